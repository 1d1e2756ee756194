"""The footer glossary explains recipegen's own shorthand, not words inside what the user gave it:
a parity recording named v14.json is not the reference lane's v14, while a report that prints
recipegen's own "v14" still explains it (recipegen.common.glossary.mask_user_text,
recipegen.cli.output)."""

from __future__ import annotations

import json
from pathlib import Path

import click
from acceptance_support import FakeModel, serve
from cli_support import invoke
from click.testing import CliRunner

from recipegen.cli.output import ExplainedEcho, explained
from recipegen.common import glossary

REVISIONS = "v11–v15: revisions of the reference GB300 lane"


def _fixture(tmp_path: Path) -> Path:
    path = tmp_path / "fixture.jsonl"
    path.write_text("\n".join(json.dumps({"id": f"p{i}", "category": "prose", "prompt": f"prompt {i}"})
                              for i in range(3)) + "\n")
    return path


# ------------------------------------------------------------------ the masking rule


def test_a_term_inside_a_user_value_is_not_matched_but_recipegens_own_is() -> None:
    header = "B: http://h:1  model m  (recorded in /tmp/v14.json)"
    assert any(REVISIONS in line for line in glossary.footnotes(header))   # what QA saw
    assert glossary.footnotes(header, ["/tmp/v14.json"]) == []
    own = header + "\nthe field report's v14 C1 88.74 tok/s"
    assert any(REVISIONS in line for line in glossary.footnotes(own, ["/tmp/v14.json"]))


def test_a_user_value_is_masked_only_where_it_stands_whole() -> None:
    # a lane named "v1" does not hide recipegen's "v14"; a class named "hot" hides only itself
    assert any(REVISIONS in line for line in glossary.footnotes("lane v1: v14 positional", ["v1"]))
    names = [t.name for t in glossary.used_terms("class hot; hotter", ["hot"])]
    assert "hot / cold" not in names
    names = [t.name for t in glossary.used_terms("class hot; 295 hot experts", ["class hot"])]
    assert "hot / cold" in names


def test_the_command_lines_values_are_left_out_and_defaults_are_not() -> None:
    @click.command()
    @click.argument("source")
    @click.option("--json", "json_path", type=click.Path(path_type=Path), default=None)
    @click.option("--label", default="v12")
    def report(source: str, json_path: Path | None, label: str) -> None:
        with explained() as say:
            say(f"compared {source}, wrote {json_path.resolve() if json_path else '-'}; label {label}")

    # the user's v14.json (as given, and by its file name once resolved) explains nothing ...
    result = CliRunner().invoke(report, ["/tmp/v14.json", "--json", "v13.json", "--label", "lab"])
    assert result.exit_code == 0, result.output
    assert "/tmp/v14.json" in result.output and "v13.json" in result.output
    assert "v11–v15" not in result.output
    # ... while a default is recipegen's own word and is explained
    result = CliRunner().invoke(report, ["/tmp/x.json"])
    assert REVISIONS in result.output


def test_explained_echo_takes_the_commands_user_text() -> None:
    def report(user_text: list[str], later: list[str]) -> str:
        @click.command()
        def command() -> None:
            say = ExplainedEcho(user_text=user_text)
            say("A: http://h:1  model model-v15")
            say.user_text(later)
            say("host TP-lab")
            say.finish()

        return CliRunner().invoke(command, []).output

    assert "shorthand above" not in report(["model-v15"], ["TP-lab"])
    told = report([], [])
    assert REVISIONS in told and "TP: tensor parallelism" in told


# ------------------------------------------------------------------ parity against the fake server


def test_parity_against_a_recording_named_v14_gets_no_reference_lane_line(tmp_path: Path) -> None:
    fixture = _fixture(tmp_path)
    record = tmp_path / "v14.json"
    with serve(FakeModel()) as url:
        made = invoke("parity", url, "--record", str(record), "--fixture", str(fixture), "--max-tokens", "8")
        assert made.code == 0, made.output
        result = invoke("parity", url, str(record), "--fixture", str(fixture), "--max-tokens", "8")
    assert result.code == 0, result.output
    assert f"(recorded in {record})" in result.stdout and "PASS" in result.stdout
    assert "v11–v15" not in result.stdout
    assert "shorthand above" not in result.stdout


def test_parity_leaves_out_what_the_server_said(tmp_path: Path) -> None:
    # a served model named like recipegen's shorthand (TP, v12) is the server's name, not recipegen's
    fixture = _fixture(tmp_path)
    with serve(FakeModel(name="moe-TP-v12")) as url:
        result = invoke("parity", url, url, "--fixture", str(fixture), "--max-tokens", "8")
    assert result.code == 0, result.output
    assert "model moe-TP-v12" in result.stdout
    assert "v11–v15" not in result.stdout and "TP: tensor parallelism" not in result.stdout


def test_a_report_in_recipegens_own_v14_wording_still_explains_it() -> None:
    # plan quotes the field report's "v14 C1 88.74 tok/s" for the reference lane's acceptance
    result = invoke("plan", "dsv41-flash-gb300", "agent", "--concurrency", "1")
    assert result.code == 0, result.output
    assert "v14 C1 88.74 tok/s" in result.stdout
    assert REVISIONS in result.stdout
