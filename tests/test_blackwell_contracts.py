"""Contract tests for the Blackwell bank kernel (``expert_residency.blackwell``) against the sources
it relies on, read as text (``ast``), never imported:

* vLLM 0.33.0 (``.cache/vllm-0.33.0``, scripts/fetch-vllm033-source.sh): the call
  ``TrtLlmMxfp4ExpertsModular._invoke_kernel`` makes, ``do_finalize`` and the unfinalized output's
  fields, the TRT-LLM weight/scale conversion steps, the activation quantization, the SM100 gate;
* FlashInfer 0.7.2.post1, the version vLLM 0.33.0's wheel pins (``Requires-Dist:
  flashinfer-python==0.7.2.post1``; ``.cache/flashinfer-python-0.7.2.post1``,
  scripts/fetch-flashinfer-source.sh): the routed entry point's parameters, the ``do_finalize=False``
  return list, the non-local-expert rule (``-1`` in the permute map, skipped by finalize), the
  launcher's range checks, the bf16 GEMM2 buffer, the row shuffle table and the 128x4 scale layout;
* vLLM's TRT-LLM conversion branch executed from its source text (with FlashInfer's own row
  permutation functions, also from source) equals ``blackwell.layout.to_trtllm_layout`` byte for byte.

A failure names the file and the missing piece: re-check docs/blackwell.md and the kernel before
moving to another vLLM or FlashInfer.
"""

from __future__ import annotations

import ast
import os
import re
from functools import cache
from pathlib import Path

import pytest
from vllm033_source import vllm033_source

REPO = Path(__file__).resolve().parent.parent
FLASHINFER_VERSION = "0.7.2.post1"
BLACKWELL = REPO / "runtime/expert_residency/blackwell"
EXPERTS_FILE = "model_executor/layers/fused_moe/experts/trtllm_mxfp4_moe.py"
ORACLE_FILE = "model_executor/layers/fused_moe/oracle/mxfp4.py"


def _flashinfer_root() -> Path | None:
    for candidate in (os.environ.get("RECIPEGEN_FLASHINFER_SRC"),
                      str(REPO / ".cache" / f"flashinfer-python-{FLASHINFER_VERSION}")):
        if candidate and (Path(candidate) / "flashinfer/__init__.py").is_file():
            return Path(candidate)
    return None


VLLM = vllm033_source(EXPERTS_FILE)
FLASHINFER = _flashinfer_root()
needs_vllm = pytest.mark.skipif(VLLM is None, reason="vllm 0.33.0 source absent: run "
                                "scripts/fetch-vllm033-source.sh or set RECIPEGEN_VLLM033_SRC")
needs_flashinfer = pytest.mark.skipif(
    FLASHINFER is None, reason=f"flashinfer-python {FLASHINFER_VERSION} source absent: run "
    "scripts/fetch-flashinfer-source.sh or set RECIPEGEN_FLASHINFER_SRC")


@cache
def _text(path: Path) -> str:
    if not path.is_file():
        pytest.fail(f"{path} does not exist")
    return path.read_text(encoding="utf-8")


@cache
def _tree(path: Path) -> ast.Module:
    return ast.parse(_text(path), filename=str(path))


def _find(path: Path, name: str, cls: str | None = None) -> ast.AST:
    scope: list[ast.stmt] = _tree(path).body
    if cls is not None:
        classes = [n for n in ast.walk(_tree(path)) if isinstance(n, ast.ClassDef) and n.name == cls]
        if not classes:
            pytest.fail(f"class {cls} not found in {path}")
        if name == cls:
            return classes[0]
        scope = classes[0].body
    for node in scope:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name == name:
            return node
    pytest.fail(f"{cls + '.' if cls else ''}{name} not found in {path}")


def _calls(node: ast.AST, func: str) -> list[ast.Call]:
    out = []
    for n in ast.walk(node):
        if isinstance(n, ast.Call):
            f = n.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
            if name == func:
                out.append(n)
    return out


def _keywords(call: ast.Call) -> dict[str, str]:
    return {k.arg: ast.unparse(k.value) for k in call.keywords if k.arg}


def _routed_call(path: Path, fn: str, cls: str) -> ast.Call:
    calls = _calls(_find(path, fn, cls), "trtllm_fp4_block_scale_routed_moe")
    if len(calls) != 1:
        pytest.fail(f"{cls}.{fn} in {path}: expected one trtllm_fp4_block_scale_routed_moe call, "
                    f"found {len(calls)}")
    return calls[0]


def _ours() -> ast.Call:
    calls = _calls(_find(BLACKWELL / "trtllm.py", "bank_call", "TrtllmMxfp4Banks"), "routed_moe")
    assert len(calls) == 1
    return calls[0]


# -- vLLM 0.33.0 ------------------------------------------------------------------------------
@needs_vllm
def test_vllm_modular_experts_call_the_routed_kernel_with_our_keywords() -> None:
    path = VLLM / EXPERTS_FILE
    cls = _find(path, "TrtLlmMxfp4ExpertsModular", "TrtLlmMxfp4ExpertsModular")
    assert [ast.unparse(b) for b in cls.bases] == ["TrtLlmMxfp4ExpertsBase",
                                                   "mk.FusedMoEExpertsModular"]
    theirs = _keywords(_routed_call(path, "_invoke_kernel", "TrtLlmMxfp4ExpertsModular"))
    ours = _keywords(_ours())
    # The same call: every keyword vLLM passes, nothing else.
    assert set(ours) == set(theirs), (set(ours) ^ set(theirs))
    assert theirs["topk_ids"] == "(topk_ids, topk_weights)" and ours["topk_ids"] == "(ids, weights)"
    assert theirs["do_finalize"] == "output is not None" and ours["do_finalize"] == "False"
    assert theirs["routing_method_type"] == "RoutingMethodType.Renormalize"
    assert ours["routing_method_type"] == "RENORMALIZE"
    for fixed in ("routing_bias", "output1_scale_scalar", "output1_scale_gate_scalar",
                  "output2_scale_scalar", "n_group", "topk_group", "routed_scaling_factor"):
        assert theirs[fixed] == ours[fixed] == "None", fixed
    assert theirs["enable_pdl"] == ours["enable_pdl"] == "True"
    assert theirs["local_expert_offset"] == "local_expert_offset"
    assert theirs["local_num_experts"] == "local_num_experts"
    assert theirs["num_experts"] == "global_num_experts"


@needs_vllm
def test_vllm_expert_parallel_numbering_is_the_one_banks_reuse() -> None:
    path = VLLM / EXPERTS_FILE
    apply = ast.unparse(_find(path, "apply", "TrtLlmMxfp4ExpertsModular"))
    # Ids stay global; a rank's experts are the contiguous range [ep_rank * local, + local).
    assert "local_num_experts = w1.size(0)" in apply
    assert "local_expert_offset = self.moe_config.ep_rank * local_num_experts" in apply
    assert "topk_ids = topk_ids.to(dtype=torch.int32)" in apply
    bound = ast.unparse(_find(path, "_max_supported_tokens", "TrtLlmMxfp4ExpertsModular"))
    assert "MAX_GRID_Y = 65535" in bound and "MIN_TILE_TOKENS_DIM = 8" in bound
    gate = ast.unparse(_find(path, "_supports_current_device", "TrtLlmMxfp4ExpertsBase"))
    assert "is_device_capability_family(100)" in gate
    # Our default tile bound is vLLM's formula.
    from expert_residency.blackwell.trtllm import MAX_GRID_Y, MIN_TILE_TOKENS_DIM

    assert (MAX_GRID_Y, MIN_TILE_TOKENS_DIM) == (65535, 8)


@needs_vllm
def test_vllm_unfinalized_output_contract() -> None:
    path = VLLM / "model_executor/layers/fused_moe/moe_output.py"
    src = _text(path)
    cls = _find(path, "UnfinalizedMoEOutput", "UnfinalizedMoEOutput")
    fields = [n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)]
    assert fields[:3] == ["gemm2_permuted", "expert_weights", "expanded_idx_to_permuted_idx"]
    assert "permuted, unweighted GEMM2 output" in src
    assert "-1 = expert not local to this rank" in src
    convert = ast.unparse(_find(path, "convert_flashinfer_moe_output"))
    assert "gemm2_permuted, expert_weights, expanded_idx = flashinfer_output" in convert
    assert "expanded_idx.dtype != torch.int32" in convert
    assert "gemm2_permuted.ndim != 2" in convert


@needs_vllm
def test_vllm_trtllm_weight_conversion_steps() -> None:
    path = VLLM / ORACLE_FILE
    fn = _find(path, "convert_weight_to_mxfp4_moe_kernel_format")
    branches = [n for n in ast.walk(fn) if isinstance(n, ast.If)
                and ast.unparse(n.test) == "mxfp4_backend in TRTLLM_BACKENDS"]
    assert len(branches) == 1, "one TRT-LLM branch"
    body = "\n".join(ast.unparse(s) for s in branches[0].body)
    # 1. up rows first, interleaved with gate rows (weights and scales).
    assert "torch.stack([w3_weight, w1_weight], dim=2).reshape(w13_weight.shape)" in body
    assert "torch.stack([w3_scale, w1_scale], dim=2).reshape(w13_weight_scale.shape)" in body
    assert "w1_weight = w13_weight[:, :intermediate_size, :]" in body
    # 2. the epilogue row shuffle, tile 128, the same for scales (num_elts_per_sf=16).
    assert "epilogue_tile_m = 128" in body
    # weights, scales (x2) and the two optional biases
    assert len(_calls(branches[0], "get_w2_permute_indices_with_cache")) == 6
    assert body.count("num_elts_per_sf=16") == 2
    assert "w13_weight.view(torch.uint8)[:, w13_perm].contiguous()" in body
    assert "w2_weight.view(torch.uint8)[:, w2_perm].contiguous()" in body
    # 3. one 128x4 interleave over all experts' rows, reshaped back per expert, fp8 view.
    assert "nvfp4_block_scale_interleave(w13_s.reshape(E * N_s, K_s))" in body
    assert "nvfp4_block_scale_interleave(w2_s.reshape(E2 * N2_s, K2_s))" in body
    assert body.count(".view(torch.float8_e4m3fn)") == 2
    from expert_residency.blackwell.layout import EPILOGUE_TILE_M

    assert EPILOGUE_TILE_M == 128


@needs_vllm
def test_vllm_trtllm_round_up_meets_bank_separability() -> None:
    fn = ast.unparse(_find(VLLM / ORACLE_FILE, "mxfp4_round_up_hidden_size_and_intermediate_size"))
    m = re.search(r"elif backend in TRTLLM_BACKENDS:\s*intermediate_size = round_up\(intermediate_size, "
                  r"(\d+)\)\s*hidden_size = round_up\(hidden_size, (\d+)\)", fn)
    assert m, "TRT-LLM round-up not found"
    inter_align, hidden_align = int(m.group(1)), int(m.group(2))
    assert (inter_align, hidden_align) == (128, 256)
    from expert_residency.blackwell.layout import check_bank_separable

    check_bank_separable(hidden_align, inter_align)  # every rounded geometry splits


@needs_vllm
def test_vllm_activation_quantization_for_trtllm_mxfp8() -> None:
    oracle = ast.unparse(_find(VLLM / ORACLE_FILE, "make_mxfp4_moe_quant_config"))
    block = oracle[oracle.index("Mxfp4MoeBackend.FLASHINFER_TRTLLM_MXFP4_MXFP8:"):]
    block = block[:block.index("elif")]
    assert "mx_alignment=256" in block and "is_scale_swizzled=False" in block
    quant = _find(VLLM / "model_executor/layers/fused_moe/utils.py", "moe_kernel_quantize_input")
    params = [a.arg for a in quant.args.args]
    for name in ("A", "A_scale", "quant_dtype", "per_act_token_quant", "block_shape",
                 "is_scale_swizzled", "mx_alignment"):
        assert name in params, name
    assert "quant_dtype == 'mxfp8'" in ast.unparse(quant)
    apply = ast.unparse(_find(VLLM / EXPERTS_FILE, "apply", "TrtLlmMxfp4ExpertsModular"))
    assert "x_scale = a1q_scale.view(torch.float8_e4m3fn)" in apply
    # DeepSeek-V4-style MXFP4 layers try TRT-LLM with MXFP8 activations first.
    prio = ast.unparse(_find(VLLM / ORACLE_FILE, "_get_priority_backends"))
    assert prio.index("FLASHINFER_TRTLLM_MXFP4_MXFP8") < prio.index("MARLIN")


@needs_vllm
def test_vllm_silu_maps_to_flashinfer_swiglu_and_moe_backend_name() -> None:
    utils = _text(VLLM / "model_executor/layers/quantization/utils/flashinfer_utils.py")
    assert "MoEActivation.SILU: ActivationType.Swiglu" in utils
    mapping = ast.unparse(_find(VLLM / ORACLE_FILE, "map_mxfp4_backend"))
    assert "'flashinfer_trtllm': [Mxfp4MoeBackend.FLASHINFER_TRTLLM_MXFP4_BF16, " \
           "Mxfp4MoeBackend.FLASHINFER_TRTLLM_MXFP4_MXFP8]" in mapping
    assert "'triton_unfused': [Mxfp4MoeBackend.TRITON_UNFUSED]" in mapping
    from expert_residency.blackwell.select import FLASHINFER_TRTLLM, STOCK_MOE_BACKEND

    assert STOCK_MOE_BACKEND[FLASHINFER_TRTLLM] == "flashinfer_trtllm"


@needs_vllm
def test_vllm_tree_expects_flashinfer_0_7_2() -> None:
    # The unpacked tree has no METADATA; its specialized decode path names the same release.
    src = _text(VLLM / "models/deepseek_v41/nvidia/specialized_decode/__init__.py")
    assert 'FLASHINFER_VERSION = "0.7.2"' in src
    assert FLASHINFER_VERSION.startswith("0.7.2")


# -- FlashInfer 0.7.2.post1 -----------------------------------------------------------------
FI_CORE = "flashinfer/fused_moe/core.py"
FI_CSRC = "flashinfer/data/csrc"
FI_INCLUDE = "flashinfer/data/include/flashinfer/trtllm/fused_moe"


@needs_flashinfer
def test_flashinfer_version() -> None:
    meta = _text(FLASHINFER / f"flashinfer_python-{FLASHINFER_VERSION}.dist-info/METADATA")
    assert f"\nVersion: {FLASHINFER_VERSION}\n" in meta


@needs_flashinfer
def test_flashinfer_routed_entry_point_accepts_our_call() -> None:
    fn = _find(FLASHINFER / FI_CORE, "trtllm_fp4_block_scale_routed_moe")
    a = fn.args
    params = [p.arg for p in a.args + a.kwonlyargs]
    for name in _keywords(_ours()):
        assert name in params, name
    defaults = dict(zip([p.arg for p in a.args][-len(a.defaults):], map(ast.unparse, a.defaults)))
    assert defaults["do_finalize"] == "True" and defaults["routing_method_type"] == "0"
    doc = ast.get_docstring(fn) or ""
    assert "Unpacked format: ``topk_ids`` is a tuple ``(topk_ids, topk_weights)``" in doc
    split = ast.unparse(_find(FLASHINFER / FI_CORE, "_split_precomputed_routing"))
    assert "if isinstance(topk_ids, tuple):" in split
    assert "return (topk_ids_tensor, topk_weights, RoutingInputMode.UnpackedPrecomputed)" in split
    assert "consumed at their native dtype" in doc
    src = _text(FLASHINFER / FI_CORE)
    assert ("``False``      ``None``            "
            "``[gemm2_output, expert_weights, expanded_idx_to_permuted_idx]``") in src
    enums = _text(FLASHINFER / "flashinfer/tllm_enums.py")
    assert re.search(r"\n\s+Swiglu = 3\n", enums) and re.search(r"\n\s+Renormalize = \(1,\)\n", enums)
    from expert_residency.blackwell.trtllm import RENORMALIZE, SWIGLU

    assert (SWIGLU, RENORMALIZE) == (3, 1)


@needs_flashinfer
def test_flashinfer_non_local_experts_get_minus_one_and_are_skipped() -> None:
    custom = _text(FLASHINFER / FI_CSRC / "fused_moe/trtllm_backend/trtllm_fused_moe_routing_custom.cuh")
    assert "auto isLocal = localExpIdx >= 0 && localExpIdx < localExpertExtent &&" in custom
    assert re.search(r"isLocal \? expertScanCountsPerExpert\[e\] \+ static_cast<int>\(smemOffset\[offset\]\)"
                     r"\s*: int32_t\{-1\};", custom)
    assert "auto localExpIdx = expert - params.mLocalExpertsStartIdx;" in custom
    kernel = _text(FLASHINFER / FI_INCLUDE / "RoutingKernel.cuh")
    assert "isLocalExpert ? int32_t{smemExpertOffset[expertIdx]} + expertOffsets[ii] : int32_t{-1};" in kernel
    dev = _text(FLASHINFER / FI_CSRC / "fused_moe/trtllm_backend/trtllm_fused_moe_dev_kernel.cu")
    # finalize: non-local routes contribute nothing; local ones are weighted there, not in GEMM2.
    assert re.search(r"if \(permutedIdx == -1\) \{\s*continue;\s*\}", dev)
    assert "data += float{scale} *" in dev


@needs_flashinfer
def test_flashinfer_launcher_range_checks_and_gemm2_buffer() -> None:
    src = _text(FLASHINFER / FI_CSRC / "trtllm_fused_moe_kernel_launcher.cu")
    assert re.search(r"args->local_expert_offset >= 0 &&\s*args->local_expert_offset \+ "
                     r"args->local_num_experts <= args->num_experts", src)
    assert "args->local_num_experts > 0 && args->local_num_experts <= args->num_experts" in src
    fp4 = src[src.index("class FP4BlockScaleLauncher"):]
    assert re.search(r"gemm2_output = alloc_tensor\(\{max_num_padded_tokens_gemm2, hidden_size_output\}, "
                     r"dl_bfloat16", fp4)
    assert "MoeRunResultBuffers result(args->do_finalize, args->do_finalize ? output : gemm2_output);" in fp4
    assert "result.expanded_to_permuted_indices = expanded_idx_to_permuted_idx;" in fp4
    assert "topk_weights.dtype() == dl_bfloat16 || topk_weights.dtype() == dl_float32" in fp4


def _flashinfer_function(path: Path, name: str) -> str:
    return ast.unparse(_find(path, name))


@needs_flashinfer
def test_flashinfer_row_shuffle_is_our_permutation() -> None:
    torch = pytest.importorskip("torch")
    path = FLASHINFER / "flashinfer/utils.py"
    tree = _tree(path)
    tables = {t.id: ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
              for t in n.targets if isinstance(t, ast.Name) and t.id.startswith("srcToDstBlk")}
    assert tables["srcToDstBlk32RowMap"] == [8 * (r % 4) + r // 4 for r in range(32)]
    # Run FlashInfer's own (pure torch) index function from its source text and compare.
    namespace: dict = {"torch": torch, **tables}
    for name in ("get_shuffle_block_size", "get_shuffle_matrix_a_row_indices"):
        exec(compile(_flashinfer_function(path, name), str(path), "exec"), namespace)
    from expert_residency.blackwell.layout import epilogue_row_permutation

    for rows in (128, 256, 4096):
        theirs = namespace["get_shuffle_matrix_a_row_indices"](torch.zeros(rows, 1), 128)
        assert torch.equal(theirs, epilogue_row_permutation(rows)), rows
    sf = _flashinfer_function(path, "get_shuffle_matrix_sf_a_row_indices")
    assert "assert M % 128 == 0" in sf and "get_shuffle_matrix_a_row_indices(input_tensor, epilogue_tile_m)" in sf


@needs_flashinfer
def test_flashinfer_128x4_scale_layout_is_ours() -> None:
    torch = pytest.importorskip("torch")
    src = _text(FLASHINFER / "flashinfer/data/csrc/nv_internal/tensorrt_llm/kernels/quantization_utils.cuh")
    body = src[src.index("get_sf_out_offset_128x4(int mIdx, int kIdx, int numColVecs)"):]
    body = body[:body.index("return SFOffset;")]
    strides = dict(re.findall(r"int64_t (\w+Stride) = ([^;]+);", body))
    assert strides["innerKStride"] == "1"
    assert strides["innerMStride"].startswith("4 * innerKStride")
    assert strides["outerMStride"].startswith("4 * innerMStride")
    assert strides["kTileStride"].startswith("32 * outerMStride")
    assert "int32_t innerMIdx = (mIdx % (32 * 4)) / 32;" in body
    assert "int32_t outerMIdx = (mIdx % 32);" in body
    assert "int32_t mTileIdx = mIdx / (32 * 4);" in body
    assert "int64_t mTileStride = numKTiles * kTileStride;" in body
    # Evaluate that formula (strides 1, 4, 16, 512) and compare with our swizzle.
    from expert_residency.blackwell.layout import swizzle_128x4

    m, c = 256, 12
    sf = torch.arange(m * c).reshape(m, c)
    flat = swizzle_128x4(sf).reshape(-1)
    for row in range(0, m, 7):
        for col in range(c):
            offset = (row // 128) * (c // 4) * 512 + (col // 4) * 512 + (row % 32) * 16 \
                + ((row % 128) // 32) * 4 + col % 4
            assert int(flat[offset]) == int(sf[row, col])


# -- docs/blackwell.md cites these lines: each must still hold what the doc says -------------
DOC = REPO / "docs" / "blackwell.md"
VLLM_CITES = [  # (file under vllm/, line, text on that line)
    (EXPERTS_FILE, 121, "def _supports_current_device"),
    (EXPERTS_FILE, 123, "is_device_capability_family(100)"),
    (EXPERTS_FILE, 355, "def _invoke_kernel("),
    (EXPERTS_FILE, 339, "def _max_supported_tokens"),
    (EXPERTS_FILE, 440, "local_expert_offset = self.moe_config.ep_rank * local_num_experts"),
    (ORACLE_FILE, 361, '"flashinfer_trtllm": ['),
    (ORACLE_FILE, 871, "elif backend in TRTLLM_BACKENDS:"),
    (ORACLE_FILE, 453, "Mxfp4MoeBackend.FLASHINFER_TRTLLM_MXFP4_MXFP8,"),
    (ORACLE_FILE, 1556, "def convert_weight_to_mxfp4_moe_kernel_format("),
    (ORACLE_FILE, 1666, "if mxfp4_backend in TRTLLM_BACKENDS:"),
    (ORACLE_FILE, 1685, "w13_weight = torch.stack([w3_weight, w1_weight], dim=2)"),
    (ORACLE_FILE, 1703, "epilogue_tile_m = 128"),
    (ORACLE_FILE, 1723, "nvfp4_block_scale_interleave(w13_s.reshape(E * N_s, K_s))"),
    (ORACLE_FILE, 2129, "Mxfp4MoeBackend.FLASHINFER_TRTLLM_MXFP4_MXFP8:"),
    ("model_executor/layers/fused_moe/moe_output.py", 10, "@dataclass"),
    ("model_executor/layers/fused_moe/moe_output.py", 11, "class UnfinalizedMoEOutput"),
    ("model_executor/layers/fused_moe/moe_output.py", 61, "def convert_flashinfer_moe_output("),
    ("envs.py", 1801, '"VLLM_FLASHINFER_AUTOTUNE_SKIP_OPS": lambda: ('),
    ("model_executor/warmup/kernel_warmup.py", 470, "skip_ops = _flashinfer_autotune_skip_ops(runner)"),
    ("model_executor/warmup/kernel_warmup.py", 476, 'autotune_kwargs["skip_ops"] = skip_ops'),
]
FLASHINFER_CITES = [  # (file under the unpacked wheel, line, text on that line)
    (FI_CORE, 6606, "def trtllm_fp4_block_scale_routed_moe("),
    (FI_CORE, 5178, "[gemm2_output, expert_weights, expanded_idx_to_permuted_idx]"),
    (f"{FI_CSRC}/trtllm_fused_moe_kernel_launcher.cu", 716, "topk_ids.size(1), top_k"),
    (f"{FI_CSRC}/trtllm_fused_moe_kernel_launcher.cu", 724, "local_expert_offset + local_num_experts <= num_experts"),
    (f"{FI_CSRC}/trtllm_fused_moe_kernel_launcher.cu", 1399, "args->local_expert_offset + args->local_num_experts <= args->num_experts"),
    (f"{FI_CSRC}/trtllm_fused_moe_kernel_launcher.cu", 5236, "gemm2_output = alloc_tensor({max_num_padded_tokens_gemm2"),
    (f"{FI_CSRC}/trtllm_fused_moe_kernel_launcher.cu", 5374, "MoeRunResultBuffers result(args->do_finalize"),
    (f"{FI_CSRC}/fused_moe/trtllm_backend/trtllm_fused_moe_routing_custom.cuh", 130, "expertIdx > -1 && expertIdx < params.mNumExperts"),
    (f"{FI_CSRC}/fused_moe/trtllm_backend/trtllm_fused_moe_routing_custom.cuh", 196, "auto isLocal = localExpIdx >= 0"),
    (f"{FI_CSRC}/fused_moe/trtllm_backend/trtllm_fused_moe_routing_custom.cuh", 306, ": int32_t{-1};"),
    (f"{FI_INCLUDE}/RoutingKernel.cuh", 363, "auto isLocalExpert = localExpertIdx >= 0"),
    (f"{FI_INCLUDE}/RoutingKernel.cuh", 538, "isLocalExpert ? int32_t{smemExpertOffset[expertIdx]}"),
    (f"{FI_CSRC}/fused_moe/trtllm_backend/trtllm_fused_moe_dev_kernel.cu", 114, "if (permutedIdx == -1) continue;"),
    (f"{FI_CSRC}/fused_moe/trtllm_backend/trtllm_fused_moe_dev_kernel.cu", 701, "if (permutedIdx == -1) {"),
    ("flashinfer/utils.py", 1053, "srcToDstBlk32RowMap = ["),
    ("flashinfer/utils.py", 1073, "def get_shuffle_matrix_a_row_indices("),
    ("flashinfer/data/csrc/nv_internal/tensorrt_llm/kernels/quantization_utils.cuh", 995,
     "get_sf_out_offset_128x4(int mIdx, int kIdx, int numColVecs)"),
    (f"{FI_CSRC}/trtllm_batched_gemm_runner.cu", 544, "prefer fewer split-K slices"),
    (f"{FI_CSRC}/trtllm_batched_gemm_runner.cu", 549, "}"),
    (f"{FI_CSRC}/trtllm_batched_gemm_runner.cu", 547,
     "if (optionsA.mNumSlicesForSplitK != optionsB.mNumSlicesForSplitK) {"),
    (FI_CORE, 3650, '"flashinfer::trtllm_fp4_block_scale_moe",'),
    ("flashinfer/autotuner/autotuner.py", 2205, "if custom_op in self._effective_skip_ops:"),
]


def _line(path: Path, number: int) -> str:
    lines = _text(path).splitlines()
    return lines[number - 1] if number <= len(lines) else ""


@needs_vllm
@pytest.mark.parametrize("rel,number,text", VLLM_CITES)
def test_doc_cites_vllm_lines(rel: str, number: int, text: str) -> None:
    assert text in _line(VLLM / rel, number), f"vllm/{rel}:{number} no longer holds {text!r}"
    assert re.search(rf"{number}\b", _text(DOC)), f"docs/blackwell.md does not cite line {number}"


@needs_flashinfer
@pytest.mark.parametrize("rel,number,text", FLASHINFER_CITES)
def test_doc_cites_flashinfer_lines(rel: str, number: int, text: str) -> None:
    assert text in _line(FLASHINFER / rel, number), f"{rel}:{number} no longer holds {text!r}"


def test_doc_cites_every_pinned_line() -> None:
    """Every line pinned above appears in docs/blackwell.md (alone or as a range end)."""
    doc = _text(DOC)
    inside_cited_ranges = {("moe_output.py", 11), ("trtllm_batched_gemm_runner.cu", 547)}
    for rel, number, _ in VLLM_CITES + FLASHINFER_CITES:
        if (rel.rsplit("/", 1)[-1], number) in inside_cited_ranges:
            continue
        assert re.search(rf"(?<![\d.]){number}(?!\d)", doc), f"docs/blackwell.md does not cite {rel}:{number}"


@needs_vllm
@needs_flashinfer
def test_vllm_conversion_run_from_source_equals_our_layout_model() -> None:
    """vLLM 0.33's TRT-LLM conversion branch, executed from its source text with FlashInfer's own
    row-permutation functions (also from source); only the 128x4 interleave kernel (CUDA) is our
    model, checked against the C++ offset formula above. Its output must equal
    ``layout.to_trtllm_layout`` byte for byte."""
    torch = pytest.importorskip("torch")
    from expert_residency.blackwell.layout import swizzle_128x4, to_trtllm_layout
    from expert_residency.mxfp4 import quantize_mxfp4

    fn = _find(VLLM / ORACLE_FILE, "convert_weight_to_mxfp4_moe_kernel_format")
    branch = next(n for n in ast.walk(fn) if isinstance(n, ast.If)
                  and ast.unparse(n.test) == "mxfp4_backend in TRTLLM_BACKENDS")
    body = [s for s in branch.body if not isinstance(s, ast.ImportFrom)]
    args = ["w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale", "w13_bias", "w2_bias",
            "_cache_permute_indices", "num_experts", "intermediate_size", "hidden_size",
            "sf_block_size"]
    module = ast.Module(body=[ast.FunctionDef(
        name="vllm_trtllm_branch", args=ast.arguments(
            posonlyargs=[], args=[ast.arg(a) for a in args], kwonlyargs=[], kw_defaults=[],
            defaults=[]), body=body, decorator_list=[], returns=None, type_params=[])],
        type_ignores=[])
    namespace: dict = {"torch": torch}
    utils_path, core_path = FLASHINFER / "flashinfer/utils.py", FLASHINFER / FI_CORE
    for node in _tree(utils_path).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id.startswith("srcToDstBlk")
                                                for t in node.targets):
            exec(compile(ast.Module([node], []), str(utils_path), "exec"), namespace)
    for path, name in ((utils_path, "get_shuffle_block_size"),
                       (utils_path, "get_shuffle_matrix_a_row_indices"),
                       (utils_path, "get_shuffle_matrix_sf_a_row_indices"),
                       (core_path, "get_w2_permute_indices_with_cache")):
        exec(compile(_flashinfer_function(path, name), str(path), "exec"), namespace)
    namespace["nvfp4_block_scale_interleave"] = lambda sf: swizzle_128x4(sf).reshape(-1)
    exec(compile(ast.fix_missing_locations(module), str(VLLM / ORACLE_FILE), "exec"), namespace)

    experts, hidden, inter = 3, 256, 128
    g = torch.Generator().manual_seed(5)
    q13, s13 = quantize_mxfp4(torch.randn(experts, 2 * inter, hidden, generator=g))
    q2, s2 = quantize_mxfp4(torch.randn(experts, hidden, inter, generator=g))
    theirs = namespace["vllm_trtllm_branch"](q13.clone(), q2.clone(), s13.clone(), s2.clone(), None,
                                             None, {}, experts, inter, hidden, 32)
    ours = {"w13_weight": q13, "w13_weight_scale": s13, "w2_weight": q2, "w2_weight_scale": s2}
    to_trtllm_layout(ours)
    for name, value in zip(("w13_weight", "w2_weight", "w13_weight_scale", "w2_weight_scale"), theirs):
        assert value.dtype == ours[name].dtype, name
        assert torch.equal(value.view(torch.uint8), ours[name].view(torch.uint8)), name
