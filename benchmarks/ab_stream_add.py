"""A/B of the streaming add on two source trees: per-token ``add`` and ``extend``,
alternating A, B, A, B, ... each run in its own process (warm numba cache, one BLAS
thread), through the public API only, so that any two versions compare.

Each run builds a memory of n keys of the redundant stream (20 clusters, 2 %
outliers, d = 64, gamma = 1/(10·d), C = 0.01) with ``extend`` (timed: tokens/s),
then adds the next ``--adds`` keys one ``add`` call each (timed: tokens/s, median µs),
and removes ``--removals`` margin tokens (each added back, untimed; median ms).
The stream comes from this tree's ``benchmarks/streams.py`` for both sides. Only
ratios within a pair mean anything on a shared machine.

Usage (the tree before a change checked out with ``git worktree add ../base REV``)::

    python benchmarks/ab_stream_add.py --a ../base --b . --pairs 3 \\
        --json results/ab_stream_add.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_trees import run_json  # noqa: E402
from bench_records import write_record  # noqa: E402

CHILD = r"""
import json, sys, time
import numpy as np
from threadpoolctl import threadpool_limits
sys.path.insert(0, {bench!r})
from streams import redundant_stream
from svattn.exact import SVDDMemory
n, adds, d = {n}, {adds}, 64
X = redundant_stream(n + adds, d, n_clusters=20, outlier_rate=0.02, seed={seed})
gamma = 1 / ({gamma_d} * d)
with threadpool_limits(1):
    w = SVDDMemory(0.05, gamma=1 / (10 * d))  # load the compiled cache, untimed
    w.extend(X[:300])
    for x in X[300:400]:
        w.add(x)
    w.remove(w.partition()["margin"][0] if w.partition()["margin"] else w.ids[0])
    mem = SVDDMemory({C}, gamma=gamma)
    t = time.perf_counter()
    mem.extend(X[:n])
    ext = n / (time.perf_counter() - t)
    ts = []
    for x in X[n:]:
        t = time.perf_counter()
        mem.add(x)
        ts.append(time.perf_counter() - t)
    rng = np.random.default_rng(1)
    rm = []
    for _ in range({removals}):
        tid = int(rng.choice(mem.partition()["margin"]))
        key = mem.keys[mem.ids.index(tid)].copy()
        t = time.perf_counter()
        mem.remove(tid)
        rm.append(time.perf_counter() - t)
        mem.add(key)
    margin = len(mem.partition()["margin"])
out = {{"extend_tok_s": ext, "margin": margin}}
if ts:
    out.update(add_tok_s=len(ts) / sum(ts), add_median_us=float(np.median(ts)) * 1e6)
if rm:
    out["remove_margin_median_ms"] = float(np.median(rm)) * 1e3
print(json.dumps(out))
"""
KEYS = ("extend_tok_s", "add_tok_s", "add_median_us", "remove_margin_median_ms")


def run(tree: Path, args) -> dict:
    code = CHILD.format(bench=str(Path(__file__).resolve().parent), n=args.n, adds=args.adds,
                        seed=args.seed, C=args.C, gamma_d=args.gamma_d,
                        removals=args.removals)
    return run_json(tree, ["-c", code])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--a", type=Path, required=True, help="the tree before (the baseline)")
    p.add_argument("--b", type=Path, required=True, help="the tree after")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--n", type=int, default=4000)
    p.add_argument("--adds", type=int, default=3000)
    p.add_argument("--C", type=float, default=0.01)
    p.add_argument("--gamma-d", type=float, default=10.0, help="gamma = 1/(gamma_d·d)")
    p.add_argument("--removals", type=int, default=0, help="margin removals timed (added back)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    runs: dict[str, list] = {"a": [], "b": []}
    for i in range(args.pairs):
        for side in ("a", "b"):
            runs[side].append(run(getattr(args, side).resolve(), args))
        a, b = runs["a"][-1], runs["b"][-1]
        keys = [k for k in KEYS if k in a]
        print(f"pair {i}: margin {a['margin']}/{b['margin']}, " + ", ".join(
            f"{k} A {a[k]:,.3f} B {b[k]:,.3f} (B/A {b[k] / a[k]:.2f})" for k in keys),
            flush=True)
    keys = [k for k in KEYS if k in runs["a"][0]]
    ratios = {k: [b[k] / a[k] for a, b in zip(runs["a"], runs["b"], strict=True)] for k in keys}
    summary = {k: statistics.median(v) for k, v in ratios.items()}
    print("median B/A:", ", ".join(f"{k} {v:.2f}" for k, v in summary.items()))
    if args.json:
        write_record(args.json, __file__, argv,
                     {"n": args.n, "adds": args.adds, "C": args.C,
                      "gamma": f"1/({args.gamma_d:g}·d)", "removals": args.removals, "runs": runs,
                      "ratios_b_over_a": ratios, "median_ratio_b_over_a": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
