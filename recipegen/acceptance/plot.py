"""PNG plot of a knee run: tok/s (min–max across windows) and p50 latency per concurrency."""

from __future__ import annotations

from pathlib import Path

from recipegen.acceptance.knee import KneeResult
from recipegen.common.plotting import pyplot, save_png


def plot_knee(result: KneeResult, path: Path) -> None:
    plt = pyplot()
    names = {"A": "candidate", "B": "control", "A2": "candidate (repeat)"}
    fig, (ax_tok, ax_lat) = plt.subplots(1, 2, figsize=(11, 4.2))
    for label in dict.fromkeys(lv.label for lv in result.levels):
        levels = sorted(result.by_label(label), key=lambda lv: lv.concurrency)
        xs = [lv.concurrency for lv in levels]
        means = [lv.tok_s.mean for lv in levels]
        low = [lv.tok_s.mean - lv.tok_s.min for lv in levels]
        high = [lv.tok_s.max - lv.tok_s.mean for lv in levels]
        name = f"{names.get(label, label)} {levels[0].url}"
        ax_tok.errorbar(xs, means, yerr=[low, high], marker="o", capsize=4, label=name)
        lat = [(lv.concurrency, lv.latency_p50 * 1e3) for lv in levels if lv.latency_p50 is not None]
        if lat:
            ax_lat.plot([x for x, _ in lat], [y for _, y in lat], marker="o", label=name)
    for ax in (ax_tok, ax_lat):
        ax.set_xlabel("concurrent streams")
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ticks = sorted({lv.concurrency for lv in result.levels})
        ax.set_xticks(ticks, [str(t) for t in ticks])
    ax_tok.set_ylabel("output tok/s (bars: min–max over windows)")
    ax_tok.set_title("Throughput, warm-up excluded")
    ax_lat.set_ylabel("p50 request latency (ms)")
    ax_lat.set_title("Per-request latency")
    ax_tok.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path)
