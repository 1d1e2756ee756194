"""Checks that span fields: references between lanes, machines, classes and files.

Each returns every problem it finds as (field path, message), so one run lists them all.
"""

from __future__ import annotations

import os
from pathlib import Path

from recipegen.common.errors import one_line
from recipegen.common.paths import escaping_link
from recipegen.common.units import format_count
from recipegen.load.document import Problem
from recipegen.multinode.checks import parallel_problems
from recipegen.multinode.launch import launch_flags
from recipegen.schema.lane import Lane
from recipegen.schema.recipe import Recipe


def project_root_of(base_dir: Path) -> Path:
    """The project a recipe folder belongs to: the parent of the nearest `recipes/` above (or
    at) it; for a recipe kept elsewhere, the folder above the recipe's own (its maps may sit
    beside it, `../maps/`). Lexical (abspath): a link does not move the project."""
    folder = Path(os.path.abspath(base_dir))
    for candidate in (folder, *folder.parents):
        if candidate.name == "recipes":
            return candidate.parent
    return folder.parent


def inside_project(base_dir: Path, relative: str) -> bool:
    """True when `base_dir / relative` stays inside the recipe's project (no `../` out of it)."""
    root = project_root_of(base_dir)
    target = Path(os.path.normpath(os.path.join(os.path.abspath(base_dir), relative)))
    return target == root or root in target.parents

# Methods that draft with a drafter shipped inside the target checkpoint.
BUNDLED_DRAFTER_METHODS = ("dspark", "mtp", "deepseek_mtp")


def cross_reference_problems(recipe: Recipe, base_dir: Path) -> list[Problem]:
    problems: list[Problem] = []
    seen_names: dict[str, int] = {}
    seen_ports: dict[tuple[str, int], int] = {}
    for i, lane in enumerate(recipe.lanes):
        where = ("lanes", i)
        if lane.name in seen_names:
            problems.append(((*where, "name"), f"duplicate lane name {lane.name!r} "
                             f"(also lanes[{seen_names[lane.name]}])"))
        seen_names.setdefault(lane.name, i)

        machine = recipe.machines.get(lane.machine)
        if machine is None:
            problems.append(((*where, "machine"), f"unknown machine {lane.machine!r}; the recipe's "
                             f"machines are: {', '.join(sorted(recipe.machines))}"))
        else:
            for j, gpu in enumerate(lane.gpus):
                if gpu >= machine.gpus.count:
                    problems.append(((*where, "gpus", j), f"GPU id {gpu} does not exist on machine "
                                     f"{lane.machine!r} ({format_count(machine.gpus.count, 'GPU')}: ids 0.."
                                     f"{machine.gpus.count - 1})"))
            key = (lane.machine, lane.port)
            if key in seen_ports:
                problems.append(((*where, "port"), f"port {lane.port} on machine {lane.machine!r} is "
                                 f"already used by lanes[{seen_ports[key]}]"))
            seen_ports.setdefault(key, i)

        offload = lane.offload
        experts = recipe.model.routed_experts
        if offload.hot_experts_per_layer is not None and offload.hot_experts_per_layer > experts:
            problems.append(((*where, "offload", "hot_experts_per_layer"),
                             f"{offload.hot_experts_per_layer} hot experts per layer, but the model "
                             f"has {experts} routed experts per layer"))
        reserve = lane.reserves.hbm.back_solved_from
        if reserve is not None and reserve.hot_experts_per_layer > experts:
            problems.append(((*where, "reserves", "hbm", "back_solved_from", "hot_experts_per_layer"),
                             f"{reserve.hot_experts_per_layer} exceeds the model's {experts} experts"))

        spec = lane.speculative
        drafter = recipe.model.drafter
        if spec is not None and drafter is not None and spec.method in BUNDLED_DRAFTER_METHODS \
                and spec.method != drafter.method and not spec.model:
            problems.append(((*where, "speculative", "method"), f"method {spec.method!r} drafts with the "
                             f"model's bundled drafter, which is {drafter.method!r} for {recipe.model.name}"))
        if spec is not None and spec.method in BUNDLED_DRAFTER_METHODS and drafter is None and not spec.model:
            problems.append(((*where, "speculative", "method"), f"method {spec.method!r} needs a drafter: "
                             f"model {recipe.model.name} declares none (add model.drafter or "
                             "speculative.model)"))
        problems.extend(extra_args_problems(lane, where))
        problems.extend(_class_problems(recipe, i, base_dir))
        problems.extend(adaptive_problems(lane, ("lanes", i)))
        if lane.parallel is not None:
            problems.extend(parallel_problems(recipe, i))
    return problems


def _class_problems(recipe: Recipe, i: int, base_dir: Path) -> list[Problem]:
    lane = recipe.lanes[i]
    where: tuple[str | int, ...] = ("lanes", i)
    problems: list[Problem] = []
    usage_aware = lane.offload.placement == "usage-aware"
    # A budget that keeps every expert hot puts nothing in host: no row map to choose by.
    all_hot = lane.offload.hot_experts_per_layer == recipe.model.routed_experts
    if usage_aware and not lane.classes and not all_hot:
        problems.append(((*where, "classes"), "a usage-aware lane needs at least one traffic class "
                         "with a row map"))
    if lane.classes and lane.active_class is None:
        problems.append(((*where, "active_class"), "missing: name one of the declared classes ("
                         f"{', '.join(lane.classes)})"))
    if lane.active_class is not None and lane.active_class not in lane.classes:
        declared = ", ".join(lane.classes) or "none"
        problems.append(((*where, "active_class"), f"class {lane.active_class!r} is not declared "
                         f"in this lane's classes (declared: {declared})"))
    for name, cls in lane.classes.items():
        cpath = (*where, "classes", name)
        if usage_aware and cls.rowmap is None:
            problems.append(((*cpath, "rowmap"), "missing: a usage-aware lane's class needs a row map"))
        if not usage_aware and cls.rowmap is not None:
            problems.append(((*cpath, "rowmap"), "a positional lane has no row map (placement is "
                             "plain --cpu-offload-gb); set offload.placement: usage-aware"))
        for field in ("rowmap", "histogram"):
            rel = getattr(cls, field)
            if rel is None:
                continue
            path = (base_dir / rel)
            if Path(rel).is_absolute():
                problems.append(((*cpath, field), f"{rel!r} must be relative to the recipe file"))
            elif not inside_project(base_dir, rel):
                problems.append(((*cpath, field), f"{rel!r} leaves the project (the folder "
                                 "holding recipes/): keep maps and histograms inside it"))
            elif (link := escaping_link(project_root_of(base_dir), path)) is not None:
                problems.append(((*cpath, field), f"{rel!r} leaves the project through {link[0]}, a "
                                 f"symlink to {link[1]}: keep maps and histograms inside it"))
            elif not path.is_file():
                problems.append(((*cpath, field), f"file not found: {rel} (resolved to {path})"))
    return problems


def adaptive_problems(lane: Lane, where: tuple[str | int, ...]) -> list[Problem]:
    """Cross-field problems of `offload.adaptive`: placement, and priors naming classes with histograms."""
    adaptive = lane.offload.adaptive
    if adaptive is None:
        return []
    path = (*where, "offload", "adaptive")
    problems: list[Problem] = []
    if lane.offload.placement != "usage-aware":
        problems.append((path, "adaptive residency swaps rows of the usage-aware banks; positional "
                         "offload has none (set offload.placement: usage-aware or drop adaptive)"))
    for j, name in enumerate(adaptive.priors or []):
        if name not in lane.classes:
            declared = ", ".join(lane.classes) or "none"
            problems.append(((*path, "priors", j), f"class {name!r} is not declared in this lane's "
                             f"classes (declared: {declared})"))
        elif not lane.classes[name].histogram:
            problems.append(((*path, "priors", j), f"class {name!r} declares no histogram to use as "
                             "a prior"))
        elif name in adaptive.priors[:j]:  # type: ignore[index]
            problems.append(((*path, "priors", j), f"class {name!r} is listed twice"))
    return problems


def extra_args_problems(lane: Lane, where: tuple[str | int, ...]) -> list[Problem]:
    """`extra_args` as vLLM 0.33 reads them (`recipegen.vllm_flags.args`): a flag given twice,
    a spelling vLLM reads differently (`-O3`, `--flag.key`), one it lacks, a value it refuses —
    a flag that changes what the ledger budgets without the ledger reading it
    (`recipegen.ledger.flags.UNBUDGETED`), a flag the render builds from the recipe's own fields
    (`rendered_flag_problems`, the rule `render` applies, with a multi-node lane's launch flags,
    `recipegen.multinode.launch.launch_flags`) and a --max-num-batched-tokens below
    --max-num-seqs (`max_num_batched_tokens_problem`) — each at its own item of the list."""
    from recipegen.ledger.flags import (
        SAME_BYTES_DTYPES,
        UNBUDGETED,
        max_num_batched_tokens_problem,
        parsed_args,
        rendered_flag_problems,
    )

    parsed = parsed_args(list(lane.extra_args))
    # Each message quotes the flag as the recipe spells it: its line breaks and control characters
    # escaped, so a value cannot start a line of its own or move the cursor over the message.
    problems: list[Problem] = [((*where, "extra_args", index), one_line(message))
                               for index, message in parsed.problems]
    # the render's own flags, refused by the same rule `render` applies (one owner, ledger.flags),
    # with the flags a multi-node launch writes for this lane's topology (`launch_flags`); an item
    # refused here is not refused again as unbudgeted (`--nnodes` on a pipeline lane)
    rendered = rendered_flag_problems(lane.extra_args, launch_flags(lane.parallel))
    rendered_items = {index for index, _ in rendered}
    for canonical, (default, why) in UNBUDGETED.items():
        given = parsed.get(canonical)
        if given is None or given.index in rendered_items:
            continue
        value = given.value
        if canonical == "--dtype" and value in SAME_BYTES_DTYPES:
            continue
        if default is not None and value is not None and value.strip() == default:
            continue
        shown = f"{given.spelled[:40]}" + (f" {value[:40]}" if value is not None and "=" not in given.spelled else "")
        problems.append(((*where, "extra_args", given.index),
                         one_line(f"{shown}: the ledger does not budget {canonical}" +
                                  (f" other than {default}" if default is not None else "") + f" ({why})")))
    problems.extend(((*where, "extra_args", index), one_line(message)) for index, message in rendered)
    batched = max_num_batched_tokens_problem(lane.extra_args, lane.concurrency.max)
    if batched is not None:
        problems.append(((*where, "extra_args", batched[0]), batched[1]))
    return problems
