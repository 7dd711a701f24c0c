#!/usr/bin/env bash
# Fetch the pinned Data Docs assets (infra/dq_assets/assets.txt) into DEST once, for offline
# Data Docs; `make setup` runs it. Needs npm (for `npm pack`) and the project's venv.
#   usage: infra/dq_assets/fetch.sh DEST        e.g. infra/dq_assets/fetch.sh .cache/dq_assets
# Every file is checked against its pinned sha384; on success DEST/.complete is touched.
set -euo pipefail

dest=${1:?usage: $0 DEST}
repo=$(cd "$(dirname "$0")/../.." && pwd)
python=${PYTHON:-$repo/.venv/bin/python}
command -v npm >/dev/null || { echo "need npm to fetch the Data Docs assets once (Debian: apt-get install npm)"; exit 1; }

mkdir -p "$dest"
dest=$(cd "$dest" && pwd)
(cd "$repo" && "$python" -m gem.quality.docs_assets --fetch --dest "$dest")
touch "$dest/.complete"
