#!/bin/bash
# The H200 checks of today's defaults, in two calls of one machine session (last run 2026-12-05:
# BENCHMARKS.md, "Call 10 and the GPU suite on today's defaults", and run EF):
#
#   bash bench/pending_h200.sh tests        # call 1: every GPU test file on today's defaults
#   bash bench/pending_h200.sh rows sim     # call 2: gpt-oss's MXFP4 row across the grouped loop's
#                                           #         limit, and the full-depth decode simulation
#
# tests: tests/gpu/* and the adaptive CUDA test together (the Triton-interpreter twins skip where a
#        GPU is present).
# rows:  gpt-oss at T = 48, 49 and 64 (the grouped loop at its limit, the Triton tl.dot kernels above
#        it), the points of bench/expert_rows.py's table on each side of the kernel change.
# sim:   the decode simulation as runs EE and EF ran it, for tests/test_estimate_validation.py.
# context: what a worker holds on the GPU before its weights load (CUDA context, cuBLAS, a Triton
#        module, a one-rank NCCL group) and CUDA's total beside NVML's: the ledger's load-time
#        allowance and the card's driver reserve (bench/context_allowance.py; run on an H100 on
#        2026-12-05, BENCHMARKS.md; on an H200 on 2026-12-06, run WH call 4).
# w2rows: the w2 launch's row tile at 256 (Humming's) beside today's 128, each in its own process
#        beside Humming, at T = 16 and 96 (with 3 pipeline stages as the default and 2 / 4 beside
#        it): whether more weight bytes in flight per program close w2's gap (run H1's Nsight
#        profile: 464 against Humming's 410 us at T = 96 on an H100). 256-row w2 tiles turn the
#        warp-MMA kernels off (64 / 128 rows only), so T <= 16 runs tl.dot there. Run on an H100
#        on 2026-12-05 (BENCHMARKS.md, run H2: 0.990x at T = 96, 1.007x at 16); on an H200 on 2026-12-06
#        (run WH call 4: 1.11x at T = 16, 1.00x at 96).
# ws:    the warp-specialized expert GEMMs (bench/ws_probe.py beside the previous launches), then
#        the layer with today's default (warp-specialized from 2 tokens per step) beside the previous
#        default (ws_grouped=0), against Humming and on the residency step (run WS on H100s,
#        2026-12-05; on the H200 on 2026-12-06, run WH call 1).
# t1ws:  T = 1 through the warp-specialized launches (one_token off, so T = 1 is grouped like larger
#        steps, then ws_min_tokens=1), with 2 / 3 / 4 programs per SM, beside today's T = 1 kernels
#        (the warp-MMA loops; 62-64% of the H200's HBM read, 76% of an H100's) and the grouped tl.dot
#        path, against Humming and on the residency step; and the GPU test of that path (its peer
#        part and the test ran on the H200 on 2026-12-06, run WH: 1.12x the T = 1 loops).
# dsrows: DeepSeek-V4.1's routed-expert row of the step-time estimate on today's default kernels
#        (13 layers as run ER, all in HBM and usage-aware, T = 1 to 96; the row's source since
#        the warp-specialized launches became the default from 2 tokens per step). Run on the H200
#        on 2026-12-06 (run WH call 2: bench/results/expert_rows_h200/call12_residency13_ws.*).
# occ:   the warp-specialized launches at 4 programs per SM, at the register cap that lets them share
#        the SM's register file (tile_rules.ws_max_registers: 64 registers; run WH's "3 programs per
#        SM" ran at 128, so its third program per SM waited for a second wave), and with each item's
#        slot rows, expert and pick ids read an item ahead (ws_prefetch): each GEMM alone
#        (bench/ws_probe.py), the layer beside Humming, the residency step, and the GPU test of those
#        settings' bits (OCC_PROBE / OCC_COMPARE replace the variants). Run on an H100 on
#        2026-12-06 with 3 and 4 programs per SM, no prefetch (bench/results/occ_h100/), and on the
#        H200 the same day (run SH call 2, bench/results/sh/: four programs per SM became its default).
#        With today's default (ws_programs_per_sm 0: four on an H200's all-HBM layers) name the
#        baseline explicitly: OCC_COMPARE="p2:ws_programs_per_sm=2;...".
# t1cap: the T = 1 launches' register cap (KernelConfig.t1_max_registers, 128 by default since run TP,
#        measured on H100s only: 0.97-1.00x the uncapped step) on the H200: 13 layers at T = 1 with
#        the uncapped launches beside, then the cap's GPU test.
# t1fused: the one-launch T = 1 layer (KernelConfig.t1_fused, off): its GPU test first, under a timeout
#        (a wait that never ends would show as rc 124), then 13 layers at T = 1 beside the two
#        launches, and beside Humming. Run on an H100 on 2026-12-06 (BENCHMARKS.md, run OL: bits
#        equal, 1.10-1.12x slower than the two launches).
# LAYERS / COLD_LAYERS (13 / 3) set the residency step of t1cap and t1fused: 13 DeepSeek-V4.1 layers do
# not fit an H100's 80 GB, 8 / 3 do.
#
# Carries (ignored paths, copied onto the machine): .cache/whl (humming-kernels 0.1.19 and
# nvidia-cuda-cccl 13.0.85 wheels from PyPI) and .cache/vsub/vllm (the unpacked vllm 0.33.0 wheel's
# fused_moe/, quantization/utils/, third_party/triton_kernels and utils/humming.py). At most eight
# files come back from a call, so each part writes one log and one JSON at most.
set -u
OUT=${OUT:-bench_out}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --target /tmp/site .cache/whl/*.whl >/dev/null 2>&1
export PYTHONPATH=$PWD:$PWD/runtime:/tmp/site PYTHONUNBUFFERED=1
VLLM_SRC=$PWD/.cache/vsub/vllm
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader > "$OUT/gpu.txt"

for part in "$@"; do
  case $part in
    tests) timeout ${TESTS_S:-560} python3 -m pytest -q -rfE -p no:cacheprovider tests/gpu \
               tests/runtime/test_adaptive_cuda.py > "$OUT/tests.log" 2>&1
           echo "tests rc=$?"; grep -E "^(FAILED|ERROR)|passed|failed" "$OUT/tests.log" | tail -20 ;;
    rows)  mkdir -p "$OUT/rows"
           timeout ${ROWS_S:-240} python3 bench/format_peer.py --formats gptoss-mxfp4 --tokens 48,49,64 \
               --steps 48:8,49:8,64:8 --vllm-src "$VLLM_SRC" --out "$OUT/rows" > "$OUT/rows.log" 2>&1
           echo "rows rc=$?"; tail -25 "$OUT/rows.log" ;;
    sim)   mkdir -p "$OUT/sim"
           timeout ${SIM_S:-300} python3 bench/decode_sim.py --models qwen3-30b-a3b,gpt-oss-120b \
               --tokens 1,8,32 --steps 1:30,8:20,32:14 --profile 3 --out "$OUT/sim" > "$OUT/sim.log" 2>&1
           echo "sim rc=$?"; tail -30 "$OUT/sim.log" ;;
    context) timeout ${CONTEXT_S:-120} python3 bench/context_allowance.py --out "$OUT/context_allowance.json" \
               > "$OUT/context.log" 2>&1
           echo "context rc=$?"; tail -8 "$OUT/context.log" ;;
    w2rows) for v in base:block_n2=128 n2_256:block_n2=256; do
               label=${v%%:*}
               timeout ${W2ROWS_S:-110} python3 bench/peer_moe.py --peers humming --vllm-src "$VLLM_SRC" \
                   --tokens 16,96 --steps 16:10,96:6 --config "${v#*:}" \
                   --compare "s2:num_stages_large=2;s4:num_stages_large=4" --out "/tmp/w2rows_$label" \
                   > "$OUT/w2rows_$label.log" 2>&1
               echo "w2rows $label rc=$?"; cp "/tmp/w2rows_$label/peer_moe.md" "$OUT/w2rows_$label.md" 2>/dev/null
               tail -12 "$OUT/w2rows_$label.log"
             done ;;
    ws)    mkdir -p "$OUT/ws"
           timeout ${WS_S:-150} python3 bench/ws_probe.py --tokens 6,16,32,96 \
               --variants "ws:bm=8;bm16:;s3:bm=8,stages=3;s6:bm=8,stages=6" --out "$OUT/ws" > "$OUT/ws.log" 2>&1
           echo "ws probe rc=$?"; tail -4 "$OUT/ws.log" | cut -c1-400
           # today's default (warp-specialized from 2 tokens) beside the previous one, both placements
           timeout ${WS_S:-150} python3 bench/peer_moe.py --peers humming --vllm-src "$VLLM_SRC" --tokens 6,16,32,96 \
               --steps 6:16,16:10,32:8,96:5 --compare "prev:ws_grouped=0" --out /tmp/ws_pm > "$OUT/ws_peer.log" 2>&1
           echo "ws peer rc=$?"; cp /tmp/ws_pm/peer_moe.md "$OUT/ws_peer.md" 2>/dev/null
           timeout ${WS_S:-150} python3 bench/gpu_residency.py --layers 8 --cold-layers 2 --tokens 6,16,32,96 \
               --steps 6:30,16:16,32:10,96:6 --compare "prev:ws_grouped=0" --out /tmp/ws_gr > "$OUT/ws_residency.log" 2>&1
           echo "ws residency rc=$?"; cp /tmp/ws_gr/gpu_residency.md "$OUT/ws_residency.md" 2>/dev/null ;;
    t1ws)  mkdir -p "$OUT/t1ws"
           timeout ${T1WS_S:-200} python3 bench/peer_moe.py --peers humming --vllm-src "$VLLM_SRC" --tokens 1,2 \
               --steps 1:40,2:30 --compare "grp1:one_token=0;ws1:one_token=0,ws_min_tokens=1;ws1p3:one_token=0,ws_min_tokens=1,ws_programs_per_sm=3;ws1p4:one_token=0,ws_min_tokens=1,ws_programs_per_sm=4" \
               --out /tmp/t1ws_pm > "$OUT/t1ws/peer.log" 2>&1
           echo "t1ws peer rc=$?"; cp /tmp/t1ws_pm/peer_moe.md "$OUT/t1ws/" 2>/dev/null; tail -12 "$OUT/t1ws/peer.log"
           timeout ${T1WS_S:-200} python3 bench/gpu_residency.py --layers 8 --cold-layers 2 --tokens 1 --steps 1:40 \
               --compare "ws1:one_token=0,ws_min_tokens=1;ws1p3:one_token=0,ws_min_tokens=1,ws_programs_per_sm=3" \
               --out /tmp/t1ws_gr > "$OUT/t1ws/res.log" 2>&1
           echo "t1ws residency rc=$?"; cp /tmp/t1ws_gr/gpu_residency.md "$OUT/t1ws/" 2>/dev/null
           timeout 120 python3 -m pytest -q -rfE -p no:cacheprovider tests/gpu/test_ws_grouped_gpu.py > "$OUT/t1ws/tests.log" 2>&1
           echo "t1ws tests rc=$?"; tail -3 "$OUT/t1ws/tests.log" ;;
    dsrows) timeout ${DSROWS_S:-200} python3 bench/gpu_residency.py --layers 13 --cold-layers 3 \
               --tokens 1,2,3,4,6,16,24,32,96 --steps 1:200,2:120,3:100,4:100,6:80,16:50,24:40,32:30,96:12 \
               --out /tmp/dsrows > "$OUT/dsrows.log" 2>&1
           echo "dsrows rc=$?"; cp /tmp/dsrows/gpu_residency.json "$OUT/dsrows_residency13.json" 2>/dev/null
           tail -14 "$OUT/dsrows.log" | cut -c1-300 ;;
    occ)   mkdir -p "$OUT/occ"
           timeout ${OCC_S:-170} python3 bench/ws_probe.py --tokens 6,16,32,96 \
               --variants "${OCC_PROBE:-p2:bm=8;pf:bm=8,prefetch=1;p4:bm=8,ctas=4;p4pf:bm=8,ctas=4,prefetch=1}" --out "$OUT/occ" \
               > "$OUT/occ/probe.log" 2>&1
           echo "occ probe rc=$?"; tail -4 "$OUT/occ/probe.log" | cut -c1-300
           timeout ${OCC_S:-170} python3 bench/peer_moe.py --peers humming --vllm-src "$VLLM_SRC" --tokens 2,6,16,32,96 \
               --steps 2:20,6:16,16:10,32:8,96:5 --compare "${OCC_COMPARE:-pf:ws_prefetch=1;p4:ws_programs_per_sm=4;p4pf:ws_programs_per_sm=4,ws_prefetch=1}" \
               --out /tmp/occ_pm > "$OUT/occ/peer.log" 2>&1
           echo "occ peer rc=$?"; cp /tmp/occ_pm/peer_moe.md "$OUT/occ/" 2>/dev/null; tail -12 "$OUT/occ/peer.log"
           timeout ${OCC_S:-170} python3 bench/gpu_residency.py --layers 8 --cold-layers 2 --tokens 2,6,16,32,96 \
               --steps 2:30,6:30,16:16,32:10,96:6 --compare "${OCC_COMPARE:-pf:ws_prefetch=1;p4:ws_programs_per_sm=4;p4pf:ws_programs_per_sm=4,ws_prefetch=1}" \
               --out /tmp/occ_gr > "$OUT/occ/res.log" 2>&1
           echo "occ residency rc=$?"; cp /tmp/occ_gr/gpu_residency.md "$OUT/occ/" 2>/dev/null; tail -12 "$OUT/occ/res.log"
           timeout 200 python3 -m pytest -q -rfE -p no:cacheprovider tests/gpu/test_ws_grouped_gpu.py > "$OUT/occ/tests.log" 2>&1
           echo "occ tests rc=$?"; tail -3 "$OUT/occ/tests.log" ;;
    t1cap) timeout ${T1CAP_S:-200} python3 bench/gpu_residency.py --layers ${LAYERS:-13} --cold-layers ${COLD_LAYERS:-3} --tokens 1 \
               --steps 1:300 --compare "nocap:t1_max_registers=0" --out /tmp/t1cap > "$OUT/t1cap.log" 2>&1
           echo "t1cap rc=$?"; cp /tmp/t1cap/gpu_residency.md "$OUT/t1cap_residency13.md" 2>/dev/null
           grep -E '^\{' "$OUT/t1cap.log"
           timeout 150 python3 -m pytest -q -rfE -p no:cacheprovider tests/gpu/test_t1_warp_mma.py -k register_cap \
               > "$OUT/t1cap_tests.log" 2>&1
           echo "t1cap tests rc=$?"; tail -3 "$OUT/t1cap_tests.log" ;;
    t1fused) timeout ${T1FUSED_TEST_S:-200} python3 -m pytest -q -x -rfE -p no:cacheprovider tests/gpu/test_t1_warp_mma.py \
               -k one_launch > "$OUT/t1fused_tests.log" 2>&1
           echo "t1fused tests rc=$?"; tail -3 "$OUT/t1fused_tests.log"
           timeout ${T1FUSED_S:-200} python3 bench/gpu_residency.py --layers ${LAYERS:-13} --cold-layers ${COLD_LAYERS:-3} --tokens 1 \
               --steps 1:300 --compare "fused:t1_fused=1" --out /tmp/t1fused > "$OUT/t1fused.log" 2>&1
           echo "t1fused rc=$?"; cp /tmp/t1fused/gpu_residency.md "$OUT/t1fused_residency13.md" 2>/dev/null
           grep -E '^\{' "$OUT/t1fused.log"
           timeout 150 python3 bench/peer_moe.py --peers humming --vllm-src "$VLLM_SRC" --tokens 1 --steps 1:60 \
               --compare "fused:t1_fused=1" --out /tmp/t1fused_pm > "$OUT/t1fused_peer.log" 2>&1
           echo "t1fused peer rc=$?"; tail -8 "$OUT/t1fused_peer.log" ;;
    *)     echo "unknown part: $part (tests, rows, sim, context, w2rows, ws, t1ws, dsrows, occ, t1cap, t1fused)"; exit 2 ;;
  esac
done
