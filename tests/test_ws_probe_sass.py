"""The warp-specialized expert GEMMs of ``bench/ws_probe.py`` (BENCHMARKS.md, run WS), compiled for
sm_90 with whichever Triton is installed (no GPU needed: Triton's own ptxas and cuobjdump). Gluon,
the language they are written in, is experimental and its API moves between Triton releases (3.6
calls the cp.async copy ``async_copy_global_to_shared``, later releases ``async_load``): this test
is what says so when the next release moves it again.

The expected counts follow from the tiles (128 x 128 for w2, two 64 x 128 tiles for w13; 16
tokens per pass; one compute warpgroup of 128 threads, one loader warpgroup of 128):
- per K step each compute thread decodes 128 weights = 64 bytes = 16 words: four 16-byte shared
  loads, and four bf16x2 multiplies per word (the decode's scale) = 64;
- the MMAs: (rows / 64 row-reps x 4 warps... ) each warp covers 16 rows per rep, 8 k16 steps per K
  step and 2 n8 halves of 16 tokens: w2 2 reps x 8 x 2 = 32, w13 2 tiles x 1 rep x 8 x 2 = 32;
- each loader thread copies 64 bytes of weights per K step (four 16-byte copies: w2 one 8 KiB
  tile, w13 two of 4 KiB), the lane groups' scale words once per lane (w2 512 rows x 4 bytes, w13
  2 x 256 x 4: four 4-byte copies) and 32 bytes of input rows (16 x 128 bf16 / 128: two copies).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from tiers import needs_gpu_experts

pytestmark = needs_gpu_experts

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def probe():
    spec = importlib.util.find_spec("triton")
    if spec is None or not (Path(spec.origin).parent / "backends/nvidia/bin/cuobjdump").exists():
        pytest.skip("this Triton has no NVIDIA backend tools (ptxas, cuobjdump) to compile for sm_90")
    sys.path.insert(0, str(ROOT / "bench"))
    import triton.language.target_info as target_info
    import ws_probe

    replaced = target_info.current_target
    yield ws_probe
    target_info.current_target = replaced


@pytest.mark.parametrize("which", ["w13", "w2"])
def test_compute_loop_decodes_from_shared_memory_without_moving_bytes_between_threads(probe, which: str) -> None:
    report = probe.sass_report(probe.parse_variant(""), which, 5120, 2304)
    ops = report["loop_ops"]
    assert report["spill_instructions"] == 0
    assert ops["LDS"] == 4 and ops["HMUL2"] == 64 and ops["HMMA"] == 32
    # no exchange between threads or through shared memory on the weights' way to the MMAs
    assert "SHFL" not in ops and "STS" not in ops
    assert report["per_weight"] < 2.6   # 2.45 with Triton 3.6 and 3.9; our tl.dot loops 3.0-3.2
    assert report["loader_copies"] == 4 + 4 + 2


def test_more_tokens_per_pass_copy_more_input_rows(probe) -> None:
    report = probe.sass_report(probe.parse_variant("bm=32"), "w2", 5120, 2304)
    assert report["loader_copies"] == 4 + 4 + 4
    assert report["loop_ops"]["HMMA"] == 2 * 8 * 4


def test_unknown_setting_is_refused(probe) -> None:
    with pytest.raises(SystemExit, match="unknown setting 'stage'"):
        probe.parse_variant("stage=3")
