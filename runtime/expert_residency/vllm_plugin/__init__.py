"""vLLM plugin of the expert residency runtime (the part of ``runtime/`` that imports vllm; outside it
only ``blackwell.layout.convert_with_vllm`` and ``blackwell.trtllm.vllm_mxfp8_quantize`` do).

Entry point ``vllm.general_plugins: expert_residency = expert_residency.vllm_plugin:register``,
declared in ``runtime/expert_residency-0.1.0.dist-info/entry_points.txt`` so that
``importlib.metadata`` finds it when ``runtime/`` is on ``PYTHONPATH`` (the container mounts the
directory; nothing is pip-installed). vLLM calls ``register()`` in every process (API server,
engine core, each worker); it is idempotent and does nothing unless ``EXPERT_RESIDENCY_MODE`` is
set to something other than ``off`` (see ``settings``).

When active, ``register()``:

1. refuses a bad environment value (``settings``: every variable, ``EXPERT_RESIDENCY_ADAPTIVE``
   included), unsupported vLLM versions, a dump folder that cannot be used, a missing, unreadable
   or folder row map and a ``content_hash`` mismatch — in the API server process, before any
   engine process starts (``preboot_checks``);
2. swaps vLLM's expert container for ``ResidencyRoutedExperts`` (``RoutedExperts.register_oot``)
   and hooks the model loader's return (``loader_hook``), where the worker runtime re-homes the
   experts or starts counting, before KV-cache sizing.
"""

from __future__ import annotations

import os

from .refusal import REFUSAL_EXIT_CODE, REFUSAL_TAG, ResidencyRefused, refuse
from .settings import PluginSettings, SettingsError, load_settings

__all__ = ["register", "preboot_checks", "REFUSAL_TAG", "REFUSAL_EXIT_CODE", "ResidencyRefused", "PluginSettings",
           "load_settings"]

_registered_pid: int | None = None


def register() -> None:
    """The ``vllm.general_plugins`` entry point."""
    global _registered_pid
    if _registered_pid == os.getpid():
        return
    try:
        settings = load_settings()
    except SettingsError as exc:
        refuse(str(exc), exit_process=True)
    if not settings.active:
        _registered_pid = os.getpid()
        return
    from .version import installed_vllm_version, unsupported_version_reason

    reason = unsupported_version_reason(installed_vllm_version())
    if reason is not None:
        refuse(reason, exit_process=True)
    rowmap = preboot_checks(settings)

    from vllm.model_executor.custom_op import op_registry_oot
    from vllm.model_executor.layers.fused_moe.routed_experts import RoutedExperts

    from .loader_hook import install_loader_hook
    from .routed_experts import ResidencyRoutedExperts
    from .worker_runtime import WorkerRuntime, set_runtime

    set_runtime(WorkerRuntime(settings, rowmap))
    if op_registry_oot.get(RoutedExperts.__name__) is not ResidencyRoutedExperts:
        RoutedExperts.register_oot(ResidencyRoutedExperts)
    from .gptoss_routed_experts import register_model_routed_experts  # gpt-oss's own subclass

    register_model_routed_experts()
    install_loader_hook()
    _registered_pid = os.getpid()


def preboot_checks(settings: PluginSettings):  # -> RowMap | None
    """The checks ``register()`` runs on the files the environment names, after the version gate
    and before vLLM is touched (API server first): the dump folder, then the row map (returned,
    None without one). A refusal exits with status 3."""
    _check_dump_dir(settings)
    return _load_rowmap(settings)


def _check_dump_dir(settings: PluginSettings) -> None:
    if settings.dump_dir is None:
        return
    from ..core.dump import check_dump_folder

    try:
        check_dump_folder(settings.dump_dir)
    except ValueError as exc:
        refuse(str(exc), exit_process=True)


def _load_rowmap(settings: PluginSettings):  # -> RowMap | None
    if settings.rowmap_path is None:
        return None
    from ..formats import FormatError, load_rowmap

    path = settings.rowmap_path
    if os.path.isdir(path):
        refuse(f"row map {path} (EXPERT_RESIDENCY_ROWMAP) is a folder, not a row map file: set "
               "EXPERT_RESIDENCY_ROWMAP to the .rowmap file itself (a bind mount of a host file "
               "that does not exist is created as an empty folder)", exit_process=True)
    if not os.path.isfile(path):
        refuse(f"row map {path} (EXPERT_RESIDENCY_ROWMAP) does not exist", exit_process=True)
    try:
        rowmap = load_rowmap(path)
    except (FormatError, OSError) as exc:
        refuse(f"row map {path} is unreadable: {exc}", exit_process=True)
    if settings.content_hash is not None:
        actual = rowmap.content_hash()
        if actual != settings.content_hash:
            refuse(f"row map {path} has content_hash {actual[:16]}…, the recipe expects "
                   f"{settings.content_hash[:16]}… (EXPERT_RESIDENCY_CONTENT_HASH): the file changed "
                   "since rendering; re-render or restore the map", exit_process=True)
    return rowmap
