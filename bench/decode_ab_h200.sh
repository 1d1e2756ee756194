#!/bin/bash
# The MXFP4 word decode before and after its re-placement, on one H200, in one machine session:
# the GPU tests of the new decode, then each bench in a process of the new tree and one of the
# previous commit's tree (a copy of its bench/ and runtime/ under .cache/oldtree, whose scripts put
# their own runtime first on sys.path), alternating, so both meet the same machine state.
#
#   bash bench/decode_ab_h200.sh tests|humming|residency|refresh|sim
#
# refresh: the new tree alone, the runs the decode-step estimate's measured tables and its validation
# come from (gpt-oss geometry beside matmul_ogs, the 13-layer residency step, the full-depth
# simulation), again after the change.
#
# Carries (ignored paths, copied onto the machine): .cache/whl (humming-kernels 0.1.19 and
# nvidia-cuda-cccl 13.0.85 wheels from PyPI), .cache/vllm-0.33.0 (the files bench/peer_moe.py names,
# unpacked from the vllm 0.33.0 wheel), .cache/oldtree. Results under $OUT.
set -u
OUT=${OUT:-bench_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .cache/whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:$PWD/runtime:/tmp/site
VLLM_SRC=$PWD/.cache/vllm-0.33.0/vllm
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt"

# The full-depth decode simulation, as BENCHMARKS.md run EB ran it, into folder $1.
run_sim() {
    timeout 200 python3 bench/decode_sim.py --models qwen3-30b-a3b,gpt-oss-120b --tokens 1,8,32 \
        --steps 1:30,8:20,32:14 --profile 3 --out "$1" > "$1/sim.log" 2>&1
    echo "sim rc=$?"; tail -30 "$1/sim.log"
}

case "${1:-tests}" in
tests)
    timeout 200 python3 -m pytest -q tests/gpu/test_gpu_residency.py tests/gpu/test_plugin_mxfp4_gpu.py \
        tests/gpu/test_plugin_entry_graph_gpu.py \
        -k "(unsplit_bitwise or dsv41_geometry) and mma-order and not splitk and not streamk and not t1-dot and not bk64 and not no-small or minus_one_picks or counter_exact or graph_replay_equals_eager_with_new or large_step or plugin" \
        > "$OUT/tests_mxfp4.log" 2>&1
    echo "mxfp4 tests rc=$?"; tail -3 "$OUT/tests_mxfp4.log"
    timeout 200 python3 -m pytest -q tests/gpu/test_t1_warp_mma.py > "$OUT/tests_t1.log" 2>&1
    echo "t1 tests rc=$?"; tail -3 "$OUT/tests_t1.log"
    ;;
humming)
    for tree in new old; do
        script=bench/peer_moe.py
        [ "$tree" = old ] && script=.cache/oldtree/bench/peer_moe.py
        timeout 240 python3 "$script" --peers humming --vllm-src "$VLLM_SRC" --steps 1:24,6:16,16:10,96:5 \
            --out "$OUT/humming_$tree" > "$OUT/humming_$tree.log" 2>&1
        echo "humming $tree rc=$?"; grep -v "^env" "$OUT/humming_$tree.log" | tail -12
    done
    ;;
residency)
    for tree in new old new old; do
        script=bench/gpu_residency.py
        extra=(--compare "gw:gw_max_tokens=16")   # the new tree also times the grouped warp-MMA kernels
        [ "$tree" = old ] && script=.cache/oldtree/bench/gpu_residency.py && extra=()
        n=$(ls "$OUT" | grep -c "^residency_${tree}_.*log")
        timeout 150 python3 "$script" --layers 8 --cold-layers 2 --tokens 1,6,16,96 \
            --steps 1:100,6:50,16:30,96:10 "${extra[@]}" --out "$OUT/residency_${tree}_$n" \
            > "$OUT/residency_${tree}_$n.log" 2>&1
        echo "residency $tree rc=$?"; grep "limits\|^{\"T\"" "$OUT/residency_${tree}_$n.log"
    done
    ;;
refresh)
    timeout 200 python3 bench/format_peer.py --formats gptoss-mxfp4 --vllm-src "$VLLM_SRC" --out "$OUT/format" \
        > "$OUT/format.log" 2>&1
    echo "format rc=$?"; grep -v "^env" "$OUT/format.log" | tail -25
    timeout 170 python3 bench/gpu_residency.py --tokens 1,6,16,96 --steps 1:200,6:80,16:50,96:12 \
        --out "$OUT/residency13" > "$OUT/residency13.log" 2>&1
    echo "residency13 rc=$?"; grep "^| [0-9]* | \(all_hbm\|usage_aware\) |\|HBM read limit at\|Limits" "$OUT/residency13.log"
    mkdir -p "$OUT/sim" && run_sim "$OUT/sim"
    ;;
sim)
    run_sim "$OUT"
    ;;
esac
