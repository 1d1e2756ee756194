"""The decode simulation's router kernel (bench/decode_sim.py ``router_topk_softmax``): one launch
that does what vLLM 0.33's ``topk_softmax`` op does — softmax over every expert in fp32, the top k,
renormalized to sum to one — checked under TRITON_INTERPRET=1 against torch's own softmax and topk
(three separate ops, the path the simulation used before), at both simulated models' expert counts
(128) and at a count that is not a power of two (384 padded to 512: the padding must never win).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
from interpreter_rerun import rerun_interpreted

torch = pytest.importorskip("torch")
ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton for TRITON_INTERPRET=1")
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present: the simulation itself runs it compiled")
@pytest.mark.parametrize("experts,top_k", [(128, 4), (128, 8), (384, 6)])
def test_router_kernel_is_softmax_topk_renormalized(experts: int, top_k: int) -> None:
    if rerun_interpreted(__file__, f"test_router_kernel_is_softmax_topk_renormalized[{experts}-{top_k}]"):
        return
    os.environ["TRITON_INTERPRET"] = "1"
    sys.path.insert(0, str(ROOT / "bench"))
    sys.path.insert(0, str(ROOT / "runtime"))
    import decode_sim

    gen = torch.Generator().manual_seed(experts + top_k)
    tokens = 5
    # fp32 logits: no ties, so the experts and their order are defined; bf16 (the simulation's
    # dtype) has ties, where the order is not: there the picked probabilities are compared.
    for dtype in (torch.float32, torch.bfloat16):
        logits = (torch.randn(tokens, experts, generator=gen) * 3).to(dtype)
        w = torch.full((tokens, top_k), float("nan"))
        ids = torch.full((tokens, top_k), -7, dtype=torch.int32)
        decode_sim.router_topk_softmax(logits, top_k, w, ids)

        probs = torch.softmax(logits.float(), dim=-1)
        ref_p, ref_ids = torch.topk(probs, top_k, dim=-1)
        ref_w = ref_p / ref_p.sum(dim=-1, keepdim=True)
        assert bool((ids >= 0).all() and (ids < experts).all())   # the padded lanes (384 -> 512) never picked
        assert all(len(set(row.tolist())) == top_k for row in ids), ids   # k distinct experts per token
        if dtype == torch.float32:
            assert torch.equal(ids.long(), ref_ids), (ids, ref_ids)   # the same experts, best first
        picked = torch.gather(probs, 1, ids.long())
        assert torch.allclose(picked, ref_p, rtol=1e-6, atol=0), (picked, ref_p)   # as good as torch's picks
        assert torch.allclose(w, ref_w, rtol=1e-5, atol=1e-6), (w, ref_w)
        assert torch.allclose(w.sum(dim=-1), torch.ones(tokens), atol=1e-5)
