"""``svattn.SVDD`` on small data against ``OneClassSVM``: scikit-learn's wine (178 rows).

The rows standardized; per ν in ``--nus``, alternating in one run on one BLAS thread:
``SVDD(nu).fit`` with the batch path's row threshold (``ingest.BATCH_MIN_ROWS``, 512:
below it a block is added one row at a time) as it is, with the threshold lowered to
``--batch-from`` (the batch path: libsvm's warm start and the exact finish) and
``OneClassSVM(nu, gamma='scale').fit``; medians of ``--fits`` each, the ratios, the path
each fit took, and the largest difference of α between the paths (and whether their
partitions are equal).

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_small_data.py --batch-from 64 \\
        --json results/bench_small_data.json
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


def _timed(fit, threshold: int | None = None) -> tuple[float, object]:
    old = ingest.BATCH_MIN_ROWS
    if threshold is not None:
        ingest.BATCH_MIN_ROWS = threshold
    try:
        t = time.perf_counter()
        model = fit()
        return time.perf_counter() - t, model
    finally:
        ingest.BATCH_MIN_ROWS = old


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nus", type=float, nargs="+", default=[0.05, 0.1, 0.5])
    p.add_argument("--fits", type=int, default=21)
    p.add_argument("--batch-from", type=int, default=64)
    p.add_argument("--json", type=Path)
    add_conditions(p)
    args = p.parse_args(argv)
    X = StandardScaler().fit_transform(load_wine().data)
    rows = []
    for nu in args.nus:
        def fit(nu=nu):
            return SVDD(nu=nu).fit(X)
        _timed(fit), _timed(fit, args.batch_from)  # (compile and import before timing)
        now, old, oc = [], [], []
        for _ in range(args.fits):
            s, model = _timed(fit, args.batch_from)
            now.append(s)
            s, by_rows = _timed(fit)
            old.append(s)
            s, _ = _timed(lambda nu=nu: OneClassSVM(nu=nu, gamma="scale").fit(X))
            oc.append(s)
        med = {k: statistics.median(v) for k, v in (("fit_batch_s", now), ("fit_as_is_s", old),
                                                    ("oneclasssvm_s", oc))}
        rows.append({
            "nu": nu, **med, "batch_from": args.batch_from,
            "threshold": ingest.BATCH_MIN_ROWS,
            "ratio_batch": med["fit_batch_s"] / med["oneclasssvm_s"],
            "ratio_as_is": med["fit_as_is_s"] / med["oneclasssvm_s"],
            "path": model.fit_path_, "path_as_is": by_rows.fit_path_,
            "same_partition": model.memory_.partition() == by_rows.memory_.partition(),
            "alpha_max_diff": float(np.abs(model.memory_.alpha - by_rows.memory_.alpha).max()),
        })
        r = rows[-1]
        print(f"nu={nu}: batch {r['fit_batch_s'] * 1e3:.2f} ms ({r['path']}), as is "
              f"{r['fit_as_is_s'] * 1e3:.2f} ms, OneClassSVM {r['oneclasssvm_s'] * 1e3:.2f}"
              f" ms: {r['ratio_batch']:.1f}x / {r['ratio_as_is']:.1f}x; same partition "
              f"{r['same_partition']}, alpha within {r['alpha_max_diff']:.1e}")
    if args.json:
        write_record(args.json, __file__, argv, {"data": "sklearn wine, standardized",
                                                 "n": len(X), "conditions": args.conditions,
                                                 "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
