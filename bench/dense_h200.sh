#!/usr/bin/env bash
# One H200 session for the BF16 / FP8-block expert layers: the GPU tests of the new schedule, then
# bench/dense_peer.py (ours under each variant against vLLM 0.33's Triton fused_moe, with the HBM
# read floor), while bench/fp8_peer_probe.py tries DeepGEMM's import and times FlashInfer's
# CUTLASS MoE compile in the background (nice'd nvcc; the GPU side runs CUDA graphs).
#
#   OUT=dir VLLM_SRC=... CONFIGS=... PROBE=dir bench/dense_h200.sh
#
# VLLM_SRC: the unpacked vLLM 0.33.0 wheel's vllm/ (default .cache/vllm-0.33.0/vllm); CONFIGS: a
# folder of its fused_moe/configs/*.json (optional); PROBE: a folder with fi_probe.tar.xz and
# dg_vendored.tar.xz (files of the published flashinfer-python 0.7.2.post1 and vLLM 0.33.0 wheels;
# optional). Logs and JSON go to OUT.
set -o pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD:$PWD/runtime PYTHONUNBUFFERED=1
OUT=${OUT:-bench_out}
mkdir -p "$OUT"
VLLM_SRC=${VLLM_SRC:-.cache/vllm-0.33.0/vllm}
CONFIGS=${CONFIGS:-.cache/fused_moe_configs}
{ date -u; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
  nproc; } > "$OUT/env.txt" 2>&1
probe_pid=
if [ -n "${PROBE:-}" ] && [ -f "$PROBE/fi_probe.tar.xz" ]; then
  mkdir -p /tmp/probe && tar xJf "$PROBE/fi_probe.tar.xz" -C /tmp/probe && tar xJf "$PROBE/dg_vendored.tar.xz" -C /tmp/probe
  python3 bench/fp8_peer_probe.py --deep-gemm /tmp/probe --fi-root /tmp/probe --fi-tus "${FI_TUS:-248}" \
    --limit "${PROBE_LIMIT:-170}" --out "$OUT" > "$OUT/probe.log" 2>&1 &
  probe_pid=$!
fi
timeout "${TEST_LIMIT:-80}" python3 -m pytest -q -x -p no:cacheprovider tests/gpu/test_dense_gpu.py \
  -k "${TEST_K:-t1_schedule or act_quant or graph_replay}" 2>&1 | tee "$OUT/tests.log"
timeout "${BENCH_LIMIT:-200}" python3 bench/dense_peer.py --vllm-src "$VLLM_SRC" --peer-configs "$CONFIGS" \
  --out "$OUT" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log"
if [ -n "$probe_pid" ]; then wait "$probe_pid"; cat "$OUT/probe.log"; fi
