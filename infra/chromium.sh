#!/usr/bin/env bash
# Headless Chromium for the browser tests (tests/browser.py opens the HTML reports in it): Debian's
# package, installed when missing and this user can install it (root with apt-get, as on CI's fresh
# Debian machines). Otherwise it says so and goes on: the browser tests then skip (fail under CI=true).
# Usage: infra/chromium.sh PYTHON (the project's interpreter: the tests' own lookup decides what counts).
set -euo pipefail
"${1:-python3}" -c "from tests.browser import find_chromium; raise SystemExit(find_chromium() is None)" && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing Debian's chromium for the browser tests (once)"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends chromium >/dev/null
else
  echo "no Chromium on PATH and no root apt-get to install it: the browser tests will skip" \
       "(install Debian's chromium package to run them)"
fi
