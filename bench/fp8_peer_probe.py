#!/usr/bin/env python3
"""Can the two other FP8 block-scaled MoE backends of vLLM 0.33 come up on this machine?

* **DeepGEMM** as vLLM 0.33.0 ships it (``vllm/third_party/deep_gemm`` of the published wheel:
  Python files, JIT headers and ``_C_extension.abi3.so``, built against torch 2.14): imported as
  a top-level ``deep_gemm`` (the name vLLM's ``utils/deep_gemm.py`` tries first) beside this
  machine's torch; on success it prints ``get_mk_alignment_for_contiguous_layout()``, the M below
  which vLLM's ``TritonOrDeepGemmExperts`` runs the Triton kernel instead.
* **FlashInfer's CUTLASS fused MoE** (``flashinfer-python`` 0.7.2.post1, what vLLM 0.33.0 pins):
  its SM90 module (``jit/fused_moe.py`` ``gen_cutlass_fused_moe_sm90_module``) is compiled from
  the ``--fi-tus`` translation-unit count of sources; this times nvcc on two of them with the
  module's flags and FlashInfer's include order (``jit/cpp_ext.py``): the FP8 block-scale GEMM
  (``fp8_blockscale_gemm.cu``, the DeepSeek path) and one generated SM90 grouped GEMM. The
  projection ``TUs x mean seconds / cores`` is what one cold build costs.

Inputs are files of the published wheels unpacked by the caller (``--deep-gemm`` folder holding
the ``deep_gemm`` package, ``--fi-root`` holding ``flashinfer/data`` and the generated folder;
``--pack`` builds both archives from the two wheels on a machine with nvcc): nothing of them is in
this repository. Writes ``probe.json`` to ``--out``.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time
from pathlib import Path

FI_FLAGS = [  # jit/core.py sm90a_nvcc_flags + jit/fused_moe.py gen_cutlass_fused_moe_sm90_module
    "-std=c++17", "-gencode=arch=compute_90a,code=sm_90a", "-DCUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED",
    "-DFLASHINFER_ENABLE_FP8_E8M0", "-DFLASHINFER_ENABLE_FP4_E2M1", "-DCOMPILE_HOPPER_TMA_GEMMS",
    "-DCOMPILE_HOPPER_TMA_GROUPED_GEMMS", "-DENABLE_BF16", "-DENABLE_FP8", "-DENABLE_FP8_BLOCK_SCALE",
    "-DENABLE_FP4", "-DUSING_OSS_CUTLASS_MOE_GEMM", "-DCUTLASS_ENABLE_GDC_FOR_SM90=1",
    "-DCUTLASS_MIXED_GEMM_FP4_FP8_PREPROCESSED_SIGNS=1",
    # jit/core.py gen_jit_spec + jit/cpp_ext.py build_cuda_cflags
    "-use_fast_math", "-Xfatbin=-compress-all", "--compress-mode=size", "-DFLASHINFER_ENABLE_F16",
    "-DFLASHINFER_ENABLE_BF16", "-DFLASHINFER_ENABLE_FP8_E4M3", "-DFLASHINFER_ENABLE_FP8_E5M2",
    "--compiler-options=-fPIC", "--expt-relaxed-constexpr", "-static-global-template-stub=false",
]


def probe_deep_gemm(folder: Path) -> dict:
    sys.path.insert(0, str(folder))
    t0 = time.perf_counter()
    try:
        import deep_gemm
        import torch
        out = {"import": "ok", "seconds": round(time.perf_counter() - t0, 1), "torch": torch.__version__}
        try:
            out["mk_alignment"] = int(deep_gemm.get_mk_alignment_for_contiguous_layout())
        except Exception as exc:  # noqa: BLE001 - reported
            out["mk_alignment_error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
        return out
    except Exception as exc:  # noqa: BLE001 - the point of the probe
        return {"import": "failed", "error": f"{type(exc).__name__}: {str(exc)[:800]}",
                "seconds": round(time.perf_counter() - t0, 1)}


def fi_includes(data: Path, gen: Path) -> list[str]:
    csrc = data / "csrc"
    extra = [csrc / "nv_internal", csrc / "nv_internal" / "include",
             csrc / "nv_internal/tensorrt_llm/cutlass_extensions/include",
             csrc / "nv_internal/tensorrt_llm/kernels/cutlass_kernels/include",
             csrc / "nv_internal/tensorrt_llm/kernels/cutlass_kernels", gen]
    cccl = [data / "cccl/cub", data / "cccl/libcudacxx/include", data / "cccl/thrust"]
    cuda_inc = sorted({str(Path(p).parent) for pat in ("/usr/local/cuda*/include/cublasLt.h",
                                                        "/usr/local/cuda*/targets/*/include/cublasLt.h")
                       for p in glob.glob(pat)})
    try:   # CUDA library headers from the pip packages when the toolkit lacks them
        import nvidia
        for base in nvidia.__path__:
            cuda_inc += sorted({str(Path(p).parent) for p in glob.glob(f"{base}/**/include/cublasLt.h",
                                                                        recursive=True)})
            cuda_inc += sorted({str(Path(p).parent) for p in glob.glob(f"{base}/**/include/curand_kernel.h",
                                                                        recursive=True)})
    except ImportError:
        pass
    system = [data / "include", csrc, data / "cutlass/include", data / "cutlass/tools/util/include",
              data / "spdlog/include"]
    return ([f"-I{p}" for p in extra] + [f"-I{p}" for p in cccl] + [f"-I{p}" for p in cuda_inc]
            + [a for p in system for a in ("-isystem", str(p))])


def probe_flashinfer(root: Path, tus: int, cores: int, limit: int) -> dict:
    data, gen = root / "flashinfer" / "data", root / "generated"
    sources = {"fp8_blockscale_gemm.cu": data / "csrc/nv_internal/tensorrt_llm/kernels/cutlass_kernels/"
                                                "fp8_blockscale_gemm/fp8_blockscale_gemm.cu"}
    grouped = sorted(gen.glob("gemm_grouped/90/*M128_group0.generated.cu"))
    if grouped:
        sources[grouped[0].name] = grouped[0]
    nvcc = os.environ.get("NVCC", "nvcc")
    ver = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=False).stdout.strip().splitlines()
    out = {"nvcc": ver[-1] if ver else "missing", "tus_in_module": tus, "cores": cores, "compiles": {}}
    procs = {}
    for name, src in sources.items():
        cmd = ["nice", "-n", "10", nvcc, *FI_FLAGS, *fi_includes(data, gen), "-c", str(src),
               "-o", f"/tmp/fi_{name}.o"]
        procs[name] = (subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True),
                       time.perf_counter())
    for name, (proc, t0) in procs.items():
        try:
            log, _ = proc.communicate(timeout=max(1, limit - (time.perf_counter() - t0)))
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            proc.kill()
            log, rc = proc.communicate()[0], "timeout"
        entry = {"rc": rc, "seconds": round(time.perf_counter() - t0, 1)}
        if rc != 0:
            entry["log_tail"] = (log or "")[-1500:]
        out["compiles"][name] = entry
    done = [e["seconds"] for e in out["compiles"].values() if e["rc"] == 0]
    if done:
        mean = sum(done) / len(done)
        out["projected_module_seconds"] = round(tus * mean / cores)
    return out


def pack(fi_wheel: Path, vllm_wheel: Path, dest: Path) -> None:
    """Build the two archives this probe reads from the published wheels (here, with an nvcc):
    ``fi_probe.tar.xz`` — FlashInfer's generated SM90 kernels (its own ``generate_gemm_operations``,
    ``"90;90-real"``, as ``gen_cutlass_fused_moe_module`` calls it), one generated grouped-GEMM file
    and every FlashInfer header the two probed units include (``nvcc -M``; CUDA's own headers
    excluded, empty stand-ins for the CUDA library headers this machine may lack);
    ``dg_vendored.tar.xz`` — the vLLM wheel's ``vllm/third_party/deep_gemm`` as ``deep_gemm``."""
    import importlib
    import shutil
    import tarfile
    import tempfile
    import types
    import zipfile

    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        with zipfile.ZipFile(fi_wheel) as zf:
            zf.extractall(tmp / "fi", [n for n in zf.namelist() if n.startswith("flashinfer/")])
        root = tmp / "fi" / "flashinfer"
        for name, path in (("flashinfer", root), ("flashinfer.jit", root / "jit"),
                           ("flashinfer.jit.gemm", root / "jit/gemm"),
                           ("flashinfer.jit.gemm.cutlass", root / "jit/gemm/cutlass")):
            mod = types.ModuleType(name)   # the generator alone, without FlashInfer's package init
            mod.__path__ = [str(path)]
            sys.modules[name] = mod
        gen_mod = importlib.import_module("flashinfer.jit.gemm.cutlass.generate_kernels")
        gen = tmp / "generated"
        gen_mod.generate_gemm_operations(gen, "90;90-real")
        print("generated units", len(list(gen.rglob("*.generated.cu"))), flush=True)
        data = root / "data"
        fake = tmp / "fake"
        fake.mkdir()
        for h in ("cublasLt.h", "cublas_v2.h", "curand_kernel.h", "curand.h", "nvrtc.h"):
            if not glob.glob(f"/usr/local/cuda*/include/{h}"):
                (fake / h).touch()
        grouped = min(gen.glob("gemm_grouped/90/*M128_group0.generated.cu"))
        units = [data / "csrc/nv_internal/tensorrt_llm/kernels/cutlass_kernels/fp8_blockscale_gemm/"
                        "fp8_blockscale_gemm.cu", grouped]
        files: set[Path] = set()
        for unit in units:
            dep = tmp / "dep.d"
            subprocess.run(["nvcc", *FI_FLAGS, *fi_includes(data, gen), f"-I{fake}", "-M", str(unit),
                            "-o", str(dep)], check=True)
            for word in dep.read_text().replace("\\\n", " ").split():
                path = Path(word).resolve() if not word.endswith(":") else None
                if path and path.is_file() and str(path).startswith(str(data.resolve())):
                    files.add(path)
        with tarfile.open(dest / "fi_probe.tar.xz", "w:xz") as tar:
            for f in sorted(files):
                tar.add(f, arcname=str(Path("flashinfer/data") / f.relative_to(data.resolve())))
            tar.add(grouped, arcname=str(Path("generated") / grouped.relative_to(gen)))
        print("fi_probe.tar.xz", len(files), "files", flush=True)
        with zipfile.ZipFile(vllm_wheel) as zf:
            zf.extractall(tmp / "v", [n for n in zf.namelist() if n.startswith("vllm/third_party/deep_gemm/")])
        shutil.move(str(tmp / "v/vllm/third_party/deep_gemm"), str(tmp / "deep_gemm"))
        with tarfile.open(dest / "dg_vendored.tar.xz", "w:xz") as tar:
            tar.add(tmp / "deep_gemm", arcname="deep_gemm")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--deep-gemm", type=Path, help="folder holding the wheel's deep_gemm package")
    ap.add_argument("--fi-root", type=Path, help="folder holding flashinfer/data and generated/")
    ap.add_argument("--fi-tus", type=int, default=0, help="translation units of the SM90 module")
    ap.add_argument("--limit", type=int, default=240, help="seconds for the nvcc probes")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--pack", nargs=2, type=Path, metavar=("FLASHINFER_WHEEL", "VLLM_WHEEL"),
                    help="build fi_probe.tar.xz and dg_vendored.tar.xz into --out from the two wheels")
    args = ap.parse_args()
    if args.pack:
        pack(args.pack[0], args.pack[1], Path(args.out))
        return 0
    res = {"cores": os.cpu_count()}
    if args.deep_gemm:
        res["deep_gemm"] = probe_deep_gemm(args.deep_gemm)
        print("deep_gemm", json.dumps(res["deep_gemm"]), flush=True)
    if args.fi_root:
        res["flashinfer_cutlass_sm90"] = probe_flashinfer(args.fi_root, args.fi_tus, os.cpu_count() or 1,
                                                          args.limit)
        print("flashinfer", json.dumps(res["flashinfer_cutlass_sm90"])[:3000], flush=True)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "probe.json").write_text(json.dumps(res, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
