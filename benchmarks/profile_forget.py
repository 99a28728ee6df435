"""Where ``SVDD.forget`` of one sample spends its time where the support is large (#36).

The benchmark's own loop (``bench_large_support.py``: issue #36's clustered stream, one
forget then one ``partial_fit`` put-back, every other forget a support sample), with the
parts of each forget timed by wrapping the functions it calls (:mod:`call_timing`): the
compiled removal (``remove_segments``: the segment loop, its margin solves, passes over
the margin block, the certificate's final pass), the uniqueness test's kept factor
(``margin_positive_definite``, its row updates ``chol_update`` and whole factorizations
``cholesky_into``), the checkpoint and its scrub, the health and audit hook
(``_after_op``), the scratch release and the estimator's support attributes (computed on
the first read after a forget, not inside it: ``support_attributes``). Medians
and means over the support and the non-support forgets, in CPU milliseconds
(``time.process_time``: a loaded machine's other processes add no time, though they
still share the memory bandwidth these memory-bound passes need).

Usage::

    OMP_NUM_THREADS=1 python benchmarks/profile_forget.py --n 4000 --forgets 30
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))
import call_timing  # noqa: E402
from streams import clustered_outliers  # noqa: E402
from svattn import SVDD  # noqa: E402
from svattn.estimators import svdd  # noqa: E402
from svattn.exact import memory  # noqa: E402
from svattn.exact.backends import compiled  # noqa: E402
from svattn.exact.backends.compiled import linalg, segments  # noqa: E402
from svattn.exact.core import gram  # noqa: E402
from svattn.exact.operations import rollback, solver  # noqa: E402

PARTS = [(memory.SVDDMemory, "remove"), (compiled, "remove_by_segments"),
         (segments, "remove_segments"), (compiled, "margin_positive_definite"),
         (linalg, "chol_update"), (linalg, "cholesky_into"), (linalg, "gather_margin_gram"),
         (rollback, "checkpoint"), (rollback, "_scrub_after_success"),
         (memory.SVDDMemory, "_after_op"), (gram.MarginGramScratch, "release_margin_gram"),
         (solver, "certificate_facts"), (compiled, "g_exact"), (compiled, "drive"),
         (solver, "finish_op"), (svdd, "support_attributes"),
         (memory.SVDDMemory, "state_digest")]


def profile(n: int, gamma: float, forgets: int, seed: int) -> dict:
    acc: dict[str, list[float]] = collections.defaultdict(list)
    for owner, name in PARTS:
        call_timing.time_calls(owner, name, acc, clock=time.process_time)
    warm = SVDD(nu=0.1, gamma=gamma).fit(clustered_outliers(1200, 8, seed=99))
    for i in range(4):  # compiled code loaded untimed: forgets of both kinds, an add
        warm.forget(indices=[int(warm.support_[i])])
    warm.forget(indices=[int(np.setdiff1d(warm.memory_.ids, warm.support_)[0])])
    warm.partial_fit(clustered_outliers(3, 8, seed=98))
    X = clustered_outliers(n + forgets + 2000, 8, seed=seed)
    extra, X = X[n:n + forgets], X[:n]
    model = SVDD(nu=0.05, gamma=gamma).fit(X)
    margin = len(model.memory_.partition()["margin"])
    rng = np.random.default_rng(seed)
    rows = dict.fromkeys(range(n), True)
    total = {True: [], False: []}
    parts = {True: collections.defaultdict(list), False: collections.defaultdict(list)}
    events = []
    for k in range(forgets):
        pool = model.support_ if k % 2 == 0 else np.fromiter(rows, np.int64)
        victim = int(pool[rng.integers(len(pool))])
        sv = victim in set(model.support_.tolist())
        mark = {name: len(v) for name, v in acc.items()}
        t = time.process_time()
        receipt = model.forget(indices=[victim])
        total[sv].append(time.process_time() - t)
        if sv:
            events.append(receipt.certificates[0].n_events)
        for name, v in acc.items():
            parts[sv][name].append(sum(v[mark.get(name, 0):]))
        rows.pop(victim)
        model.partial_fit(extra[k][None, :])
        rows[int(model.memory_.ids[-1])] = True
    ms = 1e3
    out = {"n": n, "gamma": gamma, "margin": margin, "support_events": events}
    for sv, label in ((True, "support"), (False, "other")):
        out[label] = {
            "forgets": len(total[sv]),
            "median_ms": ms * float(np.median(total[sv])),
            "parts_ms": {name: {"median": ms * float(np.median(v)), "mean": ms * float(np.mean(v))}
                         for name, v in parts[sv].items()}}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=4000)
    p.add_argument("--gamma", type=float, default=0.1)
    p.add_argument("--forgets", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    with threadpool_limits(1):
        res = profile(args.n, args.gamma, args.forgets, args.seed)
    print(f"n = {res['n']}, gamma = {res['gamma']}, {res['margin']} margin vectors; events per "
          f"support forget {res['support_events']}")
    for label in ("support", "other"):
        r = res[label]
        print(f"{label} samples: {r['forgets']} forgets, median {r['median_ms']:.2f} ms (CPU)")
        for name, v in sorted(r["parts_ms"].items(), key=lambda kv: -kv[1]["mean"]):
            if v["mean"] >= 0.005:
                print(f"  {name:28s} median {v['median']:7.3f}  mean {v['mean']:7.3f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
