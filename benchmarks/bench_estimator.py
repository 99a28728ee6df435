"""``svattn.SVDD.forget`` of one sample against ``OneClassSVM.fit`` on the rest.

What a data scientist who must honour an erasure request would otherwise do:
refit scikit-learn's one-class SVM on every row but the erased one. Per n, in
one run and on one BLAS thread:

* ``SVDD(nu).fit`` on n rows of a clustered stream (d = 8 by default);
* the median time of ``forget(indices=[i])``, every other ``i`` a support vector
  and the rest any held sample (each put back with ``partial_fit`` untimed, so
  n stays n), the fitted attributes' refresh and the certificate included, and
  its median over the support vectors alone;
* the median of ``OneClassSVM(nu, gamma=model.gamma_).fit`` on the n − 1 other
  rows (its default tolerance, 1e-3: what users run), timed in alternation
  with the forgets so a slow spell of a shared machine falls on both sides;
* the ratio, and after the forgets the largest deviation of the model's
  decision function from a fresh ``SVDD(C=model.C_, gamma=model.gamma_).fit``
  of the rows it holds (the exactness the speed comes with).

Then the agreement with ``OneClassSVM`` where the problems coincide (rbf, ν, tol
1e-12, no shrinking): the largest differences of ``decision_function`` (on the
rows and on probes around them), ``offset_`` and the coefficients β, and of our
coefficients from the float64 oracle's ``solve_svdd``.

Compile time is paid by a warm-up fit before anything is timed.

Usage::

    python benchmarks/bench_estimator.py                      # n = 1k .. 16k
    python benchmarks/bench_estimator.py --sizes 1000 --forgets 5
    python benchmarks/bench_estimator.py --json results/bench_estimator.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from sklearn.svm import OneClassSVM
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).parent))
from bench_records import write_record  # noqa: E402
from streams import redundant_stream  # noqa: E402
from svattn import SVDD  # noqa: E402
from svattn.exact.core.kernels import gram_matrix  # noqa: E402
from svattn.exact.oracle import solve_svdd  # noqa: E402


def run_size(n: int, d: int, nu: float, forgets: int, refits: int, seed: int) -> dict:
    X = redundant_stream(n + forgets, d, seed=seed)
    rng = np.random.default_rng(seed)
    t = time.perf_counter()
    model = SVDD(nu=nu).fit(X[:n])
    fit_s = time.perf_counter() - t
    rows = {i: X[i] for i in range(n)}  # held sample index -> row
    forget_s, refit_s, support = [], [], []
    for k in range(forgets):
        # every other victim a support vector (the removals that move the solution)
        pool = model.support_ if k % 2 == 0 else np.fromiter(rows, np.int64)
        victim = int(pool[rng.integers(len(pool))])
        support.append(victim in set(model.support_.tolist()))
        t = time.perf_counter()
        model.forget(indices=[victim])
        forget_s.append(time.perf_counter() - t)
        row = rows.pop(victim)
        if k < refits:  # alternate with the baseline on the same n - 1 rows
            rest = np.stack(list(rows.values()))
            t = time.perf_counter()
            OneClassSVM(nu=nu, gamma=model.gamma_).fit(rest)
            refit_s.append(time.perf_counter() - t)
        model.partial_fit(row[None, :])  # put it back (a new index): n stays n
        rows[int(model.memory_.ids[-1])] = row
    held = np.stack(list(rows.values()))
    fresh = SVDD(C=model.C_, gamma=model.gamma_).fit(held)
    probes = held[:: max(1, n // 500)]
    dev = float(np.abs(model.decision_function(probes) - fresh.decision_function(probes)).max())
    f_ms, r_ms = 1e3 * float(np.median(forget_s)), 1e3 * float(np.median(refit_s))
    return {"n": n, "d": d, "nu": nu, "C": model.C_, "n_support": int(model.n_support_[0]),
            "fit_s": fit_s, "forget_median_ms": f_ms,
            "forget_support_median_ms": 1e3 * float(np.median(
                [s for s, sv in zip(forget_s, support, strict=True) if sv] or [np.nan])),
            "ocsvm_refit_median_ms": r_ms, "speedup": r_ms / f_ms,
            "forgets": forgets, "refits": len(refit_s), "max_decision_dev_vs_fresh_fit": dev}


def agreement(n: int, d: int, nu: float, seed: int) -> dict:
    """``SVDD(nu)`` against ``OneClassSVM(nu)`` and the oracle on the same n rows."""
    X = redundant_stream(n, d, seed=seed)
    probes = np.concatenate([X[::3], X[: n // 5] + 0.5 * np.random.default_rng(seed).normal(
        size=(n // 5, d))])
    ours = SVDD(nu=nu).fit(X)
    libsvm = OneClassSVM(nu=nu, gamma=ours.gamma_, tol=1e-12, shrinking=False).fit(X)
    beta, mine = np.zeros(n), np.zeros(n)
    beta[libsvm.support_] = libsvm.dual_coef_.ravel()
    mine[ours.support_] = ours.dual_coef_.ravel()
    alpha = solve_svdd(gram_matrix(X, "rbf", ours.gamma_), ours.C_)
    dec = libsvm.decision_function(probes)
    return {"n": n, "d": d, "nu": nu, "max_abs_decision": float(np.abs(dec).max()),
            "decision_dev": float(np.abs(ours.decision_function(probes) - dec).max()),
            "offset_dev": abs(ours.offset_ - float(libsvm.offset_[0])),
            "beta_dev": float(np.abs(mine - beta).max()),
            "alpha_dev_vs_oracle": float(np.abs(mine * ours.C_ - alpha).max())}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 2000, 4000, 8000, 16000])
    p.add_argument("--d", type=int, default=8)
    p.add_argument("--nu", type=float, default=0.1)
    p.add_argument("--forgets", type=int, default=30)
    p.add_argument("--refits", type=int, default=5, help="baseline fits per n (alternating)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--agreement-sizes", type=int, nargs="*", default=[500, 1000, 2000])
    p.add_argument("--json", type=Path, help="also write the rows (and this command) here")
    args = p.parse_args(argv)
    if args.refits > args.forgets:
        p.error("--refits must be <= --forgets (each refit follows one forget)")
    rows = []
    with threadpool_limits(1):
        warm = SVDD(nu=0.2).fit(redundant_stream(300, args.d, seed=99))  # compile, untimed
        for _ in range(3):
            warm.forget(indices=[int(warm.support_[0])])
        warm.forget(indices=[int(np.setdiff1d(warm.memory_.ids, warm.support_)[0])])
        for n in args.sizes:
            row = run_size(n, args.d, args.nu, args.forgets, args.refits, args.seed)
            rows.append(row)
            print(f"  n={n:>6}: forget {row['forget_median_ms']:.3f} ms, OneClassSVM refit "
                  f"{row['ocsvm_refit_median_ms']:.1f} ms ({row['speedup']:.0f}x)", flush=True)
    print(f"\nd = {args.d}, nu = {args.nu} (C = 1/(nu n) at fit), one BLAS thread")
    print("| n | support | forget one sample, median ms (support samples) | OneClassSVM.fit "
          "on the rest, median ms | speed-up | max decision dev vs a fresh fit |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n']} | {r['n_support']} | {r['forget_median_ms']:.3f} "
              f"({r['forget_support_median_ms']:.3f}) | {r['ocsvm_refit_median_ms']:.1f} | "
              f"{r['speedup']:.0f}× | {r['max_decision_dev_vs_fresh_fit']:.1e} |")
    agree = [agreement(n, args.d, args.nu, args.seed) for n in args.agreement_sizes]
    if agree:
        print("\nagreement with OneClassSVM (rbf, tol 1e-12; libsvm caches the kernel in float32)")
        print("| n | max decision dev (values up to) | offset dev | max β dev | "
              "max α dev vs the float64 oracle |")
        print("|---|---|---|---|---|")
        for a in agree:
            print(f"| {a['n']} | {a['decision_dev']:.1e} ({a['max_abs_decision']:.1f}) | "
                  f"{a['offset_dev']:.1e} | {a['beta_dev']:.1e} | {a['alpha_dev_vs_oracle']:.1e} |")
    if args.json:
        write_record(args.json, __file__, argv, {"rows": rows, "agreement": agree})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
