"""QA pass 11 on the Kubernetes manifests: each pod requests host memory from the budget ledger (the
figures `check budgets --json` prints, as whole Mi rounded up; the one worker template the largest
of its stages', which the header prints for the workers; no memory limit); the
header lists every hostPath the nodes must provide (the runtime's included) and docs/multinode.md
the same paths; a relative or `~` checkpoint is refused naming the recipe file and
`model.checkpoint`; `recipegen k8s --check` says so when everything is current; `recipegen k8s`
reports an unchanged file as unchanged."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_support import invoke
from test_multinode import _mixed_recipe

from recipegen.common.errors import InputError, RecipegenError
from recipegen.k8s import manifests
from recipegen.k8s.render import render_k8s
from recipegen.k8s.validate import validate_manifest
from recipegen.load.recipe import load_recipe

REPO = Path(__file__).resolve().parents[1]
RECIPE = "dsv41-flash-gb300x2-pp2"


def _reference_variant(tmp_path: Path, *edits: tuple[str, str]) -> Path:
    """A copy of the reference recipe under `tmp_path/recipes/`, each (old, new) edit made once."""
    text = (REPO / "recipes" / f"{RECIPE}.yaml").read_text(encoding="utf-8")
    for old, new in edits:
        assert old in text, old
        text = text.replace(old, new, 1)
    path = tmp_path / "recipes" / f"{RECIPE}.yaml"
    path.parent.mkdir(exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def _recipe_with(tmp_path: Path, checkpoint: str) -> Path:
    """The reference recipe with `model.checkpoint: <checkpoint>`."""
    return _reference_variant(tmp_path, ("  catalog: dsv41-flash-mxfp4\n",
                                         f"  catalog: dsv41-flash-mxfp4\n  checkpoint: {checkpoint}\n"))


def _pp3_recipe(tmp_path: Path) -> Path:
    """The reference over three Stations with unequal host figures: engram-0 (94.6 GiB, layer 1) on
    stage 0, none on stage 1, engram-1 cut to 50 GiB and moved to layer 30, on stage 2."""
    return _reference_variant(
        tmp_path,
        ("      bytes: {value: 94.6 GiB, source: \"the field report 'vLLM: Pin Hot Experts' (2026-09-17), "
         "'Where the experts live today'\"}\n      layer: 15\n",
         "      bytes: {value: 50 GiB, source: a test's figure}\n      layer: 30\n"),
        ("    address: 10.0.0.2\n",
         "    address: 10.0.0.2\n  station-c:\n    catalog: gb300-station\n    address: 10.0.0.3\n"),
        ("        - {machine: station-b, gpus: [0], all_experts_in_hbm: true}\n",
         "        - {machine: station-b, gpus: [0], all_experts_in_hbm: true}\n"
         "        - {machine: station-c, gpus: [0], all_experts_in_hbm: true}\n"))


def _manifest(path: str | Path, root: Path) -> tuple[str, list[dict[str, Any]]]:
    files = render_k8s(load_recipe(path), root)
    text = next(iter(files.values())).decode("utf-8")
    return text, list(yaml.safe_load_all(text))


def _templates(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    lws = next(d for d in docs if d["kind"] == "LeaderWorkerSet")
    group = lws["spec"]["leaderWorkerTemplate"]
    return {"leader": group["leaderTemplate"]["spec"], "worker": group["workerTemplate"]["spec"]}


def _budgets_json(recipe: str) -> dict[str, Any]:
    result = invoke("check", "budgets", recipe, "--json")
    assert result.code == 0, result.output
    return json.loads(result.stdout)


def _expected_requests(recipe: str) -> dict[str, str]:
    """machine → the memory request, from `check budgets --json` alone: the stage's larger of
    "host in use" and "host peak during load", in whole mebibytes rounded up."""
    (lane,) = _budgets_json(recipe)["recipes"][0]["lanes"]
    out = {}
    for stage in lane["stages"]:
        figures = stage["ledger"]["figures"]
        need = max(figures["host.total"]["value"], figures["load.host_peak"]["value"])
        out[stage["machine"]] = f"{math.ceil(need / 2**20)}Mi"
    return out


@pytest.mark.parametrize("mixed", [False, True], ids=["all-hbm", "stage-1-offloads"])
def test_memory_request_is_the_ledgers_host_figure(mixed: bool, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    if mixed:   # stage 1 pins experts at load: its load peak is above its host in use
        path, root = _mixed_recipe(tmp_path), tmp_path
        monkeypatch.chdir(tmp_path)
        target = str(path)
    else:
        path, root, target = Path(RECIPE), REPO, RECIPE
        monkeypatch.chdir(REPO)
    expected = _expected_requests(target)
    text, docs = _manifest(target, root)
    templates = _templates(docs)
    for role, machine in (("leader", "station-a"), ("worker", "station-b")):
        resources = templates[role]["containers"][0]["resources"]
        assert resources["requests"] == {"memory": expected[machine]}, (role, resources)
        assert "memory" not in resources["limits"]            # deliberately no memory limit
        assert f"#   {role} ({machine}) {expected[machine]} (" in text   # and the header says it
    if not mixed:   # the figures docs/multinode.md quotes
        assert expected == {"station-a": "324864Mi", "station-b": "131124Mi"}
    else:
        lane = _budgets_json(target)["recipes"][0]["lanes"][0]
        figures = lane["stages"][1]["ledger"]["figures"]
        assert figures["load.host_peak"]["value"] > figures["host.total"]["value"]
    assert all(validate_manifest(d) == [] for d in docs)


def test_pp3_workers_request_the_largest_of_their_stages_and_the_header_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One LeaderWorkerSet worker template serves stages 1 and 2: both worker pods request the larger
    of their two figures, and the header prints that figure for the workers, not each stage's own."""
    path = _pp3_recipe(tmp_path)
    monkeypatch.chdir(tmp_path)
    expected = _expected_requests(str(path))
    a, b, c = expected["station-a"], expected["station-b"], expected["station-c"]
    mib = {machine: int(value.removesuffix("Mi")) for machine, value in expected.items()}
    assert mib["station-b"] < mib["station-c"] < mib["station-a"], expected   # unequal, as built
    text, docs = _manifest(path, tmp_path)
    templates = _templates(docs)
    lws = next(d for d in docs if d["kind"] == "LeaderWorkerSet")
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 3
    assert templates["leader"]["containers"][0]["resources"]["requests"] == {"memory": a}
    assert templates["worker"]["containers"][0]["resources"]["requests"] == {"memory": c}
    header = text.split("\n---\n")[0]
    assert f"#   leader (station-a) {a} (" in header
    assert f"#   workers (station-b, station-c) {c} (" in header and " each: one worker template" in header
    assert f"the largest of their stages' figures (station-b {b}, station-c {c})." in header
    assert f"station-b {b} (" not in header     # stage 1's own figure is not shown as its request
    assert all(validate_manifest(d) == [] for d in docs)


def test_a_hub_mount_without_the_recipe_is_an_error_not_an_attribute_error() -> None:
    from recipegen.render.compose import Interpolated, Mount, ServiceSpec
    from recipegen.render.services import HF_HUB_TARGET

    spec = ServiceSpec(name="lane-x", image="i", command=("--master-addr", "a", "--node-rank", "0"),
                       environment=(), mounts=(Mount("bind", Interpolated("${HF_HUB_CACHE:-~/h}"),
                                                     HF_HUB_TARGET, True),),
                       device_ids=("0",), port=8000, healthcheck=None, labels=(), tmpfs=())
    with pytest.raises(RecipegenError, match="needs the recipe"):
        manifests._container(spec, recipe="r", lane="x", rank=0, leader=True, map_volume=None)


def test_header_lists_every_host_path_with_what_goes_there(tmp_path: Path) -> None:
    text, docs = _manifest(_mixed_recipe(tmp_path), tmp_path)
    header = text.split("\n---\n")[0]
    paths = {v["hostPath"]["path"] for spec in _templates(docs).values() for v in spec["volumes"]
             if "hostPath" in v}
    assert manifests.RUNTIME_HOST_PATH in paths
    for path in paths:
        assert f"#   {path} — on " in header, path
    assert f"#   {manifests.RUNTIME_HOST_PATH} — on station-b; must exist:" in header
    assert f"rsync -a --delete runtime/ <node>:{manifests.RUNTIME_HOST_PATH}/" in header
    assert f"#   {manifests.DUMPS_HOST_ROOT}/variant/agent — on station-b; created empty if missing:" in header
    assert f"#   {manifests.CACHE_HOST_ROOT}/variant/agent — on station-a, station-b;" in header
    assert "No memory limit" in header


def test_reference_header_lists_only_what_its_pods_mount() -> None:
    header = _manifest(RECIPE, REPO)[0].split("\n---\n")[0]
    assert "#   /srv/models/dsv41-flash-mxfp4 — on station-a, station-b; must exist:" in header
    assert manifests.RUNTIME_HOST_PATH not in header      # both stages all in HBM: no runtime


def test_docs_list_the_host_paths_the_code_mounts() -> None:
    doc = (REPO / "docs" / "multinode.md").read_text(encoding="utf-8")
    for path in (manifests.RUNTIME_HOST_PATH, manifests.HF_HUB_HOST_PATH,
                 f"{manifests.CACHE_HOST_ROOT}/<recipe>/<lane>", f"{manifests.DUMPS_HOST_ROOT}/<recipe>/<lane>",
                 f"rsync -a --delete runtime/ <node>:{manifests.RUNTIME_HOST_PATH}/",
                 manifests.METRICS_EMPTYDIR_LIMIT, "No memory limit is set"):
        assert path in doc, path


def test_metrics_emptydir_has_a_size_limit(tmp_path: Path) -> None:
    _text, docs = _manifest(_mixed_recipe(tmp_path), tmp_path)
    worker = _templates(docs)["worker"]
    env = {e["name"]: e.get("value") for e in worker["containers"][0]["env"]}
    mount = next(m for m in worker["containers"][0]["volumeMounts"]
                 if m["mountPath"] == env["PROMETHEUS_MULTIPROC_DIR"])
    volume = next(v for v in worker["volumes"] if v["name"] == mount["name"])
    assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": manifests.METRICS_EMPTYDIR_LIMIT}


@pytest.mark.parametrize("checkpoint", ["~/models/x", "./models/x", "a/b/c", "relative/../../etc"])
def test_a_checkpoint_without_one_host_path_is_refused_naming_file_and_field(
        checkpoint: str, tmp_path: Path) -> None:
    """The loader refuses these first (another engineer's change); `recipegen k8s` keeps a
    defensive refusal of its own, never mapping `~` to /root."""
    path = _recipe_with(tmp_path, "/data/models/x")
    text = path.read_text(encoding="utf-8")
    loaded = load_recipe(path)
    line = next(n for n, l in enumerate(text.splitlines(), 1) if l.startswith("  checkpoint:"))
    with pytest.raises(InputError) as caught:
        manifests._host_path(checkpoint, loaded)
    message = str(caught.value)
    assert f"{RECIPE}.yaml" in message and f":{line}" in message and "model.checkpoint" in message, message
    assert "/root" not in message
    with pytest.raises(RecipegenError, match="model.checkpoint"):   # without the recipe at hand
        manifests._host_path(checkpoint)


def test_an_absolute_checkpoint_is_its_host_path(tmp_path: Path) -> None:
    path = _recipe_with(tmp_path, "/data/models/x")
    header, docs = _manifest(path, tmp_path)
    volumes = _templates(docs)["leader"]["volumes"]
    assert {"name": "m0", "hostPath": {"path": "/data/models/x", "type": "Directory"}} in volumes
    assert "#   /data/models/x — on station-a, station-b; must exist:" in header


def test_check_says_when_everything_is_current(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    result = invoke("k8s", "--check", RECIPE)
    assert result.code == 0, result.output
    assert result.stdout == "up to date: 1 recipe (1 with multi-node lanes)\n"


def test_an_unchanged_manifest_is_reported_unchanged(project: Path) -> None:
    shutil.copy(REPO / "recipes" / f"{RECIPE}.yaml", project / "recipes")
    first = invoke("k8s", RECIPE)
    assert first.code == 0 and first.stdout == f"wrote k8s/{RECIPE}/agent.yaml: new\n", first.output
    second = invoke("k8s", RECIPE)
    assert second.code == 0 and second.stdout == f"k8s/{RECIPE}/agent.yaml: unchanged\n", second.output
    manifest = project / "k8s" / RECIPE / "agent.yaml"
    manifest.write_text(manifest.read_text() + "# a hand edit\n")
    third = invoke("k8s", RECIPE)
    assert third.stdout == f"wrote k8s/{RECIPE}/agent.yaml: rewritten (edited by hand since the last run)\n"
    assert invoke("k8s", "--check", RECIPE).code == 0


def test_a_hub_repo_checkpoint_mounts_roots_hub_cache(tmp_path: Path) -> None:
    """Compose's `${HF_HUB_CACHE:-~/.cache/huggingface/hub}` is the compose user's; on a node the
    pod mounts root's hub cache (a named constant, not a guess from `~`), and the header says so."""
    path = _recipe_with(tmp_path, "example-org/dsv41-flash")
    header, docs = _manifest(path, tmp_path)
    volumes = _templates(docs)["worker"]["volumes"]
    assert {"name": "m0", "hostPath": {"path": manifests.HF_HUB_HOST_PATH, "type": "Directory"}} in volumes
    assert f"#   {manifests.HF_HUB_HOST_PATH} — on station-a, station-b; must exist:" in header
    assert "example-org/dsv41-flash" in header
