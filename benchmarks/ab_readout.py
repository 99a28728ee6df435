"""A/B of the exact core's single-query readout on two source trees, alternating runs.

Each run is its own process on one tree's ``src`` (:mod:`ab_trees`): for each n in
``--sizes`` it builds a memory of the redundant stream (d = 64, C = 0.01, rbf
gamma = 1/(10·d)), then times ``--queries`` single-query ``readout`` calls and
``decision_function`` calls (medians, µs). Reported: each run's medians and, per n,
the ratio B / A of the medians of each pair (on a shared machine only ratios within a
pair mean anything).

Usage (the tree before a change checked out with ``git worktree add ../base REV``)::

    python benchmarks/ab_readout.py --a ../base --b . --pairs 3 --json results/ab_readout.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_trees import median_ratios, run_pairs, tree_fields  # noqa: E402
from bench_records import add_conditions, write_record  # noqa: E402


def worker(sizes: list[int], queries: int) -> dict:
    """Median µs of one readout and one decision_function call at each size."""
    import numpy as np
    from threadpoolctl import threadpool_limits

    from streams import redundant_stream
    from svattn.exact import SVDDMemory

    out = {}
    with threadpool_limits(1):
        for n in sizes:
            X = redundant_stream(n + queries, 64, n_clusters=20, outlier_rate=0.02, seed=0)
            mem = SVDDMemory(0.01, gamma=1.0 / 640)
            mem.extend(X[:n])
            mem.readout(X[n])  # warm
            mem.decision_function(X[n])
            times = {"readout_us": [], "decision_us": []}
            for q in X[n:]:
                t = time.perf_counter()
                mem.readout(q)
                times["readout_us"].append(time.perf_counter() - t)
                t = time.perf_counter()
                mem.decision_function(q)
                times["decision_us"].append(time.perf_counter() - t)
            out[str(n)] = {k: 1e6 * float(np.median(v)) for k, v in times.items()}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--a", type=Path, help="the tree before (the baseline)")
    p.add_argument("--b", type=Path, help="the tree after")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--sizes", type=int, nargs="+", default=[4000, 16000, 64000])
    p.add_argument("--queries", type=int, default=300)
    add_conditions(p)
    p.add_argument("--json", type=Path)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args.sizes, args.queries)))
        return 0
    if args.a is None or args.b is None:
        p.error("--a and --b are required")
    here = str(Path(__file__).resolve())
    cmd = [here, "--worker", "--queries", str(args.queries), "--sizes", *map(str, args.sizes)]
    runs = run_pairs(args.a, args.b, cmd, args.pairs, lambda i, side, r: print(
        f"pair {i + 1}/{args.pairs} {side}: {json.dumps(r)}", flush=True))
    ratios = median_ratios(runs, ("readout_us", "decision_us"))
    print(json.dumps({"b_over_a_median": ratios}))
    if args.json:
        write_record(args.json, __file__, argv, {
            **tree_fields(args.a, args.b),
            "conditions": args.conditions, "b_over_a_median": ratios, "runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
