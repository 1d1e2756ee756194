#!/bin/bash
# Nsight Compute on one DeepSeek-V4.1 MXFP4 layer, ours beside Humming (vLLM 0.33's pick on SM90), at
# T = 16 and 96 (or the token counts given): one log per side and T under $OUT. bench/ncu_peer_layer.py
# says what each run launches and which launches are read.
#
#   bash bench/ncu_peer.sh            # T = 16 and 96
#   bash bench/ncu_peer.sh 6 16 96
#
# Carries as bench/pending_h200.sh: .cache/whl (humming-kernels 0.1.19, nvidia-cuda-cccl 13.0.85) and
# .cache/vsub/vllm (the unpacked vllm 0.33.0 wheel's files). Written 2026-12-05, not yet run (no GPU lent).
set -u
OUT=${OUT:-bench_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .cache/whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:$PWD/runtime:/tmp/site PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt"
[ $# -gt 0 ] || set -- 16 96
for t in "$@"; do
  for side in ours humming; do
    if [ "$side" = ours ]; then kernels='^w13|^w2'; else kernels='^humming'; fi
    timeout ${NCU_S:-200} ncu --clock-control none --kernel-name-base function -k "regex:$kernels" \
        --launch-skip 2 --launch-count 2 --section SpeedOfLight --section LaunchStats --section Occupancy \
        --section SchedulerStats --section WarpStateStats \
        --metrics dram__bytes_read.sum,smsp__inst_executed.sum,regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio \
        python3 bench/ncu_peer_layer.py --side "$side" --tokens "$t" --vllm-src "$PWD/.cache/vsub/vllm" \
        > "$OUT/ncu_${side}_T$t.log" 2>&1
    echo "$side T=$t rc=$?"
    grep -E '^  [a-z_0-9]+.*\(|Duration|DRAM Throughput|Registers Per|Grid Size|Block Size|Achieved Occupancy|Issue Slots Busy|Eligible Warps|Dynamic Shared|"side"' \
        "$OUT/ncu_${side}_T$t.log" | head -40
  done
done
