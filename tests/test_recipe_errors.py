"""The bad-recipe corpus: every file fails with one clear error naming file, line and field."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest
from cli_support import invoke

from recipegen.common.errors import InputError
from recipegen.load.recipe import load_recipe

CORPUS = Path(__file__).parent / "bad_recipes"
BAD = sorted(CORPUS.glob("*.yaml"))


def _expectations(path: Path) -> tuple[str | None, str, int]:
    text = path.read_text(encoding="utf-8")
    field = re.search(r"^# expect-field: (.*)$", text, re.M).group(1).strip()  # type: ignore[union-attr]
    message = re.search(r"^# expect-message: (.*)$", text, re.M).group(1).strip()  # type: ignore[union-attr]
    line = int(re.search(r"^# expect-line: (\d+)$", text, re.M).group(1))  # type: ignore[union-attr]
    return (None if field == "-" else field), message, line


def test_corpus_is_large_enough() -> None:
    assert len(BAD) >= 30


def test_the_corpus_base_is_valid() -> None:
    loaded = load_recipe(CORPUS / "valid" / "tiny.yaml")
    assert loaded.recipe.lanes[0].active_class == "chat"
    assert ("main", "chat") in loaded.rowmaps


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_recipe_error(path: Path) -> None:
    field, message, line = _expectations(path)
    with pytest.raises(InputError) as info:
        load_recipe(path)
    err = info.value
    assert err.file is not None and err.file.endswith(path.name)
    assert err.line == line, str(err)
    assert err.field == field, str(err)
    assert re.search(message, str(err)), str(err)
    # The message itself names file and line (what the user sees after "error: ").
    assert f"{path.name}:{line}" in str(err).splitlines()[0]
    assert err.exit_code == 2


@pytest.mark.parametrize("path", BAD, ids=[p.stem for p in BAD])
def test_bad_recipe_cli_exit_2_without_traceback(path: Path) -> None:
    result = invoke("check", "recipe", str(path))
    assert result.code == 2, result.output
    assert result.stderr.startswith("error: "), result.stderr
    assert f"{path.name}:" in result.stderr
    assert "Traceback" not in result.output + result.stderr
    assert result.stdout == ""  # no partial output for a bad recipe


def test_all_problems_of_a_file_are_listed(tmp_path: Path) -> None:
    text = (CORPUS / "valid" / "tiny.yaml").read_text()
    text = text.replace("port: 8000", "port: 70000").replace("host_memory: 64 GiB", "host_memory: 64")
    text = text.replace("../maps/", "maps/")
    shutil.copytree(CORPUS / "maps", tmp_path / "maps")
    (tmp_path / "two.yaml").write_text(text)
    with pytest.raises(InputError) as info:
        load_recipe(tmp_path / "two.yaml")
    message = str(info.value)
    assert "2 problems" in message
    assert "machines.box.host_memory" in message and "missing unit" in message
    assert "lanes[0].port" in message and "65535" in message


def test_budget_check_of_invalid_recipe_exits_2() -> None:
    result = invoke("check", "budgets", str(CORPUS / "missing_unit.yaml"))
    assert result.code == 2
    assert "missing unit" in result.stderr


def test_unknown_recipe_name_lists_known_ones(repo_root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(repo_root)
    with pytest.raises(InputError) as info:
        load_recipe("no-such-recipe")
    assert "recipe not found" in str(info.value) and "dsv41-flash-gb300" in str(info.value)


def test_non_utf8_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes("name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(InputError, match="not UTF-8"):
        load_recipe(path)


_ODD_VALUES = [None, [], "x", -1, "1e400 GiB", {"value": 1}]


def _scalar_paths(node: object, path: tuple = ()) -> list[tuple]:
    if isinstance(node, dict):
        return [p for k, v in node.items() for p in _scalar_paths(v, (*path, k))] + ([path] if path else [])
    if isinstance(node, list):
        return [p for i, v in enumerate(node) for p in _scalar_paths(v, (*path, i))] + [path]
    return [path]


def test_no_traceback_for_any_odd_value_anywhere(tmp_path: Path) -> None:
    """Replace every node of the valid recipe, one at a time, by odd values: the loader either
    accepts the result or raises InputError (which the CLI prints) — never anything else."""
    import yaml

    shutil.copytree(CORPUS / "maps", tmp_path / "maps")
    base = yaml.safe_load((CORPUS / "valid" / "tiny.yaml").read_text().replace("../maps/", "maps/"))
    outcomes = {"ok": 0, "error": 0}
    for path in _scalar_paths(base):
        for odd in _ODD_VALUES:
            data = yaml.safe_load(yaml.safe_dump(base))
            node = data
            for step in path[:-1]:
                node = node[step]
            node[path[-1]] = odd
            # under the name it declares (`tiny`): a recipe's file is named after it
            target = tmp_path / "tiny.yaml"
            target.write_text(yaml.safe_dump(data))
            try:
                load_recipe(target)
                outcomes["ok"] += 1
            except InputError as exc:
                assert "tiny.yaml" in str(exc)
                outcomes["error"] += 1
    assert outcomes["error"] > 200 and outcomes["ok"] > 0, outcomes
