"""`recipegen fit` (and `recipegen new`, which calls the same function): read the recipe, search
(`recipegen.fit.search`), build the row maps at the chosen count, write back, and say what was
chosen and why."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from recipegen.common.errors import InputError
from recipegen.common.units import GiB, format_bytes, format_count
from recipegen.fit.choice import not_chosen_text
from recipegen.fit.objective import Context
from recipegen.fit.rowmaps import (
    ClassHistogram,
    FileWrite,
    lane_histograms,
    map_writes,
    search_histogram,
    usage_aware_classes,
)
from recipegen.fit.search import USAGE_AWARE, FitOptions, FitResult, Inputs, fit_lane, host_in_use_text
from recipegen.fit.writeback import apply_fit, commit, dump, recipe_lock
from recipegen.load.recipe import LoadedRecipe, load_recipe_model, resolve_recipe_path
from recipegen.schema import Machine, Recipe

EXIT_FITTED, EXIT_NOTHING_FITS = 0, 1


@dataclass
class FitOutcome:
    """What a fit chose, changed and wrote."""

    recipe: str
    path: Path
    lane: str
    machine: str
    result: FitResult
    options: FitOptions
    hists: list[ClassHistogram] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    writes: list[FileWrite] = field(default_factory=list)
    text: str = ""
    dry_run: bool = False
    host_note: str = ""
    machine_key: str = ""   # the lane's key under `machines:`, where it is not the machine's own name

    @property
    def machine_text(self) -> str:
        """The machine as the header names it: the recipe's key for it, and the machine (a catalog
        id) where the two differ (`box (h200-pcie)`)."""
        return f"{self.machine_key} ({self.machine})" if self.machine_key not in ("", self.machine) else self.machine

    @property
    def fitted(self) -> bool:
        return self.result.chosen is not None

    @property
    def exit_code(self) -> int:
        return EXIT_FITTED if self.fitted else EXIT_NOTHING_FITS

    # -------------------------------------------------------------- output

    def lines(self) -> list[str]:
        r, c = self.result, self.result.chosen
        out = [f"fit {self.recipe} · lane {self.lane} · machine {self.machine_text}"
               + (" (dry run: nothing written)" if self.dry_run else "")]
        out.append(f"  context: max_model_len {r.max_model_len:,} — {r.context_why}")
        if self.host_note:
            out.append(f"  note: {self.host_note}")
        if c is None:
            out.append("  nothing fits:")
            out += [f"    {x.placement}: {x.reason}" for x in r.refusals]
            if r.suggestion:
                out.append(f"  smallest change that would: {r.suggestion}")
            return out
        ledger = c.evaluation.ledger
        fig = ledger.figures
        if c.placement == USAGE_AWARE:
            what = (f"usage-aware, {c.hot_per_layer} hot / {self.result_cold()} cold per layer, "
                    f"--cpu-offload-gb {c.load_offload_gib} at load")
        elif c.load_offload_gib:
            what = f"positional, --cpu-offload-gb {c.load_offload_gib}"
        else:
            what = "all in HBM (no --cpu-offload-gb)"
        out.append(f"  chose: {what}")
        out.append(f"    why: {c.why}")
        out.append(f"    boundary: {c.boundary}")
        out.append(f"    speed: {c.projection.text} ({c.projection.basis})")
        out.append(f"  HBM / GPU: hot experts {format_bytes(fig['hbm.hot_experts'].value)}, KV "
                   f"{format_bytes(fig['hbm.kv_pool'].value)} = {fig['kv.tokens'].display()} = "
                   f"{format_count(int(fig['kv.full_sequences'].value), 'full-length sequence')}; load peak "
                   f"{format_bytes(fig['load.hbm_peak'].value)} of {format_bytes(fig['hbm.capacity'].value)}")
        out.append(f"  host: {host_in_use_text(fig)}, load peak {format_bytes(fig['load.host_peak'].value)} "
                   f"of {format_bytes(fig['host.memory'].value)}")
        for other in r.candidates:
            if other is not c:
                out.append(f"  also fits: {other.placement} ({other.projection.text}); not chosen: "
                           f"{not_chosen_text(c, other)}")
        for refusal in r.refusals:
            out.append(f"  not {refusal.placement}: {refusal.reason}")
        if c.placement == USAGE_AWARE:
            for h in self.hists:
                out.append(f"  row map: class {h.name}: {h.rowmap_path}, top-{c.hot_per_layer} per layer of "
                           f"{h.origin()}")
        if not self.changed and not self.writes:
            out.append("  unchanged: the recipe already holds this fit")
        else:
            verb = "would change" if self.dry_run else "changed"
            if self.changed:
                out.append(f"  {verb}: " + "; ".join(self.changed))
            for w in self.writes:
                out.append(f"  {'would write' if self.dry_run else 'wrote'}: {w.path} ({w.what})")
        return out

    def result_cold(self) -> int:
        c = self.result.chosen
        assert c is not None and c.hot_per_layer is not None
        return c.evaluation.ledger.usage_aware.cold_per_layer[0]

    def to_json(self) -> dict[str, Any]:
        r, c = self.result, self.result.chosen
        out: dict[str, Any] = {
            "recipe": self.recipe, "path": str(self.path), "lane": self.lane, "machine": self.machine,
            "machine_key": self.machine_key or self.machine,
            "fitted": c is not None, "dry_run": self.dry_run, "max_model_len": r.max_model_len,
            "context": r.context_why, "min_sequences": self.options.min_sequences,
            "refusals": [{"placement": x.placement, "reason": x.reason} for x in r.refusals],
            "suggestion": r.suggestion or None, "changed": self.changed,
            "writes": [{"path": w.path, "what": w.what} for w in self.writes]}
        if c is not None:
            out["chosen"] = candidate_json(c)
            out["candidates"] = [candidate_json(x) for x in r.candidates]
            out["rowmaps"] = ([{"class": h.name, "rowmap": h.rowmap_path, "histogram": h.histogram_path,
                                "synthetic": h.synthetic} for h in self.hists] if c.placement == USAGE_AWARE else [])
            out["ledger"] = c.evaluation.ledger.to_json()
        return out


def candidate_json(c: Any) -> dict[str, Any]:
    fig = c.evaluation.ledger.figures
    return {"placement": c.placement, "hot_experts_per_layer": c.hot_per_layer,
            "load_cpu_offload_gib": c.load_offload_gib, "why": c.why, "boundary": c.boundary,
            "speed": c.projection.to_json(), "kv_tokens": fig["kv.tokens"].value,
            "kv_full_sequences": int(fig["kv.full_sequences"].value),
            "host_pinned_bytes": fig["host.cold_experts"].value, "host_total_bytes": fig["host.total"].value}


# ------------------------------------------------------------------ the function

def fit_recipe(recipe: str | Path, lane_name: str | None, options: FitOptions, *, dry_run: bool = False,
               text: str | None = None, machine: Machine | None = None) -> FitOutcome:
    """Fit one lane of `recipe` (a path or a name under recipes/) and write it back unless
    `dry_run`. `text`: the recipe's content when it is not written yet (`recipegen new`, which
    holds the lock and writes), at path `recipe`. `machine`: fit the lane onto this machine
    instead of its own (`compare`). A fit that writes holds the recipe's lock from its read to
    its write."""
    writes = not dry_run and text is None and machine is None
    # `dry_run` is only what the user asked (it is printed): `new` writes what this returns itself
    if not writes:
        return _fit(recipe, lane_name, options, dry_run=dry_run, text=text, machine=machine, write=False)
    with recipe_lock(resolve_recipe_path(recipe)):
        return _fit(recipe, lane_name, options, dry_run=False, text=None, machine=None, write=True)


def _fit(recipe: str | Path, lane_name: str | None, options: FitOptions, *, dry_run: bool, text: str | None,
         machine: Machine | None, write: bool) -> FitOutcome:
    loaded = load_recipe_model(recipe, text=text)
    path = loaded.path
    _cross_checks(loaded)
    source = text if text is not None else path.read_text(encoding="utf-8")
    index, lane = loaded.lane_at(lane_name, "to fit")
    if lane.parallel is not None:
        raise loaded.error("fit places one machine's lane; this lane spans several machines (pipeline "
                           "parallel): fit each stage's machine by hand (docs/multinode.md)", ("lanes", index, "parallel"))
    model = loaded.recipe.model
    if options.max_model_len and model.max_position_embeddings and \
            options.max_model_len > model.max_position_embeddings and \
            lane.env.get("VLLM_ALLOW_LONG_MAX_MODEL_LEN") != "1":
        raise InputError(f"{options.max_model_len:,} exceeds the model's max_position_embeddings "
                         f"{model.max_position_embeddings:,}: vLLM refuses it", field="--max-model-len")
    own_machine = loaded.recipe.machines[lane.machine]
    target = machine or own_machine
    if machine is not None:
        lane = lane.model_copy(update={"gpus": list(range(machine.gpus.count))})
    search_machine, host_note = _machine_for_search(loaded.recipe, index, target)
    hists = lane_histograms(loaded.recipe.name, path.parent, model, lane)
    chosen_hist = search_histogram(hists, lane)
    label = ("the SYNTHETIC default histogram" if chosen_hist.created else
             chosen_hist.histogram_path + (" (synthetic)" if chosen_hist.synthetic else ""))
    with usage_aware_classes(lane, hists) as (classes, active):
        speed_context = Context(loaded.recipe, path, classes, active)
        result = fit_lane(Inputs(model, search_machine, lane, chosen_hist.histogram, label, speed_context), options)
    outcome = FitOutcome(loaded.recipe.name, path, lane.name, target.name, result, options, hists,
                         dry_run=dry_run, text=source, host_note=host_note,
                         machine_key=lane.machine if machine is None else "")
    chosen = result.chosen
    if chosen is None:
        return outcome
    document = loaded.document
    concurrency = options.concurrency
    outcome.changed = apply_fit(document, index, loaded.recipe.name, chosen, hists, result.max_model_len,
                                concurrency)
    if chosen.placement == USAGE_AWARE:
        assert chosen.hot_per_layer is not None
        outcome.writes, _ = map_writes(path.parent, hists, chosen.hot_per_layer)
    new_text = dump(document) if outcome.changed else source
    if text is not None and new_text == source:
        new_text = source
    outcome.text = new_text
    if not write or (new_text == source and not outcome.writes):
        return outcome
    commit(path, new_text, outcome.writes)   # under the recipe's lock (fit_recipe)
    return outcome


# What the fit itself provides (a class, its map, the active class): not problems before it runs.
_FIT_PROVIDES = ("file not found", "a usage-aware lane needs at least one traffic class",
                 "missing: a usage-aware lane's class needs a row map", "missing: name one of the declared classes")


def _cross_checks(loaded: LoadedRecipe) -> None:
    """The recipe's cross-field checks (machines, GPUs, ports, classes), less what the fit is
    about to write: a map or histogram not there yet, a class or active class to add."""
    from recipegen.load.checks import cross_reference_problems
    from recipegen.load.document import problems_error

    problems = [(loc, message) for loc, message in cross_reference_problems(loaded.recipe, loaded.path.parent)
                if not message.startswith(_FIT_PROVIDES)]
    if problems:
        raise problems_error(loaded.path, loaded.document, problems)


def _machine_for_search(recipe: Recipe, index: int, machine: Machine) -> tuple[Machine, str]:
    """The machine the lane is fitted on, its host memory less what the recipe's other always-on
    lanes on the same machine plan to use (their declared budgets)."""
    from recipegen.ledger import compute_lane

    lane = recipe.lanes[index]
    others = [l for i, l in enumerate(recipe.lanes)
              if i != index and l.machine == lane.machine and l.profile is None and l.parallel is None]
    if not others or lane.profile is not None:
        return machine, ""
    used = sum(compute_lane(recipe.model, recipe.machines[l.machine], l).fig("host.total").value for l in others)
    left = max(0, int(machine.host_memory - used))
    note = (f"host memory for this lane: {format_bytes(left)} = {format_bytes(machine.host_memory)} less "
            f"{format_bytes(used)} that the always-on lanes {', '.join(l.name for l in others)} plan to use")
    return machine.model_copy(update={"host_memory": left}), note


def gib(value: float) -> str:
    return f"{value / GiB:,.2f} GiB"
