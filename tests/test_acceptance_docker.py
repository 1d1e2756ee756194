"""Parity/knee name the map they measured: the lane container is found on a real Docker engine.

A stand-in lane (busybox image whose `vllm` serves /v1 on loopback and prints the runtime's
start-up report) runs as the compose service `lane-accept` with host networking; the acceptance
identity finds it by the port the endpoint URL names and reads the report and hashes from its log.
"""

from __future__ import annotations

import asyncio
import time

import docker
import httpx
import pytest
from docker_support.fixtures import docker_engine  # noqa: F401
from docker_support.project import free_port
from docker_support.standin import STANDIN_TAG, build_standin_image
from expert_residency.formats import RowMap, format_report_line, report_for_rowmap

from recipegen.acceptance.client import EndpointClient
from recipegen.acceptance.identity import describe_endpoint

pytestmark = [pytest.mark.docker, pytest.mark.timeout(300)]


def test_identity_reads_the_lane_containers_startup_report(docker_engine, tmp_path, monkeypatch):  # noqa: F811
    client = docker.DockerClient(base_url=docker_engine.host)
    build_standin_image(client, [])
    rowmap = RowMap((0, 1), 8, [[0, 1, 2, 3, 4, 5]] * 2, [[6, 7]] * 2, {"builder": "test"})
    report = report_for_rowmap(rowmap, rank=0, mode="residency", vllm_version="0.33.0", runtime_version="0.1.0",
                               bytes_per_expert=1000, world_size=1, lane="accept", traffic_class="agent")
    (tmp_path / "report-agent.txt").write_text("INFO [worker_runtime.py:88] " + format_report_line(report) + "\n")
    (tmp_path / "kv_tokens-agent").write_text("4096")
    port = free_port()
    container = client.containers.run(
        STANDIN_TAG, ["tiny", "--port", str(port), "--served-model-name", "tiny-moe"], detach=True,
        network_mode="host", environment={"EXPERT_RESIDENCY_MODE": "residency", "EXPERT_RESIDENCY_CLASS": "agent",
                                          "EXPERT_RESIDENCY_LANE": "accept", "STANDIN_BOOT_S": "0"},
        labels={"com.docker.compose.project": "accept", "com.docker.compose.service": "lane-accept"},
        volumes={str(tmp_path): {"bind": "/standin", "mode": "ro"}})
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/v1/models", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        monkeypatch.setenv("DOCKER_HOST", docker_engine.host)

        async def identify() -> dict:
            async with EndpointClient(url) as endpoint:
                return await describe_endpoint(endpoint)

        info = asyncio.run(identify())
        assert info["models"][0]["id"] == "tiny-moe"
        assert info["content_hashes"] == [rowmap.content_hash()] and info["shape_hashes"] == [rowmap.shape_hash()]
        assert info["lane"] == "accept" and info["traffic_class"] == "agent"
        assert "service lane-accept, project accept" in info["lane_report_source"]

        async def other_port() -> dict:  # an endpoint no lane container serves: nothing attributed
            async with EndpointClient(f"http://127.0.0.1:{free_port()}") as endpoint:
                return await describe_endpoint(endpoint)

        assert "lane_reports" not in asyncio.run(other_port())
    finally:
        container.remove(force=True)
        client.close()
