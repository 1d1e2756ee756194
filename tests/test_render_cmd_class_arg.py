"""`render --class LANE=CLASS`: a value that is LANE=CLASS in form but names an impossible lane or
class says which name is wrong and what names may be; only a value without `=` is told to write
LANE=CLASS. Each is one `error:` line, exit 2, nothing written."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import invoke

from recipegen.schema.patterns import SERVICE_NAME

RECIPE = "dsv41-flash-gb300"
# The refusal says what a name may be in the words of the pattern's one owner (its hint, whatever
# its example) and gives the pattern itself: both read from recipegen.schema.patterns, not copied.
RULE = f"{SERVICE_NAME.hint} (pattern {SERVICE_NAME.regex})"


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
    result = invoke("render", RECIPE, "--class", value)
    assert result.code == 2, result.output
    assert result.output.startswith(f"error: field '--class': --class {value!r}: "), result.output
    assert message in result.output, result.output
    assert "^[a-z0-9][a-z0-9-]*$" in result.output, result.output   # the rule a user can act on
    assert "lowercase" in result.output, result.output
    assert "Traceback" not in result.output
    assert recipe.read_bytes() == before and not (project / "compose").exists()


def test_a_value_without_equals_is_told_the_form(project: Path) -> None:
    result = invoke("render", RECIPE, "--class", "prose")
    assert result.code == 2, result.output
    assert result.output.startswith("error: field '--class': --class 'prose': write LANE=CLASS, e.g. "
                                    "--class agent=prose"), result.output
    assert "not a valid" not in result.output


def test_a_well_formed_unknown_class_names_the_lanes_classes(project: Path) -> None:
    result = invoke("render", RECIPE, "--class", "agent=poetry")
    assert result.code == 2, result.output
    assert "class 'poetry' is not declared in lane 'agent' (declared: agent, prose, math)" in result.output, \
        result.output
