"""Benchmark: reduce the seeds' profile-boot volume (34.4M routed selections) to a histogram.

Seeds 000: the count-only profile boot held 34.4M decode-time selections. This writes a
capture of that size for DSv4.1-Flash geometry (40 MoE layers × top-6 of 384 experts,
uint16 ids as vLLM uses above 256 experts) in two forms, and times the streamed reduction
(`expert_residency.formats.histogram_from_captures`, the code behind `recipegen rowmap
reduce/build/eval`):

* raw `[tokens, 40, 6]` `.npy` (memory-mapped, 16 Ki-token chunks)
* vLLM responses as JSON Lines, one `routed_experts` base64 `.npy` per response

Usage:  .venv/bin/python bench/rowmap_reduce.py [--selections 34.4e6] [--repeats 3]
"""

from __future__ import annotations

import argparse
import base64
import io
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from expert_residency.formats import histogram_from_captures

LAYERS, TOP_K, EXPERTS = 40, 6, 384


def write_captures(folder: Path, tokens: int, tokens_per_response: int) -> tuple[Path, Path]:
    rng = np.random.default_rng(0)
    # skewed ids like real routing (exponential rank profile), distinct picks are not needed
    # for a reduction benchmark
    p = np.exp(-4.94 * (np.arange(EXPERTS) / EXPERTS) ** 1.01)
    p /= p.sum()
    ids = rng.choice(EXPERTS, size=(tokens, LAYERS, TOP_K), p=p).astype(np.uint16)
    raw = folder / "capture.npy"
    np.save(raw, ids)
    jsonl = folder / "responses.jsonl"
    with jsonl.open("w") as out:
        for start in range(0, tokens, tokens_per_response):
            buf = io.BytesIO()
            np.save(buf, ids[start:start + tokens_per_response], allow_pickle=False)
            b64 = base64.b64encode(buf.getbuffer()).decode("ascii")
            out.write(json.dumps({"object": "chat.completion",
                                  "choices": [{"index": 0, "routed_experts": b64}]}) + "\n")
    return raw, jsonl


def time_reduce(path: Path, repeats: int) -> tuple[list[float], int]:
    times, selections = [], 0
    for _ in range(repeats):
        start = time.perf_counter()
        h = histogram_from_captures([path], moe_layer_indices=range(LAYERS),
                                    num_experts=EXPERTS)
        times.append(time.perf_counter() - start)
        selections = h.selections
    return times, selections


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--selections", type=float, default=34.4e6)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokens-per-response", type=int, default=2048)
    args = parser.parse_args()
    tokens = int(round(args.selections / (LAYERS * TOP_K)))
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, "
          f"numpy {np.__version__}, python {platform.python_version()}")
    with tempfile.TemporaryDirectory(prefix="rowmap-bench-") as tmp:
        t0 = time.perf_counter()
        raw, jsonl = write_captures(Path(tmp), tokens, args.tokens_per_response)
        print(f"wrote {tokens:,} tokens = {tokens * LAYERS * TOP_K:,} selections "
              f"(raw {raw.stat().st_size / 1e6:.1f} MB, vLLM JSONL {jsonl.stat().st_size / 1e6:.1f}"
              f" MB) in {time.perf_counter() - t0:.1f} s")
        for label, path in (("raw .npy", raw), ("vLLM JSONL (base64 .npy)", jsonl)):
            times, selections = time_reduce(path, args.repeats)
            best, median = min(times), statistics.median(times)
            print(f"{label:<26} {selections:>12,} selections: best {best:.2f} s, median "
                  f"{median:.2f} s over {len(times)} runs ({selections / best / 1e6:.0f}M "
                  f"selections/s)")
        # the whole command a user runs: process start, imports, reduction, atomic write
        recipegen = Path(sys.executable).with_name("recipegen")
        if recipegen.exists():
            start = time.perf_counter()
            subprocess.run([str(recipegen), "rowmap", "reduce", str(raw), "--experts",
                            str(EXPERTS), "--layers", f"0-{LAYERS - 1}", "-o",
                            str(Path(tmp) / "out.hist")], check=True, stdout=subprocess.DEVNULL)
            print(f"{'recipegen rowmap reduce':<26} raw .npy, end to end: "
                  f"{time.perf_counter() - start:.2f} s")


if __name__ == "__main__":
    main()
