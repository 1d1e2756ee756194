"""Draw a hot-experts sweep: projected fetch tax and KV capacity against hot experts per layer."""

from __future__ import annotations

from pathlib import Path

from recipegen.common.plotting import pyplot, save_png
from recipegen.common.units import GiB
from recipegen.costmodel.sweep import Sweep


def plot_sweep(sweep: Sweep, path: Path) -> None:
    plt = pyplot()
    rows = sweep.rows
    hot = [r.hot for r in rows]
    fig, (ax_fetch, ax_kv) = plt.subplots(2, 1, figsize=(9.5, 7.5), sharex=True,
                                          gridspec_kw={"height_ratios": [1.15, 1]})
    # --- fetch tax --------------------------------------------------------------------------
    has_fetch = any(r.points for r in rows)
    if has_fetch:
        for i, streams in enumerate(sweep.streams):
            ys = [r.points[i].tax.fetch_ms for r in rows]
            k = rows[0].points[i].k
            ax_fetch.plot(hot, ys, label=f"C{streams} (k={k})", color=f"C{i}", lw=2)
        ax_fetch.set_ylabel("projected fetch tax per decode step (ms)")
        top = max(max(p.tax.fetch_ms for p in r.points) for r in rows)
        first_share = rows[0].points[0].tax.share_of_step
        if first_share is not None:
            top = max(top, first_share.operands[1].value)
        ax_fetch.set_ylim(0, top * 1.12)
        first = rows[0].points[0]
        if first.tax.share_of_step is not None:
            step_ms = first.tax.share_of_step.operands[1].value
            ax_fetch.axhline(step_ms, color="grey", ls=":", lw=1)
            ax_fetch.text(hot[-1], step_ms, f"measured C{first.streams} step {step_ms:g} ms ", fontsize=8,
                          color="grey", ha="right", va="bottom")
            ax_fetch.secondary_yaxis("right", functions=(lambda ms: ms / step_ms * 100,
                                                         lambda pct: pct * step_ms / 100)).set_ylabel(
                f"% of the measured C{first.streams} step")
        hist = f"{sweep.histogram}" + (" (synthetic)" if sweep.histogram_synthetic else "")
        ax_fetch.set_title(f"{sweep.recipe} · lane {sweep.lane} · class {sweep.traffic_class}: cold share from {hist}",
                           fontsize=10)
        ax_fetch.legend(loc="upper center", fontsize=9)
    else:
        ax_fetch.text(0.5, 0.5, "no histogram for this class: fetch tax not projected",
                      ha="center", va="center", transform=ax_fetch.transAxes)
        ax_fetch.set_yticks([])
    ax_fetch.grid(True, which="both", alpha=0.3)
    # --- KV tokens and HBM --------------------------------------------------------------------
    tokens_m = [r.kv_tokens / 1e6 for r in rows]
    ax_kv.plot(hot, tokens_m, color="C2", lw=2, label="KV pool (M tokens)")
    ax_kv.set_ylabel("KV pool (million tokens)", color="C2")
    ax_kv.axhline(sweep.max_model_len / 1e6, color="C2", ls="--", lw=1)
    ax_kv.text(hot[0], sweep.max_model_len / 1e6, f" max_model_len {sweep.max_model_len / 1e6:.2f}M",
               va="bottom", fontsize=8, color="C2")
    hbm = ax_kv.twinx()
    hbm.plot(hot, [r.hot_bytes / GiB for r in rows], color="C4", lw=1.5, label="hot experts in HBM (GiB)")
    hbm.plot(hot, [r.cold_bytes / GiB for r in rows], color="C5", lw=1.5, ls="-.",
             label="cold experts pinned in host (GiB)")
    hbm.set_ylabel("expert bytes (GiB)")
    lines = ax_kv.get_lines()[:1] + hbm.get_lines()
    ax_kv.legend(lines, [ln.get_label() for ln in lines], loc="upper right", fontsize=8)
    ax_kv.set_xlabel("hot experts per MoE layer (rest cold)")
    ax_kv.grid(True, alpha=0.3)
    # --- infeasible region and the lane's current point --------------------------------------
    bad = [r.hot for r in rows if r.violations]
    for ax in (ax_fetch, ax_kv):
        for h in bad:
            ax.axvspan(h - 0.5, h + 0.5, color="red", alpha=0.08, lw=0)
    if bad:
        ax_kv.set_title("red band: the ledger reports a violation (" +
                        ", ".join(sorted({v for r in rows for v in r.violations})) + ")", fontsize=9, color="red")
    current = round(sweep.current_hot)
    if hot[0] <= current <= hot[-1]:
        row = sweep.row(current)
        for ax in (ax_fetch, ax_kv):
            ax.axvline(current, color="black", lw=1.2)
        label = (f"lane's offload budget (usage-aware): {current} hot / {row.cold} cold" if sweep.positional
                 else f"lane now: {current} hot / {row.cold} cold")
        if row.points:
            label += f"\n{row.points[0].tax.fetch_ms:.2f} ms at C{row.points[0].streams}"
        label += f"\n{row.kv_tokens / 1e6:.2f}M KV tokens"
        ax_kv.annotate(label, xy=(current, row.kv_tokens / 1e6), xytext=(-130, 45), textcoords="offset points",
                       fontsize=8, arrowprops={"arrowstyle": "->", "lw": 0.8},
                       bbox={"boxstyle": "round", "fc": "white", "ec": "0.6"})
        if row.points:
            ax_fetch.plot([current], [row.points[0].tax.fetch_ms], "ko", ms=5)
    fig.tight_layout()
    save_png(fig, path)
