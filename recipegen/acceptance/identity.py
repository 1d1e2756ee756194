"""What an endpoint is: served models, vLLM version and, for a recipegen lane, its start-up report.

A result names the map it measured. The start-up report (one `EXPERT_RESIDENCY_REPORT` line
per worker, `expert_residency.formats.report`) carries the row map's content and shape
hashes; it is read from a log file the user names (`--lane-log`), or, for an endpoint on
this host, from the log of the local Docker container of a `lane-*` compose service that
publishes (or listens on) the endpoint's port.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx
from expert_residency.formats import FormatError, find_report_lines

from recipegen.acceptance.client import EndpointClient, EndpointError, EndpointUnreachable
from recipegen.common.errors import InputError
from recipegen.schema.lane import LANE_SERVICE_PREFIX

LOCAL_HOSTS = {"127.0.0.1", "localhost", "0.0.0.0", "::1"}


async def describe_endpoint(client: EndpointClient, *, lane_log: Path | None = None,
                            look_in_docker: bool = True, strict: bool = False) -> dict[str, Any]:
    """Models, server version and (when found) the lane's start-up reports and hashes.

    These are a run's first requests, each with the short identity timeout
    (`timeouts.IDENTITY_TIMEOUT_S`). An endpoint that does not answer at all (`EndpointUnreachable`)
    is noted and not asked again, or, with `strict` (the commands), ends the run here, as does a
    failed /v1/models when no model was named; other HTTP errors are noted."""
    info: dict[str, Any] = {"url": client.base_url}
    answered = True
    try:
        models = await client.models()
        info["models"] = [{k: m.get(k) for k in ("id", "root", "max_model_len", "owned_by") if k in m}
                          for m in models]
        if any(m.get("owned_by") == "vllm" for m in models):   # vLLM's model cards say owned_by "vllm"
            info["server"] = "vLLM"
    except EndpointError as exc:
        unanswered = isinstance(exc, EndpointUnreachable)
        if strict and (unanswered or client.model_name is None):   # nothing can be sent
            raise
        info["models_error"] = str(exc)
        answered = not unanswered
    if answered:
        try:
            version = await client.get_json("/version")
            if isinstance(version, dict) and "version" in version:
                info["server_version"] = version["version"]
        except EndpointUnreachable:
            if strict:
                raise
        except EndpointError:
            pass
    log_text, where = None, None
    if lane_log is not None:
        try:
            log_text, where = lane_log.read_text(encoding="utf-8", errors="replace"), f"log file {lane_log}"
        except OSError as exc:
            raise InputError(f"cannot read lane log: {exc}", file=str(lane_log)) from None
    elif look_in_docker:
        log_text, where = _docker_lane_log(client.base_url)
    if log_text is not None:
        info.update(_reports(log_text, where or "log"))
    return info


def _reports(log_text: str, where: str) -> dict[str, Any]:
    try:
        reports = find_report_lines(log_text)
    except FormatError as exc:
        return {"lane_report_source": where, "lane_report_error": str(exc)}
    if not reports:
        return {"lane_report_source": where, "lane_report_error": "no start-up report in the log "
                "(not a recipegen lane, or the runtime is off)"}
    latest: dict[int, Any] = {}
    for report in reports:  # the last boot's report per worker rank
        latest[report.rank] = report
    chosen = [latest[rank] for rank in sorted(latest)]
    return {
        "lane_report_source": where,
        "lane_reports": [asdict(r) for r in chosen],
        "content_hashes": sorted({r.content_hash for r in chosen if r.content_hash}),
        "shape_hashes": sorted({r.shape_hash for r in chosen if r.shape_hash}),
        "lane": next((r.lane for r in chosen if r.lane), None),
        "traffic_class": next((r.traffic_class for r in chosen if r.traffic_class), None),
        "residency_mode": sorted({r.mode for r in chosen}),
    }


def _docker_lane_log(base_url: str) -> tuple[str | None, str | None]:
    """The log of the local lane container serving `base_url`'s port, if Docker knows one."""
    url = httpx.URL(base_url)
    if url.host not in LOCAL_HOSTS:
        return None, None
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        import docker  # optional at run time; the ops extra ships it

        client = docker.from_env(timeout=5)
        containers = client.containers.list(filters={"label": "com.docker.compose.service"})
    except Exception:  # no engine, no socket, no permission: simply not identifiable
        return None, None
    try:
        for container in containers:
            labels = container.labels or {}
            service = labels.get("com.docker.compose.service", "")
            if not service.startswith(LANE_SERVICE_PREFIX):
                continue
            if _serves_port(container.attrs, port):
                logs = container.logs(stdout=True, stderr=True).decode("utf-8", errors="replace")
                project = labels.get("com.docker.compose.project", "?")
                return logs, f"container {container.name} (service {service}, project {project})"
    except Exception:
        return None, None
    finally:
        client.close()
    return None, None


def _serves_port(attrs: dict[str, Any], port: int) -> bool:
    ports = ((attrs.get("NetworkSettings") or {}).get("Ports") or {})
    for bindings in ports.values():
        for binding in bindings or []:
            if str(binding.get("HostPort")) == str(port):
                return True
    if ((attrs.get("HostConfig") or {}).get("NetworkMode")) == "host":
        args = [str(a) for a in ((attrs.get("Config") or {}).get("Cmd") or [])]
        for i, arg in enumerate(args):
            if arg == "--port" and i + 1 < len(args) and args[i + 1] == str(port):
                return True
            if arg == f"--port={port}":
                return True
    return False
