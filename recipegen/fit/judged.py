"""A placement as the fit search judges it: the budgets one configuration breaks (`Problem`), the
configuration with the ledger's verdict (`Evaluation`), and a placement that fits (`Candidate`).
Types only, so that the search and the modules that rank its results share them one way."""

from __future__ import annotations

from dataclasses import dataclass

from recipegen.fit.objective import Projection
from recipegen.ledger.result import LaneLedger
from recipegen.schema import Lane


@dataclass(frozen=True)
class Problem:
    kind: str       # a ledger violation kind, or `sequences`
    message: str
    over_bytes: float | None = None   # by how much, where the budget is one of bytes

    def text(self) -> str:
        return f"[{self.kind}] {self.message}"


@dataclass(frozen=True)
class Evaluation:
    """One configuration of the lane, judged by the ledger."""

    lane: Lane
    ledger: LaneLedger
    problems: tuple[Problem, ...]

    @property
    def ok(self) -> bool:
        return not self.problems

    def kinds(self) -> set[str]:
        return {p.kind for p in self.problems}


@dataclass
class Candidate:
    """A placement where every budget holds, at its boundary."""

    placement: str
    evaluation: Evaluation
    hot_per_layer: int | None      # usage-aware only
    load_offload_gib: int          # vLLM --cpu-offload-gb at load (0: none)
    why: str                       # how the figures were chosen
    boundary: str                  # one step further and what breaks
    projection: Projection

    @property
    def lane(self) -> Lane:
        return self.evaluation.lane

    @property
    def kv_tokens(self) -> float:
        return self.evaluation.ledger.fig("kv.tokens").value
