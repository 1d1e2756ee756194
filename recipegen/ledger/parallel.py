"""Per-GPU figures of a lane of several GPUs, as vLLM 0.33 lays the model out over its ranks.

- Routed experts under tensor parallelism (TP): every rank holds every expert's shard, `Ip = I / tp`
  intermediate rows of w13's gate and up halves and columns of w2, scales with them
  (docs/parallel.md), so a rank holds `bytes_per_expert / tp` of each hot expert. Under expert
  parallelism (`--enable-expert-parallel`) a rank holds whole experts: `E // ep` of them, one more
  on the first `E % ep` ranks (`fused_moe/expert_map_manager.py:67-86`); the fullest rank counts.
- Dense parameters: split where vLLM's layers are column/row/vocab parallel, whole on every rank
  where they are replicated (norms, routers, MLA's q_a/kv_a projections), GQA k/v projections at
  max(1, kv_heads // tp) heads per rank (the model's `dense_tensor_parallel`). Without that field
  the split is even (a lower bound per GPU), and said so.
- KV per GPU: the ledger's KV figures are already per rank (heads max(1, kv_heads // tp), an MLA
  latent whole on every rank; `lane._kv_rate_by_layer_kind`).
- Host memory: one box's, shared by all of its ranks (every rank's cold bank, the tables, one reserve).

This module owns those formulas; `ledger.lane` calls `dense_per_rank` for the reserve's dense part
and `parallel_figures` for the per-GPU section.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from recipegen.ledger.figures import Figure
from recipegen.ledger.result import USAGE_AWARE, PlacementLedger, Violation
from recipegen.schema import Lane, Model
from recipegen.units import format_bytes

# Block granularity of each expert format along the intermediate dim (one scale per this many values).
SHARD_BLOCK = {"fp8-block": 128, "mxfp4": 32}


@dataclass(frozen=True)
class DensePerRank:
    """Dense bytes one rank holds, with the formula's parts."""

    value: float
    formula: str
    operands: dict[str, object]
    note: str


def expert_parallel(lane: Lane) -> bool:
    """`--enable-expert-parallel` (or `-ep`) among the lane's vLLM flags."""
    args = list(lane.extra_args)
    return any(a in ("--enable-expert-parallel", "-ep") or
               (a.startswith("--enable-expert-parallel=") and a.split("=", 1)[1].lower() in ("1", "true"))
               for a in args)


def local_experts_max(routed_experts: int, ep: int) -> int:
    """Experts on the fullest EP rank: vLLM gives the first `E % ep` ranks one more."""
    base, remainder = divmod(routed_experts, ep)
    return base + (1 if remainder else 0)


def dense_per_rank(model: Model, tp: int) -> DensePerRank:
    """Non-routed weight bytes on one of `tp` ranks."""
    dense = model.dense_bytes or 0
    part = model.dense_tensor_parallel
    if tp == 1 or part is None:
        return DensePerRank(dense / tp, "dense_bytes / tp", {"dense_bytes": dense, "tp": tp},
                            "" if tp == 1 else "split evenly: the model declares no dense_tensor_parallel "
                            "(a lower bound per GPU where vLLM replicates norms, routers, KV heads)")
    kv_heads = part.kv_heads or 1
    kv_per_rank = part.kv_projections * max(1, kv_heads // tp) / kv_heads if part.kv_projections else 0
    sharded = dense - part.replicated - part.kv_projections
    value = sharded / tp + part.replicated + kv_per_rank
    operands: dict[str, object] = {"dense_bytes": dense, "replicated_bytes": part.replicated, "tp": tp}
    formula = "(dense_bytes − replicated) / tp + replicated"
    if part.kv_projections:
        operands.update(kv_projection_bytes=part.kv_projections, kv_heads=kv_heads,
                        kv_heads_per_rank=max(1, kv_heads // tp))
        formula = ("(dense_bytes − replicated − kv_projections) / tp + replicated + "
                   "kv_projections × max(1, kv_heads // tp) / kv_heads")
    return DensePerRank(value, formula, operands,
                        "as vLLM 0.33 builds the layers (model dense_tensor_parallel; docs/parallel.md)")


def parallel_figures(model: Model, lane: Lane, active: PlacementLedger, figs: dict[str, Figure],
                     add: Callable[[Figure], Figure], notes: list[str], violations: list[Violation]) -> None:
    """The per-GPU section of a lane with more than one GPU (nothing for one GPU)."""
    tp = lane.tensor_parallel_size
    if tp == 1:
        return
    e, n_layers = model.expert_bytes, model.num_moe_layers
    ep = expert_parallel(lane)
    add(Figure("parallel.ranks", "GPUs (vLLM ranks) of the lane on this machine", tp, "count", "len(gpus)",
               {"gpus": list(lane.gpus)}, "expert parallel (--enable-expert-parallel)" if ep else "tensor parallel"))
    if ep:
        local = local_experts_max(model.routed_experts, tp)
        add(Figure("parallel.local_experts", "routed experts per layer on the fullest rank", local, "count",
                   "⌈routed_experts / ep⌉ (vLLM: E // ep, one more on the first E % ep ranks)",
                   {"routed_experts": model.routed_experts, "ep": tp}, "fused_moe/expert_map_manager.py:67-79"))
        hot = active.hot_bytes * local / model.routed_experts
        add(Figure("parallel.hot_experts_per_gpu", "routed experts in HBM, fullest rank", hot, "bytes",
                   "hot_experts × local_experts / routed_experts (all of a rank's experts are whole)",
                   {"hot_experts_bytes": active.hot_bytes, "local_experts": local,
                    "routed_experts": model.routed_experts}))
        if model.routed_experts % tp:
            notes.append(f"expert parallel over {tp} GPUs: {model.routed_experts} experts do not divide evenly; "
                         f"the fullest rank holds {local} per layer, {format_bytes(hot - active.hot_bytes / tp)} "
                         "more HBM than the even split the HBM line assumes")
    else:
        _shard_checks(model, lane, tp, notes, violations)
        add(Figure("parallel.expert_shard_bytes", "bytes of one routed expert on one rank (its TP shard)",
                   e / tp, "bytes", "bytes_per_expert / tp (Ip = I / tp rows of w13's gate and up halves, "
                   "columns of w2, scales with them)", {"bytes_per_expert": e, "tp": tp},
                   "routed_experts.py:529-603 (vLLM 0.33)"))
        add(Figure("parallel.hot_experts_per_gpu", "routed experts in HBM per GPU (every hot expert's shard)",
                   active.hot_bytes / tp, "bytes", "Σ hot per layer × bytes_per_expert / tp",
                   {"hot_experts": sum(active.hot_per_layer), "bytes_per_expert": e, "tp": tp}))
    dense = dense_per_rank(model, tp)
    add(Figure("parallel.dense_per_gpu", "non-routed weights per GPU", dense.value, "bytes", dense.formula,
               dense.operands, dense.note))
    kv_seq = figs.get("kv.bytes_per_sequence")
    kv_text = ""
    if kv_seq is not None:
        kv_text = f"; KV {format_bytes(kv_seq.value)} per max_model_len sequence on every GPU"
        if any(g.kind == "mla" for g in model.attention):
            kv_text += " (the MLA latent is not split: each rank caches all of it)"
        elif any(g.kv_heads is not None and g.kv_heads < tp for g in model.attention):
            kv_text += " (KV heads replicated: TP exceeds them)"
    host = figs.get("host.total")
    cold_text = (f"the cold banks of all {tp} ranks ({format_bytes(active.cold_bytes)}) share this box's host memory"
                 + (f", {format_bytes(host.value)} in use in all" if host is not None else ""))
    how = ("whole experts, up to " + str(int(figs['parallel.local_experts'].value)) + " per layer on a rank"
           if ep else f"each expert's 1/{tp} shard ({int(e / tp):,} of {e:,} B)")
    notes.append(f"per GPU ({'EP' if ep else 'TP'} {tp}, one box): routed experts as {how} → "
                 f"{format_bytes(figs['parallel.hot_experts_per_gpu'].value)} hot; non-routed weights "
                 f"{format_bytes(dense.value)}"
                 + (f" ({format_bytes(model.dense_tensor_parallel.replicated)} of them whole on every GPU)"
                    if model.dense_tensor_parallel is not None else " (split evenly: no dense_tensor_parallel)")
                 + f"{kv_text}; {cold_text}")


def _shard_checks(model: Model, lane: Lane, tp: int, notes: list[str], violations: list[Violation]) -> None:
    """vLLM asserts I % tp == 0; a shard that cuts a scale block is padded or refined by vLLM and
    refused by the residency runtime (`expert_residency.parallel.tp`)."""
    inter = model.moe_intermediate_size
    if inter is None:
        return
    if inter % tp:
        violations.append(Violation(
            "parallel", f"moe_intermediate_size {inter} is not divisible by {tp} GPUs: vLLM asserts "
            "intermediate_size % tp_size == 0 (fused_moe/config.py:1351-1353)",
            "use a GPU count that divides it, or --enable-expert-parallel", lane=lane.name))
        return
    block = SHARD_BLOCK.get(model.expert_format or "")
    if block and (inter // tp) % block:
        text = (f"each rank's {inter // tp} intermediate values cut a {block}-value scale block: vLLM pads the "
                "shard or refines the scales (fused_moe/oracle/fp8.py:292-352, oracle/mxfp4.py:837-917), so "
                "per-GPU expert bytes exceed bytes_per_expert / tp")
        if lane.offload.placement == USAGE_AWARE:
            violations.append(Violation("runtime", f"the expert residency runtime would refuse this lane: {text}",
                                        "use fewer GPUs per lane (a whole number of blocks per rank) or "
                                        "--enable-expert-parallel with placement: positional", lane=lane.name))
        else:
            notes.append(text)
