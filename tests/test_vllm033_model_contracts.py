"""The vLLM 0.33.0 source lines the ledger and the importer cite, pinned: each cited line range must
still say what the ledger assumes (read from the unpacked 0.33.0 source, never imported)."""

from __future__ import annotations

import pytest
from vllm033_source import vllm033_source

SRC = vllm033_source("model_executor/layers/fused_moe/oracle/mxfp4.py")
pytestmark = pytest.mark.skipif(SRC is None, reason="vLLM 0.33.0 source not unpacked (scripts/fetch-vllm033-source.sh)")


def lines(path: str, first: int, last: int) -> str:
    assert SRC is not None
    text = (SRC / path).read_text(encoding="utf-8").splitlines()
    return "\n".join(text[first - 1:last])


@pytest.mark.parametrize("path, first, last, needles", [
    # KV heads per rank: replicated when TP exceeds them; MLA caches one latent head.
    ("config/model.py", 1673, 1683, ["if self.use_mla:", "return 1",
                                     "max(1, total_num_kv_heads // parallel_config.tensor_parallel_size)"]),
    # Sliding-window layers hold the window (+ in-flight tokens) per request.
    ("v1/kv_cache_interface.py", 918, 944, ["self.sliding_window - 1", "max_model_len", "cdiv(num_tokens, self.block_size) + 1"]),
    # The --cpu-offload-gb walk: per parameter, dense ones too, until the budget is reached.
    ("model_executor/offloader/uva.py", 74, 125, ["for name, p in module.named_parameters():",
                                                 "if self.cpu_offload_bytes >= self.cpu_offload_max_bytes:",
                                                 "self.cpu_offload_bytes += p.data.numel() * p.data.element_size()"]),
    ("model_executor/offloader/uva.py", 102, 113, ["if self.cpu_offload_params:", 'f".{param}." in f".{prefix}{name}."']),
    # MXFP4 backend order for gpt-oss and the padding per backend.
    ("model_executor/layers/fused_moe/oracle/mxfp4.py", 402, 431, ["FLASHINFER_TRTLLM_MXFP4_BF16", "Mxfp4MoeBackend.TRITON,",
                                                                  "Mxfp4MoeBackend.MARLIN,", "is_device_capability_family(120)"]),
    ("model_executor/layers/fused_moe/oracle/mxfp4.py", 865, 873, ["round_up(intermediate_size, 128)",
                                                                  "round_up(hidden_size, 256)", "TRTLLM_BACKENDS"]),
    ("model_executor/layers/fused_moe/oracle/mxfp4.py", 915, 916, ["intermediate_size = round_up(intermediate_size, 64)"]),
    ("model_executor/layers/fused_moe/experts/gpt_oss_triton_kernels_moe.py", 41, 53, ["(9, 0) <= (cap.major, cap.minor) < (13, 0)"]),
    ("model_executor/layers/fused_moe/experts/marlin_moe.py", 592, 594, ["has_device_capability((7, 5))"]),
    ("model_executor/layers/quantization/utils/humming/priority.py", 11, 11, ["frozenset({90})"]),
    # gpt-oss: swigluoai with alpha 1.702 / limit 7, expert biases.
    ("model_executor/layers/quantization/mxfp4.py", 428, 430, ["gemm1_alpha=1.702", "swiglu_limit=7.0"]),
    ("model_executor/models/gpt_oss.py", 399, 400, ["has_bias=True", 'activation="swigluoai"']),
    ("model_executor/layers/fused_moe/oracle/unquantized.py", 385, 397, ["FLASHINFER_TRTLLM", "round_up(intermediate_size, 128)"]),
    ("config/cache.py", 44, 67, ['"fp8_e4m3",', '"fp8_e5m2",', '"bfloat16",']),
    # max_model_len: x rope factor except pre-scaled (YaRN-style) types; a longer one is refused.
    ("config/model.py", 2599, 2634, ['"yarn",', '"longrope",', "derived_max_model_len *= scaling_factor"]),
    ("config/model.py", 2657, 2684, ["elif max_model_len > derived_max_model_len:", "VLLM_ALLOW_LONG_MAX_MODEL_LEN",
                                     "model_max_length"]),
])
def test_cited_lines(path: str, first: int, last: int, needles: list[str]) -> None:
    text = lines(path, first, last)
    for needle in needles:
        assert needle in text, f"vllm/{path}:{first}-{last} no longer has {needle!r}"
