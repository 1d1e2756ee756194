"""Kubernetes manifests for multi-node lanes, in the form vLLM's multi-node users deploy with:
a LeaderWorkerSet (kubernetes-sigs/lws; one group = one lane, `size` = pipeline stages, the leader
is stage 0 and serves the API) plus a Service for the leader's port.

The engine flags are exactly the compose rendering's (`recipegen.render.services.build_services`,
one spec per stage), so compose and Kubernetes never disagree on what vLLM runs. What Kubernetes
replaces: the head's address (`$(LWS_LEADER_ADDRESS)`), a worker's rank (`$(LWS_WORKER_INDEX)`, the
LWS worker index = pipeline stage), each node's own address (`VLLM_HOST_IP` from `status.podIP`),
host paths (compose's `${VAR:-default}` resolved to the default), the cache volume (a host path per
lane, so kernel tuning survives restarts like the compose named volume), row-map slices and an
adaptive lane's prior histograms (one ConfigMap), GPUs (`nvidia.com/gpu` = tensor-parallel size), and placement: pods land on nodes
labelled `recipegen.io/machine=<machine key>` (stage 0 on the head's machine, workers on theirs),
and memory: the leader's pod requests its stage's host memory from the budget ledger
(`host_memory_request`), the worker template the largest of its stages' (one template serves them all).
Every host path a pod mounts is listed, with what the operator puts there, in `LaneManifests.host_paths`:
the manifest's header is written from it (docs/multinode.md lists the same constants; a test holds it to them).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from recipegen.common.errors import RecipegenError
from recipegen.render.compose import Interpolated
from recipegen.render.monitoring import scrape_annotations
from recipegen.render.services import DUMP_TARGET, HF_HUB_TARGET, MODELS_TARGET, RUNTIME_TARGET

if TYPE_CHECKING:
    from recipegen.load.recipe import LoadedRecipe

MACHINE_LABEL = "recipegen.io/machine"
ANNOTATION_PREFIX = "recipegen.io/"
CACHE_HOST_ROOT = "/var/cache/recipegen"
DUMPS_HOST_ROOT = "/var/lib/recipegen/dumps"
RUNTIME_HOST_PATH = "/opt/recipegen/runtime"
# An HF-repo-id checkpoint: compose mounts `${HF_HUB_CACHE:-~/.cache/huggingface/hub}` (the compose
# user's home); a node has no such user, so the pod mounts root's hub cache there (the vLLM image
# runs as root and reads it at the same path inside the container, offline).
HF_HUB_HOST_PATH = "/root/.cache/huggingface/hub"
# hostPath types: "Directory" must exist before the pod starts (the kubelet refuses the pod
# otherwise); "DirectoryOrCreate" is made empty by the kubelet when missing.
MUST_EXIST = "Directory"
CREATED = "DirectoryOrCreate"
# The Memory-medium emptyDir of prometheus_client's multiprocess folder (PROMETHEUS_MULTIPROC_DIR):
# its files (one per process and metric type, 64 KiB at first, doubled as series are added) take a
# few MiB; the bound keeps a runaway from growing unseen in the node's memory (tmpfs counts against
# the pod's memory): Kubernetes sizes a memory-backed emptyDir's tmpfs to its sizeLimit.
METRICS_EMPTYDIR_LIMIT = "256Mi"
MIB = 1 << 20
LEADER_ADDRESS = "$(LWS_LEADER_ADDRESS)"
WORKER_INDEX = "$(LWS_WORKER_INDEX)"
# A first boot of a new kernel shape autotunes for a long time (compose: 180 min start period).
STARTUP_PROBE_PERIOD_S = 30
STARTUP_PROBE_FAILURES = 360
PRIOR_SOURCE_PREFIX = "priors/"   # compose's prior-histogram mounts (render.services.prior_file_name)
# "The data stored in a ConfigMap cannot exceed 1 MiB" (Kubernetes documentation, "ConfigMaps").
CONFIGMAP_LIMIT_BYTES = 1 << 20


def prior_key(source: str) -> str:
    """The ConfigMap key of a prior histogram mounted from compose source `priors/<lane>/<cls>.hist`."""
    return "prior-" + Path(source).name


@dataclass(frozen=True)
class HostPath:
    """A hostPath volume the nodes must provide: where, of which type, and what goes there."""

    path: str
    type: str
    what: str

    @property
    def provided(self) -> str:
        return "must exist" if self.type == MUST_EXIST else "created empty if missing"


def runtime_host_path() -> HostPath:
    return HostPath(RUNTIME_HOST_PATH, MUST_EXIST,
                    f"the residency runtime, mounted read-only at {RUNTIME_TARGET}: copy this checkout's "
                    f"runtime/ folder there (`rsync -a --delete runtime/ <node>:{RUNTIME_HOST_PATH}/`), "
                    "the version the pod annotation recipegen.io/runtime-version names")


def dumps_host_path(recipe: str, lane: str) -> HostPath:
    return HostPath(f"{DUMPS_HOST_ROOT}/{recipe}/{lane}", CREATED,
                    f"histogram snapshots the runtime writes (drift on a live lane), {DUMP_TARGET} "
                    "in the pod")


def cache_host_path(recipe: str, lane: str) -> HostPath:
    return HostPath(f"{CACHE_HOST_ROOT}/{recipe}/{lane}", CREATED,
                    "compile and autotune caches (vLLM, Triton, FlashInfer), kept across restarts")


def hf_hub_host_path(repo_id: str) -> HostPath:
    return HostPath(HF_HUB_HOST_PATH, MUST_EXIST,
                    f"the Hugging Face hub cache holding {repo_id}, downloaded beforehand as root "
                    "(the pod runs with HF_HUB_OFFLINE=1)")


def model_host_path(path: str, *, default: bool) -> HostPath:
    where = (" (compose's RECIPEGEN_MODELS_DIR default: a pod reads no .env; give model.checkpoint an "
             "absolute path for another folder)" if default else " (the recipe's model.checkpoint)")
    return HostPath(path, MUST_EXIST,
                    f"the checkpoint folder, mounted read-only at {MODELS_TARGET}/<model>{where}")


@dataclass(frozen=True)
class LaneManifests:
    lane: str
    documents: list[dict[str, Any]]
    # Every hostPath of the lane's pods: (machine keys whose nodes mount it, the path).
    host_paths: list[tuple[tuple[str, ...], HostPath]] = field(default_factory=list)
    # The host memory each template requests, in bytes: "leader", "worker" (none without figures).
    memory_requests: dict[str, float] = field(default_factory=dict)


# The LeaderWorkerSet's name, `<recipe>-<lane>`, names every object of the lane: the Service
# `<name>-leader` (a DNS-1035 label: a lowercase letter first, then lowercase letters, digits and
# '-', an alphanumeric last, at most 63 characters), the ConfigMap `<name>-rowmaps`, the leader
# StatefulSet `<name>` and the workers' `<name>-0` (LWS names a group's workers after its leader
# pod). A StatefulSet of more than 52 characters cannot create pods: each pod's
# `controller-revision-hash` label is the StatefulSet's name plus 11 characters, and a label
# value holds 63 ("StatefulSet with long name can not create pods", 2018-05-18,
# https://github.com/kubernetes/kubernetes/issues/64023). So the name is a DNS-1035 label of
# at most 50 characters, written as the recipe
# spells it — never shortened or rewritten, which is how two lanes used to get one name.
DNS_1035_LABEL = re.compile(r"[a-z](?:[-a-z0-9]*[a-z0-9])?")
LWS_NAME_LIMIT = 50
# A label value: at most 63 characters, alphanumerics first and last, '-', '_', '.' inside
# (Kubernetes documentation, "Labels and Selectors", "Syntax and character set").
LABEL_VALUE = re.compile(r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?")


def lws_name(loaded: Any, lane_index: int) -> str:
    """`<recipe>-<lane>`, the lane's LeaderWorkerSet name; refused naming the recipe field at
    fault unless it is a DNS-1035 label of at most `LWS_NAME_LIMIT` characters."""
    recipe = loaded.recipe
    lane = recipe.lanes[lane_index]
    name = f"{recipe.name}-{lane.name}"
    rule = ("Kubernetes object names of a lane are `<recipe>-<lane>`: a lowercase letter first, "
            "lowercase letters, digits and '-' after it, a letter or digit last")
    if not DNS_1035_LABEL.fullmatch(f"{recipe.name}-x"):
        raise loaded.error(f"recipe name {recipe.name!r} cannot start a Kubernetes name ({rule}); "
                           "rename the recipe to deploy it on Kubernetes", ("name",))
    if not DNS_1035_LABEL.fullmatch(name):
        raise loaded.error(f"lane name {lane.name!r} cannot end a Kubernetes name ({rule})",
                           ("lanes", lane_index, "name"))
    if len(name) > LWS_NAME_LIMIT:
        raise loaded.error(
            f"the lane's Kubernetes name {name[:60]!r}{'…' if len(name) > 60 else ''} has {len(name)} "
            f"characters; at most {LWS_NAME_LIMIT} (its workers' StatefulSet `<name>-0` must stay within "
            "52: a pod label holds 63 characters, https://github.com/kubernetes/kubernetes/issues/64023): "
            "shorten the recipe or lane name", ("lanes", lane_index, "name"))
    for key in sorted({s.machine for s in lane.parallel.pipeline} if lane.parallel else ()):
        if not LABEL_VALUE.fullmatch(key):
            raise loaded.error(f"machine key {key!r} cannot be a Kubernetes label value (nodes are "
                               f"selected by {MACHINE_LABEL}=<machine key>: at most 63 characters, "
                               "a letter or digit first and last)", ("machines", key))
    return name


def _host_path(source: str, loaded: Any = None) -> str:
    """The host path of the model mount: recipegen's own Compose interpolation (`Interpolated`:
    `${VAR:-default}`) → its default; a recipe's absolute `model.checkpoint` as written (a `${X:-…}`
    in it stays: Kubernetes expands nothing in hostPath, as it stays in compose.yaml).

    Anything else — a relative path, or `~…`, whose meaning depends on the folder or the user that
    runs Compose — has no one host path on a node, and is refused (the recipe loader refuses such a
    checkpoint first; this is the defensive second check), naming the recipe's file and field when
    `loaded` is given."""
    resolved = (re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:-([^}]*)\}", r"\1", source)
                if isinstance(source, Interpolated) else str(source))
    if not resolved.startswith("/"):
        why = ("`~` is the home of whoever runs Compose, and a node has no such user"
               if resolved.startswith("~") else "a relative path has no one folder on a node")
        message = (f"checkpoint {str(source)[:200]!r} is not an absolute path, so it cannot be a "
                   f"Kubernetes hostPath ({why}); write the folder's absolute path, or a Hugging Face "
                   "repo id")
        if loaded is not None:
            raise loaded.error(message, ("model", "checkpoint"))
        raise RecipegenError(message + " (field model.checkpoint)")
    return resolved


def host_memory_request(host_bytes: float) -> str:
    """A stage's host memory in bytes as a Kubernetes quantity: whole mebibytes (`Mi` = 2**20 bytes;
    `M` would be 10**6), rounded up, so the request is never below the ledger's figure."""
    return f"{math.ceil(host_bytes / MIB)}Mi"


def k8s_literal(value: str) -> str:
    """A recipe value as Kubernetes must be given it to pass it on unchanged: Kubernetes expands
    `$(VAR)` in container args and env values and reads `$$` as a literal `$`, so every `$` is
    doubled. Only the references recipegen adds itself (`LEADER_ADDRESS`, `WORKER_INDEX`) are
    written unescaped, after this."""
    return value.replace("$", "$$")


def _replace_flag(argv: list[str], flag: str, value: str) -> list[str]:
    out = list(argv)
    i = out.index(flag)
    out[i + 1] = value
    return out


def _container(spec: Any, *, recipe: str, lane: str, rank: int, leader: bool, map_volume: str | None,
               loaded: LoadedRecipe | None = None, host_bytes: float | None = None,
               host_paths: list[HostPath] | None = None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One stage's container and volumes. `host_bytes`: its memory request (none when not given);
    `host_paths` gets each hostPath the volumes need. `loaded`: the recipe, which names its file in
    a refusal and is required for a Hugging Face hub mount (the repo id the header names); it stays
    optional for a spec without one (a unit test builds such a spec by hand)."""
    if host_paths is None:
        host_paths = []
    argv = [k8s_literal(arg) for arg in spec.command]
    argv = _replace_flag(argv, "--master-addr", LEADER_ADDRESS)
    if not leader:
        argv = _replace_flag(argv, "--node-rank", WORKER_INDEX)
    env: list[dict[str, Any]] = []
    for key, value in spec.environment:
        if key == "VLLM_HOST_IP":
            env.append({"name": key, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
        else:
            env.append({"name": key, "value": k8s_literal(value)})
    mounts: list[dict[str, Any]] = []
    volumes: list[dict[str, Any]] = []
    for i, m in enumerate(spec.mounts):
        vname = f"m{i}"
        host: HostPath | None = None
        if m.type == "volume":
            host = cache_host_path(recipe, lane)
        elif m.source.startswith("maps/"):
            assert map_volume is not None
            mounts.append({"name": map_volume, "mountPath": m.target, "subPath": f"stage-{rank}.rowmap",
                           "readOnly": True})
            continue
        elif m.source.startswith(PRIOR_SOURCE_PREFIX):
            assert map_volume is not None
            mounts.append({"name": map_volume, "mountPath": m.target, "subPath": prior_key(m.source),
                           "readOnly": True})
            continue
        elif m.target == DUMP_TARGET:
            host = dumps_host_path(recipe, lane)
        elif m.target == RUNTIME_TARGET:
            host = runtime_host_path()
        elif m.target == HF_HUB_TARGET:
            if loaded is None:
                raise RecipegenError(f"internal error: the Hugging Face hub mount {m.target} needs the "
                                     "recipe (loaded=) for its repo id")
            host = hf_hub_host_path(str(loaded.recipe.model.checkpoint))
        elif m.target.startswith(MODELS_TARGET + "/"):
            host = model_host_path(_host_path(m.source, loaded), default=isinstance(m.source, Interpolated))
        else:
            raise RecipegenError(f"internal error: no Kubernetes volume for the compose mount "
                                 f"{m.source!r} → {m.target}")
        host_paths.append(host)
        volumes.append({"name": vname, "hostPath": {"path": host.path, "type": host.type}})
        mounts.append({"name": vname, "mountPath": m.target, "readOnly": bool(m.read_only)})
    for i, path in enumerate(spec.tmpfs):
        # compose's tmpfs (prometheus_client's multiprocess folder): empty at every pod start
        volumes.append({"name": f"t{i}", "emptyDir": {"medium": "Memory", "sizeLimit": METRICS_EMPTYDIR_LIMIT}})
        mounts.append({"name": f"t{i}", "mountPath": path})
    mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    # 16 GiB: compose's shm_size (SHM_SIZE, recipegen/render/services.py, since 3a56a19; no source
    # recorded), dropped from compose for `ipc: host` (9549e9f), which a pod does not have.
    volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory",
                                                 "sizeLimit": spec.shm_size.replace("gb", "Gi")}})
    resources: dict[str, Any] = {"limits": {"nvidia.com/gpu": len(spec.device_ids)}}
    if host_bytes is not None:
        # The stage's host memory from the budget ledger, as a request only (the scheduler places
        # the pod where it fits, and the pod is Burstable, not BestEffort). No memory limit: pinned
        # host memory and the checkpoint's page cache are charged to the pod, and crossing a limit
        # would OOM-kill the engine (docs/multinode.md, "Kubernetes").
        resources["requests"] = {"memory": host_memory_request(host_bytes)}
    container: dict[str, Any] = {
        "name": "vllm",
        "image": spec.image,
        # The vLLM image's entrypoint is `vllm serve`: these are its arguments (as in compose).
        "args": argv,
        "env": env,
        "envFrom": [{"secretRef": {"name": f"{recipe}-secrets", "optional": True}}],
        "resources": resources,
        "volumeMounts": mounts,
    }
    if leader:
        container["ports"] = [{"name": "http", "containerPort": spec.port, "protocol": "TCP"}]
        probe = {"httpGet": {"path": "/health", "port": spec.port}}
        container["startupProbe"] = {**probe, "periodSeconds": STARTUP_PROBE_PERIOD_S,
                                     "failureThreshold": STARTUP_PROBE_FAILURES}
        container["readinessProbe"] = {**probe, "periodSeconds": 15, "failureThreshold": 5}
    return container, volumes


def _pod_template(container: dict[str, Any], volumes: list[dict[str, Any]], *, labels: dict[str, str],
                  annotations: dict[str, str], machines: list[str],
                  grace_s: int) -> dict[str, Any]:
    affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": MACHINE_LABEL, "operator": "In", "values": machines}]}]}}}
    return {"metadata": {"labels": labels, "annotations": annotations},
            "spec": {"affinity": affinity, "containers": [container], "volumes": volumes,
                     "terminationGracePeriodSeconds": grace_s}}


def lane_manifests(loaded: Any, lane_index: int, specs: dict[int, Any],
                   slices: dict[int, bytes], host_bytes: dict[int, float] | None = None) -> LaneManifests:
    """The LeaderWorkerSet (+ Service, + ConfigMap of row-map slices) of one multi-node lane.

    `specs`: the compose ServiceSpec of each stage (rank → spec); `slices`: rank → row-map slice
    bytes for the stages that run the residency runtime; `host_bytes`: rank → the stage's host
    memory from the ledger (`recipegen.k8s.render.stage_host_bytes`), each pod's memory request —
    the worker template's is the largest of its stages' (one template serves them all).
    """
    recipe = loaded.recipe
    lane = recipe.lanes[lane_index]
    assert lane.parallel is not None
    pp = lane.parallel.pipeline_parallel_size
    name = lws_name(loaded, lane_index)
    workers = [specs[r] for r in range(1, pp)]
    # One worker template serves every worker: they may differ only in rank and address.
    if len(workers) > 1:
        def normalised(spec: Any) -> tuple[Any, ...]:
            argv = _replace_flag(list(spec.command), "--node-rank", "*")
            env = tuple((k, v) for k, v in spec.environment if k != "VLLM_HOST_IP")
            return (tuple(argv), env, spec.mounts, len(spec.device_ids), spec.image)
        if len({normalised(w) for w in workers}) > 1:
            raise loaded.error(
                f"lane {lane.name!r}: its workers differ in more than rank and address (e.g. row-map "
                "slices), and a LeaderWorkerSet has one worker template; use compose, or give the "
                "workers' stages the same placement", ("lanes", lane_index, "parallel", "pipeline"))
    data = {f"stage-{r}.rowmap": blob.decode("utf-8") for r, blob in sorted(slices.items())}
    # An adaptive lane's class histograms (the policy's priors): every residency stage mounts the
    # same full-model files (each runtime keeps its own layers' rows).
    for spec in specs.values():
        for m in spec.mounts:
            if m.source.startswith(PRIOR_SOURCE_PREFIX):
                data[prior_key(m.source)] = spec.mounted_files[m.source].decode("utf-8")
    size = sum(len(k.encode()) + len(v.encode()) for k, v in data.items())
    if size > CONFIGMAP_LIMIT_BYTES:
        where: tuple[Any, ...] = ("lanes", lane_index, "offload", "adaptive", "priors")
        if lane.offload.adaptive is None:
            where = ("lanes", lane_index, "parallel", "pipeline")
        raise loaded.error(
            f"lane {lane.name!r}: its row-map slices and prior histograms take {size:,} B, more than a "
            f"Kubernetes ConfigMap holds ({CONFIGMAP_LIMIT_BYTES:,} B); list fewer classes in "
            "offload.adaptive.priors (or none: priors: []), or deploy with compose", where)
    map_volume = "rowmaps" if data else None
    base_labels = {"app.kubernetes.io/name": "vllm", "app.kubernetes.io/managed-by": "recipegen",
                   "recipegen.io/recipe": recipe.name, "recipegen.io/lane": lane.name}
    documents: list[dict[str, Any]] = []
    if data:
        documents.append({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": f"{name}-rowmaps", "labels": base_labels},
            "data": data})
    templates: dict[str, Any] = {}
    requests: dict[str, float] = {}
    host_paths: dict[HostPath, set[str]] = {}
    for role, rank in (("leader", 0), ("worker", 1)):
        spec = specs[rank]
        ranks = [0] if role == "leader" else list(range(1, pp))
        request = max(host_bytes[r] for r in ranks) if host_bytes is not None else None
        if request is not None:
            requests[role] = request
        paths: list[HostPath] = []
        container, volumes = _container(spec, loaded=loaded, recipe=recipe.name, lane=lane.name, rank=rank,
                                        leader=role == "leader", map_volume=map_volume,
                                        host_bytes=request, host_paths=paths)
        if map_volume:
            volumes.append({"name": map_volume, "configMap": {"name": f"{name}-rowmaps"}})
        annotations = {ANNOTATION_PREFIX + k.removeprefix("io.recipegen."): v for k, v in spec.labels
                       if v and k != "io.recipegen.node-rank"}
        if role == "leader" and recipe.monitoring is not None:
            # The recipe's `monitoring`: the leader serves the lane's /metrics (vLLM's series and
            # the runtime's), where Prometheus' Kubernetes pod discovery finds it.
            annotations.update(scrape_annotations(lane.port))
        machines = ([lane.parallel.pipeline[0].machine] if role == "leader" else
                    sorted({s.machine for s in lane.parallel.pipeline[1:]}))
        for path in paths:
            host_paths.setdefault(path, set()).update(machines)
        templates[f"{role}Template"] = _pod_template(
            container, volumes, labels={**base_labels, "role": role}, annotations=annotations,
            machines=machines, grace_s=int(spec.stop_grace_period.rstrip("s")))
    documents.append({
        "apiVersion": "leaderworkerset.x-k8s.io/v1", "kind": "LeaderWorkerSet",
        "metadata": {"name": name, "labels": base_labels},
        "spec": {
            "replicas": 1,
            # Workers start with the leader (LeaderReady would wait forever: the leader is ready
            # only once every worker has joined).
            "startupPolicy": "LeaderCreated",
            "leaderWorkerTemplate": {
                "size": pp,
                # A pipeline cannot lose a stage: any pod restart recreates the whole group.
                "restartPolicy": "RecreateGroupOnPodRestart",
                **templates,
            },
        },
    })
    documents.append({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": f"{name}-leader", "labels": base_labels},
        "spec": {"type": "ClusterIP",
                 "selector": {"leaderworkerset.sigs.k8s.io/name": name, "role": "leader"},
                 "ports": [{"name": "http", "port": lane.port, "targetPort": lane.port,
                            "protocol": "TCP"}]}})
    order = [s.machine for s in lane.parallel.pipeline]
    listed = [(tuple(sorted(on, key=order.index)), path) for path, on in host_paths.items()]
    return LaneManifests(lane.name, documents, listed, requests)


def manifest_path(project_root: Path, recipe_name: str, lane: str) -> Path:
    return project_root / "k8s" / recipe_name / f"{lane}.yaml"
