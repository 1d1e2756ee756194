"""The budget ledger: pure functions, the single source of every budget formula.

`compute_ledger(loaded_recipe) -> RecipeLedger`: per lane, HBM (cap, reserve, hot experts, KV pool
and tokens), host (tables, pinned experts, reserve), both placements (positional vs usage-aware)
and load-time peaks; every figure in bytes with its formula and operands; violations with what to
change. See docs/ledger.md.

Modules, imports one way: `result` (the returned data) ← `fix_check` (whether a suggested change
fits the other budgets; `compute_lane` is handed down to it) ← `reserves`, `placements`, `verdict`,
`load`, `workspace` (the runtime's start-up HBM) (one part of a lane's figures each) ← `lane` (`compute_lane`) ← `multinode` (a lane over
several machines: `compute_lane` per stage) ← `recipe` (`compute_ledger`, shared budgets). The
human text: `report_lane` ← `multinode_report` ← `report`.
"""

from recipegen.ledger.budget import DeclaredSplit, declared_split
from recipegen.ledger.figures import Figure
from recipegen.ledger.lane import compute_lane
from recipegen.ledger.placement import positional_walk, rehoming_peaks
from recipegen.ledger.recipe import compute_ledger, concurrent_total
from recipegen.ledger.result import LaneLedger, PlacementLedger, RecipeLedger, Violation

__all__ = ["DeclaredSplit", "declared_split", "LaneLedger", "PlacementLedger", "RecipeLedger",
           "Violation", "compute_lane", "compute_ledger", "concurrent_total", "Figure", "positional_walk", "rehoming_peaks"]
