"""Soak test of the exact memory: a long random stream of adds and removes.

100,000 operations (by default) on a redundant stream (clustered near-repeats
and rare outliers, :func:`streams.redundant_stream`), keeping the live set
near ``--live`` tokens. After every operation the KKT residual is computed
twice, the larger kept: as the memory reports it (:meth:`SVDDMemory.kkt_residual`)
and with g summed afresh over every cached kernel column (independent of the
solver's running g and of its error-column sum), and the largest is reported
(target <= 1e-10 throughout); at the end the memory is compared with a
from-scratch solve by the independent oracle (target <= 1e-9 on alpha, decision
function and mu). BLAS is pinned to one thread. Not part of the test suite::

    python benchmarks/soak_exact.py            # ~minutes
    python benchmarks/soak_exact.py --ops 5000 # quick look
    python benchmarks/soak_exact.py --ops 20000 --gamma-d 0.1  # ~100+ margin tokens
    # issue #36's stream (20 clusters, 2 % uniform outliers), d = 8, gamma = 0.1:
    # hundreds of margin tokens; the first --live rows take the batch path (libsvm)
    python benchmarks/soak_exact.py --stream clustered --d 8 --gamma-d 1.25 --ops 5000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))
from streams import clustered_outliers, redundant_stream  # noqa: E402
from svattn.exact import SVDDMemory  # noqa: E402
from svattn.exact.core.kernels import gram_matrix  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=100_000)
    ap.add_argument("--live", type=int, default=2000, help="target live-set size")
    ap.add_argument("--d", type=int, default=16)
    ap.add_argument("--C", type=float, default=0.01)
    ap.add_argument("--gamma-d", type=float, default=None,
                    help="rbf gamma = 1/(GAMMA_D·d) (default: the memory's, 1/d); a small "
                         "value (0.1) makes most support tokens margin tokens, where "
                         "removals keep their uniqueness factor")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--stream", choices=("redundant", "clustered"), default="redundant",
                    help="redundant: streams.redundant_stream; clustered: "
                         "streams.clustered_outliers (issue #36's large-support stream)")
    ap.add_argument("--check-every", type=int, default=1,
                    help="compute the from-scratch KKT residual every k operations")
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    make = redundant_stream if args.stream == "redundant" else clustered_outliers
    pool = make(args.ops + args.live, args.d, seed=args.seed)
    mem = SVDDMemory(args.C, gamma=None if args.gamma_d is None
                     else 1.0 / (args.gamma_d * args.d))
    t0 = time.perf_counter()
    with threadpool_limits(1):
        mem.extend(pool[: args.live])
        print(f"  first {args.live} rows: {mem.ingest_path}, |S|={mem.view.n_margin}",
              flush=True)
        nxt = args.live
        worst, worst_at = 0.0, -1
        n_add = n_rem = n_rem_support = 0
        for op in range(args.ops):
            # drift around the target size: add more when below, remove more when above
            p_add = 0.5 + 0.4 * np.tanh((args.live - len(mem)) / (0.05 * args.live))
            if rng.random() < p_add:
                mem.add(pool[nxt])
                nxt += 1
                n_add += 1
            else:
                sup = rng.random() < 0.3
                ids = mem.support_ids() if sup else mem.ids
                mem.remove(int(ids[rng.integers(len(ids))]))
                n_rem += 1
                n_rem_support += sup
            if op % args.check_every == 0:
                # also from every cached column (not the kept error sum)
                r = max(mem.kkt_residual(), mem.view.kkt_residual_all_columns())
                if r > worst:
                    worst, worst_at = r, op
            if (op + 1) % 10_000 == 0:
                el = time.perf_counter() - t0
                nS = mem.view.n_margin
                print(f"  {op + 1:>7} ops  n={len(mem)}  |S|={nS}  max KKT {worst:.2e}  "
                      f"refact {mem.n_refactorizations}  resolves {mem.n_resolves}  "
                      f"cond1 {mem.health.cond1:.2e}  {el:.0f}s", flush=True)
        elapsed = time.perf_counter() - t0
        # final agreement with the independent oracle
        from svattn.exact.oracle import solve_svdd

        X = mem.keys
        K = gram_matrix(X, mem.kernel, mem.gamma_value)
        t1 = time.perf_counter()
        alpha_r, mu_r = solve_svdd(K, mem.C, return_mu=True)
        t_oracle = time.perf_counter() - t1
        dec_m = 2.0 * (K @ mem.alpha) - np.diag(K) + mem.mu
        dec_r = 2.0 * (K @ alpha_r) - np.diag(K) + mu_r
        a_dev = float(np.max(np.abs(mem.alpha - alpha_r)))
        d_dev = float(np.max(np.abs(dec_m - dec_r)))
        mu_dev = abs(mem.mu - mu_r)
    h = mem.health
    print(f"ops: {args.ops} ({n_add} adds, {n_rem} removes, {n_rem_support} of support tokens); "
          f"final n={len(mem)}, |S|={mem.view.n_margin}, unique optimum: {mem.unique_optimum()}")
    print(f"max KKT residual (g from every cached column, every {args.check_every} op): "
          f"{worst:.3e} "
          f"(at op {worst_at})")
    print(f"refactorizations: {mem.n_refactorizations} "
          f"(drift-triggered {h.n_drift_refactorizations}), resolves: {mem.n_resolves}")
    print(f"health: {h.n_checks} checks, max cond1 {h.max_cond1:.3e}, "
          f"max inverse residual {h.max_inv_residual:.3e}")
    print(f"final vs oracle: max|dalpha| {a_dev:.3e}, max|ddecision| {d_dev:.3e}, "
          f"|dmu| {mu_dev:.3e} (oracle {t_oracle:.1f}s)")
    print(f"time: {elapsed:.1f}s ({elapsed / args.ops * 1e3:.2f} ms/op incl. KKT checks)")
    ok = worst <= 1e-10 and max(a_dev, d_dev, mu_dev) <= 1e-9
    print("PASS" if ok else "FAIL")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
