"""Review 16, findings 5, 6 and 7: one rule for a Hugging Face repo id, the Hub's own.

- `recipegen new/fit MODEL` reads `org/name[@revision]` (`recipegen.fit.hub.parse_hub_id`) by the
  rule `model.checkpoint` is checked by (`recipegen.schema.patterns.is_hf_repo_id`), so an id it
  reads is one the model it builds can carry.
- That rule is huggingface_hub's `validate_repo_id` with the namespace required: a `.git` ending and
  a part over 96 characters are refused, a leading '_' is allowed, and an id without its namespace
  (`gpt2`) gets a refusal of its own.
- `recipegen model import --checkpoint BAD` names the option, not a field of config.json.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import invoke
from test_qa11_recipe_checks import MODEL_LINE, _check, _recipe, _refused_at

from recipegen.common.errors import InputError
from recipegen.fit.hub import parse_hub_id
from recipegen.schema.patterns import HF_NAMESPACE_NEEDED, checkpoint_refusal, is_hf_repo_id

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "tests" / "fixtures" / "hf_configs" / "nemotron-3-nano-30b-a3b" / "config.json"

# ids the two rules disagreed on before, real ids, and the Hub rule's edges
REFUSED = ["org/name-", "org/a--b", "org/x..y", "org/x.git", "café/x", f"{'a' * 97}/b", f"b/{'a' * 97}",
           "-org/name", "org/.x", "org/", "a/b/c", "gpt2"]
ACCEPTED = ["_org/x", "Qwen/Qwen3-30B-A3B", "meta-llama/Llama-4-Scout-17B-16E-Instruct", "a_b/c_d.e",
            "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-FP8", f"{'a' * 96}/{'b' * 96}", "org/x.git2", "org/x_"]


@pytest.mark.parametrize("text", REFUSED + ACCEPTED)
def test_new_and_fit_read_an_id_by_the_checkpoint_rule(text: str) -> None:
    expected = (text, None) if text in ACCEPTED else None
    assert parse_hub_id(text) == expected
    assert is_hf_repo_id(text) is (text in ACCEPTED)
    assert (checkpoint_refusal(text) is None) is (text in ACCEPTED)


@pytest.mark.parametrize(("text", "expected"), [
    ("org/name@main", ("org/name", "main")),
    ("org/name@refs/pr/1", ("org/name", "refs/pr/1")),
    ("org/name@0123456789abcdef0123456789abcdef01234567",
     ("org/name", "0123456789abcdef0123456789abcdef01234567")),
    ("org/name@", None), ("org/name@a//b", None), ("org/name@a@b", None), ("org/name@a b", None),
    ("org/name-@main", None), ("gpt2@main", None),
])
def test_a_revision_is_split_off_as_before(text: str, expected: tuple[str, str | None] | None) -> None:
    assert parse_hub_id(text) == expected


@pytest.mark.parametrize("text", REFUSED[:-1] + ACCEPTED + ["gpt2", "bert-base-uncased", "org/x.GIT", "a/b"])
def test_the_rule_is_validate_repo_id_with_the_namespace_required(text: str) -> None:
    pytest.importorskip("huggingface_hub")
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(text)
        hub = True
    except HFValidationError:
        hub = False
    assert is_hf_repo_id(text) is (hub and "/" in text), text


def test_an_id_that_was_read_from_the_hub_and_then_refused_is_refused_before(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from recipegen.fit.source import resolve_model

    monkeypatch.chdir(tmp_path)
    with pytest.raises(InputError, match=r"nor a Hugging Face id \(org/name\[@revision\]\)"):
        resolve_model("org/name-")


@pytest.mark.parametrize("value", ["gpt2", "bert-base-uncased", "GLM-5"])
def test_an_id_without_its_namespace_is_told_so_at_its_line(tmp_path: Path, value: str,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    recipe, line = _recipe(tmp_path, MODEL_LINE, f"{MODEL_LINE}  checkpoint: {value}\n")
    out = _refused_at(_check(tmp_path, recipe, monkeypatch), recipe, line, "model.checkpoint")
    assert HF_NAMESPACE_NEEDED in out
    assert HF_NAMESPACE_NEEDED == ("a Hugging Face repo id needs its namespace: org/name "
                                   "(e.g. openai-community/gpt2)")


@pytest.mark.parametrize("value", ["org/model.git", f"org/{'m' * 97}"])
def test_an_id_the_hub_refuses_is_refused_at_its_line(tmp_path: Path, value: str,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    recipe, line = _recipe(tmp_path, MODEL_LINE, f"{MODEL_LINE}  checkpoint: {value}\n")
    out = _refused_at(_check(tmp_path, recipe, monkeypatch), recipe, line, "model.checkpoint")
    assert HF_NAMESPACE_NEEDED not in out


# ------------------------------------------------------------------ finding 7: model import --checkpoint

@pytest.mark.parametrize(("value", "words"), [
    ("./models/x", "relative path would resolve against the rendered compose folder"),
    ("gpt2", HF_NAMESPACE_NEEDED),
    ("~/models/x", "Compose expands '~'"),
])
def test_model_import_names_the_checkpoint_option(tmp_path: Path, value: str, words: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = invoke("model", "import", str(CONFIG), "--checkpoint", value)
    assert result.code == 2, result.output
    assert result.output.startswith(f"error: field '--checkpoint': {value!r} is not a checkpoint: "), result.output
    assert words in result.output
    assert "config.json" not in result.output and "Value error" not in result.output
    assert not (tmp_path / "recipes").exists()


@pytest.mark.parametrize("value", ["/srv/models/nano", "nvidia/NVIDIA-Nemotron-3-Nano-30B-A3B-BF16"])
def test_model_import_records_an_accepted_checkpoint(value: str) -> None:
    result = invoke("model", "import", str(CONFIG), "--checkpoint", value, "-o", "-")
    assert result.code == 0, result.output
    assert f"checkpoint: {value}\n" in result.stdout


def test_model_import_help_says_what_a_checkpoint_is() -> None:
    text = " ".join(invoke("model", "import", "--help").output.split())
    assert "an absolute path on the serving machine or a Hugging Face repo id org/name" in text
