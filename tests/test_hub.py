"""`recipegen new ORG/NAME[@revision]`: a Hugging Face id read through huggingface_hub's own code —
offline from a hub cache laid out as huggingface_hub lays it out (`models--org--name/refs`,
`snapshots/<commit>/…` linked to `blobs/`), and online from a local HTTP server standing in for
the hub's resolve endpoint (HF_ENDPOINT), answering as the hub does (X-Repo-Commit, ETag,
Content-Length, byte ranges). Each run is a fresh process: huggingface_hub reads HF_* at import."""

from __future__ import annotations

import hashlib
import json
import os
import struct
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

pytest.importorskip("huggingface_hub")

REPO = Path(__file__).resolve().parent.parent
FIX = REPO / "tests" / "fixtures" / "hf_configs"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
SHARD = "model-00001-of-00001.safetensors"


def tiny_checkpoint() -> dict[str, bytes]:
    """A one-layer, two-expert Mixtral-architecture checkpoint: config, index, one shard. Its
    non-expert tensors are 1,024 + 8,192 B (the embedding and one attention projection); each expert
    w1, w3 [32, 64] and w2 [64, 32] bf16, 12,288 B, as the config's geometry has it."""
    cfg = json.loads((FIX / "mixtral-8x7b-v0.1" / "config.json").read_text())
    cfg.update(num_hidden_layers=1, num_local_experts=2, vocab_size=8, hidden_size=64, intermediate_size=32,
               num_attention_heads=4, num_key_value_heads=2)
    tensors = {"model.embed_tokens.weight": ("BF16", [8, 64], 1024),
               "model.layers.0.self_attn.q_proj.weight": ("BF16", [64, 64], 8192),
               **{f"model.layers.0.block_sparse_moe.experts.{e}.{w}.weight": ("BF16", shape, 4096)
                  for e in (0, 1) for w, shape in (("w1", [32, 64]), ("w3", [32, 64]), ("w2", [64, 32]))}}
    header, offset = {}, 0
    for name, (dtype, shape, nbytes) in tensors.items():
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    blob = json.dumps(header).encode()
    shard = struct.pack("<Q", len(blob)) + blob + b"\x01" * offset
    index = {"metadata": {"total_size": offset}, "weight_map": {n: SHARD for n in tensors}}
    return {"config.json": json.dumps(cfg).encode(), "model.safetensors.index.json": json.dumps(index).encode(),
            SHARD: shard}


def hub_cache(root: Path, repo: str, files: dict[str, bytes]) -> Path:
    """The layout huggingface_hub writes: blobs by etag, snapshot entries linked to them, refs/main."""
    base = root / ("models--" + repo.replace("/", "--"))
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(COMMIT)
    for name, data in files.items():
        etag = hashlib.sha256(data).hexdigest()
        (base / "blobs").mkdir(exist_ok=True)
        (base / "blobs" / etag).write_bytes(data)
        link = base / "snapshots" / COMMIT / name
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(os.path.relpath(base / "blobs" / etag, link.parent))
    return root


def recipegen(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    clean.update(env, PYTHONPATH=f"{REPO}{os.pathsep}{REPO / 'runtime'}")
    return subprocess.run([sys.executable, "-m", "recipegen", *args], cwd=cwd, env=clean, capture_output=True,
                          text=True, timeout=300)


def test_offline_from_the_hub_cache(tmp_path: Path) -> None:
    cache = hub_cache(tmp_path / "hub", "acme/tiny-moe", tiny_checkpoint())
    env = {"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    out = recipegen(tmp_path, env, "new", "acme/tiny-moe", "--machine", "rtx-4090", "--max-model-len", "4096")
    assert out.returncode == 0, out.stdout + out.stderr
    model_file = tmp_path / "recipes" / "models" / "tiny-moe.yaml"
    doc = yaml.safe_load(model_file.read_text())
    assert doc["checkpoint"] == "acme/tiny-moe" and doc["revision"] == COMMIT
    assert doc["dense_bytes"]["value"] in (1024 + 8192, "9216 B")       # exact, from the shard header
    assert "shard header" in doc["dense_bytes"]["source"]
    assert str(tmp_path) not in model_file.read_text()                  # no temporary folder named
    recipe = yaml.safe_load((tmp_path / "recipes" / "tiny-moe-rtx-4090.yaml").read_text())
    assert recipe["model"] == {"file": "models/tiny-moe.yaml"}
    assert recipegen(tmp_path, env, "check", "budgets", "tiny-moe-rtx-4090").returncode == 0
    # the shard not in the cache: its header is not read offline, and the index's total stands in
    (cache / "models--acme--tiny-moe" / "snapshots" / COMMIT / SHARD).unlink()
    out = recipegen(tmp_path, env, "new", "acme/tiny-moe@" + COMMIT, "--machine", "rtx-4090",
                    "--max-model-len", "4096", "--name", "again", "--force")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "shard headers not read: offline and" in out.stdout
    doc = yaml.safe_load((tmp_path / "recipes" / "models" / "tiny-moe.yaml").read_text())
    assert doc["dense_bytes"]["value"] in (9216, "9216 B") and "metadata.total_size" in doc["dense_bytes"]["source"]


def test_offline_without_the_files_says_so(tmp_path: Path) -> None:
    env = {"HF_HUB_CACHE": str(tmp_path / "empty"), "HF_HUB_OFFLINE": "1"}
    out = recipegen(tmp_path, env, "new", "acme/absent-moe", "--machine", "rtx-4090")
    assert out.returncode == 2 and "HF_HUB_OFFLINE=1 and config.json is not in the hub cache" in out.stderr
    assert "Traceback" not in out.stderr and not (tmp_path / "recipes").exists()


def test_a_hub_host_that_does_not_resolve_reads_the_cache_at_once(tmp_path: Path) -> None:
    # RFC 6761: names under .invalid never resolve; without HF_HUB_OFFLINE the client would retry
    # the lookup five times before giving up
    endpoint = {"HF_ENDPOINT": "https://hub.example.invalid"}
    out = recipegen(tmp_path, {**endpoint, "HF_HUB_CACHE": str(tmp_path / "empty")},
                    "new", "acme/absent-moe", "--machine", "rtx-4090")
    assert out.returncode == 2, out.stdout + out.stderr
    assert "cannot reach https://hub.example.invalid (its host name hub.example.invalid does not resolve" in out.stderr
    assert "config.json is not in the hub cache" in out.stderr and "Retrying" not in out.stderr
    cache = hub_cache(tmp_path / "hub", "acme/tiny-moe", tiny_checkpoint())
    out = recipegen(tmp_path, {**endpoint, "HF_HUB_CACHE": str(cache)},
                    "new", "acme/tiny-moe", "--machine", "rtx-4090", "--max-model-len", "4096")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "read from the hub cache only: its host name hub.example.invalid does not resolve" in out.stdout
    assert "Retrying" not in out.stderr


class FakeHub(BaseHTTPRequestHandler):
    """The hub's resolve endpoint for one repository, as the hub answers it."""

    files: dict[str, bytes] = {}
    seen: list[tuple[str, str, str | None, str | None]] = []

    def log_message(self, *args) -> None:  # quiet
        pass

    def _file(self) -> tuple[str, bytes] | None:
        parts = self.path.split("?")[0].strip("/").split("/")
        # /acme/tiny-moe/resolve/<revision>/<file>
        if len(parts) != 5 or parts[:3] != ["acme", "tiny-moe", "resolve"] or parts[3] not in ("main", COMMIT):
            return None
        return parts[4], self.files.get(parts[4], b"")

    def _answer(self, body: bool) -> None:
        found = self._file()
        self.seen.append((self.command, self.path, self.headers.get("Range"), self.headers.get("Authorization")))
        if found is None or found[0] not in self.files:
            self.send_response(404)
            self.send_header("X-Error-Code", "EntryNotFound")
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        name, data = found
        start, end = 0, len(data) - 1
        status = 200
        if self.headers.get("Range"):
            lo, hi = self.headers["Range"].split("=")[1].split("-")
            start, end, status = int(lo), min(int(hi), len(data) - 1), 206
        part = data[start:end + 1]
        self.send_response(status)
        self.send_header("X-Repo-Commit", COMMIT)
        self.send_header("ETag", '"' + hashlib.sha256(data).hexdigest() + '"')
        self.send_header("Content-Length", str(len(part) if status == 206 or body else len(data)))
        if status == 206:
            self.send_header("Content-Range", f"bytes {start}-{end}/{len(data)}")
        self.end_headers()
        if body:
            self.wfile.write(part)

    def do_HEAD(self) -> None:  # noqa: N802
        self._answer(False)

    def do_GET(self) -> None:  # noqa: N802
        self._answer(True)


def test_online_through_the_hub_endpoint_reads_headers_by_range_only(tmp_path: Path) -> None:
    FakeHub.files = tiny_checkpoint()
    FakeHub.seen = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeHub)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        env = {"HF_ENDPOINT": f"http://127.0.0.1:{server.server_port}", "HF_HUB_CACHE": str(tmp_path / "cache"),
               "HF_TOKEN": "hf_testtokenvalue", "HF_HUB_DISABLE_TELEMETRY": "1"}
        out = recipegen(tmp_path, env, "new", "acme/tiny-moe", "--machine", "rtx-4090", "--max-model-len", "4096")
    finally:
        server.shutdown()
    assert out.returncode == 0, out.stdout + out.stderr
    doc = yaml.safe_load((tmp_path / "recipes" / "models" / "tiny-moe.yaml").read_text())
    assert doc["dense_bytes"]["value"] in (9216, "9216 B") and doc["revision"] == COMMIT
    shard_requests = [s for s in FakeHub.seen if s[1].endswith(SHARD)]
    assert shard_requests and all(s[0] == "GET" and s[2] is not None for s in shard_requests)   # ranges only
    assert all(s[3] == "Bearer hf_testtokenvalue" for s in FakeHub.seen)                       # HF_TOKEN sent
    assert any(s[1].endswith("hf_quant_config.json") for s in FakeHub.seen)                    # asked, 404
    # the hub cache holds the JSON files as huggingface_hub stores them, and no shard
    snap = tmp_path / "cache" / "models--acme--tiny-moe" / "snapshots" / COMMIT
    assert (snap / "config.json").is_file() and not (snap / SHARD).exists()
