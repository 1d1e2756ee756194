#!/usr/bin/env python3
"""A probe, not a path any user runs: how fast could an MXFP4 expert GEMM go on Hopper with FP8
activations and FP8 tensor-core products (what vLLM 0.33's Humming backend does there), against
the HBM read limit measured in the same process?

Our layers keep bf16 activations and decode E2M1 to bf16 (BENCHMARKS.md: the layer at 75-78% of the
HBM read at T = 16 / 96, Humming's GEMMs 90-94%). This probe times DeepSeek-V4.1's two expert
GEMMs as grouped GEMMs (w13: 2I = 4,608 rows x H = 5,120; w2: H rows x I = 2,304; 384 experts,
top-6, random routing; no SwiGLU, no activation quantization between them) in which each E2M1 code
becomes an E4M3 byte with its block's scale folded into the exponent, by two byte permutes on an 8-entry
table per word (the trick Humming 0.1.19 uses, written here for this probe's own bit placement):

* a 32-bit word holds 8 codes of one row in one 32-value block: code m = 2d + c is value
  16c + 4q + d of the block (q: the thread's lane in its group of four, d: a byte of an FP8 A
  register). Code 2i: magnitude (3 bits) at nibble i, sign at bit 8i+7; code 2i+1: magnitude at
  nibble 4+i, sign at bit 8i+3. Then
  ``prmt(table, mag & 0x7777)`` gives the even codes' E4M3 magnitudes, ``prmt(table, mag >> 16)``
  the odd ones', and the signs drop into bit 7 of each byte with one mask (and one shift);
* the table for a 32-value block with exponent offset ``off`` (1..12) holds E4M3 bytes of
  ``v * 2^(off-6)`` for the 8 magnitudes v = 0, .5, 1, 1.5, 2, 3, 4, 6 (entry 0 stays zero, 0.5
  becomes the normal 2^(off-7)), so a block with ue8m0 scale s takes ``off = s - base + 1`` and the
  row's ``2^(base-122)`` multiplies its fp32 sum once: exact while a row's block scales span at
  most 11 powers of two (the range Humming also allows; it re-rounds blocks below it);
* activations quantized per token and 128 values to E4M3 (fp32 scales), each 128-value block's
  FP8 dot scaled and added in fp32 (vLLM's block-FP8 scheme).

Tiles are stored in the A operand's register order, as the runtime's bf16 MMA-order layout is for
bf16 (``gpu.layout``), so no byte moves between the decode and the tensor cores; the probe checks
its outputs against a hand decode of the same bytes and reports each launch's read rate beside the
HBM read limit measured in the same process (``gpu_residency.hbm_read_limit``).

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

# One asm instance: $2 = 4 bytes (one word, 8 codes), $3 = the word's block offset in all 4 bytes;
# $0 / $1 = the even / odd codes as 4 E4M3 bytes each.
_W4A8_WORD_PTX = tl.constexpr("""
{
.reg .b32 m, t, lo, hi, r;
and.b32 m, $2, 0x77777777;
shl.b32 t, $3, 3;
add.u32 hi, t, 0x1C181410;
and.b32 t, t, 0xFFFFFF00;
add.u32 lo, t, 0x0C080000;
prmt.b32 r, lo, hi, m;
and.b32 t, $2, 0x80808080;
or.b32 $0, t, r;
shr.u32 m, m, 16;
prmt.b32 r, lo, hi, m;
shl.b32 t, $2, 4;
and.b32 t, t, 0x80808080;
or.b32 $1, t, r;
}
""")


@triton.jit
def w4a8_mma_kernel(xq_ptr, xs_ptr, w_ptr, o_ptr, r_ptr, slot_expert_ptr, slot_start_ptr, sorted_tok_ptr,
                    out_ptr, N: tl.constexpr, K: tl.constexpr, BN: tl.constexpr, BM: tl.constexpr,
                    BK: tl.constexpr):
    """``out[p, rows] = 2^(base_row-122) * sum_b (W8[rows, b] . xq[tok_p, b]) * xs[tok_p, b]`` on tiles
    stored in the FP8 A operand's register order (``mma_tile_index``): each thread loads its own
    words 16 bytes at a time, and each word's two outputs are two of the wgmma A fragment's
    registers (row g or g+8; k 4q..4q+3 and 16+4q..16+4q+3 of one 32-value block), so the reshapes
    below only rename registers (no layout conversion in the compiled kernel)."""
    R: tl.constexpr = BN // 64
    ROWS: tl.constexpr = BN * BK // 32
    pid_n = tl.program_id(0)
    slot = tl.program_id(1)
    e = tl.load(slot_expert_ptr + slot).to(tl.int64)
    start = tl.load(slot_start_ptr + slot)
    end = tl.load(slot_start_ptr + slot + 1)
    out_rows = pid_n * BN + tl.arange(0, BN)
    mm = start + tl.arange(0, BM)
    m_ok = mm < end
    tok = tl.load(sorted_tok_ptr + mm, mask=m_ok, other=0).to(tl.int64)
    rows = tl.arange(0, ROWS)
    acc = tl.zeros((BN, BM), dtype=tl.float32)
    for k0 in range(0, K, BK):
        tile = e * (N // BN) * (K // BK) + pid_n * (K // BK) + k0 // BK
        packed = tl.load(w_ptr + tile * (BN * BK // 2) + rows[:, None] * 16 + tl.arange(0, 16)[None, :])
        offs = tl.load(o_ptr + tile * (BN * BK // 32) + (rows // 4)[:, None] * 4 + tl.arange(0, 4)[None, :])
        offs = tl.reshape(tl.broadcast_to(offs[:, :, None], (ROWS, 4, 4)), (ROWS, 16))
        even, odd = tl.inline_asm_elementwise(_W4A8_WORD_PTX, "=r,=r,r,r", [packed, offs],
                                              dtype=(tl.float8e4nv, tl.float8e4nv), is_pure=True, pack=4)
        # [rm, kk_hi, w, g, q | kk_lo, h, d | c] -> rows (rm, w, h, g) x k (kk_hi, kk_lo, c, q, d)
        w = tl.reshape(tl.join(even, odd), (R, 2, 4, 8, 4, 2, 2, 4, 2))
        w = tl.reshape(tl.permute(w, (0, 2, 6, 3, 1, 5, 8, 4, 7)), (BN, BK))
        x = tl.load(xq_ptr + tok[None, :] * K + (k0 + tl.arange(0, BK))[:, None], mask=m_ok[None, :])
        xs = tl.load(xs_ptr + tok * (K // 128) + k0 // 128, mask=m_ok, other=0.0)
        acc += tl.dot(w, x) * xs[None, :]
    r = tl.load(r_ptr + e * N + out_rows)
    tl.store(out_ptr + mm[None, :].to(tl.int64) * N + out_rows[:, None], acc * r[:, None], mask=m_ok[None, :])


def mma_tile_index(bn: int, bk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Where ``w4a8_mma_kernel`` finds each code of a ``bn x bk`` tile: (row, k) of byte-slot
    ``(word index, code m)`` as two int64 tensors ``[bn*bk/8, 8]``; words in storage order
    ``(rm, kk_hi, w, g, q, kk_lo, h)``, code m = 2d + c of the word at row 64rm + 16w + 8h + g,
    k = 32(2kk_hi + kk_lo) + 16c + 4q + d. And the offsets' storage order is ``(rm, kk_hi, w, g, kk_lo,
    h)``: the same words without q."""
    idx = torch.arange(bn * bk // 8)
    h, idx = idx % 2, idx // 2
    kk_lo, idx = idx % 2, idx // 2
    q, idx = idx % 4, idx // 4
    g, idx = idx % 8, idx // 8
    w, idx = idx % 4, idx // 4
    kk_hi, rm = idx % 2, idx // 2
    m = torch.arange(8)
    d, c = m // 2, m % 2
    row = (64 * rm + 16 * w + 8 * h + g)[:, None].expand(-1, 8)
    k = (32 * (2 * kk_hi + kk_lo) + 4 * q)[:, None] + (16 * c + d)[None, :]
    return row, k


E2M1 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


def word_codes(words: torch.Tensor) -> torch.Tensor:
    """int64 words [..., W] in this probe's bit placement -> signed E2M1 values [..., 8W] in k order."""
    mags = torch.tensor(E2M1, dtype=torch.float32, device=words.device)
    out = []
    for m in range(8):
        i = m // 2
        if m % 2 == 0:
            mag, sign = (words >> (4 * i)) & 7, (words >> (8 * i + 7)) & 1
        else:
            mag, sign = (words >> (16 + 4 * i)) & 7, (words >> (8 * i + 3)) & 1
        out.append(torch.where(sign == 1, -mags[mag], mags[mag]))
    return torch.stack(out, dim=-1).reshape(*words.shape[:-1], -1)


def weights_mma(packed: torch.Tensor, offs: torch.Tensor, expert: int, bn: int, bk: int) -> torch.Tensor:
    """fp32 ``[N, K]`` E4M3 weight values of one expert in ``w4a8_mma_kernel``'s tile-major,
    register-order storage (``mma_tile_index``), decoded by hand (no Triton)."""
    n, k = packed.shape[1], packed.shape[2] * 2
    tiles = packed[expert].reshape(n // bn, k // bk, bn * bk // 2).to(torch.int64)
    words = tiles[..., 0::4] | (tiles[..., 1::4] << 8) | (tiles[..., 2::4] << 16) | (tiles[..., 3::4] << 24)
    widx = torch.arange(words.shape[-1], device=packed.device)
    off = offs[expert].reshape(n // bn, k // bk, bn * bk // 32)[..., (widx // 16) * 4 + widx % 4]
    vals = word_codes(words).reshape(*words.shape, 8) * torch.exp2(off.float() - 6)[..., None]  # [tn, tk, words, 8]
    row, col = (t.to(packed.device) for t in mma_tile_index(bn, bk))
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
              reps: int, limit: float) -> dict:
    """One GEMM's launches over the draws: median µs, read rate, and (first draw, first 4 slots) the
    largest relative L2 against the hand decode."""
    packed, offs, r = weights
    out = torch.empty(draws[0][2].numel(), n, dtype=torch.float32, device=packed.device)

    def launch(d):
        return lambda: w4a8_mma_kernel[(n // bn, d[0].numel())](
            xq, xs, packed, offs, r, d[0], d[1], d[2], out, N=n, K=k, BN=bn, BM=bm, BK=128,
            num_warps=4, num_stages=stages)

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
    ap.add_argument("--tiles", default="64x16;128x16", help="';'-separated BNxBM[xSTAGES] (3 stages unless given)")
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
            bn, bm, stages = ([int(v) for v in tile.split("x")] + [3])[:3]
            row = {"T": t, "tile": tile}
            for name, (n, k) in gemms.items():
                xq, xs = inputs[name]
                row[name] = time_gemm(gr, n, k, bn, bm, stages, weights[name], draws, xq, xs, args.reps, limit)
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
