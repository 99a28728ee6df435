"""``svattn.SVDD`` with ``sample_weight`` against ``OneClassSVM`` with it: scikit-learn's
wine (178 rows).

The rows standardized, integer weights 0 … 3 drawn with ``--seed`` (so a weight equals
that many copies; about a quarter are 0). Per ν in ``--nus``, alternating in one run:
``SVDD(nu).fit(X, sample_weight=w)`` (the weighted solver), ``OneClassSVM(nu,
gamma=ours.gamma_).fit(X, sample_weight=w)`` with its defaults, a ``forget`` of one
row of weight > 0 under weights (a warm re-solve), and a fresh weighted fit of the
rows left; medians of ``--fits`` each (wall-clock and CPU; on a shared machine the wall
clock also holds other jobs' time). Agreement, each the largest difference of the
decision function on the rows: with ``OneClassSVM(tol=1e-12, shrinking=False)`` (libsvm
keeps a float32 kernel cache) and with its defaults; with the fit on the rows repeated
``w_i`` times (copies); the forget against the fresh fit of the rows left.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_sample_weight.py \
        --json results/bench_sample_weight.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
import warnings
from pathlib import Path

import numpy as np
from sklearn.datasets import load_wine
from sklearn.preprocessing import StandardScaler
from sklearn.svm import OneClassSVM

sys.path.insert(0, str(Path(__file__).parent))
from bench_records import add_conditions, write_record  # noqa: E402
from svattn import SVDD  # noqa: E402


def _timed(run) -> tuple[float, float, object]:
    t, c = time.perf_counter(), time.process_time()
    out = run()
    return time.perf_counter() - t, time.process_time() - c, out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nus", type=float, nargs="+", default=[0.1, 0.5])
    p.add_argument("--fits", type=int, default=11)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    add_conditions(p)
    args = p.parse_args(argv)
    X = StandardScaler().fit_transform(load_wine().data)
    w = np.random.default_rng(args.seed).integers(0, 4, len(X)).astype(float)
    victim = int(np.flatnonzero(w > 0)[0])
    keep = np.setdiff1d(np.arange(len(X)), [victim])
    rows = []
    for nu in args.nus:
        model = SVDD(nu=nu).fit(X, sample_weight=w)
        gamma = model.gamma_
        tight = OneClassSVM(nu=nu, gamma=gamma, tol=1e-12, shrinking=False).fit(
            X, sample_weight=w)
        default = OneClassSVM(nu=nu, gamma=gamma).fit(X, sample_weight=w)
        copies = SVDD(nu=nu).fit(np.repeat(X, w.astype(int), axis=0))
        d = model.decision_function(X)
        times: dict[str, list[float]] = {k: [] for k in (
            "fit_s", "fit_cpu_s", "oneclasssvm_s", "oneclasssvm_cpu_s", "forget_s",
            "forget_cpu_s", "refit_s", "refit_cpu_s")}
        for _ in range(args.fits):
            wall, cpu, fitted = _timed(lambda nu=nu: SVDD(nu=nu).fit(X, sample_weight=w))
            times["fit_s"].append(wall)
            times["fit_cpu_s"].append(cpu)
            wall, cpu, _ = _timed(lambda nu=nu, g=gamma: OneClassSVM(nu=nu, gamma=g).fit(
                X, sample_weight=w))
            times["oneclasssvm_s"].append(wall)
            times["oneclasssvm_cpu_s"].append(cpu)
            wall, cpu, receipt = _timed(lambda m=fitted: m.forget(ids=[victim]))
            times["forget_s"].append(wall)
            times["forget_cpu_s"].append(cpu)
            wall, cpu, refit = _timed(lambda r=receipt: SVDD(**r.refit_with).fit(
                X[keep], sample_weight=w[keep]))
            times["refit_s"].append(wall)
            times["refit_cpu_s"].append(cpu)
        med = {k: statistics.median(v) for k, v in times.items()}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            forget_gap = float(np.abs(fitted.decision_function(X)
                                      - refit.decision_function(X)).max())
        rows.append({
            "nu": nu, **med, "gamma": gamma, "path": model.fit_path_,
            "forget_path": fitted.memory_.ingest_path,
            "ratio_fit": med["fit_s"] / med["oneclasssvm_s"],
            "ratio_fit_cpu": med["fit_cpu_s"] / med["oneclasssvm_cpu_s"],
            "ratio_forget_vs_refit": med["forget_s"] / med["refit_s"],
            "decision_dev_tight": float(np.abs(d - tight.decision_function(X)).max()),
            "decision_dev_default": float(np.abs(d - default.decision_function(X)).max()),
            "decision_dev_copies": float(np.abs(d - copies.decision_function(X)).max()),
            "decision_dev_forget_vs_refit": forget_gap,
            "decision_scale": float(np.abs(d).max()),
            "kkt_residual": model.memory_.kkt_residual(),
        })
        r = rows[-1]
        print(f"nu={nu}: weighted fit {r['fit_s'] * 1e3:.2f} ms ({r['path']}), OneClassSVM "
              f"{r['oneclasssvm_s'] * 1e3:.2f} ms ({r['ratio_fit']:.1f}x, CPU "
              f"{r['ratio_fit_cpu']:.1f}x); forget {r['forget_s'] * 1e3:.2f} ms "
              f"({r['forget_path']}) vs refit {r['refit_s'] * 1e3:.2f} ms; decision vs "
              f"tight libsvm {r['decision_dev_tight']:.1e}, default "
              f"{r['decision_dev_default']:.1e}, copies {r['decision_dev_copies']:.1e}, "
              f"forget vs refit {r['decision_dev_forget_vs_refit']:.1e}")
    if args.json:
        write_record(args.json, __file__, argv, {
            "data": "sklearn wine, standardized", "n": len(X),
            "weights": f"integers 0..3, numpy default_rng({args.seed})",
            "zero_weights": int((w == 0).sum()), "sum_weights": float(w.sum()),
            "conditions": args.conditions, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
