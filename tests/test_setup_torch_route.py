"""Where the test setup takes torch from (scripts/setup-lib.sh), with the real pip, offline.

Each case runs `torch_route` in bash with pip's configuration replaced by the case's own: a
find-links folder holding empty files named like wheels (`pip index versions` reads only the
names), an index on a loopback port that refuses connections, or a loopback HTTP server that
plays PyTorch's CPU index, or one that accepts connections and never answers. Claims:

* pip as configured listing torch==<pin>+cpu is the first route, named with where pip found it;
* otherwise a CPU index that lists it is the second, added as an extra index;
* otherwise the plain <pin> (PyPI's build) is the third, and the message names the CPU index
  and why it was not used;
* with none of them the setup stops, naming the wheel and the index to add;
* a probe of an index that never answers gives up after its timeout, once (no retries).
"""

from __future__ import annotations

import http.server
import os
import re
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PIN = re.search(r'^torch = \["torch==(.*)"\]', (REPO / "pyproject.toml").read_text(), re.MULTILINE).group(1)


def refused_url() -> str:
    """A loopback URL nothing listens on (connections are refused at once)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/simple"


def route(tmp_path: Path, *, find_links: list[str], index: str, cpu_index: str,
          probe_timeout_s: int = 5) -> subprocess.CompletedProcess[str]:
    links = tmp_path / "links"
    links.mkdir(exist_ok=True)
    for name in find_links:
        (links / name).write_bytes(b"")
    env = {
        "PATH": os.environ["PATH"], "HOME": str(tmp_path), "TMPDIR": str(tmp_path),
        "PIP_CONFIG_FILE": os.devnull,          # none of this machine's pip settings
        "PIP_FIND_LINKS": str(links), "PIP_INDEX_URL": index,
        "RECIPEGEN_PYTORCH_CPU_INDEX": cpu_index,
    }
    script = (f'. scripts/step.sh; . scripts/setup-lib.sh; PROBE_TIMEOUT_S={probe_timeout_s}; '
              f'torch_route "{sys.executable}" && echo "ROUTE=$RECIPEGEN_TORCH_ROUTE '
              f'REQ=$(torch_req) ARGS=$(torch_pip_args)"')
    return subprocess.run(["bash", "-c", script], check=False, cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=120)


@pytest.fixture
def cpu_index(tmp_path: Path) -> Iterator[str]:
    """A loopback simple index that lists torch-<pin>+cpu, as PyTorch's CPU index does."""
    root = tmp_path / "cpu-index"
    (root / "torch").mkdir(parents=True)
    name = f"torch-{PIN}%2Bcpu-py3-none-any.whl"
    (root / "torch" / "index.html").write_text(f'<html><body><a href="{name}">{name}</a></body></html>')

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def __init__(self, *a, **k):
            super().__init__(*a, directory=str(root), **k)

        def log_message(self, *a):  # keep pytest's output clean
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_configured_sources_first(tmp_path: Path) -> None:
    r = route(tmp_path, find_links=[f"torch-{PIN}+cpu-py3-none-any.whl", f"torch-{PIN}-py3-none-any.whl"],
              index=refused_url(), cpu_index=refused_url())
    assert r.returncode == 0, r.stderr
    assert f"ROUTE=configured REQ=torch=={PIN}+cpu ARGS=" in r.stdout
    assert f"torch-{PIN}%2Bcpu-py3-none-any.whl" in r.stderr    # where pip found it


def test_pytorch_cpu_index_second(tmp_path: Path, cpu_index: str) -> None:
    r = route(tmp_path, find_links=[f"torch-{PIN}-py3-none-any.whl"], index=refused_url(),
              cpu_index=cpu_index)
    assert r.returncode == 0, r.stderr
    assert f"ROUTE=pytorch-cpu-index REQ=torch=={PIN}+cpu ARGS=--extra-index-url {cpu_index}" in r.stdout


def test_same_version_from_pypi_third_and_says_why(tmp_path: Path) -> None:
    cpu = refused_url()
    r = route(tmp_path, find_links=[f"torch-{PIN}-py3-none-any.whl"], index=refused_url(), cpu_index=cpu)
    assert r.returncode == 0, r.stderr
    assert f"ROUTE=pypi REQ=torch=={PIN} ARGS=" in r.stdout
    assert f"{cpu} is unreachable from here" in r.stderr
    assert "Connection refused" in r.stderr


def test_no_route_names_the_wheel_and_the_index(tmp_path: Path) -> None:
    cpu = refused_url()
    r = route(tmp_path, find_links=[], index=refused_url(), cpu_index=cpu)
    assert r.returncode == 1
    assert "ROUTE=" not in r.stdout
    assert f"torch-{PIN}+cpu" in r.stderr
    assert f"pip config set global.extra-index-url {cpu}" in r.stderr
    assert "nothing was installed" in r.stderr


def test_an_index_that_never_answers_is_given_up_after_one_timeout(tmp_path: Path) -> None:
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)                      # accepts (in the kernel's backlog), never answers
    try:
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/simple"
        r = route(tmp_path, find_links=[], index=url, cpu_index=refused_url(), probe_timeout_s=2)
    finally:
        silent.close()
    assert r.returncode == 1
    assert f"{url}/torch/ (unreachable: no answer within 2.0 s)" in r.stderr
    log = Path(re.search(r"pip's log of the last probe: (\S+)\)", r.stderr).group(1)).read_text()
    assert "Retrying" not in log and "Retrying" not in r.stderr
