"""A/B in one process: removals whose uniqueness test updates the factor the last
removal kept (``svattn.exact.core.gram.KeptFactor``) against removals that compute the test
whole, on twin memories in the same state (the "fresh" twin's calls run with
``compiled.FACTOR_KEPT_FROM`` set out of reach).

Each case builds one memory (``bench_stream_speed.py``'s streams and cases, one BLAS
thread), copies it twice, then removes the same random margin token (an error token
while the margin set is empty) from both twins, in alternating order, and adds the
same new key to both. The twins' digests, uniqueness claims and coefficients must agree
bit for bit after every step (the run stops otherwise). Medians of the removals' wall
times, and their ratio kept / fresh, per run; the median ratio over runs per size.

Usage::

    python benchmarks/ab_kept_factor.py --case 5 --seed 0 --seed 1 --seed 2 --seed 3 \
        --json results/ab_kept_factor.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))
import svattn.exact.backends.compiled as backend  # noqa: E402
from bench_records import add_conditions, write_record  # noqa: E402
from bench_stream_speed import CASES, D, keys, warm_up  # noqa: E402
from svattn.exact import SVDDMemory  # noqa: E402

KEPT_FROM = backend.FACTOR_KEPT_FROM


def run_case(case: int, removals: int, seed: int) -> dict:
    stream, n, C, gamma = CASES[case]
    stream_keys = keys(stream, n + removals, seed)
    base = SVDDMemory(C, gamma=gamma)
    base.extend(stream_keys[:n])
    kept, fresh = base.copy(), base.copy()
    rng = np.random.default_rng(seed + 1)
    times: dict[str, list[float]] = {"kept": [], "fresh": []}
    started_kept = 0
    for i in range(removals):
        view = kept.view
        if view.n_margin:
            tid = view.margin_ids()[rng.integers(view.n_margin)]
        else:  # (a few margin tokens can all leave: an error token then)
            tid = int(rng.choice(kept.partition()["error"]))
        order = (("kept", kept), ("fresh", fresh))
        certs = {}
        for name, mem in order if i % 2 else order[::-1]:
            if name == "fresh":
                backend.FACTOR_KEPT_FROM = 1 << 30
            else:
                backend.FACTOR_KEPT_FROM = KEPT_FROM
                started_kept += mem.view.has_kept_factor
            t = time.perf_counter()
            certs[name] = mem.remove(tid)
            times[name].append(time.perf_counter() - t)
        backend.FACTOR_KEPT_FROM = KEPT_FROM
        if (kept.state_digest() != fresh.state_digest()
                or certs["kept"].unique_optimum != certs["fresh"].unique_optimum
                or not np.array_equal(kept.alpha, fresh.alpha)):
            raise SystemExit(f"case {case}: the twins differ after removal {i}")
        x = stream_keys[n + i]
        kept.add(x)
        fresh.add(x)
    ms = {k: 1e3 * float(np.median(v)) for k, v in times.items()}
    return {"stream": stream, "n": n, "C": C, "d": D, "gamma": gamma,
            "margin": base.view.n_margin, "removals": removals,
            "started_from_kept": started_kept,
            "kept_median_ms": ms["kept"], "fresh_median_ms": ms["fresh"],
            "ratio_kept_over_fresh": ms["kept"] / ms["fresh"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--case", type=int, action="append",
                   help=f"index into bench_stream_speed.CASES (0..{len(CASES) - 1}); "
                        "repeatable; default 5 (16k, ~300 margin tokens)")
    p.add_argument("--removals", type=int, default=60)
    p.add_argument("--seed", type=int, action="append",
                   help="stream seed (repeatable: one run per seed; default 0)")
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
            for seed in args.seed or [0]:
                row = run_case(c, args.removals, seed)
                rows.append({"seed": seed, **row})
                print(f"{row['stream']} n = {row['n']} (seed {seed}), {row['margin']} "
                      f"margin tokens: removal {row['kept_median_ms']:.3f} ms kept, "
                      f"{row['fresh_median_ms']:.3f} ms fresh (ratio "
                      f"{row['ratio_kept_over_fresh']:.2f}; "
                      f"{row['started_from_kept']}/{row['removals']} started kept)")
    summary = {}
    for row in rows:
        summary.setdefault(f"n={row['n']}", []).append(row["ratio_kept_over_fresh"])
    summary = {k: {"ratios": v, "median": float(np.median(v))} for k, v in summary.items()}
    for k, v in summary.items():
        runs = ", ".join(f"{r:.2f}" for r in v["ratios"])
        print(f"{k}: kept / fresh {v['median']:.2f} (runs {runs})")
    if args.json:
        write_record(args.json, __file__, argv, {"conditions": args.conditions, "rows": rows,
                                                 "median_ratios": summary})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
