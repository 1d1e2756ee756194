"""Expert residency runtime: mounted into the vLLM serving container.

Imports nothing from recipegen. Dependencies: standard library and numpy everywhere;
torch/triton in the compute modules; vllm in the plugin modules and two ``blackwell`` functions
that call vLLM's own code (``layout.convert_with_vllm``, ``trtllm.vllm_mxfp8_quantize``). What
recipegen reads (``formats``, ``contract``) is numpy / standard library only (tests/test_layers.py).
"""

__version__ = "0.1.0"
