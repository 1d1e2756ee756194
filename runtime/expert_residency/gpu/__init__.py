"""GPU residency path: pinned-host device views, Triton MXFP4 expert kernels over a hot (HBM) and
a cold (pinned host, read in place) bank, in-kernel usage counter, CUDA-graph capture.

Needs torch with CUDA and triton; imports nothing from vLLM (the H200 bench machine has none) and
nothing from recipegen. Import the submodules directly:

* ``gpu.pinned``  — ``PinnedRegion``, ``device_view``, ``pinned_view_allocator`` (cold-bank allocator
  for ``core.banks.rehome_layer``);
* ``gpu.experts`` — ``TritonMxfp4Experts`` (fused split layer + finalize; ``per_pick_fn()`` for the
  core's split invoke), ``KernelConfig``, ``ExpertShape``;
* ``gpu.kernels`` — the Triton kernels;
* ``gpu.graphs``  — ``CapturedStep``.
"""
