"""compose.yaml as data: every service — the lanes' (from `ServiceSpec`) and the monitoring
profile's (render.monitoring) — is a mapping serialized here, and nowhere else, by
`recipegen.common.generated.block_yaml`, which reads the text back and compares it with the data
before it is returned. No value, name or file name is ever pasted into text.

The config hash of a service is the sha256 of its own serialized block (with the hash left empty)
plus the bytes of every generated file it mounts, so any change to what defines the service — a
flag, an env var, the mounted row map, the layout itself — changes the label, and
`docker compose up -d` recreates exactly that service.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from recipegen.common.errors import RecipegenError
from recipegen.common.generated import Comment, Flow, Plain, block_lines, block_yaml
from recipegen.schema.lane import LANE_SERVICE_PREFIX

CONFIG_HASH_LABEL = "io.recipegen.config-hash"


@dataclass(frozen=True)
class Mount:
    """A volume entry (long syntax). Bind sources are relative to the output folder."""

    type: Literal["bind", "volume"]
    source: str
    target: str
    read_only: bool
    create_host_path: bool = False


@dataclass(frozen=True)
class HealthCheck:
    test: tuple[str, ...]
    interval: str = "15s"
    timeout: str = "10s"
    retries: int = 5
    start_period: str = "180m"


# The compose profile of a lane's count-only profile boot (`docker compose --profile profile up`).
PROFILE_COMPOSE_PROFILE = "profile"


@dataclass(frozen=True)
class ServiceSpec:
    """Everything one lane's compose service carries (`lane_service` lays it out)."""

    name: str
    image: str
    command: tuple[str, ...]
    environment: tuple[tuple[str, str], ...]
    mounts: tuple[Mount, ...]
    device_ids: tuple[str, ...]
    port: int
    healthcheck: HealthCheck | None
    labels: tuple[tuple[str, str], ...]
    shm_size: str = "16gb"
    restart: str = "unless-stopped"
    stop_grace_period: str = "120s"
    profiles: tuple[str, ...] = ()
    # (service, required): wait for it to be healthy first; not required when it sits behind a
    # compose profile this service lacks (then it may legitimately be off).
    depends_on: tuple[tuple[str, bool], ...] = ()
    env_files: tuple[str, ...] = ()
    # "host" for nodes of a multi-node lane (published ports do not apply then).
    network_mode: str | None = None
    # Container paths mounted as a fresh tmpfs at every start (prometheus_client's multiprocess
    # folder of a lane with metrics: render.monitoring).
    tmpfs: tuple[str, ...] = ()
    # Output-folder files this service mounts (path → bytes), hashed into the config hash.
    mounted_files: dict[str, bytes] = field(default_factory=dict, compare=False)


class Interpolated(str):
    """A value recipegen writes with a Compose interpolation on purpose (`${VAR:-default}`):
    the only strings whose `$` reaches Compose unescaped (docs/render.md lists them)."""


@dataclass(frozen=True)
class Service:
    """One compose service as data: its body in Compose's terms and key order (a `Comment` key
    is a comment line there), and the output-folder files it mounts (path -> bytes), which the
    config hash covers too."""

    name: str
    body: dict[Any, Any]
    mounted_files: dict[str, bytes] = field(default_factory=dict, compare=False)


def lane_service(spec: ServiceSpec, vllm_version: str) -> Service:
    """The compose service of a lane engine (or its profile boot), in the layout of every
    rendering: recipe values as double-quoted strings, recipegen's own words bare."""
    body: dict[Any, Any] = {}
    if spec.profiles:
        body["profiles"] = Flow(spec.profiles)
    body["image"] = spec.image
    body[Comment("The image's entrypoint is `vllm serve`; every flag below exists in vLLM "
                 f"{vllm_version}.")] = None
    body["command"] = list(spec.command)
    body["environment"] = dict(_unique(spec.environment, "environment variable", spec.name))
    if spec.env_files:
        body["env_file"] = [{"path": path, "required": False} for path in spec.env_files]
    body["volumes"] = [_mount(m) for m in spec.mounts]
    if spec.tmpfs:
        body["tmpfs"] = list(spec.tmpfs)
    if spec.network_mode:
        body["network_mode"] = spec.network_mode
    else:
        body["ports"] = [f"{spec.port}:{spec.port}"]
    body["ipc"] = Plain("host")
    body["ulimits"] = {"memlock": {"soft": -1, "hard": -1}}
    body["deploy"] = {"resources": {"reservations": {"devices": [{
        "driver": Plain("nvidia"), "device_ids": Flow(spec.device_ids),
        "capabilities": Flow((Plain("gpu"),))}]}}}
    if spec.healthcheck is not None:
        check = spec.healthcheck
        body["healthcheck"] = {"test": Flow(check.test), "interval": Plain(check.interval),
                               "timeout": Plain(check.timeout), "retries": check.retries,
                               "start_period": Plain(check.start_period)}
    body["restart"] = spec.restart
    body["stop_grace_period"] = Plain(spec.stop_grace_period)
    if spec.depends_on:
        body["depends_on"] = {dep: {"condition": Plain("service_healthy"), "required": required,
                                    "restart": False} for dep, required in spec.depends_on}
    body["labels"] = dict(_unique(spec.labels, "label", spec.name))
    return Service(spec.name, body, spec.mounted_files)


def _unique(pairs: tuple[tuple[str, str], ...], what: str, service: str) -> tuple[tuple[str, str], ...]:
    keys = [key for key, _ in pairs]
    if len(set(keys)) != len(keys):
        raise RecipegenError(f"internal error: service {service} sets a {what} twice")
    return pairs


def _mount(mount: Mount) -> dict[str, Any]:
    entry: dict[str, Any] = {"type": Plain(mount.type), "source": mount.source,
                             "target": mount.target, "read_only": mount.read_only}
    if mount.type == "bind":
        entry["bind"] = {"create_host_path": mount.create_host_path}
    return entry


def compose_literal(node: Any) -> Any:
    """Every string as Compose must be given it to pass it on unchanged: `$` written `$$`
    (Compose's literal dollar), but for an `Interpolated` value. Keys and markers keep theirs."""
    if isinstance(node, Interpolated):
        return str(node)
    if isinstance(node, (Plain, Comment)):
        return node
    if isinstance(node, str):
        return node.replace("$", "$$")
    if isinstance(node, dict):
        return {k: compose_literal(v) for k, v in node.items()}
    if isinstance(node, Flow):
        return Flow(compose_literal(v) for v in node)
    if isinstance(node, (list, tuple)):
        return [compose_literal(v) for v in node]
    return node


def config_hash(block_without_hash: str, mounted_files: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    digest.update(block_without_hash.encode("utf-8"))
    for path, data in sorted(mounted_files.items()):
        digest.update(b"\0" + path.encode("utf-8") + b"\0")
        digest.update(hashlib.sha256(data).digest())
    return digest.hexdigest()


def _with_labels(service: Service, digest: str) -> dict[Any, Any]:
    labels = {**service.body.get("labels", {}), CONFIG_HASH_LABEL: digest}
    return {service.name: compose_literal({**service.body, "labels": labels})}


def service_text(entry: dict[Any, Any]) -> str:
    """A service's block as it stands under `services:` (what its config hash covers)."""
    return "\n".join(block_lines(entry, 2))


def hashed_service(service: Service) -> dict[Any, Any]:
    """`{name: body}` of a service, Compose-literal, its config-hash label filled in: the hash
    of its block with the label empty, and of the files it mounts."""
    digest = config_hash(service_text(_with_labels(service, "")), service.mounted_files)
    return _with_labels(service, digest)


def render_compose(*, project_name: str, recipe_name: str, recipe_file: str, vllm_version: str,
                   services: list[Service], volumes: list[str]) -> str:
    """The compose file: the services in order, then the named volumes. Built as data and
    serialized by `block_yaml`; each service's block in the text is exactly the one its config
    hash was computed over."""
    names = [s.name for s in services]
    if len(set(names)) != len(names):
        raise RecipegenError("internal error: two compose services named "
                             f"{next(n for n in names if names.count(n) > 1)}")
    first = services[0].name if services else ""
    header = [f"Generated by `recipegen render {recipe_name}` from {recipe_file} — do not edit.",
              "Change the recipe and re-render; `recipegen render --check` fails while this file "
              "is stale.",
              f"Start a lane: `docker compose up -d {first}` (from this folder)."]
    # the profile boots this file really has, by their compose profile (a multi-node worker's carry
    # its rank, -worker-N-profile; a lane may itself be named `x-profile`, so not by name)
    profile_boots = [s.name for s in services
                     if tuple(s.body.get("profiles") or ()) == (PROFILE_COMPOSE_PROFILE,)]
    if profile_boots:
        header.append("Profile boot (count-only, never together with its lane): `docker compose --profile "
                      f"profile up -d {profile_boots[0]}`"
                      + (f" (or {', '.join(profile_boots[1:])})." if len(profile_boots) > 1 else "."))
    entries = [hashed_service(s) for s in services]  # Compose-literal already
    document = {**compose_literal({"name": project_name,
                                   "x-recipegen": {"recipe": recipe_name, "recipe_file": recipe_file,
                                                   "vllm_version": vllm_version}}),
                "services": {k: v for entry in entries for k, v in entry.items()},
                "volumes": {volume: {} for volume in sorted(set(volumes))}}
    text = block_yaml(header, document, what="compose.yaml")
    lines = text.split("\n")
    for entry in entries:
        block = service_text(entry).split("\n")
        at = lines.index(block[0]) if block[0] in lines else -1
        if at < 0 or lines[at:at + len(block)] != block:
            raise RecipegenError("internal error: a service's block in compose.yaml is not the "
                                 "text its config hash covers; nothing written")
    return text


_SERVICE_LINE = re.compile(r"^  ([A-Za-z0-9_.-]+):\s*$")
_HASH_LINE = re.compile(r'^\s+' + re.escape(CONFIG_HASH_LABEL) + r': "([0-9a-f]*)"\s*$')


def service_hashes(compose_text: str) -> dict[str, str]:
    """lane service name → config hash, read from a rendered compose file (the lanes' services
    only: `recipegen render` reports and `up -d` recreates those by their hash)."""
    hashes: dict[str, str] = {}
    current = None
    for line in compose_text.splitlines():
        service = _SERVICE_LINE.match(line)
        if service:
            current = service.group(1) if service.group(1).startswith(LANE_SERVICE_PREFIX) else None
            continue
        digest = _HASH_LINE.match(line)
        if digest and current:
            hashes[current] = digest.group(1)
    return hashes
