"""`plan`'s routing note explains r and E of the default skew where it prints the formula: r an
expert's popularity rank from 0, E the layer's routed experts. Checked by rebuilding the shares from
the printed formula and definitions and comparing them with the skew the estimate uses."""

from __future__ import annotations

import re

import numpy as np
from cli_support import invoke

from recipegen.costmodel.estimate import default_skew
from recipegen.load.recipe import load_recipe

RECIPE, LANE = "qwen3-235b-a22b-nvfp4-b200", "chat"   # its class has no histogram


def test_default_skew_note_defines_r_and_e():
    result = invoke("plan", RECIPE, LANE)
    assert result.code == 0, result.output
    note = next(l for l in result.output.splitlines() if "note: routing:" in l)
    formula = re.search(r"exp\(-(\d+(?:\.\d+)?) \(r/E\)\^(\d+(?:\.\d+)?)\)", note)
    assert formula, note
    assert re.search(r"\br = an expert's popularity rank \(0 = the most picked\)", note), note
    e = re.search(r"\bE = ([\d,]+), the layer's routed experts", note)
    assert e, note
    experts = int(e[1].replace(",", ""))
    assert experts == load_recipe(RECIPE).recipe.model.routed_experts
    a, b = float(formula[1]), float(formula[2])
    rank = np.arange(experts)
    shares = np.exp(-a * (rank / experts) ** b)
    np.testing.assert_allclose(shares / shares.sum(), default_skew(experts), rtol=1e-12)
