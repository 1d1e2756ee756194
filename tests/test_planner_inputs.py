"""The planner's inputs read as vLLM and a user expect: vLLM's cap on its default max_num_batched_tokens, a negative token
count refused as not positive, a machine file that starts from a catalog entry, TP in the shorthand
footer and the catalog list commands."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cli_support import invoke

from recipegen.catalog import catalog_names
from recipegen.common.errors import InputError
from recipegen.common.glossary import HEADING
from recipegen.common.units import UnitError, parse_count, parse_positive_count
from recipegen.ledger import compute_lane
from recipegen.ledger.workspace import max_num_batched_tokens
from recipegen.load.machine_file import load_machine_file
from recipegen.load.recipe import load_recipe

REPO = Path(__file__).resolve().parents[1]


def _run(*args: str) -> tuple[int, str]:
    result = invoke(*args)
    return result.code, result.output


# ------------------------------------------------------------------ the batched-tokens cap

def _rtx4090():
    loaded = load_recipe(str(REPO / "recipes" / "qwen3-30b-a3b-rtx4090.yaml"))
    lane = loaded.recipe.lane("chat")
    return loaded, lane, loaded.recipe.machines[lane.machine]


def _lane(lane, *, max_model_len: int, seqs: int = 1, extra_args: tuple[str, ...] = ()):
    return lane.model_copy(update={"max_model_len": max_model_len, "extra_args": list(extra_args),
                                   "concurrency": lane.concurrency.model_copy(update={"min": 1, "max": seqs})})


# vLLM 0.33, engine/arg_utils.py `_set_default_max_num_seqs_and_batched_tokens_args`, when
# --max-num-batched-tokens is not given: the `vllm serve` default for the GPU (2,048 below 70 GiB,
# :2999-3002), doubled by --performance-mode throughput (:3184-3186), at least max_model_len with
# chunked prefill off (:3194-3199), then min(max_num_seqs × max_model_len, that) (:3221-3224).
# max_num_seqs is what the render passes: concurrency.max, or --max-num-seqs in extra_args.
@pytest.mark.parametrize(("max_model_len", "seqs", "extra_args", "expected", "capped"), [
    (100, 1, (), 100, True),                                          # min(1 × 100, 2048)
    (100, 4, (), 400, True),                                          # min(4 × 100, 2048)
    (1000, 2, (), 2000, True),                                        # min(2 × 1000, 2048)
    (1000, 3, (), 2048, False),                                        # min(3 × 1000, 2048): the cap does not bind
    (32_768, 1, (), 2048, False),                                      # min(32768, 2048)
    (100, 1, ("--max-num-seqs", "3"), 300, True),                     # extra_args' max_num_seqs: min(3 × 100, 2048)
    (100, 1, ("--performance-mode", "throughput"), 100, True),        # min(100, 2 × 2048)
    (3000, 1, ("--performance-mode", "throughput"), 3000, True),      # min(3000, 4096)
    (100, 1, ("--no-enable-chunked-prefill",), 100, True),            # min(100, max(100, 2048))
    (4096, 1, ("--no-enable-chunked-prefill",), 4096, False),          # min(4096, max(4096, 2048))
    (100, 1, ("--max-num-batched-tokens", "512"), 512, False),         # given: vLLM applies no default and no cap
])
def test_max_num_batched_tokens_takes_vllms_cap(max_model_len: int, seqs: int, extra_args: tuple[str, ...],
                                                expected: int, capped: bool) -> None:
    _, lane, machine = _rtx4090()
    got = max_num_batched_tokens(machine, _lane(lane, max_model_len=max_model_len, seqs=seqs, extra_args=extra_args))
    assert got.value == expected
    assert ("engine/arg_utils.py:3221-3224" in got.reason) == capped, got.reason


def test_the_cap_on_a_large_gpu() -> None:
    """An H200-sized GPU defaults to 8,192 (:2989-2996); 1 × 4,096 caps it."""
    _, lane, machine = _rtx4090()
    big = machine.model_copy(update={"gpus": machine.gpus.model_copy(update={"hbm": 131 * 2**30})})
    assert max_num_batched_tokens(big, _lane(lane, max_model_len=4096)).value == 4096
    assert max_num_batched_tokens(big, _lane(lane, max_model_len=4096, seqs=2)).value == 8192


def test_the_workspace_is_sized_at_the_capped_value() -> None:
    """Qwen3-30B-A3B (H 2048, I 768, top-8) at max_model_len 100, one sequence: T = 100, P = 800,
    PB = 1,024: int32 4·(2·1024 + 801 + 800 + 2) = 14,604; + 8; bf16 2·800·(768 + 2048) = 4,505,600;
    T = 1 finalize tickets 4·ceil(2048 / 16) = 512. Counter 8·48·128 + 16·48 = 49,920; masks 5·100 + 9."""
    loaded, lane, machine = _rtx4090()
    out = compute_lane(loaded.recipe.model, machine, _lane(lane, max_model_len=100),
                       rowmap_hot=[20] * 48, rowmap_label="test")
    kernels = out.figures["hbm.runtime_workspace.kernels"]
    assert kernels.operands["max_num_batched_tokens"] == 100
    assert kernels.value == 14_604 + 8 + 4_505_600 + 512
    assert out.figures["hbm.runtime_workspace.counter"].value == 49_920 + 509
    assert "engine/arg_utils.py:3221-3224" in kernels.note


def test_new_with_a_short_context_prints_the_capped_value(tmp_path: Path) -> None:
    target = tmp_path / "x6.yaml"
    code, out = _run("new", "qwen3-30b-a3b", "--machine", "rtx-5090", "--max-model-len", "100", "-o", str(target))
    assert code == 0, out
    code, out = _run("check", "budgets", str(target), "--explain")
    assert code == 0, out
    [line] = [ln for ln in out.splitlines() if ln.strip().startswith("runtime workspace =")]
    assert "max_num_batched_tokens 100 × top-k 8" in line
    assert "max_num_seqs 1 (concurrency.max) × max_model_len 100" in out
    assert "uncapped it would be 2,048" in out


# ------------------------------------------------------------------ a negative token count

def test_a_negative_count_is_read_and_refused_as_not_positive() -> None:
    assert parse_count("-5") == -5 and parse_count("-1K") == -1024
    with pytest.raises(UnitError, match="cannot read '\\+32k'"):   # vLLM refuses a plus sign too
        parse_count("+32k")
    for text in ("-5", "0", "-1K", 0, -5):
        with pytest.raises(UnitError, match="^must be positive, got"):
            parse_positive_count(text)
    with pytest.raises(UnitError, match="cannot read 'abc' as a whole number"):
        parse_positive_count("abc")
    assert parse_positive_count("32K") == 32_768


@pytest.mark.parametrize("value", ["-5", "0", "-32K"])
def test_max_model_len_flag_says_positive(value: str, tmp_path: Path) -> None:
    code, out = _run("new", "qwen3-30b-a3b", "--machine", "rtx-5090", "--max-model-len", value,
                     "-o", str(tmp_path / "n.yaml"))
    assert code == 2
    assert f"field '--max-model-len': must be positive, got '{value}'" in out
    assert "whole number" not in out
    assert not (tmp_path / "n.yaml").exists()


def test_a_recipe_max_model_len_says_positive(tmp_path: Path) -> None:
    text = (REPO / "tests" / "bad_recipes" / "valid" / "tiny.yaml").read_text()
    lines = [ln for ln in text.splitlines() if ln.strip().startswith("max_model_len:")]
    assert len(lines) == 1
    path = tmp_path / "neg.yaml"
    path.write_text(text.replace(lines[0], lines[0].split(":")[0] + ': "-5"'))
    with pytest.raises(InputError) as info:
        load_recipe(path, read_maps=False)
    assert info.value.field == "lanes[0].max_model_len"
    assert "must be positive, got '-5'" in str(info.value)


# ------------------------------------------------------------------ a machine file from the catalog

H200_144 = "name: h200-144\ncatalog: h200-pcie\nhost_memory: 144 GiB\n"


def test_a_machine_file_starts_from_a_catalog_entry(tmp_path: Path) -> None:
    from recipegen.catalog import catalog_entry
    from recipegen.schema import Machine

    path = tmp_path / "h200-144.yaml"
    path.write_text(H200_144)
    entry, machine = load_machine_file(path)
    base = Machine.model_validate(catalog_entry("machines", "h200-pcie"))
    assert machine.name == "h200-144" and machine.host_memory == 144 * 2**30
    assert machine.gpus == base.gpus and machine.pinned_read_bandwidth == base.pinned_read_bandwidth
    assert "host_memory" not in machine.sources      # an overridden figure drops the catalog's source
    assert entry == {"name": "h200-144", "catalog": "h200-pcie", "host_memory": "144 GiB"}


def test_new_with_a_catalog_based_machine_file(tmp_path: Path) -> None:
    (tmp_path / "h200-144.yaml").write_text(H200_144)
    target = tmp_path / "q235.yaml"
    code, out = _run("new", "qwen3-235b-a22b-fp8", "--machine", str(tmp_path / "h200-144.yaml"), "-o", str(target))
    assert code == 0, out
    assert "of 144.00 GiB" in out
    # the recipe keeps the same form, read by the same resolver
    loaded = load_recipe(target, read_maps=False)
    assert loaded.recipe.machines["h200-144"].host_memory == 144 * 2**30
    assert "catalog: h200-pcie" in target.read_text()


@pytest.mark.parametrize(("text", "line", "field", "message"), [
    ("name: x\ncatalog: h200-pci\nhost_memory: 144 GiB\n", 2, "catalog",
     "unknown machine 'h200-pci' in the machine catalog; known: "),
    ("name: x\ncatalog: [h200-pcie]\n", 2, "catalog", "catalog must be a catalog name"),
    ("name: x\ncatalog: h200-pcie\nhost_memory: 144 GB!\n", 3, "host_memory", "cannot read '144 GB!' as a size"),
    ("name: x\ncatalog: h200-pcie\nhost_memry: 144 GiB\n", 3, "host_memry", "did you mean 'host_memory'?"),
    ("catalog: h200-pcie\ngpus:\n  hbm: -3 GiB\n", 3, "gpus.hbm", "size must be positive"),
])
def test_a_catalog_based_machine_file_is_refused_at_its_line(tmp_path: Path, text: str, line: int, field: str,
                                                             message: str) -> None:
    path = tmp_path / "m.yaml"
    path.write_text(text)
    with pytest.raises(InputError) as info:
        load_machine_file(path)
    assert (info.value.line, info.value.field) == (line, field)
    assert message in str(info.value) and str(info.value).startswith(f"{path}:{line}: field '{field}': ")


def test_an_incomplete_machine_file_says_what_to_do(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("name: box\nhost_memory: 64 GiB\n")
    with pytest.raises(InputError) as info:
        load_machine_file(path)
    assert info.value.field == "gpus"
    assert "`recipegen machine detect -o FILE`" in str(info.value)
    assert "`catalog: h200-pcie`" in str(info.value)


def test_a_recipe_names_the_catalog_line_of_an_unknown_entry(tmp_path: Path) -> None:
    text = (REPO / "tests" / "bad_recipes" / "valid" / "tiny.yaml").read_text()
    lines = text.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln == "machines:")
    key = lines[start + 1]                                    # "  box:"
    end = next(i for i in range(start + 2, len(lines)) if not lines[i].startswith("    "))
    lines[start + 1:end] = [key, "    catalog: nope", "    host_memory: 64 GiB"]
    path = tmp_path / "r.yaml"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(InputError) as info:
        load_recipe(path, read_maps=False)
    assert info.value.field == f"machines.{key.strip().rstrip(':')}.catalog"
    assert info.value.line == start + 3


# ------------------------------------------------------------------ TP and the list commands

def test_tp_is_in_the_footer_where_it_is_printed() -> None:
    code, out = _run("check", "budgets", str(REPO / "recipes" / "deepseek-v3-fp8-h200x8.yaml"))
    assert code == 0, out
    assert "(TP 8, one box)" in out
    footer = out.split(HEADING)[1]
    assert ("  TP: tensor parallelism: each of the lane's N GPUs (TP N) holds a 1/N shard of most weights; some, "
            "such as norms and the router, are whole on every GPU instead") in footer
    code, out = _run("check", "budgets", str(REPO / "recipes" / "qwen3-30b-a3b-rtx4090.yaml"))
    assert "TP" not in out.split(HEADING)[1]


@pytest.mark.parametrize(("group", "kind"), [("model", "models"), ("machine", "machines")])
def test_list_names_every_catalog_entry(group: str, kind: str) -> None:
    code, out = _run(group, "list")
    assert code == 0, out
    rows = out.splitlines()
    assert [row.split()[0] for row in rows] == catalog_names(kind)
    assert all(len(row.split(None, 1)[1]) > 20 for row in rows)
    code, out = _run(group, "list", "--json")
    assert [item["id"] for item in json.loads(out)] == catalog_names(kind)


def test_list_lines_carry_the_catalog_figures() -> None:
    _, machines = _run("machine", "list")
    [h200] = [row for row in machines.splitlines() if row.startswith("h200-pcie ")]
    # 143,771 MiB as the driver reports it, 615 MiB of it reserved (machines.yaml)
    assert ("1 × H200, 140.40 GiB GPU memory each (CUDA allocates 139.80 GiB), host 125.87 GiB, pinned read "
            "51 GB/s") in h200
    [rtx] = [row for row in machines.splitlines() if row.startswith("rtx-4090 ")]
    assert "host 64.00 GiB (assumed)" in rtx
    _, models = _run("model", "list")
    [q30] = [row for row in models.splitlines() if row.startswith("qwen3-30b-a3b ")]
    # 48 MoE layers × 128 experts × 9,437,184 B (3 × 768 × 2048 bf16) = 54 GiB
    assert "48 layers (48 MoE) × 128 experts, top-8, bf16, routed experts 54.00 GiB, context 40,960" in q30


def test_new_help_points_at_the_list_commands() -> None:
    code, out = _run("new", "--help")
    assert code == 0
    flat = " ".join(out.split())
    assert "`recipegen machine list`" in flat and "`recipegen model list`" in flat
    assert "recipegen/catalog/machines.yaml" not in flat
