"""`recipegen new MODEL --machine NAME`: a one-lane recipe for a model on a machine, fitted by the
same function as `recipegen fit` and written only when it fits (and passes `check budgets`).

The lane starts from vLLM 0.33's own defaults (`--gpu-memory-utilization` 0.92, vllm/config/
cache.py:215), every GPU of the machine (tensor parallel), one stream unless `--concurrency`
says otherwise, the model's full context unless `--max-model-len` says otherwise, and *estimated*
reserves (recipegen.ledger.reserves: labelled so until a measured boot replaces them).
"""

from __future__ import annotations

import json
import os
import re
import shlex
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from recipegen.catalog import catalog_names, load_catalog
from recipegen.common.errors import InputError
from recipegen.common.files import output_target
from recipegen.common.paths import escaping_link
from recipegen.fit.run import FitOutcome, fit_recipe
from recipegen.fit.search import FitOptions
from recipegen.fit.source import ModelSource, model_name_of, resolve_model
from recipegen.fit.writeback import commit, recipe_lock
from recipegen.load.checks import inside_project, project_root_of
from recipegen.load.recipe import RECIPE_SUFFIX, recipe_file_stem
from recipegen.modelimport.write import describe_difference, same_figures
from recipegen.schema import Machine
from recipegen.schema.patterns import FILE_NAME, NAME_MAX_LENGTH

VLLM_IMAGE = "vllm/vllm-openai:v0.33.0"
VLLM_GPU_MEMORY_UTILIZATION = 0.92   # vLLM 0.33 CacheConfig.gpu_memory_utilization default
DEFAULT_PORT = 8000
OFFLOAD_PARAMS = ("--cpu-offload-params", "experts")
# The context a new lane starts from when the model declares no max_position_embeddings (and no
# --max-model-len is given); `new --help` names it.
DEFAULT_CONTEXT = 32768
DEFAULT_CONTEXT_WHY = "recipegen's default (the model declares no max_position_embeddings)"


@dataclass
class NewOutcome:
    recipe_path: Path
    model: ModelSource
    machine_label: str
    fit: FitOutcome | None
    model_file: Path | None = None
    written: bool = False
    notes: list[str] = field(default_factory=list)
    model_ref: Any = None   # the recipe's `model:` value

    def lines(self) -> list[str]:
        refused = self.fit is not None and not self.fit.fitted and not self.written
        # a refusal must not open as if the file were written
        out = [f"new recipe {self.recipe_path}{' (not written: nothing fits)' if refused else ''}: "
               f"{self.model.label} on {self.machine_label}"]
        out += [f"  note: {n}" for n in self.model.notes + self.notes]
        if self.fit is not None:  # a new recipe: what changed from the template is all of it
            out += [line for line in self.fit.lines() if not line.startswith(("  changed:", "  unchanged:",
                                                                               "  would change:"))]
        if self.written:
            if self.model_file is not None:
                out.append(f"wrote {self.model_file} (the model file the recipe reads)")
            out.append(f"wrote {self.recipe_path}: `recipegen check budgets {self.recipe_path}` passes; "
                       f"next `recipegen render {self.recipe_path}`")
        elif self.fit is not None and not self.fit.fitted:
            out.append("nothing written: nothing fits")
        return out


def resolve_machine(arg: str, option: str = "--machine") -> tuple[str | dict[str, Any], Machine, str]:
    """A catalog machine name, or a machine file (`recipegen machine detect -o FILE`): what the
    recipe's `machines` entry holds, the validated machine, and a label (`option`: the command-line
    option that named it, for the error)."""
    if arg in load_catalog("machines"):
        from recipegen.catalog import catalog_entry

        return arg, Machine.model_validate(catalog_entry("machines", arg)), f"catalog machine {arg}"
    path = Path(arg).expanduser()
    if not path.is_file():
        raise InputError(f"{arg!r} is not a catalog machine nor a machine file; catalog machines "
                         f"(`recipegen machine list` describes them): {', '.join(catalog_names('machines'))}; a "
                         "machine file is what `recipegen machine detect -o FILE` writes on the box, or a catalog "
                         "machine with the figures that differ (`catalog: <id>` and e.g. `host_memory: 144 GiB`)",
                         field=option)
    from recipegen.load.machine_file import load_machine_file

    entry, machine = load_machine_file(path)
    key = machine_key(arg, entry)
    base = entry.get("catalog")
    own = [k for k in entry if k not in ("catalog", "name")]
    if key in catalog_names("machines") and (base != key or own):
        # what new drafts for this file would be named as the catalog machine's, which it is not
        source = "its `name:`" if isinstance(entry.get("name"), str) and entry["name"].strip() else "its file name"
        raise InputError(f"named {key!r} by {source}, the name of the catalog machine {key}, which this file "
                         f"is not ({'a catalog machine ' + base if isinstance(base, str) else 'its own figures'}"
                         f"{' with its own ' + ', '.join(own) if isinstance(base, str) and own else ''}): the "
                         "recipe and machine key new drafts are named after the file and would pass for the "
                         f"catalog machine's; give the file a `name:` of its own (e.g. `name: {key}-box`)",
                         file=arg, field="name")
    if isinstance(base, str):
        given = f", with its own {', '.join(own)}" if own else ""
        return entry, machine, f"machine {key} ({arg}: catalog machine {base}{given})"
    return entry, machine, f"machine {key} ({arg})"


def machine_key(arg: str, entry: str | dict[str, Any]) -> str:
    """The name a machine goes by in what `new` drafts — its key under the recipe's `machines:` and
    the second half of the default recipe name `<model>-<machine>` — and in `compare --json`: a
    catalog machine's id; for a machine file, the file's own `name:` where it gives one, else the
    file's name without .yaml / .yml (`box.yaml` -> `box`), never the catalog machine it starts
    from (two boxes of one catalog machine would draft one recipe name). Made a machine key
    (lowercase letters, digits, '-')."""
    if isinstance(entry, str):
        text = entry
    else:
        own = entry.get("name")
        stem = Path(arg).name
        for suffix in (".yaml", ".yml"):
            if stem.lower().endswith(suffix) and len(stem) > len(suffix):
                stem = stem[: -len(suffix)]
                break
        text = own if isinstance(own, str) and own.strip() else stem
    key = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")[:NAME_MAX_LENGTH].rstrip("-")
    return key or "machine"


def recipe_text(name: str, model_ref: Any, machine_key: str, machine_entry: Any, machine: Machine, lane: str,
                max_model_len: int, concurrency: int, offload_params: bool, command: str,
                gpu_count: int | None = None) -> str:
    doc: dict[str, Any] = {
        "version": 1, "name": name,
        "description": f"{name}: written by `{command}`, fitted by `recipegen fit`",
        "model": model_ref,
        "machines": {machine_key: machine_entry},
        "lanes": [{
            "name": lane, "machine": machine_key, "gpus": list(range(gpu_count or machine.gpus.count)), "port": DEFAULT_PORT,
            "image": VLLM_IMAGE, "gpu_memory_utilization": VLLM_GPU_MEMORY_UTILIZATION,
            "max_model_len": max_model_len, "concurrency": {"min": 1, "max": concurrency},
            **({"extra_args": list(OFFLOAD_PARAMS)} if offload_params else {}),
            "reserves": {"hbm": {"estimated": True}, "host": {"estimated": True}},
        }],
    }
    # a name from the command line never reaches the comment raw: a newline would end it
    command = json.dumps(command, ensure_ascii=False)[1:-1]
    head = (f"# Written by `{command}`; placement, hot experts per layer, load-time offload and\n"
            "# context fitted by `recipegen fit` at the boundary where every budget holds (`recipegen fit\n"
            "# RECIPE --dry-run` says why). The reserves are estimated from the model and the machine\n"
            "# (docs/ledger.md 'Estimated reserves'): replace them with a measured boot (`recipegen verify`).\n")
    return head + yaml.dump(doc, Dumper=_Dumper, sort_keys=False, width=4096, allow_unicode=True)


class _Dumper(yaml.SafeDumper):
    """Block mappings, flow lists of scalars (`gpus: [0]`), lists indented under their key: the
    layout of the shipped recipes."""

    def increase_indent(self, flow: bool = False, indentless: bool = False) -> None:
        super().increase_indent(flow, False)


def _flow_scalar_lists(dumper: yaml.SafeDumper, data: list[Any]) -> Any:
    flow = all(not isinstance(x, (dict, list)) for x in data)
    return dumper.represent_sequence("tag:yaml.org,2002:seq", data, flow_style=flow)


_Dumper.add_representer(list, _flow_scalar_lists)


def new_recipe(model_arg: str, machine_arg: str, *, lane: str = "chat", max_model_len: int | None = None,
               concurrency: int | None = None, min_sequences: int = 1, gpu_count: int | None = None,
               output: Path | None = None, name: str | None = None, force: bool = False,
               command: str = "recipegen new") -> NewOutcome:
    from_output = _name_from_output(output, name) if output is not None else None   # before any look-up
    source = resolve_model(model_arg)
    machine_entry, machine, machine_label = resolve_machine(machine_arg)
    key = machine_key(machine_arg, machine_entry)
    if gpu_count is not None:
        _check_gpu_count(gpu_count, source, machine, machine_label)
    default_name = model_name_of(f"{source.name}-{key}")
    recipe_name = from_output or name or default_name
    if from_output is not None:
        if name is None and recipe_name != default_name:
            # the header reproduces the recipe: its name came from -o, which the header leaves out
            command += f" --name {shlex.quote(recipe_name)}"
    path = output or Path("recipes") / f"{recipe_name}.yaml"
    made = not path.parent.exists()
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with recipe_lock(path):  # from the exists check to the write: two `new` to one file, one writes
            outcome = _new(source, machine_entry, machine, machine_label, key, recipe_name, path, lane,
                           max_model_len, concurrency, min_sequences, force, command, gpu_count)
    finally:
        if made and not any(path.parent.iterdir()):
            path.parent.rmdir()  # nothing written: no folder left behind either
    return outcome


def _check_gpu_count(gpu_count: int, source: ModelSource, machine: Machine, machine_label: str) -> None:
    """`--gpus N`: at least one, at most the machine's, and a tensor-parallel size vLLM boots this
    model at (the ledger's own [parallel] rule, `parallel_problems`: heads and expert shards),
    refused up front with the counts that do."""
    from recipegen.ledger.parallel import booting_counts, parallel_problems

    if not 1 <= gpu_count <= machine.gpus.count:
        raise InputError(f"{gpu_count}: a lane runs on 1 to {machine.gpus.count} GPUs of {machine_label}",
                         field="--gpus")
    problems = parallel_problems(source.model, gpu_count)
    if problems:
        raise InputError(f"{'; '.join(message for message, _ in problems)}; on this machine vLLM boots "
                         f"{source.name} on {', '.join(map(str, booting_counts(source.model, machine.gpus.count)))} GPUs",
                         field="--gpus")


def _name_from_output(output: Path, name: str | None) -> str:
    """The recipe's name when `-o FILE` is given: FILE's name without `.yaml` (a recipe's `name` must
    be its file's, `recipegen.load.recipe.file_name_problems`). Refused up front, before anything is
    drafted, where --name says otherwise or the file's name is no recipe name."""
    if not output.name.endswith(RECIPE_SUFFIX):
        raise InputError(f"-o {str(output)!r}: a recipe's file is <name>{RECIPE_SUFFIX} (commands find it as "
                         f"recipes/<name>{RECIPE_SUFFIX}); pass -o a file whose name ends in {RECIPE_SUFFIX}")
    stem = recipe_file_stem(output)
    if name is not None and name != stem:
        raise InputError(f"--name {name!r} and -o {str(output)!r} disagree: a recipe's name is its file's "
                         f"name without .yaml ({stem!r}); drop --name, or write to "
                         f"-o {str(output.parent / (name + '.yaml'))!r}")
    if not re.fullmatch(FILE_NAME.regex, stem) or len(stem) > NAME_MAX_LENGTH:
        raise InputError(f"-o {str(output)!r}: a recipe's name is its file's name without .yaml, and {stem!r} "
                         f"is not a recipe name ({FILE_NAME.hint}, at most {NAME_MAX_LENGTH} characters); "
                         "pass -o a file named so")
    return stem


def model_file_reference(recipe: Path, model_file: Path) -> str | None:
    """`model_file` as the recipe at `recipe` references it (`model: {file: …}`): its path relative
    to the recipe's folder, where the recipe loader takes it (inside the recipe's project, through
    no link that leaves it: `recipegen.load.recipe`); None where it cannot."""
    base = recipe.parent
    relative = Path(os.path.relpath(os.path.abspath(model_file), os.path.abspath(base))).as_posix()
    if not inside_project(base, relative) or escaping_link(project_root_of(base), base / relative) is not None:
        return None
    return relative


def _machine_said(key: str, entry: Any) -> str:
    """A recipe's `machines` entry in a refusal: `box {catalog: h200-pcie, host_memory: 144 GiB}`."""
    if isinstance(entry, str):
        return key if entry == key else f"{key} (catalog machine {entry})"
    return f"{key} {yaml.safe_dump(entry, default_flow_style=True, sort_keys=False).strip()}"


def _same_machines(machines: dict[Any, Any], machine_key: str, machine_entry: Any) -> bool:
    """An existing recipe's `machines` is this draft's: one entry, under the same key, that resolves
    to the same machine (`catalog: h200-sxm-x8` is the catalog's `h200-sxm-x8`), through the
    resolver a recipe's `machines:` and a machine file use (`recipegen.schema.MachineEntry`)."""
    if list(machines) != [machine_key]:
        return False
    if machines[machine_key] == machine_entry:
        return True
    from pydantic import TypeAdapter, ValidationError

    from recipegen.catalog import catalog_entry
    from recipegen.schema import MachineEntry

    adapter: TypeAdapter[Machine] = TypeAdapter(MachineEntry)
    try:
        resolved = [adapter.validate_python(e, context={"catalog": catalog_entry})
                    for e in (machines[machine_key], machine_entry)]
    except (ValidationError, ValueError, InputError):
        return False
    return resolved[0] == resolved[1]


def _exists_refusal(path: Path, source: ModelSource, machine_key: str, machine_entry: Any,
                    gpus: int, gpus_said: str) -> InputError:
    """The refusal of a recipe file that exists. Where that recipe was drafted for another machine,
    model (two machine files `a/box.yaml` and `b/box.yml` name one recipe) or lane size (`--gpus`),
    it says which, so that `--force` is not taken for a refresh of the same recipe. `gpus`: the GPUs
    of this draft's lane, `gpus_said` where that count comes from."""
    try:
        existing = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        existing = None
    others: list[str] = []
    if isinstance(existing, dict):
        machines = existing.get("machines")
        if isinstance(machines, dict) and not _same_machines(machines, machine_key, machine_entry):
            said = "; ".join(_machine_said(key, entry) for key, entry in machines.items())
            others.append(f"machine {said} (this one: {_machine_said(machine_key, machine_entry)})")
        model = existing.get("model")
        model_name = (Path(str(model["file"])).stem if isinstance(model, dict) and "file" in model
                      else model if isinstance(model, str) else None)
        if model_name is not None and model_name != source.name:
            others.append(f"model {model_name} (this one: {source.name})")
        lanes = existing.get("lanes")
        lane_gpus = ({len(lane["gpus"]) for lane in lanes if isinstance(lane, dict) and isinstance(lane.get("gpus"), list)}
                     if isinstance(lanes, list) else set())
        if not others and lane_gpus and lane_gpus != {gpus}:
            said = " and ".join(str(n) for n in sorted(lane_gpus))
            others.append(f"lane size: {said} GPU{'s' if lane_gpus != {1} else ''} per lane (this one: {gpus}, "
                          f"{gpus_said})")
    if not others:
        return InputError("exists; pass --force to overwrite (or -o another file)", file=str(path))
    return InputError(f"exists, drafted for another {' and '.join(others)}; draft this one under "
                      "another name (--name, or -o another file), or pass --force to overwrite it", file=str(path))


def _new(source: ModelSource, machine_entry: Any, machine: Machine, machine_label: str, machine_key: str,
         recipe_name: str, path: Path, lane: str, max_model_len: int | None, concurrency: int | None,
         min_sequences: int, force: bool, command: str, gpu_count: int | None = None) -> NewOutcome:
    if path.exists() and not force:
        raise _exists_refusal(path, source, machine_key, machine_entry, gpu_count or machine.gpus.count,
                              "--gpus" if gpu_count else "every GPU of the machine, without --gpus")
    output_target(path, "--output")   # --force replaces a regular file, never a device or a link
    model_file = None
    model_ref: Any = source.name
    notes: list[str] = []
    if source.file is not None:   # a model file: referenced where it is, as a recipe does
        relative = model_file_reference(path, source.file)
        if relative is not None:
            model_ref = {"file": relative}
            notes.append(f"the recipe reads the model file where it is: model: {{file: {relative}}} "
                         "(relative to the recipe)")
        else:   # out of the recipe's reach: a copy beside it, as for a checkpoint
            source = replace(source, model_text=source.file.read_text(encoding="utf-8"))
            notes.append(f"{source.file} is outside the recipe's project ({project_root_of(path.parent)}: the "
                         "folder holding recipes/, or the one above the recipe's), where a recipe's model: "
                         f"{{file: …}} cannot reach: copied to models/{source.name}.yaml beside the recipe")
    if source.model_text is not None:
        model_file = path.parent / "models" / f"{source.name}.yaml"
        existing = model_file.read_text(encoding="utf-8") if model_file.exists() else None
        if existing is not None and existing != source.model_text and not force:
            if same_figures(existing, source.model_text):
                source = replace(source, model_text=existing)   # the file says more (its checkpoint id): keep it
            else:
                raise InputError(f"exists with other content ({describe_difference(existing, source.model_text)}); "
                                 "pass --force to overwrite", file=str(model_file))
        model_ref = {"file": f"models/{source.name}.yaml"}
    limit = source.model.max_position_embeddings
    auto = max_model_len is None
    start = max_model_len or limit or DEFAULT_CONTEXT
    options = FitOptions(min_sequences=min_sequences, max_model_len=None if auto else max_model_len,
                         auto_context=auto, concurrency=concurrency, default_context=DEFAULT_CONTEXT_WHY,
                         gpus_option="--gpus")

    def attempt(offload_params: bool) -> FitOutcome:
        text = recipe_text(recipe_name, model_ref, machine_key, machine_entry, machine, lane, start,
                           concurrency or 1, offload_params, command, gpu_count)
        return fit_recipe(path, lane, options, text=text)  # `text`: fitted here, written below

    outcome = NewOutcome(path, source, machine_label, None, model_file, notes=notes, model_ref=model_ref)
    from expert_residency.formats import atomic_write_bytes

    previous_model: bytes | None = None
    written_model = made_models_dir = False
    if model_file is not None and source.model_text is not None:
        previous_model = model_file.read_bytes() if model_file.is_file() else None
        if previous_model != source.model_text.encode("utf-8"):
            made_models_dir = not model_file.parent.exists()
            model_file.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_bytes(model_file, source.model_text.encode("utf-8"))
            written_model = True

    def restore_model() -> None:
        if not written_model or model_file is None:
            return
        if previous_model is None:
            model_file.unlink(missing_ok=True)
            if made_models_dir and not any(model_file.parent.iterdir()):
                model_file.parent.rmdir()   # nothing written: no empty models/ left behind
        else:
            atomic_write_bytes(model_file, previous_model)

    try:
        # `--cpu-offload-params experts` on every new lane: an offload at load moves routed experts
        # only (the walk would otherwise move attention weights too, read over the link every step);
        # with no offload it changes nothing, and a later fit onto a smaller machine keeps it
        try:
            fitted = attempt(True)
        except InputError as exc:
            if exc.file is None or Path(exc.file).name != path.name or path.exists():
                raise
            # the recipe `new` drafted is not on disk: name the option that made it invalid
            if exc.field and exc.field.endswith("max_model_len"):
                raise InputError(exc.message, field="--max-model-len") from None
            raise InputError(f"the recipe `new` drafted (not written) is invalid: {exc.message}",
                             field=exc.field) from None
        outcome.fit = fitted
        if not fitted.fitted:
            restore_model()
            outcome.model_file = None
            return outcome
        commit(path, fitted.text, fitted.writes)  # the maps, then the recipe; loaded again after
        outcome.written = True
    except BaseException:
        restore_model()
        raise
    return outcome

