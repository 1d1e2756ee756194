"""vLLM 0.33's Hopper MoE kernel for DeepSeek-V4-style MXFP4 experts: Humming, driven the way vLLM's
glue drives it, for ``bench/peer_moe.py``.

Why Humming: ``Mxfp4MoEMethod`` (DeepSeek-V4.1's experts, ``models/deepseek_v41/quant_config.py``,
``activation_key=kMxfp8Dynamic``) selects through ``select_deepseek_v4_mxfp4_moe_backend``
(``model_executor/layers/fused_moe/oracle/mxfp4.py``), which walks ``_get_priority_backends()``:
FLASHINFER_TRTLLM_MXFP4_MXFP8, DEEPGEMM_MXFP4, MARLIN, BATCHED_MARLIN, HUMMING, reordered by
``prioritize_humming`` (``quantization/utils/humming/priority.py``: on compute capability 9.0 Humming
moves directly ahead of Marlin). The first two are SM100-family kernels, so an H100/H200 lane runs
HUMMING, with MARLIN next. Without expert parallelism ``get_humming_moe_gemm_type`` picks the
``indexed`` GEMM, i.e. ``HummingIndexedExperts`` (``fused_moe/experts/fused_humming_moe.py``).
``_humming_input_schema`` runs the checkpoint's MXFP8 activations as block FP8 (E4M3, one fp32
scale per 128 values) on Hopper, and ``HummingExpertsBase._prequantizes_dispatch_activation`` has
the prepare step quantize the layer input (``per_token_group_quant_fp8``, group 128, before the
dispatch) while Humming quantizes the w2 input itself, fused with the activation.

The kernels come from the published ``humming-kernels`` 0.1.19 wheel (the version vLLM 0.33.0 pins),
installed on the bench machine, JIT-compiled there through NVRTC; nothing of it is in this
repository. vLLM's own Python pieces around it are cut out of the unpacked 0.33.0 wheel by the AST at
run time (``load_vllm_glue``): ``per_token_group_quant_fp8`` + its Triton kernel (vLLM calls the
C++ twin ``torch.ops._C.per_token_group_fp8_quant`` when its compiled extension is loaded; the
extension is not Python, so the function's own Triton fallback runs), ``moe_fused_mul_sum`` (the
top-k reduction ``HummingIndexedExperts.apply`` ends with), ``get_humming_activation`` and
``create_humming_locks``. ``moe_align_block_size`` is a CUDA op of vLLM's extension: a torch
stand-in (``align_block_size``) gives its outputs, timed only in the peer's whole layer.

The weight conversion replays ``convert_to_humming_moe_kernel_format``
(``quantization/utils/humming/moe.py``) for ``quant_config={"quant_method": "mxfp4"}``,
``input_schema=quant_key_to_input_schema(kFp8Dynamic128Sym)``, ``allow_input_schema_fallback=False``:
per sublayer ``convert_humming`` of the weight and input schemas, the compatibility check of
``check_and_fallback_input_schema`` (which raises where this one raises), then
``prepare_and_transform_humming_tensors`` with ``pad_n_to_multiple=256, pad_k_to_multiple=128``.
The forward replays ``HummingIndexedExperts.apply`` (``prepare_humming_moe_kwargs``: block size from
the w13 tuning config's interval holding ``T * top_k``, a second alignment when w2's differs).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

# -- vLLM's Python glue, cut out of the unpacked wheel ---------------------------------------------

GLUE = {
    "model_executor/layers/quantization/utils/fp8_utils.py":
        ("_per_token_group_quant_fp8", "_per_token_group_quant_fp8_colmajor", "per_token_group_quant_fp8"),
    "model_executor/layers/fused_moe/moe_fused_mul_sum.py":
        ("moe_fused_mul_sum_kernel", "_heuristic_config", "moe_fused_mul_sum"),
    "model_executor/layers/quantization/utils/humming/activation.py":
        ("_SILU_IMPL", "_GELU_IMPL", "_RELU2_IMPL", "_GELU_TANH_IMPL", "_CLAMPED_SILU_IMPL",
         "_HUMMING_ACTIVATIONS", "get_humming_activation"),
    "utils/humming.py": ("create_humming_locks",),
}

_HEADER = '''from __future__ import annotations
import enum
from dataclasses import dataclass, replace
import torch
import triton
import triton.language as tl
from torch._subclasses.fake_tensor import FakeTensor


class MoEActivation(enum.Enum):   # vllm/model_executor/layers/fused_moe/activation.py
    SILU = "silu"
    GELU = "gelu"
    GELU_TANH = "gelu_tanh"
    RELU2 = "relu2"
    SWIGLUOAI = "swigluoai"
    SITU = "situ"
    SWIGLUOAI_UNINTERLEAVE = "swigluoai_uninterleave"
    SWIGLUSTEP = "swiglustep"
    SILU_NO_MUL = "silu_no_mul"
    GELU_NO_MUL = "gelu_no_mul"
    GELU_TANH_NO_MUL = "gelu_tanh_no_mul"
    RELU2_NO_MUL = "relu2_no_mul"


@dataclass
class ApplyMoEActivationConfig:   # same file, same defaults
    clamp_limit: float | None = None
    alpha: float = 1.0
    beta: float = 0.0
    activation_situ_beta: float | None = None
    activation_situ_linear_beta: float | None = None


class _Platform:   # vLLM's current_platform on an H100/H200 (compute capability 9.0)
    def is_cuda(self): return True
    def is_cuda_alike(self): return False   # no compiled _C extension here: the Triton fallback runs
    def is_xpu(self): return False
    def fp8_dtype(self): return torch.float8_e4m3fn
    def get_device_capability(self, device_id=0): return (9, 0)


current_platform = _Platform()


def get_fp8_min_max():   # quantization/utils/quant_utils.py on CUDA: the e4m3fn range
    finfo = torch.finfo(torch.float8_e4m3fn)
    return finfo.min, finfo.max


def num_compute_units(device_id=0):
    return torch.cuda.get_device_properties(device_id).multi_processor_count


USE_UE8M0 = True


def is_deep_gemm_e8m0_used():
    # True on an H200 with the wheel's DeepGEMM (VLLM_USE_DEEP_GEMM=1, VLLM_USE_DEEP_GEMM_E8M0=1,
    # the defaults): per_token_group_quant_fp8 then rounds each scale up to a power of two.
    return USE_UE8M0


def get_tma_aligned_size(x, alignment):
    return (x + alignment - 1) // alignment * alignment
'''


def _cut(text: str, names: tuple[str, ...], path: Path) -> dict[str, tuple[int, str]]:
    """Top-level functions, classes and assignments named in ``names``: (first line, source)."""
    tree = ast.parse(text)
    lines = text.splitlines()
    found: dict[str, tuple[int, str]] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            name = node.name
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            name = next((t.id for t in targets if isinstance(t, ast.Name)), None)
        else:
            continue
        if name in names:
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            found[name] = (first, "\n".join(lines[first - 1:node.end_lineno]))
    missing = set(names) - set(found)
    if missing:
        raise SystemExit(f"{path}: vLLM names {sorted(missing)} not found (another vLLM version?)")
    return found


def load_vllm_glue(vllm_src: Path, use_ue8m0: bool = True):
    """The names in ``GLUE`` as one module (Triton needs a real file for ``@triton.jit`` sources);
    ``mod.CITED`` maps each to ``file:line``."""
    parts, cited = [_HEADER, f"USE_UE8M0 = {bool(use_ue8m0)}"], {}
    for rel, names in GLUE.items():
        path = vllm_src / rel
        found = _cut(path.read_text(), names, path)
        for name in names:   # in the listed order: later names use earlier ones
            first, src = found[name]
            parts.append(src)
            cited[name] = f"{rel}:{first}"
    fd, tmp = tempfile.mkstemp(prefix="vllm_humming_glue_", suffix=".py")
    with os.fdopen(fd, "w") as f:
        f.write("\n\n\n".join(parts) + "\n")
    spec = importlib.util.spec_from_file_location("vllm_humming_glue", tmp)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod   # dataclasses look their module up while the file executes
    spec.loader.exec_module(mod)
    mod.CITED = cited
    return mod


# -- moe_align_block_size stand-in ------------------------------------------------------------------

def align_block_size(ids: torch.Tensor, block: int, experts: int):
    """The outputs of vLLM's CUDA ``moe_align_block_size(topk_ids, block, experts,
    ignore_invalid_experts=True)`` (``fused_moe/moe_align_block_size.py``), in torch, fixed shapes,
    no host sync: ``sorted_ids`` (each expert's flat pick indices ``t * top_k + k`` in order,
    padded to a multiple of ``block`` with the pick count), one expert id per block, and the padded
    total. Buffer sizes as vLLM allocates them (``max_num_tokens_padded``, capped at
    ``numel * block`` when there are fewer picks than experts). Ids outside ``0..E-1`` are dropped
    (sorted after every real pick, in no expert's blocks)."""
    flat = ids.reshape(-1).to(torch.int64)
    p = flat.numel()
    max_len = p + experts * (block - 1)
    if p < experts:
        max_len = min(p * block, max_len)
    valid = (flat >= 0) & (flat < experts)
    key = torch.where(valid, flat, torch.full_like(flat, experts))
    counts = torch.zeros(experts + 1, dtype=torch.int64, device=ids.device).scatter_add_(
        0, key, torch.ones_like(key))[:experts]
    padded = (counts + block - 1) // block * block
    ends = torch.cumsum(padded, 0)
    starts = ends - padded
    order = torch.argsort(key * p + torch.arange(p, device=ids.device))
    sorted_e = key[order]
    first = torch.cumsum(counts, 0) - counts
    real = sorted_e < experts
    e_safe = torch.where(real, sorted_e, torch.zeros_like(sorted_e))
    dest = starts[e_safe] + torch.arange(p, device=ids.device) - first[e_safe]
    dest = torch.where(real, dest, torch.full_like(dest, max_len))   # dropped: written past the end
    sorted_ids = torch.full((max_len + 1,), p, dtype=torch.int32, device=ids.device)
    sorted_ids.scatter_(0, dest, order.to(torch.int32))
    sorted_ids = sorted_ids[:max_len]
    blocks = torch.arange(0, (max_len + block - 1) // block * block, block, device=ids.device)
    expert_ids = torch.searchsorted(ends, blocks, right=True).clamp(max=experts - 1).to(torch.int32)
    return sorted_ids, expert_ids, ends[-1:].to(torch.int32)


# -- the peer ----------------------------------------------------------------------------------------

def vllm_input_schema():
    """``quant_key_to_input_schema(kFp8Dynamic128Sym)`` (``quantization/utils/humming/schema.py``):
    E4M3 activations, one dynamic fp32 scale per 128 values along K."""
    from humming import dtypes
    from humming.config import InputQuantizationMode
    from humming.schema import HummingInputSchema
    return HummingInputSchema(a_dtype=dtypes.float8e4m3, input_scale_group_size=128,
                              input_scale_dtype=dtypes.float32,
                              input_quant_mode=InputQuantizationMode.DynamicGroup)


def convert_sublayer(weight: torch.Tensor, scale: torch.Tensor, shape_n_stacks: list[int], shape_k: int,
                     num_experts: int, weight_schema, input_schema, device):
    """``_process_single_sublayer`` of vLLM's ``humming/moe.py`` for one sublayer (no forced
    requant, no bias): returns the Humming ``LayerConfig`` and the transformed tensors."""
    from humming.transform import prepare_and_transform_humming_tensors
    param_dtype = torch.bfloat16
    tensors = {"weight": weight, "weight_scale": scale}
    w_schema, converted = weight_schema.convert_humming(tensors=tensors, shape_n_stacks=shape_n_stacks,
                                                        shape_k_stacks=[shape_k], param_dtype=param_dtype,
                                                        num_experts=num_experts)
    i_schema, input_tensors = input_schema.convert_humming(tensors=tensors, shape_n_stacks=shape_n_stacks,
                                                           shape_k_stacks=[shape_k], param_dtype=param_dtype,
                                                           num_experts=num_experts)
    converted.update(input_tensors)
    # check_and_fallback_input_schema(..., allow_fallback=False): the schema as it is, or an error.
    i_schema = i_schema.to_humming_schema(param_dtype)
    if not i_schema.is_compatible_with(w_schema.to_humming_schema(param_dtype), param_dtype):
        raise ValueError(f"Humming refuses input schema {i_schema} with weight schema {w_schema} "
                         "(vLLM raises here too: allow_input_schema_fallback=False)")
    config, out = prepare_and_transform_humming_tensors(
        tensors=converted, shape_n=sum(shape_n_stacks), shape_k=shape_k, pad_n_to_multiple=256,
        pad_k_to_multiple=128, input_schema=i_schema, weight_schema=w_schema, has_bias=False,
        num_experts=num_experts, torch_dtype=param_dtype, device=device)
    return config, out


class HummingPeer:
    """vLLM 0.33's HUMMING backend (``HummingIndexedExperts``, block-FP8 activations) on one layer
    of checkpoint-layout MXFP4 experts (``w13 [E, 2I, H/2]`` gate rows first, ``w2 [E, H, I/2]``,
    ue8m0 scales ``[E, rows, K/32]``)."""

    name = "humming"

    def __init__(self, glue, ckpt: dict[str, torch.Tensor], top_k: int, swiglu_limit: float | None,
                 max_tokens: int, shapes_m: list[int] | None = None) -> None:
        """``shapes_m``: the ``T * top_k`` values the run will use. vLLM hands Humming the whole
        tuning list (one interval of ``T * top_k`` per kernel config) and Humming compiles every
        interval's kernel at the first call; given ``shapes_m`` only the intervals holding them
        (and the one holding 1, which the launcher reads first) are passed, with their bounds and
        configs unchanged, so the same kernel runs for each of those T and the others (about 20
        NVRTC compiles) are not built."""
        from humming.config import GemmType
        from humming.schema import BaseWeightSchema
        from humming.tune import get_heuristics_config
        self.glue = glue
        e, two_i, half_h = ckpt["w13_weight"].shape
        self.experts, self.inter, self.hidden, self.top_k = e, two_i // 2, half_h * 2, top_k
        device = ckpt["w13_weight"].device
        weight_schema = BaseWeightSchema.from_config({"quant_method": "mxfp4"})
        input_schema = vllm_input_schema()
        self.config13, t13 = convert_sublayer(ckpt["w13_weight"], ckpt["w13_weight_scale"],
                                              [self.inter, self.inter], self.hidden, e, weight_schema,
                                              input_schema, device)
        self.config2, t2 = convert_sublayer(ckpt["w2_weight"], ckpt["w2_weight_scale"], [self.hidden],
                                            self.inter, e, weight_schema, input_schema, device)
        self.t13, self.t2 = t13, t2
        # HummingExpertsBase.init_humming_moe: compute and tuning configs (VLLM_BATCH_INVARIANT and
        # VLLM_HUMMING_USE_F16_ACCUM off, the defaults; indexed GEMM without expert parallelism)
        self.compute_config = json.dumps({"use_batch_invariant": False, "use_f16_accum": False,
                                          "gemm_type": GemmType.INDEXED.value})
        self.tuning13 = get_heuristics_config(layer_config=self.config13, use_f16_accum=False,
                                              use_batch_invariant=False, gemm_type=GemmType.INDEXED)
        self.tuning2 = get_heuristics_config(layer_config=self.config2, use_f16_accum=False,
                                             use_batch_invariant=False, gemm_type=GemmType.INDEXED)
        self.intervals = {"w13": len(self.tuning13), "w2": len(self.tuning2)}
        if shapes_m:   # and the interval holding 1: Humming's launcher looks it up first (launcher.cpp)
            def keep(tuning: list) -> list:
                return [iv for iv in tuning if any(iv[0] < m <= iv[1] for m in [1, *shapes_m])]
            self.tuning13, self.tuning2 = keep(self.tuning13), keep(self.tuning2)
        self.tuning13_str, self.tuning2_str = json.dumps(self.tuning13), json.dumps(self.tuning2)
        # MoEActivation.SILU with the model's clamp (ApplyMoEActivationConfig.from_configs)
        act_cfg = glue.ApplyMoEActivationConfig(clamp_limit=swiglu_limit)
        self.activation = glue.get_humming_activation(glue.MoEActivation.SILU, act_cfg)
        self.locks = glue.create_humming_locks(device)
        # buffers (get_buffer_metas for the indexed GEMM: M tokens in, M * top_k rows out)
        m = max_tokens
        self.gate_up = torch.empty(m * top_k, 2 * self.inter, dtype=torch.bfloat16, device=device)
        self.down_in = torch.empty(m * top_k, self.inter, dtype=torch.float8_e4m3fn, device=device)
        self.down = torch.empty(m * top_k, self.hidden, dtype=torch.bfloat16, device=device)

    def describe(self) -> dict:
        return {"w13_layer_config": self.config13.to_str(), "w2_layer_config": self.config2.to_str(),
                "tuning_intervals_in_vllm_list": self.intervals, "w13_tuning_used": self.tuning13,
                "w2_tuning_used": self.tuning2, "activation": self.activation}

    @staticmethod
    def _block(tuning: list, valid_shape_m: int) -> int:
        for lower, upper, config in tuning:
            if lower < valid_shape_m <= upper:
                return config["block_shape"][0]
        return 64   # vLLM's fallback (with a warning)

    def routing(self, ids: torch.Tensor):
        """``prepare_humming_moe_kwargs`` (no expert map, no scatter): the alignment(s)."""
        valid_shape_m = ids.numel()
        b13 = self._block(self.tuning13, valid_shape_m)
        b2 = self._block(self.tuning2, valid_shape_m)
        a13 = align_block_size(ids, b13, self.experts)
        a2 = a13 if b2 == b13 else align_block_size(ids, b2, self.experts)
        return a13, a2

    def gemms(self, x: torch.Tensor, routing, weights: torch.Tensor, ids: torch.Tensor,
              out: torch.Tensor) -> torch.Tensor:
        """The prepare step's input quantization, ``HummingIndexedExperts.apply`` (w13, activation
        + w2 input quantization, w2) and its ``moe_fused_mul_sum`` into ``out [T, H]``."""
        from humming.forward import humming_forward, may_process_input
        g = self.glue
        t, k = ids.shape
        valid_shape_m = t * k
        (s13, e13, n13), (s2, e2, n2) = routing
        xq, xs = g.per_token_group_quant_fp8(x, 128)
        gate_up = self.gate_up[:t * k]
        humming_forward(self.config13, inputs=xq, weight=self.t13["weight"],
                        weight_scale=self.t13["weight_scale"], zero_point=None, bias=None,
                        weight_scale_2=self.t13.get("weight_scale_2"), input_scale=xs, input_scale_2=None,
                        outputs=gate_up, locks=self.locks, sorted_ids=s13, expert_ids=e13,
                        num_tokens_padded=n13, compute_config=self.compute_config, valid_shape_m=valid_shape_m,
                        top_k=k, tuning_config=self.tuning13_str)
        inputs, group_scales, _ = may_process_input(self.config2, inputs=gate_up, outputs=self.down_in[:t * k],
                                                    token_scales=None, hadamard_block_size=0, layout="normal",
                                                    **self.activation)
        down = self.down[:t * k]
        humming_forward(self.config2, inputs=inputs, weight=self.t2["weight"], weight_scale=self.t2["weight_scale"],
                        zero_point=None, bias=None, weight_scale_2=self.t2.get("weight_scale_2"),
                        input_scale=group_scales, input_scale_2=None, outputs=down, locks=self.locks,
                        sorted_ids=s2, expert_ids=e2, num_tokens_padded=n2, compute_config=self.compute_config,
                        valid_shape_m=valid_shape_m, top_k=1, tuning_config=self.tuning2_str)
        g.moe_fused_mul_sum(inputs=down.view(t, k, -1), topk_weights=weights, topk_ids=ids, expert_map=None,
                            outputs=out)
        return out

    def layer(self, x, weights, ids, out):
        return self.gemms(x, self.routing(ids), weights, ids, out)

    # bench/peer_moe.py's peer interface
    def route(self, ids: torch.Tensor, weights: torch.Tensor):
        return self.routing(ids)

    def run(self, x, routing, weights, ids, out):
        return self.gemms(x, routing, weights, ids, out)

    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for d in (self.t13, self.t2) for v in d.values())
