"""An adaptive lane over real CPU processes (torch.distributed over gloo): TP = 2 x PP = 2.

Ranks 0, 1 are pipeline stage 0 (MoE layers 0, 1), ranks 2, 3 stage 1 (layers 2, 3); within a
stage each rank holds its tensor-parallel shard of every expert (``parallel.tp``) with the lane's
one row map, re-homed with spare rows. Every rank sees the same routing for its stage's layers
(drawn from seeds, as every rank of a real lane sees the same router output) through a class shift
(agent, then prose), runs its own ``AdaptivePolicy`` with copies on a worker thread
(``ThreadedCopies``: copies beside the forwards), the stages' class fits summed over the pipeline
group (``reduce_fit``: one all-reduce per barrier), and checks split == unsplit on its shard bit
for bit at every forward and after every barrier. Each rank logs what it decided and when: every
barrier's flipped swaps, chosen profile and window figures, and after every step the transfers in
flight with their chunks issued. ``tests/test_adaptive_gloo.py`` compares the logs.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

HERE = Path(__file__).resolve().parent
for path in (HERE, HERE / "runtime", HERE.parent / "runtime"):
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

from expert_residency.core import ExpertCounter, device_allocator, host_allocator, residency_forward  # noqa: E402
from expert_residency.core.adaptive import AdaptiveConfig, AdaptivePolicy  # noqa: E402
from expert_residency.core.adaptive_step import StepBarrier  # noqa: E402
from expert_residency.core.copies import ThreadedCopies  # noqa: E402
from expert_residency.core.reference import swiglu_per_pick  # noqa: E402
from expert_residency.core.slots import add_spare_rows  # noqa: E402
from expert_residency.formats import load_histogram  # noqa: E402
from expert_residency.parallel import TensorShard, rehome_tp_rank, unsplit_tp_rank  # noqa: E402

PROFILES = HERE.parent / "recipes" / "profiles" / "dsv41-flash"
EXPERTS, HIDDEN, INTER, TOP_K, HOT = 16, 64, 32, 4, 10
LAYERS = (0, 1, 2, 3)
STAGES, TP = 2, 2
STEPS, SHIFT, TOKENS = 40, 12, 6
CONFIGS = {
    # copies keep up (each plan copied in the steps after it): plans are comparable with one process
    "keep_up": AdaptiveConfig(interval=4, swaps_per_layer=2, decay=0.5, margin=0.25, evidence=0.5,
                              counts_evidence=0.5, prior_weight=8.0, copy_rows_per_layer=1e6),
    # a small copy budget: transfers carried over barriers
    "budget": AdaptiveConfig(interval=4, swaps_per_layer=3, decay=0.5, margin=0.25, evidence=0.5,
                             counts_evidence=0.5, prior_weight=8.0, copy_rows_per_layer=0.125),
}


def stage_layers(stage: int) -> tuple[int, ...]:
    per = len(LAYERS) // STAGES
    return LAYERS[stage * per:(stage + 1) * per]


def class_probs(name: str, layers=LAYERS) -> torch.Tensor:
    counts = torch.tensor(load_histogram(PROFILES / f"{name}.hist").counts[list(layers), :EXPERTS],
                          dtype=torch.float64)
    return counts / counts.sum(dim=1, keepdim=True)


def full_layer(index: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + index)
    return {"w13_weight": (torch.randn(EXPERTS, 2 * INTER, HIDDEN, generator=g) / HIDDEN ** 0.5).bfloat16(),
            "w2_weight": (torch.randn(EXPERTS, HIDDEN, INTER, generator=g) / INTER ** 0.5).bfloat16()}


def step_inputs(step: int, index: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(x, weights, ids) of one layer's step: the same on every rank and in the reference."""
    phase = "agent" if step < SHIFT else "prose"
    probs = class_probs(phase)[LAYERS.index(index)]
    g = torch.Generator().manual_seed(10_000 * step + index)
    ids = torch.multinomial(probs.float().expand(TOKENS, -1), TOP_K, replacement=False, generator=g)
    x = torch.randn(TOKENS, HIDDEN, generator=g).bfloat16()
    w = torch.softmax(torch.randn(TOKENS, TOP_K, generator=g), -1)
    return x, w, ids.to(torch.int32)


def build(layers: tuple[int, ...], shard: TensorShard | None, config: AdaptiveConfig):
    """(split layers with spare rows, unsplit references) for this rank's shard (None: whole experts)."""
    agent = class_probs("agent")
    split, ref = {}, {}
    for index in layers:
        order = torch.argsort(agent[LAYERS.index(index)], descending=True, stable=True).tolist()
        hot, cold = order[:HOT], order[HOT:]
        full = full_layer(index)
        if shard is None:
            from expert_residency.core import build_unsplit_layer, rehome_layer

            layer = rehome_layer({k: v.clone() for k, v in full.items()}, hot, cold, layer_index=index,
                                 hot_alloc=device_allocator("cpu"), cold_alloc=host_allocator())
            ref[index] = build_unsplit_layer(full, layer_index=index)
        else:
            layer = rehome_tp_rank(full, hot, cold, shard, layer_index=index, hot_alloc=device_allocator("cpu"),
                                   cold_alloc=host_allocator())
            ref[index] = unsplit_tp_rank(full, shard, layer_index=index)
        split[index] = add_spare_rows(layer, config.swaps_per_layer, config.swaps_per_layer)
    return split, ref


def run_lane(layers, shard, config, reduce_fit=None) -> list:
    split, ref = build(layers, shard, config)
    counter = ExpertCounter(layers, EXPERTS, top_k=TOP_K)
    priors = {name: class_probs(name, layers) for name in ("agent", "prose")}
    copies = ThreadedCopies()
    policy = AdaptivePolicy(counter, split, config, priors=priors, lookahead=True, copies=copies,
                            reduce_fit=reduce_fit)
    barrier = StepBarrier(policy)
    fn = swiglu_per_pick()
    e = torch.arange(EXPERTS)
    check_ids = torch.stack([(e + 3 * k) % EXPERTS for k in range(TOP_K)], dim=1).to(torch.int32)
    check_x = torch.randn(EXPERTS, HIDDEN, generator=torch.Generator().manual_seed(1)).bfloat16()
    check_w = torch.full((EXPERTS, TOP_K), 1.0 / TOP_K)
    log = []
    try:
        for step in range(STEPS):
            report = barrier.before_forward(real=True)
            if report is not None:
                log.append(("barrier", report.barrier, sorted(report.swaps), report.prior,
                            report.window_picks, report.window_cold_picks))
                for index in layers:   # every expert through every slot: split == unsplit
                    got = residency_forward(split[index], check_x, check_w, check_ids, fn)
                    want = residency_forward(ref[index], check_x, check_w, check_ids, fn)
                    assert torch.equal(got, want), f"layer {index}: split != unsplit after barrier {report.barrier}"
            log.append(("in flight", step, [(t.swap, t.issued) for t in policy.in_flight]))
            for index in layers:       # copies may be running on the worker thread right now
                x, w, ids = step_inputs(step, index)
                got = residency_forward(split[index], x, w, ids, fn, counter=counter)
                want = residency_forward(ref[index], x, w, ids, fn)
                assert torch.equal(got, want), f"layer {index}: split != unsplit at step {step}"
    finally:
        copies.drain()
        copies.close()
    log.append(("swaps", policy.swaps_done))
    return log


def rank_main(rank: int, world: int, init_method: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=world)
    try:
        stage, tp_rank = divmod(rank, TP)
        # every rank creates every pipeline group, in the same order (torch.distributed's rule)
        pp_groups = [dist.new_group([t + TP * s for s in range(STAGES)]) for t in range(TP)]
        group = pp_groups[tp_rank]

        def reduce_fit(t: torch.Tensor) -> torch.Tensor:
            dist.all_reduce(t, group=group)
            return t

        shard = TensorShard(TP, tp_rank, INTER)
        logs = {name: run_lane(stage_layers(stage), shard, config, reduce_fit) for name, config in CONFIGS.items()}
        (Path(out_dir) / f"rank{rank}.json").write_text(
            json.dumps({"rank": rank, "stage": stage, "tp_rank": tp_rank, "logs": logs}))
    finally:
        dist.destroy_process_group()


def run() -> tuple[list[dict], dict[str, list]]:
    """Every rank's logs, and one process holding every layer whole (the reference lane)."""
    import torch.multiprocessing as mp

    world = STAGES * TP
    with tempfile.TemporaryDirectory() as tmp:
        init = "file://" + os.path.join(tmp, "rendezvous")
        mp.spawn(rank_main, args=(world, init, tmp), nprocs=world, join=True)
        ranks = [json.loads((Path(tmp) / f"rank{r}.json").read_text()) for r in range(world)]
    # the same JSON round trip as the ranks' logs (tuples become lists)
    reference = json.loads(json.dumps({name: run_lane(LAYERS, None, config) for name, config in CONFIGS.items()}))
    return ranks, reference
