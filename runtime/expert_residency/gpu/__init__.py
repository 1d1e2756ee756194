"""GPU residency path: pinned-host device views, Triton MXFP4 expert kernels over a hot (HBM) and
a cold (pinned host, read in place) bank, in-kernel usage counter, CUDA-graph capture.

Needs torch with CUDA and triton; imports nothing from vLLM (the H200 bench machine has none) and
nothing from recipegen. Import the submodules directly:

* ``gpu.pinned``  — ``PinnedRegion``, ``device_view``, ``pinned_view_allocator`` (cold-bank allocator
  for ``core.banks.rehome_layer``);
* ``gpu.experts`` — ``TritonMxfp4Experts`` (fused split layer + finalize; ``per_pick_fn()`` for the
  core's split invoke), ``KernelConfig``, ``ExpertShape``;
* ``gpu.layout``  — ``to_kernel_layout`` (tile-major expert bytes; convert each layer once, before
  re-homing it, with the config the kernels will use);
* ``gpu.kernels`` — the Triton kernels; ``gpu.kernels_t1`` — the T=1 pair on warp-level MMA;
* ``gpu.graphs``  — ``CapturedStep``.

Typical use (one MoE layer; ``tensors`` are its vLLM MXFP4 expert tensors on the device)::

    ex = TritonMxfp4Experts(ExpertShape(hidden, intermediate), num_experts, top_k, max_tokens, "cuda")
    ex.to_kernel_layout(tensors)
    layer = rehome_layer(tensors, hot_ids, cold_ids, layer_index=i,
                         hot_alloc=device_allocator("cuda"), cold_alloc=pinned_view_allocator())
    out = ex.forward(layer, x, topk_weights, topk_ids, counter=counter)   # capturable

Measured on the H200: BENCHMARKS.md, "Residency runtime on the H200 (GPU)".
"""
