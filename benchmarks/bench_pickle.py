"""The size of a pickled ``svattn.SVDD`` against its rows and ``OneClassSVM``'s pickle,
and what an unpickled model does.

One fit of ``--n`` rows of :func:`streams.clustered_outliers` (d = 8, ν = 0.05,
γ = 0.1: about 1,100 margin vectors at 20k rows), then: the pickle's bytes; the
kernel cache's bytes (8·n·|S ∪ E|: what a model's pickle held besides before the cache
was left out); the rows' bytes; the bar (4× the rows plus the
bordered inverse's 8·(|S|+1)² bytes); ``OneClassSVM``'s pickle; the times to pickle
and unpickle (the cache rebuilt, digest and KKT residual checked); the kernel cache
recipe's patch (entries no rebuild routine reproduces) and rows rebuilt by the
streaming add's scoring routine; the state file
``SVDDMemory.save`` writes (its bytes, the times to save and load it: format 5 holds
the cache's recipe too, and its load rebuilds and checks the cache); what refactorizing
the bordered inverse would cost instead of keeping it (the margin block's kernel and
one inverse: time, largest deviation); and
``--forgets`` forgets of support vectors on the model and on its unpickled twin,
compared bit for bit (state digests, α, μ), the first of each timed (an unpickle builds
what a fit leaves for the first removal); then ``--adds`` rows added one at a time
(``partial_fit``), the recipe again (patch, scored rows, bytes) and one more forget on
the model and on a twin unpickled after the adds.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_pickle.py --n 20000 \\
        --json results/bench_pickle.json
"""

from __future__ import annotations

import argparse
import pickle
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from sklearn.svm import OneClassSVM

sys.path.insert(0, str(Path(__file__).parent))
from bench_records import add_conditions, write_record  # noqa: E402
from streams import clustered_outliers  # noqa: E402
from svattn import SVDD  # noqa: E402
from svattn.exact import SVDDMemory, kernel_matrix  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=20000)
    p.add_argument("--forgets", type=int, default=5)
    p.add_argument("--adds", type=int, default=20)
    p.add_argument("--json", type=Path)
    add_conditions(p)
    args = p.parse_args(argv)
    X = clustered_outliers(args.n, 8, seed=0)
    model = SVDD(nu=0.05, gamma=0.1).fit(X)
    oc = OneClassSVM(nu=0.05, gamma=0.1).fit(X)
    mem = model.memory_
    pickle.loads(pickle.dumps(model))  # (compile and import before timing, and the
    warm = SVDD(nu=0.05, gamma=0.1).fit(X[:600])  # kernels a forget loads at its first
    warm.forget(indices=[int(warm.support_[0])])  # call in a process)
    t0 = time.perf_counter()
    blob = pickle.dumps(model)
    t1 = time.perf_counter()
    twin = pickle.loads(blob)
    t2 = time.perf_counter()
    recipe = mem.__getstate__()["_s"]["cache_recipe"]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "model.safetensors"
        t5 = time.perf_counter()
        mem.save(path)
        t6 = time.perf_counter()
        loaded = SVDDMemory.load(path)
        t7 = time.perf_counter()
        file_bytes = path.stat().st_size
    file_same = loaded.state_digest() == mem.state_digest()
    system = mem.margin_system()  # the bordered inverse, and a refactorization of it
    keys = np.array([mem.view.key_of(t) for t in system.margin])
    Q = np.zeros((len(keys) + 1, len(keys) + 1))
    Q[0, 1:] = Q[1:, 0] = 1.0
    t3 = time.perf_counter()
    Q[1:, 1:] = 2.0 * kernel_matrix(keys, keys, "rbf", mem.gamma_value)
    Qinv = np.linalg.inv(Q)
    t4 = time.perf_counter()
    same, first = [], {}
    for k in range(args.forgets):
        victim = int(model.support_[(7 * k) % len(model.support_)])
        t8 = time.perf_counter()
        a = model.forget(indices=[victim])
        t9 = time.perf_counter()
        b = twin.forget(indices=[victim])
        t10 = time.perf_counter()
        if k == 0:  # the first forget on the fitted model and on its unpickled twin
            first = {"first_forget_fitted_ms": 1e3 * (t9 - t8),
                     "first_forget_unpickled_ms": 1e3 * (t10 - t9)}
        same.append(bool(a.state_digest == b.state_digest
                         and np.array_equal(mem.alpha, twin.memory_.alpha)
                         and mem.mu == twin.memory_.mu))
    extra = clustered_outliers(args.n + args.adds, 8, seed=0)[args.n:]
    for row in extra:  # rows added one at a time after the fit: the streaming add's scoring
        model.partial_fit(row[None, :])
    again = pickle.loads(pickle.dumps(model))
    after = mem.__getstate__()["_s"]["cache_recipe"]
    victim = int(model.support_[0])
    added_same = (model.forget(indices=[victim]).state_digest
                  == again.forget(indices=[victim]).state_digest)
    nS, chi = len(system.margin), len(recipe["kinds"])
    body = {
        "n": args.n, "d": 8, "nu": 0.05, "gamma": 0.1, "conditions": args.conditions,
        "margin": nS, "cache_columns": chi,
        "pickle_bytes": len(blob),
        "cache_bytes": 8 * args.n * chi,  # what a pickle held besides, with its cache
        "rows_bytes": int(X.nbytes),
        "bar_bytes": int(4 * X.nbytes + 8 * (nS + 1) ** 2),
        "inverse_bytes": int(system.Qinv.nbytes),
        "oneclasssvm_pickle_bytes": len(pickle.dumps(oc)),
        "dump_s": t1 - t0, "load_s": t2 - t1,
        "file_bytes": file_bytes, "file_save_s": t6 - t5, "file_load_s": t7 - t6,
        "file_loads_same_digest": file_same,
        "patch_entries": len(recipe["patch_values"]),
        "scored_rows": len(recipe["scored_slots"]),
        "refactorize_s": t4 - t3,
        "refactorize_max_deviation": float(np.abs(Qinv - system.Qinv).max()),
        "forgets_bit_for_bit": same,
        **first,
        "adds": args.adds,
        "after_adds_patch_entries": len(after["patch_values"]),
        "after_adds_scored_rows": len(after["scored_slots"]),
        "after_adds_pickle_bytes": len(pickle.dumps(model)),
        "after_adds_forget_bit_for_bit": bool(added_same),
    }
    for k, v in body.items():
        print(f"{k:28s} {v}")
    if args.json:
        write_record(args.json, __file__, argv, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
