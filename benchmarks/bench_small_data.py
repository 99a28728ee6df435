"""``svattn.SVDD`` on small data against ``OneClassSVM``: scikit-learn's wine (178 rows).

The rows standardized; per ν in ``--nus``, alternating in one run on one BLAS thread:
``SVDD(nu).fit`` as it is (an empty memory's first block of at least
``ingest.FIRST_BATCH_MIN_ROWS`` = 64 rows takes the batch path: libsvm's warm start and
the exact finish), the same fit with that path switched off (the rows added one at a
time, as below 64 rows or onto held rows under ``ingest.BATCH_MIN_ROWS``) and
``OneClassSVM(nu, gamma='scale').fit``; medians of ``--fits`` each, wall-clock and CPU
(on a machine shared with other jobs the wall clock also holds their time), the ratios,
the path each fit took, and the largest difference of α between the paths (and whether
their partitions are equal).

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_small_data.py --json results/bench_small_data.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from sklearn.datasets import load_wine
from sklearn.preprocessing import StandardScaler
from sklearn.svm import OneClassSVM

sys.path.insert(0, str(Path(__file__).parent))
from bench_records import add_conditions, write_record  # noqa: E402
from svattn import SVDD  # noqa: E402
from svattn.exact.operations import ingest  # noqa: E402


def _timed(fit, batch: bool = True) -> tuple[float, float, object]:
    old = ingest.FIRST_BATCH_MIN_ROWS
    if not batch:
        ingest.FIRST_BATCH_MIN_ROWS = 1 << 60
    try:
        t, c = time.perf_counter(), time.process_time()
        model = fit()
        return time.perf_counter() - t, time.process_time() - c, model
    finally:
        ingest.FIRST_BATCH_MIN_ROWS = old


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nus", type=float, nargs="+", default=[0.05, 0.1, 0.5])
    p.add_argument("--fits", type=int, default=21)
    p.add_argument("--json", type=Path)
    add_conditions(p)
    args = p.parse_args(argv)
    X = StandardScaler().fit_transform(load_wine().data)
    rows = []
    for nu in args.nus:
        def fit(nu=nu):
            return SVDD(nu=nu).fit(X)
        _timed(fit), _timed(fit, batch=False)  # (compile and import before timing)
        times: dict[str, list[float]] = {k: [] for k in (
            "fit_s", "fit_cpu_s", "fit_by_rows_s", "fit_by_rows_cpu_s", "oneclasssvm_s",
            "oneclasssvm_cpu_s")}
        for _ in range(args.fits):
            for name, run in (("fit", lambda: _timed(fit)),
                              ("fit_by_rows", lambda: _timed(fit, batch=False)),
                              ("oneclasssvm", lambda nu=nu: _timed(
                                  lambda: OneClassSVM(nu=nu, gamma="scale").fit(X)))):
                wall, cpu, got = run()
                times[name + "_s"].append(wall)
                times[name + "_cpu_s"].append(cpu)
                if name == "fit":
                    model = got
                elif name == "fit_by_rows":
                    by_rows = got
        med = {k: statistics.median(v) for k, v in times.items()}
        rows.append({
            "nu": nu, **med, "first_batch_min_rows": ingest.FIRST_BATCH_MIN_ROWS,
            "ratio": med["fit_s"] / med["oneclasssvm_s"],
            "ratio_cpu": med["fit_cpu_s"] / med["oneclasssvm_cpu_s"],
            "ratio_by_rows": med["fit_by_rows_s"] / med["oneclasssvm_s"],
            "ratio_by_rows_cpu": med["fit_by_rows_cpu_s"] / med["oneclasssvm_cpu_s"],
            "path": model.fit_path_, "path_by_rows": by_rows.fit_path_,
            "same_partition": model.memory_.partition() == by_rows.memory_.partition(),
            "alpha_max_diff": float(np.abs(model.memory_.alpha - by_rows.memory_.alpha).max()),
        })
        r = rows[-1]
        print(f"nu={nu}: fit {r['fit_s'] * 1e3:.2f} ms ({r['path']}), by rows "
              f"{r['fit_by_rows_s'] * 1e3:.2f} ms, OneClassSVM {r['oneclasssvm_s'] * 1e3:.2f}"
              f" ms: {r['ratio']:.1f}x / {r['ratio_by_rows']:.1f}x (CPU {r['ratio_cpu']:.1f}x"
              f" / {r['ratio_by_rows_cpu']:.1f}x); same partition {r['same_partition']}, "
              f"alpha within {r['alpha_max_diff']:.1e}")
    if args.json:
        write_record(args.json, __file__, argv, {"data": "sklearn wine, standardized",
                                                 "n": len(X), "conditions": args.conditions,
                                                 "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
