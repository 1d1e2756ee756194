"""`render --class LANE=CLASS`: a value that is LANE=CLASS in form but names an impossible lane or
class says which name is wrong and what names may be; only a value without `=` is told to write
LANE=CLASS. Each is one `error:` line, exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from recipegen.cli import main
from recipegen.schema.patterns import SERVICE_NAME

RECIPE = "dsv41-flash-gb300"
# The refusal says what a name may be in the words of the pattern's one owner (its hint, whatever
# its example) and gives the pattern itself: both read from recipegen.schema.patterns, not copied.
RULE = f"{SERVICE_NAME.hint} (pattern {SERVICE_NAME.regex})"


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args))
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit), \
        result.exception
    return result.exit_code, result.output


@pytest.mark.parametrize("value,message", [
    ('agent=pro"se', f"""'pro"se' is not a valid class name: {RULE}"""),
    ("agent=Prose", f"'Prose' is not a valid class name: {RULE}"),
    ("agent=", f"'' is not a valid class name: {RULE}"),
    ("agent=a=b", f"'a=b' is not a valid class name: {RULE}"),
    ("-agent=prose", f"'-agent' is not a valid lane name: {RULE}"),
    ("=prose", f"'' is not a valid lane name: {RULE}"),
])
def test_an_invalid_name_is_named_not_the_form(project: Path, value: str, message: str) -> None:
    recipe = project / "recipes" / f"{RECIPE}.yaml"
    before = recipe.read_bytes()
    code, out = run("render", RECIPE, "--class", value)
    assert code == 2, out
    assert out.startswith(f"error: field '--class': --class {value!r}: "), out
    assert message in out, out
    assert "^[a-z0-9][a-z0-9-]*$" in out and "lowercase" in out, out   # the rule a user can act on
    assert "Traceback" not in out
    assert recipe.read_bytes() == before and not (project / "compose").exists()


def test_a_value_without_equals_is_told_the_form(project: Path) -> None:
    code, out = run("render", RECIPE, "--class", "prose")
    assert code == 2, out
    assert out.startswith("error: field '--class': --class 'prose': write LANE=CLASS, e.g. "
                          "--class agent=prose"), out
    assert "not a valid" not in out


def test_a_well_formed_unknown_class_names_the_lanes_classes(project: Path) -> None:
    code, out = run("render", RECIPE, "--class", "agent=poetry")
    assert code == 2, out
    assert "class 'poetry' is not declared in lane 'agent' (declared: agent, prose, math)" in out, out
