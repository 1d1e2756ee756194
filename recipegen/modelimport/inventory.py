"""The non-routed tensors of a model as vLLM 0.33 builds it, and their bytes in the checkpoint's format.

Each family (`families`) lists its tensors by checkpoint name and shape (`Tensor`); this module
alone turns them into bytes. A tensor's `klass` says how it is stored:

- `linear`: a linear layer's weight, quantized with the model (FP8 with one fp32 scale per
  128×128 block — vLLM allocates the block scales fp32, quantization/fp8.py; ModelOpt NVFP4:
  e2m1 values, one e4m3 scale per 16, a per-tensor weight and input scale, modelopt.py; int4
  groups) unless the quantization config leaves the module out;
- `linear_bf16`: a linear vLLM builds unquantized whatever the checkpoint (the sparse-attention
  indexer's `wk_weights_proj`, models/deepseek_v32/attention.py:79-86);
- `param`: embeddings, norms, routers, biases, convolution weights: the model dtype;
- `fp32`: parameters vLLM allocates fp32 (routers' `e_score_correction_bias`, Mamba's `A`,
  GDN's `A_log`, the indexer's LayerNorm).

Embeddings, the LM head and routers are never quantized here (the public FP8 and NVFP4
checkpoints keep them bf16).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from fnmatch import fnmatchcase

BLOCK = 128          # FP8 block size of the DeepSeek / Qwen / GLM FP8 checkpoints


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclass(frozen=True)
class Tensor:
    name: str                       # checkpoint tensor name, e.g. model.layers.3.self_attn.q_proj.weight
    shape: tuple[int, ...]
    klass: str = "param"            # linear | linear_bf16 | param | fp32
    part: str = "other"             # embeddings, lm_head, norms, attention, routers, shared_experts, dense_mlp, ...
    layer: int | None = None        # decoder layer index (None: outside the decoder layers)
    replicated: bool = False        # held whole on every tensor-parallel rank
    kv_proj: bool = False           # a GQA k/v projection (max(1, kv_heads // tp) heads per rank)
    encoder: bool = False           # the vision tower / projector
    mtp: bool = False               # a next-token-prediction layer vLLM loads only for speculative decoding
    unquantized_for: tuple[str, ...] = ()   # dense formats for which vLLM builds this linear unquantized

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class DenseFormat:
    """How the checkpoint stores its non-routed linear layers."""

    kind: str = "bf16"                      # bf16 | fp16 | fp32 | fp8_block | nvfp4 | int4
    group: int = 0                          # nvfp4 / int4 group size
    excluded: tuple[str, ...] = ()          # modules left unquantized (patterns)
    regex: bool = False                     # `excluded` are compressed-tensors `re:` patterns / names
    exact: bool = False                     # `excluded` are module names matched exactly (vLLM's FP8)

    @property
    def param_bytes(self) -> int:
        return {"fp16": 2, "fp32": 4}.get(self.kind, 2)

    def is_excluded(self, module: str) -> bool:
        """vLLM 0.33's FP8 rule (exact names, quantization/fp8.py:180-187), its ModelOpt rule (quantization/modelopt.py:191-226: exact, substring, then wildcard),
        or compressed-tensors' `ignore` (exact names, and `re:` patterns matched from the name's start with re.match,
        not whole: quantization/utils/config_utils.py:443-446)."""
        if self.exact:
            return module in self.excluded
        for pattern in self.excluded:
            if self.regex:
                if pattern.startswith("re:"):
                    if re.match(pattern[3:], module):
                        return True
                elif pattern == module:
                    return True
            elif pattern == module or pattern in module or fnmatchcase(module, pattern):
                return True
        return False


def tensor_bytes(t: Tensor, fmt: DenseFormat) -> int:
    if t.klass == "fp32":
        return t.numel * 4
    if t.klass in ("param", "linear_bf16") or fmt.kind in ("bf16", "fp16", "fp32") or fmt.kind in t.unquantized_for:
        return t.numel * fmt.param_bytes
    module = t.name.rsplit(".", 1)[0]
    if fmt.is_excluded(module):
        return t.numel * fmt.param_bytes
    rows, cols = t.shape[0], t.numel // t.shape[0]
    if fmt.kind == "fp8_block":
        return t.numel + cdiv(rows, BLOCK) * cdiv(cols, BLOCK) * 4
    if fmt.kind == "nvfp4":
        return t.numel // 2 + t.numel // fmt.group + 8          # + weight_scale_2, input_scale (fp32)
    if fmt.kind == "int4":
        return t.numel // 2 + rows * cdiv(cols, fmt.group) * 2 + 8   # + weight_shape [2] int32
    raise ValueError(f"unknown dense format {fmt.kind}")


@dataclass
class DenseParts:
    """Bytes of the non-routed tensors, by part and by decoder layer."""

    parts: dict[str, int] = field(default_factory=dict)
    per_layer: dict[int, int] = field(default_factory=dict)
    replicated: int = 0
    kv_projections: int = 0
    encoder: int = 0
    mtp: int = 0
    params: int = 0          # elements (for published parameter counts)

    @property
    def total(self) -> int:
        """Everything vLLM loads without speculative decoding: MTP layers excluded."""
        return sum(self.parts.values())

    def summary(self) -> str:
        return ", ".join(f"{k} {v:,}" for k, v in self.parts.items())


def dense_parts(tensors: Iterable[Tensor], fmt: DenseFormat) -> DenseParts:
    out = DenseParts()
    for t in tensors:
        n = tensor_bytes(t, fmt)
        if t.mtp:
            out.mtp += n
            continue
        out.params += t.numel
        out.parts[t.part] = out.parts.get(t.part, 0) + n
        if t.layer is not None:
            out.per_layer[t.layer] = out.per_layer.get(t.layer, 0) + n
        if t.replicated:
            out.replicated += n
        if t.kv_proj:
            out.kv_projections += n
        if t.encoder:
            out.encoder += n
    return out


def exclusion_note(fmt: DenseFormat, tensors: Iterable[Tensor], layers: int) -> str:
    """For exactly matched exclusions (FP8 `modules_to_not_convert`): what each entry does to the figures."""
    if not (fmt.exact and fmt.excluded):
        return ""
    kinds: dict[str, str] = {}
    for t in tensors:
        kinds.setdefault(t.name.rsplit(".", 1)[0], t.klass)
        kinds.setdefault(t.name, t.klass)
    linear = [e for e in fmt.excluded if kinds.get(e) == "linear"]
    other = [e for e in fmt.excluded if e in kinds and kinds[e] != "linear"]
    mtp = [e for e in fmt.excluded if e not in kinds and (_layer(e) or -1) >= layers]
    inert = [e for e in fmt.excluded if e not in kinds and e not in mtp]
    out = f"; of the {len(fmt.excluded)} modules_to_not_convert: {len(linear)} linear layers kept in the model dtype"
    out += f", {len(other)} norms / routers / embeddings already unquantized"
    if mtp:
        out += f", {len(mtp)} in MTP layers (not loaded here)"
    if inert:
        out += (f", {len(inert)} naming no module of the model (e.g. `{inert[0]}`): vLLM matches them exactly, so "
                "they change nothing")
    return out


def _layer(name: str) -> int | None:
    m = re.search(r"\.layers\.(\d+)(\.|$)", name)
    return int(m.group(1)) if m else None
