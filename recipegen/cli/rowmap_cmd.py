"""`recipegen rowmap …`: build, evaluate, compare, diff and show row maps (thin layer)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import click

from recipegen.cli.types import FiniteFloat
from recipegen.common.errors import InputError
from recipegen.common.units import format_count

GEOMETRY_HELP = ("Model geometry for capture files: --recipe R, or --experts E "
                 "[--layers 0-39] [--top-k K].")


def _geometry_options(func: Any) -> Any:
    func = click.option("--recipe", help="Recipe (name under recipes/ or path): model geometry "
                        "and bytes per expert.")(func)
    func = click.option("--experts", type=int, help="Routed experts per MoE layer.")(func)
    func = click.option("--layers", help="MoE layer indices, e.g. 0-39, with --experts (default from "
                        "capture files: their layer axis; without them required).")(func)
    func = click.option("--bytes-per-expert", "bytes_per_expert",
                        help="Bytes of one routed expert, e.g. 18800640 or '17.93 MiB'.")(func)
    return func


def _decode_only_option(func: Any) -> Any:
    return click.option("--decode-only", is_flag=True,
                        help="From vLLM captures count only decode rows (responses must carry "
                             "usage or token_ids); the field reports' histograms are decode-only.")(func)


# A size on the command line: at most 1 EiB (19 digits of bytes), and no longer than any way of
# writing one ('1,152,921,504,606,846,976 B'): checked before int() or a float sees the digits.
_MAX_SIZE_CHARS = 48
_PLAIN_BYTES = re.compile(r"[0-9]+")


def _parse_size(text: str, field: str, *, positive: bool = False) -> int:
    """A byte size (`18800640`, `'17.93 MiB'`), from 0 (1 with `positive`) to 1 EiB."""
    from recipegen.common.units import MAX_BYTES, UnitError, parse_bytes
    if len(text) > _MAX_SIZE_CHARS:
        raise InputError(f"{len(text):,} characters is no size (at most 1 EiB, e.g. '62 GiB')",
                         field=field)
    stripped = text.strip().replace("_", "").replace(",", "")
    if _PLAIN_BYTES.fullmatch(stripped):
        if int(stripped) > MAX_BYTES:   # at most 48 digits here: int() is cheap and exact
            raise InputError(f"{text!r} is beyond any real size (at most 1 EiB)", field=field)
        value = int(stripped)
    else:
        try:
            value = parse_bytes(text)
        except UnitError as exc:
            raise InputError(str(exc), field=field) from None
    if value < 0 or (positive and value == 0):
        raise InputError(f"{text!r}: must be {'positive' if positive else 'zero or more'}",
                         field=field)
    return value


# Longest file name an output may have: its lock and temp files (`.<name>.recipegen-lock`) beside
# it must fit the 255 bytes a file name can be, or the refusal would name recipegen's own file.
def _max_output_name() -> int:
    from recipegen.common.lock import LOCK_SUFFIX, TEMP_SUFFIX
    return 255 - 1 - max(len(LOCK_SUFFIX), len(TEMP_SUFFIX))


def _output(path: str | Path, option: str, inputs: tuple[str | Path, ...] = ()) -> Path:
    """An output path checked before any work: a regular file or nothing there (not a link, a
    FIFO, a device or a folder), a file name short enough for its lock and temp, and not one
    of the command's own input files."""
    from recipegen.common.files import output_target

    target = Path(path)
    name = os.fsencode(target.name)
    if not name:
        raise InputError("names no file", file=str(path), field=option)
    if len(name) > _max_output_name():
        raise InputError(f"the file name is {len(name)} bytes; an output's can be at most "
                         f"{_max_output_name()} (its lock and temp file beside it add "
                         f"{255 - _max_output_name()})", file=str(path), field=option)
    output_target(target, option)
    try:
        resolved = target.resolve()
    except (OSError, RuntimeError) as exc:  # a link loop on the way
        raise InputError(f"cannot resolve the path ({exc})", file=str(path), field=option) from None
    for item in inputs:
        source = Path(item)
        try:
            same = source.resolve() == resolved or (target.exists() and source.exists()
                                                    and os.path.samefile(source, target))
        except OSError:
            same = False
        if same:
            raise InputError(f"is also an input of this command ({item}); write the output "
                             "elsewhere", file=str(path), field=option)
    return target


def _geometry(recipe: str | None, experts: int | None, layers: str | None,
              bytes_per_expert: str | None, captures: list[str]) -> Any:
    from recipegen.rowmap.inputs import Geometry, capture_layer_count, parse_layers
    bpe = (_parse_size(bytes_per_expert, "--bytes-per-expert", positive=True)
           if bytes_per_expert is not None else None)
    if recipe:
        from recipegen.rowmap.inputs import geometry_from_recipe
        geo = geometry_from_recipe(recipe)
        if bpe is not None and bpe != geo.bytes_per_expert:
            raise InputError(f"--bytes-per-expert {bpe} disagrees with the recipe's model "
                             f"({geo.bytes_per_expert})", field="--bytes-per-expert")
        return geo
    if experts is None:
        return Geometry((), 0, bpe, source="command line") if bpe else None
    from expert_residency.formats._io import MAX_EXPERTS

    if not 0 < experts <= MAX_EXPERTS:
        raise InputError(f"must be positive and at most {MAX_EXPERTS}", field="--experts")
    if layers:
        moe_layers = parse_layers(layers)
    elif captures:
        moe_layers = tuple(range(capture_layer_count(captures[0])))
    else:
        raise InputError("give --layers with --experts (e.g. --layers 0-39), or --recipe", field="--layers")
    return Geometry(moe_layers, experts, bpe, source="command line")


def _recipe_inputs(recipe: str | None) -> tuple[Path, ...]:
    """The recipe file `--recipe` names, when it names one (an input the output must not be)."""
    if not recipe:
        return ()
    from recipegen.load.recipe import resolve_recipe_path
    try:
        return (resolve_recipe_path(recipe),)
    except (InputError, OSError):  # a missing recipe is refused by the read that follows
        return ()


def _write(path: str | Path, text: str) -> None:
    """Write a row map or histogram file through the one locked writer
    (`recipegen.common.lock.write_atomically`: a fixed temp name beside the file, renamed): a run
    killed at its rename leaves a temp that this next write (or any later run's sweep of the
    folder) removes, never a stray file. A folder that cannot be written is an input error, not
    a traceback."""
    from recipegen.common.lock import LockUnavailable, sweep_temps, write_atomically

    target = Path(path)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        sweep_temps(target.parent)  # what a build, reduce or synth killed at its rename left
        write_atomically(target, text.encode("utf-8"))
    except LockUnavailable:
        raise InputError("cannot write (the folder is read-only to this process)", file=str(path)) from None
    except OSError as exc:
        raise InputError(f"cannot write ({exc.strerror or exc})", file=str(path)) from None


def _emit_json(payload: Any) -> None:
    click.echo(json.dumps(payload, indent=2, sort_keys=False))


def _echo(lines: list[str]) -> None:
    """A report for people, its shorthand explained after it."""
    from recipegen.cli.output import explained

    with explained() as say:
        say("\n".join(lines))


@click.group()
def rowmap() -> None:
    """Row maps per traffic class: which experts are hot (HBM) and which cold (host).

    \b
    build    HIST... (--hot N | --cold-budget BYTES) -o MAP
    eval     MAP HIST...            cold share, skew, leave-one-out
    compare  HIST_A HIST_B          one map per class or one merged map?
    diff     MAP_A MAP_B            changed cold ids, shape/content hashes
    show     MAP [--recipe R]       geometry, provenance, hashes, bank bytes
    reduce   CAPTURE... -o HIST     vLLM routed-experts / raw .npy captures → histogram
    synth    -o DIR                 seeded SYNTHETIC example histograms
    save-live RECIPE LANE --class C the map an adaptive lane's banks hold now → C's map

    HIST arguments accept histogram files and capture files (vLLM
    --enable-return-routed-experts responses, raw [tokens, layers, top_k] .npy).
    """


@rowmap.command()
@click.argument("inputs", nargs=-1, required=True)
@click.option("--hot", type=int, help="Hot experts per layer (uniform top-N).")
@click.option("--cold-budget", "cold_budget",
              help="Cold-bank byte budget, e.g. '62.34 GiB': budget-global map (variable hot "
                   "count per layer).")
@click.option("--uniform", is_flag=True,
              help="With --cold-budget: write the uniform map the budget gives instead.")
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Row-map file to write (atomically).")
@_geometry_options
@_decode_only_option
@click.option("--json", "as_json", is_flag=True, help="Print a JSON summary.")
def build(inputs: tuple[str, ...], hot: int | None, cold_budget: str | None, uniform: bool,
          output: str, recipe: str | None, experts: int | None, layers: str | None,
          bytes_per_expert: str | None, decode_only: bool, as_json: bool) -> None:
    """Build a row map from histograms/captures (pooled when several).

    Top-N per layer: count descending, ties to the lower expert id; rows in each bank in
    ascending id order.
    """
    from expert_residency.formats import FormatError, format_rowmap, merge_histograms

    from recipegen.rowmap.build import build_budget_global, build_top_n, provenance_for
    from recipegen.rowmap.evaluate import evaluate_on
    from recipegen.rowmap.inputs import is_histogram_file, read_histograms
    from recipegen.rowmap.text import budget_lines, pct, show_lines

    if (hot is None) == (cold_budget is None):
        raise InputError("give exactly one of --hot N and --cold-budget BYTES", field="--hot")
    if uniform and cold_budget is None:
        raise InputError("--uniform goes with --cold-budget", field="--uniform")
    _output(output, "--output", (*inputs, *_recipe_inputs(recipe)))
    captures = [p for p in inputs if not is_histogram_file(p)]
    geo = _geometry(recipe, experts, layers, bytes_per_expert, captures)
    named = read_histograms(inputs, geo if geo and geo.num_experts else None,
                            group_captures=True, decode_only=decode_only)
    hists = [h for _, h in named]
    names = [n for n, _ in named]
    if geo is not None and geo.num_experts:
        for name, h in named:
            if (h.moe_layer_indices, h.num_experts) != (geo.moe_layer_indices, geo.num_experts):
                raise InputError(f"covers {len(h.moe_layer_indices)} MoE layers × "
                                 f"{h.num_experts} experts; {geo.source} has "
                                 f"{len(geo.moe_layer_indices)} × {geo.num_experts}",
                                 file=name, field="moe_layers")
    try:
        pooled = merge_histograms(hists) if len(hists) > 1 else hists[0]
    except FormatError as exc:  # different geometry
        raise InputError(f"{exc.reason}: {', '.join(names)}", field="moe_layers") from None
    comments = ["expert residency row map, written by `recipegen rowmap build`"]
    if any(h.meta.get("synthetic") for h in hists):
        comments.append("SYNTHETIC: built from synthetic example histograms, not measured "
                        "traffic")
    summary: dict[str, Any] = {"output": output}
    if hot is not None:
        prov = provenance_for(hists, names, "top-n", hot=hot)
        prov["histogram_checksums"] = [h.checksum() for h in hists]
        rowmap = build_top_n(pooled, hot, prov)
        lines = []
    else:
        assert cold_budget is not None
        budget = _parse_size(cold_budget, "--cold-budget")
        bpe = geo.bytes_per_expert if geo else None
        if not bpe:
            raise InputError("--cold-budget needs bytes per expert: give --recipe or "
                             "--bytes-per-expert", field="--cold-budget")
        prov = provenance_for(hists, names, "budget-uniform" if uniform else "budget-global",
                              cold_budget_bytes=budget, bytes_per_expert=bpe)
        prov["histogram_checksums"] = [h.checksum() for h in hists]
        result = build_budget_global(pooled, budget, bpe, prov)
        rowmap = result.uniform if uniform else result.rowmap
        if uniform:
            rowmap.provenance.update(prov)
        global_eval = evaluate_on(result.rowmap, pooled, "input")
        uniform_eval = evaluate_on(result.uniform, pooled, "input")
        same_eval = evaluate_on(result.global_same_total, pooled, "input")
        lines = budget_lines(result, global_eval, uniform_eval, same_eval)
        summary.update({"cold_budget_bytes": budget, "cold_experts": result.cold_experts,
                        "uniform_cold_per_layer": result.uniform_cold_per_layer,
                        "kernel_tunings": result.tunings,
                        "uniform_kernel_tunings": result.uniform_tunings,
                        "layer_shapes": len(result.rowmap.distinct_shapes()),
                        "cold_share_global": global_eval.cold_share,
                        "cold_share_uniform": uniform_eval.cold_share,
                        "cold_share_global_same_total": same_eval.cold_share})
    _write(output, format_rowmap(rowmap, comments=comments))
    in_sample = evaluate_on(rowmap, pooled, "input")
    summary.update({"content_hash": rowmap.content_hash(), "shape_hash": rowmap.shape_hash(),
                    "hot_counts": rowmap.hot_counts(), "cold_share_in_sample":
                    in_sample.cold_share, "positional_cold_share":
                    in_sample.positional_cold_share, "inputs": names})
    if as_json:
        _emit_json(summary)
        return
    _echo([f"wrote {output}"] + show_lines(rowmap, output, geo.bytes_per_expert if geo else None,
                                            geo.source if geo else "")[1:] + lines +
          [f"  cold share on its own input: {pct(in_sample.cold_share)} (positional "
           f"{pct(in_sample.positional_cold_share)}) — in-sample; use `rowmap eval` with "
           f"held-out files for an honest figure"])


@rowmap.command(name="eval")
@click.argument("map_path", metavar="MAP")
@click.argument("inputs", nargs=-1, required=True)
@click.option("--per-layer", is_flag=True, help="Also print per-layer cold shares and Gini.")
@_decode_only_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def eval_(map_path: str, inputs: tuple[str, ...], per_layer: bool, decode_only: bool,
          as_json: bool) -> None:
    """Cold share of MAP on each histogram/capture, per layer and overall; skew; positional
    baseline; leave-one-out across the files when there are several."""
    from recipegen.rowmap.evaluate import evaluate
    from recipegen.rowmap.inputs import Geometry, read_histograms, read_rowmap, short_names
    from recipegen.rowmap.text import eval_lines

    rm = read_rowmap(map_path)
    named = read_histograms(inputs, Geometry(rm.moe_layer_indices, rm.num_experts),
                            decode_only=decode_only)
    names = [n for n, _ in named] if as_json else short_names([n for n, _ in named])
    report = evaluate(rm, [h for _, h in named], names, map_path)
    if as_json:
        _emit_json(report.to_json())
    else:
        _echo(eval_lines(report, per_layer=per_layer))


@rowmap.command()
@click.argument("hist_a")
@click.argument("hist_b")
@click.option("--hot", type=int, help="Hot experts per layer for the maps compared "
              "(default: the reference's 295 of 384, scaled to the model).")
@click.option("--equal-weights", is_flag=True,
              help="Merge the two classes with equal weight instead of by selections.")
@_geometry_options
@_decode_only_option
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def compare(hist_a: str, hist_b: str, hot: int | None, equal_weights: bool, recipe: str | None,
            experts: int | None, layers: str | None, bytes_per_expert: str | None,
            decode_only: bool, as_json: bool) -> None:
    """Two traffic classes: rank correlation, top-set overlap, and the cold share each class's
    map gives the other beside a merged map — one map per class, or one merged map?"""
    from recipegen.rowmap.compare import compare as compare_hists
    from recipegen.rowmap.inputs import is_histogram_file, read_histograms
    from recipegen.rowmap.text import compare_lines

    captures = [p for p in (hist_a, hist_b) if not is_histogram_file(p)]
    geo = _geometry(recipe, experts, layers, bytes_per_expert, captures)
    (name_a, a), (name_b, b) = read_histograms([hist_a, hist_b],
                                               geo if geo and geo.num_experts else None,
                                               decode_only=decode_only)
    if hot is None:
        hot = round(a.num_experts * 295 / 384)
    report = compare_hists(a, b, hot=hot, name_a=Path(name_a).stem, name_b=Path(name_b).stem,
                           equal_weights=equal_weights)
    if as_json:
        _emit_json(report.to_json())
    else:
        _echo(compare_lines(report))


@rowmap.command()
@click.argument("map_a")
@click.argument("map_b")
@click.option("--summary", is_flag=True, help="Omit the per-layer table.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def diff(map_a: str, map_b: str, summary: bool, as_json: bool) -> None:
    """Per layer: cold ids changed; whether shape_hash is equal (swap without re-tuning) and
    content_hash differs."""
    from recipegen.rowmap.diff import diff as diff_maps
    from recipegen.rowmap.inputs import read_rowmap
    from recipegen.rowmap.text import diff_lines

    report = diff_maps(read_rowmap(map_a), read_rowmap(map_b), name_a=map_a, name_b=map_b)
    if as_json:
        _emit_json(report.to_json())
    else:
        _echo(diff_lines(report, per_layer=not summary))


@rowmap.command()
@click.argument("map_path", metavar="MAP")
@click.option("--recipe", help="Recipe whose model gives the bytes per expert.")
@click.option("--bytes-per-expert", "bytes_per_expert", help="Bytes of one routed expert.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def show(map_path: str, recipe: str | None, bytes_per_expert: str | None, as_json: bool) -> None:
    """Geometry, provenance, hashes, and bytes hot/cold with the recipe's model."""
    from recipegen.rowmap.inputs import read_rowmap
    from recipegen.rowmap.text import show_lines

    rm = read_rowmap(map_path)
    bpe, source = None, ""
    if recipe:
        from recipegen.rowmap.inputs import geometry_from_recipe
        geo = geometry_from_recipe(recipe)
        if (geo.moe_layer_indices, geo.num_experts) != (rm.moe_layer_indices, rm.num_experts):
            raise InputError(f"the map's geometry ({len(rm.moe_layer_indices)} layers × "
                             f"{rm.num_experts}) is not the recipe model's "
                             f"({len(geo.moe_layer_indices)} × {geo.num_experts})",
                             file=map_path, field="moe_layers")
        bpe, source = geo.bytes_per_expert, geo.source
    elif bytes_per_expert is not None:
        bpe = _parse_size(bytes_per_expert, "--bytes-per-expert", positive=True)
        source = "command line"
    if as_json:
        hot, cold = sum(rm.hot_counts()), sum(rm.cold_counts())
        _emit_json({"map": map_path, "moe_layers": list(rm.moe_layer_indices),
                    "num_experts": rm.num_experts, "hot_counts": rm.hot_counts(),
                    "cold_counts": rm.cold_counts(), "content_hash": rm.content_hash(),
                    "shape_hash": rm.shape_hash(), "provenance": rm.provenance,
                    "bytes_per_expert": bpe,
                    "hot_bytes": hot * bpe if bpe else None,
                    "cold_bytes": cold * bpe if bpe else None})
    else:
        _echo(show_lines(rm, map_path, bpe, source))


@rowmap.command()
@click.argument("captures", nargs=-1, required=True)
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False),
              help="Histogram file to write (atomically).")
@click.option("--source", help="Source text recorded in the histogram.")
@_geometry_options
@_decode_only_option
def reduce(captures: tuple[str, ...], output: str, source: str | None, recipe: str | None,
           experts: int | None, layers: str | None, bytes_per_expert: str | None,
           decode_only: bool) -> None:
    """Reduce captures (vLLM routed_experts responses, raw .npy) into one histogram file."""
    import time

    from expert_residency.formats import format_histogram

    from recipegen.rowmap.inputs import is_histogram_file, read_histograms

    _output(output, "--output", (*captures, *_recipe_inputs(recipe)))
    for c in captures:
        if is_histogram_file(c):
            raise InputError("is already a histogram; `reduce` takes captures", file=c)
    geo = _geometry(recipe, experts, layers, bytes_per_expert, list(captures))
    if geo is None or not geo.num_experts:
        raise InputError(GEOMETRY_HELP, field="--recipe")
    start = time.perf_counter()
    [(_, hist)] = read_histograms(captures, geo, group_captures=True, decode_only=decode_only)
    elapsed = time.perf_counter() - start
    if source:
        hist.source = source
    _write(output, format_histogram(hist))
    split = (f" ({hist.prefill_tokens:,} prefill + {hist.decode_tokens:,} decode)"
             if hist.decode_tokens is not None and not decode_only else
             " (decode only)" if decode_only else "")
    click.echo(f"wrote {output}: {hist.tokens:,} tokens{split}, {hist.selections:,} selections "
               f"over {len(hist.moe_layer_indices)} MoE layers × {hist.num_experts} experts "
               f"(top_k {hist.top_k}) in {elapsed:.2f} s")


@rowmap.command()
@click.option("-o", "--output-dir", required=True, type=click.Path(file_okay=False),
              help="Folder for <class>.hist files.")
@click.option("--class", "classes", multiple=True, default=("agent", "prose", "math"),
              show_default=True, help="Traffic class (repeat).")
@click.option("--seed", type=int, default=41, show_default=True, help="Random seed of the synthetic routing.")
@click.option("--tokens", type=int, default=47_778, show_default=True,
              help="Tokens per class (47,778 × 40 layers × 6 = 11.5M selections).")
@click.option("--correlation", type=FiniteFloat(-1.0, 1.0), default=0.15, show_default=True,
              help="Spearman rank correlation between classes (field reports: agent vs prose 0.15).")
@click.option("--top-k", "top_k", type=int, help="Experts picked per token (with --experts).")
@_geometry_options
def synth(output_dir: str, classes: tuple[str, ...], seed: int, tokens: int, correlation: float,
          top_k: int | None, recipe: str | None, experts: int | None, layers: str | None,
          bytes_per_expert: str | None) -> None:
    """Write seeded SYNTHETIC example histograms, one per class (marked synthetic inside)."""
    from expert_residency.formats import format_histogram

    from recipegen.rowmap.synthetic import synthetic_histogram

    geo = _geometry(recipe, experts, layers, bytes_per_expert, [])
    if geo is None or not geo.num_experts:
        raise InputError("give --recipe R, or --experts E --layers L --top-k K",
                         field="--recipe")
    k = geo.top_k or top_k
    if not k or k <= 0 or k > geo.num_experts:
        raise InputError(f"give a top-k between 1 and the expert count ({geo.num_experts})",
                         field="--top-k")
    longest = _max_output_name() - len(".hist")
    for name in classes:  # every name, before anything is written
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", name):
            raise InputError(f"class name {name[:64]!r} must be letters, digits, '.', '_' or '-' "
                             f"(it names the file)", field="--class")
        if len(name) > longest:
            raise InputError(f"class name of {len(name)} characters: at most {longest} (it "
                             f"names the file {{class}}.hist)", field="--class")
    from expert_residency.formats.histogram import MAX_TOTAL
    most_tokens = MAX_TOTAL // (k * len(geo.moe_layer_indices))
    if not 0 < tokens <= most_tokens:
        raise InputError(f"must be from 1 to {most_tokens:,} (tokens × top-k {k} × "
                         f"{len(geo.moe_layer_indices)} MoE layers is the histogram's count "
                         "total, at most 2^63 - 1)", field="--tokens")
    if not 0 <= correlation < 1:
        raise InputError("must be in [0, 1)", field="--correlation")
    folder = Path(output_dir)
    if folder.exists() and not folder.is_dir():
        raise InputError("is not a folder", file=output_dir, field="--output-dir")
    for name in classes:
        _output(folder / f"{name}.hist", "--output-dir", _recipe_inputs(recipe))
    from expert_residency.formats._io import format_index_ranges
    geometry_args = (f"--recipe {recipe}" if recipe else
                     f"--experts {geo.num_experts} --layers "
                     f"{format_index_ranges(geo.moe_layer_indices)} --top-k {k}")
    for name in classes:
        hist = synthetic_histogram(seed, name, moe_layer_indices=geo.moe_layer_indices,
                                   num_experts=geo.num_experts, top_k=k, tokens=tokens,
                                   correlation=correlation, model_revision=geo.model_revision)
        path = Path(output_dir) / f"{name}.hist"
        _write(path, format_histogram(hist, comments=[
            f"SYNTHETIC example histogram for traffic class '{name}' — generated, not measured",
            f"regenerate: recipegen rowmap synth --class {name} --seed {seed} --tokens {tokens} "
            f"--correlation {correlation} {geometry_args} -o {output_dir}"]))
        click.echo(f"wrote {path} (SYNTHETIC, {hist.selections:,} selections)")


@rowmap.command(name="save-live")
@click.argument("recipe")
@click.argument("lane")
@click.option("--class", "cls", required=True, help="Class whose row-map file receives the live map.")
@click.option("--dump-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="The lane's dump folder (default: the rendering's dumps/<lane>).")
@click.option("--machine", envvar="RECIPEGEN_MACHINE", default=None,
              help="Machine whose rendering holds the dump folder (multi-machine recipes).")
@click.option("-o", "--output", type=click.Path(dir_okay=False), default=None,
              help="Write the map here instead of the class's row-map file.")
@click.option("--json", "as_json", is_flag=True, help="Print JSON.")
def save_live(recipe: str, lane: str, cls: str, dump_dir: Path | None, machine: str | None,
              output: str | None, as_json: bool) -> None:
    """Keep the live map of an adaptive LANE (its newest histogram snapshot's) as class CLS's map."""
    from recipegen.common.lock import recipe_lock
    from recipegen.common.paths import project_path
    from recipegen.load.checks import project_root_of
    from recipegen.load.recipe import load_recipe, resolve_recipe_path
    from recipegen.ops.dumps import read_host_dir
    from recipegen.ops.livemap import adaptive_lane
    from recipegen.ops.livemap import save_live as run

    path = resolve_recipe_path(recipe)
    if output is not None:
        _output(output, "--output", (path,))
    with recipe_lock(path, echo=click.echo):  # the class's map is the recipe's: one writer at a time
        loaded = load_recipe(path)
        adaptive_lane(loaded, lane)   # the recipe first: a lane that writes no live map, no dump to read
        root = project_root_of(loaded.base_dir)
        if dump_dir is None:
            from recipegen.ops.rendering import Rendering

            dump_dir = Rendering.load(str(path), machine).out_dir / "dumps" / lane
        if output is not None and Path(output).resolve().is_relative_to(Path(dump_dir).resolve()):
            raise InputError(f"is inside the dump folder {dump_dir} this command reads; write the "
                             "map elsewhere", file=output, field="--output")
        if Path(os.path.abspath(dump_dir)).is_relative_to(root):
            # inside the project: no link on the way may lead out of it (dumps/<lane> -> /)
            project_path(root, dump_dir, what="the dump folder", field="--dump-dir")
        if output is None:
            cls_entry = next((l.classes.get(cls) for l in loaded.recipe.lanes if l.name == lane), None)
            if cls_entry is not None and cls_entry.rowmap:
                project_path(root, loaded.resolve(cls_entry.rowmap), what=f"class {cls}'s row map")
        target, view = run(loaded, lane, cls, read_host_dir(dump_dir), where=str(dump_dir), output=output)
    figures = view.against(None)
    if as_json:
        _emit_json({"written": str(target), "class": cls, **figures})
        return
    click.echo(f"wrote {target}: the live map {view.live.content_hash[:12]} of lane {lane} "
               f"({format_count(view.live.swaps, 'swap')} in {format_count(view.live.barriers, 'barrier')} since boot map "
               f"{view.live.boot_content_hash[:12]}, as the runtime counted them, cross-checked "
               f"against the map file; hashes recomputed; from {view.snapshot.name})")
    if output is None:
        click.echo(f"next: `recipegen swap {recipe} {lane} --class {cls}` (or `recipegen up`) boots "
                   "the lane on it; the class's histogram is unchanged")
