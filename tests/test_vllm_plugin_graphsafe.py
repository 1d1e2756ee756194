"""The plugin's entry is CUDA-graph-safe, checked on the CPU with the core's op-level checker
(tests/runtime/test_core_graphsafe.py: no op that reads a device value back to the host, no op
with a data-dependent output shape, the same op sequence whatever the routing or the padding).

The entry is ``forward_modular`` of a stand-in layer laid out like vLLM 0.33's ``RoutedExperts`` +
``Mxfp4MoEMethod`` (tests/plugin_entry_support.py), i.e. the method vLLM calls, through the worker
runtime, in residency (with the counter on, as a live lane with a dump folder), unsplit and count
mode. The step masks come from a forward context shaped like vLLM's (``is_padding`` +
``query_start_loc``) through ``WorkerRuntime.on_forward_context`` — the callback vLLM's
``create_forward_context`` runs.

Claims, each able to fail:
* no forbidden op in any mode's forward, nor in the mask refresh;
* identical op sequence and shapes for different routing and different padding/request mixes;
* the counter equals a recount by hand that skips padded rows (which route to expert 0, so
  counting them would show), and decode tokens equal the number of length-1 requests;
* residency == unsplit on the real rows, bit for bit (``torch.equal``), through the entry.
The same entry is captured in a CUDA graph on the H200: tests/gpu/test_plugin_entry_graph_gpu.py.
"""

from __future__ import annotations

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

sys.path.insert(0, str(Path(__file__).resolve().parent / "runtime"))

import test_vllm_plugin_mxfp4 as mx  # noqa: E402
from expert_residency.mxfp4 import quantize_mxfp4  # noqa: E402
from expert_residency.vllm_plugin.step_masks import StepMasks  # noqa: E402
from expert_residency.vllm_plugin.worker_runtime import set_runtime  # noqa: E402
from plugin_entry_support import plugin_runtime, recount, step_context  # noqa: E402
from test_core_graphsafe import FORBIDDEN, OpRecorder  # noqa: E402

pytestmark = pytest.mark.torch

ROWS = 8                      # padded step size (a CUDA-graph batch size)
STEPS = [(ROWS, [1, 1, 4]),   # two decode requests and a 4-token prefill chunk, 2 padded rows
         (ROWS, [1, 1, 1, 1, 1]),   # five decodes, 3 padded rows
         (ROWS, [3, 1])]            # a chunk and one decode, 4 padded rows
HOT = [0, 3, 5]


def _tensors() -> dict[int, dict[str, torch.Tensor]]:
    case = mx.build_case("cpu")
    out = {}
    for index, (w13, w2) in case.weights.items():
        q13, s13 = quantize_mxfp4(w13)
        q2, s2 = quantize_mxfp4(w2)
        out[index] = {"w13_weight": q13, "w13_weight_scale": s13, "w2_weight": q2,
                      "w2_weight_scale": s2}
    return out


def _routing(seed: int, actual: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(ROWS, mx.HIDDEN, generator=gen).to(torch.bfloat16)
    ids = torch.stack([torch.randperm(mx.EXPERTS, generator=gen)[:mx.TOP_K] for _ in range(ROWS)])
    ids[actual:] = 0  # padded rows route garbage: here all to expert 0
    weights = torch.softmax(torch.randn(ROWS, mx.TOP_K, generator=gen), dim=-1)
    return x, weights, ids.to(torch.int32)


@pytest.fixture(autouse=True)
def _no_runtime_left():
    yield
    set_runtime(None)


def _run(runtime, layers, ctx, x, weights, ids):
    set_runtime(runtime)
    runtime.on_forward_context(ctx)
    with OpRecorder() as rec:
        outs = [layers[i].forward_modular(x, weights, ids) for i in sorted(layers)]
    return outs, rec.ops


@pytest.mark.parametrize("mode", ["residency", "unsplit", "count"])
def test_entry_has_no_sync_same_ops_and_exact_counts(mode: str) -> None:
    runtime, layers = plugin_runtime(_tensors(), mode, top_k=mx.TOP_K, max_num_tokens=64,
                                     hot={i: HOT for i in mx.LAYERS} if mode == "residency"
                                     else None, count=True)
    expected = {i: [0] * mx.EXPERTS for i in mx.LAYERS}
    tokens = decode = 0
    first_ops = None
    for seed, (rows, lengths) in enumerate(STEPS):
        x, weights, ids = _routing(seed, sum(lengths))
        _, ops = _run(runtime, layers, step_context(rows, lengths, "cpu"), x, weights, ids)
        names = {name for name, _ in ops}
        assert not names & FORBIDDEN, names & FORBIDDEN
        assert "index_add" in names or "index_add_" in names  # the counter ran inside the step
        if first_ops is None:
            first_ops = ops
        assert ops == first_ops, f"step {seed}: op sequence differs"
        counts, n, d = recount(ids, lengths, mx.EXPERTS)
        for i in mx.LAYERS:
            expected[i] = [a + b for a, b in zip(expected[i], counts)]
        tokens, decode = tokens + n, decode + d
    got, got_tokens, got_decode = runtime.counter.snapshot()
    for row, i in enumerate(mx.LAYERS):
        assert got[row].tolist() == expected[i], f"layer {i}"
    assert (got_tokens, got_decode) == (tokens, decode) == (6 + 5 + 4, 2 + 5 + 1)
    # Padded rows all route to expert 0: counting them would add 3 * 9 picks per layer.
    assert got[0, 0] == expected[0][0]


def test_residency_equals_unsplit_on_real_rows_through_the_entry() -> None:
    res, res_layers = plugin_runtime(_tensors(), "residency", top_k=mx.TOP_K, max_num_tokens=64,
                                     hot={i: HOT for i in mx.LAYERS}, count=True)
    ref, ref_layers = plugin_runtime(_tensors(), "unsplit", top_k=mx.TOP_K, max_num_tokens=64)
    for seed, (rows, lengths) in enumerate(STEPS):
        actual = sum(lengths)
        x, weights, ids = _routing(10 + seed, actual)
        ctx = step_context(rows, lengths, "cpu")
        got, _ = _run(res, res_layers, ctx, x, weights, ids)
        want, _ = _run(ref, ref_layers, ctx, x, weights, ids)
        for a, b in zip(got, want):
            assert torch.equal(a[:actual], b[:actual])
            assert a[:actual].abs().sum() > 0


def test_mask_refresh_has_no_sync_and_matches_hand_masks() -> None:
    masks = StepMasks(16, "cpu")
    # Requests of 1, 3, 0 (a padded request), 1 new tokens in a step padded to 8 rows.
    ctx = step_context(8, [1, 3, 0, 1], "cpu")
    with OpRecorder() as rec:
        masks.update_from_context(ctx)
    assert not {name for name, _ in rec.ops} & FORBIDDEN
    # A handful of kernels per step (views aside), outside the captured region: ~valid, the
    # tail's zero, and the decode count (lengths, first rows' validity, and, sum).
    kernels = [name for name, _ in rec.ops if name not in ("slice", "view", "select", "alias")]
    assert kernels[:2] == ["logical_not", "zero_"] and kernels[-1] == "sum", kernels
    assert len(kernels) <= 7, kernels
    assert masks.valid.tolist() == [True] * 5 + [False] * 11
    assert masks.decode_count.tolist() == [2]
    # Capture/warm-up dummies: metadata of one-token requests on rows all marked padding
    # (V1 _dummy_run, V2 cudagraph_utils): no real token, no decode token.
    ctx = step_context(8, [1] * 8, "cpu")
    ctx.is_padding = torch.ones(8, dtype=torch.bool)
    masks.update_from_context(ctx)
    assert not masks.valid.any() and masks.decode_count.tolist() == [0]
    # No attention metadata (vLLM's profiling run): nothing is real.
    masks.update_from_context(SimpleNamespace(attn_metadata=None, is_padding=None))
    assert not masks.valid.any() and masks.decode_count.tolist() == [0]
    # Without is_padding the metadata's num_actual_tokens decides.
    ctx = step_context(8, [2, 1], "cpu")
    ctx.is_padding = None
    masks.update_from_context(ctx)
    assert masks.valid.tolist()[:9] == [True, True, True] + [False] * 6
    assert masks.decode_count.tolist() == [1] and masks.decode_known
    # Metadata without query_start_loc: decode tokens unknown, real tokens still masked.
    ctx.attn_metadata = {"a": SimpleNamespace(num_actual_tokens=2)}
    masks.update_from_context(ctx)
    assert masks.valid.tolist()[:3] == [True, True, False] and not masks.decode_known
    assert StepMasks.bytes_for(16) == 16 * 5 + 1 + 8 == masks.nbytes


def test_counted_boot_reports_workspace_bytes() -> None:
    runtime, _ = plugin_runtime(_tensors(), "residency", top_k=mx.TOP_K, max_num_tokens=64,
                                hot={i: HOT for i in mx.LAYERS}, count=True)
    sizes = runtime.workspace_bytes()
    # CPU: the torch reference has no workspace, and host-side counter bytes are not HBM.
    assert sizes == {"workspace_bytes": 0, "counter_bytes": 0}
    assert runtime.fused == {}
