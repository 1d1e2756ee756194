"""Whether the fix a violation prints fits the lane's other budgets, before it is printed.

`verdict` and `load` name each lever they suggest as a `Fix`: its text, and the change to the lane
it stands for. `vetted` recomputes the lane as changed with `lane.compute_lane`, which hands itself
down as `recompute` (the ledger's own arithmetic, no second copy of a formula, and no import back
up to the module that calls this one) and keeps a fix only where the budget it is for then holds
and no other budget (HBM/KV at steady state, host, the load-time peaks) breaks or gets worse. A
lever that would break one is said with the budget and by how much; where none of them fits, the
line says so and points at `recipegen fit`, which searches placements and names the smallest
machine change.

The recomputed lanes are not checked again (`_inside`): their violations keep the text the
arithmetic gives.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from recipegen.common.units import format_bytes, format_tokens
from recipegen.ledger.result import LaneLedger, Violation
from recipegen.schema import Lane, Machine, Model

BUDGETS = ("hbm", "kv", "host", "load-hbm", "load-host", "runtime")
"""The budgets a fix is checked against: what `verdict` and `load` report, and whether the expert
residency runtime would take the lane (a switch to usage-aware placement runs its split, which some
experts' activations or formats cannot have: `runtime_check`)."""
RUNTIME_REFUSAL = re.compile(r"the expert residency runtime would refuse this lane at (boot|load): ")
HOST_SIDE = ("host", "load-host")
"""Budgets of host memory; the rest are of HBM. Every lever here moves experts between the two, so
one that breaks a budget on the side it moves them to breaks it further the further it goes."""

FIT_POINTER = "`recipegen fit RECIPE --dry-run` searches placements and names the smallest machine change"
FIT_SEARCH = "`recipegen fit RECIPE --dry-run` searches placements for one that fits every budget"

UNWORDED = "not worded: a lane computed only to check another fix"
"""The suggestion of a violation in a trial lane (`trial`), where finding the value costs a search."""

Recompute = Callable[..., LaneLedger]
"""`recipegen.ledger.lane.compute_lane`, as it passes itself to the verdict and the load figures."""

_inside: ContextVar[bool] = ContextVar("recipegen_fix_check_inside", default=False)


def trial() -> bool:
    """Whether this lane is a fix's trial: only which budgets it breaks, and by how much, are read;
    its own fixes are never printed, so a fix whose value takes a search need not be found."""
    return _inside.get()


@dataclass(frozen=True)
class Fix:
    """One lever of a violation's fix.

    `text`: as printed when it fits ("lower offload.load_cpu_offload to at most 45 GiB");
    `doing`: the same change as said when it does not ("lowering offload.load_cpu_offload to 45 GiB");
    `offload` / `lane`: the change to the lane's offload block / the lane itself. A fix with neither
    names no value to try ("lower hot experts per layer") and is printed as it is."""

    text: str
    doing: str = ""
    offload: dict[str, Any] = field(default_factory=dict)
    lane: dict[str, Any] = field(default_factory=dict)

    @property
    def checkable(self) -> bool:
        return bool(self.offload or self.lane)


def changed_lane(lane: Lane, fix: Fix) -> Lane:
    """The lane with `fix` applied."""
    update = dict(fix.lane)
    if fix.offload:
        update["offload"] = lane.offload.model_copy(update=fix.offload)
    return lane.model_copy(update=update)


def vetted(model: Model, machine: Machine, lane: Lane, kind: str, fixes: Sequence[Fix], printed: str, *,
           recompute: Recompute | None, rowmap_hot: Sequence[int] | None = None) -> str:
    """The suggestion to print for a `kind` violation of `lane`: `printed` (the fixes as the ledger
    words them together) where every one of `fixes` fits; else the ones that fit, each one that does
    not with the budget it would break, and where none fits, a pointer to `recipegen fit`.
    `recompute`: the lane computation (None: the fixes are printed unchecked); `rowmap_hot`: the
    active row map's hot counts, kept where a fix leaves the split as it is."""
    if recompute is None or trial() or not any(f.checkable for f in fixes):
        return printed
    lane_now: list[LaneLedger | None] = []

    def baseline() -> LaneLedger | None:
        if not lane_now:
            lane_now.append(_recompute(recompute, model, machine, lane, rowmap_hot))
        return lane_now[0]

    kept: list[Fix] = []
    refused: list[str] = []
    dead_end = True    # every refused lever breaks a budget on the side it moves experts to
    for fix in fixes:
        if not fix.checkable:
            kept.append(fix)
            continue
        keeps_split = not any(k in fix.offload for k in ("placement", "hot_experts_per_layer",
                                                           "cold_experts_budget"))
        after = _recompute(recompute, model, machine, changed_lane(lane, fix), rowmap_hot if keeps_split else None)
        broken = [] if after is None else _broken(kind, after, baseline, machine)
        if broken:
            refused.append(f"{fix.doing} would {_joined([words for _, words in broken])}")
            dead_end = dead_end and breaks_past_fixing(kind, [k for k, _ in broken])
        else:
            kept.append(fix)
    if not refused:
        return printed
    if kept:
        return f"{', or '.join(f.text for f in kept)}; {'; '.join(refused)}"
    if dead_end:
        return f"no single change to this lane fits this machine: {', and '.join(refused)}; {FIT_POINTER}"
    return f"{', and '.join(refused)}; {FIT_SEARCH}"


def breaks_past_fixing(kind: str, broken: Sequence[str]) -> bool:
    """Whether a lever for a `kind` violation that breaks the budgets `broken` cannot be saved by going
    less far: it breaks a budget on the side it moves experts to, or the runtime refuses the changed
    lane whatever the hot count ("runtime"). A refusal the lane lifts itself, an environment setting
    the runtime names ("runtime-lane"), is not past fixing, whichever side the violation is on."""
    return any(k == "runtime" or (k != "runtime-lane" and (k in HOST_SIDE) != (kind in HOST_SIDE))
               for k in broken)


def _recompute(recompute: Recompute, model: Model, machine: Machine, lane: Lane,
               rowmap_hot: Sequence[int] | None) -> LaneLedger | None:
    """`compute_lane` on `lane`, its own fixes left unchecked; None where the changed lane cannot be
    computed (the fix is then printed unchecked, as before: a check must not stop the report)."""
    token = _inside.set(True)
    try:
        return recompute(model, machine, lane, rowmap_hot=rowmap_hot,
                            rowmap_label="the lane's row map" if rowmap_hot is not None else None)
    except Exception:  # noqa: BLE001 - an unforeseen lane shape: keep the fix as the ledger words it
        return None
    finally:
        _inside.reset(token)


def _over_now(kind: str, now: LaneLedger | None, machine: Machine) -> float:
    """How far the lane as it stands is over the `kind` budget (0: within it). A load peak counts
    from its figure: the ledger does not report a load-time violation on a side already over at the
    end (`lane.compute_lane`), yet the peak is over all the same, and a fix that lowers it is not
    what puts it over."""
    if now is None:
        return 0.0
    said = [w.over_bytes or 0.0 for w in now.violations if w.kind == kind]
    if said:
        return said[0]
    peak_and_cap = {"load-hbm": ("load.hbm_peak", machine.gpus.usable),
                    "load-host": ("load.host_peak", machine.host_memory)}.get(kind)
    if peak_and_cap is None or peak_and_cap[0] not in now.figures:
        return 0.0
    key, cap = peak_and_cap
    return max(0.0, now.fig(key).value - cap)


def _broken(kind: str, after: LaneLedger, baseline: Callable[[], LaneLedger | None],
            machine: Machine) -> list[tuple[str, str]]:
    """What the changed lane breaks, (budget, in words) each (none: the fix fits): the `kind` budget
    the fix is for still over, or another budget over that was not, or further over than it is now."""
    said: list[tuple[str, str]] = []
    for v in after.violations:
        if v.kind not in BUDGETS:
            continue
        if v.kind == "runtime":
            now = baseline()
            if now is not None and any(w.kind == "runtime" for w in now.violations):
                continue   # refused already: not this fix's doing
        elif v.kind != kind:
            before = _over_now(v.kind, baseline(), machine)
            if before > 0 and (v.over_bytes or 0) <= before * (1 + 1e-9):
                continue   # over already, and no further: not this fix's doing
        # a refusal the lane can lift itself (an environment setting the runtime names) is not a dead end
        kind_said = "runtime-lane" if v.kind == "runtime" and "set env" in v.suggestion else v.kind
        said.append((kind_said, _words(v, after)))
    refusal = [s for s in said if s[0].startswith("runtime")]
    if len(refusal) > 1:   # one clause: "refuse the lane at load: A, and at load: B"
        kinds = {k for k, _ in refusal}
        words = refusal[0][1] + "".join(", and " + w.split(" refuse the lane ", 1)[1] for _, w in refusal[1:])
        refusal = [("runtime" if "runtime" in kinds else "runtime-lane", words)]
    return refusal or said   # a lane the runtime refuses: what else it would break is beside the point


def _joined(said: list[str]) -> str:
    """'put HBM 1 GiB over its cap and host memory 2 GiB over while loading': one 'put' for the lot."""
    return " and ".join(w[len("put "):] if i and w.startswith("put ") and said[i - 1].startswith("put ") else w
                        for i, w in enumerate(said))


def _words(v: Violation, after: LaneLedger) -> str:
    over = format_bytes(v.over_bytes or 0)
    if v.kind == "runtime":
        found = RUNTIME_REFUSAL.match(v.message)
        reason = v.message[found.end():] if found else v.message
        # whole, with its own remedy; the fix line joins levers with '; ', so its clauses are set apart
        reason = reason.replace("; ", " — ")
        return (f"make the expert residency runtime refuse the lane at {found.group(1)}: {reason}"
                if found else f"be refused at boot: {reason}")
    if v.kind == "kv":
        return (f"leave the KV pool {format_tokens(after.fig('kv.tokens').value)} tokens, less than one "
                f"max_model_len sequence ({int(after.fig('kv.max_model_len').value):,} tokens)")
    return {"hbm": f"put HBM {over} over its cap",
            "host": f"put host memory {over} over",
            "load-hbm": f"put HBM {over} over while loading",
            "load-host": f"put host memory {over} over while loading"}[v.kind]
