"""Model geometry in the ledger: expert scale layouts, KV per tensor-parallel rank (GQA replication,
MLA latents, sliding windows), hybrid models summed by layer kind, and the runtime's refusals.

Every expected figure is hand arithmetic from the model's published geometry, written out here.
"""

from __future__ import annotations

import math

import pytest

from recipegen.common.units import GiB
from recipegen.ledger import compute_lane
from recipegen.schema import Lane, Machine, Model

MACHINE = {"name": "box", "gpus": {"kind": "H200", "count": 8, "compute_capability": "9.0",
                                   "hbm": "141 GB", "hbm_bandwidth": "4.8 TB/s"},
           "host_memory": "2 TiB", "pinned_read_bandwidth": "55 GB/s"}


def machine(**gpus) -> Machine:
    data = {**MACHINE, "gpus": {**MACHINE["gpus"], **gpus}}
    return Machine.model_validate(data)


def lane(tp: int = 1, max_model_len: int = 32768, kv: str = "100 GiB", **offload) -> Lane:
    return Lane.model_validate({
        "name": "l", "machine": "box", "gpus": list(range(tp)), "port": 8000, "image": "vllm/vllm-openai:v0.33.0",
        "kv_cache_bytes": kv, "max_model_len": max_model_len, "concurrency": {"max": 1},
        "offload": offload or {"placement": "usage-aware", "hot_experts_per_layer": 128},
        "reserves": {"hbm": {"value": "2 GiB", "source": "test"}}})


def qwen3_235b(dtype: str = "bf16") -> Model:
    """Qwen3-235B-A22B: 94 layers, 128 experts top-8, hidden 4096, moe_intermediate 1536,
    GQA 64 q / 4 KV heads, head_dim 128."""
    scale = {"scale": {"dtype": "fp32", "block": [128, 128]}} if dtype == "fp8" else {}
    return Model.model_validate({
        "name": "q", "decoder_layers": 94, "moe_layers": "0-93", "routed_experts": 128, "top_k": 8,
        "expert_tensors": [{"name": "w13", "shape": [3072, 4096], "dtype": dtype, **scale},
                           {"name": "w2", "shape": [4096, 1536], "dtype": dtype, **scale}],
        "attention": [{"kind": "full", "layers": "0-93", "kv_heads": 4, "head_dim": 128}]})


def test_fp8_block_scales_close_the_gap() -> None:
    # w13 3072x4096: ceil(3072/128) * ceil(4096/128) = 24 * 32 = 768 fp32 scales;
    # w2 4096x1536: 32 * 12 = 384; (768 + 384) * 4 B = 4,608 B of scales per expert.
    values = 3 * 4096 * 1536  # one byte per fp8 value
    assert qwen3_235b("fp8").expert_bytes == values + 4608
    assert qwen3_235b("bf16").expert_bytes == values * 2


def test_int4_needs_its_groups_and_counts_them() -> None:
    # Kimi-K2-Thinking style int4 g32: w13 4096x7168 -> 4096*7168/2 B + 4096*(7168/32) bf16 scales.
    t = {"name": "w13", "shape": [4096, 7168], "dtype": "int4", "scale": {"dtype": "bf16", "block": [32]}}
    m = Model.model_validate({"name": "k", "decoder_layers": 1, "moe_layers": [0], "routed_experts": 2,
                              "top_k": 1, "expert_tensors": [t], "kv_bytes_per_token": "1 B"})
    assert m.expert_bytes == 4096 * 7168 // 2 + 4096 * 224 * 2
    with pytest.raises(ValueError, match="int4 values need their scale layout"):
        Model.model_validate({"name": "k", "decoder_layers": 1, "moe_layers": [0], "routed_experts": 2,
                              "top_k": 1, "expert_tensors": [{**t, "scale": None}], "kv_bytes_per_token": "1 B"})


def test_tp8_replicates_kv_heads_beyond_their_count() -> None:
    model = qwen3_235b()
    # TP=8 over 4 KV heads: vLLM keeps max(1, 4 // 8) = 1 head per GPU (replicated), so each GPU
    # caches 2 (K, V) * 1 * 128 * 2 B = 512 B per layer per token, 94 layers = 48,128 B per token.
    per_gpu = 94 * 2 * 1 * 128 * 2
    got = compute_lane(model, machine(), lane(tp=8))
    assert got.fig("kv.tokens").value == pytest.approx(100 * GiB / per_gpu)
    assert round(got.fig("kv.tokens").value / 1e6, 2) == 2.23
    # The even split (what the ledger used to assume) would be 4 heads / 8 = half a head: twice the tokens.
    assert got.fig("kv.tokens").value == pytest.approx(100 * GiB / (94 * 2 * 4 * 128 * 2 / 8) / 2)
    # At TP=2 the 4 heads split evenly: 2 heads per GPU.
    got2 = compute_lane(model, machine(), lane(tp=2))
    assert got2.fig("kv.tokens").value == pytest.approx(100 * GiB / (94 * 2 * 2 * 128 * 2))
    assert got2.fig("kv.full_sequences").value == math.floor(100 * GiB / (94 * 2 * 2 * 128 * 2) / 32768)


def test_mla_latent_is_on_every_rank() -> None:
    # DeepSeek-V3: 61 layers of MLA, kv_lora_rank 512 + qk_rope_head_dim 64, bf16:
    # (512 + 64) * 2 B = 1,152 B per layer per token, 70,272 B per token, the same on every GPU.
    model = Model.model_validate({
        "name": "d", "decoder_layers": 61, "moe_layers": "3-60", "routed_experts": 256, "top_k": 8,
        "bytes_per_expert": f"{44_040_192 + 10_752} B",
        "attention": [{"kind": "mla", "layers": "0-60", "kv_lora_rank": 512, "rope_head_dim": 64}]})
    assert model.kv_bytes_per_token == 70_272
    for tp in (1, 8):
        got = compute_lane(model, machine(), lane(tp=tp, hot_experts_per_layer=256))
        assert got.fig("kv.tokens").value == pytest.approx(100 * GiB / 70_272)


def test_sliding_window_layers_hold_one_window_per_sequence() -> None:
    # gpt-oss-120b: 36 layers alternating sliding (128 tokens) and full, 8 KV heads of 64:
    # 2 * 8 * 64 * 2 B = 2,048 B per layer per token. A 131,072-token sequence holds
    # 18 * 2048 * 131072 (full) + 18 * 2048 * 128 (sliding) bytes.
    model = Model.model_validate({
        "name": "g", "decoder_layers": 36, "moe_layers": "0-35", "routed_experts": 128, "top_k": 4,
        "bytes_per_expert": "13215744 B",
        "attention": [{"kind": "sliding", "layers": list(range(0, 36, 2)), "kv_heads": 8, "head_dim": 64,
                       "window": 128},
                      {"kind": "full", "layers": list(range(1, 36, 2)), "kv_heads": 8, "head_dim": 64}]})
    seq = 131072
    per_seq = 18 * 2048 * seq + 18 * 2048 * 128
    got = compute_lane(model, machine(), lane(max_model_len=seq, kv="20 GiB"))
    assert got.fig("kv.bytes_per_sequence").value == per_seq
    assert got.fig("kv.full_sequences").value == math.floor(20 * GiB / per_seq) == 4
    # Counting every layer at full length (36 * 2048 * 131072 = 9 GiB a sequence) fits only 2.
    assert math.floor(20 * GiB / (36 * 2048 * seq)) == 2
    assert got.fig("kv.tokens").value == pytest.approx(20 * GiB / (per_seq / seq))


def test_attention_groups_cover_every_layer_once() -> None:
    base = {"name": "x", "decoder_layers": 4, "moe_layers": "0-3", "routed_experts": 4, "top_k": 1,
            "bytes_per_expert": "10 B"}
    with pytest.raises(ValueError, match="leave decoder layers 3 out"):
        Model.model_validate({**base, "attention": [{"kind": "full", "layers": "0-2", "kv_heads": 1,
                                                     "head_dim": 8}]})
    with pytest.raises(ValueError, match="sliding attention needs window"):
        Model.model_validate({**base, "attention": [{"kind": "sliding", "layers": "0-3", "kv_heads": 1,
                                                     "head_dim": 8}]})
    with pytest.raises(ValueError, match="disagrees with the 128 bytes"):
        # 4 layers * 2 * 1 * 8 * 2 B = 128 B per token
        Model.model_validate({**base, "kv_bytes_per_token": "100 B",
                              "attention": [{"kind": "full", "layers": "0-3", "kv_heads": 1, "head_dim": 8}]})


def test_runtime_refusal_fails_a_usage_aware_lane_and_names_why() -> None:
    # FP16 experts with biases and the swigluoai activation (alpha 1.702, limit 7): the runtime's
    # fp16 row computes SILU only (gpt-oss's own MXFP4 and BF16 experts are supported).
    model = Model.model_validate({
        "name": "g", "decoder_layers": 2, "moe_layers": "0-1", "routed_experts": 4, "top_k": 1,
        "expert_tensors": [{"name": "w13", "shape": [64, 32], "dtype": "fp16"},
                           {"name": "w2", "shape": [32, 32], "dtype": "fp16"},
                           {"name": "w13_bias", "shape": [64], "dtype": "bf16", "kind": "bias"}],
        "activation": {"kind": "swigluoai", "alpha": 1.702, "limit": 7.0}, "kv_bytes_per_token": "64 B"})
    got = compute_lane(model, machine(), lane(hot_experts_per_layer=2))
    runtime = [v for v in got.violations if v.kind == "runtime"]
    assert len(runtime) == 1 and "swigluoai" in runtime[0].message and "positional" in runtime[0].suggestion
    # The same model on plain vLLM's positional offload is not the runtime's business.
    got = compute_lane(model, machine(), lane(placement="positional", load_cpu_offload="0 GiB"))
    assert not [v for v in got.violations if v.kind == "runtime"]


def test_positional_zero_offload_is_accepted_and_says_so() -> None:
    model = qwen3_235b()
    got = compute_lane(model, machine(), lane(placement="positional", load_cpu_offload="0 GiB"))
    assert got.positional is not None and got.positional.cold_bytes == 0
    assert any("0 GiB" in n and "every routed expert into HBM" in n for n in got.notes)
    with pytest.raises(ValueError, match="positional offload needs load_cpu_offload"):
        lane(placement="positional")


def _dense_model(**extra) -> Model:
    """4 decoder layers, layer 0 dense, layers 1-3 MoE with 2 experts of (w13 100 B + w2 50 B) bf16."""
    return Model.model_validate({
        "name": "w", "decoder_layers": 4, "moe_layers": "1-3", "routed_experts": 2, "top_k": 1,
        "expert_tensors": [{"name": "w13", "shape": [50], "dtype": "bf16"},
                           {"name": "w2", "shape": [25], "dtype": "bf16"}],
        "kv_bytes_per_token": "64 B", **extra})


def test_positional_walk_meets_dense_parameters_in_vllm_order() -> None:
    from recipegen.ledger import positional_walk
    model = _dense_model(decoder_layer_bytes={"moe_layer": "30 B", "dense_layer": "70 B"})
    # Layer params: w13 = 2 experts * 100 B = 200 B, w2 = 2 * 50 B = 100 B.
    # Order: dense layer 0 (70), layer 1 other (30), w13 (200), w2 (100), layer 2 other (30), w13 ...
    # Budget 350: offload while the running total < 350: 70, 30, 200 (=300), 100 (=400) -> stop.
    walk = positional_walk(model, 350)
    assert (walk.dense_offloaded, walk.offloaded_bytes, walk.host_per_layer) == (100, 300, [300, 0, 0])
    # Without the layer bytes only experts are walked: 200, 100 (=300), 200 (=500) -> stop.
    walk = positional_walk(_dense_model(), 350)
    assert (walk.dense_offloaded, walk.offloaded_bytes, walk.host_per_layer) == (0, 500, [300, 200, 0])
    # --cpu-offload-params experts: the same as experts only.
    walk = positional_walk(model, 350, experts_only=True)
    assert (walk.dense_offloaded, walk.offloaded_bytes) == (0, 500)


def test_dense_offloaded_leaves_hbm_and_joins_host() -> None:
    model = _dense_model(decoder_layer_bytes={"moe_layer": "30 B", "dense_layer": "70 B"})
    base = lane(placement="positional", load_cpu_offload="350 B", kv="1 GiB")
    got = compute_lane(model, machine(), base)
    assert got.fig("host.dense_offloaded").value == 100
    # experts as vLLM pins them on a positional lane (w13 200 B -> 256, w2 100 B -> 128: next power
    # of two, kept for the whole run) + dense, no host reserve declared
    assert got.fig("host.total").value == 256 + 128 + 100
    experts_only = compute_lane(model, machine(), base.model_copy(
        update={"extra_args": ["--cpu-offload-params", "experts"]}))
    assert "host.dense_offloaded" not in experts_only.figures
    assert experts_only.fig("host.total").value == (256 + 128) + 256  # layer 0 whole, layer 1's w13


def test_vllm_pads_gpt_oss_experts_for_marlin_not_for_triton() -> None:
    # gpt-oss-120b: hidden 2880, intermediate 2880, MXFP4 + bf16 biases, 13,236,480 B per expert.
    from recipegen.catalog import catalog_entry
    model = Model.model_validate(catalog_entry("models", "gpt-oss-120b"))
    positional = lane(placement="positional", load_cpu_offload="0 GiB", max_model_len=4096, kv="1 GiB")
    # SM89 (L40S): Marlin pads hidden to 256 (3072) and intermediate to 128 (2944):
    # w13 5888x3072 + w2 3072x2944 at 4.25 bits, biases (5888 + 3072) x 2 B.
    n = 2 * 2944 * 3072 + 3072 * 2944
    marlin = n // 2 + n // 32 + (5888 + 3072) * 2
    got = compute_lane(model, machine(compute_capability="8.9"), positional)
    assert got.fig("experts.bytes_per_expert").value == marlin == 14_431_744
    assert got.fig("experts.checkpoint_bytes_per_expert").value == 13_236_480
    # SM90 (H200): OAI Triton only rounds the intermediate size to 64 (2880 is a multiple): no padding.
    got = compute_lane(model, machine(compute_capability="9.0"), positional)
    assert got.fig("experts.bytes_per_expert").value == 13_236_480
    # A usage-aware lane keeps the checkpoint layout (the runtime holds back vLLM's conversion).
    from recipegen.ledger.vllm_layout import vllm_mxfp4_layout
    assert vllm_mxfp4_layout(model, machine(compute_capability="12.0"), 1) is not None


def test_pipeline_stage_caches_kv_for_its_own_layers(tmp_path) -> None:
    # gpt-oss-120b over two H200 boxes, PP=2: vLLM splits 36 layers 18 / 18; each stage holds 9
    # sliding (window 128) and 9 full layers: per 8,192-token sequence 9*2048*8192 + 9*2048*128 B.
    from recipegen.ledger import compute_ledger
    from recipegen.load.recipe import load_recipe
    recipe = tmp_path / "pp.yaml"
    recipe.write_text(
        "version: 1\nname: pp\nmodel: gpt-oss-120b\nmachines:\n"
        "  a: {catalog: h200-pcie, address: 10.0.0.1}\n  b: {catalog: h200-pcie, address: 10.0.0.2}\n"
        "lanes:\n  - name: chat\n    machine: a\n    gpus: [0]\n    port: 8000\n"
        "    image: vllm/vllm-openai:v0.33.0\n    gpu_memory_utilization: 0.9\n    max_model_len: 8192\n"
        "    concurrency: {max: 1}\n    offload: {placement: usage-aware, hot_experts_per_layer: 128}\n"
        "    reserves: {hbm: {value: 8 GiB, source: test}}\n"
        "    parallel:\n      pipeline:\n        - {machine: a, gpus: [0], all_experts_in_hbm: true}\n"
        "        - {machine: b, gpus: [0], all_experts_in_hbm: true}\n      master_port: 29501\n")
    lane = compute_ledger(load_recipe(recipe)).lanes[0]
    for stage in lane.stages:
        assert stage.ledger.fig("kv.bytes_per_sequence").value == 9 * 2048 * 8192 + 9 * 2048 * 128
    # Every expert in HBM: nothing for the runtime to split, so its refusal of gpt-oss does not apply.
    assert not [v for v in lane.violations if v.kind == "runtime"]


def test_unverified_device_is_a_note_not_a_failure() -> None:
    model = qwen3_235b()  # bf16 SwiGLU: the runtime splits it; verified on CPU only
    got = compute_lane(model, machine(compute_capability="8.9"), lane(hot_experts_per_layer=64))
    assert not [v for v in got.violations if v.kind == "runtime"]
    assert any("not verified on compute capability 8.9" in n for n in got.notes)


def test_moe_backend_flag_chooses_the_padding() -> None:
    from recipegen.catalog import catalog_entry
    model = Model.model_validate(catalog_entry("models", "gpt-oss-120b"))
    base = lane(placement="positional", load_cpu_offload="0 GiB", max_model_len=4096, kv="1 GiB")
    # On an H200 vLLM's default (OAI Triton) pads nothing; --moe-backend marlin pads like on an L40S.
    marlin = base.model_copy(update={"extra_args": ["--moe-backend", "marlin"]})
    assert compute_lane(model, machine(compute_capability="9.0"), marlin).fig(
        "experts.bytes_per_expert").value == 14_431_744
    # flashinfer_cutlass: hidden and intermediate to 128 -> 2944 x 2944.
    cutlass = base.model_copy(update={"extra_args": ["--moe-backend=flashinfer_cutlass"]})
    n = 2 * 2944 * 2944 + 2944 * 2944
    assert compute_lane(model, machine(compute_capability="9.0"), cutlass).fig(
        "experts.bytes_per_expert").value == n // 2 + n // 32 + (2 * 2944 + 2944) * 2


def test_fp8_kv_cache_halves_kv_per_token() -> None:
    model = qwen3_235b()
    fp8 = lane(tp=2).model_copy(update={"extra_args": ["--kv-cache-dtype", "fp8"]})
    # 2 KV heads per GPU at TP=2, 1 byte per element: 2 * 2 * 128 * 1 * 94 B per token.
    got = compute_lane(model, machine(), fp8)
    assert got.fig("kv.tokens").value == pytest.approx(100 * GiB / (94 * 2 * 2 * 128 * 1))
    odd = lane(tp=2).model_copy(update={"extra_args": ["--kv-cache-dtype=turboquant_4bit_nc"]})
    got = compute_lane(model, machine(), odd)
    # TurboQuant 4-bit: (64 + 2) + (64 + 4) = 134 B per KV head; layers 0, 1, 92, 93 stay bf16
    assert got.fig("kv.tokens").value == pytest.approx(100 * GiB / (90 * 2 * 134 + 4 * 2 * 2 * 128 * 2))
    assert any("TURBOQUANT" in n for n in got.notes)


def test_expert_parallel_lane_is_refused_by_the_runtime() -> None:
    model = qwen3_235b()
    ep = lane(hot_experts_per_layer=64).model_copy(update={"extra_args": ["--enable-expert-parallel"]})
    got = compute_lane(model, machine(), ep)
    assert not [v for v in got.violations if v.kind == "runtime" and "expert parallelism" in v.message]
    dp = ep.model_copy(update={"extra_args": ["--enable-expert-parallel", "--data-parallel-size", "2"]})
    assert [v for v in compute_lane(model, machine(), dp).violations
            if v.kind == "runtime" and "--data-parallel-size > 1" in v.message]
    eplb = lane(hot_experts_per_layer=64).model_copy(update={"extra_args": ["--enable-eplb"]})
    assert [v for v in compute_lane(model, machine(), eplb).violations if "EPLB" in v.message]


def test_cpu_offload_params_beyond_experts_is_said_not_modelled() -> None:
    model = _dense_model(decoder_layer_bytes={"moe_layer": "30 B", "dense_layer": "70 B"})
    base = lane(placement="positional", load_cpu_offload="350 B", kv="1 GiB")
    got = compute_lane(model, machine(), base.model_copy(update={"extra_args": ["--cpu-offload-params", "self_attn"]}))
    assert any("not modelled exactly" in n for n in got.notes)
    assert got.fig("host.dense_offloaded").value == 100   # walked as if unselective
