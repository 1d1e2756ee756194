"""The plugin's entry on stand-in layers, without vLLM: shared by the CPU graph-safety tests, the
H200 tests (tests/gpu/test_plugin_entry_graph_gpu.py) and bench/plugin_gpu.py.

``StandInRoutedExperts`` has exactly the parameters vLLM 0.33's ``RoutedExperts`` gets from
``Mxfp4MoEMethod.create_weights`` (names, shapes, dtypes; pinned by
tests/test_vllm_plugin_mxfp4_contracts.py) in the checkpoint layout the plugin keeps, the
attributes the worker runtime reads, and ``ResidencyForward`` first in its bases — as
``ResidencyRoutedExperts(ResidencyForward, RoutedExperts)`` — so ``layer.forward_modular`` is the
very method vLLM's ``MoERunner`` calls. Its base's ``forward_modular`` stands for vLLM's own
kernel (count mode serves through it): it returns zeros.

``step_context`` builds what vLLM hands ``create_forward_context`` for a step: per-layer attention
metadata with ``query_start_loc`` and ``num_actual_tokens``, and ``is_padding`` (a bool row per
padded token), as vLLM 0.33's model runners do (tests/test_vllm_plugin_graphsafe_contracts.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import Enum
from types import SimpleNamespace
from typing import Any

import torch
from expert_residency.formats import RowMap
from expert_residency.vllm_plugin.forward import ResidencyForward
from expert_residency.vllm_plugin.settings import PluginSettings
from expert_residency.vllm_plugin.worker_runtime import WorkerRuntime

NAMES = ("w13_weight", "w13_weight_scale", "w2_weight", "w2_weight_scale")


class _Silu(Enum):
    SILU = "silu"


class _VllmKernelSide(torch.nn.Module):
    """What sits after ``ResidencyForward`` in the MRO: vLLM's ``RoutedExperts``."""

    def forward_modular(self, x: torch.Tensor, topk_weights: torch.Tensor, topk_ids: torch.Tensor,
                        shared_experts: Any = None, shared_experts_input: Any = None
                        ) -> torch.Tensor:
        return torch.zeros_like(x)


class StandInRoutedExperts(ResidencyForward, _VllmKernelSide):
    def __init__(self, index: int, tensors: dict[str, torch.Tensor], top_k: int,
                 max_num_tokens: int, swiglu_limit: float | None = None) -> None:
        super().__init__()
        for name in NAMES:
            self.register_parameter(name, torch.nn.Parameter(tensors[name], requires_grad=False))
        experts = int(tensors["w13_weight"].shape[0])
        self.layer_name = f"model.layers.{index}.mlp.experts"
        self.local_num_experts = self.global_num_experts = experts
        self.top_k = top_k
        self.activation = _Silu.SILU
        self.swiglu_limit = swiglu_limit
        self.apply_router_weight_on_input = False
        self.moe_config = SimpleNamespace(max_num_tokens=max_num_tokens, swiglu_alpha=None,
                                          swiglu_beta=None, use_deferred_moe_finalize=False)
        self.quant_method = SimpleNamespace(moe_kernel=None, is_monolithic=False)
        self._er_layer_index = index
        self._er_mxfp4 = True      # as hold_back_conversion marks a target layer
        self._er_counted = False
        self._er_excluded = False
        self._er_resident = None


def rowmap_for(layers: Sequence[int], experts: int, hot: dict[int, list[int]]) -> RowMap:
    return RowMap(tuple(layers), experts, [sorted(hot[i]) for i in layers],
                  [[e for e in range(experts) if e not in set(hot[i])] for i in layers],
                  provenance={"source": "test"})


def plugin_runtime(tensors: dict[int, dict[str, torch.Tensor]], mode: str, *, top_k: int,
                   max_num_tokens: int, hot: dict[int, list[int]] | None = None,
                   count: bool = False, swiglu_limit: float | None = None
                   ) -> tuple[WorkerRuntime, dict[int, StandInRoutedExperts]]:
    """A worker runtime after load, as ``after_model_loaded`` leaves it: counter (``count`` or
    count mode) and banks (split modes) installed on stand-in layers built from ``tensors``
    (consumed: residency re-homes them)."""
    experts = int(next(iter(tensors.values()))["w13_weight"].shape[0])
    rowmap = rowmap_for(sorted(tensors), experts, hot) if hot is not None else None
    settings = PluginSettings(mode=mode, rowmap_path="test.rowmap" if rowmap else None,
                              content_hash=rowmap.content_hash() if rowmap else None)
    runtime = WorkerRuntime(settings, rowmap)
    layers = {}
    for i in sorted(tensors):
        # Popped: the layers' parameters must hold the last reference, so that re-homing frees
        # each original as it is copied (as in vLLM, where the module owns its weights).
        layers[i] = StandInRoutedExperts(i, tensors.pop(i), top_k, max_num_tokens, swiglu_limit)
    if mode == "count":
        for layer in layers.values():
            layer._er_mxfp4 = False  # count mode leaves vLLM's conversion alone
    runtime.target_layers = dict(sorted(layers.items()))
    if count or mode == "count":
        runtime._start_counter()
    if settings.splits_experts:
        runtime._install_banks()
    return runtime, layers


def step_context(rows: int, lengths: Sequence[int], device: torch.device | str) -> SimpleNamespace:
    """A forward context for a step of ``rows`` (padded) rows holding requests of ``lengths`` new
    tokens each (then padding), as vLLM 0.33 builds it."""
    starts = [0]
    for n in lengths:
        starts.append(starts[-1] + int(n))
    actual = starts[-1]
    assert actual <= rows
    query_start_loc = torch.tensor(starts, dtype=torch.int32, device=device)
    is_padding = torch.arange(rows, device=device) >= actual
    meta = SimpleNamespace(query_start_loc=query_start_loc, num_actual_tokens=actual)
    return SimpleNamespace(attn_metadata={"model.layers.0.self_attn.attn": meta},
                           is_padding=is_padding,
                           batch_descriptor=SimpleNamespace(num_tokens=rows))


def recount(ids: torch.Tensor, lengths: Sequence[int], experts: int) -> tuple[list[int], int, int]:
    """(counts per expert, real tokens, decode tokens) of one layer's step, by hand: only the
    first sum(lengths) rows are real; a decode token is the one token of a length-1 request."""
    actual = sum(lengths)
    counts = [0] * experts
    for row in ids[:actual].tolist():
        for e in row:
            counts[int(e)] += 1
    return counts, actual, sum(1 for n in lengths if n == 1)
