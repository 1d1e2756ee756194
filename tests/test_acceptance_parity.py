"""Parity: comparison logic, fixture parsing, and the CLI against a loopback OpenAI-compatible server."""

from __future__ import annotations

import json

import pytest
from acceptance_support import FakeModel, serve
from click.testing import CliRunner

from recipegen.acceptance.fixture import Prompt, load_fixture, parse_fixture
from recipegen.acceptance.parity import Output, first_divergence, judge_prompt
from recipegen.cli import main
from recipegen.errors import InputError

P = Prompt(id="p", category="agent", prompt="x")


def out(*ids: int) -> Output:
    return Output(text="".join(f" w{i}" for i in ids), token_ids=ids)


def test_first_divergence_by_token_with_text_context():
    d = first_divergence(out(1, 2, 3, 4), out(1, 2, 9, 4))
    assert d is not None and d.unit == "token" and d.index == 2
    assert d.common.endswith(" w1 w2 w") and d.left.startswith("3") and d.right.startswith("9")
    assert first_divergence(out(1, 2), out(1, 2)) is None
    assert first_divergence(out(1, 2), out(1, 2, 3)).index == 2  # one is a prefix of the other


def test_first_divergence_falls_back_to_text():
    d = first_divergence(Output("the host"), Output("that host"))
    assert d.unit == "char" and d.index == 2


def test_verdicts_separate_placement_from_nondeterminism():
    a, b = out(1, 2, 3), out(1, 2, 4)
    assert judge_prompt(P, [a, a], [a, a]).status == "exact"
    diverges = judge_prompt(P, [a, a], [b, b])
    assert diverges.status == "diverges" and diverges.divergence.index == 2 and diverges.a_self_exact
    nondet_a = judge_prompt(P, [a, b], [a, a])
    assert nondet_a.status == "nondeterministic" and not nondet_a.a_self_exact
    assert nondet_a.self_divergence.index == 2
    # A stable, B jitters but reproduces A once: B's own nondeterminism, not a placement effect
    assert judge_prompt(P, [a, a], [a, b]).status == "nondeterministic"
    # one run each: nothing can be excused
    assert judge_prompt(P, [a], [b]).status == "diverges"


def test_default_fixture_has_the_seeds_categories():
    fixture = load_fixture()
    assert len(fixture.prompts) == 50
    assert fixture.categories() == {"agent": 8, "prose": 8, "code": 10, "math": 10, "non-english": 8, "tool": 6}
    assert len({p.id for p in fixture.prompts}) == 50


@pytest.mark.parametrize("text, line, field", [
    ('{"id": "a", "prompt": "x"}\n{"id": "a", "prompt": "y"}', 2, "id"),
    ('{"id": "a"}', 1, "prompt"),
    ('{"id": "a", "prompt": "x", "colour": 1}', 1, "colour"),
    ('# comment\n\n{"id": "a", "prompt": "x", "tools": []}', 3, "tools"),
    ('{"id": "a", "messages": [{"content": "hi"}]}', 1, "messages"),
])
def test_bad_fixture_names_file_line_and_field(text, line, field):
    with pytest.raises(InputError) as info:
        parse_fixture(text, "f.jsonl")
    assert (info.value.file, info.value.line, info.value.field) == ("f.jsonl", line, field)
    assert f"f.jsonl:{line}" in str(info.value)


def write_fixture(tmp_path, n=6, jitter_ids=()):
    lines = [{"id": f"p{i}", "category": "agent" if i % 2 else "prose",
              "prompt": f"prompt number {i}" + (" JITTER" if i in jitter_ids else "")} for i in range(n)]
    lines.append({"id": "chat", "category": "tool", "messages": [{"role": "user", "content": "call a tool"}]})
    path = tmp_path / "fixture.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return path


def run_parity(*args):
    return CliRunner().invoke(main, ["parity", *map(str, args)], catch_exceptions=False)


def test_parity_of_a_server_against_itself_passes(tmp_path):
    fixture = write_fixture(tmp_path)
    with serve(FakeModel()) as url:
        result = run_parity(url, url, "--fixture", fixture, "--runs", "2", "--max-tokens", "12",
                            "--json", tmp_path / "r.json")
    assert result.exit_code == 0, result.output
    assert "PASS" in result.output and "exact 7/7" in result.output
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["passed"] and data["summary"]["exact"] == 7
    assert data["pairwise_exact"]["A1×B1"] == {"exact": 7, "total": 7}
    assert data["endpoints"]["A"]["models"][0]["id"] == "fake-moe"


def test_parity_detects_a_perturbed_engine(tmp_path):
    fixture = write_fixture(tmp_path)
    with serve(FakeModel(weight_seed=0)) as url_a, serve(FakeModel(weight_seed=1)) as url_b:
        result = run_parity(url_a, url_b, "--fixture", fixture, "--runs", "2", "--max-tokens", "12")
    assert result.exit_code == 1, result.output
    assert "FAIL" in result.output and "diverges 7/7" in result.output
    assert "A≠B at token 3" in result.output  # the fake engines agree on the first three tokens


def test_serving_nondeterminism_is_not_a_placement_effect(tmp_path):
    fixture = write_fixture(tmp_path, jitter_ids=(2,))
    with serve(FakeModel(jitter=("JITTER",))) as url:
        result = run_parity(url, url, "--fixture", fixture, "--runs", "2", "--max-tokens", "12")
    assert result.exit_code == 0, result.output
    assert "nondeterministic 1/7" in result.output
    row = next(line for line in result.output.splitlines() if line.startswith("p2 "))
    assert "nondeterministic" in row and "A≠A at token 6" in row


def test_text_comparison_when_the_server_gives_no_token_ids(tmp_path):
    fixture = write_fixture(tmp_path, n=2)
    with serve(FakeModel(with_token_ids=False)) as url_a, \
            serve(FakeModel(with_token_ids=False, weight_seed=5)) as url_b:
        result = run_parity(url_a, url_b, "--fixture", fixture, "--runs", "1", "--max-tokens", "8")
    assert result.exit_code == 1 and "A≠B at char" in result.output
    assert "one run of A cannot tell" in result.output


def test_unreachable_endpoint_is_a_clear_error(tmp_path):
    fixture = write_fixture(tmp_path, n=1)
    result = CliRunner().invoke(main, ["parity", "http://127.0.0.1:9", "http://127.0.0.1:9", "--fixture",
                                       str(fixture)])
    assert result.exit_code == 2
    assert "error: http://127.0.0.1:9/v1/models: connection refused" in result.output
    assert "Traceback" not in result.output


def test_recorded_runs_compare_across_boots(tmp_path):
    fixture = write_fixture(tmp_path)
    record = tmp_path / "control.json"
    with serve(FakeModel()) as url:
        made = run_parity(url, "--record", record, "--fixture", fixture, "--runs", "2", "--max-tokens", "10")
    assert made.exit_code == 0, made.output
    assert json.loads(record.read_text())["format"] == "recipegen-parity-record"
    with serve(FakeModel()) as url:  # a fresh "boot" of the same engine: passes against the recording
        same = run_parity(url, record, "--fixture", fixture, "--max-tokens", "10")
    assert same.exit_code == 0 and "recorded in" in same.output, same.output
    with serve(FakeModel(weight_seed=9)) as url:
        other = run_parity(url, record, "--fixture", fixture, "--max-tokens", "10")
    assert other.exit_code == 1 and "diverges 7/7" in other.output
    # a recording made with other settings is refused, naming the file and field
    bad = CliRunner().invoke(main, ["parity", str(record), str(record), "--fixture", str(fixture),
                                    "--max-tokens", "11"])
    assert bad.exit_code == 2 and "settings.max_tokens" in bad.output
    both = run_parity(record, record, "--fixture", fixture, "--max-tokens", "10")
    assert both.exit_code == 0 and "PASS" in both.output
