"""Every `→` fix `recipegen check budgets` prints fits the lane's other budgets.

QA found the host fix of Qwen3-235B-A22B-FP8 on the 125.87 GiB-host H200 PCIe box ("lower
offload.load_cpu_offload to at most 45 GiB (or switch to usage-aware placement with 91+ hot per
layer)") overfilling HBM either way, so a user following it went round in circles. Each test here
applies every fix a run offers to the recipe itself, runs `check budgets` again and reads the
verdict: the budget the fix is for holds and no other breaks. A lever the run says would break a
budget is applied too, and the budget it names must break by the amount it says.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_support import invoke
from expert_residency.formats import RowMap, save_rowmap

from recipegen.load.recipe import load_recipe

REPO = Path(__file__).resolve().parent.parent
FAILURES = Path(__file__).parent / "budget_failures"

Doc = dict[str, Any]
Change = Callable[[Doc], None]


def _doc(path: Path) -> Doc:
    """The recipe as data, with its model's MoE layers and experts (`_shape`) for the row maps written
    beside each changed copy (a usage-aware lane's map must hold its hot count)."""
    doc = yaml.safe_load(path.read_text())
    model = load_recipe(path, read_maps=False).recipe.model
    doc["_shape"] = (tuple(model.moe_layers), model.routed_experts)
    return doc


def _with_rowmap(doc: Doc, folder: Path) -> Doc:
    """`doc` with a positional-ids row map of its declared hot count on each usage-aware lane."""
    doc = yaml.safe_load(yaml.safe_dump(doc))
    layers, experts = doc.pop("_shape")
    for spec in doc["lanes"]:
        offload = spec.get("offload", {})
        if offload.get("placement", "usage-aware") != "usage-aware":
            spec.pop("classes", None)
            spec.pop("active_class", None)
            continue
        hot = offload["hot_experts_per_layer"]
        path = folder / "maps" / f"hot{hot}.rowmap"
        if not path.exists():
            path.parent.mkdir(exist_ok=True)
            save_rowmap(RowMap(layers, experts, [list(range(hot))] * len(layers),
                               [list(range(hot, experts))] * len(layers), {"builder": "test: positional ids"}), path)
        spec["classes"] = {"t": {"rowmap": f"maps/hot{hot}.rowmap"}}
        spec["active_class"] = "t"
    return doc


def _budgets(doc: Doc, tmp_path: Path, name: str) -> tuple[int, dict[str, tuple[str, str]]]:
    """`check budgets` on `doc` written as `name`.yaml: exit code, and per violated budget its line and fix."""
    doc = _with_rowmap(doc, tmp_path)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**doc, "name": name}, sort_keys=False))
    result = invoke("check", "budgets", str(path))
    assert result.code in (0, 1), result.output
    lines = result.stdout.splitlines()
    found = {}
    for i, line in enumerate(lines):
        m = re.match(r"\s*OVER BUDGET \[([a-z-]+)\]: (.*)$", line)
        if m and i + 1 < len(lines) and lines[i + 1].strip().startswith("→ "):
            found[m.group(1)] = (m.group(2), lines[i + 1].strip()[2:])
    return result.code, found


def _lane(key: str, value: Any) -> Change:
    def change(doc: Doc) -> None:
        doc["lanes"][0][key] = value
    return change


def _offload(**values: Any) -> Change:
    def change(doc: Doc) -> None:
        doc["lanes"][0]["offload"].update(values)
        if "hot_experts_per_layer" in values:
            doc["lanes"][0]["offload"].pop("cold_experts_budget", None)
    return change


def _offload_by(gib: int) -> Change:
    def change(doc: Doc) -> None:
        now = float(doc["lanes"][0]["offload"]["load_cpu_offload"].split()[0])
        doc["lanes"][0]["offload"]["load_cpu_offload"] = f"{now + gib:g} GiB"
    return change


# What each fix the ledger words says to change, read from its words alone.
_LEVERS: list[tuple[str, Callable[[re.Match[str]], Change]]] = [
    (r"lower offload\.load_cpu_offload to at most (\d+) GiB", lambda m: _offload(load_cpu_offload=f"{m[1]} GiB")),
    (r"raise offload\.load_cpu_offload to at least (\d+) GiB", lambda m: _offload(load_cpu_offload=f"{m[1]} GiB")),
    (r"raise offload\.load_cpu_offload by (?:at least|about) (\d+) GiB", lambda m: _offload_by(int(m[1]))),
    (r"switch to usage-aware placement with (\d+)\+ hot per layer",
     lambda m: _offload(placement="usage-aware", hot_experts_per_layer=int(m[1]))),
    (r"(?:raise|lower) hot experts per layer to (?:at least )?(\d+)",
     lambda m: _offload(hot_experts_per_layer=int(m[1]))),
    (r"lower max_model_len to at most ([\d,]+)", lambda m: _lane("max_model_len", int(m[1].replace(",", "")))),
    (r"raise gpu_memory_utilization to ([\d.]+)", lambda m: _lane("gpu_memory_utilization", float(m[1]))),
]
# The same levers as a refused fix says them ("lowering offload.load_cpu_offload to 45 GiB would ...").
_REFUSED: list[tuple[str, Callable[[re.Match[str]], Change]]] = [
    (r"lowering offload\.load_cpu_offload to (\d+) GiB", lambda m: _offload(load_cpu_offload=f"{m[1]} GiB")),
    (r"raising offload\.load_cpu_offload to (\d+) GiB", lambda m: _offload(load_cpu_offload=f"{m[1]} GiB")),
    (r"raising offload\.load_cpu_offload by (\d+) GiB", lambda m: _offload_by(int(m[1]))),
    (r"switching to usage-aware placement with (\d+) hot per layer",
     lambda m: _offload(placement="usage-aware", hot_experts_per_layer=int(m[1]))),
    (r"(?:raising|lowering) hot experts per layer to (\d+)", lambda m: _offload(hot_experts_per_layer=int(m[1]))),
]
_BREAKS = {  # how a refused fix names a budget -> the budget's kind, and how its own line says the amount
    "HBM {} over its cap": ("hbm", "exceed the HBM cap by {}"),
    "host memory {} over": ("host", "host memory over by {}"),
    "HBM {} over while loading": ("load-hbm", ", {} over the GPU's"),
    "host memory {} over while loading": ("load-host", ", {} over the machine's"),
}


def _offered(fix: str) -> list[tuple[str, Change]]:
    """The fixes a suggestion offers: the text before any refused lever ('… would …')."""
    head = fix.split(";")[0]
    if " would " in head or head.startswith("no single change"):
        return []
    out = []
    for pattern, change in _LEVERS:
        out += [(m[0], change(m)) for m in re.finditer(pattern, head)]
    return out


def _refused(fix: str) -> list[tuple[str, Change, list[tuple[str, str]]]]:
    """The levers a suggestion says would break a budget: (words, change, [(kind, amount)])."""
    out = []
    for clause in re.split(r"; |, and ", fix):
        if " would " not in clause:
            continue
        lever, broken = clause.split(" would ", 1)
        changes = [change(m) for pattern, change in _REFUSED for m in [re.search(pattern, lever)] if m]
        assert len(changes) == 1, clause
        said = []
        refusal = re.fullmatch(r"make the expert residency runtime refuse the lane at (?:boot|load): (.*)", broken)
        if refusal:   # the lane's own runtime line must say the same reason (its '; ' said as ' — ')
            out.append((clause, changes[0], [("runtime", refusal[1].replace(" — ", "; "))]))
            continue
        for part in re.split(r" and (?=HBM|host)", broken.removeprefix("put ")):
            for words, (kind, _) in _BREAKS.items():
                m = re.fullmatch(re.escape(words).replace(r"\{\}", r"([\d,.]+ GiB)"), part)
                if m:
                    said.append((kind, m[1]))
                    break
            else:
                raise AssertionError(f"unread budget: {part!r} in {clause!r}")
        out.append((clause, changes[0], said))
    return out


def _copy(doc: Doc) -> Doc:
    shape = doc["_shape"]
    out = yaml.safe_load(yaml.safe_dump({k: v for k, v in doc.items() if k != "_shape"}))
    out["_shape"] = shape
    return out


def _assert_every_fix_holds(doc: Doc, tmp_path: Path, name: str) -> dict[str, tuple[str, str]]:
    """Apply each offered fix and each refused lever of `doc`'s run; return the run's violations."""
    code, before = _budgets(doc, tmp_path, name)
    assert code == 1 and before
    for kind, (_, fix) in before.items():
        for i, (words, change) in enumerate(_offered(fix)):
            changed = _copy(doc)
            change(changed)
            _, after = _budgets(changed, tmp_path, f"{name}-{kind}-fix{i}")
            assert kind not in after, f"[{kind}] fix {words!r} leaves it over: {after[kind][0]}"
            new = set(after) - set(before)
            assert not new, f"[{kind}] fix {words!r} breaks " + "; ".join(
                f"[{k}] {after[k][0]}" for k in sorted(new))
        for i, (clause, change, said) in enumerate(_refused(fix)):
            changed = _copy(doc)
            change(changed)
            _, after = _budgets(changed, tmp_path, f"{name}-{kind}-refused{i}")
            assert said, clause
            for broken, amount in said:
                assert broken in after, f"{clause!r}: but [{broken}] holds: {sorted(after)}"
                own = amount if broken == "runtime" else dict(_BREAKS.values())[broken].format(amount)
                assert own in after[broken][0], f"{clause!r}: the run says {after[broken][0]}"
    return before


def test_q235_on_h200_pcie_offers_no_fix_that_breaks_hbm(tmp_path: Path) -> None:
    """The QA case: no change of this lane fits the PCIe box (lowering --cpu-offload-gb to fit the
    host overfills HBM; usage-aware needs 91+ hot for the host where HBM holds 66), so nothing is
    offered as a fix, each lever is said with the budget it breaks, and `recipegen fit` is named."""
    doc = _doc(REPO / "recipes" / "qwen3-235b-a22b-fp8-h200.yaml")
    doc["machines"]["dgx"]["catalog"] = "h200-pcie"
    before = _assert_every_fix_holds(doc, tmp_path, "q235pcie")
    message, fix = before["host"]
    assert "host memory over by 93.17 GiB" in message
    assert fix.startswith("no single change to this lane fits this machine: ")
    assert "recipegen fit RECIPE --dry-run" in fix
    refused = _refused(fix)
    assert [c.split(" would ")[0].split(": ")[-1] for c, _, _ in refused] == [
        "lowering offload.load_cpu_offload to 45 GiB", "switching to usage-aware placement with 91 hot per layer"]
    assert all(("hbm" in {k for k, _ in said}) for _, _, said in refused)


@pytest.mark.parametrize("name, kind, fix", [
    ("hot-over-hbm-cap", "hbm", "lower hot experts per layer to 299 (room for one max_model_len sequence)"),
    ("kv-below-max-model-len", "kv", "lower max_model_len to at most 724,096 (a whole number of 128-token blocks), "
                                     "or lower hot experts per layer to 299"),
    ("all-experts-pinned-positional", "host", "lower offload.load_cpu_offload to at most 91 GiB"),
])
def test_a_fix_that_fits_is_printed_as_before(tmp_path: Path, name: str, kind: str, fix: str) -> None:
    """Fixes that fit every other budget keep their words; each one applied clears its budget."""
    before = _assert_every_fix_holds(_doc(FAILURES / f"{name}.yaml"), tmp_path, name)
    if name == "all-experts-pinned-positional":
        # usage-aware with 132 hot keeps vLLM's 269 GiB load offload: its pinned blocks overfill the host
        assert before[kind][1].startswith(fix + "; switching to usage-aware placement with 132 hot per layer "
                                          "would put host memory ")
        assert before[kind][1].endswith(" over while loading")
    else:
        assert before[kind][1] == fix


def test_load_host_fix_that_overfills_hbm_at_load_is_named(tmp_path: Path) -> None:
    """Qwen3-30B-A3B on its RTX 4090 desktop cut to 64 GiB of host: the load peaks over the host, and
    lowering --cpu-offload-gb far enough for it overfills the 24 GB card at load."""
    doc = _doc(REPO / "recipes" / "qwen3-30b-a3b-rtx4090.yaml")
    doc["machines"]["desk"]["host_memory"]["value"] = "64 GiB"
    before = _assert_every_fix_holds(doc, tmp_path, "q30desk")
    _, fix = before["load-host"]
    assert re.fullmatch(r"no single change to this lane fits this machine: lowering offload\.load_cpu_offload to "
                        r"\d+ GiB would put HBM [\d.]+ GiB over while loading; `recipegen fit RECIPE --dry-run` "
                        r"searches placements and names the smallest machine change", fix), fix


def _load_peak_hbm(doc: Doc, tmp_path: Path, name: str) -> tuple[float, float]:
    """The printed HBM load-time peak and what the GPU can allocate, in GiB (`Load: … peak HBM X GiB of Y GiB`)."""
    doc = _with_rowmap(doc, tmp_path)
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({**doc, "name": name}, sort_keys=False))
    out = invoke("check", "budgets", str(path)).stdout
    m = re.search(r"peak HBM ([\d,.]+) GiB of ([\d,.]+) GiB", out)
    assert m, out
    return float(m[1].replace(",", "")), float(m[2].replace(",", ""))


def test_a_fix_that_lowers_a_load_peak_already_over_is_still_offered(tmp_path: Path) -> None:
    """GLM-5's lane moved to 8x H100: over the HBM cap at steady state, and its load peak is over
    too (the ledger reports no load-time violation on a side already over at the end). Lowering the
    hot count is the lever for HBM; it leaves the load peak over, but lower than it was, so it is not
    the fix that "puts HBM over while loading" and must be offered, not refused."""
    doc = _doc(REPO / "recipes" / "glm-5-h200x8.yaml")
    doc["machines"]["dgx"]["catalog"] = "h100-sxm-x8"
    (tmp_path / "models").mkdir()
    shutil.copy(REPO / "recipes" / doc["model"]["file"], tmp_path / doc["model"]["file"])
    _, before = _budgets(doc, tmp_path, "glm")
    fix = before["hbm"][1]
    offered = re.search(r"lower hot experts per layer to (\d+)", fix)
    assert offered and " would " not in fix, fix
    peak_before, capacity = _load_peak_hbm(doc, tmp_path, "glm-peak")
    assert peak_before > capacity   # over already, though no [load-hbm] line says so
    changed = _copy(doc)
    _offload(hot_experts_per_layer=int(offered[1]))(changed)
    _, after = _budgets(changed, tmp_path, "glm-fix")
    assert "hbm" not in after and "kv" not in after, after
    peak_after, _ = _load_peak_hbm(changed, tmp_path, "glm-fix-peak")
    assert peak_after < peak_before


def test_a_switch_the_runtime_would_refuse_is_said_as_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Nemotron-3-Nano's experts are relu2 without a gate, which the runtime's split cannot compute:
    on a 5090 box with 56 GiB of host memory its positional lane is over on the host, and the
    usage-aware lever, which would fit no budget either way, is said as the runtime's refusal (it
    was offered as a load-time host overflow, as if more hot experts would do)."""
    monkeypatch.chdir(tmp_path)
    config = REPO / "tests" / "fixtures" / "hf_configs" / "nemotron-3-nano-30b-a3b" / "config.json"
    made = invoke("new", str(config), "--machine", "rtx-5090", "--name", "nano")
    assert made.code == 0, made.output
    doc = _doc(tmp_path / "recipes" / "nano.yaml")
    doc["machines"]["rtx-5090"] = {"catalog": "rtx-5090", "host_memory": "56 GiB"}
    doc["model"] = {"file": "recipes/models/nemotron-3-nano-30b-a3b.yaml"}   # from tmp_path, where _budgets writes
    before = _assert_every_fix_holds(doc, tmp_path, "nano56")
    fix = before["host"][1]
    assert fix.startswith("no single change to this lane fits this machine: lowering offload.load_cpu_offload to ")
    assert re.search(r"switching to usage-aware placement with \d+ hot per layer would make the expert residency "
                     r"runtime refuse the lane at boot: expert activation 'relu2_no_mul': experts without a gate "
                     r"\(an up projection only, e\.g\. Nemotron-H's relu2\) — the runtime's split computes gated "
                     r"experts only \(w13 = gate \+ up rows\); `recipegen fit", fix), fix


def test_a_refusal_the_lane_can_lift_keeps_its_remedy_and_is_no_dead_end(tmp_path: Path) -> None:
    """gpt-oss on a one-GPU B200 box: the usage-aware lever meets two refusals at load, the first of
    which the lane lifts itself (EXPERT_RESIDENCY_BANK_KERNEL=triton). The reason was cut at its first
    '; ', dropping that remedy, and the line counted the lever as one no hot count could save."""
    doc = _doc(REPO / "recipes" / "gpt-oss-120b-l40s.yaml")
    (key,) = doc["machines"]
    doc["machines"][key] = {"catalog": "b200-x8", "gpus": {"count": 1, "hbm": "48 GB"}, "host_memory": "145 GiB"}
    code, found = _budgets(doc, tmp_path, "gb")
    assert code == 1 and "host" in found, found
    fix = found["host"][1]
    assert fix.startswith("lower offload.load_cpu_offload to at most "), fix          # offered, not a dead end
    assert "— set EXPERT_RESIDENCY_BANK_KERNEL=triton" in fix and ", and at load: vLLM's MXFP4 backend" in fix, fix
    assert "no single change" not in fix



def test_which_broken_budgets_put_a_lever_past_fixing() -> None:
    from recipegen.ledger.fix_check import breaks_past_fixing
    # a host fix that overfills HBM, or one the runtime refuses whatever the hot count: past fixing
    assert breaks_past_fixing("host", ["hbm"]) and breaks_past_fixing("host", ["runtime"])
    # one that overfills the host further, or one the lane's own environment setting lifts: not
    assert not breaks_past_fixing("host", ["load-host"])
    assert not breaks_past_fixing("host", ["runtime-lane"]) and not breaks_past_fixing("hbm", ["runtime-lane"])
