"""Shared builders for the runtime-core tests (no tests here).

Small geometries, seeded generators; every builder returns fresh tensors the caller owns.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from expert_residency.mxfp4 import quantize_mxfp4  # noqa: E402


@pytest.fixture(autouse=True)
def single_torch_thread():
    """The tests' tensors are tiny: intra-op threads only add contention (50x slower measured on a
    loaded 2-core CI box). Restored afterwards so other suites keep their setting. Test modules
    activate it by importing it."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


HIDDEN = 64
INTER = 32
EXPERTS = 16
TOP_K = 4


def float_layer(seed: int, dtype: torch.dtype, *, experts: int = EXPERTS, hidden: int = HIDDEN,
                inter: int = INTER, bias: bool = False) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    tensors = {
        "w13_weight": (torch.randn(experts, 2 * inter, hidden, generator=g) / hidden ** 0.5).to(dtype),
        "w2_weight": (torch.randn(experts, hidden, inter, generator=g) / inter ** 0.5).to(dtype),
    }
    if bias:
        tensors["w13_bias"] = (torch.randn(experts, 2 * inter, generator=g) * 0.1).to(dtype)
        tensors["w2_bias"] = (torch.randn(experts, hidden, generator=g) * 0.1).to(dtype)
    return tensors


def mxfp4_layer(seed: int, *, experts: int = EXPERTS, hidden: int = HIDDEN,
                inter: int = INTER) -> dict[str, torch.Tensor]:
    """vLLM Mxfp4MoEMethod layout: packed uint8 weights + uint8 ue8m0 block scales."""
    g = torch.Generator().manual_seed(seed)
    w13 = torch.randn(experts, 2 * inter, hidden, generator=g) / hidden ** 0.5
    w2 = torch.randn(experts, hidden, inter, generator=g) / inter ** 0.5
    w13_packed, w13_scale = quantize_mxfp4(w13)
    w2_packed, w2_scale = quantize_mxfp4(w2)
    return {"w13_weight": w13_packed, "w13_weight_scale": w13_scale,
            "w2_weight": w2_packed, "w2_weight_scale": w2_scale}


def clone_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {name: t.clone() for name, t in tensors.items()}


def random_partition(seed: int, experts: int, hot: int) -> tuple[list[int], list[int]]:
    """Shuffled hot and cold id lists (rows in a non-sorted physical order)."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(experts, generator=g).tolist()
    return perm[:hot], perm[hot:]


def routing(seed: int, tokens: int, *, experts: int = EXPERTS, top_k: int = TOP_K,
            hot_ids: list[int] | None = None, cold_ids: list[int] | None = None
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_ids int32 [T, K], topk_weights fp32 [T, K]): distinct ids per token.

    With ``hot_ids``/``cold_ids`` the batch is built to contain, in this order, a quarter of tokens
    entirely hot, a quarter entirely cold, and the rest straddling (at least one pick in each bank);
    otherwise routing is uniformly random.
    """
    g = torch.Generator().manual_seed(seed)
    rows = []
    for t in range(tokens):
        if hot_ids is None or cold_ids is None:
            pool = list(range(experts))
        elif t < tokens // 4 and len(hot_ids) >= top_k:
            pool = list(hot_ids)
        elif t < tokens // 2 and len(cold_ids) >= top_k:
            pool = list(cold_ids)
        else:
            first_hot = hot_ids[int(torch.randint(len(hot_ids), (1,), generator=g))]
            first_cold = cold_ids[int(torch.randint(len(cold_ids), (1,), generator=g))]
            rest = [e for e in range(experts) if e not in (first_hot, first_cold)]
            pick = torch.randperm(len(rest), generator=g)[:top_k - 2].tolist()
            ids = [first_hot, first_cold] + [rest[i] for i in pick]
            order = torch.randperm(top_k, generator=g).tolist()
            rows.append([ids[i] for i in order])
            continue
        pick = torch.randperm(len(pool), generator=g)[:top_k].tolist()
        rows.append([pool[i] for i in pick])
    ids = torch.tensor(rows, dtype=torch.int32)
    logits = torch.randn(tokens, top_k, generator=g)
    weights = torch.softmax(logits, dim=-1).float()
    return ids, weights


def hidden_states(seed: int, tokens: int, dtype: torch.dtype, hidden: int = HIDDEN) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(tokens, hidden, generator=g).to(dtype)
