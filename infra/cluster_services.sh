#!/usr/bin/env bash
# Redis and PostgreSQL for the Airflow cluster of the slow tests and `make cluster-demo` (Celery's
# broker and the metadata DB; gem.pipeline.services starts each in a temporary folder on a free
# loopback port, never as a system service): Debian's packages, installed when missing and this user
# can install them (root with apt-get, as on CI's fresh Debian machines). The packages' own services
# are kept from starting while they install (policy-rc.d). Otherwise it says so and goes on: the
# tests that need them then skip (fail under CI=true).
set -euo pipefail
missing=()
command -v redis-server >/dev/null || missing+=(redis-server)
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || command -v initdb >/dev/null || missing+=(postgresql)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
  echo "installing Debian's ${missing[*]} for the Airflow cluster (once)"
  policy=/usr/sbin/policy-rc.d
  if [ ! -e "$policy" ]; then
    printf '#!/bin/sh\nexit 101\n' > "$policy" && chmod 755 "$policy"
    trap 'rm -f "$policy"' EXIT
  fi
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
else
  echo "no ${missing[*]} and no root apt-get to install them: the Airflow cluster tests will skip" \
       "(install Debian's redis-server and postgresql packages to run them)"
fi
