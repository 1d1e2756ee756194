"""A machine's `address` reaches vLLM's --master-addr, Prometheus targets and the ops HTTP calls:
only an IP address or a host name is accepted, refused otherwise naming the file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner
from test_fit import project  # a copy of a shipped recipe with its maps and profiles

from recipegen.cli import main
from recipegen.schema.machine import is_host_address

RECIPE = "dsv41-flash-gb300"   # its machine is `{catalog: …, address: 127.0.0.1}`


@pytest.mark.parametrize("text", ["127.0.0.1", "10.0.0.1", "::1", "fe80::1", "gpu01", "node-1.cluster.local",
                                  "station."])
def test_addresses_a_network_can_reach_are_accepted(text: str) -> None:
    assert is_host_address(text)


@pytest.mark.parametrize("text", ["127.0.0.1; rm -rf /", "999.1.1.1", "1.2.3", "127.0.0.1\nx: y", "-node", "a..b",
                                  "", "node_1", "x" * 64, "$(hostname)"])
def test_anything_else_is_not(text: str) -> None:
    assert not is_host_address(text)


@pytest.mark.parametrize("bad", ['"127.0.0.1; rm"', '"999.1.1.1"', '"a b"'])
def test_check_recipe_refuses_an_address_naming_file_line_and_field(tmp_path: Path, bad: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = project(tmp_path, RECIPE, edit=lambda t: t.replace("address: 127.0.0.1", f"address: {bad}", 1))
    text = recipe.read_text()
    assert f"address: {bad}" in text
    line = text[:text.index(f"address: {bad}")].count("\n") + 1
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, ["check", "recipe", str(recipe)])
    assert result.exit_code == 2, result.output
    assert f"{recipe.name}:{line}" in result.output and "address" in result.output, result.output
    assert "neither an IP address nor a host name" in result.output and "Traceback" not in result.output
