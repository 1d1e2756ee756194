"""Turn service specs into compose.yaml text with the jinja2 templates under `templates/`.

Pure text in, text out: no recipe, no ledger, no I/O besides reading templates. The config
hash of a service is the sha256 of its own rendered block (with the hash left empty) plus the
bytes of every generated file it mounts, so any change to what defines the service — a flag,
an env var, the mounted row map, the template itself — changes the label, and
`docker compose up -d` recreates exactly that service.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import jinja2

from recipegen.common.errors import RecipegenError

TEMPLATES_DIR = Path(__file__).resolve().parent.parent.parent / "templates"
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


@dataclass(frozen=True)
class ServiceSpec:
    """Everything one compose service carries; the template only lays it out."""

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


# Characters a YAML double-quoted scalar must not carry raw: C0/C1 controls, DEL, the Unicode
# line/paragraph separators (Compose's YAML parser breaks lines on them), BOM and non-characters.
_YAML_UNSAFE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff\"\\\\]")
_YAML_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t", "\r": "\\r"}
# Names recipegen writes as YAML keys (services, env keys, labels, volumes): never quoted, so
# they must not be able to end the key or start a new one.
YAML_KEY_PATTERN = re.compile(r"[A-Za-z_][A-Za-z0-9_.-]*")


def yaml_scalar(value: Any) -> str:
    """The one escaping function for every value that reaches compose.yaml: a YAML
    double-quoted scalar that Compose reads back as exactly `str(value)`.

    Quotes, backslashes and every line-breaking or control character are escaped, so a value
    can never end its scalar and add keys; `$` becomes `$$` (Compose's literal dollar) so a
    recipe value arrives in the container as written, except an `Interpolated` value.
    """
    text = str(value)
    if any(0xD800 <= ord(c) <= 0xDFFF for c in text):
        raise RecipegenError(f"value {text[:40]!r}… is not valid Unicode text (lone surrogate)")
    if not isinstance(value, Interpolated):
        text = text.replace("$", "$$")
    escaped = _YAML_UNSAFE.sub(lambda m: _YAML_ESCAPES.get(m.group(0), f"\\u{ord(m.group(0)):04x}"),
                               text)
    return f'"{escaped}"'


def yaml_key(value: Any) -> str:
    """A name written as a plain YAML key; refused unless it matches `YAML_KEY_PATTERN`."""
    text = str(value)
    if not YAML_KEY_PATTERN.fullmatch(text):
        raise RecipegenError(f"{text[:60]!r} cannot be a compose key: use letters, digits, "
                             "'_', '.' and '-', starting with a letter or '_'")
    return text


def yaml_comment(value: Any) -> str:
    """Text for a `#` comment line: every generated file's one comment escaper
    (`expert_residency.formats._io.comment_text`: line breaks and controls as escapes)."""
    from expert_residency.formats._io import comment_text

    return comment_text(str(value))


def make_environment(templates_dir: Path = TEMPLATES_DIR) -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(templates_dir)),
        undefined=jinja2.StrictUndefined,
        autoescape=False,
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
    )
    env.filters["q"] = yaml_scalar
    env.filters["k"] = yaml_key
    env.filters["c"] = yaml_comment
    return env


def _render(env: jinja2.Environment, name: str, **context: Any) -> str:
    try:
        return env.get_template(name).render(**context)
    except jinja2.TemplateNotFound as exc:
        raise RecipegenError(f"template {exc.name} not found under {env.loader.searchpath}") from None  # type: ignore[union-attr]
    except jinja2.TemplateSyntaxError as exc:
        raise RecipegenError(f"template {exc.filename or exc.name}:{exc.lineno}: {exc.message}") from None
    except jinja2.UndefinedError as exc:
        raise RecipegenError(f"template {name}: {exc.message}") from None


def config_hash(block_without_hash: str, mounted_files: dict[str, bytes]) -> str:
    digest = hashlib.sha256()
    digest.update(block_without_hash.encode("utf-8"))
    for path, data in sorted(mounted_files.items()):
        digest.update(b"\0" + path.encode("utf-8") + b"\0")
        digest.update(hashlib.sha256(data).digest())
    return digest.hexdigest()


def render_service(env: jinja2.Environment, spec: ServiceSpec, vllm_version: str) -> str:
    """The service's YAML block, its config hash label filled in."""
    unhashed = _render(env, "service.yaml.j2", s=spec, config_hash="", vllm_version=vllm_version)
    digest = config_hash(unhashed.strip("\n"), spec.mounted_files)
    block = _render(env, "service.yaml.j2", s=spec, config_hash=digest, vllm_version=vllm_version)
    return block.strip("\n")


def render_compose(env: jinja2.Environment, *, project_name: str, recipe_name: str,
                   recipe_file: str, vllm_version: str, services: list[ServiceSpec],
                   volumes: list[str], extra_blocks: tuple[str, ...] = ()) -> str:
    """The compose file: the engines' services, then `extra_blocks` (service blocks serialized
    from data: the monitoring profile's, render.monitoring)."""
    blocks = [render_service(env, spec, vllm_version) for spec in services] + list(extra_blocks)
    return _render(env, "compose.yaml.j2", project_name=project_name, recipe_name=recipe_name,
                   recipe_file=recipe_file, vllm_version=vllm_version, service_blocks=blocks,
                   first_service=services[0].name if services else "",
                   volumes=sorted(volumes))


_SERVICE_LINE = re.compile(r"^  (lane-[a-z0-9-]+):\s*$")
_HASH_LINE = re.compile(r'^\s+' + re.escape(CONFIG_HASH_LABEL) + r': "([0-9a-f]*)"\s*$')


def service_hashes(compose_text: str) -> dict[str, str]:
    """service name → config hash, read from a rendered compose file."""
    hashes: dict[str, str] = {}
    current = None
    for line in compose_text.splitlines():
        service = _SERVICE_LINE.match(line)
        if service:
            current = service.group(1)
            continue
        digest = _HASH_LINE.match(line)
        if digest and current:
            hashes[current] = digest.group(1)
    return hashes
