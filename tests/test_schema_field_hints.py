"""A refused value is told what its own field takes: every pattern-checked field's refusal prints the
hint of that field's pattern (recipegen.schema.patterns), with file, line and field; a lane name
fits a DNS label once `lane-` is in front and `-profile` after it; a scrape interval stays inside Prometheus' lookback; a
recipe's `name` is its file's name."""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import pytest
import yaml
from cli_support import invoke
from pydantic import TypeAdapter

from recipegen.common.errors import InputError
from recipegen.load.recipe import load_recipe, load_recipe_model
from recipegen.schema import Bandwidth, Bytes, PositiveBytes, TokenCount
from recipegen.schema.base import ScaledNumber
from recipegen.schema.lane import LANE_NAME_MAX_LENGTH
from recipegen.schema.patterns import (
    COMPUTE_CAPABILITY,
    ENV_KEY,
    FILE_NAME,
    IMAGE,
    IPV4,
    MINUTES,
    PATTERNS,
    RETENTION,
    SECONDS,
    SERVICE_NAME,
    TextPattern,
    pattern_hint,
)
from recipegen.schema.recipe import Recipe

CORPUS = Path(__file__).parent / "bad_recipes"
REPO = Path(__file__).resolve().parent.parent
GENERIC = "lowercase letters, digits and '-'"


def _patterns_in(node: Any) -> set[str]:
    found: set[str] = set()
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "pattern" and isinstance(value, str):
                found.add(value)
            elif key == "patternProperties" and isinstance(value, dict):
                found.update(value)
                found.update(*(_patterns_in(v) for v in value.values()))
            else:
                found |= _patterns_in(value)
    elif isinstance(node, list):
        for item in node:
            found |= _patterns_in(item)
    return found


def test_every_field_pattern_has_its_own_hint() -> None:
    # the unit types' JSON Schema patterns document a text form their own parser reads; pydantic
    # never refuses a value by them, so they need no hint
    unit_patterns = set().union(*(_patterns_in(TypeAdapter(t).json_schema())
                                  for t in (Bytes, PositiveBytes, Bandwidth, TokenCount, ScaledNumber)))
    schema_patterns = _patterns_in(Recipe.model_json_schema(mode="validation")) - unit_patterns
    without = sorted(p for p in schema_patterns if pattern_hint(p) is None)
    assert not without, f"field patterns without a hint in recipegen.schema.patterns: {without}"
    # every declared pattern is in use, and the walk above found the fields
    assert schema_patterns == {p.regex for p in PATTERNS}


def test_hints_are_distinct_and_describe_their_own_pattern() -> None:
    hints = [p.hint for p in PATTERNS]
    assert len(set(hints)) == len(hints)
    for pattern in PATTERNS:
        example = re.search(r"(?:e\.g\.|such as) (\S+?)(?:\)|$| or |,| \()", pattern.hint)
        assert example, pattern
        # the hint's own example is a value its pattern takes
        assert re.search(pattern.regex, example.group(1)), (pattern.regex, example.group(1))
    # only the name patterns speak of lowercase letters
    assert [p for p in PATTERNS if GENERIC[:17] in p.hint] == [SERVICE_NAME, FILE_NAME]


def _tiny(tmp_path: Path) -> dict[str, Any]:
    shutil.copytree(CORPUS / "maps", tmp_path / "maps")
    return yaml.safe_load((CORPUS / "valid" / "tiny.yaml").read_text().replace("../maps/", "maps/"))


def _refusal(tmp_path: Path, data: dict[str, Any], file_name: str = "tiny.yaml") -> InputError:
    target = tmp_path / file_name
    target.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(InputError) as info:
        load_recipe(target)
    return info.value


def _line_of(tmp_path: Path, start: str, file_name: str = "tiny.yaml") -> int:
    """The 1-based line of the written file that starts (after indentation) with `start`."""
    lines = (tmp_path / file_name).read_text().splitlines()
    return next(i for i, line in enumerate(lines, 1) if line.lstrip(" -").startswith(start))


def _monitoring(field: str, value: str) -> Any:
    def change(d: dict) -> None:
        d["monitoring"] = {field: value}
    return change


def _lane(field: str, value: Any) -> Any:
    def change(d: dict) -> None:
        d["lanes"][0][field] = value
    return change


def _class_key(d: dict) -> None:
    d["lanes"][0]["classes"] = {"Chat Class": d["lanes"][0]["classes"]["chat"]}
    d["lanes"][0]["active_class"] = "Chat Class"


def _machine_key(d: dict) -> None:
    d["machines"] = {"Box 1": d["machines"]["box"]}
    d["lanes"][0]["machine"] = "Box 1"


def _env_key(d: dict) -> None:
    d["lanes"][0]["env"] = {"1BAD-KEY": "x"}


def _machine(field: str, value: str) -> Any:
    def change(d: dict) -> None:
        if field == "compute_capability":
            d["machines"]["box"]["gpus"][field] = value
        else:
            d["machines"]["box"][field] = value
    return change


def _model_name(d: dict) -> None:
    d["model"]["name"] = "Tiny MoE"


# (what is changed, the field the refusal names, the pattern whose hint it must print, the value)
CASES = [
    (_monitoring("scrape_interval", "0s"), "monitoring.scrape_interval", SECONDS, "'0s'"),
    (_monitoring("scrape_interval", "1m"), "monitoring.scrape_interval", SECONDS, "'1m'"),
    (_monitoring("window", "1h"), "monitoring.window", MINUTES, "'1h'"),
    (_monitoring("drift_for", "900s"), "monitoring.drift_for", MINUTES, "'900s'"),
    (_monitoring("retention", "1y"), "monitoring.retention", RETENTION, "'1y'"),
    (_monitoring("bind_address", "::1"), "monitoring.bind_address", IPV4, "'::1'"),
    (_monitoring("bind_address", "localhost"), "monitoring.bind_address", IPV4, "'localhost'"),
    (_lane("image", "vllm/vllm-openai:${TAG}"), "lanes[0].image", IMAGE, "'vllm/vllm-openai:${TAG}'"),
    (_lane("name", "Main"), "lanes[0].name", SERVICE_NAME, "'Main'"),
    (_lane("name", "main.lane"), "lanes[0].name", SERVICE_NAME, "'main.lane'"),
    (_lane("profile", "batch_jobs"), "lanes[0].profile", SERVICE_NAME, "'batch_jobs'"),
    (_class_key, "lanes[0].classes.Chat Class", SERVICE_NAME, "'Chat Class'"),
    (_machine_key, "machines.Box 1", SERVICE_NAME, "'Box 1'"),
    (_env_key, "lanes[0].env.1BAD-KEY", ENV_KEY, "'1BAD-KEY'"),
    (_machine("compute_capability", "sm90"), "machines.box.gpus.compute_capability", COMPUTE_CAPABILITY, "'sm90'"),
    (_machine("name", "Box"), "machines.box.name", FILE_NAME, "'Box'"),
    (_model_name, "model.name", FILE_NAME, "'Tiny MoE'"),
]


@pytest.mark.parametrize("change,field,pattern,shown", CASES, ids=[c[1] + "=" + c[3] for c in CASES])
def test_a_refused_value_gets_its_own_fields_hint(tmp_path: Path, change: Any, field: str,
                                                  pattern: TextPattern, shown: str) -> None:
    data = _tiny(tmp_path)
    change(data)
    err = _refusal(tmp_path, data)
    first = str(err).splitlines()[0]
    assert err.field == field, str(err)
    assert err.file is not None and err.file.endswith("tiny.yaml") and err.line is not None
    assert f"tiny.yaml:{err.line}" in first
    assert f"{shown} is not allowed: use {pattern.hint}" in first, first
    # no other field's advice
    for other in PATTERNS:
        if other is not pattern:
            assert other.hint not in first
    assert err.exit_code == 2


def test_recipe_name_hint_allows_dots_and_underscores(tmp_path: Path) -> None:
    # a recipe name may hold '.' and '_': the hint says so (not the lane names' "letters, digits and '-'")
    data = _tiny(tmp_path)
    data["name"] = "tiny\u200b"
    err = _refusal(tmp_path, data)
    assert err.field == "name"
    assert f"is not allowed: use {FILE_NAME.hint}" in str(err)
    assert "'.', '_' and '-'" in str(err)


def test_the_cli_prints_the_hint_without_a_traceback(tmp_path: Path) -> None:
    data = _tiny(tmp_path)
    data["monitoring"] = {"bind_address": "::1"}
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    result = invoke("check", "recipe", str(tmp_path / "tiny.yaml"))
    assert result.code == 2
    assert result.stderr.startswith("error: ") and "Traceback" not in result.output + result.stderr
    assert "monitoring.bind_address" in result.stderr and "an IPv4 address such as 127.0.0.1" in result.stderr
    assert GENERIC not in result.stderr


# ---------------------------------------------------------------- item: lane names fit a DNS label

def test_lane_name_of_50_characters_is_taken(tmp_path: Path) -> None:
    # Every lane renders `lane-<name>-profile`, its longest service on one machine.
    assert LANE_NAME_MAX_LENGTH == 50 == 63 - len("lane-") - len("-profile")
    data = _tiny(tmp_path)
    data["lanes"][0]["name"] = "a" * 50
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    assert load_recipe(tmp_path / "tiny.yaml").recipe.lanes[0].name == "a" * 50


@pytest.mark.parametrize("length", [51, 58, 59, 63, 64, 5000])
def test_lane_name_longer_than_50_is_refused_at_its_line(tmp_path: Path, length: int) -> None:
    data = _tiny(tmp_path)
    data["lanes"][0]["name"] = "a" * length
    err = _refusal(tmp_path, data)
    assert err.field == "lanes[0].name"
    assert err.line == _line_of(tmp_path, "name: aaaa"), str(err)  # the lane's `- name:` line
    message = str(err)
    assert f"lane name of {length:,} characters: at most 50" in message
    assert "`lane-<name>-profile`" in message and "one DNS label of at most 63 characters" in message
    assert f"would have {length + 13:,} characters, {length - 50:,} too many" in message
    assert ("a" * length in message) == (length <= 63)  # a name is echoed only while it could be one
    assert "a" * 64 not in message


def test_long_lane_name_is_refused_by_check_recipe(tmp_path: Path) -> None:
    data = _tiny(tmp_path)
    data["lanes"][0]["name"] = "a" * 51
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    result = invoke("check", "recipe", str(tmp_path / "tiny.yaml"))
    assert result.code == 2
    assert "tiny.yaml:" in result.stderr and "lanes[0].name" in result.stderr
    assert "Traceback" not in result.output + result.stderr


def test_committed_recipes_lane_names_fit(repo_root: Path) -> None:
    names = [lane["name"] for path in sorted((repo_root / "recipes").glob("*.yaml"))
             for lane in yaml.safe_load(path.read_text())["lanes"]]
    assert names and all(len(n) <= LANE_NAME_MAX_LENGTH for n in names)


def test_a_50_character_lane_renders_services_that_fit_a_dns_label(repo_root: Path) -> None:
    from recipegen.render.render import render_recipe

    path = repo_root / "recipes" / "dsv41-flash-gb300.yaml"
    text = path.read_text()
    old = yaml.safe_load(text)["lanes"][0]["name"]
    long_name = ("lane" + "x" * 60)[:LANE_NAME_MAX_LENGTH]
    new_text, count = re.subn(rf"(^\s*- name: ){re.escape(old)}(\s)", rf"\g<1>{long_name}\g<2>", text,
                              count=1, flags=re.M)
    assert count == 1
    rendering = render_recipe(load_recipe(path, text=new_text))
    prometheus = [files["monitoring/prometheus.yml"] for files in rendering.folders.values()
                  if "monitoring/prometheus.yml" in files]
    assert prometheus
    targets = re.findall(r"(lane-[a-z0-9-]+):\d+", prometheus[0].decode())
    assert f"lane-{long_name}" in targets
    assert all(len(t) <= 63 for t in targets)
    services = [name for files in rendering.folders.values()
                for name in yaml.safe_load(files["compose.yaml"])["services"]]
    assert f"lane-{long_name}-profile" in services
    assert max(len(n) for n in services) == 63


# ---------------------------------------------------------------- item: scrape interval <= 300 s

@pytest.mark.parametrize("interval", ["300s", "15s", "1s"])
def test_scrape_interval_up_to_300s_is_taken(tmp_path: Path, interval: str) -> None:
    data = _tiny(tmp_path)
    data["monitoring"] = {"scrape_interval": interval, "window": "10m"}
    (tmp_path / "tiny.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    assert load_recipe(tmp_path / "tiny.yaml").recipe.monitoring.scrape_interval == interval


@pytest.mark.parametrize("interval", ["301s", "400s", "9999s"])
def test_scrape_interval_above_300s_is_refused_with_the_lookback(tmp_path: Path, interval: str) -> None:
    data = _tiny(tmp_path)
    data["monitoring"] = {"scrape_interval": interval, "window": "999m"}
    err = _refusal(tmp_path, data)
    assert err.field == "monitoring.scrape_interval"
    assert err.line is not None and f"tiny.yaml:{err.line}" in str(err)
    message = str(err)
    assert f"'{interval}' is above 300s" in message
    assert "5 minutes after its last sample" in message and "lookback" in message


# ---------------------------------------------------------------- item: name is the file's name

def test_name_other_than_the_file_is_refused_naming_both(tmp_path: Path) -> None:
    data = _tiny(tmp_path)
    err = _refusal(tmp_path, data, "other-name.yaml")
    line = _line_of(tmp_path, "name: tiny", "other-name.yaml")
    assert err.field == "name" and err.line == line, str(err)
    first = str(err).splitlines()[0]
    assert f"other-name.yaml:{line}" in first
    assert "name 'tiny' is not the file's name 'other-name'" in first
    assert "compose/<name>/" in first
    assert "write `name: other-name` or rename the file to tiny.yaml" in first


@pytest.mark.parametrize("file_name", ["tiny.yml", "tiny", "tiny.YAML", "tiny.yaml.bak"])
def test_a_recipe_file_not_ending_in_yaml_is_refused(tmp_path: Path, file_name: str) -> None:
    # `render NAME`, `--check` and the orphan check find recipes as recipes/<name>.yaml only: a
    # tiny.yml would render into compose/tiny/ that no command finds again
    data = _tiny(tmp_path)
    err = _refusal(tmp_path, data, file_name)
    assert err.field == "name" and err.line == _line_of(tmp_path, "name: tiny", file_name), str(err)
    assert f"the recipe's file name {file_name!r} does not end in .yaml" in str(err)
    assert "rename the file to tiny.yaml" in str(err)


def test_new_refuses_an_output_file_not_ending_in_yaml(tmp_path: Path) -> None:
    target = tmp_path / "q.yml"
    result = invoke("new", "qwen3-30b-a3b", "--machine", "rtx4090", "-o", str(target))
    assert result.code == 2, result.output
    assert "ends in .yaml" in result.output and "Traceback" not in result.output
    assert not target.exists()


def test_name_mismatch_is_refused_without_reading_maps_too(tmp_path: Path) -> None:
    data = _tiny(tmp_path)
    (tmp_path / "copy.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    for load in (lambda p: load_recipe(p, read_maps=False), load_recipe_model):
        with pytest.raises(InputError) as info:
            load(tmp_path / "copy.yaml")
        assert info.value.field == "name" and "'copy'" in str(info.value)


def test_a_file_name_that_is_no_recipe_name_gets_only_the_rename_fix(tmp_path: Path) -> None:
    data = _tiny(tmp_path)
    err = _refusal(tmp_path, data, "My Recipe.yaml")
    assert "rename the file to tiny.yaml" in str(err)
    assert "write `name:" not in str(err)


def test_name_mismatch_is_listed_after_the_files_other_problems(tmp_path: Path) -> None:
    data = _tiny(tmp_path)
    data["lanes"][0]["port"] = 8000
    data["lanes"].append({**data["lanes"][0], "name": "second"})  # same machine, same port
    err = _refusal(tmp_path, data, "copy.yaml")
    assert err.field == "lanes[1].port", str(err)
    assert "2 problems" in str(err) and "name 'tiny' is not the file's name 'copy'" in str(err)


def test_the_cli_refuses_a_renamed_recipe_before_writing(tmp_path: Path) -> None:
    data = _tiny(tmp_path)
    (tmp_path / "recipes").mkdir()
    shutil.move(tmp_path / "maps", tmp_path / "recipes" / "maps")
    (tmp_path / "recipes" / "tiny.yaml").write_text(yaml.safe_dump({**data, "name": "other-name"}, sort_keys=False))
    result = invoke("render", str(tmp_path / "recipes" / "tiny.yaml"))
    assert result.code == 2, result.output
    assert "tiny.yaml:" in result.stderr and "field 'name'" in result.stderr
    assert "'other-name'" in result.stderr and "'tiny'" in result.stderr
    assert "Traceback" not in result.output + result.stderr
    assert not (tmp_path / "compose").exists()


def test_committed_recipes_are_named_after_their_files(repo_root: Path) -> None:
    paths = sorted((repo_root / "recipes").glob("*.yaml"))
    assert len(paths) >= 10
    for path in paths:
        assert yaml.safe_load(path.read_text())["name"] == path.stem, path


def test_the_valid_corpus_base_is_named_after_its_file() -> None:
    assert load_recipe(CORPUS / "valid" / "tiny.yaml").name == "tiny"
