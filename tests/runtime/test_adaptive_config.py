"""The adaptive policy's parameters and byte budget, importable without torch (ledgers, schemas)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from expert_residency.core.adaptive_config import AdaptiveConfig, barrier_link_bytes, staging_bytes

RUNTIME = Path(__file__).resolve().parents[2] / "runtime"


def test_budget_by_hand():
    # DSv4.1-Flash: 18,800,640 B per MXFP4 expert, 40 MoE layers; 16 swaps per layer per barrier:
    # 2 * 18,800,640 * 16 * 40 = 24,064,819,200 B (24.06 GB); at 4 swaps a quarter of it
    assert barrier_link_bytes(AdaptiveConfig(), 18_800_640, 40) == 24_064_819_200
    assert barrier_link_bytes(AdaptiveConfig(swaps_per_layer=4), 18_800_640, 40) == 6_016_204_800
    assert barrier_link_bytes(AdaptiveConfig(swaps_per_layer=0), 18_800_640, 40) == 0
    assert staging_bytes(18_800_640) == 18_800_640 and staging_bytes(100, row_layouts=3) == 300


def test_config_and_setup_import_without_torch():
    code = ("import sys; sys.modules['torch'] = None\n"  # any torch import now fails
            "import expert_residency.core.adaptive_config, expert_residency.core.adaptive_setup as s\n"
            "assert s.parse_adaptive_spec('interval=8').interval == 8\n")
    done = subprocess.run([sys.executable, "-c", code], env={"PYTHONPATH": str(RUNTIME)},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    # and the check is real: the policy module itself does need torch
    bad = subprocess.run([sys.executable, "-c", "import sys; sys.modules['torch'] = None\n"
                          "import expert_residency.core.adaptive"], env={"PYTHONPATH": str(RUNTIME)},
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0 and "torch" in bad.stderr
