"""A/B in one process: removals that start from the kept margin Gram block against
removals that gather it from the cache, on twin memories in the same state.

Each case builds one memory (``bench_stream_speed.py``'s streams and cases, one BLAS
thread), copies it twice, then removes the same random margin token from both twins,
in alternating order, and adds the same new key to both; before each of its removals
the "gather" twin drops its kept block (``release_margin_gram(keep=False)``), so its
first solve gathers ``K_SS`` from the cache's margin rows as every removal did before
the block was kept. The twins' digests and coefficients must agree bit for bit after
every step (the run stops otherwise). Medians of the removals' wall times, and their
ratio kept / gather.

Usage::

    python benchmarks/ab_kept_gram.py --case 5 --case 0 --json results/ab_kept_gram.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_records import add_conditions, write_record  # noqa: E402
from bench_stream_speed import CASES, D, keys, warm_up  # noqa: E402
from svattn.exact import SVDDMemory  # noqa: E402


def run_case(case: int, removals: int, seed: int) -> dict:
    stream, n, C, gamma = CASES[case]
    stream_keys = keys(stream, n + removals, seed)
    base = SVDDMemory(C, gamma=gamma)
    base.extend(stream_keys[:n])
    kept, gather = base.copy(), base.copy()
    rng = np.random.default_rng(seed + 1)
    times: dict[str, list[float]] = {"kept": [], "gather": []}
    started_kept = 0
    for i in range(removals):
        ss = kept.solver_state
        tid = int(ss.slot_id[ss.slot_of_col[rng.integers(ss.nS)]])
        order = (("kept", kept), ("gather", gather))
        for name, mem in order if i % 2 else order[::-1]:
            if name == "gather":
                mem.solver_state.release_margin_gram(keep=False)
            else:
                started_kept += mem.solver_state.margin_gram_kept()
            t = time.perf_counter()
            mem.remove(tid)
            times[name].append(time.perf_counter() - t)
        if kept.state_digest() != gather.state_digest() or not np.array_equal(
                kept.alpha, gather.alpha):
            raise SystemExit(f"case {case}: the twins differ after removal {i}")
        x = stream_keys[n + i]
        kept.add(x)
        gather.add(x)
    ms = {k: 1e3 * float(np.median(v)) for k, v in times.items()}
    return {"stream": stream, "n": n, "C": C, "d": D, "gamma": gamma,
            "margin": int(base.solver_state.nS), "removals": removals,
            "started_from_kept_block": started_kept,
            "kept_median_ms": ms["kept"], "gather_median_ms": ms["gather"],
            "ratio_kept_over_gather": ms["kept"] / ms["gather"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--case", type=int, action="append",
                   help=f"index into bench_stream_speed.CASES (0..{len(CASES) - 1}); "
                        "repeatable; default 5 (16k, ~300 margin tokens)")
    p.add_argument("--removals", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    add_conditions(p)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    cases = args.case or [5]
    if any(not 0 <= c < len(CASES) for c in cases):
        p.error(f"--case must be in 0..{len(CASES) - 1}")
    if args.removals < 2:
        p.error("--removals must be >= 2")
    rows = []
    with threadpool_limits(1):
        warm_up()  # compiled code loaded untimed
        for c in cases:
            row = run_case(c, args.removals, args.seed)
            rows.append(row)
            print(f"{row['stream']} n = {row['n']}, {row['margin']} margin tokens: removal "
                  f"{row['kept_median_ms']:.3f} ms from the kept block, "
                  f"{row['gather_median_ms']:.3f} ms gathering (ratio "
                  f"{row['ratio_kept_over_gather']:.2f}; "
                  f"{row['started_from_kept_block']}/{row['removals']} started kept)")
    if args.json:
        write_record(args.json, __file__, argv, {"conditions": args.conditions, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
