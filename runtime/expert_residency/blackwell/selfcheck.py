"""Split == unsplit on this box, with the bank kernel this box would run.

    python -m expert_residency.blackwell.selfcheck            # on an SM100 GPU (GB300, B200, ...)
    python -m expert_residency.blackwell.selfcheck --emulate  # anywhere: CPU model of the kernel

On a GPU it builds one random MXFP4 layer of DeepSeek-V4.1-Flash's geometry (384 experts, hidden
5120, intermediate 2304, top-6; change with flags), converts it with vLLM 0.33's own TRT-LLM
conversion, re-homes it into a hot bank in HBM (295 rows, the reference row map's count) and a
cold bank in pinned host memory read in place, and for each token count compares

* split (two ``do_finalize=False`` launches + the runtime's finalize) against
* unsplit (all experts in one bank, one launch + the same finalize),

bit for bit (``torch.equal``), both through ``TrtllmMxfp4Banks.forward`` and through the core's
per-pick contract. It also prints how far FlashInfer's own finalized output (``do_finalize=True``,
the stock lane's arithmetic) is from ours — information, not a pass criterion — and, with
``--timing``, CUDA-event medians of stock / unsplit / split. Exit 0 when every comparison is
equal, 1 when one is not, 2 when this box cannot run the check.

Next step on a passing box is the serving-level knee (README, "Planning and acceptance"):
``recipegen knee http://HOST:PORT --compare http://HOST:CONTROL_PORT``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from typing import Any

import torch

from ..core.banks import build_unsplit_layer, device_allocator, rehome_layer
from ..core.devmap import lookup_routed
from ..core.split import residency_forward
from .select import FLASHINFER_TRTLLM, bank_kernel_from_env
from .trtllm import TrtllmMxfp4Banks

EMULATED_GEOMETRY = dict(experts=12, hidden=256, intermediate=128, top_k=4, hot=7, tokens="1,5,9")


def random_checkpoint(experts: int, hidden: int, inter: int, device: torch.device,
                      generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random packed E2M1 bytes and ue8m0 scales near 2**-6 (checkpoint layout), drawn on
    ``device`` with ``generator`` (a generator of that device; quantizing float weights of the
    reference size would take minutes and tens of GiB)."""
    def u8(*shape: int, low: int = 0, high: int = 256) -> torch.Tensor:
        return torch.randint(low, high, shape, generator=generator, dtype=torch.uint8, device=device)

    return {"w13_weight": u8(experts, 2 * inter, hidden // 2),
            "w13_weight_scale": u8(experts, 2 * inter, hidden // 32, low=118, high=124),
            "w2_weight": u8(experts, hidden, inter // 2),
            "w2_weight_scale": u8(experts, hidden, inter // 32, low=118, high=124)}


def cold_pick_count(row_codes: torch.Tensor, topk_ids: torch.Tensor) -> int:
    """How many picks of ``topk_ids [T, K]`` the cold bank computes (a report field; syncs). Ids
    outside ``0..E-1`` (vLLM's -1) are nobody's pick: never ``row_codes[-1]``, no IndexError."""
    code, valid = lookup_routed(row_codes, topk_ids)
    return int((valid & (code < 0)).sum())


def _routing(tokens: int, experts: int, top_k: int, hidden: int, device: torch.device,
             generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    scores = torch.rand(tokens, experts, generator=generator).to(device)
    weights, ids = torch.topk(torch.softmax(scores, dim=-1), top_k, dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    x = torch.randn(tokens, hidden, generator=generator).to(device=device, dtype=torch.bfloat16)
    return x, weights.float().contiguous(), ids.to(torch.int32).contiguous()


def _median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m expert_residency.blackwell.selfcheck",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--emulate", action="store_true",
                   help="CPU: FlashInfer replaced by blackwell.emulation (small geometry by default)")
    p.add_argument("--experts", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--intermediate", type=int)
    p.add_argument("--top-k", type=int)
    p.add_argument("--hot", type=int, help="rows in the hot bank (the rest go cold)")
    p.add_argument("--tokens", help="comma-separated token counts (default 1,2,4,8,16,64,256,1024)")
    p.add_argument("--activation", choices=("mxfp8", "bf16"), default="mxfp8",
                   help="activation format (vLLM's FLASHINFER_TRTLLM_MXFP4_MXFP8 or _BF16)")
    p.add_argument("--swiglu-limit", type=float, default=None,
                   help="the layers' SwiGLU clamp (DeepSeek-V4.1 configs set one)")
    p.add_argument("--cold-in-hbm", action="store_true",
                   help="cold bank in device memory instead of pinned host memory")
    p.add_argument("--autotune", action="store_true",
                   help="run FlashInfer's autotuner on each shape first (slow: minutes per shape); "
                        "compares under tuned tactics, where a split-K pick for one bank's shape "
                        "would break bit-identity (docs/blackwell.md)")
    p.add_argument("--timing", action="store_true", help="CUDA-event medians (not a pass criterion)")
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the results here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    emulate = args.emulate
    defaults = EMULATED_GEOMETRY if emulate else dict(experts=384, hidden=5120, intermediate=2304,
                                                      top_k=6, hot=295, tokens="1,2,4,8,16,64,256,1024")
    experts = args.experts or defaults["experts"]
    hidden, inter = args.hidden or defaults["hidden"], args.intermediate or defaults["intermediate"]
    top_k, hot = args.top_k or defaults["top_k"], args.hot if args.hot is not None else defaults["hot"]
    token_counts = [int(t) for t in (args.tokens or defaults["tokens"]).split(",")]
    if not 0 < hot < experts:
        print(f"selfcheck: --hot {hot} must leave both banks non-empty (0 < hot < {experts})")
        return 2

    if emulate:
        from .emulation import emulated_routed_moe
        from .layout import to_trtllm_layout

        device = torch.device("cpu")
        choice = bank_kernel_from_env(None, {})
        kernel = TrtllmMxfp4Banks(hidden, inter, experts, top_k, activation="bf16",
                                  swiglu_limit=args.swiglu_limit, routed_moe=emulated_routed_moe,
                                  convert=to_trtllm_layout)
        kernel_name = "emulated " + kernel.name
    else:
        if not torch.cuda.is_available():
            print("selfcheck: no CUDA device (use --emulate for the CPU dry run)")
            return 2
        device = torch.device("cuda")
        try:
            choice = bank_kernel_from_env(torch.cuda.get_device_capability(device))
        except ValueError as exc:
            print(f"selfcheck: {exc}")
            return 2
        if choice.kernel != FLASHINFER_TRTLLM:
            print(f"selfcheck: this device runs the '{choice.kernel}' bank kernel ({choice.reason});"
                  " the FlashInfer TRT-LLM check needs the SM100 family")
            return 2
        kernel = TrtllmMxfp4Banks(hidden, inter, experts, top_k, activation=args.activation,
                                  swiglu_limit=args.swiglu_limit, device=device)
        kernel_name = kernel.name
    print(f"selfcheck: device {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}, "
          f"selection {choice.report_fields()}")
    print(f"selfcheck: kernel {kernel_name}; layer {experts} experts, hidden {hidden}, "
          f"intermediate {inter}, top-{top_k}; banks {hot} hot / {experts - hot} cold"
          f"{' (cold bank in device memory)' if args.cold_in_hbm or emulate else ' (cold bank in pinned host memory)'}")

    gen = torch.Generator().manual_seed(args.seed)
    weight_gen = torch.Generator(device=device).manual_seed(args.seed)
    converted = random_checkpoint(experts, hidden, inter, device, weight_gen)
    kernel.to_kernel_layout(converted)
    unsplit = build_unsplit_layer({k: v.clone() for k, v in converted.items()}, layer_index=0)
    hot_ids = torch.randperm(experts, generator=gen)[:hot].sort().values.tolist()
    hot_set = set(hot_ids)
    cold_ids = [e for e in range(experts) if e not in hot_set]
    if device.type == "cuda" and not args.cold_in_hbm:
        from ..gpu.pinned import pinned_view_allocator

        cold_alloc = pinned_view_allocator(device)
    else:
        cold_alloc = device_allocator(device)
    split = rehome_layer(converted, hot_ids, cold_ids, layer_index=0,
                         hot_alloc=device_allocator(device), cold_alloc=cold_alloc)

    results: list[dict[str, Any]] = []
    ok = True
    for tokens in token_counts:
        x, weights, ids = _routing(tokens, experts, top_k, hidden, device, gen)
        if args.autotune and not emulate:
            from flashinfer.autotuner import autotune

            with autotune(True):
                kernel.forward(unsplit, x, weights, ids)
                kernel.forward(split, x, weights, ids)
        y_unsplit = kernel.forward(unsplit, x, weights, ids)
        y_split = kernel.forward(split, x, weights, ids)
        y_core = residency_forward(split, x, weights, ids, kernel.per_pick_fn())
        row: dict[str, Any] = {
            "tokens": tokens,
            "split_equal": bool(torch.equal(y_split, y_unsplit)),
            "per_pick_equal": bool(torch.equal(y_core, y_unsplit)),
            "cold_picks": cold_pick_count(split.row_codes, ids),
        }
        if not emulate:
            stock = _stock(kernel, unsplit, x, weights, ids)
            row["stock_max_abs_diff"] = float((stock.float() - y_unsplit.float()).abs().max())
            row["stock_equal"] = bool(torch.equal(stock, y_unsplit))
            if args.timing:
                row["ms_stock"] = _median_ms(lambda: _stock(kernel, unsplit, x, weights, ids), args.reps)
                row["ms_unsplit"] = _median_ms(lambda: kernel.forward(unsplit, x, weights, ids), args.reps)
                row["ms_split"] = _median_ms(lambda: kernel.forward(split, x, weights, ids), args.reps)
        ok &= row["split_equal"] and row["per_pick_equal"]
        results.append(row)
        print("selfcheck: " + json.dumps(row, sort_keys=True))
    print(f"selfcheck: {'PASS' if ok else 'FAIL'}: split {'==' if ok else '!='} unsplit bit for bit "
          f"at {len(token_counts)} token counts")
    if ok and not emulate:
        print("selfcheck: next, the serving-level knee against the stock lane: "
              "recipegen knee http://HOST:PORT --compare http://HOST:CONTROL_PORT --json knee.json")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"selection": choice.report_fields(), "kernel": kernel_name, "ok": ok,
                       "geometry": dict(experts=experts, hidden=hidden, intermediate=inter,
                                        top_k=top_k, hot=hot), "results": results}, fh, indent=1)
    return 0 if ok else 1


def _stock(kernel: TrtllmMxfp4Banks, layer, x, weights, ids) -> torch.Tensor:
    """FlashInfer's own finalize over the unsplit layer (``do_finalize=True``), as a stock lane."""
    from flashinfer import trtllm_fp4_block_scale_routed_moe

    x_quant, x_scale = kernel.prepare(x)
    bank = layer.hot
    out = torch.empty(x.shape[0], kernel.hidden, dtype=torch.bfloat16, device=x.device)
    trtllm_fp4_block_scale_routed_moe(
        topk_ids=(ids, weights), routing_bias=None, hidden_states=x_quant,
        hidden_states_scale=x_scale, gemm1_weights=bank["w13_weight"],
        gemm1_weights_scale=bank["w13_weight_scale"], gemm1_bias=None, gemm1_alpha=None,
        gemm1_beta=None, gemm1_clamp_limit=kernel._clamp_limit(bank.num_rows, x.device),
        gemm2_weights=bank["w2_weight"], gemm2_weights_scale=bank["w2_weight_scale"],
        gemm2_bias=None, output1_scale_scalar=None, output1_scale_gate_scalar=None,
        output2_scale_scalar=None, num_experts=kernel.num_experts, top_k=ids.shape[1],
        n_group=None, topk_group=None, intermediate_size=kernel.intermediate,
        local_expert_offset=0, local_num_experts=bank.num_rows, routed_scaling_factor=None,
        routing_method_type=1, do_finalize=True, enable_pdl=True, activation_type=3, output=out,
        tune_max_num_tokens=kernel.tune_max_num_tokens)
    return out


if __name__ == "__main__":
    sys.exit(main())
