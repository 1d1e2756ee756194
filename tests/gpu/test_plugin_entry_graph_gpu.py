"""The plugin's entry under CUDA graphs on a CUDA GPU (the H200), without vLLM.

The entry is ``forward_modular`` of stand-in layers laid out like vLLM 0.33's ``RoutedExperts`` +
``Mxfp4MoEMethod`` (tests/plugin_entry_support.py; ``ResidencyForward`` first in the bases, as in
``ResidencyRoutedExperts``), i.e. the method vLLM's ``MoERunner`` calls, through the worker
runtime: on CUDA an MXFP4 layer's split forward is the fused split layer
(``TritonMxfp4Experts.forward``), its cold bank pinned host memory read in place. Step masks come
from a forward context shaped like vLLM's through ``WorkerRuntime.on_forward_context``.

Run there with ``PYTHONPATH=runtime python3 -m pytest tests/gpu/test_plugin_entry_graph_gpu.py -q``.

Claims, each able to fail:
* the step (two MoE layers through the entry) is captured in one CUDA graph with
  ``torch.cuda.set_sync_debug_mode("error")`` set inside the capture; the mask refresh and every
  replay run under it too (any synchronising call raises);
* replayed with new routing and new padding each time, residency's graph == residency eager ==
  unsplit (its own graph and eager) on the real rows, bit for bit (``torch.equal``);
* the in-kernel counter after the replays == a recount by hand that skips padded rows (all
  routed to expert 0 so that counting them shows), decode tokens == the length-1 requests;
* count mode (vLLM's kernel serves; the runtime only counts) captured and replayed the same way:
  counter == the recount;
* the plugin's split forward is the fused layer (report ``forward: fused``) and the start-up
  report's workspace bytes equal the workspace formula.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU: run them on a GPU machine (BENCHMARKS.md gives the H200 commands)",
                allow_module_level=True)
pytest.importorskip("triton", reason="needs Triton (the H200 image has triton 3.6)")

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "runtime"))
sys.path.insert(0, str(ROOT / "tests"))

from expert_residency.gpu.experts import ExpertShape, Workspace  # noqa: E402
from expert_residency.gpu.pinned import PinnedRegion  # noqa: E402
from expert_residency.vllm_plugin.step_masks import StepMasks  # noqa: E402
from expert_residency.vllm_plugin.worker_runtime import set_runtime  # noqa: E402
from plugin_entry_support import plugin_runtime, recount, step_context  # noqa: E402

pytestmark = pytest.mark.gpu
DEV = torch.device("cuda")
HIDDEN, INTER, EXPERTS, TOP_K, LAYERS = 512, 256, 16, 4, (3, 5)
ROWS, MAX_TOKENS = 16, 64
HOT = [0, 2, 3, 7, 8, 11]
# (lengths of the step's requests): decodes, prefill chunks, a verify-like window; then padding
STEPS = [[1, 1, 1], [4, 1, 1, 6], [1] * 9, [2, 1, 3], [1, 7, 1, 1, 1, 1]]


def _tensors(seed: int) -> dict[int, dict[str, torch.Tensor]]:
    gen = torch.Generator(device=DEV).manual_seed(seed)
    out = {}
    for index in LAYERS:
        t = {"w13_weight": (EXPERTS, 2 * INTER, HIDDEN // 2),
             "w13_weight_scale": (EXPERTS, 2 * INTER, HIDDEN // 32),
             "w2_weight": (EXPERTS, HIDDEN, INTER // 2),
             "w2_weight_scale": (EXPERTS, HIDDEN, INTER // 32)}
        layer = {}
        for name, shape in t.items():
            x = torch.empty(shape, dtype=torch.uint8, device=DEV)
            x.random_(118, 124, generator=gen) if name.endswith("scale") else x.random_(0, 256, generator=gen)
            layer[name] = x
        out[index] = layer
    return out


def _routing(seed: int, actual: int):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    x = (torch.randn(ROWS, HIDDEN, generator=gen, device=DEV) * 0.5).to(torch.bfloat16)
    ids = torch.argsort(torch.rand(ROWS, EXPERTS, generator=gen, device=DEV), dim=1)[:, :TOP_K]
    ids[actual:] = 0  # padded rows: garbage routing, all to expert 0
    weights = torch.softmax(torch.randn(ROWS, TOP_K, generator=gen, device=DEV), dim=-1)
    return x, weights, ids.to(torch.int32)


@pytest.fixture(autouse=True)
def _no_runtime_left():
    yield
    set_runtime(None)
    torch.cuda.set_sync_debug_mode(0)


class Captured:
    """The entry over every layer, captured once; masks refreshed and buffers loaded per step."""

    def __init__(self, runtime, layers) -> None:
        self.runtime, self.layers = runtime, [layers[i] for i in sorted(layers)]
        self.x = torch.zeros(ROWS, HIDDEN, dtype=torch.bfloat16, device=DEV)
        self.w = torch.full((ROWS, TOP_K), 1.0 / TOP_K, device=DEV)
        self.ids = torch.zeros(ROWS, TOP_K, dtype=torch.int32, device=DEV)
        set_runtime(runtime)
        runtime.on_forward_context(step_context(ROWS, [1], DEV))
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):  # warm-up: Triton compiles outside the capture
            for _ in range(2):
                self.step()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            torch.cuda.set_sync_debug_mode("error")
            try:
                self.out = self.step()
            finally:
                torch.cuda.set_sync_debug_mode(0)
        torch.cuda.synchronize()

    def step(self):
        return [layer.forward_modular(self.x, self.w, self.ids) for layer in self.layers]

    def replay(self, ctx, x, w, ids):
        set_runtime(self.runtime)
        self.runtime.on_forward_context(ctx)   # eager, before the replay, as vLLM does
        self.x.copy_(x)
        self.w.copy_(w)
        self.ids.copy_(ids)
        self.graph.replay()
        return [o.clone() for o in self.out]

    def eager(self, ctx, x, w, ids):
        set_runtime(self.runtime)
        self.runtime.on_forward_context(ctx)
        return [layer.forward_modular(x, w, ids) for layer in self.layers]


def _contexts_and_routing(seed0: int):
    out = []
    for s, lengths in enumerate(STEPS):
        x, w, ids = _routing(seed0 + s, sum(lengths))
        out.append((lengths, step_context(ROWS, lengths, DEV), x, w, ids))
    return out


def test_entry_captured_replays_new_routing_equal_to_eager_and_unsplit_and_counts_exactly():
    res, res_layers = plugin_runtime(_tensors(1), "residency", top_k=TOP_K,
                                     max_num_tokens=MAX_TOKENS,
                                     hot={i: HOT for i in LAYERS}, count=True)
    ref, ref_layers = plugin_runtime(_tensors(1), "unsplit", top_k=TOP_K,
                                     max_num_tokens=MAX_TOKENS, count=True)
    assert set(res.fused) == set(LAYERS) and res.report is None
    assert res.per_pick_name.startswith("expert_residency Triton MXFP4")
    resident = res_layers[LAYERS[0]]._er_resident
    assert resident.cold.num_rows == EXPERTS - len(HOT)
    assert all(isinstance(o, PinnedRegion) for o in resident.cold.owners)
    g_res, g_ref = Captured(res, res_layers), Captured(ref, ref_layers)
    steps = _contexts_and_routing(100)
    for runtime in (res, ref):
        runtime.counter.reset()
    got_res, got_ref = [], []
    torch.cuda.set_sync_debug_mode("error")
    for _, ctx, x, w, ids in steps:
        got_res.append(g_res.replay(ctx, x, w, ids))
        got_ref.append(g_ref.replay(ctx, x, w, ids))
    torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    counts, tokens, decode = res.counter.snapshot()
    counts_ref, tokens_ref, decode_ref = ref.counter.snapshot()
    # Eager through the same entry (after the counts were read: eager runs count too).
    torch.cuda.set_sync_debug_mode("error")
    eager_res = [g_res.eager(ctx, x, w, ids) for _, ctx, x, w, ids in steps]
    eager_ref = [g_ref.eager(ctx, x, w, ids) for _, ctx, x, w, ids in steps]
    torch.cuda.set_sync_debug_mode(0)
    torch.cuda.synchronize()
    want = {i: [0] * EXPERTS for i in LAYERS}
    want_tokens = want_decode = 0
    for s, (lengths, _, _x, _w, ids) in enumerate(steps):
        n = sum(lengths)
        for layer in range(len(LAYERS)):
            a, b = got_res[s][layer][:n], got_ref[s][layer][:n]
            assert torch.equal(a, b), f"step {s} layer {layer}: residency graph != unsplit graph"
            assert torch.equal(a, eager_res[s][layer][:n]), f"step {s}: graph != eager"
            assert torch.equal(a, eager_ref[s][layer][:n]), f"step {s}: graph != unsplit eager"
            assert torch.isfinite(a.float()).all() and a.float().abs().sum() > 0
        c, t, d = recount(ids.cpu(), lengths, EXPERTS)
        for i in LAYERS:
            want[i] = [u + v for u, v in zip(want[i], c)]
        want_tokens, want_decode = want_tokens + t, want_decode + d
    # the replays really saw new routing: outputs differ between steps
    assert not torch.equal(got_res[0][0][:3], got_res[2][0][:3])
    for row, i in enumerate(LAYERS):
        assert counts[row].tolist() == want[i], f"layer {i}: counter != recount"
        assert counts_ref[row].tolist() == want[i]
    assert (tokens, decode) == (tokens_ref, decode_ref) == (want_tokens, want_decode)
    assert (want_tokens, want_decode) == (3 + 12 + 9 + 6 + 12, 3 + 2 + 9 + 1 + 5)


def test_count_mode_entry_captured_counts_exactly():
    runtime, layers = plugin_runtime(_tensors(2), "count", top_k=TOP_K, max_num_tokens=MAX_TOKENS)
    assert runtime.fused == {} and all(m._er_resident is None for m in layers.values())
    g = Captured(runtime, layers)
    runtime.counter.reset()
    steps = _contexts_and_routing(200)
    torch.cuda.set_sync_debug_mode("error")
    for _, ctx, x, w, ids in steps:
        g.replay(ctx, x, w, ids)
    torch.cuda.set_sync_debug_mode(0)
    counts, tokens, decode = runtime.counter.snapshot()
    want = [0] * EXPERTS
    want_tokens = want_decode = 0
    for lengths, _, _, _, ids in steps:
        c, t, d = recount(ids.cpu(), lengths, EXPERTS)
        want = [u + v for u, v in zip(want, c)]
        want_tokens, want_decode = want_tokens + t, want_decode + d
    for row in range(len(LAYERS)):
        assert counts[row].tolist() == want
    assert (tokens, decode) == (want_tokens, want_decode)


def test_report_names_the_fused_forward_and_its_workspace_bytes():
    runtime, _ = plugin_runtime(_tensors(3), "residency", top_k=TOP_K, max_num_tokens=MAX_TOKENS,
                                hot={i: HOT for i in LAYERS}, count=True)
    runtime._emit_report()
    extra = runtime.report.extra
    assert extra["forward"] == "fused"
    # One shared workspace (one geometry), by hand: P = 64*4 = 256 picks, PB = 256;
    # int32 2*256 + 257 + 256 + 2 = 1027 -> 4108 B, int64 8 B, bf16 256*(256+512)*2 = 393,216 B;
    # split-K tickets: p = min(64, 6)*4 = 24 picks x (256/64 + 512/128) tiles x 4 B = 768 B.
    assert extra["workspace_bytes"] == 4108 + 8 + 393216 + 768
    assert Workspace.bytes_for(MAX_TOKENS, TOP_K, ExpertShape(HIDDEN, INTER)) == 397332
    # Counter: 2 layers x 16 experts x 8 B + 2 x 2 x 8 B; masks 64 x (1 + 4) B + 1 B + 8 B.
    assert extra["counter_bytes"] == 2 * 16 * 8 + 2 * 2 * 8 + StepMasks.bytes_for(64) == 617


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q", "-rs", "-s"] + sys.argv[1:]))
