"""A/B of a removal's active-set steps: twins in one process, steps allowed vs. not.

For each stream and seed, two memories are built from the same keys (d = 64,
C = 0.01, rbf gamma = 1/(10·d), one BLAS thread): one with ``max_jumps = 2`` (the
default), one with ``max_jumps = 0`` (the solution path alone). The same tokens are
then removed from both, margin and error tokens in turn, the twins timed in
alternating order, each token added back untimed. Reported per case: the margin set's
size, the median removal of each twin and the ratio path-alone ÷ steps. This is the
evidence for ``compiled.segments.JUMP_MIN_MARGIN``, below which no step is tried
(exactly ``max_jumps = 0``), so it is measured on a tree from before that threshold,
whose steps are tried at every size: point ``PYTHONPATH`` at its ``src`` (the record
names the source it ran and its commit). On a tree with the threshold the twins
agree below it.

Usage (the tree before checked out with ``git worktree add ../base-jumps a9002ec``)::

    PYTHONPATH=../base-jumps/src python benchmarks/ab_jumps.py --json results/ab_jumps.json
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))
import svattn  # noqa: E402
from bench_records import add_conditions, portable_path, write_record  # noqa: E402
from bench_stream_speed import G10, keys, warm_up  # noqa: E402
from svattn.exact import SVDDMemory  # noqa: E402
from svattn.exact.view import instrument  # noqa: E402


def source() -> dict:
    """Which svattn ran: its package directory (relative to the repository, where
    benchmarks run) and that tree's commit."""
    where = Path(svattn.__file__).resolve().parent
    rev = subprocess.run(["git", "-C", str(where), "rev-parse", "HEAD"], capture_output=True,
                         text=True).stdout.strip()
    return {"package": portable_path(where), "commit": rev or None}


def twins(stream: str, n: int, seed: int, removals: int) -> dict:
    X = keys(stream, n, seed)
    mems = {}
    for jumps in (2, 0):
        mem = SVDDMemory(0.01, gamma=G10)
        mem.extend(X)
        instrument(mem).max_jumps = jumps
        mems[jumps] = mem
    margin = mems[2].view.n_margin
    rng = np.random.default_rng(seed + 100)
    times: dict[int, list[float]] = {2: [], 0: []}
    for i in range(removals):
        part = mems[2].partition()
        which = "margin" if i % 2 == 0 or not part["error"] else "error"
        tid = int(rng.choice(part[which]))
        for jumps in ((2, 0) if i % 2 == 0 else (0, 2)):
            mem = mems[jumps]
            if tid not in mem.partition()[which]:
                continue  # (the twins' partitions agree to rounding; skip a disagreement)
            key = mem.view.key_of(tid)
            t = time.perf_counter()
            mem.remove(tid)
            times[jumps].append(time.perf_counter() - t)
            mem.add(key)
    med = {j: statistics.median(v) for j, v in times.items()}
    return {"stream": stream, "n": n, "seed": seed, "margin": margin,
            "removals": {str(j): len(v) for j, v in times.items()},
            "median_us_steps": 1e6 * med[2], "median_us_path_alone": 1e6 * med[0],
            "ratio_path_alone_over_steps": med[0] / med[2]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, action="append", help="default: 4000 and 16000")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--removals", type=int, default=160)
    add_conditions(p)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    rows = []
    print(f"svattn from {source()}")
    with threadpool_limits(1):
        warm_up()
        for n in args.n or [4000, 16000]:
            for stream in ("redundant", "gaussian"):
                for seed in range(args.seeds if n <= 4000 else 1):
                    r = twins(stream, n, seed, args.removals if n <= 4000 else 40)
                    rows.append(r)
                    print(f"{stream:9s} n={n:6d} seed {seed}: {r['margin']:3d} margin tokens, "
                          f"removal {r['median_us_steps']:7.0f} µs with steps, "
                          f"{r['median_us_path_alone']:7.0f} µs path alone "
                          f"(ratio {r['ratio_path_alone_over_steps']:.2f})", flush=True)
    if args.json:
        write_record(args.json, __file__, argv, {"conditions": args.conditions,
                                                  "source": source(), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
