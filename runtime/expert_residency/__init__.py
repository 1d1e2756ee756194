"""Expert residency runtime: mounted into the vLLM serving container.

Imports nothing from recipegen. Dependencies: standard library and numpy everywhere;
torch/triton in the compute modules; vllm only in the plugin modules.
"""

__version__ = "0.1.0"
