"""`check budgets --explain` lets a reader redo each figure from what it prints.

For committed recipes this parses the explanation text — each figure's printed value, formula
operands and note — and recomputes named figures with its own arithmetic from the printed operands
only, asserting the result is the printed value within the rounding it is printed with. It also
checks the operand rendering rule (a unit on every size and rate, exact integers where a ceil or a
floor is taken) and that a pipeline stage's derived reserves are not labelled measured.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest
from cli_support import invoke

from recipegen.ledger import compute_ledger
from recipegen.ledger.figures import format_operand, operand_unit
from recipegen.ledger.kv import kv_tokens_figure
from recipegen.load.recipe import load_recipe

ROOT = Path(__file__).resolve().parents[1]
GIB, MIB = 2**30, 2**20

RECIPES = ("gpt-oss-120b-l40s", "deepseek-v3-fp8-h200x8", "qwen3.5-35b-a3b-rtx5090",
           "nemotron-3-nano-30b-a3b-rtx4090", "dsv41-flash-gb300x2-pp2")
STATE_RECIPES = ("qwen3.5-35b-a3b-rtx5090", "nemotron-3-nano-30b-a3b-rtx4090")


# ------------------------------------------------------------------------------------------
# parsing the text

@dataclass
class Printed:
    """One figure as --explain prints it."""

    label: str
    display: str
    formula: str = ""
    operands: dict[str, str] = field(default_factory=dict)
    note: str = ""

    def op(self, name: str) -> float:
        """An operand's number, from its exact text (never from the GiB beside it)."""
        return number(self.operands[name])

    @property
    def value(self) -> tuple[float, float]:
        return printed_value(self.display)


_FIGURE = re.compile(r"^(?P<indent> +)(?:\[[\w-]+\] )?(?P<label>.+?) = (?P<display>.+)$")
_OPERAND_SPLIT = re.compile(r", (?=[A-Za-z_][\w\-]*=)")


def figures(text: str) -> list[Printed]:
    """Every figure block of the explanation, in order."""
    out: list[Printed] = []
    for line in text.splitlines():
        stripped = line.strip()
        if out and stripped.startswith("= ") and not out[-1].formula:
            formula, _, ops = stripped[2:].partition("   [")
            out[-1].formula = formula
            if ops:
                for part in _OPERAND_SPLIT.split(ops.removesuffix("]")):
                    name, _, value = part.partition("=")
                    out[-1].operands[name] = value
        elif out and stripped.startswith("(") and stripped.endswith(")") and not out[-1].note:
            out[-1].note = stripped[1:-1]
        else:
            m = _FIGURE.match(line)
            if m and len(m["indent"]) >= 4 and not stripped.startswith(("=", "(")):
                out.append(Printed(m["label"], m["display"]))
    return out


def find(figs: list[Printed], label: str) -> Printed:
    """The first figure whose label starts with `label`."""
    return next(f for f in figs if f.label.startswith(label))


def find_all(figs: list[Printed], label: str) -> list[Printed]:
    return [f for f in figs if f.label.startswith(label)]


def number(text: str) -> float:
    """The leading number of an operand's text: '2,146,304 B (2.05 MiB)' -> 2146304."""
    m = re.match(r"-?[\d,]+(?:\.\d+)?", text.strip())
    assert m, f"no number in {text!r}"
    return float(m.group(0).replace(",", ""))


def printed_value(display: str) -> tuple[float, float]:
    """(value, half the last printed digit) of a figure's printed value."""
    display = display.strip()
    if m := re.fullmatch(r"[\d.,]+ MiB \(([\d,]+) B\)", display):
        return float(m.group(1).replace(",", "")), 0.5
    if m := re.fullmatch(r"(-?[\d,]+\.(\d+)) (GiB|MiB)", display):
        scale = GIB if m.group(3) == "GiB" else MIB
        return float(m.group(1).replace(",", "")) * scale, 0.5 * 10 ** -len(m.group(2)) * scale
    if m := re.fullmatch(r"([\d.]+)([kM]) tokens", display):
        scale = {"k": 1e3, "M": 1e6}[m.group(2)]
        decimals = len(m.group(1).partition(".")[2])
        return float(m.group(1)) * scale, 0.5 * 10 ** -decimals * scale
    if m := re.fullmatch(r"([\d,]+(?:\.(\d+))?)(?: B/token| tokens)?", display):
        decimals = len(m.group(2) or "")
        return float(m.group(1).replace(",", "")), 0.5 * 10 ** -decimals
    raise AssertionError(f"unparsed printed value {display!r}")


def assert_reproduces(fig: Printed, recomputed: float) -> None:
    value, tol = fig.value
    assert abs(recomputed - value) <= tol * 1.0000001 + 1e-9, (
        f"{fig.label}: recomputed {recomputed!r} from the printed operands, printed {fig.display!r}")


@cache
def explain(recipe: str) -> str:
    result = invoke("check", "budgets", str(ROOT / "recipes" / f"{recipe}.yaml"), "--explain")
    assert result.code in (0, 1), result.output
    return result.output


# ------------------------------------------------------------------------------------------
# the operand rule

def test_operand_rule() -> None:
    assert format_operand("page_bytes", 2_228_224) == "2,228,224 B (2.12 MiB)"
    assert format_operand("hbm_cap_bytes", 138_101_089_894.4) == "138,101,089,894.40 B (128.62 GiB)"
    assert format_operand("drafter_bytes", 0.0) == "0 B"
    assert format_operand("counter_bytes", 92_809) == "92,809 B"
    assert format_operand("bytes_per_expert", 6_291_456) == "6,291,456 B (6.00 MiB)"
    assert format_operand("attention_bytes_per_token_per_layer", 2048) == "2,048 B/token"
    assert format_operand("kv_bytes_per_token_per_gpu", 6975.75) == "6,975.75 B/token"
    assert format_operand("tokens_per_gib_per_gpu", 15279.77) == "15,279.8 tokens/GiB"
    assert format_operand("max_model_len", 131072) == "131,072 tokens"
    assert format_operand("layer_param_bytes", [1024, 2 * MIB]) == "[1,024 B, 2,097,152 B (2.00 MiB)]"
    assert format_operand("tp", 8) == "8"
    assert format_operand("gpu_memory_utilization", 0.92) == "0.92"
    assert format_operand("prefix_caching", True) == "True"


@pytest.mark.parametrize("recipe", RECIPES)
def test_every_size_and_rate_carries_its_unit(recipe: str) -> None:
    """Operands named as sizes print in bytes (exact, the GiB beside them), rates per token in B/token:
    never a bare number, never GiB alone."""
    seen = 0
    for fig in figures(explain(recipe)):
        for name, text in fig.operands.items():
            unit = operand_unit(name)
            if not unit or text.startswith(("[", "'")) or not re.match(r"-?\d", text):
                continue
            seen += 1
            if unit == "B":
                assert re.fullmatch(r"-?[\d,]+(\.\d+)? B( \(-?[\d,]+\.\d\d (GiB|MiB)\))?", text), (fig.label, name, text)
            else:
                assert text.endswith(" " + unit), (fig.label, name, text)
        if fig.label.startswith("KV per token per layer"):
            assert fig.display.endswith(" B/token"), fig.display
    assert seen > 20


# ------------------------------------------------------------------------------------------
# figures redone from their printed operands

_DTYPE = {"bf16": 2, "fp16": 2, "fp8": 1, "fp32": 4}


@pytest.mark.parametrize("recipe", RECIPES[:4])
def test_kv_layers_and_sequence_redo(recipe: str) -> None:
    figs = figures(explain(recipe))
    for layer in find_all(figs, "KV per token per layer"):
        if "kv_lora_rank" in layer.operands:
            rate = (layer.op("kv_lora_rank") + layer.op("rope_head_dim")) * _DTYPE[layer.operands["kv_dtype"]]
        else:
            heads = max(1, int(layer.op("kv_heads")) // int(layer.op("tp")))
            assert heads == layer.op("kv_heads_per_rank")
            rate = 2 * heads * layer.op("head_dim") * _DTYPE[layer.operands["kv_dtype"]]
        assert_reproduces(layer, rate)
    seq = next(f for f in figs if "of one max_model_len sequence" in f.label)
    if "page_bytes" in seq.operands:
        blocks = (seq.op("attention_groups") * seq.op("attention_blocks")
                  + seq.op("state_groups") * seq.op("state_blocks"))
        assert_reproduces(seq, blocks * seq.op("layers_per_group") * seq.op("page_bytes"))
    else:
        groups = [n for n in seq.operands if re.fullmatch(r"group\d+_\w+_bytes", n)]
        assert groups
        assert_reproduces(seq, sum(seq.op(n) for n in groups))
    lane = find(figs, "KV bytes per token at max_model_len")
    assert lane.op("bytes_per_sequence") == seq.value[0] or seq.value[1] > 0.5
    assert_reproduces(lane, lane.op("bytes_per_sequence") / lane.op("max_model_len") * lane.op("tp"))


@pytest.mark.parametrize("recipe", STATE_RECIPES)
def test_state_page_block_and_pool_redo(recipe: str) -> None:
    """The state page from its printed inputs (conv and SSM dtypes included), the block's ceil, the
    page, the pool block and the sequences the pool holds — all in exact integers."""
    figs = figures(explain(recipe))
    state = find(figs, "state per sequence per layer")
    a, b = [state.op(n) for n in state.operands if n in ("head_v_dim", "head_k_dim", "head_dim", "state_size")]
    conv = (state.op("conv_kernel") - 1) * state.op("conv_channels") * _DTYPE[state.operands["conv_dtype"]]
    ssm = state.op("state_heads") * a * b * _DTYPE[state.operands["ssm_dtype"]]
    assert _DTYPE[state.operands["conv_dtype"]] == state.op("conv_dtype_bytes")
    assert _DTYPE[state.operands["ssm_dtype"]] == state.op("ssm_dtype_bytes")
    assert state.operands["ssm_dtype"] == "fp32"      # both models keep their SSM state in fp32
    assert_reproduces(state, conv + ssm)
    assert state.value[1] == 0.5                       # printed to the byte

    block = find(figs, "attention block (tokens)")
    assert re.fullmatch(r"[\d,]+ tokens", block.display), block.display
    align, per_token = block.op("align"), block.op("attention_bytes_per_token_per_layer")
    assert block.op("state_page_bytes") == state.value[0]
    assert_reproduces(block, align * math.ceil(block.op("state_page_bytes") / (align * per_token)))

    page = find(figs, "one page")
    assert page.op("block_tokens") == block.value[0]
    assert_reproduces(page, page.op("block_tokens") * page.op("attention_bytes_per_token_per_layer"))
    assert page.op("state_padding_bytes") == page.value[0] - state.value[0]

    pool_block = find(figs, "one pool block")
    assert_reproduces(pool_block, pool_block.op("layers_per_group") * pool_block.op("page_bytes"))

    seq = next(f for f in figs if f.label.startswith("KV + state of one max_model_len sequence"))
    assert seq.op("attention_blocks") == math.ceil(find(figs, "max_model_len").value[0] / block.value[0])

    bound = find(figs, "sequences of any length the pool holds")
    blocks = math.floor(max(0.0, bound.op("kv_pool_bytes")) / bound.op("bytes_per_block"))
    assert_reproduces(bound, blocks // bound.op("blocks_per_short_sequence"))


@pytest.mark.parametrize("recipe", RECIPES[:4])
def test_hbm_pool_redo(recipe: str) -> None:
    figs = figures(explain(recipe))
    cap = find(figs, "HBM cap (vLLM budget)")
    assert_reproduces(cap, cap.op("hbm_capacity_bytes") * cap.op("gpu_memory_utilization"))
    pool = find(figs, "KV pool (per GPU)")
    rest = sum(pool.op(n) for n in pool.operands if n not in ("hbm_cap_bytes", "dense_offloaded_bytes", "tp"))
    assert_reproduces(pool, pool.op("hbm_cap_bytes") - rest)


def _check_kv_tokens(fig: Printed, figs: list[Printed]) -> None:
    """`kv.tokens` redone per GPU: the per-GPU pool over the per-GPU rate, and the rate's note says what
    it is (the lane's rate, kv.lane_bytes_per_token, where the model has attention layers)."""
    per_gpu = fig.op("kv_bytes_per_token_per_gpu")
    assert per_gpu == pytest.approx(fig.op("lane_kv_bytes_per_token") / fig.op("tp"), abs=0.005)
    assert_reproduces(fig, max(0.0, fig.op("kv_pool_bytes")) / per_gpu)
    assert_reproduces(fig, max(0.0, fig.op("kv_pool_bytes")) / GIB * fig.op("tokens_per_gib_per_gpu"))
    assert "uncapped here" not in fig.note
    lane = find_all(figs, "KV bytes per token at max_model_len")
    if lane:
        assert "kv.lane_bytes_per_token" in fig.note
        assert fig.operands["lane_kv_bytes_per_token"] == format_operand("lane_kv_bytes_per_token", lane[0].value[0])


def test_kv_tokens_figure_redoes_per_gpu() -> None:
    """kv.kv_tokens_figure, as `placement_figures` is to use it, on a TP-8 lane and on a lane whose
    sliding layers are capped: the printed pool × the printed per-GPU tokens per GiB is the figure."""
    for recipe in ("deepseek-v3-fp8-h200x8", "gpt-oss-120b-l40s", "qwen3.5-35b-a3b-rtx5090"):
        loaded = load_recipe(ROOT / "recipes" / f"{recipe}.yaml")
        lane = loaded.recipe.lanes[0]
        ledger = compute_ledger(loaded).lane(lane.name)
        rate = ledger.fig("kv.bytes_per_token").value if "kv.bytes_per_token" in ledger.figures \
            else ledger.fig("kv.lane_bytes_per_token").value
        pool = ledger.fig("hbm.kv_pool").value
        fig = kv_tokens_figure(loaded.recipe.model, lane, pool, rate, lane.tensor_parallel_size)
        assert fig.value == ledger.fig("kv.tokens").value          # the same figure, explained per GPU
        printed = figures("    " + fig.explain().replace("\n", "\n    "))[0]
        _check_kv_tokens(printed, figures(explain(recipe)))


@pytest.mark.parametrize("recipe", RECIPES[:4])
def test_kv_tokens_redo_per_gpu(recipe: str) -> None:
    figs = figures(explain(recipe))
    for fig in find_all(figs, "KV pool in tokens"):
        _check_kv_tokens(fig, figs)


# ------------------------------------------------------------------------------------------
# the pipeline-parallel lane

def test_pipeline_stage_reserves_are_not_labelled_measured() -> None:
    text = explain("dsv41-flash-gb300x2-pp2")
    assert "(measured)" not in text
    assert "measured input" not in text
    assert "the lane's measured reserve" not in text
    figs = figures(text)
    stages = find_all(figs, "stage HBM reserve (per GPU)")
    assert len(stages) == 2
    for stage in stages:
        parts = ("runtime_rest_bytes", "stage_dense_per_gpu_bytes", "drafter_per_gpu_bytes",
                 "tables_in_hbm_per_gpu_bytes")
        assert_reproduces(stage, sum(stage.op(n) for n in parts if n in stage.operands))
        assert "back-solved single-box reserve" in stage.note
    for reserve in find_all(figs, "HBM reserve (non-expert, non-KV; this stage's share)"):
        assert reserve.note.startswith("back-solved on one box, not measured on this pipeline")
    for reserve in find_all(figs, "host reserve (page cache, processes)"):
        assert reserve.note.startswith("back-solved on one box, not measured on this pipeline")
        assert "assumed on every machine" in reserve.note
    headline = [line for line in text.splitlines() if line.strip().startswith("stage reserve")]
    assert len(headline) == 2 and all("derived from the lane's back-solved single-box reserve" in line
                                      for line in headline)
    assert all(re.search(r"host reserve [\d.]+ GiB \(the lane's back-solved single-box host reserve, assumed on "
                         r"every machine\)", line) for line in headline)
    for line in text.splitlines():
        if line.strip().startswith("HBM / GPU:"):   # derived on the single box's basis, not measured here
            assert "derived from the lane's back-solved single-box reserve)" in line, line
        if line.strip().startswith("Host:"):
            assert "(back-solved" in line, line
