"""Where a support forget spends its time on the ICU vitals, part by part (#51 item 3).

Fits ``SVDD(nu, gamma)`` on the MIMIC-III demo vitals as the project's loader gives them
(the first ``--first`` rows, z-scored; ``--dedup``: each row once), then forgets
``--forgets`` support vectors, timing each forget whole and the Python-level parts it
calls by wrapping them (:mod:`call_timing`): the compiled removal (``remove_by_segments``:
the segment loop, the working set, the check pass, the inverse's updates and health
measure, all inside one compiled call), the uniqueness test's kept factor
(``margin_positive_definite``), the checkpoint and its scrub, the health and audit hook
(``_after_op``), the certificate's facts and the estimator's attributes.

Inside the compiled call nothing can be wrapped, so beside them each compiled kernel a
removal runs is timed on its own, on the memory's arrays as the forgets left them (the
unit costs): one pass over the margin block (``n × |S|``, the floor), a copy of the
bordered inverse into a new array (``bordered_out``) and into a kept buffer (the working
set's save), one rank-one drop and one append of the inverse, one product with it (a
solve), the two refinement steps, the health measure, a row deleted from the kept factor
and one appended, and zeroing the inverse (the scrub). Medians in ms (``perf_counter``).

Usage::

    python benchmarks/profile_forget_parts.py --first 4000 --json results/profile_forget_icu4k.json
    python benchmarks/profile_forget_parts.py --dedup --first 13551 \\
        --json results/profile_forget_icu_dedup.json
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))
import call_timing  # noqa: E402
from bench_records import add_conditions, write_record  # noqa: E402
from svattn import SVDD  # noqa: E402
from svattn.data.icu import default_slice_path, load_mimic3_vitals  # noqa: E402
from svattn.estimators import svdd  # noqa: E402
from svattn.exact import memory  # noqa: E402
from svattn.exact.backends import compiled  # noqa: E402
from svattn.exact.backends.compiled import columns, linalg  # noqa: E402
from svattn.exact.operations import rollback, solver  # noqa: E402
from svattn.exact.view import instrument  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FULL = REPO.parent / "shared" / "data" / "icu" / "mimic3_demo_vitals.csv.gz"
PARTS = [(memory.SVDDMemory, "remove"), (compiled, "remove_by_segments"),
         (compiled, "margin_positive_definite"), (rollback, "checkpoint"),
         (rollback, "_scrub_after_success"), (memory.SVDDMemory, "_after_op"),
         (solver, "certificate_facts"), (svdd, "support_attributes"),
         (compiled, "drive")]


def _median_ms(fn, reps: int = 7) -> float:
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return 1e3 * float(np.median(ts))


def unit_costs(mem) -> dict:
    """Each compiled kernel of a removal timed alone on the memory's arrays (see module)."""
    ss = instrument(mem)
    nS, hi = ss.nS, ss.hi
    m = nS + 1
    Q = np.ascontiguousarray(ss.Qinv)
    kss = np.ascontiguousarray(linalg.gather_margin_gram(ss.KC, ss.slot_of_col, nS))
    w, out = np.full(nS, 1.0 / nS), np.zeros(hi)
    work = np.zeros((m + 2, m + 2))
    rhs = np.cos(np.arange(m))
    x = np.empty(m)
    units = {
        "pass_n_by_S": lambda: columns.add_block_matvec(ss.KC, w, nS, hi, out),
        "inverse_copy_new_array": lambda: columns.bordered_out(Q, nS),
        "inverse_copy_into_buffer": lambda: columns.bordered_into(Q, nS, work),
        "inverse_zero_fill": lambda: work[:m, :m].fill(0.0),
        "inverse_matvec": lambda: columns.matvec_lead(Q, rhs, m, x, 1.0),
        "refine_two_steps": lambda: linalg.refine(Q, kss, rhs, x, nS),
        "health_measure": lambda: linalg.bordered_health(Q, kss, nS),
    }
    res = {name: _median_ms(fn) for name, fn in units.items()}
    # a rank-one drop and an append (on a work copy; each drop restored by a re-copy)
    drops = []
    for _ in range(5):
        columns.bordered_into(Q, nS, work)
        t = time.perf_counter()
        columns.qb_drop(work, nS // 2, nS)
        drops.append(time.perf_counter() - t)
    res["inverse_rank1_drop"] = 1e3 * float(np.median(drops))
    u = np.empty(m)
    u[0] = 1.0
    u[1:] = 2.0 * kss[:, nS // 2] * 0.999
    apps = []
    for _ in range(5):
        columns.bordered_into(Q, nS - 1, work)
        t = time.perf_counter()
        columns.qb_append(work, u[:nS], nS - 1, float(kss[nS // 2, nS // 2]), ss.scale)
        apps.append(time.perf_counter() - t)
    res["inverse_rank1_append"] = 1e3 * float(np.median(apps))
    # the kept factor: one row deleted (from the middle) and one appended
    L = np.zeros((nS + 1, nS + 1))
    shift = 2e-10 * float(np.trace(kss))
    ok = compiled.factor_into(kss, nS, shift, L)
    res["factor_whole_dpotrf"] = _median_ms(lambda: compiled.factor_into(kss, nS, shift, L), 3)
    if ok:
        t = time.perf_counter()
        n1 = linalg.chol_delete(L, nS // 2, nS)
        res["factor_row_delete_middle"] = 1e3 * (time.perf_counter() - t)
        b = np.ascontiguousarray(kss[nS // 2, :])
        b = np.delete(b, nS // 2)
        t = time.perf_counter()
        linalg.chol_append(L, n1, b, float(kss[nS // 2, nS // 2]), shift)
        res["factor_row_append"] = 1e3 * (time.perf_counter() - t)
    for a in (Q, kss, work, L, out):
        a.fill(0.0)
    return res


def profile(X: np.ndarray, nu: float, gamma: float, count: int, seed: int) -> dict:
    acc: dict[str, list[float]] = collections.defaultdict(list)
    for owner, name in PARTS:
        call_timing.time_calls(owner, name, acc)
    warm = SVDD(nu=0.2, gamma=gamma).fit(X[:600])  # compile, untimed
    for _ in range(3):
        warm.forget(indices=[int(warm.support_[0])])
    unit_costs(warm.memory_)
    acc.clear()
    t = time.perf_counter()
    model = SVDD(nu=nu, gamma=gamma).fit(X)
    fit_s = time.perf_counter() - t
    part = model.memory_.partition()
    rng = np.random.default_rng(seed)
    total, passes, events, parts = [], [], [], collections.defaultdict(list)
    for _ in range(count):
        victim = int(model.support_[rng.integers(len(model.support_))])
        before = model.memory_.view.counters()["n_block_passes"]
        mark = {k: len(v) for k, v in acc.items()}
        t = time.perf_counter()
        receipt = model.forget(indices=[victim])
        total.append(time.perf_counter() - t)
        passes.append(model.memory_.view.counters()["n_block_passes"] - before)
        events.append(receipt.certificates[0].n_events)
        for name in {k for k, _ in ((n, 0) for _, n in PARTS)}:
            parts[name].append(sum(acc.get(name, [])[mark.get(name, 0):]))
    ms = 1e3
    out = {"n": len(X), "nu": nu, "gamma": gamma, "fit_s": fit_s,
           "margin": len(part["margin"]), "error": len(part["error"]),
           "forgets": count, "forget_events": events, "forget_passes": passes,
           "forget_first_ms": ms * total[0], "forget_median_ms": ms * float(np.median(total)),
           "forget_all_ms": [ms * t for t in total],
           "parts_first_ms": {k: ms * v[0] for k, v in parts.items()},
           "parts_median_ms": {k: ms * float(np.median(v)) for k, v in parts.items()},
           "unit_costs_ms": unit_costs(model.memory_)}
    out["median_over_floor_pass"] = (out["forget_median_ms"]
                                     / out["unit_costs_ms"]["pass_n_by_S"])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=FULL if FULL.exists() else default_slice_path())
    p.add_argument("--first", type=int, default=4000)
    p.add_argument("--dedup", action="store_true")
    p.add_argument("--gamma", type=float, default=1.0)
    p.add_argument("--nu", type=float, default=0.05)
    p.add_argument("--forgets", type=int, default=9)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    add_conditions(p)
    args = p.parse_args(argv)
    keys = np.ascontiguousarray(load_mimic3_vitals(args.data).standardised().keys)
    if args.dedup:
        keys = keys[np.sort(np.unique(keys, axis=0, return_index=True)[1])]
    load = os.getloadavg()
    with threadpool_limits(1):
        res = profile(keys[: args.first], args.nu, args.gamma, args.forgets, args.seed)
    print(f"n = {res['n']}: {res['margin']} margin / {res['error']} error; fit {res['fit_s']:.1f}"
          f" s; forget first {res['forget_first_ms']:.1f} ms, median "
          f"{res['forget_median_ms']:.1f} ms ({res['median_over_floor_pass']:.1f}x a pass); "
          f"passes {res['forget_passes']}, events {res['forget_events']}")
    for name, v in sorted(res["parts_median_ms"].items(), key=lambda kv: -kv[1]):
        print(f"  {name:28s} median {v:8.2f} ms   first {res['parts_first_ms'][name]:8.2f} ms")
    print("unit costs (ms):")
    for name, v in res["unit_costs_ms"].items():
        print(f"  {name:28s} {v:8.2f}")
    if args.json:
        write_record(args.json, __file__, argv, {
            "conditions": args.conditions, "load_average_before": load,
            "load_average_after": os.getloadavg(), **res})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
