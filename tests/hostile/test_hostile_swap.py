"""Class swaps are one transaction (recipegen.render.swap, used by `render --class` and
`recipegen swap`): any failure after the recipe is written restores the recipe, the rendering
and the service; a process killed at any step leaves nothing the next run cannot roll back, and
no temp file is ever read as a recipe or missed by `render --check`."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hostile_support import REFERENCE, REPO, cli, refused, snapshot

RECIPE = Path("recipes") / f"{REFERENCE}.yaml"
OUT = Path("compose") / REFERENCE


def _state(project: Path) -> tuple[bytes, dict[str, bytes]]:
    return (project / RECIPE).read_bytes(), snapshot(project / OUT)


def _active(project: Path) -> str:
    return re.search(r"^\s*active_class:\s*(\S+)", (project / RECIPE).read_text(), re.M).group(1)


def _served(project: Path) -> str:
    text = (project / OUT / "compose.yaml").read_text()
    block = text.split("  lane-agent:\n")[1].split("\n  lane-agent-profile:")[0]
    return re.search(r'io\.recipegen\.class: "([^"]*)"', block).group(1)


def _temps(project: Path) -> list[Path]:
    return sorted([p for p in (project / "recipes").iterdir() if p.name.startswith(".")] +
                  [p for p in (project / "compose").rglob("*")
                   if re.search(r"\.recipegen-[0-9]+\.(new|old)$", p.name)])


def test_a_failing_render_write_restores_recipe_and_rendering(project: Path, monkeypatch) -> None:
    assert cli("render", REFERENCE)[0] == 0
    before = _state(project)
    from recipegen.render import output

    real = output.os.replace
    calls = {"n": 0}

    def failing_replace(src, dst):  # renaming the new compose.yaml fails (disk full), once
        if str(dst).endswith("compose.yaml") and not calls["n"]:
            calls["n"] += 1
            raise OSError(28, "No space left on device", str(dst))
        return real(src, dst)

    monkeypatch.setattr(output.os, "replace", failing_replace)
    code, out = cli("render", REFERENCE, "--class", "agent=prose")
    monkeypatch.setattr(output.os, "replace", real)
    assert code == 2 and "No space left" in out, out
    assert _state(project) == before
    assert not _temps(project)


def test_a_rollback_that_fails_too_is_finished_by_the_next_run(project: Path, monkeypatch) -> None:
    assert cli("render", REFERENCE)[0] == 0
    before = _state(project)
    from recipegen.render import output

    real = output.os.replace

    def always_failing(src, dst):  # the disk stays full through the rollback
        if str(dst).endswith(".recipegen-manifest"):
            raise OSError(28, "No space left on device", str(dst))
        return real(src, dst)

    monkeypatch.setattr(output.os, "replace", always_failing)
    code, out = cli("render", REFERENCE, "--class", "agent=prose")
    monkeypatch.setattr(output.os, "replace", real)
    assert code == 2, out
    code, out = cli("check", "recipe", REFERENCE)
    assert code == 0, out
    assert "rolled back" in out
    assert _state(project) == before
    assert not _temps(project)


def test_a_failing_apply_restores_recipe_rendering_and_calls_restore(project: Path) -> None:
    from recipegen.render.swap import swap_classes

    assert cli("render", REFERENCE)[0] == 0
    before = _state(project)
    seen: list[str] = []

    def apply() -> None:
        seen.append(f"apply on {_active(project)}/{_served(project)}")
        raise RuntimeError("the new container never became healthy")

    def restore() -> None:
        seen.append(f"restore on {_active(project)}/{_served(project)}")

    with pytest.raises(RuntimeError):
        swap_classes(project / RECIPE, [("agent", "prose")], apply=apply, restore=restore,
                     echo=lambda s: None)
    assert seen == ["apply on prose/prose", "restore on agent/agent"]
    assert _state(project) == before
    assert not _temps(project)


def test_validation_failure_writes_nothing(project: Path, monkeypatch) -> None:
    from recipegen.render import render as render_module
    from recipegen.render.compose_validate import ComposeValidationError

    assert cli("render", REFERENCE)[0] == 0
    before = _state(project)

    def reject(*args, **kwargs):
        raise ComposeValidationError("compose.yaml: Docker Compose rejected it: test")

    monkeypatch.setattr(render_module, "validate_rendering", reject)
    refused("render", REFERENCE, "--class", "agent=prose", "--validate", expect="rejected")
    assert _state(project) == before


def test_ops_swap_rolls_back_recipe_rendering_and_service_on_any_failure(project: Path,
                                                                       monkeypatch) -> None:
    """`recipegen swap` through the same transaction: the new service fails its health check;
    recipe, rendering and service (re-upped on the previous class) are restored."""
    from recipegen.ops import lanes
    from recipegen.ops.compose import ComposeError
    from recipegen.ops.deployment import Deployment
    from recipegen.ops.rendering import Rendering

    assert cli("render", REFERENCE)[0] == 0
    before = _state(project)
    ups: list[str] = []

    class FakeProject:
        def config(self):
            import yaml
            return yaml.safe_load((project / OUT / "compose.yaml").read_text())

    def fake_start(dep, service, config, **kwargs):
        """The start-and-wait step (ops.startup.start) on whatever rendering is on disk now."""
        ups.append(f"{service}:{_served(project)}")
        if _served(project) == "prose":
            raise ComposeError("lane-agent did not become healthy")

    dep = Deployment(Rendering.load(str(project / RECIPE)))
    monkeypatch.setattr(Deployment, "project", lambda self: FakeProject())
    monkeypatch.setattr(Deployment, "client", lambda self: object())
    monkeypatch.setattr(lanes, "start", fake_start)
    result = lanes.swap(dep, "agent", "prose", wait_s=5, echo=lambda s: None)
    assert not result.ok and result.rolled_back
    assert ups == ["lane-agent:prose", "lane-agent:agent"]
    assert _state(project) == before


def test_ops_swap_restores_when_the_render_itself_fails(project: Path, monkeypatch) -> None:
    from recipegen.ops import lanes
    from recipegen.ops.deployment import Deployment
    from recipegen.ops.rendering import Rendering
    from recipegen.render import output

    assert cli("render", REFERENCE)[0] == 0
    before = _state(project)
    ups: list[str] = []

    class FakeProject:
        def config(self):
            return {"name": REFERENCE, "services": {"lane-agent": {}}}

        def up(self, services, **kwargs):
            ups.append(services[0])

    dep = Deployment(Rendering.load(str(project / RECIPE)))
    monkeypatch.setattr(Deployment, "project", lambda self: FakeProject())
    monkeypatch.setattr(Deployment, "client", lambda self: object())
    real = output.os.replace

    def failing(src, dst):
        if str(dst).endswith(".recipegen-manifest"):
            raise OSError(5, "Input/output error", str(dst))
        return real(src, dst)

    monkeypatch.setattr(output.os, "replace", failing)
    with pytest.raises(OSError):
        lanes.swap(dep, "agent", "prose", wait_s=5, echo=lambda s: None)
    monkeypatch.setattr(output.os, "replace", real)
    assert ups == []  # the service was never touched
    assert _state(project) == before


KILLER = """
import os, signal, sys
limit = int(os.environ["KILL_AT"]); count = [0]
def wrap(name):
    real = getattr(os, name)
    def hit(*a, **k):
        count[0] += 1
        if count[0] == limit:
            os.kill(os.getpid(), signal.SIGKILL)
        return real(*a, **k)
    setattr(os, name, hit)
for name in ("replace", "rename", "link", "unlink", "fsync"):
    wrap(name)
from recipegen.cli import main
sys.argv = ["recipegen", *sys.argv[1:]]
main()
"""


def test_killed_at_every_step_the_next_run_recovers(project: Path, tmp_path: Path) -> None:
    """SIGKILL at the 1st, 2nd, … file-system step of `render --class agent=prose` (every
    rename, link, unlink, fsync), until the command completes untouched. After each kill the
    next command sees recipe and rendering on one class, with no temp file left."""
    assert cli("render")[0] == 0
    pristine = tmp_path / "pristine"
    shutil.copytree(project, pristine, symlinks=True)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "runtime")])}
    outcomes: list[str] = []
    for step in range(1, 200):
        shutil.rmtree(project)
        shutil.copytree(pristine, project, symlinks=True)
        os.chdir(project)  # the old folder is gone
        result = subprocess.run([sys.executable, "-c", KILLER, "render", REFERENCE, "--class",
                                 "agent=prose"], cwd=project, env={**env, "KILL_AT": str(step)},
                                capture_output=True, text=True, timeout=120)
        code, out = cli("render", "--check")  # any command: recovers first
        assert code == 0, f"step {step}: {out}"
        assert _active(project) == _served(project), f"step {step}"
        assert not _temps(project), f"step {step}: {_temps(project)}"
        outcomes.append(_active(project))
        if result.returncode == 0:
            break
        assert result.returncode == -9, f"step {step}: {result.stderr[-3000:]}"
    else:
        pytest.fail("the swap never completed")
    # the kills before the commit roll back, the run that completes commits
    assert outcomes[-1] == "prose" and "agent" in outcomes and len(outcomes) > 5


def test_temp_recipes_are_never_read_as_recipes(project: Path) -> None:
    assert cli("render")[0] == 0
    (project / "recipes" / f".{REFERENCE}.yaml.ab12cd.yaml").write_text("name: [broken")
    (project / "recipes" / f".{REFERENCE}.yaml.recipegen-swap.tmp").write_text("half a recipe")
    code, out = cli("render", "--check")
    assert code == 0, out
    assert not (project / "recipes" / f".{REFERENCE}.yaml.recipegen-swap.tmp").exists()


def test_merge_key_active_class_is_a_clean_error(project: Path) -> None:
    """A lane whose active_class comes from a YAML merge key: writing it would change every lane
    sharing the anchor (or raise deep inside the YAML writer); refused, nothing written."""
    from hostile_support import reference_plain, write_recipe

    doc = reference_plain()
    doc["extra"] = "last"  # a top-level key after lanes, removed below
    path = write_recipe(project, "merged", doc)
    text = path.read_text()
    assert text.endswith("extra: last\n")
    # lane 1 inherits everything (active_class included) from lane 0 through `<<: *first`
    text = text.replace("lanes:\n- name: agent\n", "lanes:\n- &first\n  name: agent\n", 1)
    text = text[:-len("extra: last\n")] + "- <<: *first\n  name: batch\n  port: 30007\n"
    path.write_text(text)
    from recipegen.load.recipe import load_recipe

    lanes = load_recipe(path, read_maps=False).recipe.lanes
    assert [l.name for l in lanes] == ["agent", "batch"] and lanes[1].active_class == "agent"
    before = path.read_bytes()
    out = refused("render", "merged", "--class", "batch=prose", expect="merge key")
    # it points at the value to edit: the anchored lane's own `active_class:` line
    lines = text.splitlines()
    first_lane = lines.index("- &first")
    anchored = next(i for i in range(first_lane, len(lines)) if lines[i].startswith("  active_class:")) + 1
    assert f"merged.yaml:{anchored}: field 'lanes[1].active_class'" in out, out
    assert path.read_bytes() == before
    assert not _temps(project)


@pytest.mark.parametrize("value", ["agent=prose\n", "agent=pro se", "agent=prose=x", "agent=",
                                   "=prose", "agent=../x", "agent=PROSE", "agent=pro\u2028se"])
def test_class_arguments_are_strict(project: Path, value: str) -> None:
    before = (project / RECIPE).read_bytes()
    refused("render", REFERENCE, "--class", value)
    assert (project / RECIPE).read_bytes() == before


def test_a_recipe_named_by_path_is_recovered_from_any_folder(project: Path, tmp_path: Path) -> None:
    """The journal sits beside the recipe: a command naming the recipe by path, run from another
    folder, rolls the interrupted swap back too."""
    assert cli("render", REFERENCE)[0] == 0
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "runtime")])}
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    recipe = project / RECIPE
    journal = project / "recipes" / f".{REFERENCE}.yaml.recipegen-swap.json"
    for step in range(1, 60):
        subprocess.run([sys.executable, "-c", KILLER, "render", str(recipe), "--class",
                        "agent=prose"], cwd=elsewhere, env={**env, "KILL_AT": str(step)},
                       capture_output=True, text=True, timeout=120)
        if journal.exists() and _active(project) == "prose":
            break  # killed with the recipe on the new class and the journal not yet removed
        cli("render", str(recipe), "--class", "agent=agent")
    else:
        pytest.fail("no step left the journal behind")
    os.chdir(elsewhere)
    code, out = cli("render", "--check", str(recipe))
    assert code == 0, out
    assert "rolled back" in out
    assert not journal.exists() and _active(project) == _served(project) == "agent"
