"""Every compose service a lane renders is one DNS label: `lane-<name>`, a multi-node lane's
`lane-<name>-worker-<r>`, and each one's count-only profile boot `…-profile`. The recipe check
refuses a lane name whose longest service would not fit (file, line, field, the service and how
far over), computed from the lane's own stage count; the name parts have one owner
(`recipegen.schema.lane`) and one builder (`recipegen.render.lanes`), and nothing else in
recipegen writes them literally."""

from __future__ import annotations

import ast
import re
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from cli_support import invoke

from recipegen.common.errors import InputError
from recipegen.load.recipe import load_recipe
from recipegen.render import lanes
from recipegen.schema.lane import (
    DNS_LABEL_MAX_LENGTH,
    LANE_NAME_MAX_LENGTH,
    LANE_PROFILE_SUFFIX,
    LANE_SERVICE_PREFIX,
    LANE_WORKER_SUFFIX,
    longest_service_name,
)

REPO = Path(__file__).resolve().parent.parent
CORPUS = Path(__file__).parent / "bad_recipes"
PIPELINE = "dsv41-flash-gb300x2-pp2"   # one lane, `agent`, pipeline parallel 2 over two Stations


def _tiny(tmp_path: Path, lane_name: str) -> Path:
    """The one-machine corpus recipe `tiny`, its lane renamed, written to tmp_path/tiny.yaml."""
    shutil.copytree(CORPUS / "maps", tmp_path / "maps")
    data = yaml.safe_load((CORPUS / "valid" / "tiny.yaml").read_text().replace("../maps/", "maps/"))
    data["lanes"][0]["name"] = lane_name
    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _pipeline(tmp_path: Path, lane_name: str, stages: int) -> Path:
    """The two-Station recipe (every expert in HBM) as `variant.yaml`, its lane renamed and, for 3
    stages, a third Station added."""
    text = (REPO / "recipes" / f"{PIPELINE}.yaml").read_text()
    text, count = re.subn(r"^name: .*$", "name: variant", text, count=1, flags=re.M)
    assert count == 1
    assert text.count("\n  - name: agent\n") == 1
    text = text.replace("\n  - name: agent\n", f"\n  - name: {lane_name}\n")
    if stages == 3:
        last = "        - {machine: station-b, gpus: [0], all_experts_in_hbm: true}\n"
        assert "    address: 10.0.0.2\n" in text and last in text
        text = text.replace("    address: 10.0.0.2\n", "    address: 10.0.0.2\n  station-c:\n"
                            "    catalog: gb300-station\n    address: 10.0.0.3\n")
        text = text.replace(last, last + last.replace("station-b", "station-c"))
    path = tmp_path / "recipes" / "variant.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _line_of(path: Path, start: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1)
                if line.lstrip(" -").startswith(start))


def _refused(path: Path) -> InputError:
    with pytest.raises(InputError) as info:
        load_recipe(path)
    return info.value


def _rendered_services(path: Path) -> list[str]:
    from recipegen.render.render import render_recipe

    rendering = render_recipe(load_recipe(path), project_root=REPO)
    return [name for files in rendering.folders.values()
            for name in yaml.safe_load(files["compose.yaml"])["services"]]


def _room(stages: int) -> int:
    """The longest lane name whose services all fit, counted by hand."""
    worker = len(f"-worker-{stages - 1}") if stages > 1 else 0
    return 63 - len("lane-") - worker - len("-profile")


# ------------------------------------------------------------------ the refusal

@pytest.mark.parametrize("over", [1, 8])
def test_a_lane_whose_profile_service_would_exceed_63_is_refused(tmp_path: Path, over: int) -> None:
    name = "p" * (_room(1) + over)
    path = _tiny(tmp_path, name)
    err = _refused(path)
    assert err.file is not None and Path(err.file).name == "tiny.yaml", str(err)
    assert err.line == _line_of(path, f"name: {name}"), str(err)
    assert err.field == "lanes[0].name", str(err)
    message = str(err)
    assert f"lane name of {len(name)} characters: at most 50" in message
    assert f"its count-only profile boot `lane-<name>-profile` (here lane-{name}-profile)" in message
    assert f"would have {63 + over} characters, {over} too many" in message
    assert "its host name on the compose network, one DNS label of at most 63 characters" in message
    assert f"shorten the lane name by {over} character" in message


@pytest.mark.parametrize("stages", [2, 3])
def test_a_pipeline_lane_whose_worker_service_would_exceed_63_is_refused(tmp_path: Path, stages: int) -> None:
    # The name passes the one-machine limit (50); its workers' `-worker-<r>` is what overflows.
    name = "w" * (_room(stages) + 1)
    assert len(name) <= LANE_NAME_MAX_LENGTH
    path = _pipeline(tmp_path, name, stages)
    err = _refused(path)
    assert err.file is not None and Path(err.file).name == "variant.yaml", str(err)
    assert err.line == _line_of(path, f"name: {name}"), str(err)
    assert err.field == "lanes[0].name", str(err)
    message = str(err)
    last = stages - 1
    assert f"lane name of {len(name)} characters: at most {_room(stages)}" in message
    assert f"stage {last}, the last of its {stages} pipeline stages" in message
    assert f"`lane-<name>-worker-{last}-profile` (here lane-{name}-worker-{last}-profile)" in message
    assert "would have 64 characters, 1 too many" in message
    assert "shorten the lane name by 1 character" in message
    # Its engines run on the machines' own network: the reason is the kept limit, not a host name.
    assert "each machine's own network, where a service's name is no host name" in message
    assert "host name on the compose network" not in message
    # `recipegen check recipe` says the same: file:line, the field, exit 2, no traceback.
    result = invoke("check", "recipe", str(path))
    assert result.code == 2
    assert f"variant.yaml:{err.line}" in result.stderr and "lanes[0].name" in result.stderr
    assert f"-worker-{last}-profile" in result.stderr and "Traceback" not in result.output + result.stderr


# ------------------------------------------------------------------ the longest name that fits

def test_the_longest_one_machine_name_is_taken_and_renders_a_63_character_service(tmp_path: Path) -> None:
    assert _room(1) == LANE_NAME_MAX_LENGTH == 50
    path = _tiny(tmp_path, "p" * LANE_NAME_MAX_LENGTH)
    assert load_recipe(path).recipe.lanes[0].name == "p" * 50
    assert len(longest_service_name("p" * 50)) == DNS_LABEL_MAX_LENGTH


@pytest.mark.parametrize("stages", [2, 3])
def test_the_longest_pipeline_name_is_taken_and_its_services_fit(tmp_path: Path, stages: int) -> None:
    name = "w" * _room(stages)
    services = _rendered_services(_pipeline(tmp_path, name, stages))
    # Every engine and its profile boot, on every machine; the longest is exactly one DNS label,
    # and it is the one the schema's check measures.
    expected = {f"lane-{name}", f"lane-{name}-profile"} | {
        f"lane-{name}-worker-{r}{p}" for r in range(1, stages) for p in ("", "-profile")}
    assert expected <= set(services)
    lane_services = [s for s in services if s.startswith("lane-")]
    assert max(len(s) for s in lane_services) == DNS_LABEL_MAX_LENGTH
    assert longest_service_name(name, stages) == f"lane-{name}-worker-{stages - 1}-profile" in lane_services


# ------------------------------------------------------------------ one owner, one builder

def test_the_builder_uses_the_schemas_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (LANE_SERVICE_PREFIX, LANE_WORKER_SUFFIX, LANE_PROFILE_SUFFIX) == ("lane-", "-worker-", "-profile")
    assert lanes.lane_service_name("a") == "lane-a" and lanes.lane_service_name("a", 2) == "lane-a-worker-2"
    assert lanes.profile_service_name("a", 2) == "lane-a-worker-2-profile"
    monkeypatch.setattr(lanes, "LANE_SERVICE_PREFIX", "eng-")
    monkeypatch.setattr(lanes, "LANE_WORKER_SUFFIX", "-w")
    monkeypatch.setattr(lanes, "LANE_PROFILE_SUFFIX", "-count")
    assert lanes.profile_service_name("a", 2) == "eng-a-w2-count"


def test_the_lane_alerts_name_the_service_by_the_builder(monkeypatch: pytest.MonkeyPatch) -> None:
    from recipegen.render import monitoring as mon

    loaded = load_recipe(REPO / "recipes" / "dsv41-flash-gb300.yaml")
    assert loaded.recipe.monitoring is not None

    def descriptions() -> list[str]:
        return [r["annotations"]["description"] for r in mon.lane_availability_rules(loaded)
                if r["alert"] in (mon.DOWN_ALERT, mon.NOT_SERVING_ALERT)]

    # The text the committed renderings hold, unchanged...
    assert descriptions() and all(d.endswith("`docker compose logs lane-{{ $labels.lane }}` says why.")
                                  for d in descriptions())
    # ...and built from the one builder, not a literal.
    monkeypatch.setattr(lanes, "LANE_SERVICE_PREFIX", "eng-")
    assert all(d.endswith("`docker compose logs eng-{{ $labels.lane }}` says why.") for d in descriptions())


def test_service_hashes_read_the_services_of_the_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    from recipegen.render import compose

    text = "\n".join(["services:",
                      "  lane-a:", "    labels:", f'      {compose.CONFIG_HASH_LABEL}: "aa"',
                      "  eng-a:", "    labels:", f'      {compose.CONFIG_HASH_LABEL}: "bb"',
                      "  prometheus:", "    labels:", f'      {compose.CONFIG_HASH_LABEL}: "cc"', ""])
    assert compose.service_hashes(text) == {"lane-a": "aa"}
    monkeypatch.setattr(compose, "LANE_SERVICE_PREFIX", "eng-")
    assert compose.service_hashes(text) == {"eng-a": "bb"}


def test_the_acceptance_run_finds_the_lane_container_by_the_prefix(monkeypatch: pytest.MonkeyPatch) -> None:
    from recipegen.acceptance import identity

    def container(service: str) -> Any:
        return SimpleNamespace(
            name=f"proj-{service}-1", labels={"com.docker.compose.service": service,
                                              "com.docker.compose.project": "proj"},
            attrs={"NetworkSettings": {"Ports": {"8000/tcp": [{"HostPort": "8000"}]}}},
            logs=lambda **_: f"log of {service}".encode())

    client = SimpleNamespace(containers=SimpleNamespace(
        list=lambda **_: [container("other-a"), container("lane-a"), container("eng-a")]),
        close=lambda: None)
    monkeypatch.setitem(sys.modules, "docker", SimpleNamespace(from_env=lambda **_: client))
    assert identity._docker_lane_log("http://127.0.0.1:8000")[0] == "log of lane-a"
    monkeypatch.setattr(identity, "LANE_SERVICE_PREFIX", "eng-")
    assert identity._docker_lane_log("http://127.0.0.1:8000")[0] == "log of eng-a"


def test_nothing_else_in_recipegen_writes_the_name_parts() -> None:
    """No string in recipegen's code (docstrings aside) spells `lane-`, `-worker-` or `-profile` as a
    name part except their owner: a service name is always built by `render.lanes`."""
    part = re.compile(r"(?<![-\w])lane-|(?<![-\w])-profile\b|(?<![-\w])-worker-")
    owner = REPO / "recipegen" / "schema" / "lane.py"
    found = []
    for path in sorted((REPO / "recipegen").rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        # A string standing alone as a statement: a module's, class's or function's docstring, or
        # an attribute's (the schema's field docs).
        bodies = [node.body for node in ast.walk(tree) if isinstance(getattr(node, "body", None), list)]
        docstrings = {id(stmt.value) for body in bodies for stmt in body
                      if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)}
        for node in ast.walk(tree):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and id(node) not in docstrings and part.search(node.value)):
                found.append((path.relative_to(REPO).as_posix(), node.lineno, node.value))
    assert {(p, v) for p, _, v in found} == {(owner.relative_to(REPO).as_posix(), v)
                                            for v in ("lane-", "-worker-", "-profile")}, found
