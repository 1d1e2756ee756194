"""A router id outside ``0..E-1`` (vLLM's -1: a pick computed on another rank, or unrouted; or an
id ``>= E``) adds ``fma(0, 0, acc)`` in the Blackwell bank kernel (``blackwell.trtllm``), exactly
as in the core torch path (``core.split.residency_forward``): never the last expert's row
(``codes[-1]`` wraps around in the bank remap), never an IndexError, never a stale ``pick_out`` row.

Runs on CPU with ``blackwell.emulation`` standing in for FlashInfer's routed MoE (the emulated
launcher, like FlashInfer's routing kernels, refuses an id outside ``[0, num_experts)``, so the
remap must hand it an in-range stand-in). ``checked_routed_moe`` adds what the emulation does not
model: FlashInfer's block routing kernel keeps one ``k`` per (token, id) (``smemKIdx``), so a launch
whose token repeats an id local to it would drop one of those routes — a stand-in must never
collide with a real pick."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from expert_residency.blackwell import layout as L  # noqa: E402
from expert_residency.blackwell.emulation import emulated_routed_moe  # noqa: E402
from expert_residency.blackwell.selfcheck import cold_pick_count  # noqa: E402
from expert_residency.blackwell.trtllm import TrtllmMxfp4Banks, bank_slots  # noqa: E402
from expert_residency.core.banks import build_unsplit_layer, device_allocator, host_allocator, rehome_layer  # noqa: E402
from expert_residency.core.counter import ExpertCounter  # noqa: E402
from expert_residency.core.fma_finalize import finalize  # noqa: E402
from expert_residency.core.reference import mxfp4_swiglu_per_pick  # noqa: E402
from expert_residency.core.split import residency_forward  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from random_experts import random_experts  # noqa: E402
from test_core_fixtures import single_torch_thread  # noqa: E402,F401  (autouse)

pytestmark = pytest.mark.torch

# Smallest bank-separable TRT-LLM geometry (H, I multiples of 128).
EXPERTS, HIDDEN, INTER, TOP_K = 10, 128, 128, 4
HOT, COLD = [3, 7, 1, 0, 5], [2, 4, 6, 8, 9]   # the wrapped-around expert E-1 is a cold row
assert EXPERTS - 1 in COLD

# token 0: a skipped pick in the middle; token 1: the last expert routed for real; token 2: two
# skipped picks (one past the end in IDS); token 3: every pick skipped.
MINUS_ONE_IDS = torch.tensor([[3, -1, 7, 0], [EXPERTS - 1, 2, 5, 8], [-1, 4, -1, 1],
                              [-1, -1, -1, -1]], dtype=torch.int32)
IDS = MINUS_ONE_IDS.clone()
IDS[2, 2] = EXPERTS
WEIGHTS = torch.tensor([[0.4, 0.3, 0.2, 0.1], [0.25, 0.25, 0.25, 0.25], [0.5, 0.2, 0.2, 0.1],
                        [0.3, 0.3, 0.2, 0.2]], dtype=torch.float32)
TOKENS = IDS.shape[0]
SKIPPED = (IDS < 0) | (IDS >= EXPERTS)
assert torch.equal(SKIPPED, MINUS_ONE_IDS < 0)


def checkpoint(seed: int = 1) -> dict[str, torch.Tensor]:
    return random_experts("mxfp4", EXPERTS, HIDDEN, INTER, seed)[0]


def hidden_states(seed: int = 2) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(TOKENS, HIDDEN, generator=g).to(torch.bfloat16)


def checked_routed_moe(launches: list | None = None, **kw):
    """The emulation, refusing a token that repeats an id local to the launch (FlashInfer would
    keep one of those routes and map the other to -1); records (ids, offset, local count)."""
    ids = kw["topk_ids"][0]
    lo, n = kw["local_expert_offset"], kw["local_num_experts"]
    for row in ids.tolist():
        local = [e for e in row if lo <= e < lo + n]
        assert len(local) == len(set(local)), f"duplicate local id in a token: {row} [{lo}, +{n})"
    if launches is not None:
        launches.append((ids.clone(), lo, n))
    return emulated_routed_moe(**kw)


def kernel(launches: list | None = None, *, checked: bool = True) -> TrtllmMxfp4Banks:
    routed_moe = (lambda **kw: checked_routed_moe(launches, **kw)) if checked else emulated_routed_moe
    return TrtllmMxfp4Banks(HIDDEN, INTER, EXPERTS, TOP_K, activation="bf16",
                            routed_moe=routed_moe, convert=L.to_trtllm_layout)


def layers(k: TrtllmMxfp4Banks):
    """(unsplit, split) layers in the TRT-LLM layout: one hot bank, and hot + cold (host) banks."""
    converted = checkpoint()
    k.to_kernel_layout(converted)
    unsplit = build_unsplit_layer({n: t.clone() for n, t in converted.items()}, layer_index=0)
    split = rehome_layer(converted, HOT, COLD, layer_index=0, hot_alloc=device_allocator("cpu"),
                         cold_alloc=host_allocator())
    return unsplit, split


def expected(k: TrtllmMxfp4Banks, layer, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """Independent expectation from the same kernel: every pick on a valid id (skipped ones on
    experts their token does not pick, chosen here in Python), then the skipped picks' rows and
    weights zeroed, so their step is fma(0, 0, acc)."""
    skipped = (ids < 0) | (ids >= EXPERTS)
    safe = ids.clone()
    for t, row in enumerate(ids.tolist()):
        unused = iter(e for e in range(EXPERTS) if e not in row)
        for j, e in enumerate(row):
            if not 0 <= e < EXPERTS:
                safe[t, j] = next(unused)
    picks = k.pick_outputs(layer, x, WEIGHTS, safe)
    picks = torch.where(skipped.unsqueeze(-1), torch.zeros_like(picks), picks)
    return finalize(picks, torch.where(skipped, 0.0, WEIGHTS), torch.bfloat16)


@pytest.mark.parametrize("ids", [MINUS_ONE_IDS, IDS], ids=["minus_one", "minus_one_and_E"])
def test_out_of_range_id_adds_nothing(ids: torch.Tensor) -> None:
    k = kernel()
    unsplit, split = layers(k)
    x = hidden_states()
    # the core torch path on the checkpoint layout (already fixed) is the reference
    core = residency_forward(build_unsplit_layer(checkpoint(), layer_index=0), x, WEIGHTS, ids,
                             mxfp4_swiglu_per_pick())
    for layer in (unsplit, split):
        want = expected(k, layer, x, ids)
        assert torch.equal(want, core)
        got = k.forward(layer, x, WEIGHTS, ids)
        assert torch.equal(got, want)
        assert not torch.isnan(got).any()
        # the core's per-pick contract over the kernel's banks: the same bits
        assert torch.equal(residency_forward(layer, x, WEIGHTS, ids, k.per_pick_fn()), want)
    assert torch.equal(core[3], torch.zeros_like(core[3]))
    # and not what wrapping -1 to the last expert computes (the old behaviour; it repeats expert
    # E-1 within a token, so only the unchecked emulation runs it)
    wrapped = torch.where(MINUS_ONE_IDS < 0, MINUS_ONE_IDS + EXPERTS, MINUS_ONE_IDS)
    old = kernel(checked=False).forward(split, x, WEIGHTS, wrapped)
    assert not torch.equal(old[0], core[0]) and not torch.equal(old[3], core[3])


def test_reused_pick_out_rows_of_skipped_picks_are_zero() -> None:
    k = kernel()
    _, split = layers(k)
    x = hidden_states()
    stale = torch.full((TOKENS, TOP_K, HIDDEN), 7.0, dtype=torch.bfloat16)
    picks = k.pick_outputs(split, x, WEIGHTS, IDS, pick_out=stale)
    assert picks is stale
    assert torch.equal(picks[SKIPPED], torch.zeros_like(picks[SKIPPED]))
    assert (picks[~SKIPPED] != 7.0).all()
    fresh = k.pick_outputs(split, x, WEIGHTS, IDS)
    assert torch.equal(fresh, picks)


def test_bank_slots_give_skipped_picks_an_in_range_slot() -> None:
    """The remap stays fixed-shape and in range (FlashInfer's routing indexes shared memory by
    id); the slots of valid picks are unchanged."""
    _, split = layers(kernel())
    slots = bank_slots(split.row_codes, IDS, split.hot.num_rows)
    assert slots.dtype == torch.int32 and slots.shape == IDS.shape
    assert bool(((slots >= 0) & (slots < EXPERTS)).all())
    valid_only = bank_slots(split.row_codes, torch.where(SKIPPED, 0, IDS), split.hot.num_rows)
    assert torch.equal(slots[~SKIPPED], valid_only[~SKIPPED])
    # the wrapped-around expert's slot (cold row of expert E-1) is not what -1 gets
    last = bank_slots(split.row_codes, torch.tensor([[EXPERTS - 1]]), split.hot.num_rows)
    assert not (slots[MINUS_ONE_IDS < 0] == int(last)).any()


def test_forward_counts_skipped_picks_for_no_expert() -> None:
    k = kernel()
    _, split = layers(k)
    counter = ExpertCounter([0], EXPERTS)
    k.forward(split, hidden_states(), WEIGHTS, IDS, counter=counter)
    want = torch.bincount(IDS[~SKIPPED].long(), minlength=EXPERTS)
    assert counter.counts[counter.row_of(0)].tolist() == want.tolist()


def test_selfcheck_cold_pick_count_skips_out_of_range_ids() -> None:
    _, split = layers(kernel())
    cold = set(COLD)
    want = sum(1 for e in IDS.reshape(-1).tolist() if e in cold)
    assert cold_pick_count(split.row_codes, IDS) == want
    assert cold_pick_count(split.row_codes, MINUS_ONE_IDS) == want


def test_split_layer_computes_nothing_for_skipped_picks() -> None:
    """Each bank's launch gets the skipped picks as ids of the other bank (not local), the path
    FlashInfer runs for another EP rank's picks: no GEMM row, no cold weights read for them."""
    launches: list = []
    k = kernel(launches)
    _, split = layers(k)
    k.forward(split, hidden_states(), WEIGHTS, IDS)
    assert len(launches) == 2
    for ids, lo, n in launches:
        local = (ids >= lo) & (ids < lo + n)
        assert not (local & SKIPPED).any(), (lo, n)
        assert bool(((ids >= 0) & (ids < EXPERTS)).all())
    # the valid picks are the one remap in both launches
    assert torch.equal(launches[0][0][~SKIPPED], launches[1][0][~SKIPPED])


def test_spare_slots_are_distinct_and_unused() -> None:
    from expert_residency.blackwell.trtllm import spare_slots

    slots = torch.tensor([[0, 0, 3, 0], [0, 0, 0, 0], [1, 2, 3, 0]], dtype=torch.int32)
    valid = torch.tensor([[True, False, True, False], [False] * 4, [True] * 4])
    spare = spare_slots(slots, valid, 5)
    assert spare.shape == slots.shape
    assert spare[0, 1].item() == 1 and spare[0, 3].item() == 2    # the free slots 1, 2, 4 in order
    assert spare[1].tolist() == [0, 1, 2, 3]
    for t in range(slots.shape[0]):
        real = set(slots[t][valid[t]].tolist())
        stand_ins = spare[t][~valid[t]].tolist()
        assert len(set(stand_ins)) == len(stand_ins) and not real & set(stand_ins)
        assert all(0 <= s < 5 for s in stand_ins)


@pytest.mark.parametrize("num_slots", [6, 7, 384])
def test_spare_slots_property_on_random_routing(num_slots: int) -> None:
    """Every token, any number of skipped picks (0..K): the stand-ins are distinct, inside
    ``0..num_slots-1`` and none of the token's real slots (router picks of a token are distinct)."""
    from expert_residency.blackwell.trtllm import spare_slots

    gen = torch.Generator().manual_seed(num_slots)
    t, k = 500, 6
    slots = torch.stack([torch.randperm(num_slots, generator=gen)[:k] for _ in range(t)]).to(torch.int32)
    valid = torch.rand(t, k, generator=gen) < torch.rand(t, 1, generator=gen)  # 0..K skipped per token
    spare = spare_slots(slots, valid, num_slots)
    for row in range(t):
        real = set(slots[row][valid[row]].tolist())
        stand_ins = spare[row][~valid[row]].tolist()
        assert len(set(stand_ins)) == len(stand_ins), (row, stand_ins)
        assert not real & set(stand_ins), (row, real, stand_ins)
        assert all(0 <= s < num_slots for s in stand_ins)
