"""The size of a pickled ``svattn.SVDD`` against its rows and ``OneClassSVM``'s pickle,
and what an unpickled model does.

One fit of ``--n`` rows of :func:`streams.clustered_outliers` (d = 8, ν = 0.05,
γ = 0.1: about 1,100 margin vectors at 20k rows), then: the pickle's bytes; the
bytes of the solver state pickled with its kernel cache (what a model's pickle was
before the cache was left out); the rows' bytes; the bar (4× the rows plus the
bordered inverse's 8·(|S|+1)² bytes); ``OneClassSVM``'s pickle; the times to pickle
and unpickle (the cache rebuilt, digest and KKT residual checked); the kernel cache
recipe's patch (entries neither rebuild routine reproduces); what refactorizing the
bordered inverse would cost instead of keeping it (time, largest deviation); and
``--forgets`` forgets of support vectors on the model and on its unpickled twin,
compared bit for bit (state digests, α, μ).

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_pickle.py --n 20000 \\
        --json results/bench_pickle.json
"""

from __future__ import annotations

import argparse
import pickle
import sys
import time
from pathlib import Path

import numpy as np
from sklearn.svm import OneClassSVM

sys.path.insert(0, str(Path(__file__).parent))
from bench_records import add_conditions, write_record  # noqa: E402
from streams import clustered_outliers  # noqa: E402
from svattn import SVDD  # noqa: E402
from svattn.exact.core.cache import refactorize  # noqa: E402
from svattn.exact.records import pickled  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--forgets", type=int, default=5)
    p.add_argument("--json", type=Path)
    add_conditions(p)
    args = p.parse_args(argv)
    X = clustered_outliers(args.n, 8, seed=0)
    model = SVDD(nu=0.05, gamma=0.1).fit(X)
    oc = OneClassSVM(nu=0.05, gamma=0.1).fit(X)
    ss = model.memory_.solver_state
    pickle.loads(pickle.dumps(model))  # (compile and import before timing)
    t0 = time.perf_counter()
    blob = pickle.dumps(model)
    t1 = time.perf_counter()
    twin = pickle.loads(blob)
    t2 = time.perf_counter()
    recipe = pickled.pack(ss)["cache_recipe"]
    Q = ss.Qinv.copy()
    ss_copy = ss.copy()
    t3 = time.perf_counter()
    refactorize(ss_copy, count=False)
    t4 = time.perf_counter()
    same = []
    for k in range(args.forgets):
        victim = int(model.support_[(7 * k) % len(model.support_)])
        a, b = model.forget(indices=[victim]), twin.forget(indices=[victim])
        same.append(bool(a.state_digest == b.state_digest
                         and np.array_equal(model.memory_.alpha, twin.memory_.alpha)
                         and model.memory_.mu == twin.memory_.mu))
    nS = ss.nS
    body = {
        "n": args.n, "d": 8, "nu": 0.05, "gamma": 0.1, "conditions": args.conditions,
        "margin": int(nS), "cache_columns": int(ss.chi),
        "pickle_bytes": len(blob),
        "with_cache_bytes": len(pickle.dumps(ss_copy)),
        "rows_bytes": int(X.nbytes),
        "bar_bytes": int(4 * X.nbytes + 8 * (nS + 1) ** 2),
        "inverse_bytes": int(Q.nbytes),
        "oneclasssvm_pickle_bytes": len(pickle.dumps(oc)),
        "dump_s": t1 - t0, "load_s": t2 - t1,
        "patch_entries": len(recipe["patch_values"]),
        "cache_entries": int(ss.n * ss.chi),
        "refactorize_s": t4 - t3,
        "refactorize_max_deviation": float(np.abs(ss_copy.Qinv - Q).max()),
        "forgets_bit_for_bit": same,
    }
    for k, v in body.items():
        print(f"{k:28s} {v}")
    if args.json:
        write_record(args.json, __file__, argv, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
