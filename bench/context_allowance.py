"""What a vLLM worker holds on its GPU before the weights load, measured stage by stage.

The ledger adds `recipegen.ledger.reserves.load_context_allowance` (768 MiB on a one-GPU lane, 1,344 MiB
per GPU with NCCL: this bench's run on one H100 80GB HBM3, 2026-12-05, rounded up to 64 MiB; it had
been 512 MiB, assumed from one public reading) to the load-time HBM peak for the CUDA context, cuBLAS and NCCL a worker creates
before its first weight. This measures each of those on the machine it runs on, as device memory in
use (NVML) after each stage against the figure before this process touched CUDA:

  context    the CUDA context (`torch.cuda.init` and a 1-element tensor)
  cublas     a bf16 matmul (cuBLAS / cuBLASLt handles and workspace, as the first linear layer makes)
  triton     one Triton kernel compiled and launched (a module load, as vLLM's Triton kernels make)
  nccl       a one-rank NCCL process group and one all-reduce (a tensor-parallel lane's communicator;
             with more ranks NCCL's buffers grow, so this is a floor for TP > 1)

It also reads CUDA's own total (`torch.cuda.mem_get_info`) beside NVML's, which is the catalog's
`hbm` less `driver_reserved` for this GPU.

    python3 bench/context_allowance.py --out $OUT/context_allowance.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path

MiB = 2**20
# recipegen.ledger.reserves.LOAD_CONTEXT_ONE_GPU / LOAD_CONTEXT_WITH_NCCL, the figures checked here
ALLOWANCE_ONE_GPU = 768 * MiB
ALLOWANCE_WITH_NCCL = 1344 * MiB


def nvml_used(handle: object) -> tuple[int, int, int | None]:
    """(device bytes in use, device total, this process's bytes or None where NVML cannot see it)."""
    import pynvml

    info = pynvml.nvmlDeviceGetMemoryInfo(handle)
    mine = None
    try:
        for proc in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
            if proc.pid == os.getpid():
                mine = int(proc.usedGpuMemory or 0)
    except pynvml.NVMLError:
        pass
    return int(info.used), int(info.total), mine


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="JSON file to write")
    args = parser.parse_args()

    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    base_used, nvml_total, _ = nvml_used(handle)
    stages: list[dict[str, object]] = []

    def record(stage: str) -> None:
        import torch

        torch.cuda.synchronize()
        used, _, mine = nvml_used(handle)
        free, total = torch.cuda.mem_get_info()
        stages.append({"stage": stage, "device_used_above_baseline": used - base_used, "process_used": mine,
                       "torch_reserved": int(torch.cuda.memory_reserved()), "cuda_free": int(free),
                       "cuda_total": int(total)})
        print(f"{stage:8s} +{(used - base_used) / MiB:8.1f} MiB on the device"
              + (f", NVML per process {mine / MiB:.1f} MiB" if mine is not None else ""), flush=True)

    import torch

    torch.cuda.init()
    torch.empty(1, device="cuda")
    record("context")

    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    (a @ a).sum().item()
    del a
    torch.cuda.empty_cache()
    record("cublas")

    import triton
    import triton.language as tl

    @triton.jit
    def _add_one(x_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)

    x = torch.zeros(1024, device="cuda")
    _add_one[(1,)](x, 1024, BLOCK=1024)
    del x
    torch.cuda.empty_cache()
    record("triton")

    import torch.distributed as dist

    dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                            device_id=torch.device("cuda", 0))
    t = torch.ones(1024, device="cuda")
    dist.all_reduce(t)
    del t
    torch.cuda.empty_cache()
    record("nccl")
    dist.destroy_process_group()

    cuda_total = int(stages[0]["cuda_total"])
    before_weights = int(stages[-1]["device_used_above_baseline"])
    tp1 = int(next(s for s in stages if s["stage"] == "triton")["device_used_above_baseline"])
    result = {
        "gpu": pynvml.nvmlDeviceGetName(handle), "driver": pynvml.nvmlSystemGetDriverVersion(),
        "torch": torch.__version__, "triton": triton.__version__,
        "nvml_total": nvml_total, "cuda_total": cuda_total, "driver_reserved": nvml_total - cuda_total,
        "baseline_device_used": base_used, "stages": stages,
        "held_before_weights_one_gpu": tp1, "held_before_weights_with_nccl": before_weights,
        "allowance_one_gpu": ALLOWANCE_ONE_GPU, "allowance_with_nccl": ALLOWANCE_WITH_NCCL,
        "allowance_covers_one_gpu": tp1 <= ALLOWANCE_ONE_GPU,
        "allowance_covers_with_nccl": before_weights <= ALLOWANCE_WITH_NCCL,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n")
    print(f"NVML total {nvml_total / MiB:,.0f} MiB, CUDA total {cuda_total / MiB:,.0f} MiB "
          f"(driver reserve {(nvml_total - cuda_total) / MiB:,.0f} MiB); held before weights: "
          f"{tp1 / MiB:,.0f} MiB on one GPU, {before_weights / MiB:,.0f} MiB with a one-rank NCCL group; "
          f"the ledger counts {ALLOWANCE_ONE_GPU / MiB:,.0f} / {ALLOWANCE_WITH_NCCL / MiB:,.0f} MiB", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
