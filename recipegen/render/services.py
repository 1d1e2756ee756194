"""Build the compose services of a recipe: one `lane-<lane>` per lane plus its profile boot.

Reads the validated recipe (and the ledger's figures passed in), decides every flag, env var,
mount and label, and returns `ServiceSpec`s (`render.compose.lane_service` lays them out as
data). Paths in the specs are relative to the output folder.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

from expert_residency.contract import env as runtime_env
from expert_residency.contract.metrics import MULTIPROC_DIR_ENV

from recipegen.ledger.flags import max_num_seqs, rendered_flag_problems
from recipegen.multinode.launch import host_table_args, launch_flags
from recipegen.render.compose import PROFILE_COMPOSE_PROFILE, HealthCheck, Interpolated, Mount, ServiceSpec
from recipegen.render.lanes import lane_service_name, profile_service_name, runs_residency
from recipegen.render.monitoring import lane_metrics
from recipegen.schema.patterns import is_hf_repo_id
from recipegen.vllm_flags import FlagTable, argv_problems
from recipegen.vllm_flags.args import parse_args
from recipegen.vllm_flags.moe_backend import (
    START_PERIOD_AUTOTUNED,
    BackendChoice,
    NoBackend,
    choose,
    choose_or_auto,
    start_period,
)

if TYPE_CHECKING:
    from expert_residency.formats import RowMap

    from recipegen.load.recipe import LoadedRecipe
    from recipegen.schema import Recipe
    from recipegen.schema.lane import Lane, Speculative

# --- where things live inside the container --------------------------------------------------
RUNTIME_TARGET = "/opt/expert-residency"
ROWMAP_TARGET_DIR = "/etc/expert-residency"
DUMP_TARGET = "/var/lib/expert-residency/dumps"
CACHE_TARGET = "/cache"
MODELS_TARGET = "/models"
HF_HUB_TARGET = "/root/.cache/huggingface/hub"

# --- the runtime's activation contract (runtime/expert_residency/vllm_plugin/settings.py) -----
WORKER_EXTENSION_CLS = "expert_residency.vllm_plugin.worker_ext.ResidencyWorkerExtension"
DEFAULT_PLUGIN_ENTRY_POINT = "expert_residency"
# Histogram snapshots: the profile boot wants fine-grained counts; a live lane only feeds drift.
DUMP_INTERVAL_PROFILE_S = 60
DUMP_INTERVAL_LANE_S = 600

# --- container defaults ------------------------------------------------------------------------
SHM_SIZE = "16gb"
# Health start period: by the lane's MoE backend (recipegen.vllm_flags.moe_backend.start_period).
SECRETS_ENV_FILE = "secrets.env"
PROFILE_BOOT_FLAGS: tuple[tuple[str, ...], ...] = (
    ("--enforce-eager",), ("--no-enable-prefix-caching",), ("--shutdown-timeout", "10"))
PROFILE_STOP_GRACE_PERIOD = "20s"  # > --shutdown-timeout: compose waits for the final snapshot

LABEL_PREFIX = "io.recipegen."

def read_mounted(path: Path) -> bytes:
    """A row map or histogram the rendering mounts, read only as a regular file of bounded size
    (a FIFO or device put in its place since the recipe was checked raises, never hangs)."""
    from expert_residency.formats._io import read_regular_file
    from expert_residency.formats._records import MAX_RECORD_BYTES

    return read_regular_file(path, limit=MAX_RECORD_BYTES)


# Env keys recipegen sets itself; a lane's `env:` may not override them.
_MANAGED_ENV_PREFIXES = (runtime_env.PREFIX,)
_MANAGED_ENV_KEYS = {"PYTHONPATH", "VLLM_PLUGINS", "VLLM_CACHE_ROOT", "VLLM_ENABLE_STARTUP_PLAN",
                     "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR", "HF_HUB_OFFLINE", MULTIPROC_DIR_ENV}


@dataclass(frozen=True)
class LaneMemory:
    """How a lane's KV pool is sized on the command line (decided with the ledger)."""

    gpu_memory_utilization: float | None = None
    kv_cache_memory_bytes: int | None = None


@dataclass(frozen=True)
class RenderInputs:
    """What the service builder needs besides the recipe: paths and ledger-derived figures."""

    out_dir: Path                      # compose/<recipe>[/<machine>]
    runtime_dir: Path                  # the runtime/ folder that gets mounted
    plugin_entry_point: str            # name in VLLM_PLUGINS
    runtime_version: str               # runtime dist-info version: a bump recreates the services
    memory: dict[str, LaneMemory]      # lane name -> KV sizing
    flag_table: FlagTable


def relative_posix(target: Path, start: Path) -> str:
    """`target` relative to `start`, with forward slashes (committed output is OS-independent)."""
    # abspath, not resolve: a symlinked runtime/ keeps its place in the project layout.
    relative = os.path.relpath(os.path.abspath(target), os.path.abspath(start))
    return PurePosixPath(*Path(relative).parts).as_posix()


def rowmap_file_name(lane: str, cls: str) -> str:
    return f"maps/{lane}/{cls}.rowmap"


def format_gib(num_bytes: int) -> str:
    """Bytes as the GiB figure vLLM's --cpu-offload-gb reads (it multiplies by 2^30)."""
    value = num_bytes / 2**30
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    return text or "0"


def _moe_backend(loaded: LoadedRecipe, index: int, recipe: Recipe, stage: Stage, mode: str
                 ) -> BackendChoice:
    """`--moe-backend` by the stage's GPU and the expert format (recipegen.vllm_flags.moe_backend); a
    residency lane no backend admits is refused (check budgets says the same)."""
    gpus = recipe.machines[stage.machine].gpus
    if mode == "residency":
        try:
            return choose(recipe.model.expert_format, gpus.compute_capability, gpus.kind)
        except NoBackend as exc:
            raise loaded.error(str(exc), ("lanes", index, "machine")) from None
    return choose_or_auto(recipe.model.expert_format, gpus.compute_capability, gpus.kind)


def healthcheck_for(port: int, start_period: str = START_PERIOD_AUTOTUNED) -> HealthCheck:
    """A probe the vLLM image can run: python3 is there, curl is not guaranteed."""
    probe = ("import sys, urllib.request; "
             f"sys.exit(0 if urllib.request.urlopen('http://127.0.0.1:{port}/health', "
             "timeout=5).status == 200 else 1)")
    return HealthCheck(test=("CMD", "python3", "-c", probe), start_period=start_period)


def speculative_json(spec: Speculative) -> str:
    """`--speculative-config`: a plain `num_speculative_tokens` when k is constant (the safe
    default); the per-batch-size schedule only when the recipe declares one."""
    config: dict[str, object] = {"method": spec.method, "num_speculative_tokens": spec.k}
    if spec.model:
        config["model"] = spec.model
    if spec.schedule:
        config["num_speculative_tokens_per_batch_size"] = [list(r) for r in spec.schedule]
    return json.dumps(config, separators=(", ", ": "))


HF_HUB_SOURCE = "${HF_HUB_CACHE:-~/.cache/huggingface/hub}"
"""The host folder a repo-id checkpoint is mounted from (Compose interpolates it)."""


def hub_repo_id(recipe: Recipe) -> str | None:
    """The model's checkpoint when the rendering reads it as a Hugging Face repo id (mounted from
    the hub cache, offline), else None (an absolute path, or the models folder)."""
    checkpoint = recipe.model.checkpoint
    if checkpoint and not checkpoint.startswith("/") and is_hf_repo_id(checkpoint):
        return checkpoint
    return None


def hub_checkpoint_note(recipe: Recipe) -> str | None:
    """One line for `recipegen render` and `recipegen check recipe` when the checkpoint is read as a
    repo id: `checkpoints/x` is that shape too, and a local folder so written would not be mounted."""
    repo_id = hub_repo_id(recipe)
    if repo_id is None:
        return None
    return (f"model.checkpoint {repo_id} is read as a Hugging Face repo id (mounted from the hub cache, "
            f"{HF_HUB_SOURCE}, with HF_HUB_OFFLINE=1: download it there first); a local checkpoint needs "
            "an absolute path")


def _model_source(recipe: Recipe) -> tuple[str, Mount, tuple[tuple[str, str], ...]]:
    """`--model` value, the read-only model mount, and env it needs.

    - `checkpoint` is a Hugging Face repo id: the host's HF hub cache, read-only, offline.
    - `checkpoint` is an absolute host path: that folder, read-only, under /models/<name>.
    - no checkpoint: `${RECIPEGEN_MODELS_DIR:-/srv/models}/<model name>` under /models/<name>.
    """
    model = recipe.model
    checkpoint = model.checkpoint
    target = f"{MODELS_TARGET}/{model.name}"
    if checkpoint and hub_repo_id(recipe) == checkpoint:
        mount = Mount("bind", Interpolated(HF_HUB_SOURCE), HF_HUB_TARGET, True)
        return checkpoint, mount, (("HF_HUB_OFFLINE", "1"),)
    # A checkpoint path is the recipe's text: its `$` stay literal. The default is recipegen's
    # own interpolation (the host's models folder from `.env` or the shell).
    source = checkpoint if checkpoint else Interpolated(
        f"${{RECIPEGEN_MODELS_DIR:-/srv/models}}/{model.name}")
    return target, Mount("bind", source, target, True), ()


def _shape_key(rowmap: RowMap | None) -> str:
    return rowmap.shape_hash()[:16] if rowmap is not None else "unsplit"


@dataclass(frozen=True)
class Stage:
    """Where one engine process of a lane runs: a whole single-node lane, or one pipeline stage
    of a multi-node lane (rank 0 is the head that serves the API; the others run headless)."""

    rank: int
    machine: str
    gpus: tuple[int, ...]
    all_experts_in_hbm: bool = False
    pipeline_size: int = 1

    @property
    def multi_node(self) -> bool:
        return self.pipeline_size > 1

    def service_name(self, lane: str) -> str:
        return lane_service_name(lane, self.rank)

    def profile_service_name(self, lane: str) -> str:
        return profile_service_name(lane, self.rank)


def lane_stages(lane: Lane) -> list[Stage]:
    parallel = getattr(lane, "parallel", None)
    if parallel is None:
        return [Stage(0, lane.machine, tuple(lane.gpus))]
    return [Stage(rank, stage.machine, tuple(stage.gpus), stage.all_experts_in_hbm,
                  len(parallel.pipeline))
            for rank, stage in enumerate(parallel.pipeline)]


def recipe_machines(recipe: Recipe) -> list[str]:
    """Machines that run at least one engine of the recipe."""
    return sorted({stage.machine for lane in recipe.lanes for stage in lane_stages(lane)})


def build_services(loaded: LoadedRecipe, machine: str,
                   inputs: RenderInputs) -> tuple[list[ServiceSpec], list[str], dict[str, bytes]]:
    """Services of `machine` (its lanes' engines in recipe order, each followed by its profile
    boot), named volumes, and the extra files to write into the output folder (row maps)."""
    recipe = loaded.recipe
    refuse_service_collisions(loaded)
    engines = [(i, lane, stage) for i, lane in enumerate(recipe.lanes)
               for stage in lane_stages(lane) if stage.machine == machine]
    services: list[ServiceSpec] = []
    volumes: list[str] = []
    files: dict[str, bytes] = {}
    for position, (index, lane, stage) in enumerate(engines):
        previous_sharing = [(other, st) for _, other, st in engines[:position]
                            if set(st.gpus) & set(stage.gpus)]
        # Engines sharing a GPU start one after another: each sizes its KV pool while the
        # previous one is already resident (their pools are then fixed bytes, see LaneMemory).
        before = previous_sharing[-1] if previous_sharing else None
        # One persistent cache volume per lane (vLLM, Triton, inductor, FlashInfer autotune),
        # shared with its profile boot: same kernel shapes, so the tuning is paid once.
        volume = f"{lane.name}-cache"
        volumes.append(volume)
        spec, lane_files = _service(loaded, index, lane, stage, inputs, volume, before,
                                    profile=False)
        profile_spec, _ = _service(loaded, index, lane, stage, inputs, volume, before,
                                   profile=True)
        services += [spec, profile_spec]
        files.update(lane_files)
    return services, volumes, files


def refuse_service_collisions(loaded: LoadedRecipe) -> None:
    """Refuse, at the later lane's name, two lanes whose compose services would share a name:
    lane `a`'s profile boot is `lane-a-profile`, which is also lane `a-profile`'s engine (a
    compose file holds each service once; the second would silently replace the first)."""
    owners: dict[str, str] = {}
    for index, lane in enumerate(loaded.recipe.lanes):
        for stage in lane_stages(lane):
            for name in (stage.service_name(lane.name), stage.profile_service_name(lane.name)):
                other = owners.setdefault(name, lane.name)
                if other != lane.name:
                    raise loaded.error(f"lane {lane.name!r} would render a compose service named "
                                       f"{name}, which lane {other!r} renders already; rename one "
                                       "of the two lanes", ("lanes", index, "name"))


def _multi_node_launch(loaded: LoadedRecipe, lane: Lane, stage: Stage):  # -> NodeLaunch
    """The stage's node launch from `recipegen.multinode.launch` (the one owner of vLLM's
    multi-node flags and env: --nnodes/--node-rank/--master-addr/--master-port, --headless on
    ranks >= 1, VLLM_HOST_IP, VLLM_PP_LAYER_PARTITION) and its layers."""
    from recipegen.multinode.launch import lane_launches

    return lane_launches(loaded.recipe, lane)[stage.rank]


def _service(loaded: LoadedRecipe, index: int, lane: Lane, stage: Stage, inputs: RenderInputs,
             cache_volume: str, before: tuple[Lane, Stage] | None, *,
             profile: bool) -> tuple[ServiceSpec, dict[str, bytes]]:
    recipe = loaded.recipe
    launch = _multi_node_launch(loaded, lane, stage) if stage.multi_node else None
    mode = "count" if profile else ("residency" if runs_residency(loaded, lane, stage.rank) else "off")
    runtime_on = mode != "off"
    cls = lane.active_class if mode == "residency" else None
    rowmap = loaded.rowmaps.get((lane.name, cls)) if cls is not None else None
    if mode == "residency" and rowmap is None:
        raise loaded.error(f"no row map loaded for the active class {cls!r} of lane "
                           f"{lane.name!r}", ("lanes", index, "active_class"))
    map_bytes: bytes | None = None
    map_file = rowmap_file_name(lane.name, cls) if cls is not None else ""
    if rowmap is not None and cls is not None:
        map_bytes = read_mounted(loaded.resolve(lane.classes[cls].rowmap))
        if launch is not None:
            # Each pipeline stage builds only its own MoE layers, and the runtime refuses a map
            # that does not cover exactly those: mount the stage's slice (its own hashes).
            from recipegen.multinode.slices import slice_text

            rowmap, map_bytes = slice_text(rowmap, list(launch.layers.moe_layers), stage=stage.rank,
                                           source=lane.classes[cls].rowmap)
            map_file = f"maps/{lane.name}/{cls}.stage{stage.rank}.rowmap"

    model_arg, model_mount, model_env = _model_source(recipe)
    memory = inputs.memory[lane.name]
    argv: list[str] = ["--model", model_arg]
    # --revision selects a commit of a Hugging Face repo; a local folder is one revision already
    # (the model's revision still goes into the labels and the row maps' provenance).
    if recipe.model.revision and not model_arg.startswith("/"):
        argv += ["--revision", recipe.model.revision]
    argv += ["--served-model-name", recipe.model.name,
             "--host", "0.0.0.0", "--port", str(lane.port),
             "--tensor-parallel-size", str(len(stage.gpus)),
             "--max-model-len", str(lane.max_model_len)]
    if launch is not None:
        argv += [*launch.args, *host_table_args(lane.parallel)]
    extra = parse_args(list(lane.extra_args), inputs.flag_table)  # as vLLM reads them
    if extra.problems:  # the recipe loader refuses these first; never render past one
        at, message = extra.problems[0]
        raise loaded.error(message, ("lanes", index, "extra_args", at))
    seqs, in_extra_args = max_num_seqs(lane.extra_args, lane.concurrency.max)
    if not in_extra_args:
        argv += ["--max-num-seqs", str(seqs)]
    if memory.kv_cache_memory_bytes is not None:
        argv += ["--kv-cache-memory-bytes", str(memory.kv_cache_memory_bytes)]
    else:
        assert memory.gpu_memory_utilization is not None
        argv += ["--gpu-memory-utilization", repr(memory.gpu_memory_utilization)]
    if lane.offload.load_cpu_offload and not stage.all_experts_in_hbm:
        argv += ["--cpu-offload-gb", format_gib(lane.offload.load_cpu_offload)]
    backend = _moe_backend(loaded, index, recipe, stage, mode)
    if runtime_on and backend.moe_backend and "--moe-backend" not in extra.given:
        argv += ["--moe-backend", backend.moe_backend]
    if lane.speculative is not None:
        argv += ["--speculative-config", speculative_json(lane.speculative)]
    if runtime_on:
        argv += ["--worker-extension-cls", WORKER_EXTENSION_CLS]
    # The loader refuses these first (`recipegen.load.checks.extra_args_problems`), by the same
    # rule: the fixed set plus the multi-node launch's flags (`launch_flags`, read by both); what
    # this render wrote is added so that nothing it writes can ever be repeated.
    rendered = {**dict.fromkeys(canonical_flags(argv, inputs.flag_table), ""), **launch_flags(lane.parallel)}
    repeated = rendered_flag_problems(lane.extra_args, rendered)
    if repeated:
        at, message = repeated[0]
        raise loaded.error(message, ("lanes", index, "extra_args", at))
    own = list(argv)
    argv += list(lane.extra_args)
    if profile:
        # Exact counts: eager keeps the count on the path verified inside an engine (the counting
        # is graph-safe, docs/render.md says why eager stays), and a prefix-cache hit would skip
        # routing for the cached tokens; the shutdown timeout lets the worker write
        # its final snapshot (vLLM kills workers at once otherwise). Last, so that the lane's
        # extra_args (e.g. --enable-prefix-caching) cannot undo them: argparse keeps the last.
        for flag in PROFILE_BOOT_FLAGS:
            argv += list(flag)
    # The render's own flags in their canonical spellings only (a typo in the renderer); extra_args
    # were read above as vLLM reads them (`--max_num_seqs` is --max-num-seqs), in their own spelling.
    problems = argv_problems(own + argv[len(own) + len(lane.extra_args):], inputs.flag_table)
    if problems:
        raise loaded.error("the rendered `vllm serve` command is not valid for vLLM "
                           f"{inputs.flag_table.vllm_version}: " + "; ".join(problems),
                           ("lanes", index, "extra_args"))

    name = stage.profile_service_name(lane.name) if profile else stage.service_name(lane.name)
    out_dir = inputs.out_dir
    mounts: list[Mount] = [model_mount, Mount("volume", cache_volume, CACHE_TARGET, False)]
    env: dict[str, str] = {
        "VLLM_CACHE_ROOT": f"{CACHE_TARGET}/vllm",
        # Autotuned kernels are keyed on the bank shapes: maps with one shape_hash reuse them
        # (the field reports' "hash-hit reboot"); a new shape tunes into its own folder.
        "VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR": f"{CACHE_TARGET}/flashinfer-autotune/{_shape_key(rowmap)}",
        "TRITON_CACHE_DIR": f"{CACHE_TARGET}/triton",
        "TORCHINDUCTOR_CACHE_DIR": f"{CACHE_TARGET}/inductor",
        "XDG_CACHE_HOME": f"{CACHE_TARGET}/xdg",
        # vLLM's start-up plan caches the KV size keyed on the vLLM config, which does not see
        # the row map; a new map changes the HBM the experts take, so never reuse a plan.
        "VLLM_ENABLE_STARTUP_PLAN": "0",
        **dict(model_env),
    }
    if launch is not None:
        env.update(dict(launch.env))  # its own address, the pinned layer split
    files: dict[str, bytes] = {}
    labels: dict[str, str] = {
        "recipe": recipe.name, "lane": lane.name, "mode": mode,
        "model": recipe.model.name, "model-revision": recipe.model.revision or "",
        "class": cls or "", "content-hash": rowmap.content_hash() if rowmap else "",
        "shape-hash": rowmap.shape_hash() if rowmap else "",
    }
    if stage.multi_node:
        labels["node-rank"] = str(stage.rank)
    if runtime_on:
        # The runtime's code is mounted, not rendered: its version is part of the service's
        # definition (and so of the config hash), its individual files are not.
        labels["runtime-version"] = inputs.runtime_version
        mounts.append(Mount("bind", relative_posix(inputs.runtime_dir, out_dir), RUNTIME_TARGET, True))
        dump_source = f"dumps/{lane.name}"
        mounts.append(Mount("bind", dump_source, DUMP_TARGET, False, create_host_path=True))
        env.update({
            "PYTHONPATH": RUNTIME_TARGET,
            "VLLM_PLUGINS": inputs.plugin_entry_point,
            runtime_env.MODE: mode,
            runtime_env.LANE: lane.name,
            runtime_env.DUMP_DIR: DUMP_TARGET,
            runtime_env.DUMP_INTERVAL_S: str(DUMP_INTERVAL_PROFILE_S if profile else DUMP_INTERVAL_LANE_S),
        })
    if rowmap is not None and cls is not None and map_bytes is not None:
        files[map_file] = map_bytes
        target = f"{ROWMAP_TARGET_DIR}/{lane.name}-{cls}.rowmap"
        mounts.append(Mount("bind", map_file, target, True))
        env.update({runtime_env.ROWMAP: target,
                    runtime_env.CONTENT_HASH: rowmap.content_hash(),
                    runtime_env.CLASS: cls})
        if lane.offload.adaptive is not None:
            adaptive_env, adaptive_mounts, adaptive_files = _adaptive(loaded, index, lane)
            env.update(adaptive_env)
            mounts.extend(adaptive_mounts)
            files.update(adaptive_files)
    tmpfs: tuple[str, ...] = ()
    if mode == "residency":
        metrics = lane_metrics(loaded, lane)  # the recipe's `monitoring`: the lane's own /metrics
        if metrics is not None:
            env.update(metrics.environment)
            tmpfs = metrics.tmpfs
    for key in lane.env:
        if key in _MANAGED_ENV_KEYS or key.startswith(_MANAGED_ENV_PREFIXES) or key in env:
            raise loaded.error(f"{key} is set by recipegen render; remove it from env",
                               ("lanes", index, "env", key))
    env.update(lane.env)

    profiles: tuple[str, ...] = ()
    if profile:
        profiles = (PROFILE_COMPOSE_PROFILE,)
    elif lane.profile:
        profiles = (lane.profile,)
    depends_on: tuple[tuple[str, bool], ...] = ()
    if before is not None:
        # Not required when the earlier engine sits behind a profile this service lacks.
        before_lane, before_stage = before
        required = before_lane.profile is None or before_lane.profile in profiles
        depends_on = ((before_stage.service_name(before_lane.name), required),)
    # Only the head serves HTTP; headless workers have no /health to probe.
    serves_api = stage.rank == 0
    spec = ServiceSpec(
        name=name,
        image=lane.image,
        command=tuple(argv),
        environment=tuple(sorted(env.items())),
        mounts=tuple(mounts),
        device_ids=tuple(str(g) for g in stage.gpus),
        port=lane.port,
        healthcheck=healthcheck_for(lane.port, start_period(backend)) if serves_api else None,
        labels=tuple((LABEL_PREFIX + k, v) for k, v in labels.items()),
        shm_size=SHM_SIZE,
        restart="no" if profile else "unless-stopped",
        **({"stop_grace_period": PROFILE_STOP_GRACE_PERIOD} if profile else {}),
        profiles=profiles,
        depends_on=depends_on,
        env_files=(SECRETS_ENV_FILE,),
        # Nodes of a multi-node lane reach each other at the machines' own addresses (NCCL,
        # the rendezvous port): no bridge network and NAT between them.
        network_mode="host" if stage.multi_node else None,
        tmpfs=tmpfs,
        mounted_files=dict(files),
    )
    return spec, files


def prior_file_name(lane: str, cls: str) -> str:
    return f"priors/{lane}/{cls}.hist"


def _adaptive(loaded: LoadedRecipe, index: int, lane: Lane
              ) -> tuple[dict[str, str], list[Mount], dict[str, bytes]]:
    """A residency engine's adaptive settings (`core.adaptive_setup`'s environment) and its
    class histograms, mounted read-only as the policy's priors beside the row map."""
    from expert_residency.core.adaptive_setup import format_adaptive_spec
    from expert_residency.formats import FormatError, parse_histogram

    from recipegen.schema.lane import prior_classes

    adaptive = lane.offload.adaptive
    assert adaptive is not None
    env = {runtime_env.ADAPTIVE: format_adaptive_spec(adaptive.runtime_config())}
    mounts: list[Mount] = []
    files: dict[str, bytes] = {}
    targets: list[str] = []
    for cls in prior_classes(lane):
        rel = lane.classes[cls].histogram
        assert rel is not None  # schema checks: a prior class declares a histogram
        where = ("lanes", index, "classes", cls, "histogram")
        data = read_mounted(loaded.resolve(rel))
        try:  # the worker would refuse it at boot (core.adaptive_setup): say so now, at its line
            hist = parse_histogram(data.decode("utf-8"), rel)
        except (FormatError, UnicodeDecodeError, ValueError) as exc:
            raise loaded.error(f"{rel} is not a readable histogram: {exc}", where) from None
        if hist.num_experts != loaded.recipe.model.routed_experts:
            raise loaded.error(f"{rel} counts {hist.num_experts} experts per layer, the model has "
                               f"{loaded.recipe.model.routed_experts}", where)
        missing = sorted(set(loaded.recipe.model.moe_layers) - set(hist.moe_layer_indices))
        if missing:
            raise loaded.error(f"{rel} has no counts for MoE layer(s) {missing[:5]}", where)
        source = prior_file_name(lane.name, cls)
        target = f"{ROWMAP_TARGET_DIR}/{lane.name}-{cls}.hist"
        files[source] = data
        mounts.append(Mount("bind", source, target, True))
        targets.append(target)
    if targets:
        env[runtime_env.ADAPTIVE_PRIORS] = ",".join(targets)
    return env, mounts, files


def canonical_flag(token: str, table: FlagTable) -> str:
    """The flag `token` (`-tp`, `--tensor_parallel_size`, `--no-enforce-eager`, `--x=v`) sets,
    by vLLM's own alias table: its canonical `--long-name`."""
    flag = token.partition("=")[0]
    if flag not in table and flag.startswith("--"):
        flag = "--" + flag[2:].replace("_", "-")  # vLLM's parser reads `_` as `-`
    if flag in table:
        return str(table.flags[flag].get("canonical") or flag)
    return flag


def canonical_flags(argv: list[str], table: FlagTable) -> set[str]:
    """Canonical names of every flag in `argv` (values and negative numbers skipped)."""
    return {canonical_flag(a, table) for a in argv
            if a.startswith("-") and len(a) > 1 and not re.fullmatch(r"-[0-9.]+", a)}
