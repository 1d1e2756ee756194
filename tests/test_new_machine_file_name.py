"""`recipegen new MODEL --machine FILE`: the default recipe name `<model>-<machine>` and the recipe's
machine key come from the machine file's own `name:`, else its file name without .yaml — never
silently the catalog machine the file starts from. Before, `--machine box.yaml` (`catalog:
h200-pcie` plus `host_memory: 144 GiB`) wrote `recipes/<model>-h200-pcie.yaml` keyed `h200-pcie`,
like a fit on the catalog machine, and a second box of the same catalog machine said "exists"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cli_support import invoke

from recipegen.fit.new import machine_key

BOX = "catalog: h200-pcie\nhost_memory: 144 GiB\n"


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _recipe(here: Path, name: str) -> dict:
    return yaml.safe_load((here / "recipes" / f"{name}.yaml").read_text())


def test_a_catalog_based_machine_file_names_the_recipe_and_the_machine_key_after_the_file(here: Path) -> None:
    (here / "box.yaml").write_text(BOX)
    result = invoke("new", "qwen3-30b-a3b", "--machine", "box.yaml")
    assert result.code == 0, result.output
    assert result.output.startswith("new recipe recipes/qwen3-30b-a3b-box.yaml: catalog model qwen3-30b-a3b on "
                                    "machine box (box.yaml: catalog machine h200-pcie, with its own host_memory)")
    assert "· machine box (h200-pcie)" in result.output       # the fit's header: the key, and what it is
    doc = _recipe(here, "qwen3-30b-a3b-box")
    assert doc["machines"] == {"box": {"catalog": "h200-pcie", "host_memory": "144 GiB"}}
    assert doc["lanes"][0]["machine"] == "box"
    assert not (here / "recipes" / "qwen3-30b-a3b-h200-pcie.yaml").exists()
    assert invoke("check", "budgets", "recipes/qwen3-30b-a3b-box.yaml").code == 0


def test_a_second_box_of_the_same_catalog_machine_gets_its_own_recipe(here: Path) -> None:
    (here / "box.yaml").write_text(BOX)
    (here / "box2.yaml").write_text("catalog: h200-pcie\nhost_memory: 160 GiB\n")
    assert invoke("new", "qwen3-30b-a3b", "--machine", "box.yaml").code == 0
    second = invoke("new", "qwen3-30b-a3b", "--machine", "box2.yaml")
    assert second.code == 0, second.output                  # not "exists"
    assert _recipe(here, "qwen3-30b-a3b-box2")["machines"] == {"box2": {"catalog": "h200-pcie",
                                                                        "host_memory": "160 GiB"}}
    # and the catalog machine itself keeps its own name
    assert invoke("new", "qwen3-30b-a3b", "--machine", "h200-pcie").code == 0
    assert list(_recipe(here, "qwen3-30b-a3b-h200-pcie")["machines"]) == ["h200-pcie"]


def test_the_files_own_name_comes_first(here: Path) -> None:
    (here / "Box_3.yml").write_text("name: rack-7\n" + BOX)
    result = invoke("new", "qwen3-30b-a3b", "--machine", "Box_3.yml")
    assert result.code == 0, result.output
    doc = _recipe(here, "qwen3-30b-a3b-rack-7")
    assert list(doc["machines"]) == ["rack-7"] and doc["lanes"][0]["machine"] == "rack-7"


@pytest.mark.parametrize(("arg", "entry", "key"), [
    ("h200-pcie", "h200-pcie", "h200-pcie"),
    ("box.yaml", {"catalog": "h200-pcie"}, "box"),
    ("some/dir/My_Box.v2.yml", {"catalog": "h200-pcie"}, "my-box-v2"),
    ("box.yaml", {"name": "h200-detected", "gpus": {}}, "h200-detected"),
    ("box.yaml", {"name": "  ", "catalog": "h200-pcie"}, "box"),
    ("___.yaml", {"catalog": "h200-pcie"}, "machine"),
    (".yaml", {"catalog": "h200-pcie"}, "yaml"),
    ("b" * 80 + ".yaml", {"catalog": "h200-pcie"}, "b" * 63),
])
def test_machine_key(arg: str, entry, key: str) -> None:
    assert machine_key(arg, entry) == key


def test_compare_json_names_each_file_as_new_would(here: Path) -> None:
    (here / "box.yaml").write_text(BOX)
    (here / "box2.yaml").write_text("catalog: h200-pcie\nhost_memory: 160 GiB\n")
    assert invoke("new", "qwen3-30b-a3b", "--machine", "h200-pcie", "-o", "recipes/q.yaml").code == 0
    result = invoke("compare", "recipes/q.yaml", "--machines", "h200-pcie,box.yaml,box2.yaml", "--json")
    assert result.code == 0, result.output
    rows = json.loads(result.stdout)["machines"]
    assert [(r["machine"], r["name"]) for r in rows] == [("h200-pcie", "h200-pcie"), ("box.yaml", "box"),
                                                         ("box2.yaml", "box2")]
    table = invoke("compare", "recipes/q.yaml", "--machines", "box.yaml,box2.yaml").output.splitlines()
    assert [line.split()[0] for line in table[2:4]] == ["box.yaml", "box2.yaml"]


def test_fit_names_a_keyed_machine_with_what_it_is(here: Path) -> None:
    (here / "box.yaml").write_text(BOX)
    assert invoke("new", "qwen3-30b-a3b", "--machine", "box.yaml").code == 0
    result = invoke("fit", "recipes/qwen3-30b-a3b-box.yaml", "--dry-run")
    assert result.code == 0, result.output
    assert result.output.startswith("fit qwen3-30b-a3b-box · lane chat · machine box (h200-pcie) (dry run")
    out = json.loads(invoke("fit", "recipes/qwen3-30b-a3b-box.yaml", "--dry-run", "--json").stdout)
    assert (out["machine"], out["machine_key"]) == ("h200-pcie", "box")


@pytest.mark.parametrize("file_name, text", [
    ("rtx-4090.yaml", "catalog: rtx-5090\n"),                              # another catalog machine
    ("rtx-5090.yaml", "catalog: rtx-5090\nhost_memory: 64 GiB\n"),         # its own, with other figures
    ("desk.yaml", "name: rtx-5090\ncatalog: rtx-5090\nhost_memory: 64 GiB\n"),
])
def test_a_machine_file_named_as_a_catalog_machine_it_is_not_is_refused(here: Path, file_name: str, text: str) -> None:
    """Its recipe and key would be `<model>-<catalog id>`, what `new --machine <catalog id>` drafts."""
    (here / file_name).write_text(text)
    result = invoke("new", "qwen3-30b-a3b", "--machine", file_name)
    assert result.code == 2, result.output
    assert f"{file_name}: field 'name'" in result.stderr
    assert "give the file a `name:` of its own" in result.stderr
    assert not (here / "recipes").exists()


def test_a_machine_file_that_is_just_its_catalog_machine_keeps_its_name(here: Path) -> None:
    (here / "rtx-5090.yaml").write_text("catalog: rtx-5090\n")
    result = invoke("new", "qwen3-30b-a3b", "--machine", "rtx-5090.yaml")
    assert result.code == 0, result.output
    assert (here / "recipes" / "qwen3-30b-a3b-rtx-5090.yaml").is_file()


def test_a_second_box_of_the_same_file_name_is_told_what_the_existing_recipe_was_drafted_for(here: Path) -> None:
    (here / "a").mkdir()
    (here / "b").mkdir()
    (here / "a" / "box.yaml").write_text(BOX)
    (here / "b" / "box.yml").write_text("catalog: h200-pcie\nhost_memory: 160 GiB\n")
    assert invoke("new", "qwen3-30b-a3b", "--machine", "a/box.yaml").code == 0
    before = (here / "recipes" / "qwen3-30b-a3b-box.yaml").read_bytes()
    second = invoke("new", "qwen3-30b-a3b", "--machine", "b/box.yml")
    assert second.code == 2
    assert second.stderr == (
        "error: recipes/qwen3-30b-a3b-box.yaml: exists, drafted for another machine box {catalog: h200-pcie, "
        "host_memory: 144 GiB} (this one: box {catalog: h200-pcie, host_memory: 160 GiB}); draft this one under "
        "another name (--name, or -o another file), or pass --force to overwrite it\n")
    assert (here / "recipes" / "qwen3-30b-a3b-box.yaml").read_bytes() == before
    # the same draft again is the plain refusal: nothing else to say
    again = invoke("new", "qwen3-30b-a3b", "--machine", "a/box.yaml")
    assert again.stderr == "error: recipes/qwen3-30b-a3b-box.yaml: exists; pass --force to overwrite (or -o another file)\n"
    assert invoke("new", "qwen3-30b-a3b", "--machine", "b/box.yml", "--name", "qwen3-box-b").code == 0
    other_model = invoke("new", "gpt-oss-120b", "--machine", "a/box.yaml", "-o", "recipes/qwen3-30b-a3b-box.yaml")
    assert "exists, drafted for another model qwen3-30b-a3b (this one: gpt-oss-120b);" in other_model.stderr


def test_a_machine_file_that_resolves_to_the_existing_recipes_machine_gets_the_plain_exists(here: Path) -> None:
    # Review 18, finding 12: `catalog: h200-sxm-x8` in h200-sxm-x8.yaml is the catalog machine
    # h200-sxm-x8 itself: the machines are compared resolved, not as raw entries
    assert invoke("new", "qwen3-30b-a3b", "--machine", "h200-sxm-x8").code == 0
    (here / "x").mkdir()
    (here / "x" / "h200-sxm-x8.yaml").write_text("catalog: h200-sxm-x8\n")
    same = invoke("new", "qwen3-30b-a3b", "--machine", "x/h200-sxm-x8.yaml")
    assert same.code == 2
    assert same.stderr == ("error: recipes/qwen3-30b-a3b-h200-sxm-x8.yaml: exists; pass --force to overwrite "
                           "(or -o another file)\n")
    # a file that differs in a figure is still another machine, under the same key
    (here / "y").mkdir()
    (here / "y" / "box.yaml").write_text("catalog: h200-sxm-x8\n")
    assert invoke("new", "qwen3-30b-a3b", "--machine", "y/box.yaml").code == 0
    (here / "z").mkdir()
    (here / "z" / "box.yaml").write_text("catalog: h200-sxm-x8\nhost_memory: 100 GiB\n")
    other = invoke("new", "qwen3-30b-a3b", "--machine", "z/box.yaml")
    assert other.code == 2
    assert other.stderr.startswith("error: recipes/qwen3-30b-a3b-box.yaml: exists, drafted for another machine box "
                                   "{catalog: h200-sxm-x8} (this one: box {catalog: h200-sxm-x8, host_memory: "
                                   "100 GiB}); "), other.stderr
