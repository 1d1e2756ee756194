"""bench/decode_sim.py's per-kernel, per-GEMM and expert-byte records, and bench/estimate_gap.py beside them.

* The kernel grouping (``decode_sim.kernel_component``) on the kernel names the H200 run recorded
  (bench/results/decode_sim_h200.json, its census at T = 8), against a hand count of each decoder
  layer's launches (BENCHMARKS.md, "Kernels per step").
* ``kernel_table`` on hand-made kernel records (busy time, span, counts per step).
* The harness end to end on the CPU (``--device cpu``: tiny geometry, ``TRITON_INTERPRET=1``, run
  under ``nice``), then the comparison on its JSON: the expert bytes against the routing drawn
  again and counted here, each GEMM's bytes against rows × cols × 2 worked out by hand, the
  comparison's GEMM line and attention against the efficiency tables' published figures.
* The comparison on the committed H200 run reproduces docs/costmodel.md's table "Where the time
  goes missing" (step, experts alone and rest per layer, the experts' share of the read limit).
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import estimate_gap  # noqa: E402

H200 = ROOT / "bench" / "results" / "decode_sim_h200_run_ea.json"     # run EA: census, no profile
H200_EB = ROOT / "bench" / "results" / "decode_sim_h200.json"          # run EB: profiled, GEMMs alone
H200_EE = ROOT / "bench" / "results" / "decode_sim_h200_run_ee.json"   # run EE: the same on today's kernels
needs_triton = pytest.mark.skipif(importlib.util.find_spec("triton") is None or importlib.util.find_spec("torch") is None,
                                  reason="needs torch and Triton (the test extra)")


def _decode_sim():
    import decode_sim
    return decode_sim


# -- the grouping, on the H200 run's kernel names -------------------------------------------------

# Each name the H200 census recorded (80 characters, as recorded), its component by hand.
H200_NAMES = {
    "_add_rmsnorm_kernel": "norm_rope_elementwise",
    "_rope_cache_kernel": "norm_rope_elementwise",
    "void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda": "norm_rope_elementwise",
    "void at::native::vectorized_elementwise_kernel<8, at::native::FillFunctor<c10::B": "norm_rope_elementwise",
    "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_TNT": "dense_gemm",
    "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_TNT": "dense_gemm",
    "void cublasLt::splitKreduce_kernel<32, 16, int, float, __nv_bfloat16, float, __n": "dense_gemm",
    "nvjet_sm90_tst_8x64_64x16_4x1_v_bz_TNN": "dense_gemm",
    "nvjet_sm90_tst_384x8_64x4_2x1_v_bz_TNT": "dense_gemm",
    "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_bias_TNT": "dense_gemm",
    "nvjet_sm90_tst_64x8_64x16_4x1_v_bz_splitK_bias_TNT": "dense_gemm",
    "nvjet_sm90_tst_64x8_64x16_2x1_v_bz_splitK_bias_TNT": "dense_gemm",
    "nvjet_sm90_tst_512x8_64x3_2x1_v_bz_TNT": "dense_gemm",
    "void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<128, 64, 12": "attention",
    "void pytorch_flash::flash_fwd_splitkv_combine_kernel<Flash_fwd_kernel_traits<128": "attention",
    "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, fa": "attention",
    "void pytorch_flash::flash_fwd_splitkv_kernel<Flash_fwd_kernel_traits<64, 64, 256": "attention",
    "void pytorch_flash::flash_fwd_splitkv_combine_kernel<Flash_fwd_kernel_traits<64,": "attention",
    "void at::native::sbtopk::gatherTopK<c10::BFloat16, unsigned int, 2, false>(at::c": "router_topk_softmax",
    "void at::native::bitonicSortKVInPlace<2, -1, 16, 16, c10::BFloat16, long, at::na": "router_topk_softmax",
    "void (anonymous namespace)::softmax_warp_forward<float, float, float, 3, false, ": "router_topk_softmax",
    "void (anonymous namespace)::softmax_warp_forward<float, float, float, 2, false, ": "router_topk_softmax",
    "group_picks_kernel": "routed_experts",
    "dense_w13_act_kernel": "routed_experts",
    "dense_w2_kernel": "routed_experts",
    "w13_swiglu_kernel": "routed_experts",
    "w2_kernel": "routed_experts",
    "finalize_kernel": "routed_experts",
    "void at::native::(anonymous namespace)::indexSelectSmallIndex<c10::BFloat16, lon": "other",
    "void at::native::reduce_kernel<512, 1, at::native::ReduceOp<c10::BFloat16, at::n": "other",
}
# Per step at T = 8, by hand from the step's structure (BENCHMARKS.md, "Kernels per step"): per layer
# the experts' 4; 3 GEMMs + split-K reductions (Qwen3 1, gpt-oss 2) and the LM head once; flash 2
# per full layer (split-KV + combine) and 1 on gpt-oss's 18 sliding layers; top-k 2 + softmax; 2
# add + RMSNorm + the final one, rotary, the weights' cast, the residual reset once; embedding and
# argmax once.
H200_COUNTS = {
    "qwen3-30b-a3b": {"routed_experts": 4 * 48, "dense_gemm": 4 * 48 + 1, "attention": 2 * 48,
                      "router_topk_softmax": 3 * 48, "norm_rope_elementwise": 4 * 48 + 2, "other": 2},
    "gpt-oss-120b": {"routed_experts": 4 * 36, "dense_gemm": 5 * 36 + 1, "attention": 2 * 18 + 18,
                     "router_topk_softmax": 3 * 36, "norm_rope_elementwise": 4 * 36 + 2, "other": 2},
}


@needs_triton
def test_kernel_groups_of_the_h200_runs_names():
    ds = _decode_sim()
    assert {"group_picks_kernel", "w13_swiglu_kernel", "w2_kernel", "finalize_kernel", "dense_w13_act_kernel",
            "dense_w2_kernel", "w13_t1_kernel", "w2_t1_kernel"} <= ds.RUNTIME_KERNELS
    data = json.loads(H200.read_text())
    for name, run in data["models"].items():
        census = run["per_T"]["8"]["census"]
        counts = dict.fromkeys(ds.COMPONENTS, 0)
        for kernel, n in census["by_name"].items():
            assert ds.kernel_component(kernel) == H200_NAMES[kernel], kernel
            counts[H200_NAMES[kernel]] += n
        assert counts == H200_COUNTS[name], name
        assert sum(counts.values()) == census["kernels"]      # 821 and 635: every kernel grouped once


@needs_triton
def test_kernel_groups_of_cpu_ops_and_unknown_names():
    ds = _decode_sim()
    assert ds.kernel_component("aten::addmm") == ds.kernel_component("aten::mm") == "dense_gemm"
    assert ds.kernel_component("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    assert ds.kernel_component("aten::topk") == ds.kernel_component("aten::_softmax") == "router_topk_softmax"
    assert ds.kernel_component("aten::copy_") == "norm_rope_elementwise"
    assert ds.kernel_component("aten::argmax") == ds.kernel_component("Memcpy HtoD (Pinned -> Device)") == "other"


@needs_triton
def test_kernel_table_per_step():
    ds = _decode_sim()
    # two replays of a two-kernel step: (name, start µs, µs)
    events = [("_add_rmsnorm_kernel", 0.0, 2.0), ("w2_kernel", 3.0, 4.0),
              ("_add_rmsnorm_kernel", 10.0, 2.0), ("w2_kernel", 13.0, 6.0)]
    table = ds.kernel_table(events, 2, cuda=True)
    assert table["kernels_per_step"] == 2
    assert table["busy_us"] == pytest.approx((2 + 4 + 2 + 6) / 2)
    assert table["span_us"] == pytest.approx((7 + 9) / 2)       # 0..7 and 10..19
    assert table["by_component"]["routed_experts"] == {"count": 1, "us": pytest.approx(5.0)}
    assert table["by_component"]["norm_rope_elementwise"] == {"count": 1, "us": pytest.approx(2.0)}
    assert list(table["by_name"]) == ["w2_kernel", "_add_rmsnorm_kernel"]   # by time
    assert "span_us" not in ds.kernel_table(events, 2, cuda=False)


# -- the harness end to end on the CPU -------------------------------------------------------------

TOKENS = (1, 2)
# bench/decode_sim.tiny: 3 layers, hidden 256, 4 query and 2 KV heads of 64, vocab 512, 8 experts,
# top-2, intermediate 128; gpt-oss's keeps its biases and a 16-token window on the even layers.
LAYERS, HIDDEN, VOCAB, EXPERTS, INTER = 3, 256, 512, 8, 128
# bytes per expert by hand: BF16 gate/up (2I x H) and down (H x I), 2 bytes each; MXFP4 the same
# weights at half a byte plus one scale byte per 32 values, and bf16 biases (2I + H)
BYTES_PER_EXPERT = {"qwen3-30b-a3b-tiny": 3 * HIDDEN * INTER * 2,                             # 196,608
                    "gpt-oss-120b-tiny": 2 * INTER * (HIDDEN // 2 + HIDDEN // 32)
                    + HIDDEN * (INTER // 2 + INTER // 32) + 2 * (2 * INTER + HIDDEN)}           # 53,248
# the weight GEMMs: (rows, cols) by hand; QKV (4 + 2 x 2) heads x 64
GEMMS = {"qkv": (512, 256), "o_proj": (256, 256), "router": (8, 256), "lm_head": (512, 256)}
COLD_PER_LAYER, COLD_LAYERS = 3, 1


@pytest.fixture(scope="module")
def cpu_run(tmp_path_factory):
    pytest.importorskip("torch")
    pytest.importorskip("triton")
    out = tmp_path_factory.mktemp("decode_sim")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(ROOT / "runtime"), env.get("PYTHONPATH", "")])
    done = subprocess.run(["nice", "-n", "19", sys.executable, str(ROOT / "bench" / "decode_sim.py"), "--device", "cpu",
                           "--tokens", ",".join(map(str, TOKENS)), "--cold-per-layer", str(COLD_PER_LAYER),
                           "--cold-layers", str(COLD_LAYERS), "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    gap = subprocess.run([sys.executable, str(ROOT / "bench" / "estimate_gap.py"), str(out / "decode_sim.json"),
                          "--hbm-read-GBps", "4110", "--pinned-read-GBps", "51.3", "--json", str(out / "gap.json")],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert gap.returncode == 0, gap.stdout[-3000:] + gap.stderr[-3000:]
    return {"dir": out, "sim": json.loads((out / "decode_sim.json").read_text()),
            "gap": json.loads((out / "gap.json").read_text()), "report": gap.stdout, "env": env}


def _touched(run: dict, t: int) -> list[list[set[int]]]:
    """The experts each layer's routing touched at each timed step, drawn again here (the run's
    seed + T, bench/format_peer's draw) and collected into sets."""
    import format_peer as fp
    import torch
    g = run["geometry"]
    steps = run["per_T"][str(t)]["steps"]
    ids, _ = fp.sample_routing(fp.popularity(g["experts"], g["layers"], run["popularity_seed"]), steps, t,
                               g["top_k"], run["popularity_seed"] + t, torch.device("cpu"))
    return [[set(ids[s, layer].reshape(-1).tolist()) for layer in range(g["layers"])] for s in range(steps)]


@pytest.mark.interpreter
def test_cpu_run_records_expert_bytes_as_unique_times_bytes_per_expert(cpu_run):
    sim = cpu_run["sim"]
    assert set(sim["models"]) == set(BYTES_PER_EXPERT)
    for name, run in sim["models"].items():
        bpe = BYTES_PER_EXPERT[name]
        assert run["bytes_per_expert"] == bpe
        for t in TOKENS:
            row = run["per_T"][str(t)]
            touched = _touched(run, t)
            assert row["unique_per_layer_mean"] == pytest.approx(np.mean([len(u) for s in touched for u in s]))
            unique = np.mean([sum(len(u) for u in s) for s in touched])
            for case in ("all_hbm", "usage_aware", "positional"):
                if case not in row:
                    continue
                assert row[case]["expert_bytes_per_step_mean"] == unique * bpe, (name, t, case)
                if case == "usage_aware":
                    cold_ids = run["cold_ids"]["usage_aware"]
                    assert all(len(c) == COLD_PER_LAYER for c in cold_ids)
                    cold = np.mean([sum(len(u & set(cold_ids[i])) for i, u in enumerate(s)) for s in touched])
                elif case == "positional":
                    cold = np.mean([sum(len(u) for u in s[:COLD_LAYERS]) for s in touched])
                else:
                    cold = 0
                assert row[case]["cold_expert_bytes_per_step_mean"] == cold * bpe, (name, t, case)
                assert row[case]["kernels"]["expert_bytes"] == sum(len(u) for u in touched[-1]) * bpe
    assert {"usage_aware", "positional"} <= set(sim["models"]["qwen3-30b-a3b-tiny"]["per_T"]["1"])


@pytest.mark.interpreter
def test_cpu_run_times_each_weight_gemm_at_its_own_shape(cpu_run):
    for name, run in cpu_run["sim"]["models"].items():
        bias = name.startswith("gpt-oss")
        for t in TOKENS:
            got = {m["name"]: m for m in run["gemms"]["by_T"][str(t)]}
            assert set(got) == set(GEMMS)
            for gemm, (rows, cols) in GEMMS.items():
                m = got[gemm]
                assert (m["rows"], m["cols"], m["bytes"]) == (rows, cols, rows * cols * 2), (name, gemm)
                assert m["bias"] == (bias and gemm != "lm_head")
                assert m["launches_per_step"] == (1 if gemm == "lm_head" else LAYERS)
                assert m["copies"] >= 2 and m["us"] > 0


@pytest.mark.interpreter
def test_cpu_run_profiles_every_case_at_every_t_labelled_as_cpu_time(cpu_run):
    for name, run in cpu_run["sim"]["models"].items():
        for t in TOKENS:
            row = run["per_T"][str(t)]
            for case in ("all_hbm", "usage_aware", "positional"):
                if case not in row:
                    continue
                k = row[case]["kernels"]
                assert k["device_times"] is False and "not device time" in k["source"], (name, t, case)
                comps = k["by_component"]
                assert sum(c["us"] for c in comps.values()) == pytest.approx(k["busy_us"])
                assert sum(c["count"] for c in comps.values()) == pytest.approx(k["kernels_per_step"])
                # the step's weight GEMMs: 3 per layer and the LM head (aten::mm / aten::addmm)
                assert comps["dense_gemm"]["count"] == 3 * LAYERS + 1, (name, t, case)


def _gemm_line_us(nbytes: float, t: int) -> float:
    """The GEMM line of docs/costmodel.md ("Component costs": T = 1: 5.137 µs, 1.109; T = 8:
    5.165 µs, 1.127), linear in log T between, at the 4,110 GB/s the comparison was given."""
    share = math.log(t) / math.log(8)
    fixed = 5.137e-6 + (5.165e-6 - 5.137e-6) * share
    eff = 1.109 + (1.127 - 1.109) * share
    return (fixed + nbytes / (4110e9 * eff)) * 1e6


def _attention_us_per_layer(t: int, window: int) -> float:
    """The attention line ("Component costs": T = 1: 8.836 µs, 0.512; T = 8: 10.340 µs, 1.058) over
    the tiny geometry's 3 layers at the CPU run's 64 tokens of context: 2 KV heads x 64 x K and V x
    2 bytes per token per layer; with a window, layers 0 and 2 hold at most 16."""
    share = math.log(t) / math.log(8)
    fixed = 8.836e-6 + (10.340e-6 - 8.836e-6) * share
    eff = 0.512 + (1.058 - 0.512) * share
    held = [min(64, window) if window and i % 2 == 0 else 64 for i in range(LAYERS)]
    return sum(fixed + t * h * 2 * 64 * 2 * 2 / (4110e9 * eff) for h in held) / LAYERS * 1e6


@pytest.mark.interpreter
def test_comparison_on_the_cpu_run(cpu_run):
    sim, gap = cpu_run["sim"], cpu_run["gap"]
    assert gap["hbm_read_GBps"] == 4110 and gap["gpu"].startswith("CPU")
    for name, run in sim["models"].items():
        res = gap["models"][name]
        assert "the run's own geometry" in res["inputs"]
        window = run["geometry"]["window"]
        cases = [c for c in ("all_hbm", "usage_aware", "positional") if c in run["per_T"]["1"]]
        assert [(r["case"], r["T"]) for r in res["rows"]] == [(c, t) for t in TOKENS for c in cases]
        for r in res["rows"]:
            measured = run["per_T"][str(r["T"])][r["case"]]
            pl = r["per_layer_us"]
            assert pl["step"]["measured"] == pytest.approx(measured["step_ms"] * 1e3 / LAYERS)
            assert pl["rest"]["measured"] == pytest.approx((measured["step_ms"] - measured["experts_ms"]) * 1e3 / LAYERS)
            assert pl["dense_gemm"]["measured"] == pytest.approx(
                measured["kernels"]["by_component"]["dense_gemm"]["us"] / LAYERS)
            assert pl["attention"]["estimate"] == pytest.approx(_attention_us_per_layer(r["T"], window), rel=1e-9)
            assert r["device_times"] is False
            for c in pl.values():
                if c["measured"] is not None:
                    assert c["gap"] == pytest.approx(c["measured"] - c["estimate"])
            if r["case"] == "all_hbm":
                e = r["experts"]
                assert e["bytes_per_step"] == measured["expert_bytes_per_step_mean"]
                assert e["efficiency_alone"] == pytest.approx(
                    measured["expert_bytes_per_step_mean"] / (measured["experts_ms"] * 1e-3 * 4110e9))
        for t in TOKENS:
            g = res["gemms"][str(t)]
            per_layer_bytes = sum(r * c * 2 for r, c in GEMMS.values()) - 512 * 256 * 2 + 512 * 256 * 2 / LAYERS
            assert g["dense_bytes_per_layer"]["these_gemms"] == pytest.approx(per_layer_bytes)   # 484,693.3
            assert g["dense_bytes_per_layer"]["estimate"] == pytest.approx(per_layer_bytes)
            for m in g["gemms"]:
                rows, cols = GEMMS[m["name"]]
                assert m["estimate_us"] == pytest.approx(_gemm_line_us(rows * cols * 2, t), rel=1e-9)
    assert "GEMMs alone at T = 2" in cpu_run["report"]


@pytest.mark.interpreter
def test_comparison_without_a_read_limit_is_refused_naming_the_field(cpu_run):
    path = cpu_run["dir"] / "decode_sim.json"
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "estimate_gap.py"), str(path)], cwd=ROOT,
                          env=cpu_run["env"], capture_output=True, text=True, timeout=300)
    assert done.returncode == 2
    assert str(path) in done.stderr and "components.hbm_read_GBps" in done.stderr and "--hbm-read-GBps" in done.stderr
    assert "Traceback" not in done.stderr


def test_comparison_refuses_a_file_that_is_not_json(tmp_path, capsys):
    bad = tmp_path / "decode_sim.json"
    bad.write_text('{"env": {}\n  "models": {}}\n')
    assert estimate_gap.main([str(bad)]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "line 2" in err


# -- the committed H200 run: the docs' table ---------------------------------------------------------

def _docs_gap_table(head: str = "| model | T | step measured / estimate | experts alone measured / estimate |"
                    ) -> list[list[str]]:
    doc = (ROOT / "docs" / "costmodel.md").read_text()
    lines = doc[doc.index(head):].splitlines()[2:]
    rows = []
    for line in lines:
        if not line.startswith("|"):
            break
        rows.append([c.strip() for c in line.strip("|").split("|")])
    return rows


def _pair(cell: str) -> tuple[float, float]:
    a, b = (float(re.sub(r"[%*]", "", x)) for x in cell.split("/"))
    return a, b


def _docs_rows_with_results(result: dict, head: str | None = None) -> list[tuple[list[str], dict]]:
    """Each row of a docs gap table (six: two models x three T) with the comparison's all-HBM row
    for the same model and T (the model named on its first row only)."""
    rows = {(name, r["T"]): r for name, res in result["models"].items() for r in res["rows"] if r["case"] == "all_hbm"}
    table = _docs_gap_table(head) if head else _docs_gap_table()
    assert len(table) == 6
    model, out = None, []
    for cells in table:
        model = {"Qwen3-30B-A3B BF16": "qwen3-30b-a3b", "gpt-oss-120b MXFP4": "gpt-oss-120b"}.get(cells[0], model)
        out.append((cells, rows[(model, int(cells[1]))]))
    return out


def test_comparison_of_the_h200_run_is_the_docs_table():
    result = estimate_gap.compare(json.loads(H200.read_text()), 4110.287287363219, 51.25791042634007)
    for cells, r in _docs_rows_with_results(result):
        model, pl = cells[0], r["per_layer_us"]
        # the measured side (the estimate side was computed with the expert rows of that time,
        # before run 5 measured gpt-oss's and Qwen3's again: docs/costmodel.md says so)
        for cell, key in ((cells[2], "step"), (cells[3], "experts_alone"), (cells[4], "rest")):
            measured, _ = _pair(cell)
            assert pl[key]["measured"] == pytest.approx(measured, abs=0.051), (model, cells[1], key)
        share, _ = _pair(cells[7])
        assert 100 * r["experts"]["efficiency_alone"] == pytest.approx(share, abs=0.51), (model, cells[1])
        # an older run: no profile and no GEMMs alone, said as such
        assert pl["dense_gemm"]["measured"] is None and r["experts"]["efficiency_in_step"] is None
    assert all(g is None for res in result["models"].values() for g in res["gemms"].values())


def _check_gap_table(result: dict, head: str, estimates_of: set[str]) -> None:
    """Every measured cell of a docs gap table, and the estimate's cells for the models named."""
    model = None
    for cells, r in _docs_rows_with_results(result, head):
        model, pl = cells[0] or model, r["per_layer_us"]
        for cell, key in zip(cells[2:8], ("step", "experts_alone", "rest", "dense_gemm", "attention", "small_kernels")):
            measured, estimate = _pair(cell)
            assert pl[key]["measured"] == pytest.approx(measured, abs=0.051), (model, cells[1], key)
            if model in estimates_of:
                assert pl[key]["estimate"] == pytest.approx(estimate, abs=0.051), (model, cells[1], key)
        share, table_share = _pair(cells[8])
        assert 100 * r["experts"]["efficiency_alone"] == pytest.approx(share, abs=0.51), (model, cells[1])
        if model in estimates_of:
            assert 100 * r["experts"]["efficiency_table"] == pytest.approx(table_share, abs=0.51), (model, cells[1])


def test_comparison_of_the_profiled_h200_run_is_the_docs_table():
    """Run EB (profiled, the router in one launch): docs/costmodel.md's "Where the time goes, run EB",
    with the run's own read limits, every measured column from the profile. Its gpt-oss estimate
    column was computed with the MXFP4 rows of that time (before run ER measured today's kernels:
    the docs say so), so only Qwen3's estimate side is today's."""
    data = json.loads(H200_EB.read_text())
    result = estimate_gap.compare(data, data["components"]["hbm_read_GBps"], data["components"]["pinned_read_GBps"])
    _check_gap_table(result, "| model | T | step, measured / estimate | experts alone | rest |",
                     {"Qwen3-30B-A3B BF16"})


def test_comparison_of_run_ee_is_the_docs_table():
    """Run EE (the same command on today's kernels): docs/costmodel.md's "Where the time goes, run EE",
    every column, the estimate with the committed tables."""
    data = json.loads(H200_EE.read_text())
    result = estimate_gap.compare(data, data["components"]["hbm_read_GBps"], data["components"]["pinned_read_GBps"])
    _check_gap_table(result, "| model | T | step, measured / estimate | experts alone | rest (run EE) |",
                     {"Qwen3-30B-A3B BF16", "gpt-oss-120b MXFP4"})


def test_profiled_h200_run_routes_in_one_launch_per_layer():
    """The router's softmax + top-k is one launch per decoder layer in run EB's graph replays (vLLM's
    ``topk_softmax``), and no torch topk / sort / softmax kernel is left in the step."""
    data = json.loads(H200_EB.read_text())
    layers = {"qwen3-30b-a3b": 48, "gpt-oss-120b": 36}     # the models' num_hidden_layers
    for name, run in data["models"].items():
        for t, row in run["per_T"].items():
            kernels = row["all_hbm"]["kernels"]
            assert kernels["source"].startswith("CUDA graph replay") and kernels["device_times"]
            router = kernels["by_component"]["router_topk_softmax"]
            assert router["count"] == layers[name], (name, t, router)
            assert set(k for k, v in kernels["by_name"].items() if v["component"] == "router_topk_softmax") == {
                "_router_topk_softmax_kernel"}, (name, t)
