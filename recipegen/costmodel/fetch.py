"""Fetch tax: cold expert bytes read over the host link per decode step, and their time (pure).

    cold bytes per step = Σ_layers  unique experts per layer × cold share × bytes per expert
    fetch time          = cold bytes per step ÷ link bandwidth        (bandwidth in decimal GB/s)
    share of step       = fetch time ÷ measured step time

With one stream at k=0 the unique experts per layer are the top_k picks themselves, so this
is exactly the field reports' arithmetic ("Should a GB300 Prefetch", Figure 3: layers × 6 picks ×
cold share × bytes ÷ 340 GB/s). It is simplified the same way: no overlap of the cold read
with compute, no L2 reuse, every cold pick read once per step.

The cold share is the share of routed picks that land on a cold expert: from a row map and
a histogram (`recipegen.rowmap.cold_share`), per layer or overall, or declared.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from recipegen.costmodel.figures import Figure, Operand

GB = 10**9


@dataclass(frozen=True)
class FetchTax:
    """The fetch tax of one operating point, every figure explained."""

    cold_bytes: Figure       # bytes per decode step
    fetch_time: Figure       # seconds per decode step
    share_of_step: Figure | None  # fraction of the measured step (None when no step time is known)
    hot_read_time: Figure | None = None  # the same step's hot expert bytes at HBM bandwidth, for scale

    @property
    def fetch_ms(self) -> float:
        return self.fetch_time.value * 1e3

    @property
    def share(self) -> float | None:
        return None if self.share_of_step is None else self.share_of_step.value


def _check_share(share: float, what: str) -> None:
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"{what} must be a share between 0 and 1, got {share}")


def cold_bytes_per_step(*, moe_layers: int, unique_per_layer: float, cold_share: float | Sequence[float],
                        bytes_per_expert: int, cold_share_source: str = "",
                        unique_source: str = "") -> Figure:
    """Expected cold expert bytes read per decode step.

    `cold_share` is one share for every MoE layer, or one share per MoE layer (len == moe_layers).
    """
    if moe_layers <= 0:
        raise ValueError(f"moe_layers must be positive, got {moe_layers}")
    if bytes_per_expert <= 0:
        raise ValueError(f"bytes_per_expert must be positive, got {bytes_per_expert}")
    if isinstance(cold_share, (int, float)):
        _check_share(cold_share, "cold share")
        value = moe_layers * unique_per_layer * cold_share * bytes_per_expert
        formula = "MoE layers × unique experts per layer × cold share × bytes per expert"
        share_operand = Operand("cold share", cold_share, "of picks", cold_share_source)
    else:
        shares = list(cold_share)
        if len(shares) != moe_layers:
            raise ValueError(f"{len(shares)} per-layer cold shares for {moe_layers} MoE layers")
        for share in shares:
            _check_share(share, "per-layer cold share")
        value = sum(unique_per_layer * share * bytes_per_expert for share in shares)
        formula = "Σ over MoE layers (unique experts per layer × layer's cold share × bytes per expert)"
        mean = sum(shares) / len(shares)
        share_operand = Operand("mean per-layer cold share", mean, "of picks", cold_share_source)
    return Figure("cold bytes per step", value, "B", formula, (
        Operand("MoE layers", moe_layers),
        Operand("unique experts per layer", unique_per_layer, "per step", unique_source),
        share_operand,
        Operand("bytes per expert", bytes_per_expert, "B"),
    ))


def fetch_tax(*, moe_layers: int, unique_per_layer: float, cold_share: float | Sequence[float],
              bytes_per_expert: int, link_bandwidth: float, step_time: float | None = None,
              cold_share_source: str = "", unique_source: str = "", bandwidth_source: str = "",
              step_source: str = "", hbm_bandwidth: float | None = None) -> FetchTax:
    """Cold bytes, fetch time and (given a measured step time, seconds) its share of the step.

    `link_bandwidth` is bytes per second for pinned in-place reads (e.g. 340e9 for 340 GB/s).
    With `hbm_bandwidth`, also the time to read the step's *hot* expert bytes from HBM — the
    floor the expert GEMMs stream at, against which the fetch tax is an addition.
    """
    if link_bandwidth <= 0:
        raise ValueError(f"link bandwidth must be positive, got {link_bandwidth}")
    cold = cold_bytes_per_step(moe_layers=moe_layers, unique_per_layer=unique_per_layer,
                               cold_share=cold_share, bytes_per_expert=bytes_per_expert,
                               cold_share_source=cold_share_source, unique_source=unique_source)
    seconds = cold.value / link_bandwidth
    fetch = Figure("fetch time per step", seconds, "s", "cold bytes per step ÷ link bandwidth", (
        Operand("cold bytes per step", cold.value, "B"),
        Operand("link bandwidth", link_bandwidth / GB, "GB/s", bandwidth_source),
    ))
    share = None
    if step_time is not None:
        if step_time <= 0:
            raise ValueError(f"step time must be positive, got {step_time}")
        share = Figure("fetch share of step", seconds / step_time, "", "fetch time ÷ measured step time", (
            Operand("fetch time", seconds * 1e3, "ms"),
            Operand("step time", step_time * 1e3, "ms", step_source),
        ))
    hot = None
    if hbm_bandwidth is not None:
        if hbm_bandwidth <= 0:
            raise ValueError(f"HBM bandwidth must be positive, got {hbm_bandwidth}")
        all_bytes = moe_layers * unique_per_layer * bytes_per_expert
        hot_bytes = all_bytes - cold.value
        hot = Figure("hot expert read time per step", hot_bytes / hbm_bandwidth, "s",
                     "(MoE layers × unique experts per layer × bytes per expert − cold bytes) ÷ HBM bandwidth", (
                         Operand("hot expert bytes per step", hot_bytes, "B"),
                         Operand("HBM bandwidth", hbm_bandwidth / GB, "GB/s")))
    return FetchTax(cold_bytes=cold, fetch_time=fetch, share_of_step=share, hot_read_time=hot)
