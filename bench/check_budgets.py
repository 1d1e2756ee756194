"""Time `recipegen check budgets` on every shipped recipe: whole process and in-process parts.

Usage: .venv/bin/python bench/check_budgets.py [--repeats N]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    exe = Path(sys.executable).parent / "recipegen"
    recipes = sorted((REPO / "recipes").glob("*.yaml"))

    whole = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        proc = subprocess.run([str(exe), "check", "budgets"], cwd=REPO, capture_output=True)
        whole.append(time.perf_counter() - start)
        assert proc.returncode == 0, proc.stderr.decode()

    start = time.perf_counter()
    from recipegen.ledger import compute_ledger
    from recipegen.load.recipe import load_recipe
    imports = time.perf_counter() - start
    loads, ledgers = [], []
    for _ in range(args.repeats):
        t0 = time.perf_counter()
        loaded = [load_recipe(p) for p in recipes]
        t1 = time.perf_counter()
        for item in loaded:
            compute_ledger(item)
        ledgers.append(time.perf_counter() - t1)
        loads.append(t1 - t0)

    print(f"{len(recipes)} recipes, {args.repeats} repeats")
    print(f"whole process `recipegen check budgets`: best {min(whole):.3f} s, median {statistics.median(whole):.3f} s")
    print(f"imports (first, in-process): {imports:.3f} s")
    print(f"load + validate (YAML, schema, row maps): best {min(loads) * 1e3:.1f} ms, median {statistics.median(loads) * 1e3:.1f} ms")
    print(f"compute_ledger: best {min(ledgers) * 1e3:.2f} ms, median {statistics.median(ledgers) * 1e3:.2f} ms")


if __name__ == "__main__":
    main()
