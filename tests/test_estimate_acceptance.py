"""A lane's measured speculative acceptance (`speculative.acceptance`): used by the decode
estimate, overridden by `recipegen plan --acceptance`, refused with its field when it cannot be."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from cli_support import invoke

from recipegen.costmodel.lane_estimate import DEFAULT_ACCEPTANCE, estimate_lane
from recipegen.load.recipe import load_recipe


def test_the_recipe_acceptance_is_used_and_the_command_line_overrides_it():
    loaded = load_recipe("dsv41-flash-gb300")
    assert loaded.recipe.lane("agent").speculative.acceptance.mean_length == 2.13
    est = estimate_lane(loaded, "agent", streams=[1])
    assert est.acceptance == pytest.approx(DEFAULT_ACCEPTANCE, abs=5e-5)   # 2.13 tokens at k=5
    assert "speculative.acceptance" in est.acceptance_source
    assert est.point(1).tokens_per_step == pytest.approx(2.13, abs=1e-6)
    given = estimate_lane(loaded, "agent", streams=[1], acceptance=0.8)
    assert given.acceptance == 0.8 and "--acceptance" in given.acceptance_source
    # 1 + 0.8 + 0.64 + 0.512 + 0.4096 + 0.32768
    assert given.point(1).tokens_per_step == pytest.approx(3.68928)


def _write(tmp_path: Path, source: str, old: str, new: str) -> Path:
    text = (Path("recipes") / f"{source}.yaml").read_text()
    assert old in text
    out = tmp_path / f"{source}.yaml"
    out.write_text(text.replace(old, new, 1))
    for sub in ("maps", "profiles", "models"):
        shutil.copytree(Path("recipes", sub), tmp_path / sub)   # a link out of the project is refused
    return out


def test_acceptance_rate_in_the_recipe(tmp_path):
    path = _write(tmp_path, "dsv41-flash-gb300", "        mean_length: 2.13\n        k: 5\n",
                  "        rate: 0.6\n")
    est = estimate_lane(load_recipe(str(path)), "agent", streams=[1])
    assert est.acceptance == 0.6
    assert est.point(1).tokens_per_step == pytest.approx(1 + 0.6 + 0.36 + 0.216 + 0.1296 + 0.07776)


@pytest.mark.parametrize(("new", "field", "message"), [
    ("        mean_length: 6\n        k: 5\n", "mean_length", "at most k + 1"),
    ("        mean_length: 2.13\n", "k", "needs the k"),
    ("        rate: 0.6\n        k: 5\n", "k", "rate needs none"),
    ("        rate: 0.6\n        mean_length: 2.13\n        k: 5\n", "rate", "exactly one"),
    ("        rate: 1.2\n", "rate", "less than 1"),
])
def test_a_bad_acceptance_is_refused_naming_the_field(tmp_path, new, field, message):
    path = _write(tmp_path, "dsv41-flash-gb300", "        mean_length: 2.13\n        k: 5\n", new)
    result = invoke("check", "recipe", str(path))
    assert result.code == 2, result.output
    text = result.output + result.stderr
    assert f"{path.name}:" in text and f"acceptance.{field}" in text and message in text, text
    assert "Traceback" not in text


def test_the_acceptance_needs_a_source(tmp_path):
    path = _write(tmp_path, "dsv41-flash-gb300", "        source: \"the field report 'vLLM: Pin Hot Experts' "
                  "(2026-09-17): v14 C1", "        note: \"v14 C1")
    result = invoke("check", "recipe", str(path))
    assert result.code == 2 and "acceptance" in result.output + result.stderr
