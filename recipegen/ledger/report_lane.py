"""The human ledger of one lane on one machine: its table, budget lines, notes, (with --explain)
every formula, and the verdict lines."""

from __future__ import annotations

from recipegen.common.units import GiB, MiB, format_count
from recipegen.ledger.pinning import PINNED_ROUNDING
from recipegen.ledger.reserves import basis_of, stage_share_of
from recipegen.ledger.result import POSITIONAL, LaneLedger, PlacementLedger, Violation, placement_label


def _g(value: float) -> str:
    if 0 < abs(value) < GiB / 8:
        return f"{value / MiB:,.2f} MiB"
    return f"{value / GiB:,.2f} GiB"


def _placement_column(p: PlacementLedger | None, layer_bytes: float) -> list[str]:
    """One placement's column; `layer_bytes`: a whole MoE layer's routed experts (lane, all GPUs)."""
    if p is None:
        return ["—"] * 5
    f = p.figures
    if p.placement == POSITIONAL:
        whole = sum(1 for c in p.cold_per_layer if c == max(p.cold_per_layer)) if any(p.cold_per_layer) else 0
        counts = f"all {max(p.cold_per_layer)} cold in {whole} layer{'s' if whole != 1 else ''}" if whole else "none cold"
        # the walk stops past its budget, often inside the next layer (its w13 offloaded, its w2 not)
        part = f["host.cold_experts"].value - whole * layer_bytes
        if part > 0:
            counts += f" + {_g(part)} of the next"
        host = _g(f["host.cold_experts"].value)
        if "positional.measured" in f:
            host += f" (measured {_g(f['positional.measured'].value)})"
    else:
        counts = p.counts_label().replace(" per layer", "")
        host = _g(f["host.cold_experts"].value)
    seqs = int(f["kv.full_sequences"].value)
    tokens = "none" if p.kv_pool_shortfall else f["kv.tokens"].display()
    return [counts, _g(f["hbm.hot_experts"].value), host, kv_pool_text(f["hbm.kv_pool"].value),
            f"{tokens} ({seqs} × max_model_len)"]


def kv_pool_text(pool: float) -> str:
    """A KV pool for people; below zero there is none, and the cap is short by that much (a negative
    size is not a figure)."""
    return f"none — {_g(-pool)} short" if pool < 0 else _g(pool)


def render_lane(lane: LaneLedger, *, explain: bool = False) -> str:
    fig = lane.figures
    out: list[str] = []
    own = lane.placement
    other = "positional" if own != POSITIONAL else "usage-aware"
    pos_budget = ""
    if lane.positional is not None:
        # `new` and `fit` price positional at their own least offload that fits: name the one priced here
        pos_budget = (f" at --cpu-offload-gb {fig['load.host_experts_initial'].operands['load_cpu_offload_bytes'] / GiB:g}"
                      " (the lane's load offload)")
    head_own = f"{placement_label(lane)} (this lane)"
    head_other = f"{other}{pos_budget if other == 'positional' else ' (same budget)'}"
    rows = ["hot / cold per layer", "routed experts in HBM / GPU", "routed experts pinned in host",
            "KV pool / GPU", "KV tokens"]
    col_own = _placement_column(lane.active, fig["experts.per_layer"].value)
    compared = lane.positional if own != POSITIONAL else lane.usage_aware
    col_other = _placement_column(compared, fig["experts.per_layer"].value)
    w0 = max(len(r) for r in rows) + 2
    w1 = max(len(head_own), *(len(c) for c in col_own)) + 3
    out.append(f"  {'':<{w0}}{head_own:<{w1}}{head_other}")
    for r, a, b in zip(rows, col_own, col_other):
        out.append(f"  {r:<{w0}}{a:<{w1}}{b}")
    if compared is None:
        # a usage-aware lane that loads every routed expert into HBM: vLLM offloads nothing by position
        out.append(f"  {other}: — the lane loads every routed expert into HBM (no --cpu-offload-gb at load), "
                   "so there is no positional placement to compare")
    elif not compared.fits:
        # the comparison column is what that placement would leave, not a setting that fits
        fit_note = ("; `recipegen new` and `fit` price positional at the least --cpu-offload-gb that fits"
                    if other == POSITIONAL else "")
        out.append(f"  {head_other}: does not fit — its KV pool ({kv_pool_text(compared.figures['hbm.kv_pool'].value)}) holds "
                   f"no max_model_len sequence; shown for comparison only{fit_note}")
    if "budget.hot_per_layer" in fig:
        hot_budget = int(fig["budget.hot_per_layer"].value)
        if "budget.cold_per_layer" in fig:
            declared = (f"cold_experts_budget {_g(fig['budget.cold_per_layer'].operands['cold_experts_budget_bytes'])}"
                        f" → {int(fig['budget.cold_per_layer'].value)} cold per layer (largest whole count that "
                        f"fits) = {_g(fig['budget.cold_bytes'].value)}, {hot_budget} hot")
        else:
            declared = (f"hot_experts_per_layer {hot_budget} → "
                        f"{int(fig['experts.per_layer'].value / fig['experts.bytes_per_expert'].value) - hot_budget}"
                        f" cold per layer = {_g(fig['budget.cold_bytes'].value)} in host")
        if fig["budget.cold_bytes"].value > 0:
            out.append(f"  Budget: {declared}; the row map is the truth ({lane.usage_aware.basis.split(';')[0]})")
        else:   # every expert in HBM: no row map decides anything
            out.append(f"  Budget: {declared}: every expert in HBM")
    cap = fig["hbm.cap"]
    util = cap.operands.get("gpu_memory_utilization")
    cap_text = (f"{_g(fig['hbm.capacity'].value)} × {util:g} = {_g(cap.value)} cap" if util is not None
                else f"{_g(cap.value)} (fixed KV pool)")
    reserve = fig["hbm.reserve"]
    reserve_kind = basis_of(reserve)
    stage = stage_share_of(reserve.note)
    if stage:  # a pipeline stage's share: worked out from the single box's reserve, never measured here
        reserve_kind = f"{stage[0]}'s share, derived from the lane's {stage[1]} single-box reserve"
    elif reserve_kind == "back-solved":  # say what that means once, where it is printed
        reserve_kind += " from a measured boot's KV pool: docs/design.md 'The HBM reserve'"
    elif reserve_kind == "estimated":
        reserve_kind += " from the model and machine: docs/ledger.md 'Estimated reserves'"
    elif reserve_kind == "declared":
        reserve_kind += ", not marked measured"
    workspace = fig.get("hbm.runtime_workspace")
    ws_text = f" + runtime workspace {_g(workspace.value)}" if workspace is not None else ""
    out.append(f"  HBM / GPU: {cap_text} = reserve {_g(reserve.value)} ({reserve_kind}) + hot experts "
               f"{_g(fig['hbm.hot_experts'].value)}{ws_text} + KV {_g(fig['hbm.kv_pool'].value)}")
    if workspace is not None:
        out.append("    " + workspace_line(fig))
    if "hbm.reserve.dense" in fig:
        parts = [f"dense {_g(fig['hbm.reserve.dense'].value)}"]
        if "hbm.reserve.drafter" in fig:
            parts.append(f"drafter {_g(fig['hbm.reserve.drafter'].value)}")
        parts.append(f"activations/CUDA graphs/rest {_g(fig['hbm.reserve.runtime'].value)}")
        out.append(f"    reserve = {' + '.join(parts)}")
    per_seq = (f" of {_g(fig['kv.bytes_per_sequence'].value)} each (per GPU, by layer kind)"
               if "kv.bytes_per_sequence" in fig else "")
    out.append(f"  KV: {fig['kv.tokens'].display()} for max_model_len {int(fig['kv.max_model_len'].value):,} "
               f"→ {format_count(int(fig['kv.full_sequences'].value), 'full-length sequence')}{per_seq}")
    dense_host = (f" + non-routed weights offloaded {_g(fig['host.dense_offloaded'].value)}"
                  if "host.dense_offloaded" in fig else "")
    tables = (f"host tables {_g(fig['host.tables'].value)} + " if fig["host.tables"].value else "")
    held = (f" in {_g(fig['host.cold_pinned'].value)} of vLLM's pinned blocks ({PINNED_ROUNDING}, kept for the whole run)"
            if "host.cold_pinned" in fig and fig["host.cold_pinned"].value > fig["host.cold_experts"].value else "")
    out.append(f"  Host: {tables}pinned experts "
               f"{_g(fig['host.cold_experts'].value)}{held} = {_g(fig['host.before_reserve'].value)} before page "
               f"cache; + reserve {_g(fig['host.reserve'].value)} ({_host_basis(fig['host.reserve'])}){dense_host} = {_g(fig['host.total'].value)} of "
               f"{_g(fig['host.memory'].value)} (headroom {_g(fig['host.headroom'].value)})")
    pinned = fig.get("load.host_pinned_initial")
    rounded = (f" (vLLM pins {_g(pinned.value)} for them: PyTorch rounds each pinned parameter up to a power of two)"
               if pinned is not None and pinned.value > fig["load.host_experts_initial"].value else "")
    out.append(f"  Load: experts after load HBM {_g(fig['load.hbm_experts_initial'].value)} / host "
               f"{_g(fig['load.host_experts_initial'].value)}{rounded}; peak HBM {_g(fig['load.hbm_peak'].value)} "
               f"of {_g(fig['hbm.capacity'].value)}, peak host {_g(fig['load.host_peak'].value)} of "
               f"{_g(fig['host.memory'].value)}")
    for note in lane.notes:
        out.append(f"  {note}" if note.startswith("warning: ") else f"  note: {note}")
    if explain:
        out.append("  Figures:")
        seen: set[str] = set()
        for placement in (lane.usage_aware, lane.positional):
            if placement is None:
                continue
            for key, f in {**fig, **{f"{placement.placement}:{k}": v for k, v in placement.figures.items()}}.items():
                if key in seen:
                    continue
                seen.add(key)
                prefix = f"[{key.split(':')[0]}] " if ":" in key else ""
                lines = f.explain().splitlines()
                if key.endswith("hbm.kv_pool") and f.value < 0:  # the table's words, not a negative size
                    lines[0] = f"{f.label} = {kv_pool_text(f.value)}"
                out.extend("    " + (prefix if i == 0 else "") + line for i, line in enumerate(lines))
    out += verdict_lines(lane.ok, lane.violations, holds="every budget holds")
    return "\n".join(out)


def _host_basis(figure) -> str:
    kind = basis_of(figure)
    return kind + (", not marked measured" if kind == "declared" else "")


def workspace_line(fig: dict) -> str:
    """The runtime workspace's parts and why it is taken before the KV pool."""
    kernels, counter = fig.get("hbm.runtime_workspace.kernels"), fig["hbm.runtime_workspace.counter"]
    tokens = counter.operands["max_num_batched_tokens"]
    if workspace_on_host(fig):
        return "runtime workspace = 0 B on the device: " + counter.note
    if kernels is None:
        kernel_text = "no split-layer kernel workspace for this format"
    elif kernels.value:
        extra = "".join(text for key, text in (("split_ticket_bytes", " + split-K tickets"),
                                                ("fp8_scratch_bytes", " + FP8 quantized inputs"))
                        if kernels.operands.get(key))
        kernel_text = (f"kernels {_g(kernels.value)} (max_num_batched_tokens {tokens:,} × top-k "
                       f"{kernels.operands['top_k']} picks of bf16 activation + output rows{extra})")
    else:
        kernel_text = "kernels 0 B (FlashInfer TRT-LLM banks allocate per call)"
    return (f"runtime workspace = {kernel_text} + counter and step masks {_g(counter.value)}: allocated by "
            "the runtime before vLLM sizes the KV cache, so taken from the KV pool (docs/ledger.md)")


def workspace_on_host(fig: dict) -> bool:
    return fig["hbm.runtime_workspace"].note.startswith("CPU device")


def verdict_lines(ok: bool, violations: list[Violation], *, holds: str) -> list[str]:
    """A lane's closing lines: `verdict: OK — <holds>`, or each violation with what to change."""
    if ok:
        return [f"  verdict: OK — {holds}"]
    out: list[str] = []
    for v in violations:
        out.append(f"  OVER BUDGET [{v.kind}]: {v.message}")
        out.append(f"    → {v.suggestion}")
    return out
