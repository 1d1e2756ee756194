"""Random routing for the GPU expert tests, drawn the same way in every file that uses it.

Not a test module: the GPU test files import it (pytest puts their directory on the path).
"""

from __future__ import annotations

import torch


def random_routing(tokens: int, experts: int, k: int, gen: torch.Generator,
                   hot: list[int] | None = None, cold: list[int] | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k ids of uniform scores and softmax weights, on the generator's device.

    Given a layer's hot and cold experts (and at least three tokens), the first three tokens pick
    entirely hot, entirely cold, and half of each: the cases a split layer must get right.
    """
    dev = gen.device
    ids = torch.topk(torch.rand(tokens, experts, generator=gen, device=dev), k, dim=1).indices
    if hot is not None and cold is not None and tokens >= 3:
        ids[0] = torch.tensor(hot[:k], device=dev)
        ids[1] = torch.tensor(cold[:k], device=dev)
        ids[2] = torch.tensor(hot[:k // 2] + cold[:k - k // 2], device=dev)
    weights = torch.softmax(torch.randn(tokens, k, generator=gen, device=dev), dim=1)
    return ids, weights
