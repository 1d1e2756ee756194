"""Follow-ups to machine files from the catalog and the fit's choice rule: the `--machine` error
points at `recipegen machine list` and both machine-file forms; `compare`'s `fastest:` line follows
`choice.same_speed` (rounding noise is a tie, said in the fit's words); docs/fit.md quotes what the
commands it shows print; the README's workflow block names the list commands; TokenCount's JSON
Schema description says what the validator accepts."""

from __future__ import annotations

import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from cli_support import invoke
from doc_commands import commands_and_quotes
from pydantic import TypeAdapter, ValidationError

from recipegen.fit.compare import fastest_text
from recipegen.fit.objective import Projection
from recipegen.schema.base import TokenCount

REPO = Path(__file__).resolve().parent.parent
FIT_PAGE = REPO / "docs" / "fit.md"


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    return tmp_path


# ------------------------------------------------------------------ --machine error

@pytest.mark.parametrize("command", [["new", "qwen3-30b-a3b", "--machine", "no-such-box"],
                                     ["compare", "dsv41-flash-gb300", "--machines", "h200-pcie,no-such-box"]])
def test_an_unknown_machine_points_at_the_list_and_both_file_forms(here: Path, command: list[str]) -> None:
    result = invoke(*command)
    assert result.code == 2, result.output
    assert "'no-such-box' is not a catalog machine nor a machine file" in result.output
    assert "`recipegen machine list`" in result.output and "h200-pcie" in result.output
    assert "`recipegen machine detect -o FILE`" in result.output and "`catalog: <id>`" in result.output
    assert "Traceback" not in result.output


# ------------------------------------------------------------------ compare's fastest line

def _cand(tok_s: float, kv: float) -> SimpleNamespace:
    text = f"{tok_s:,.1f} tok/s at 1 stream (validation band 1.0–2.0)"
    return SimpleNamespace(projection=Projection(tok_s, text, "test", tokens_per_s=tok_s), kv_tokens=kv)


def test_rounding_noise_between_machines_is_a_tie_not_the_fastest() -> None:
    a, b = _cand(1.2345, 100), _cand(1.2345 + 1e-15, 100)
    assert b.projection.score > a.projection.score  # the raw max would name b
    line = fastest_text([("a", a), ("b", b)])  # type: ignore[list-item]
    assert line.startswith("a tie between a and b: the same speed (1.2 tok/s at 1 stream "
                           "(validation band 1.0–2.0)) and KV pool (speed: "), line
    assert "faster" not in line


def test_equal_speed_goes_to_the_larger_kv_pool_in_the_fits_words() -> None:
    a, b = _cand(16.65605562740838, 50), _cand(16.656055627408374, 100)  # 6e-15 apart: a is "faster"
    assert a.projection.score > b.projection.score
    line = fastest_text([("a", a), ("b", b)])  # type: ignore[list-item]
    assert line.startswith("b (speed: "), line
    assert line.endswith("; over a: the same speed (16.7 tok/s at 1 stream (validation band 1.0–2.0)); "
                         "chosen for its larger KV pool (100 tokens against 50)"), line


def test_a_difference_below_the_printed_precision_is_said_so() -> None:
    a, b, c = _cand(16.74, 1), _cand(16.68, 2), _cand(9.0, 3)
    line = fastest_text([("b", b), ("c", c), ("a", a)])  # type: ignore[list-item]
    assert line.startswith("a (speed: "), line
    assert line.endswith("; over b: the same 16.7 tok/s at 1 stream at the printed precision; chosen on the "
                         "estimate before rounding (16.74 tok/s against 16.68 tok/s), a difference below the "
                         "printed precision"), line
    assert "over c" not in line  # clearly slower: the table shows it


def test_a_clearly_faster_machine_is_named_alone() -> None:
    line = fastest_text([("slow", _cand(10.0, 9)), ("fast", _cand(20.0, 1))])  # type: ignore[list-item]
    assert line.startswith("fast (speed: the decode estimate") and "over" not in line and "tie" not in line


def test_compare_calls_a_catalog_machine_and_its_file_with_more_ram_a_tie(here: Path) -> None:
    """The same H200 with 144 GiB of host memory instead of 125.87: Qwen3-30B-A3B fits all in HBM on
    both, with the same speed and KV pool; the line named the first machine fastest before."""
    result = invoke("new", "qwen3-30b-a3b", "--machine", "h200-pcie", "-o", "recipes/q.yaml")
    assert result.code == 0, result.output
    (here / "box.yaml").write_text("catalog: h200-pcie\nhost_memory: 144 GiB\n")
    result = invoke("compare", "recipes/q.yaml", "--machines", "h200-pcie,box.yaml")
    assert result.code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("  fastest:"))
    assert line.startswith("  fastest: a tie between h200-pcie and box.yaml: the same speed ("), line
    speed = line.split(": the same speed (")[1].split(") and KV pool")[0]
    rows = result.output.splitlines()[2:4]
    assert [x.endswith(speed) for x in rows] == [True, True], result.output  # both rows print it


# ------------------------------------------------------------------ docs/fit.md and README

def _fit_page_blocks() -> list[tuple[list[str], list[str]]]:
    """(argv, quoted output lines) of every docs/fit.md block that quotes output (indented lines)."""
    blocks = FIT_PAGE.read_text(encoding="utf-8").split("```")[1::2]
    return commands_and_quotes([b for b in blocks if not b.startswith("yaml") and re.search(r"^  ", b, re.M)])


def test_the_fit_page_quotes_what_its_commands_print(here: Path) -> None:
    text = FIT_PAGE.read_text(encoding="utf-8")
    machine_file = re.search(r"```yaml\n(catalog: h200-pcie\n.*?)```", text, re.S)
    assert machine_file, "docs/fit.md no longer shows the catalog machine file"
    (here / "box.yaml").write_text(machine_file.group(1))
    found = _fit_page_blocks()
    assert sorted(argv[-1] for argv, _ in found) == ["7", "box.yaml", "h200-pcie"]
    for i, (argv, quoted) in enumerate(found):
        result = invoke(*argv, "-o", f"recipes/r{i}.yaml")
        assert result.code in (0, 1), result.output
        lines = [x.rstrip() for x in result.output.splitlines()]
        for want in quoted:
            assert want in lines, \
                f"`recipegen {' '.join(argv)}` no longer prints:\n{want}\n--- it printed:\n{result.output}"


@pytest.mark.parametrize("kind", ["model", "machine"])
def test_the_list_commands_the_docs_show_run(kind: str) -> None:
    result = invoke(kind, "list")
    assert result.code == 0 and result.output.strip(), result.output
    assert f"recipegen {kind} list" in (REPO / "README.md").read_text(encoding="utf-8").split(
        "## The operator's workflow")[1].split("```")[1]
    assert f"recipegen {kind} list" in FIT_PAGE.read_text(encoding="utf-8")


# ------------------------------------------------------------------ TokenCount's description

def test_the_token_count_description_says_what_the_validator_accepts() -> None:
    adapter: TypeAdapter[int] = TypeAdapter(TokenCount)
    description = adapter.json_schema()["description"]
    assert description.startswith("A positive whole number") and "K/M/G binary" in description
    for text, value in (("25.6k", 25600), ("1M", 1048576)):
        assert f"{text} = {value}" in description
        assert adapter.validate_python(text) == value
    assert adapter.validate_python(2**53) == 2**53 and "at most 2^53" in description
    for refused in (0, "0", -5, "-5", 32768.0, "1.5M", 2**53 + 1):
        with pytest.raises(ValidationError):
            adapter.validate_python(refused)


def test_a_catalog_checkpoint_id_names_the_hub_revision_to_pass(tmp_path: Path) -> None:
    # the note told users to pass the literal text "{repo}@main"
    result = invoke("new", "Qwen/Qwen3-30B-A3B", "--machine", "rtx-5090", "-o", str(tmp_path / "q.yaml"))
    assert result.code == 0, result.output
    assert "pass Qwen/Qwen3-30B-A3B@main to read the hub instead" in result.output
    assert "{repo}" not in result.output


def test_an_unknown_model_points_at_the_list_command() -> None:
    result = invoke("new", "no-such-model", "--machine", "rtx-5090")
    assert result.code == 2
    assert "`recipegen model list`" in result.output and "qwen3-30b-a3b" in result.output


def test_machines_with_different_kinds_of_speed_figure_are_not_ranked() -> None:
    # a tok/s estimate scores > 0 and the link-read stand-in <= 0 (negated ms; 0 with nothing offloaded):
    # ranking them on one scale would call the estimated machine fastest whatever the figures
    from recipegen.fit.objective import LINK_READS

    estimated = _cand(20.0, 100)
    all_hbm = SimpleNamespace(projection=Projection(0.0, "no link reads (every routed expert in HBM)",
                                                    "nothing offloaded", LINK_READS), kv_tokens=500)
    line = fastest_text([("a", estimated), ("b", all_hbm)])  # type: ignore[list-item]
    assert line.startswith("not ranked: the machines' speed figures are of different kinds"), line
    assert "a: 20.0 tok/s" in line and "b: no link reads" in line
