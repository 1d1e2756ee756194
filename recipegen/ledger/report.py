"""The human ledger of a recipe: each lane (`report_lane`, or `multinode_report` for a lane over
several machines), the machine-wide violations, and the verdict."""

from __future__ import annotations

from recipegen.ledger.multinode import MultiNodeLaneLedger
from recipegen.ledger.multinode_report import render_multinode_lane
from recipegen.ledger.report_lane import render_lane
from recipegen.ledger.result import RecipeLedger, placement_label


def render_ledger(ledger: RecipeLedger, path: str, *, explain: bool = False) -> str:
    out = [f"{ledger.recipe} ({path})"]
    for lane in ledger.lanes:
        if isinstance(lane, MultiNodeLaneLedger):  # a lane over several machines: one ledger per machine
            out.append(f"lane {lane.lane} · {len(lane.stages)} machines (pipeline parallel) · "
                       f"{placement_label(lane)}")
            out.append(render_multinode_lane(lane, explain=explain))
            continue
        out.append(f"lane {lane.lane} · machine {lane.machine} GPU {','.join(map(str, lane.gpus))} · "
                   f"{placement_label(lane)}")
        out.append(render_lane(lane, explain=explain))
    for v in ledger.machine_violations:
        out.append(f"OVER BUDGET [{v.kind}] machine {v.machine}: {v.message}")
        out.append(f"  → {v.suggestion}")
    out.append(f"verdict: {'OK' if ledger.ok else 'OVER BUDGET'} ({ledger.recipe})")
    return "\n".join(out) + "\n"
