#!/usr/bin/env bash
# The kernel's tests and benchmarks on one H200, in one call (see BENCHMARKS.md):
#   bash bench/kernel_h200.sh [tests|residency|peer|offload|ncu ...]   (default: the first four)
# TESTS_K: a pytest -k expression for the tests part; *_S: each part's time limit.
# Needs the unpacked vLLM 0.33.0 wheel at .cache/vllm-0.33.0 (its triton_kernels and two glue files).
set -o pipefail
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD/runtime
OUT=${OUT:-bench_out}; mkdir -p "$OUT"
parts=${*:-tests residency peer offload}
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
for part in $parts; do
  case $part in
    tests) timeout ${TESTS_S:-240} python3 -m pytest tests/gpu/test_gpu_residency.py -q -rA -s --timeout 200 ${TESTS_K:+-k "$TESTS_K"} \
             -p no:cacheprovider > "$OUT/tests.log" 2>&1
           grep -E "^(FAILED|ERROR)|passed|failed|vs int-dequant|Triton vs|small-step|streamK" "$OUT/tests.log" | cut -c1-160 ;;
    residency) timeout ${RES_S:-240} python3 bench/gpu_residency.py --out "$OUT" ${RES_ARGS:-} 2>&1 \
             | tee "$OUT/residency.log" | grep -v "^sweep" | tail -${RES_TAIL:-45} ;;
    peer) timeout ${PEER_S:-240} python3 bench/peer_moe.py --out "$OUT" ${PEER_ARGS:-} 2>&1 \
             | tee "$OUT/peer.log" | tail -${PEER_TAIL:-25} ;;
    ncu) NCU=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu | head -1)
         timeout ${NCU_S:-90} "$NCU" --clock-control none -k regex:'w13|w2' --launch-skip 4 --launch-count 2 \
             --section SpeedOfLight --section SchedulerStats --section WarpStateStats \
             --section ComputeWorkloadAnalysis --section Occupancy --section LaunchStats \
             --metrics regex:smsp__average_warps_issue_stalled_.*_per_issue_active.ratio,regex:sm__pipe_.*_cycles_active.avg.pct_of_peak_sustained_active \
             python3 bench/kernel_ncu_t1.py > "$OUT/ncu_t1.txt" 2>&1
         grep -E "w13|w2_kernel|Duration|Throughput|Issue|Eligible|Active Warps|Issued Warp|Stall|Pipe|Occupancy|Registers|Warp Cycles|No Eligible|One or More|issue_stalled|pipe_(alu|fma|shared|tensor)_cycles" "$OUT/ncu_t1.txt" | cut -c1-150 | head -${NCU_TAIL:-130} ;;
    offload) timeout ${OFF_S:-300} python3 bench/peer_moe.py --out "$OUT/offload" --tokens 1 --steps 1:3 --layers 1 \
             --offload 2>&1 | tee "$OUT/offload.log" | grep -E "offload|Offload|ratio|\| 1 |\| 16 " | tail -12 ;;
  esac
done
