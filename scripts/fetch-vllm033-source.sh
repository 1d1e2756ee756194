#!/usr/bin/env bash
# Unpacked vllm 0.33.0 python source for tests/test_vllm033_contracts.py (read as text, never
# imported). Goes to .cache/vllm-0.33.0 (gitignored). Skipped when RECIPEGEN_VLLM033_SRC points
# at an unpacked tree already. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup-lib.sh   # VLLM033_VERSION and the stamp
vllm033_src_ready && exit 0
dest=.cache/vllm-$VLLM033_VERSION
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  -d "$tmp" "vllm==$VLLM033_VERSION"
whl=$(ls "$tmp"/vllm-"$VLLM033_VERSION"-*.whl | head -n1)
rm -rf "$dest" && mkdir -p "$dest"
"$PY" - "$whl" "$dest" <<'PYEOF'
import sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as zf:
    zf.extractall(dest, [n for n in zf.namelist() if n.startswith("vllm/") and n.endswith(".py")])
PYEOF
touch "$vllm033_stamp"
