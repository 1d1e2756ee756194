"""The stand-in vLLM image: a busybox rootfs imported with `docker import` (no registry, no pull).

Its `vllm` entry (standin/vllm) serves /health, /metrics and /v1 on loopback, prints start-up report
lines from /standin, answers the rendered python3 healthcheck, and dumps histograms on SIGUSR1.
"""

from __future__ import annotations

import io
import shutil
import tarfile
from pathlib import Path

import docker

HERE = Path(__file__).resolve().parent / "standin"
APPLETS = ("sh", "timeout", "cat", "cp", "mv", "rm", "mkdir", "sleep", "echo", "printf", "date", "wget", "nc",
           "grep", "sed", "head", "tr", "wc", "env", "ls", "kill", "id", "true", "false", "test", "[")
STANDIN_TAG = "recipegen-standin/vllm:local"


def _busybox() -> Path:
    for candidate in ("/bin/busybox", "/usr/bin/busybox"):
        if Path(candidate).is_file():
            return Path(candidate)
    found = shutil.which("busybox")
    if found is None:
        raise FileNotFoundError("busybox not installed (run scripts/setup-docker.sh)")
    return Path(found)


def rootfs_tar() -> bytes:
    """A minimal rootfs: static busybox, its applets as links, and the stand-in scripts."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        def add_dir(name: str, mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, mode
            tar.addfile(info)

        def add_file(name: str, data: bytes, mode: int = 0o755) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))

        for d in ("bin", "etc", "standin", "root"):
            add_dir(d)
        add_dir("tmp", 0o1777)
        add_file("bin/busybox", _busybox().read_bytes())
        for applet in APPLETS:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
        for script in ("vllm", "standin-http", "python3"):
            add_file(f"bin/{script}", (HERE / script).read_bytes())
        add_file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\n", 0o644)
        add_file("etc/group", b"root:x:0:\n", 0o644)
    return buf.getvalue()


def build_standin_image(client: docker.DockerClient, tags: list[str]) -> str:
    """Import the stand-in rootfs and tag it as each of `tags` (e.g. the rendered image name)."""
    repo, _, tag = STANDIN_TAG.rpartition(":")
    client.api.import_image_from_data(
        rootfs_tar(), repository=repo, tag=tag,
        changes=['ENTRYPOINT ["/bin/vllm", "serve"]', 'ENV PATH=/bin', 'WORKDIR /'],
    )
    image = client.images.get(STANDIN_TAG)
    for full in tags:
        name, _, t = full.rpartition(":") if ":" in full.rsplit("/", 1)[-1] else (full, "", "latest")
        image.tag(name, t or "latest")
    return image.id
