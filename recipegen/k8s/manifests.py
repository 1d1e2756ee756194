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
labelled `recipegen.io/machine=<machine key>` (stage 0 on the head's machine, workers on theirs).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recipegen.common.errors import RecipegenError
from recipegen.render.compose import Interpolated
from recipegen.render.monitoring import scrape_annotations

MACHINE_LABEL = "recipegen.io/machine"
ANNOTATION_PREFIX = "recipegen.io/"
CACHE_HOST_ROOT = "/var/cache/recipegen"
DUMPS_HOST_ROOT = "/var/lib/recipegen/dumps"
RUNTIME_HOST_PATH = "/opt/recipegen/runtime"
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
class LaneManifests:
    lane: str
    documents: list[dict[str, Any]]


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


def _host_path(source: str) -> str:
    """recipegen's own Compose interpolations (`Interpolated`: `${VAR:-default}`) → default; `~` →
    /root (the vLLM image runs as root). A recipe's path is its text: a `${X:-…}` in it stays as
    written (Kubernetes expands nothing in hostPath), as it does in compose.yaml."""
    resolved = (re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:-([^}]*)\}", r"\1", source)
                if isinstance(source, Interpolated) else str(source))
    if resolved.startswith("~"):
        resolved = "/root" + resolved[1:]
    if not resolved.startswith("/"):
        raise RecipegenError(f"cannot turn compose mount source {source!r} into a host path")
    return resolved


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


def _container(spec: Any, *, recipe: str, lane: str, rank: int, leader: bool,
               map_volume: str | None) -> tuple[dict[str, Any], list[dict[str, Any]]]:
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
        if m.type == "volume":
            host = f"{CACHE_HOST_ROOT}/{recipe}/{lane}"
            volumes.append({"name": vname, "hostPath": {"path": host, "type": "DirectoryOrCreate"}})
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
        elif m.source.startswith("dumps/"):
            volumes.append({"name": vname, "hostPath": {"path": f"{DUMPS_HOST_ROOT}/{recipe}/{lane}",
                                                        "type": "DirectoryOrCreate"}})
        elif m.target.startswith("/opt/"):
            volumes.append({"name": vname, "hostPath": {"path": RUNTIME_HOST_PATH, "type": "Directory"}})
        else:
            volumes.append({"name": vname, "hostPath": {"path": _host_path(m.source), "type": "Directory"}})
        mounts.append({"name": vname, "mountPath": m.target, "readOnly": bool(m.read_only)})
    for i, path in enumerate(spec.tmpfs):
        # compose's tmpfs (prometheus_client's multiprocess folder): empty at every pod start
        volumes.append({"name": f"t{i}", "emptyDir": {"medium": "Memory"}})
        mounts.append({"name": f"t{i}", "mountPath": path})
    mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory",
                                                 "sizeLimit": spec.shm_size.replace("gb", "Gi")}})
    container: dict[str, Any] = {
        "name": "vllm",
        "image": spec.image,
        # The vLLM image's entrypoint is `vllm serve`: these are its arguments (as in compose).
        "args": argv,
        "env": env,
        "envFrom": [{"secretRef": {"name": f"{recipe}-secrets", "optional": True}}],
        "resources": {"limits": {"nvidia.com/gpu": len(spec.device_ids)}},
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
                   slices: dict[int, bytes]) -> LaneManifests:
    """The LeaderWorkerSet (+ Service, + ConfigMap of row-map slices) of one multi-node lane.

    `specs`: the compose ServiceSpec of each stage (rank → spec); `slices`: rank → row-map slice
    bytes for the stages that run the residency runtime.
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
    for role, rank in (("leader", 0), ("worker", 1)):
        spec = specs[rank]
        container, volumes = _container(spec, recipe=recipe.name, lane=lane.name, rank=rank,
                                        leader=role == "leader", map_volume=map_volume)
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
    return LaneManifests(lane.name, documents)


def manifest_path(project_root: Path, recipe_name: str, lane: str) -> Path:
    return project_root / "k8s" / recipe_name / f"{lane}.yaml"
