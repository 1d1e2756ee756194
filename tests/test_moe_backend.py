"""`--moe-backend` by the lane's GPU and expert format (recipegen/vllm_flags/moe_backend.py) and what render
and `check budgets` do with it. Expected values are read off vLLM 0.33's device gates by hand
(pinned against the source in tests/test_moe_backend_contracts.py):
TrtLlmMxfp4ExpertsModular needs the SM100 family, MarlinExperts 7.5+, TritonExperts any CUDA
device (7.0 here) and FP8 schemes 8.9+."""

from __future__ import annotations

from pathlib import Path

import pytest
from cli_support import invoke

from recipegen.vllm_flags.moe_backend import (
    START_PERIOD_AUTOTUNED,
    START_PERIOD_DEFAULT,
    NoBackend,
    choose,
    start_period,
)

REPO = Path(__file__).resolve().parent.parent


@pytest.mark.parametrize("fmt, cc, backend", [
    ("mxfp4", "10.3", "flashinfer_trtllm"),   # GB300
    ("mxfp4", "10.0", "flashinfer_trtllm"),   # B200 / GB200
    ("mxfp4", "9.0", "marlin"),               # H100 / H200: TRT-LLM is SM100-only
    ("mxfp4", "8.9", "marlin"),               # L40S / RTX 4090
    ("mxfp4", "12.0", "marlin"),              # RTX 5090 / RTX PRO 6000: not the SM100 family
    ("mxfp4", "7.5", "marlin"),
    ("bf16", "8.9", "triton"),
    ("bf16", "10.3", "triton"),
    ("fp16", "7.0", "triton"),
    ("fp8-block", "9.0", "triton"),
    ("fp8-block", "8.9", "triton"),
    ("fp8-block", "8.0", "marlin"),           # no FP8 MMA before 8.9: Marlin's W8A16
])
def test_backend_by_gpu_and_format(fmt: str, cc: str, backend: str) -> None:
    choice = choose(fmt, cc)
    assert choice.moe_backend == backend
    assert choice.row is not None and "vLLM 0.33.0" in choice.row.source


def test_no_flag_without_a_row_or_a_known_gpu() -> None:
    assert choose("nvfp4", "10.0").moe_backend is None   # vLLM's auto oracle
    assert choose("int4", "9.0").moe_backend is None
    assert choose("mxfp4", None).moe_backend is None
    assert choose(None, "9.0").moe_backend is None


def test_no_backend_names_gpu_format_and_what_would_work() -> None:
    with pytest.raises(NoBackend) as err:
        choose("mxfp4", "7.0", "V100")
    text = str(err.value)
    for words in ("mxfp4", "V100", "compute capability 7.0",
                  "--moe-backend flashinfer_trtllm (TrtLlmMxfp4ExpertsModular) needs the SM100 family",
                  "--moe-backend marlin (MarlinExperts) needs compute capability 7.5 or newer",
                  "placement: positional"):
        assert words in text, words


def test_start_period_follows_autotuning() -> None:
    assert start_period(choose("mxfp4", "10.3")) == START_PERIOD_AUTOTUNED == "180m"
    assert start_period(choose("mxfp4", "9.0")) == START_PERIOD_DEFAULT == "60m"
    assert start_period(choose("bf16", "8.9")) == "60m"
    assert start_period(None) == "60m"


def _run(*args: str) -> tuple[int, str]:
    result = invoke(*args)
    return result.code, result.output


def test_rendered_lanes_get_their_gpus_backend(project: Path) -> None:
    code, out = _run("render", "qwen3-30b-a3b-rtx4090")
    assert code == 0, out
    text = (project / "compose/qwen3-30b-a3b-rtx4090/compose.yaml").read_text()
    assert '"--moe-backend"\n      - "triton"' in text and "flashinfer_trtllm" not in text
    assert "start_period: 60m" in text and "start_period: 180m" not in text
    code, out = _run("render", "dsv41-flash-gb300")
    assert code == 0, out
    text = (project / "compose/dsv41-flash-gb300/compose.yaml").read_text()
    assert '"--moe-backend"\n      - "flashinfer_trtllm"' in text
    assert "start_period: 180m" in text


def test_a_residency_lane_no_backend_admits_fails_check_and_render(
        project: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The runtime's capability table (bf16 from 8.0) admits the RTX 4090 (8.9); a backend table
    whose only bf16 row needs 9.0 does not: `check budgets` fails naming GPU, format and what
    would work, and render refuses to write."""
    import dataclasses

    from recipegen.vllm_flags import moe_backend

    rows = tuple(dataclasses.replace(r, min_cc=(9, 0)) if r.expert_format == "bf16" else r
                 for r in moe_backend.TABLE)
    monkeypatch.setattr(moe_backend, "TABLE", rows)
    code, out = _run("check", "budgets", "qwen3-30b-a3b-rtx4090")
    assert code == 1, out
    for words in ("no vLLM 0.33 MoE backend runs bf16 experts", "RTX 4090 (compute capability 8.9)",
                  "--moe-backend triton (TritonExperts) needs compute capability 9.0 or newer",
                  "placement: positional"):
        assert words in out, words
    before = (project / "compose").exists()
    code, out = _run("render", "qwen3-30b-a3b-rtx4090")
    assert code != 0 and "no vLLM 0.33 MoE backend runs bf16 experts" in out
    assert (project / "compose").exists() == before
