"""QA pass 11, findings 1, 4 and 5: values that passed `check recipe` although the rendering cannot
serve them are refused at their own line, naming the file, the line and the field.

- `model.checkpoint` is an absolute path on the machine that runs the lane or a Hugging Face repo id
  `org/name` (the two forms `recipegen.render.services._model_source` mounts); a relative path (Compose
  resolves it against the rendered compose folder) or a `~` path (the invoking user's home in Compose,
  nothing in Kubernetes) is refused.
- A machine's `address` is not an unspecified address (`0.0.0.0`, `::`), not IPv6 link-local, carries no
  IPv6 zone id, and a bracketed IPv6 address is told to drop the brackets.
- A multi-node lane's `parallel.master_port` is not the monitoring profile's Prometheus or Grafana host
  port, which the head publishes beside the rendezvous.

Each recipe is the shipped two-Station reference with one line changed; the expected line is counted
in the text written here.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import invoke
from test_fit import project  # a copy of a shipped recipe with its maps and profiles

RECIPE = "dsv41-flash-gb300x2-pp2"
MODEL_LINE = "  catalog: dsv41-flash-mxfp4\n"
HEAD_ADDRESS = "address: 10.0.0.1 "
MASTER_PORT = "master_port: 29501"
ACCEPTED = "an absolute path on the machine that runs the lane, or a Hugging Face repo id 'org/name'"


def _recipe(tmp_path: Path, old: str, new: str) -> tuple[Path, int]:
    """The reference recipe with `old` replaced once by `new`, and the line `new` starts on."""
    def edit(text: str) -> str:
        assert text.count(old) == 1, old
        return text.replace(old, new, 1)

    path = project(tmp_path, RECIPE, edit=edit)
    text = path.read_text()
    marker = new.rstrip("\n").split("\n")[-1]     # the changed line itself
    return path, text[:text.index(marker)].count("\n") + 1


def _check(tmp_path: Path, recipe: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    return invoke("check", "recipe", str(recipe))


def _refused_at(result, recipe: Path, line: int, field: str) -> str:
    assert result.code == 2, result.output
    assert f"recipes/{recipe.name}:{line}: field '{field}':" in result.output, result.output
    assert "Traceback" not in result.output
    return result.output


# ------------------------------------------------------------------ finding 1: model.checkpoint

@pytest.mark.parametrize("value", ["./models/x", "a/b/c", "relative/../../etc", "models", "./x", "../x",
                                   "org/", "org/name/", "-org/name", "'~/models/x'", "'~'"])
def test_a_checkpoint_that_is_no_absolute_path_nor_repo_id_is_refused(tmp_path: Path, value: str,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    recipe, line = _recipe(tmp_path, MODEL_LINE, f"{MODEL_LINE}  checkpoint: {value}\n")
    out = _refused_at(_check(tmp_path, recipe, monkeypatch), recipe, line, "model.checkpoint")
    assert ACCEPTED in out
    assert "relative path would resolve against the rendered compose folder" in out
    if "~" in value:
        assert "Compose expands '~' to the home of whoever runs docker compose" in out
        assert "Kubernetes" in out


def test_render_refuses_a_relative_checkpoint_and_writes_nothing(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    recipe, line = _recipe(tmp_path, MODEL_LINE, f"{MODEL_LINE}  checkpoint: ./models/x\n")
    monkeypatch.chdir(tmp_path)
    result = invoke("render", str(recipe))
    _refused_at(result, recipe, line, "model.checkpoint")
    assert not (tmp_path / "compose").exists()


@pytest.mark.parametrize("value", ["/srv/models/dsv41", "/data/ckpt", "deepseek-ai/DeepSeek-V4.1-Flash",
                                   "org_1/name.v2-x"])
def test_an_absolute_path_or_a_repo_id_is_accepted_and_mounted_as_such(tmp_path: Path, value: str,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    recipe, _ = _recipe(tmp_path, MODEL_LINE, f"{MODEL_LINE}  checkpoint: {value}\n")
    result = _check(tmp_path, recipe, monkeypatch)
    assert result.code == 0, result.output
    # and the rendering takes it for what the loader took it for
    from recipegen.load.recipe import load_recipe
    from recipegen.render.services import MODELS_TARGET, _model_source

    loaded = load_recipe(recipe, read_maps=False).recipe
    model_arg, mount, env = _model_source(loaded)
    if value.startswith("/"):
        assert (model_arg, mount.source, env) == (f"{MODELS_TARGET}/{loaded.model.name}", value, ())
    else:
        assert model_arg == value and ("HF_HUB_OFFLINE", "1") in env


# ------------------------------------------------------------------ finding 4: address

@pytest.mark.parametrize(("value", "words"), [
    ("0.0.0.0", "is the unspecified address, which names no machine"),
    ("'::'", "is the unspecified address, which names no machine"),
    ("'0:0:0:0:0:0:0:0'", "is the unspecified address, which names no machine"),
    ("'::ffff:0.0.0.0'", "is the unspecified address, which names no machine"),
    ("'fd00::1%eth0'", "carries a zone id (%eth0), which names a network interface of one machine"),
    ("'fe80::1%2'", "is an IPv6 link-local address"),
    ("'fe80::1'", "is an IPv6 link-local address"),
    ('"[fd00::1]"', "write the address without brackets (recipegen adds them where a URL needs them): fd00::1"),
])
def test_an_address_no_peer_can_reach_is_refused_at_its_line(tmp_path: Path, value: str, words: str,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    recipe, line = _recipe(tmp_path, HEAD_ADDRESS, f"address: {value} ")
    out = _refused_at(_check(tmp_path, recipe, monkeypatch), recipe, line, "machines.station-a.address")
    assert words in out, out


@pytest.mark.parametrize("value", ["10.0.0.9", "'fd00::1'", "station-a.cluster.local"])
def test_a_reachable_address_is_accepted(tmp_path: Path, value: str, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe, _ = _recipe(tmp_path, HEAD_ADDRESS, f"address: {value} ")
    result = _check(tmp_path, recipe, monkeypatch)
    assert result.code == 0, result.output


# ------------------------------------------------------------------ finding 5: master_port

@pytest.mark.parametrize(("monitoring", "port", "field", "service"), [
    ("monitoring: {}\n", 9090, "prometheus_port", "Prometheus"),      # the defaults
    ("monitoring: {}\n", 3000, "grafana_port", "Grafana"),
    ("monitoring: {prometheus_port: 9191}\n", 9191, "prometheus_port", "Prometheus"),
    ("monitoring: {grafana_port: 3300}\n", 3300, "grafana_port", "Grafana"),
])
def test_a_master_port_that_is_a_monitoring_port_is_refused(tmp_path: Path, monitoring: str, port: int, field: str,
                                                            service: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def edit(text: str) -> str:
        assert text.count("monitoring: {}\n") == 1 and text.count(MASTER_PORT) == 1
        return text.replace("monitoring: {}\n", monitoring, 1).replace(MASTER_PORT, f"master_port: {port}", 1)

    recipe = project(tmp_path, RECIPE, edit=edit)
    text = recipe.read_text()
    line = text[:text.index(f"master_port: {port}")].count("\n") + 1
    out = _refused_at(_check(tmp_path, recipe, monkeypatch), recipe, line, "lanes[0].parallel.master_port")
    assert (f"master_port {port} is monitoring.{field}: {service} publishes it on the head machine "
            "'station-a'") in out, out


def test_a_master_port_clear_of_the_monitoring_ports_is_accepted(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    recipe, _ = _recipe(tmp_path, MASTER_PORT, "master_port: 29502")
    assert _check(tmp_path, recipe, monkeypatch).code == 0


def test_without_monitoring_port_9090_is_free_for_the_rendezvous(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    def edit(text: str) -> str:
        return text.replace("monitoring: {}\n", "", 1).replace(MASTER_PORT, "master_port: 9090", 1)

    recipe = project(tmp_path, RECIPE, edit=edit)
    assert "monitoring:" not in recipe.read_text()
    result = _check(tmp_path, recipe, monkeypatch)
    assert result.code == 0, result.output


def test_a_model_file_with_a_relative_checkpoint_is_refused_at_the_model_files_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    recipe = project(tmp_path, "glm-5-h200x8")
    text = (Path(__file__).resolve().parent.parent / "recipes" / "models" / "glm-5.yaml").read_text()
    assert text.count("checkpoint: zai-org/GLM-5\n") == 1
    text = text.replace("checkpoint: zai-org/GLM-5\n", "checkpoint: GLM-5\n", 1)
    line = text[:text.index("checkpoint: GLM-5")].count("\n") + 1
    (recipe.parent / "models").mkdir()
    (recipe.parent / "models" / "glm-5.yaml").write_text(text)
    result = _check(tmp_path, recipe, monkeypatch)
    assert result.code == 2, result.output
    assert f"recipes/models/glm-5.yaml:{line}: field 'checkpoint':" in result.output, result.output
    assert ACCEPTED in result.output
