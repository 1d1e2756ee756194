"""A read-only image registry on loopback for the engine tests: the stand-in image as one
gzipped layer, served over the registry HTTP API v2 (the subset `docker pull` uses: the version
check, manifests and blobs by digest), so Compose really pulls it — its pull progress included.

dockerd treats 127.0.0.0/8 as an insecure registry by default, so plain HTTP works without any
daemon setting. `pace_s` stretches each layer's download over about that many seconds (sent in
chunks), so the pull lasts long enough to show progress.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import platform
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from docker_support.standin import rootfs_tar

MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
LAYER_TYPE = "application/vnd.docker.image.rootfs.diff.tar.gzip"


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _arch() -> str:
    machine = platform.machine().lower()
    return {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}.get(machine, machine)


def standin_blobs() -> tuple[bytes, dict[str, bytes]]:
    """(manifest, blobs by digest) of the stand-in image: entrypoint `vllm serve`, PATH=/bin."""
    tar = rootfs_tar()
    layer = gzip.compress(tar, compresslevel=6, mtime=0)
    config = json.dumps({
        "architecture": _arch(), "os": "linux",
        "config": {"Entrypoint": ["/bin/vllm", "serve"], "Env": ["PATH=/bin"], "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [_digest(tar)]},
        "history": [{"created_by": "recipegen tests: busybox stand-in for vllm serve"}],
    }, sort_keys=True).encode()
    manifest = json.dumps({
        "schemaVersion": 2, "mediaType": MANIFEST_TYPE,
        "config": {"mediaType": CONFIG_TYPE, "size": len(config), "digest": _digest(config)},
        "layers": [{"mediaType": LAYER_TYPE, "size": len(layer), "digest": _digest(layer)}],
    }, sort_keys=True).encode()
    return manifest, {_digest(config): config, _digest(layer): layer}


class LocalRegistry:
    """Serves `repository:tag` → the stand-in image on 127.0.0.1 (a free port)."""

    def __init__(self, repository: str, tag: str, *, pace_s: float = 0.0) -> None:
        self.repository, self.tag, self.pace_s = repository, tag, pace_s
        self.manifest, self.blobs = standin_blobs()
        self.pulls: list[str] = []          # paths requested, in order (for the tests' checks)
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:  # quiet
                pass

            def _send(self, status: int, body: bytes, ctype: str, paced: bool = False) -> None:
                self.send_response(status)
                self.send_header("Content-Type", ctype)
                self.send_header("Content-Length", str(len(body)))
                self.send_header("Docker-Distribution-API-Version", "registry/2.0")
                if status == 200 and ctype != "application/json":
                    self.send_header("Docker-Content-Digest", _digest(body))
                self.end_headers()
                if self.command == "HEAD":
                    return
                if not paced or registry.pace_s <= 0:
                    self.wfile.write(body)
                    return
                chunks = 20
                step = max(1, -(-len(body) // chunks))
                for i in range(0, len(body), step):
                    self.wfile.write(body[i:i + step])
                    self.wfile.flush()
                    time.sleep(registry.pace_s / chunks)

            def _route(self) -> None:
                registry.pulls.append(f"{self.command} {self.path}")
                path = self.path.split("?", 1)[0]
                if path in ("/v2/", "/v2"):
                    return self._send(200, b"{}", "application/json")
                prefix = f"/v2/{registry.repository}/"
                if path.startswith(prefix + "manifests/"):
                    ref = path[len(prefix + "manifests/"):]
                    if ref in (registry.tag, _digest(registry.manifest)):
                        return self._send(200, registry.manifest, MANIFEST_TYPE)
                elif path.startswith(prefix + "blobs/"):
                    blob = registry.blobs.get(path[len(prefix + "blobs/"):])
                    if blob is not None:
                        return self._send(200, blob, "application/octet-stream", paced=True)
                self._send(404, b'{"errors":[{"code":"NAME_UNKNOWN","message":"not here"}]}',
                           "application/json")

            do_GET = do_HEAD = _route

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])

    @property
    def image(self) -> str:
        return f"127.0.0.1:{self.port}/{self.repository}:{self.tag}"

    def start(self) -> LocalRegistry:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
