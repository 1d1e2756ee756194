"""Contract: the vLLM 0.33.0 lines ``vllm_plugin/expert_parallel.py`` relies on say what it assumes.

Read from the unpacked wheel's source (never imported). Each check names the file and line range
cited in the module's docstring and docs/parallel.md; a failure means 0.33's EP seam moved and the
module must be re-read against the new source before EP lanes are allowed.
"""

from __future__ import annotations

import pytest
from vllm033_source import vllm033_source

MOE = "model_executor/layers/fused_moe/"

# (file, first line, last line, snippets that must all appear there, what the plugin assumes)
PINNED = [
    (MOE + "config.py", 1226, 1245, ["ep_size = tp_size", "ep_rank = tp_rank", "tp_size=1", "use_ep=True"],
     "under EP the MoE layer has tp_size 1 and ep_size = the flattened TP size"),
    (MOE + "config.py", 1034, 1039, ["def use_all2all_kernels", "self.use_ep and",
                                     "self.dp_size > 1 or self.pcp_size > 1 or self.is_sequence_parallel"],
     "all2all kernels only with DP, PCP or sequence parallel"),
    ("config/parallel.py", 220, 220, ['all2all_backend: All2AllBackend = "allgather_reducescatter"'],
     "the default all2all backend"),
    ("config/parallel.py", 537, 543, ['["pplx", "naive"]', 'self.all2all_backend = "allgather_reducescatter"'],
     "'naive' is mapped to allgather_reducescatter"),
    (MOE + "expert_map_manager.py", 301, 311, ["def expert_map(self)",
                                               "expert_map[global_id] = local_id if expert is on this rank",
                                               "expert_map[global_id] = -1 if expert is not on this rank"],
     "the canonical map: global id -> local slot or -1"),
    (MOE + "routed_experts.py", 268, 276, ["self.local_num_experts = self.expert_map_manager.local_num_experts",
                                           "self.expert_placement_strategy = self.expert_map_manager.placement_strategy",
                                           '"_expert_map", self.expert_map_manager.expert_map'],
     "the layer registers the canonical map as _expert_map"),
    (MOE + "routed_experts.py", 256, 266, ["def expert_map(self)", "consumes_expert_mask", "return self.expert_mask",
                                           "return self._expert_map"],
     "the public expert_map may be AITER's mask; the plugin reads _expert_map and refuses the mask"),
    (MOE + "routed_experts.py", 727, 737, ["expert_id = self._map_global_expert_id_to_local_expert_id(global_expert_id)",
                                           "if expert_id == -1 and not use_global_sf:"],
     "the loader keeps only local experts, at their local slot"),
    (MOE + "runner/moe_runner.py", 629, 643, ["topk_weights, topk_ids = self.router.select_experts(",
                                              "fused_out = self.routed_experts.forward_modular(",
                                              "topk_ids=topk_ids,"],
     "forward_modular gets the router's (global) ids"),
    (MOE + "fused_moe_modular_method.py", 110, 121, ["topk_ids=topk_ids,", "global_num_experts=layer.global_num_experts",
                                                     "expert_map=layer.expert_map,"],
     "vLLM's own kernel drops foreign picks through the expert map"),
    (MOE + "runner/moe_runner.py", 508, 515, ["self.moe_config.tp_size > 1 or self.moe_config.ep_size > 1",
                                              "states = tensor_model_parallel_all_reduce(states)"],
     "the runner all-reduces the ranks' shares after forward_modular"),
    (MOE + "runner/moe_runner.py", 801, 804, ["def do_naive_dispatch_combine", "self.moe_config.dp_size > 1",
                                              "not self._quant_method.supports_internal_mk"],
     "with DP the dispatch happens around or inside the kernel: refused by the plugin"),
    (MOE + "expert_map_manager.py", 449, 452, ["self._local_num_experts += self.num_fused_shared_experts"],
     "fused shared experts add local rows the row map does not have: refused"),
]


@pytest.mark.parametrize("rel,first,last,snippets,why", PINNED, ids=[f"{p[0]}:{p[1]}" for p in PINNED])
def test_pinned_lines(rel: str, first: int, last: int, snippets: list[str], why: str) -> None:
    root = vllm033_source(rel)
    if root is None:
        pytest.skip("vLLM 0.33.0 source not unpacked (scripts/fetch-vllm033-source.sh)")
    lines = (root / rel).read_text(encoding="utf-8").splitlines()
    text = "\n".join(lines[first - 1:last])
    missing = [s for s in snippets if s not in text]
    assert not missing, f"{rel}:{first}-{last} no longer has {missing} ({why})"
