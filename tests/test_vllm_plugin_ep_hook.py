"""The worker runtime under expert parallelism, through its own entry points (``register_layer``,
``_install_banks``, ``split_forward``): each EP rank re-homes only its local experts with the lane's
row map sliced through the layer's expert map, serves the router's global ids, and equals its
unsplit local layer bit for bit; the ranks' sum (vLLM's runner all-reduces it) is within the rounding
bound of one rank holding every expert. Stand-in layers are laid out like vLLM 0.33's RoutedExperts
(``tests/test_vllm_plugin_expert_parallel.py`` builds their expert maps with vLLM's own
``determine_expert_map``)."""

from __future__ import annotations

import types

import pytest

torch = pytest.importorskip("torch", reason="the plugin's runtime needs torch")

import test_vllm_plugin_expert_parallel as ep_layers  # noqa: E402
from expert_residency.core.banks import build_unsplit_layer  # noqa: E402
from expert_residency.core.split import residency_forward  # noqa: E402
from expert_residency.formats.rowmap import RowMap  # noqa: E402
from expert_residency.vllm_plugin import worker_runtime  # noqa: E402
from expert_residency.vllm_plugin.refusal import ResidencyRefused  # noqa: E402
from expert_residency.vllm_plugin.settings import MODE_RESIDENCY  # noqa: E402

LAYER = 3


def _settings() -> types.SimpleNamespace:
    return types.SimpleNamespace(mode=MODE_RESIDENCY, splits_experts=True, rowmap_path="x",
                                 dump_dir=None, per_pick="auto")


def _runtime(layer, rowmap: RowMap, fn, monkeypatch) -> worker_runtime.WorkerRuntime:
    monkeypatch.setattr(worker_runtime, "_capability_reason", lambda module, mxfp4: None)
    monkeypatch.setattr(worker_runtime, "_per_pick_fn", lambda module, cfg: (fn, "torch-ref"))
    runtime = worker_runtime.WorkerRuntime(_settings(), rowmap)
    runtime.register_layer(layer)
    runtime.target_layers = {LAYER: layer}
    runtime._mxfp4_layers = lambda: {}
    return runtime


@pytest.mark.parametrize(("fmt", "hidden", "inter"),
                         [("bf16", 64, 128), ("mxfp4", 64, 128), ("fp8", 256, 256)])
def test_ep_ranks_through_the_worker_runtime(fmt: str, hidden: int, inter: int, monkeypatch) -> None:
    monkeypatch.delenv("EXPERT_RESIDENCY_ADAPTIVE", raising=False)
    full, fn = ep_layers._experts(fmt, 8, hidden, inter)
    x, w, ids = ep_layers._routing(6, 8, 2, hidden)
    rowmap = RowMap((LAYER,), 8, [ep_layers.HOT], [ep_layers.COLD], {})
    outs = []
    for rank in range(2):
        layer = ep_layers.StandInRoutedExperts(full, 2, rank)
        layer.moe_config.moe_parallel_config.enable_eplb = False
        layer.apply_router_weight_on_input = False
        local_before = {n: p.data.clone() for n, p in layer.named_parameters(recurse=False)}
        runtime = _runtime(layer, rowmap, fn, monkeypatch)
        runtime._install_banks()
        resident = layer._er_resident
        # linear placement: rank r holds global experts 4r..4r+3 in local slots 0..3
        local = range(4 * rank, 4 * rank + 4)
        assert resident.num_experts == 4
        want_hot = [g - 4 * rank for g in ep_layers.HOT if g in local]
        assert list(resident.hot_ids) == want_hot
        y = runtime.split_forward(layer, x, w, ids)
        lids, lw = ep_layers.local_picks(layer._er_expert_map, ids, w)
        unsplit = build_unsplit_layer(local_before, layer_index=LAYER)
        assert torch.equal(y, residency_forward(unsplit, x, lw, lids, fn, pick_dtype=x.dtype,
                                                out_dtype=x.dtype))
        outs.append(y)
    one = residency_forward(build_unsplit_layer(full, layer_index=LAYER), x, w, ids, fn,
                            pick_dtype=x.dtype, out_dtype=x.dtype)
    # each rank's output and the bf16 sum round once each: 2^-8 relative per rounded term
    bound = 2.0 ** -8 * (sum(y.float().abs() for y in outs) * 2 + one.float().abs()) + 1e-30
    assert bool((((outs[0] + outs[1]).float() - one.float()).abs() <= bound).all())


def test_ep_refusals_through_register_layer(monkeypatch) -> None:
    full, fn = ep_layers._experts("bf16")
    rowmap = RowMap((LAYER,), 8, [ep_layers.HOT], [ep_layers.COLD], {})
    monkeypatch.delenv("EXPERT_RESIDENCY_ADAPTIVE", raising=False)
    with pytest.raises(ResidencyRefused, match="data/context/sequence parallel"):
        _runtime(ep_layers.StandInRoutedExperts(full, 2, 0, all2all_kernels=True), rowmap, fn,
                 monkeypatch)
    monkeypatch.setenv("EXPERT_RESIDENCY_ADAPTIVE", "on")
    with pytest.raises(ResidencyRefused, match="adaptive residency .* expert parallelism"):
        _runtime(ep_layers.StandInRoutedExperts(full, 2, 0), rowmap, fn, monkeypatch)
