"""Kubernetes manifests of multi-node lanes: LeaderWorkerSet + leader Service, validated against
the vendored LWS CRD schema and kubernetes-validate's core schemas; committed output is current."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_support import invoke

from recipegen.k8s.render import render_k8s
from recipegen.k8s.validate import lws_schema_source, validate_manifest
from recipegen.load.recipe import load_recipe

REPO = Path(__file__).resolve().parents[1]
RECIPE = "dsv41-flash-gb300x2-pp2"


@pytest.fixture(scope="module")
def docs() -> list[dict[str, Any]]:
    files = render_k8s(load_recipe(RECIPE), REPO)
    assert list(files) == [REPO / "k8s" / RECIPE / "agent.yaml"]
    return list(yaml.safe_load_all(next(iter(files.values())).decode()))


def test_committed_manifests_are_current() -> None:
    result = invoke("k8s", RECIPE, "--check")
    assert result.code == 0, result.output


def test_leaderworkerset_shape(docs: list[dict[str, Any]]) -> None:
    lws, service = docs
    assert lws["kind"] == "LeaderWorkerSet" and service["kind"] == "Service"
    template = lws["spec"]["leaderWorkerTemplate"]
    assert template["size"] == 2 and template["restartPolicy"] == "RecreateGroupOnPodRestart"
    assert lws["spec"]["startupPolicy"] == "LeaderCreated"
    leader = template["leaderTemplate"]["spec"]["containers"][0]
    worker = template["workerTemplate"]["spec"]["containers"][0]
    flag = lambda args, name: args[args.index(name) + 1]  # noqa: E731
    assert flag(leader["args"], "--node-rank") == "0" and "--headless" not in leader["args"]
    assert flag(worker["args"], "--node-rank") == "$(LWS_WORKER_INDEX)" and "--headless" in worker["args"]
    for c in (leader, worker):
        assert flag(c["args"], "--master-addr") == "$(LWS_LEADER_ADDRESS)"
        assert flag(c["args"], "--pipeline-parallel-size") == "2"
        assert flag(c["args"], "--tensor-parallel-size") == "1"
        assert c["resources"]["limits"]["nvidia.com/gpu"] == 1
        host_ip = next(e for e in c["env"] if e["name"] == "VLLM_HOST_IP")
        assert host_ip["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    # Only the leader serves the API; the Service selects it.
    assert leader["ports"][0]["containerPort"] == 30006 and "ports" not in worker
    assert service["spec"]["selector"] == {"leaderworkerset.sigs.k8s.io/name": lws["metadata"]["name"],
                                           "role": "leader"}
    # Placement follows the recipe's machines.
    terms = lambda t: t["spec"]["affinity"]["nodeAffinity"][  # noqa: E731
        "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]["matchExpressions"][0]
    assert terms(template["leaderTemplate"])["values"] == ["station-a"]
    assert terms(template["workerTemplate"])["values"] == ["station-b"]


def test_manifests_validate(docs: list[dict[str, Any]]) -> None:
    assert [validate_manifest(d) for d in docs] == [[], []]


@pytest.mark.parametrize("mutate,expected", [
    (lambda d: d["spec"]["leaderWorkerTemplate"].update(sise=2), "'sise' was unexpected"),
    (lambda d: d["spec"]["leaderWorkerTemplate"].update(restartPolicy="Always"), "'Always' is not one of"),
    (lambda d: d["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
     .update(imagePullPolicyy="Always"), "'imagePullPolicyy' was unexpected"),
    (lambda d: d["spec"].update(replicas="one"), "'one' is not of type 'integer'"),
])
def test_lws_schema_is_strict(docs: list[dict[str, Any]], mutate: Any, expected: str) -> None:
    doc = copy.deepcopy(docs[0])
    mutate(doc)
    problems = validate_manifest(doc)
    assert problems and any(expected in p for p in problems), problems


def test_core_kinds_validate_strictly(docs: list[dict[str, Any]]) -> None:
    service = copy.deepcopy(docs[1])
    service["spec"]["ports"][0]["prot"] = 1
    assert validate_manifest(service)
    service = copy.deepcopy(docs[1])
    service["spec"]["ports"][0]["port"] = "http"
    assert validate_manifest(service)


def test_vendored_schema_records_its_source() -> None:
    source = lws_schema_source()
    assert source["repository"] == "https://github.com/kubernetes-sigs/lws"
    assert len(source["commit"]) == 40 and source["license"] == "Apache-2.0"


def test_single_machine_recipes_render_no_manifests() -> None:
    assert render_k8s(load_recipe("dsv41-flash-gb300"), REPO) == {}


def test_offloading_worker_mounts_its_slice_from_a_configmap(tmp_path: Path) -> None:
    """A lane whose stage 1 offloads (the v15 maps): the ConfigMap carries stage 1's slice and
    the worker's runtime expects exactly that slice's content hash."""
    from expert_residency.formats import parse_rowmap
    from test_multinode import _mixed_recipe

    path = _mixed_recipe(tmp_path)
    files = render_k8s(load_recipe(path), tmp_path)
    configmap, lws, _service = yaml.safe_load_all(next(iter(files.values())).decode())
    assert configmap["kind"] == "ConfigMap" and list(configmap["data"]) == ["stage-1.rowmap"]
    sliced = parse_rowmap(configmap["data"]["stage-1.rowmap"])
    assert sliced.moe_layer_indices == tuple(range(20, 40))
    worker = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env["EXPERT_RESIDENCY_MODE"] == "residency"
    assert env["EXPERT_RESIDENCY_CONTENT_HASH"] == sliced.content_hash()
    mount = next(m for m in worker["volumeMounts"] if m["name"] == "rowmaps")
    assert mount["subPath"] == "stage-1.rowmap" and mount["mountPath"] == env["EXPERT_RESIDENCY_ROWMAP"]
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    assert "EXPERT_RESIDENCY_MODE" not in {e["name"] for e in leader["env"]}   # stage 0: all in HBM
    assert validate_manifest(configmap) == [] and validate_manifest(lws) == []


def _three_stations(tmp_path: Path, *, offload: bool) -> Path:
    from test_multinode import _mixed_recipe

    path = _mixed_recipe(tmp_path)
    text = path.read_text()
    text = text.replace("    address: 10.0.0.2\n", "    address: 10.0.0.2\n  station-c:\n"
                        "    catalog: gb300-station\n    address: 10.0.0.3\n")
    text = text.replace("        - {machine: station-b, gpus: [0]}",
                        "        - {machine: station-b, gpus: [0]%s}\n"
                        "        - {machine: station-c, gpus: [0]%s}"
                        % (("", "") if offload else (", all_experts_in_hbm: true",) * 2))
    path.write_text(text)
    return path


def test_three_stages_one_worker_template(tmp_path: Path) -> None:
    files = render_k8s(load_recipe(_three_stations(tmp_path, offload=False)), tmp_path)
    lws, _service = yaml.safe_load_all(next(iter(files.values())).decode())
    assert lws["spec"]["leaderWorkerTemplate"]["size"] == 3
    worker = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]
    args = worker["spec"]["containers"][0]["args"]
    assert args[args.index("--pipeline-parallel-size") + 1] == "3"
    env = {e["name"]: e.get("value") for e in worker["spec"]["containers"][0]["env"]}
    assert env["VLLM_PP_LAYER_PARTITION"] == "13,14,13"          # vLLM's rule for 40 over 3
    values = worker["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"][0]["matchExpressions"][0]["values"]
    assert values == ["station-b", "station-c"]
    assert validate_manifest(lws) == []


def test_workers_with_different_slices_are_refused(tmp_path: Path) -> None:
    from recipegen.common.errors import InputError

    loaded = load_recipe(_three_stations(tmp_path, offload=True))
    with pytest.raises(InputError, match="one worker template"):
        render_k8s(loaded, tmp_path)
