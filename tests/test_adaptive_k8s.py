"""Kubernetes manifests of an adaptive multi-node lane: the prior histograms travel in the lane's
ConfigMap beside the row-map slices and are mounted where the runtime's environment says; a lane
whose ConfigMap would exceed Kubernetes' 1 MiB is refused naming the recipe's file, line and field
(exit 2 from the CLI, nothing written)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from cli_support import invoke
from expert_residency.contract.env import ADAPTIVE as ENV_ADAPTIVE
from expert_residency.contract.env import ADAPTIVE_PRIORS as ENV_PRIORS
from expert_residency.core.adaptive_config import AdaptiveConfig
from expert_residency.core.adaptive_setup import format_adaptive_spec
from test_multinode import _mixed_recipe

from recipegen.common.errors import InputError
from recipegen.k8s import manifests
from recipegen.k8s.render import render_k8s
from recipegen.k8s.validate import validate_manifest
from recipegen.load.recipe import load_recipe


def _adaptive_recipe(tmp_path: Path, spec: str = "adaptive: {}") -> Path:
    """The two-Station lane whose stage 1 offloads (the v15 agent map), with adaptive residency."""
    path = _mixed_recipe(tmp_path)
    text = path.read_text()
    assert text.count("      load_cpu_offload: 60 GiB\n") == 1
    path.write_text(text.replace("      load_cpu_offload: 60 GiB\n",
                                 f"      load_cpu_offload: 60 GiB\n      {spec}\n"))
    return path


def _documents(tmp_path: Path, path: Path) -> list[dict]:
    files = render_k8s(load_recipe(path), tmp_path)
    return list(yaml.safe_load_all(next(iter(files.values())).decode()))


def test_priors_ride_in_the_configmap_and_mount_where_the_runtime_looks(tmp_path: Path) -> None:
    path = _adaptive_recipe(tmp_path)
    configmap, lws, service = _documents(tmp_path, path)
    histogram = (path.parent / "profiles/dsv41-flash/agent.hist").read_text()
    assert sorted(configmap["data"]) == ["prior-agent.hist", "stage-1.rowmap"]
    assert configmap["data"]["prior-agent.hist"] == histogram          # the file, byte for byte
    worker = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    env = {e["name"]: e.get("value") for e in worker["env"]}
    assert env[ENV_ADAPTIVE] == format_adaptive_spec(AdaptiveConfig())   # `adaptive: {}`: defaults
    targets = env[ENV_PRIORS].split(",")
    assert len(targets) == 1
    mount = next(m for m in worker["volumeMounts"] if m["mountPath"] == targets[0])
    assert (mount["name"], mount["subPath"], mount["readOnly"]) == ("rowmaps", "prior-agent.hist", True)
    leader = lws["spec"]["leaderWorkerTemplate"]["leaderTemplate"]["spec"]["containers"][0]
    assert ENV_ADAPTIVE not in {e["name"] for e in leader["env"]}      # stage 0 holds every expert in HBM
    assert all(validate_manifest(d) == [] for d in (configmap, lws, service))


def test_counts_only_adaptive_lane_mounts_no_priors(tmp_path: Path) -> None:
    configmap, lws, _service = _documents(tmp_path, _adaptive_recipe(tmp_path, "adaptive: {priors: []}"))
    assert list(configmap["data"]) == ["stage-1.rowmap"]
    worker = lws["spec"]["leaderWorkerTemplate"]["workerTemplate"]["spec"]["containers"][0]
    names = {e["name"] for e in worker["env"]}
    assert ENV_ADAPTIVE in names and ENV_PRIORS not in names


def test_a_configmap_over_the_limit_is_refused_at_the_adaptive_field(tmp_path: Path, monkeypatch) -> None:
    path = _adaptive_recipe(tmp_path)
    line = path.read_text().splitlines().index("      adaptive: {}") + 1
    # the slice (~30 kB) and one histogram (~62 kB) fit 1 MiB; a 64 kB limit does not hold both
    monkeypatch.setattr(manifests, "CONFIGMAP_LIMIT_BYTES", 64_000)
    with pytest.raises(InputError) as info:
        render_k8s(load_recipe(path), tmp_path)
    err = info.value
    assert (Path(err.file).name, err.line, err.field) == (path.name, line, "lanes[0].offload.adaptive.priors")
    assert "more than a Kubernetes ConfigMap holds (64,000 B)" in str(err)
    result = invoke("k8s", str(path))
    assert result.code == 2 and f"{path.name}:{line}" in result.output, result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "k8s").exists()
