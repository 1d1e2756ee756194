"""Stand-ins for an adaptive lane's dump sources, for tests that write dumps with the runtime's own
``HistogramDumper``: a counter that returns a fixed histogram, a policy that serves a fixed live
map and status, and a live map a few hot/cold exchanges away from a boot map."""

from __future__ import annotations

from expert_residency.formats import Histogram, RowMap


class FixedCounter:
    """``ExpertCounter.to_histogram`` returning ``hist``'s counts with the dump's provenance."""

    def __init__(self, hist: Histogram) -> None:
        self.hist = hist

    def to_histogram(self, *, source: str, model_revision: str, meta: dict) -> Histogram:
        h = self.hist
        return Histogram(h.moe_layer_indices, h.num_experts, h.counts, h.tokens, top_k=h.top_k,
                         source=source, model_revision=model_revision, meta=meta)


class FixedLivePolicy:
    """``AdaptivePolicy.live_rowmap`` / ``status`` serving ``rowmap`` and the given window figures."""

    def __init__(self, rowmap: RowMap, *, window_cold_share: float, prior: str) -> None:
        self.rowmap = rowmap
        self._status = {"window_cold_share": window_cold_share, "prior": prior}

    def live_rowmap(self) -> RowMap:
        return self.rowmap

    def status(self) -> dict:
        return dict(self._status)


def exchanged_map(boot: RowMap, *, layers: int, pairs: int, barriers: int) -> RowMap:
    """``boot`` with its first ``pairs`` hot and cold experts exchanged in each of its first
    ``layers`` layers, carrying the provenance an adaptive policy writes."""
    hot = [list(ids) for ids in boot.hot]
    cold = [list(ids) for ids in boot.cold]
    for layer in range(layers):
        for i in range(pairs):
            hot[layer][i], cold[layer][i] = cold[layer][i], hot[layer][i]
    return RowMap(boot.moe_layer_indices, boot.num_experts, hot, cold,
                  {"builder": "adaptive", "barriers": barriers, "swaps": layers * pairs,
                   "boot_content_hash": boot.content_hash()})
