#!/usr/bin/env bash
# `pip check`, with exactly one expected complaint filtered: torchrec declares the CUDA fbgemm-gpu,
# and we install it with --no-deps next to fbgemm-gpu-cpu. Anything else fails set-up.
set -euo pipefail
py="$1"
expected='^torchrec [0-9.]+ requires fbgemm-gpu, which is not installed\.$'
out=$("$py" -m pip check 2>&1 || true)
rest=$(grep -Ev "$expected" <<<"$out" | grep -v '^No broken requirements found\.$' || true)
if [ -n "$rest" ]; then
  echo "pip check found unexpected problems:"; echo "$rest"; exit 1
fi
echo "pip check: ok (torchrec's fbgemm-gpu requirement is served by fbgemm-gpu-cpu)"
