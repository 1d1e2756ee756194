"""`recipegen swap` on a lane that spans machines: refused, with the procedure that works (every
stage's engine is one vLLM group, so a class change restarts the lane on every machine; one
machine's compose project can neither do that nor roll it back). No container engine is needed:
the refusal comes before the tool talks to one."""

from __future__ import annotations

from pathlib import Path

from cli_support import invoke
from test_adaptive_k8s import _mixed_recipe


def test_swap_of_a_multi_node_lane_is_refused_naming_the_procedure(tmp_path: Path) -> None:
    path = _mixed_recipe(tmp_path)
    before = path.read_bytes()
    result = invoke("swap", str(path), "agent", "--class", "agent")   # no --machine: refused all the same
    line = next(n for n, text in enumerate(before.decode().splitlines(), 1) if text.strip() == "parallel:")
    assert result.code == 2, result.output
    assert result.stderr.startswith(f"error: {path}:{line}: field 'lanes[0].parallel': "
                                    "lane agent spans machines (station-a, station-b)"), result.stderr
    assert "--machine <machine>` on each of station-a, station-b" in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert path.read_bytes() == before   # the recipe untouched
