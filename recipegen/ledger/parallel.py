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
  latent whole on every rank; `ledger.kv.kv_rate`).
- Host memory: one box's, shared by all of its ranks (every rank's cold bank, the tables, one reserve).

This module owns those formulas; `ledger.lane` calls `dense_per_rank` for the reserve's dense part
and `parallel_figures` for the per-GPU section.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from recipegen.common.units import format_bytes
from recipegen.ledger.figures import Figure
from recipegen.ledger.flags import flag_on, flag_value
from recipegen.ledger.result import USAGE_AWARE, PlacementLedger, Violation
from recipegen.schema import Lane, Model

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
    return flag_on(list(lane.extra_args), "--enable-expert-parallel")


def local_experts_max(routed_experts: int, ep: int) -> int:
    """Experts on the fullest EP rank: vLLM gives the first `E % ep` ranks one more."""
    base, remainder = divmod(routed_experts, ep)
    return base + (1 if remainder else 0)


LINEAR, ROUND_ROBIN = "linear", "round_robin"


def ep_placement_strategy(lane: Lane) -> str:
    """`--expert-placement-strategy` among the lane's flags (vLLM's default: linear). vLLM keeps
    round_robin only for models with expert groups and no EPLB (`fused_moe/expert_map_manager.py:116-149`)."""
    given = flag_value(list(lane.extra_args), "--expert-placement-strategy")
    return LINEAR if given is None else given.replace("-", "_")


def ep_local_experts(rank: int, routed_experts: int, ep: int, strategy: str = LINEAR) -> list[int]:
    """Global ids of rank `rank`'s experts as vLLM 0.33's `determine_expert_map` places them
    (`fused_moe/expert_map_manager.py:67-86`): `E // ep` each, one more on the first `E % ep` ranks;
    linear = a contiguous run from `rank·base + min(rank, E % ep)`, round_robin = rank, rank+ep, …"""
    base, remainder = divmod(routed_experts, ep)
    if strategy == ROUND_ROBIN:
        return list(range(rank, routed_experts, ep))
    start = rank * base + min(rank, remainder)
    return list(range(start, start + base + (1 if rank < remainder else 0)))


@dataclass(frozen=True)
class EpHot:
    """Hot routed-expert bytes on the fullest EP rank (the per-GPU HBM line of an EP lane)."""

    value: float
    """Bytes of hot experts in that rank's HBM."""
    rank: int
    """The fullest rank (first of equals)."""
    hot_per_layer: list[int]
    """Hot experts of that rank per MoE layer."""
    exact: bool
    """True: counted from the row map's hot ids; False: the bound min(hot, local) per layer."""
    formula: str
    operands: dict[str, object]


def ep_fullest_hot(model: Model, lane: Lane, hot_per_layer: list[int],
                   hot_ids: list[list[int]] | None = None) -> EpHot:
    """Whole experts per rank: with the row map's hot ids, each rank's hot experts are the ids it
    holds (`ep_local_experts`), and the fullest rank is the one with the most hot bytes over all
    layers; without them, which experts are hot is unknown and every rank may hold its experts all
    hot, so a rank holds at most min(hot, local) per layer (the bound the verdict then uses)."""
    e, ep, n = model.expert_bytes, lane.tensor_parallel_size, model.routed_experts
    strategy = ep_placement_strategy(lane)
    local = [ep_local_experts(r, n, ep, strategy) for r in range(ep)]
    if hot_ids is not None and len(hot_ids) == len(hot_per_layer):
        per_rank = []
        for ids in local:
            mine = set(ids)
            per_rank.append([sum(1 for g in layer if g in mine) for layer in hot_ids])
        totals = [sum(c) for c in per_rank]
        rank = max(range(ep), key=lambda r: (totals[r], -r))
        return EpHot(totals[rank] * e, rank, per_rank[rank], True,
                     "max over ranks r of Σ_layers |hot ids ∩ experts of r| × bytes_per_expert",
                     {"rank": rank, "hot_on_rank": totals[rank], "bytes_per_expert": e, "ep": ep,
                      "placement": strategy})
    fullest = len(local[0])
    counts = [min(h, fullest) for h in hot_per_layer]
    return EpHot(sum(counts) * e, 0, counts, False,
                 "Σ_layers min(hot, local_experts) × bytes_per_expert (row map not read: a rank may hold "
                 "all its experts hot)",
                 {"local_experts": fullest, "hot_on_rank": sum(counts), "bytes_per_expert": e, "ep": ep,
                  "placement": strategy})


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
    e = model.expert_bytes
    ep = expert_parallel(lane)
    violations.extend(parallel_violations(model, lane, tp))
    add(Figure("parallel.ranks", "GPUs (vLLM ranks) of the lane on this machine", tp, "count", "len(gpus)",
               {"gpus": list(lane.gpus)}, "expert parallel (--enable-expert-parallel)" if ep else "tensor parallel"))
    if ep:
        local = local_experts_max(model.routed_experts, tp)
        add(Figure("parallel.local_experts", "routed experts per layer on the fullest rank", local, "count",
                   "⌈routed_experts / ep⌉ (vLLM: E // ep, one more on the first E % ep ranks)",
                   {"routed_experts": model.routed_experts, "ep": tp}, "fused_moe/expert_map_manager.py:67-79"))
        hot_fig = active.figures.get("hbm.hot_experts")
        hot = hot_fig.value if hot_fig is not None else active.hot_bytes * local / model.routed_experts
        add(Figure("parallel.hot_experts_per_gpu", "routed experts in HBM, fullest rank", hot, "bytes",
                   hot_fig.formula if hot_fig is not None else
                   "hot_experts × local_experts / routed_experts (all of a rank's experts are whole)",
                   dict(hot_fig.operands) if hot_fig is not None else
                   {"hot_experts_bytes": active.hot_bytes, "local_experts": local,
                    "routed_experts": model.routed_experts}))
        if hot > active.hot_bytes / tp:
            notes.append(f"expert parallel over {tp} GPUs: the fullest rank holds "
                         f"{format_bytes(hot)} of hot experts, {format_bytes(hot - active.hot_bytes / tp)} more "
                         "than an even split; the HBM line and the KV pool are that rank's")
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


def parallel_violations(model: Model, lane: Lane, tp: int) -> list[Violation]:
    """`parallel_problems` as the lane's violations: each a lane vLLM will not boot."""
    return [Violation("parallel", message, fix, lane=lane.name)
            for message, fix in parallel_problems(model, tp, expert_parallel=expert_parallel(lane))]


def parallel_problems(model: Model, tp: int, *, expert_parallel: bool = False) -> list[tuple[str, str]]:
    """Every reason vLLM 0.33 will not boot `model` over `tp` ranks that the model alone decides (the
    one rule of the ledger's [parallel] check and of `new --gpus`): the attention heads
    (`head_problems`) and, under tensor parallelism of the routed experts (no `expert_parallel`), the
    experts' intermediate size (`shard_problems`). Each (message, fix) is a failure at boot."""
    if tp == 1:
        return []
    return head_problems(model, tp) + ([] if expert_parallel else shard_problems(model, tp))


def booting_counts(model: Model, gpus: int, *, expert_parallel: bool = False) -> list[int]:
    """The GPU counts, 1 to `gpus`, vLLM 0.33 boots `model` at (no `parallel_problems`)."""
    return [n for n in range(1, gpus + 1) if not parallel_problems(model, n, expert_parallel=expert_parallel)]


def shard_problems(model: Model, tp: int) -> list[tuple[str, str]]:
    """vLLM asserts I % tp == 0 where each rank holds a shard of every routed expert."""
    inter = model.moe_intermediate_size
    if inter is None or not inter % tp:
        return []
    return [(f"moe_intermediate_size {inter} is not divisible by {tp} GPUs: vLLM asserts "
             "intermediate_size % tp_size == 0 (fused_moe/config.py:1351-1353)",
             "use a GPU count that divides it, or --enable-expert-parallel")]


def head_problems(model: Model, tp: int) -> list[tuple[str, str]]:
    """The attention heads vLLM 0.33 splits over `tp` ranks, as it checks them at boot: the query
    heads must divide evenly (`verify_with_parallel_config`, vllm/config/model.py:1559-1564), and
    the KV heads either divide evenly over the ranks or, when fewer than the ranks, be replicated
    evenly (`QKVParallelLinear`: `divide(tp, kv)` or `divide(kv, tp)`, an assertion,
    vllm/model_executor/layers/linear.py:1064-1070). Each (message, fix) is a failure at boot."""
    out: list[tuple[str, str]] = []
    heads = model.attention_heads
    if heads is not None and heads % tp:
        out.append((
            f"{tp} GPUs do not divide the model's {heads} attention heads: vLLM 0.33 refuses "
            f"to boot (\"Total number of attention heads ({heads}) must be divisible by tensor parallel "
            f"size ({tp})\", vllm/config/model.py:1559-1564)",
            "use a GPU count that divides the attention heads"))
    kv_heads = sorted({g.kv_heads for g in model.attention if g.kv_heads is not None}
                      | ({model.dense_tensor_parallel.kv_heads} if model.dense_tensor_parallel is not None
                         and model.dense_tensor_parallel.kv_heads is not None else set()))
    for kv in kv_heads:
        if (tp >= kv and tp % kv) or (tp < kv and kv % tp):
            out.append((
                f"{tp} GPUs and {kv} KV heads: vLLM 0.33 splits KV heads evenly over the ranks, "
                f"or replicates them evenly when there are fewer heads than ranks, and asserts one of the two "
                f"(divide(), vllm/model_executor/layers/linear.py:1064-1070); {kv} and {tp} divide neither "
                "way, so the engine fails at boot",
                "use a GPU count that divides the KV heads or that they divide"))
    return out


def _shard_checks(model: Model, lane: Lane, tp: int, notes: list[str], violations: list[Violation]) -> None:
    """A shard that cuts a scale block is padded or refined by vLLM and refused by the residency
    runtime (`expert_residency.parallel.tp`). A size that does not divide at all is `shard_problems`'
    (a [parallel] violation from `parallel_violations`): nothing more to say of it here."""
    inter = model.moe_intermediate_size
    if inter is None or inter % tp:
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
