"""A machine's `address` reaches vLLM's --master-addr, Prometheus targets and the ops HTTP calls:
only an IP address or a host name is accepted, refused otherwise naming the file, line and field."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import invoke
from test_fit import project  # a copy of a shipped recipe with its maps and profiles

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
    result = invoke("check", "recipe", str(recipe))
    assert result.code == 2, result.output
    assert f"{recipe.name}:{line}" in result.output and "address" in result.output, result.output
    assert "neither an IP address nor a host name" in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("text,words", [
    ("fe80::1", "IPv6 link-local address"),               # unreachable without a zone
    ("fe80::1%eth0", "IPv6 link-local address"),          # the zone names this box's interface only
    ("[fe80::1%eth0]", "without brackets (recipegen adds them where a URL needs them); and 'fe80::1%eth0' is an IPv6 "
                       "link-local address"),            # one refusal that says both
    ("fd00::1%eth0", "needs none: write fd00::1"),
    ("[::]", "and '::' is the unspecified address"),
    ("[fd00::1]", "without brackets (recipegen adds them where a URL needs them): fd00::1"),
])
def test_addresses_other_machines_cannot_use_are_refused_with_the_fix(text: str, words: str) -> None:
    from recipegen.schema.machine import address_refusal

    assert words in (address_refusal(text) or "")


@pytest.mark.parametrize("text", ["169.254.10.2", "fd00::1", "2001:db8::7", "10.0.0.1", "station-b"])
def test_addresses_other_machines_can_use_pass(text: str) -> None:
    from recipegen.schema.machine import address_refusal

    assert address_refusal(text) is None
