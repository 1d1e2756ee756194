#!/usr/bin/env python3
"""A probe, not a path any user runs: how fast could an MXFP4 expert GEMM go on Hopper with FP8
activations and FP8 tensor-core products (what vLLM 0.33's Humming backend does there), against
the HBM read limit measured in the same process?

This probe times DeepSeek-V4.1's two expert GEMMs alone as grouped GEMMs (w13: 2I = 4,608 rows x
H = 5,120; w2: H rows x I = 2,304; 384 experts, top-6, random routing; no SwiGLU, no activation
quantization between them) on the runtime's FP8-activation tiles (``gpu.layout_w4a8``: each E2M1
code becomes an E4M3 byte with its block's scale folded into the exponent, two byte permutes per
word, words in the wgmma A operand's register order; decoded by ``gpu.kernels_w4a8._w4a8_tile``),
activations quantized per token and 128 values to E4M3 with fp32 scales (vLLM's block-FP8 scheme).
The weights are random bytes of that layout (offsets 1..12, a random power-of-two multiplier per
row). The whole layer on these tiles is ``gpu.experts_w4a8`` (``bench/peer_moe.py --w4a8`` times
it beside Humming); this probe isolates the GEMMs, checks them against a hand decode of the same
bytes and reports each launch's read rate beside the HBM read limit measured in the same process
(``gpu_residency.hbm_read_limit``).

    python3 bench/w4a8_probe.py --tokens 6,16,96 --out $OUT      # a CUDA GPU (sm_90)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "runtime"))
sys.path.insert(0, str(ROOT / "bench"))   # gpu_residency: the HBM read limit

from expert_residency.fp8 import per_token_group_quant_fp8  # noqa: E402
from expert_residency.gpu.kernels_w4a8 import _tile_offsets, _w4a8_tile, w4a8_decode_tile  # noqa: E402
from expert_residency.gpu.layout_w4a8 import decode_words, w4a8_tile_index  # noqa: E402
from expert_residency.mxfp4 import e2m1_table  # noqa: E402


@triton.jit
def w4a8_mma_kernel(xq_ptr, xs_ptr, w_src, o_ptr, r_ptr, slot_expert_ptr, slot_start_ptr, sorted_tok_ptr,
                    out_ptr, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                    BK: tl.constexpr, TMA: tl.constexpr = False):
    """``out[p, rows] = r_row * sum_b (W8[rows, b] . xq[tok_p, b]) * xs[tok_p, b]`` on the runtime's
    FP8-activation tiles (``gpu.kernels_w4a8``: words in the wgmma A operand's register order), with
    each row's multiplier ``r`` given apart (the runtime keeps it in the offsets). ``w_src``: the
    weights' pointer, or with ``TMA`` a tensor descriptor over them as 64-byte rows (each tile one
    bulk copy by the Tensor Memory Accelerator; boxes hold at most 256 rows)."""
    ROWS: tl.constexpr = BN * BK // 32
    pid_n = tl.program_id(0)
    slot = tl.program_id(1)
    e = tl.load(slot_expert_ptr + slot)
    start = tl.load(slot_start_ptr + slot)
    end = tl.load(slot_start_ptr + slot + 1)
    out_rows = pid_n * BN + tl.arange(0, BN)
    mm = start + tl.arange(0, BM)
    m_ok = mm < end
    tok = tl.load(sorted_tok_ptr + mm, mask=m_ok, other=0).to(tl.int64)
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    for k0 in range(0, K, BK):
        tile = e * (N // BN) * (K // BK) + pid_n * (K // BK) + k0 // BK
        if TMA:
            packed = tl.reshape(w_src.load([tile * (ROWS // 4), 0]), (ROWS, 16))
            w = w4a8_decode_tile(packed, _tile_offsets(o_ptr, tile.to(tl.int64), BN, BK), BN, BK)
        else:
            w = _w4a8_tile(w_src, o_ptr, tile.to(tl.int64), BN, BK)
        x = tl.load(xq_ptr + tok[None, :] * K + (k0 + tl.arange(0, BK))[:, None], mask=m_ok[None, :])
        xs = tl.load(xs_ptr + tok * (K // 128) + k0 // 128, mask=m_ok, other=0.0)
        acc += tl.dot(w, x) * xs[None, :]
    r = tl.load(r_ptr + e.to(tl.int64) * N + out_rows)
    tl.store(out_ptr + mm[None, :].to(tl.int64) * N + out_rows[:, None], acc * r[:, None], mask=m_ok[None, :])


def weights_mma(packed: torch.Tensor, offs: torch.Tensor, expert: int, bn: int, bk: int) -> torch.Tensor:
    """fp32 ``[N, K]`` E4M3 weight values of one expert (before the row multiplier), decoded by
    hand (``gpu.layout_w4a8``'s word and tile order; no Triton)."""
    n, k = packed.shape[1], packed.shape[2] * 2
    tiles = packed[expert].reshape(n // bn, k // bk, bn * bk // 2).to(torch.int64)
    words = tiles[..., 0::4] | (tiles[..., 1::4] << 8) | (tiles[..., 2::4] << 16) | (tiles[..., 3::4] << 24)
    widx = torch.arange(words.shape[-1], device=packed.device)
    off = offs[expert].reshape(n // bn, k // bk, bn * bk // 32)[..., (widx // 16) * 4 + widx % 4]
    codes = decode_words(words)
    vals = e2m1_table(packed.device)[codes] * torch.exp2(off.float() - 6)[..., None]  # [tn, tk, words, 8]
    row, col = (t.to(packed.device) for t in w4a8_tile_index(bn, bk))
    w = torch.empty(n, k, device=packed.device)
    tn = torch.arange(n // bn, device=packed.device)[:, None, None, None]
    tk = torch.arange(k // bk, device=packed.device)[None, :, None, None]
    w[(tn * bn + row).expand_as(vals), (tk * bk + col).expand_as(vals)] = vals
    return w


def reference(w: torch.Tensor, r: torch.Tensor, xq, xs, expert: int, toks: list[int]) -> torch.Tensor:
    """fp32 out[len(toks), N]: each 128-value block's dot times the token's scale, summed, times the
    row's multiplier (decoded by hand above, no Triton)."""
    x = xq[toks].float()
    n, k = w.shape
    blocks = torch.einsum("nbk,tbk->tnb", w.reshape(n, k // 128, 128), x.reshape(len(toks), k // 128, 128))
    return (blocks * xs[toks][:, None, :]).sum(-1) * r[expert][None, :]


def route(tokens: int, experts: int, top_k: int, gen: torch.Generator, dev):
    ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
    order = torch.argsort(ids.flatten() * tokens + torch.arange(tokens).repeat_interleave(top_k), stable=True)
    sorted_ids = ids.flatten()[order]
    sorted_tok = (torch.arange(tokens).repeat_interleave(top_k))[order]
    uniq, counts = torch.unique_consecutive(sorted_ids, return_counts=True)
    start = torch.cat([torch.zeros(1, dtype=torch.long), torch.cumsum(counts, 0)])
    return (uniq.to(dev, torch.int32), start.to(dev, torch.int32), sorted_tok.to(dev, torch.int32),
            [(int(e), sorted_tok[start[i]:start[i + 1]].tolist()) for i, e in enumerate(uniq)])


def time_gemm(gr, n: int, k: int, bn: int, bm: int, stages: int, weights, draws, xq, xs,
              reps: int, limit: float, tma: bool = False) -> dict:
    """One GEMM's launches over the draws: median µs, read rate, and (first draw, first 4 slots) the
    largest relative L2 against the hand decode. ``tma``: weight tiles by TMA."""
    packed, offs, r = weights
    out = torch.empty(draws[0][2].numel(), n, dtype=torch.float32, device=packed.device)
    if tma:
        from triton.tools.tensor_descriptor import TensorDescriptor
        desc = TensorDescriptor.from_tensor(packed.view(-1, 64), [bn * 128 // 128, 64])

    def launch(d):
        return lambda: w4a8_mma_kernel[(n // bn, d[0].numel())](
            xq, xs, desc if tma else packed, offs, r, d[0], d[1], d[2], out, N=n, K=k, BN=bn, BM=bm, BK=128,
            TMA=tma, num_warps=4, num_stages=stages)

    launch(draws[0])()
    torch.cuda.synchronize()
    errs = []
    for (expert, toks), s0 in list(zip(draws[0][3], draws[0][1].tolist()))[:4]:
        ref = reference(weights_mma(packed, offs, expert, bn, 128), r, xq, xs, expert, toks)
        errs.append(((out[s0:s0 + len(toks)] - ref).norm() / ref.norm()).item())
    secs = []
    for d in draws:
        secs += gr.time_fn(launch(d), reps, warmup=2)
    uniq = sum(d[0].numel() for d in draws) / len(draws)
    nbytes = uniq * n * (k // 2 + k // 32)
    med = sorted(secs)[len(secs) // 2]
    return {"us": med * 1e6, "bytes": nbytes, "GBps": nbytes / med / 1e9,
            "pct_hbm": 100 * nbytes / med / 1e9 / limit, "rel_l2_max": max(errs), "unique_experts": uniq}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tokens", default="6,16,96")
    ap.add_argument("--experts", type=int, default=384)
    ap.add_argument("--top-k", type=int, default=6)
    ap.add_argument("--hidden", type=int, default=5120)
    ap.add_argument("--intermediate", type=int, default=2304)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--tiles", default="64x16;128x16", help="';'-separated BNxBM[xSTAGES][t] (3 stages unless "
                                                               "given; t: weight tiles by TMA)")
    ap.add_argument("--out", default=os.environ.get("OUT", "bench_out"))
    args = ap.parse_args()
    import gpu_residency as gr
    dev = torch.device("cuda")
    e, h, i = args.experts, args.hidden, args.intermediate
    gen = torch.Generator().manual_seed(2027)
    gemms = {"w13": (2 * i, h), "w2": (h, i)}       # (rows N, reduction K)
    weights = {name: (torch.randint(0, 256, (e, n, k // 2), dtype=torch.uint8, device=dev),
                      torch.randint(1, 13, (e, n, k // 32), dtype=torch.uint8, device=dev),
                      torch.exp2(torch.randint(-14, -10, (e, n), device=dev).float()))
               for name, (n, k) in gemms.items()}
    limit = gr.hbm_read_limit()["GBps"]
    print(f"HBM read limit {limit:.0f} GB/s; {torch.cuda.get_device_name(0)}, torch {torch.__version__}, "
          f"triton {triton.__version__}", flush=True)
    results = {"hbm_read_GBps": limit, "geometry": {"hidden": h, "intermediate": i, "experts": e,
                                                    "top_k": args.top_k}, "rows": []}
    for t in (int(v) for v in args.tokens.split(",")):
        draws = [route(t, e, args.top_k, gen, dev) for _ in range(4)]
        # each GEMM's input, quantized as vLLM quantizes it on Hopper (E4M3, one scale per 128 values)
        inputs = {name: per_token_group_quant_fp8(torch.randn(t, k, device=dev), 128)
                  for name, (_, k) in gemms.items()}
        for tile in args.tiles.split(";"):
            tma = tile.endswith("t")
            bn, bm, stages = ([int(v) for v in tile.rstrip("t").split("x")] + [3])[:3]
            row = {"T": t, "tile": tile}
            for name, (n, k) in gemms.items():
                xq, xs = inputs[name]
                row[name] = time_gemm(gr, n, k, bn, bm, stages, weights[name], draws, xq, xs, args.reps, limit, tma)
            both_us = row["w13"]["us"] + row["w2"]["us"]
            both_bytes = row["w13"]["bytes"] + row["w2"]["bytes"]
            row["both"] = {"us": both_us, "pct_hbm": 100 * both_bytes / (both_us * 1e-6) / 1e9 / limit}
            print(json.dumps(row), flush=True)
            results["rows"].append(row)
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / "w4a8_probe.json").write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
