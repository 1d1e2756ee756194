"""Parity: comparison logic, fixture parsing, and the CLI against a loopback OpenAI-compatible server."""

from __future__ import annotations

import json

import pytest
from acceptance_support import FakeModel, serve
from cli_support import invoke

from recipegen.acceptance.fixture import Prompt, load_fixture, parse_fixture
from recipegen.acceptance.parity import Output, first_divergence, judge_prompt
from recipegen.common.errors import InputError

P = Prompt(id="p", category="agent", prompt="x")


def out(*ids: int) -> Output:
    return Output(text="".join(f" w{i}" for i in ids), token_ids=ids)


def test_first_divergence_by_token_with_text_context():
    d = first_divergence(out(1, 2, 3, 4), out(1, 2, 9, 4))
    assert d is not None and d.unit == "token" and d.index == 2
    # the diverging tokens themselves (cut at the word boundaries around the first differing character)
    assert (d.common, d.left, d.right) == (" w1 w2", " w3", " w9")
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


def jittered(base: tuple[int, ...], at: int, token: int = 99) -> Output:
    """`base` with the token at `at` replaced: a run that parts from `base` exactly there."""
    return out(*base[:at], token, *base[at + 1:])


RUN = tuple(range(1, 301))  # a 300-token greedy run


@pytest.mark.parametrize("a_runs, b_runs, status, index", [
    # the excuse that must not hold: A jitters with itself at token 200, but already leaves B at 0
    ([out(*RUN), jittered(RUN, 200)], [jittered(RUN, 0, 7)] * 2, "diverges", 0),
    # A's own runs disagree at 5; one leaves B at 9, the other at 5 (never before 5): A's jitter
    ([out(*RUN), jittered(RUN, 5)], [jittered(RUN, 9)] * 2, "nondeterministic", 5),
    # ... and at exactly the jitter point, still A's jitter
    ([out(*RUN), jittered(RUN, 5)], [jittered(RUN, 5, 7)] * 2, "nondeterministic", 5),
    # A's own runs disagree at 5 but leave B at 4, before: a real divergence
    ([jittered(RUN, 4), jittered(jittered(RUN, 4).token_ids, 5)], [out(*RUN)] * 2, "diverges", 4),
    # A stable and never reproduced: diverges wherever it is
    ([jittered(RUN, 250)] * 2, [out(*RUN)] * 2, "diverges", 250),
    # A stable, B jitters at 0 but one run of B reproduces A exactly: B's jitter
    ([out(*RUN)] * 2, [out(*RUN), jittered(RUN, 0)], "nondeterministic", 0),
    # three runs of A: two agree, a third jitters at 200; all leave B at 3
    ([jittered(RUN, 3)] * 2 + [jittered(jittered(RUN, 3).token_ids, 200)], [out(*RUN)] * 2,
     "diverges", 3),
    # one run of A reproduced by B, the other parts from it (and from B) at 10: A's jitter
    ([out(*RUN), jittered(RUN, 10)], [out(*RUN)], "nondeterministic", 10),
    # B's runs disagree with each other at 50, A follows one of them to 120 then leaves both:
    # B's jitter does not excuse A (A's own runs agree)
    ([jittered(jittered(RUN, 50).token_ids, 120)] * 2, [out(*RUN), jittered(RUN, 50)], "diverges", 120),
])
def test_divergence_is_excused_only_at_or_after_the_endpoints_own_jitter(a_runs, b_runs, status, index):
    verdict = judge_prompt(P, a_runs, b_runs)
    assert verdict.status == status, verdict.reason
    assert verdict.divergence is not None and verdict.divergence.index == index
    assert verdict.divergence.unit == "token"


def test_attribution_reason_names_both_points():
    diverges = judge_prompt(P, [out(*RUN), jittered(RUN, 200)], [jittered(RUN, 0, 7)] * 2)
    assert diverges.self_divergence.index == 200
    assert diverges.reason.startswith("A≠B at token 0")
    assert "before A's own runs disagree (token 200)" in diverges.reason
    excused = judge_prompt(P, [out(*RUN), jittered(RUN, 5)], [jittered(RUN, 9)] * 2)
    assert excused.reason.startswith("A≠A at token 5") and "A leaves B at token 5" in excused.reason


def test_attribution_on_text_when_one_output_lacks_token_ids():
    # compared on characters for every pair: A's own runs part at char 9, A leaves B at char 4
    a1, a2 = Output("the hostAAAA", (1, 2)), Output("the hostABBB")
    b = Output("the cold")
    verdict = judge_prompt(P, [a1, a2], [b, b])
    assert verdict.status == "diverges" and verdict.divergence.unit == "char"
    assert verdict.divergence.index == 4 and verdict.self_divergence.index == 9


def test_recorded_runs_attribute_per_prompt(tmp_path):
    """Both sides as recordings: the token-0 divergence with token-200 self-jitter fails, the
    jitter-after-divergence prompt passes, through the CLI and its JSON."""
    from recipegen.acceptance.fixture import load_fixture
    from recipegen.acceptance.parity import record_json

    path = tmp_path / "fixture.jsonl"
    path.write_text('{"id": "early", "category": "agent", "prompt": "a"}\n'
                    '{"id": "late", "category": "prose", "prompt": "b"}\n')
    fixture = load_fixture(path)
    settings = {"max_tokens": 300, "seed": 0}
    runs_a = [[out(*RUN), out(*RUN)], [jittered(RUN, 200), jittered(RUN, 5)]]
    runs_b = [[jittered(RUN, 0, 7), jittered(RUN, 9)]] * 2
    for name, runs in (("a.json", runs_a), ("b.json", runs_b)):
        (tmp_path / name).write_text(json.dumps(record_json(fixture, runs, {}, settings)))
    result = run_parity(tmp_path / "a.json", tmp_path / "b.json", "--fixture", path, "--max-tokens", "300",
                        "--seed", "0", "--json", tmp_path / "r.json")
    assert result.code == 1, result.output
    early = next(line for line in result.output.splitlines() if line.startswith("early "))
    late = next(line for line in result.output.splitlines() if line.startswith("late "))
    assert "diverges" in early and "A≠B at token 0" in early and "(token 200)" in early
    assert "nondeterministic" in late and "A≠A at token 5" in late
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["summary"] == {"exact": 0, "nondeterministic": 1, "diverges": 1}


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
    return invoke("parity", *map(str, args))


def test_parity_of_a_server_against_itself_passes(tmp_path):
    fixture = write_fixture(tmp_path)
    with serve(FakeModel()) as url:
        result = run_parity(url, url, "--fixture", fixture, "--runs", "2", "--max-tokens", "12",
                            "--json", tmp_path / "r.json")
    assert result.code == 0, result.output
    assert "PASS" in result.output and "exact 7/7" in result.output
    data = json.loads((tmp_path / "r.json").read_text())
    assert data["passed"] and data["summary"]["exact"] == 7
    assert data["pairwise_exact"]["A1×B1"] == {"exact": 7, "total": 7}
    assert data["endpoints"]["A"]["models"][0]["id"] == "fake-moe"


def test_parity_detects_a_perturbed_engine(tmp_path):
    fixture = write_fixture(tmp_path)
    with serve(FakeModel(weight_seed=0)) as url_a, serve(FakeModel(weight_seed=1)) as url_b:
        result = run_parity(url_a, url_b, "--fixture", fixture, "--runs", "2", "--max-tokens", "12")
    assert result.code == 1, result.output
    assert "FAIL" in result.output and "diverges 7/7" in result.output
    assert "A≠B at token 3" in result.output  # the fake engines agree on the first three tokens


def test_serving_nondeterminism_is_not_a_placement_effect(tmp_path):
    fixture = write_fixture(tmp_path, jitter_ids=(2,))
    with serve(FakeModel(jitter=("JITTER",))) as url:
        result = run_parity(url, url, "--fixture", fixture, "--runs", "2", "--max-tokens", "12")
    assert result.code == 0, result.output
    assert "nondeterministic 1/7" in result.output
    row = next(line for line in result.output.splitlines() if line.startswith("p2 "))
    assert "nondeterministic" in row and "A≠A at token 6" in row


def test_text_comparison_when_the_server_gives_no_token_ids(tmp_path):
    fixture = write_fixture(tmp_path, n=2)
    with serve(FakeModel(with_token_ids=False)) as url_a, \
            serve(FakeModel(with_token_ids=False, weight_seed=5)) as url_b:
        result = run_parity(url_a, url_b, "--fixture", fixture, "--runs", "1", "--max-tokens", "8")
    assert result.code == 1 and "A≠B at char" in result.output
    assert "one run of A cannot tell" in result.output


def test_unreachable_endpoint_is_a_clear_error(tmp_path):
    fixture = write_fixture(tmp_path, n=1)
    result = invoke("parity", "http://127.0.0.1:9", "http://127.0.0.1:9", "--fixture", str(fixture))
    assert result.code == 2
    assert "error: http://127.0.0.1:9/v1/models: connection refused" in result.output
    assert "Traceback" not in result.output


def test_recorded_runs_compare_across_boots(tmp_path):
    fixture = write_fixture(tmp_path)
    record = tmp_path / "control.json"
    with serve(FakeModel()) as url:
        made = run_parity(url, "--record", record, "--fixture", fixture, "--runs", "2", "--max-tokens", "10")
    assert made.code == 0, made.output
    assert json.loads(record.read_text())["format"] == "recipegen-parity-record"
    with serve(FakeModel()) as url:  # a fresh "boot" of the same engine: passes against the recording
        same = run_parity(url, record, "--fixture", fixture, "--max-tokens", "10")
    assert same.code == 0 and "recorded in" in same.output, same.output
    with serve(FakeModel(weight_seed=9)) as url:
        other = run_parity(url, record, "--fixture", fixture, "--max-tokens", "10")
    assert other.code == 1 and "diverges 7/7" in other.output
    # a recording made with other settings is refused, naming the file and field
    bad = invoke("parity", str(record), str(record), "--fixture", str(fixture), "--max-tokens", "11")
    assert bad.code == 2 and "settings.max_tokens" in bad.output
    both = run_parity(record, record, "--fixture", fixture, "--max-tokens", "10")
    assert both.code == 0 and "PASS" in both.output
