"""A throwaway recipegen project for the engine tests: a two-lane variant of the reference
recipe (lanes `agent` on GPU 0 and `prose` on GPU 1 of a two-GPU station, the DESIGN's "one lane
per class" deployment), the reference's row maps and histograms, free loopback ports, and the
test compose override (no GPU reservation, host network, fast health checks, stand-in data)."""

from __future__ import annotations

import re
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "recipes" / "dsv41-flash-gb300.yaml"
NAME = "opstest"

OVERRIDE = """\
# Test override (tests only): the stand-in image has no GPU, no registry is reachable, the
# sandbox refuses to raise RLIMIT_MEMLOCK (so no `ulimits`), and traffic stays on loopback. Everything else (command, env, mounts, labels, health test) is
# exactly what `recipegen render` wrote.
services:
{services}
"""

SERVICE_OVERRIDE = """\
  {name}:
    deploy: !reset {{}}
    network_mode: host
    ports: !reset []
    ulimits: !reset {{}}
    healthcheck:
      interval: 1s
      timeout: 5s
      retries: 3
    volumes:
      - type: bind
        source: {standin}
        target: /standin
        read_only: true
    environment:
      STANDIN_FAIL_CLASSES: "{fail}"
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class TestProject:
    __test__ = False  # a helper, not a pytest test class

    root: Path
    recipe: Path
    ports: dict[str, int]

    @property
    def out_dir(self) -> Path:
        return self.root / "compose" / NAME

    @property
    def standin_dir(self) -> Path:
        return self.root / "standin"

    def write_override(self, *, fail_classes: str = "") -> Path:
        names = []
        for lane in self.ports:
            names += [f"lane-{lane}", f"lane-{lane}-profile"]
        body = "".join(SERVICE_OVERRIDE.format(name=n, standin=self.standin_dir, fail=fail_classes)
                       for n in names)
        path = self.root / "test-override.yaml"
        path.write_text(OVERRIDE.format(services=body.rstrip("\n")))
        return path


def make_project(root: Path) -> TestProject:
    """Write recipes/opstest.yaml (+ maps, profiles) under `root`."""
    recipes = root / "recipes"
    recipes.mkdir(parents=True)
    for sub in ("maps", "profiles"):
        shutil.copytree(REPO / "recipes" / sub, recipes / sub)
    text = REFERENCE.read_text()
    text = re.sub(r"(?m)^name: .*$", f"name: {NAME}", text, count=1)
    text = text.replace(
        "  station:\n    catalog: gb300-station\n",
        "  station:\n    catalog: gb300-station\n"
        "    gpus: {kind: GB300, count: 2, compute_capability: \"10.3\", hbm: 250.7 GiB,"
        " hbm_bandwidth: 4.2 TB/s}\n"
        "    host_memory: 1000 GiB\n")
    lane_start = text.index("  - name: agent")
    agent = text[lane_start:]
    prose = (agent.replace("  - name: agent ", "  - name: prose ")
             .replace("    gpus: [0]", "    gpus: [1]")
             .replace("    active_class: agent", "    active_class: prose"))
    ports = {"agent": free_port(), "prose": free_port()}
    agent = re.sub(r"(?m)^    port: \d+", f"    port: {ports['agent']}", agent)
    prose = re.sub(r"(?m)^    port: \d+", f"    port: {ports['prose']}", prose)
    text = text[:lane_start] + agent.rstrip("\n") + "\n" + prose
    recipe = recipes / f"{NAME}.yaml"
    recipe.write_text(text)
    (root / "standin").mkdir()
    (root / "models" / "dsv41-flash-mxfp4").mkdir(parents=True)
    return TestProject(root, recipe, ports)
