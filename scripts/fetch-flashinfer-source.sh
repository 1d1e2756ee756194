#!/usr/bin/env bash
# Unpacked flashinfer-python source at the version vLLM 0.33.0 pins (its wheel's Requires-Dist:
# flashinfer-python==0.7.2.post1) for tests/test_blackwell_contracts.py: read as text, never
# imported. Goes to .cache/flashinfer-python-<version> (gitignored). Only the files the contract
# tests cite are kept (the routed MoE API, the weight-shuffle helpers, the TRT-LLM MoE launcher,
# routing and finalize kernels, the 128x4 scale layout).
# Skipped when RECIPEGEN_FLASHINFER_SRC points at an unpacked tree already. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/setup-lib.sh   # FLASHINFER_VERSION and the stamp (bumped there when the kept file list changes)
flashinfer_src_ready && exit 0
dest=.cache/flashinfer-python-$FLASHINFER_VERSION
stamp=$flashinfer_stamp
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && PY=.venv/bin/python
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$PY" -m pip download -q --disable-pip-version-check --no-deps --only-binary=:all: \
  -d "$tmp" "flashinfer-python==$FLASHINFER_VERSION"
whl=$(ls "$tmp"/flashinfer_python-"$FLASHINFER_VERSION"-*.whl | head -n1)
rm -rf "$dest" && mkdir -p "$dest"
"$PY" - "$whl" "$dest" <<'PYEOF'
import sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
keep = ("flashinfer/__init__.py", "flashinfer/utils.py", "flashinfer/tllm_enums.py",
        "flashinfer/fp4_quantization.py", "flashinfer/quantization/fp4_quantization.py",
        "flashinfer/fused_moe/__init__.py", "flashinfer/fused_moe/core.py",
        "flashinfer/autotuner/autotuner.py", "flashinfer/data/csrc/trtllm_batched_gemm_runner.cu",
        "flashinfer/data/csrc/trtllm_fused_moe_kernel_launcher.cu",
        "flashinfer/data/csrc/fused_moe/trtllm_backend/",
        "flashinfer/data/include/flashinfer/trtllm/fused_moe/",
        "flashinfer/data/csrc/nv_internal/tensorrt_llm/kernels/quantization_utils.cuh")
with zipfile.ZipFile(whl) as zf:
    names = [n for n in zf.namelist() if n.startswith(keep) or n.endswith(".dist-info/METADATA")]
    zf.extractall(dest, names)
PYEOF
touch "$stamp"
