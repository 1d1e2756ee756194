"""Kubernetes names (recipegen.k8s.manifests.lws_name): `<recipe>-<lane>` is validated, never
rewritten — a DNS-1035 label of at most 50 characters (its workers' StatefulSet `<name>-0` must stay
within 52 for the pods' controller-revision-hash label), refused at the recipe's or the lane's name
with its line; two recipes whose lanes would share a name are refused; `k8s/<recipe>/` is an output
folder whose removed lanes' files are retired, as compose/ does."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from hostile_support import REPO, cli, refused, write_recipe

PP = "dsv41-flash-gb300x2-pp2"


def _pp() -> dict:
    return yaml.safe_load((REPO / "recipes" / f"{PP}.yaml").read_text())


def _name_line(project: Path, file: str, pattern: str) -> int:
    lines = (project / "recipes" / f"{file}.yaml").read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if re.search(pattern, line))


@pytest.mark.parametrize("recipe_name", ["1abc", "a_b", "a..b", "a.b", "x" * 47])
def test_recipe_names_kubernetes_cannot_take_are_refused_at_the_name(project: Path, recipe_name: str) -> None:
    doc = _pp()
    doc["name"] = recipe_name
    write_recipe(project, recipe_name, doc)  # under the name it declares: refused for Kubernetes' sake alone
    out = refused("k8s", recipe_name)
    assert "is not the file's name" not in out
    if len(recipe_name) > 40:
        assert "at most 50" in out and "lanes[0].name" in out
    else:
        assert f"{recipe_name}.yaml:{_name_line(project, recipe_name, '^name:')}: field 'name'" in out
    assert not (project / "k8s").exists()


@pytest.mark.parametrize("lane_name", ["agent-", "a" * 63, "x" * 30])
def test_lane_names_kubernetes_cannot_take_are_refused_at_the_lane(project: Path, lane_name: str) -> None:
    doc = _pp()
    doc["name"] = "k"
    doc["lanes"][0]["name"] = lane_name
    write_recipe(project, "k", doc, keep_name=True)
    if len("k-" + lane_name) <= 50 and not lane_name.endswith("-"):
        code, out = cli("k8s", "k")
        assert code == 0, out
        return
    out = refused("k8s", "k")
    assert f"k.yaml:{_name_line(project, 'k', 'name: ' + lane_name)}: field 'lanes[0].name'" in out


def test_a_name_is_never_rewritten_into_another_lanes(project: Path) -> None:
    """`a-b` + lane `c` and `a` + lane `b-c` are both `a-b-c`: the second is refused."""
    for recipe, lane in (("a-b", "c"), ("a", "b-c")):
        doc = _pp()
        doc["name"] = recipe
        doc["lanes"][0]["name"] = lane
        write_recipe(project, recipe, doc, keep_name=True)
    assert cli("k8s", "a-b")[0] == 0
    out = refused("k8s", "a", expect="a-b-c")
    assert "a-b" in out
    assert not (project / "k8s" / "a").exists()
    # both in one run: refused too (whichever comes second)
    import shutil
    shutil.rmtree(project / "k8s")
    refused("k8s", expect="a-b-c")


def test_a_removed_lanes_manifest_is_retired(project: Path) -> None:
    doc = _pp()
    doc["name"] = "two"
    write_recipe(project, "two", doc, keep_name=True)
    code, out = cli("k8s", "two")
    assert code == 0, out
    folder = project / "k8s" / "two"
    assert sorted(p.name for p in folder.iterdir()) == [".recipegen-manifest", "agent.yaml"]
    doc["lanes"][0]["name"] = "chat"           # lane agent is gone, lane chat is new
    write_recipe(project, "two", doc, keep_name=True)
    code, out = cli("k8s", "--check", "two")
    assert code == 1 and "agent.yaml: no longer rendered" in out and "chat.yaml: missing" in out, out
    assert cli("k8s", "two")[0] == 0
    assert sorted(p.name for p in folder.iterdir()) == [".recipegen-manifest", "chat.yaml"]
    assert cli("k8s", "--check", "two")[0] == 0
    # a recipe that no longer spans machines has its manifests retired
    single = yaml.safe_load((REPO / "recipes" / "dsv41-flash-gb300.yaml").read_text())
    single["name"] = "two"
    write_recipe(project, "two", single, keep_name=True)
    code, out = cli("k8s", "two")
    assert code == 0, out
    assert not folder.exists()


def test_a_folder_somebody_else_wrote_is_not_taken_over(project: Path) -> None:
    import shutil

    shutil.copy(REPO / "recipes" / f"{PP}.yaml", project / "recipes")
    folder = project / "k8s" / PP
    folder.mkdir(parents=True)
    (folder / "agent.yaml").write_text("kind: Mine\n")
    refused("k8s", PP, expect="not written by `recipegen k8s`")
    assert (folder / "agent.yaml").read_text() == "kind: Mine\n"
