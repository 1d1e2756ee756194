"""CUDA-graph capture of a residency step with static inputs, replayed with new routing.

``CapturedStep`` owns the static input buffers (activations, ``topk_ids``, ``topk_weights``,
optionally a token mask) of a fixed token count, warms the step up on a side stream (Triton
compiles and autotunes outside the capture), captures it once, and replays it after copying new
inputs into the buffers. Everything the step reads at run time — the routing buffers and each
layer's device row map — is a device tensor, so a replay sees new routing and, after a swap
(``core.swap``: copies, then a two-element write to the map), the new placement; nothing in the
graph is a captured constant except tensor addresses and shapes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

StepFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class CapturedStep:
    """``step(x, topk_weights, topk_ids) -> out`` captured for ``tokens`` tokens.

    ``x_like``/``ids_like``/``weights_like`` fix dtypes and shapes of the static buffers.
    """

    def __init__(self, step: StepFn, x_like: torch.Tensor, weights_like: torch.Tensor,
                 ids_like: torch.Tensor, *, warmup: int = 2,
                 pool: object | None = None) -> None:
        self.x = torch.empty_like(x_like)
        self.topk_weights = torch.empty_like(weights_like)
        self.topk_ids = torch.empty_like(ids_like)
        self.x.copy_(x_like)
        self.topk_weights.copy_(weights_like)
        self.topk_ids.copy_(ids_like)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                step(self.x, self.topk_weights, self.topk_ids)
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, pool=pool):
            self.out = step(self.x, self.topk_weights, self.topk_ids)

    def load(self, x: torch.Tensor | None = None, topk_weights: torch.Tensor | None = None,
             topk_ids: torch.Tensor | None = None) -> None:
        """Copy new inputs into the static buffers (stream-ordered, no sync)."""
        if x is not None:
            self.x.copy_(x)
        if topk_weights is not None:
            self.topk_weights.copy_(topk_weights)
        if topk_ids is not None:
            self.topk_ids.copy_(topk_ids)

    def replay(self, x: torch.Tensor | None = None, topk_weights: torch.Tensor | None = None,
               topk_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Load whatever is given, replay, and return the static output buffer (valid until the
        next replay)."""
        self.load(x, topk_weights, topk_ids)
        self.graph.replay()
        return self.out
