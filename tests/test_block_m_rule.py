"""The compiled MXFP4 kernels never run with a token tile (``KernelConfig.block_m``) below 16:
measured on one NVIDIA H200 (2026-12-01), the MMA-order decode compiled with ``block_m=4`` gave
wrong outputs (relative L2 1.9 against ``block_m=16``), which ``TRITON_INTERPRET=1`` does not
show. On CPU: every path a user reaches (the default config, ``config_for_shape`` over the served
geometries, the plugin's bank-kernel entry under each ``EXPERT_RESIDENCY_BANK_KERNEL`` value, the
benches' ``--config`` parser) picks ``block_m >= 16`` or refuses with the rule's message."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from expert_residency.gpu.tile_rules import (
    MIN_COMPILED_BLOCK_M,
    check_compiled_block_m,
    compiled_block_m_reason,
)
from tiers import needs_gpu_experts

ROOT = Path(__file__).resolve().parents[1]


def test_rule_refuses_small_tiles_compiled_only() -> None:
    assert MIN_COMPILED_BLOCK_M == 16
    msg = compiled_block_m_reason(4, 3, "cuda")
    assert msg is not None and "block_m=4" in msg and "16" in msg and "MMA-order" in msg
    assert "never checked" in compiled_block_m_reason(8, 0, "cuda")
    assert compiled_block_m_reason(15, 1, "cuda") is not None
    assert compiled_block_m_reason(16, 3, "cuda") is None
    assert compiled_block_m_reason(32, 3, "cuda") is None
    assert compiled_block_m_reason(4, 3, "cpu") is None     # the interpreter computes it right


class _Cfg:
    def __init__(self, block_m: int, dequant: int = 3) -> None:
        self.block_m, self.dequant = block_m, dequant


def test_check_reads_the_device_type() -> None:
    check_compiled_block_m(_Cfg(4), "cpu")
    check_compiled_block_m(_Cfg(16), "cuda:0")
    with pytest.raises(ValueError, match="block_m=4 is below 16"):
        check_compiled_block_m(_Cfg(4), "cuda:1")


# (hidden, intermediate) of the MXFP4 geometries served: DeepSeek-V4.1, gpt-oss-120b/20b, and
# gpt-oss as vLLM 0.33 pads it for its Marlin / TRT-LLM backends (3,072 / 2,944).
GEOMETRIES = [(5120, 2304), (2880, 2880), (3072, 2944)]


@needs_gpu_experts
@pytest.mark.parametrize("hidden,inter", GEOMETRIES)
@pytest.mark.parametrize("dequant", [3, 1, 0])
def test_config_for_shape_keeps_the_token_tile(hidden: int, inter: int, dequant: int) -> None:
    from expert_residency.gpu.experts import ExpertShape, KernelConfig, config_for_shape

    assert KernelConfig().block_m == 16
    cfg = config_for_shape(ExpertShape(hidden, inter), KernelConfig(dequant=dequant))
    assert cfg.block_m == 16
    check_compiled_block_m(cfg, "cuda")


class _Recorder:
    """Stands in for TritonMxfp4Experts (no GPU here): records the config it would compile."""
    configs: list = []

    def __init__(self, shape, num_experts, top_k, max_tokens, device, config, **kw) -> None:
        _Recorder.configs.append(config)
        self.config = config


@needs_gpu_experts
@pytest.mark.parametrize("environ", [{}, {"EXPERT_RESIDENCY_BANK_KERNEL": "triton"},
                                     {"EXPERT_RESIDENCY_BANK_KERNEL": "triton-dot-scaled"}])
@pytest.mark.parametrize("activation", ["silu", "swigluoai"])
def test_plugin_bank_kernel_entry_picks_block_m_16(monkeypatch, environ, activation) -> None:
    import expert_residency.gpu.experts as gx
    from expert_residency.blackwell.plugin import cuda_bank_experts

    monkeypatch.setattr(gx, "TritonMxfp4Experts", _Recorder)
    _Recorder.configs = []
    for hidden, inter in GEOMETRIES:
        cuda_bank_experts(hidden, inter, 8, 4, 16, "cuda", capability=(9, 0), environ=environ,
                          activation=activation)
    assert [c.block_m for c in _Recorder.configs] == [16, 16, 16]


@needs_gpu_experts
def test_plugin_refuses_a_given_small_tile_before_building(monkeypatch) -> None:
    import expert_residency.gpu.experts as gx
    from expert_residency.blackwell.plugin import cuda_bank_experts

    monkeypatch.setattr(gx, "TritonMxfp4Experts", _Recorder)
    _Recorder.configs = []
    with pytest.raises(ValueError, match="block_m=4 is below 16"):
        cuda_bank_experts(5120, 2304, 8, 4, 16, "cuda", capability=(9, 0), environ={},
                          kernel_config=gx.KernelConfig(block_m=4))
    assert _Recorder.configs == []


@needs_gpu_experts
def test_plugin_layer_object_passes_no_tile_override(monkeypatch) -> None:
    """The worker runtime builds ``Mxfp4Residency`` without a kernel config: the default tiles."""
    import expert_residency.gpu.experts as gx
    import torch
    from expert_residency.vllm_plugin.mxfp4_experts import Mxfp4Geometry, Mxfp4Residency, residency_for

    monkeypatch.setattr(gx, "TritonMxfp4Experts", _Recorder)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a, **k: (9, 0))
    monkeypatch.delenv("EXPERT_RESIDENCY_BANK_KERNEL", raising=False)
    _Recorder.configs = []
    Mxfp4Residency(Mxfp4Geometry(2880, 2880, 8, 4), "cuda", 16, activation="swigluoai")
    assert [c.block_m for c in _Recorder.configs] == [16]
    import inspect
    assert "kernel_config" not in inspect.getsource(residency_for)   # no override on this path


@needs_gpu_experts
def test_bench_config_parser_refuses_small_tiles() -> None:
    """``bench/gpu_residency.py --config/--sweep/--compare`` (and ``bench/peer_moe.py --config``,
    which calls the same parser) run on CUDA: block_m=4 is refused with the rule's message."""
    sys.path.insert(0, str(ROOT / "bench"))
    spec = importlib.util.spec_from_file_location("_gr_under_test", ROOT / "bench" / "gpu_residency.py")
    gr = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gr)
    assert str(gr.DEV) == "cuda"
    assert gr.parse_config("block_m=16,dequant=1").block_m == 16
    assert gr.parse_config("").block_m == 16
    with pytest.raises(ValueError, match="block_m=4 is below 16"):
        gr.parse_config("block_m=4,block_n1=64")
    assert "gr.parse_config(args.config)" in (ROOT / "bench" / "peer_moe.py").read_text()


@needs_gpu_experts
def test_kernel_object_refuses_a_small_tile_for_cuda_before_allocating() -> None:
    """The constructor itself checks (every caller is covered); it raises before touching the
    device, so no GPU is needed to see it. On CPU the same tile is accepted."""
    import torch
    from expert_residency.gpu import experts as gx

    shape = gx.ExpertShape(hidden=256, intermediate=128)
    small = gx.KernelConfig(dequant=0, block_m=4, block_n1=32, block_k1=64, block_n2=32, block_k2=64)
    with pytest.raises(ValueError, match="block_m=4 is below 16"):
        gx.TritonMxfp4Experts(shape, 8, 2, 4, "cuda", small)
    gx.TritonMxfp4Experts(shape, 8, 2, 4, torch.device("cpu"), small)
