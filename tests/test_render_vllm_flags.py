"""The vLLM 0.33 `vllm serve` flag table: derived from source, checked against a real parser."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from recipegen.vllm_flags import argv_problems, load_flag_table
from recipegen.vllm_flags.generate import derive_flags

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "recipegen" / "data" / "vllm_flags" / "vllm-0.33.0.json"
VLLM_VENV_PYTHON = REPO / ".venv-vllm" / "bin" / "python"


def vllm033_source() -> Path | None:
    """The unpacked vllm 0.33.0 `vllm/` folder, wherever this machine keeps it."""
    candidates = []
    if os.environ.get("RECIPEGEN_VLLM033_SRC"):
        candidates.append(Path(os.environ["RECIPEGEN_VLLM033_SRC"]) / "vllm")
    candidates += [REPO / ".cache" / "vllm-0.33.0" / "vllm", Path("/work/cache/vllm-0.33.0/vllm")]
    for candidate in candidates:
        if (candidate / "engine" / "arg_utils.py").is_file():
            return candidate
    return None


def test_committed_table_is_what_the_generator_derives_from_033_source() -> None:
    source = vllm033_source()
    if source is None:
        pytest.skip("vllm 0.33.0 source not unpacked (scripts/fetch-vllm033-source.sh)")
    derived = derive_flags(source)
    committed = json.loads(DATA.read_text(encoding="utf-8"))
    assert derived["vllm_version"] == "0.33.0"
    assert derived == committed, "regenerate: python -m recipegen.vllm_flags.generate " \
        f"{source} --out {DATA.relative_to(REPO)}"


def test_table_knows_the_flags_and_kinds_read_in_033_source() -> None:
    # Facts read by hand in vllm/engine/arg_utils.py and vllm/config/*.py of 0.33.0.
    table = load_flag_table("0.33.0")
    assert table.vllm_version == "0.33.0"
    expected = {
        "--model": "value", "--revision": "value", "--port": "int", "--host": "value",
        "--max-model-len": "int", "--kv-cache-memory-bytes": "int",
        "--gpu-memory-utilization": "float", "--cpu-offload-gb": "float",
        "--speculative-config": "json", "--worker-extension-cls": "value",
        "--served-model-name": "list", "--enforce-eager": "bool",
        "--no-enforce-eager": "bool_negated", "--disable-log-stats": "switch",
        "--tensor-parallel-size": "int", "--moe-backend": "choice",
    }
    assert {flag: table.kind(flag) for flag in expected} == expected
    assert "flashinfer_trtllm" in (table.choices("--moe-backend") or [])
    assert table.flags["-q"]["canonical"] == "--quantization"
    # Flags that do not exist must not sneak in.
    for missing in ("--kv-cache-memory", "--num-speculative-tokens", "--cpu-offload"):
        assert missing not in table


def test_argv_checker_reports_each_kind_of_mistake() -> None:
    table = load_flag_table()
    good = ["--model", "/models/m", "--port", "8000", "--enforce-eager", "--served-model-name",
            "a", "b", "--moe-backend", "flashinfer_trtllm", "--speculative-config",
            '{"method": "mtp", "num_speculative_tokens": 3}', "--kv-cache-memory-bytes=5261334937"]
    assert argv_problems(good, table) == []
    assert argv_problems(["--kv-cache-memory", "1"], table) == [
        "--kv-cache-memory: not a `vllm serve` flag in vLLM 0.33.0"]
    assert argv_problems(["--max-model-len"], table) == ["--max-model-len needs a value"]
    assert argv_problems(["--moe-backend", "flashinfer"], table)[0].startswith(
        "--moe-backend 'flashinfer': not one of")
    assert argv_problems(["--enforce-eager=yes"], table) == ["--enforce-eager takes no value (got 'yes')"]
    assert argv_problems(["--port", "eighty"], table) == [
        "--port needs a value", "unexpected value 'eighty' (no flag takes it)"] or \
        argv_problems(["--port", "eighty"], table) == ["--port 'eighty': not a number"]
    assert argv_problems(["--speculative-config", "{bad"], table)[0].startswith(
        "--speculative-config: invalid JSON")
    # JSON keys are checked against the config dataclass's fields (SpeculativeConfig here).
    assert argv_problems(["--speculative-config", '{"method": "mtp", "k": 3}'], table) == [
        "--speculative-config: 'k' is not a field of VllmConfig.speculative_config"]
    assert argv_problems(["--speculative-config", json.dumps(
        {"method": "dspark", "num_speculative_tokens": 5,
         "num_speculative_tokens_per_batch_size": [[1, 4, 5], [5, 64, 3]]})], table) == []


_PARSER_DUMP = r"""
import argparse, json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.cli.serve import make_arg_parser  # what `vllm serve` itself uses
parser = make_arg_parser(FlexibleArgumentParser())
out = {}
for action in parser._actions:
    for option in action.option_strings:
        if option in ("-h", "--help"):
            continue
        if isinstance(action, argparse.BooleanOptionalAction):
            kind = "bool_negated" if option.startswith("--no-") else "bool"
        elif action.nargs == 0:
            kind = "switch"
        else:
            kind = "value"
        out[option] = {"kind": kind,
                       "choices": sorted(str(c) for c in action.choices if c is not None)
                       if action.choices else None}
import vllm
print(json.dumps({"version": vllm.__version__, "file": vllm.__file__, "flags": out}))
"""


@pytest.mark.vllm
def test_generator_reproduces_the_installed_vllm_parser_exactly() -> None:
    """Run the same static derivation on the installed CPU build's source and compare it with
    the parser that build actually constructs: same option strings, same on/off flags, same
    choices. This is what makes the 0.33 table (derived the same way) trustworthy."""
    if not VLLM_VENV_PYTHON.exists():
        pytest.skip(".venv-vllm not installed (scripts/setup-vllm-cpu.sh)")
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_LOGGING_LEVEL="ERROR")
    result = subprocess.run([str(VLLM_VENV_PYTHON), "-c", _PARSER_DUMP], capture_output=True,
                            text=True, timeout=300, env=env, check=False)
    if result.returncode != 0 and "No module named 'vllm'" in result.stderr:
        pytest.skip("vllm not installed in .venv-vllm")
    assert result.returncode == 0, result.stderr[-3000:]
    real = json.loads(result.stdout.strip().splitlines()[-1])
    derived = derive_flags(Path(real["file"]).parent)["flags"]
    real_flags = real["flags"]
    assert sorted(set(derived) ^ set(real_flags)) == [], "option strings differ"
    no_value = {"bool", "bool_negated", "switch"}
    for option, info in real_flags.items():
        mine = derived[option]
        assert (mine["kind"] in no_value) == (info["kind"] in no_value), option
        if info["kind"] in ("bool", "bool_negated"):
            assert mine["kind"] == info["kind"], option
        if info["choices"] and mine["kind"] == "choice":
            assert set(mine["choices"]) <= set(info["choices"]) | {"None"}, option


def test_generator_cli_refuses_a_folder_that_is_not_vllm(tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "recipegen.vllm_flags.generate", str(tmp_path)],
                            capture_output=True, text=True, check=False)
    assert result.returncode == 2
    assert "does not look like a vllm package folder" in result.stderr


_PARSE_RENDERED = r"""
import json, sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.entrypoints.cli.serve import make_arg_parser
parser = make_arg_parser(FlexibleArgumentParser())
known = {o for a in parser._actions for o in a.option_strings}
results = []
for argv in json.loads(sys.stdin.read()):
    unknown, kept, i = [], [], 0
    while i < len(argv):
        if argv[i].startswith("--") and argv[i] not in known:
            unknown.append(argv[i]); i += 2; continue
        kept.append(argv[i]); i += 1
    ns = parser.parse_args(kept)
    results.append({"unknown": unknown, "port": ns.port, "max_model_len": ns.max_model_len})
print(json.dumps(results))
"""


@pytest.mark.vllm
def test_rendered_commands_parse_with_the_installed_vllm_parser() -> None:
    """Every committed rendering's `vllm serve` argv goes through the real parser of the CPU
    build (0.32): types, choices and JSON are accepted; a flag that build lacks must at least be
    a 0.33 flag (the GPU target), and is reported."""
    if not VLLM_VENV_PYTHON.exists():
        pytest.skip(".venv-vllm not installed (scripts/setup-vllm-cpu.sh)")
    import yaml

    commands = []
    for compose_file in sorted((REPO / "compose").rglob("compose.yaml")):
        for service in yaml.safe_load(compose_file.read_text())["services"].values():
            if "io.recipegen.lane" in service.get("labels", {}):   # lanes, not the monitoring profile's services
                commands.append(service["command"])
    assert commands
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_LOGGING_LEVEL="ERROR")
    result = subprocess.run([str(VLLM_VENV_PYTHON), "-c", _PARSE_RENDERED], input=json.dumps(commands),
                            capture_output=True, text=True, timeout=300, env=env, check=False)
    if result.returncode != 0 and "No module named 'vllm'" in result.stderr:
        pytest.skip("vllm not installed in .venv-vllm")
    assert result.returncode == 0, result.stderr[-3000:]
    parsed = json.loads(result.stdout.strip().splitlines()[-1])
    table = load_flag_table("0.33.0")
    for argv, outcome in zip(commands, parsed):
        assert outcome["port"] == int(argv[argv.index("--port") + 1])
        assert all(flag in table for flag in outcome["unknown"]), outcome["unknown"]


def test_worker_extension_named_in_renders_exists_in_the_runtime() -> None:
    """The qualname passed to --worker-extension-cls is a class of runtime/ (read, not imported:
    the plugin modules import vllm)."""
    import ast

    from recipegen.render.services import WORKER_EXTENSION_CLS

    module, _, cls = WORKER_EXTENSION_CLS.rpartition(".")
    source = REPO / "runtime" / (module.replace(".", "/") + ".py")
    assert source.is_file(), source
    tree = ast.parse(source.read_text(encoding="utf-8"))
    assert cls in {node.name for node in tree.body if isinstance(node, ast.ClassDef)}


_LOAD_PLUGINS = r"""
import importlib, json, sys
from vllm.plugins import load_general_plugins
load_general_plugins()
loaded = sorted(m for m in sys.modules if m.startswith("expert_residency.vllm_plugin"))
ext = None
if len(sys.argv) > 1:
    module, _, name = sys.argv[1].rpartition(".")
    ext = getattr(importlib.import_module(module), name).__qualname__
print(json.dumps({"loaded": loaded, "ext": ext}))
"""


@pytest.mark.vllm
@pytest.mark.parametrize("service", ["lane-agent", "lane-agent-profile"])
def test_rendered_environment_activates_the_runtime_in_a_real_vllm(service: str, tmp_path: Path) -> None:
    """The committed reference service's environment, with its bind mounts mapped to their host
    sources, makes the installed vLLM's own plugin loader load the runtime plugin; and the
    --worker-extension-cls qualname imports. Control: a different VLLM_PLUGINS loads nothing."""
    if not VLLM_VENV_PYTHON.exists():
        pytest.skip(".venv-vllm not installed (scripts/setup-vllm-cpu.sh)")
    import yaml

    compose_dir = REPO / "compose" / "dsv41-flash-gb300"
    spec = yaml.safe_load((compose_dir / "compose.yaml").read_text())["services"][service]
    mounts = {m["target"]: m["source"] for m in spec["volumes"] if m["type"] == "bind"}

    def host(path: str) -> str:
        for target, source in mounts.items():
            if path == target or path.startswith(target + "/"):
                return str((compose_dir / source).resolve()) + path[len(target):]
        return path

    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(tmp_path),
           "VLLM_TARGET_DEVICE": "cpu", "VLLM_LOGGING_LEVEL": "ERROR"}
    for key, value in spec["environment"].items():
        if key.startswith(("EXPERT_RESIDENCY_", "VLLM_PLUGINS", "PYTHONPATH")):
            env[key] = host(str(value))
    env["EXPERT_RESIDENCY_DUMP_DIR"] = str(tmp_path / "dumps")
    if "PROMETHEUS_MULTIPROC_DIR" in spec["environment"]:
        # the service mounts an empty tmpfs there; here an empty folder of the test's own
        assert spec["environment"]["PROMETHEUS_MULTIPROC_DIR"] in spec.get("tmpfs", [])
        (tmp_path / "metrics").mkdir()
        env["PROMETHEUS_MULTIPROC_DIR"] = str(tmp_path / "metrics")
    assert env["PYTHONPATH"] == str((REPO / "runtime").resolve())
    argv = spec["command"]
    ext = argv[argv.index("--worker-extension-cls") + 1]

    def load(extra_env: dict[str, str], *args: str) -> dict:
        result = subprocess.run([str(VLLM_VENV_PYTHON), "-c", _LOAD_PLUGINS, *args],
                                capture_output=True, text=True, timeout=300, cwd=tmp_path,
                                env={**env, **extra_env}, check=False)
        if result.returncode != 0 and "No module named 'vllm'" in result.stderr:
            pytest.skip("vllm not installed in .venv-vllm")
        assert result.returncode == 0, result.stderr[-3000:]
        return json.loads(result.stdout.strip().splitlines()[-1])

    outcome = load({}, ext)
    assert "expert_residency.vllm_plugin" in outcome["loaded"]
    assert outcome["ext"] == ext.rpartition(".")[2]
    if service == "lane-agent":  # the control once: another process start costs ~20 s
        assert load({"VLLM_PLUGINS": "some_other_plugin"})["loaded"] == []
