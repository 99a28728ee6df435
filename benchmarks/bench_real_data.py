"""``SVDD`` on real clinical data beside ``OneClassSVM``: fit, support forgets, exactness.

The MIMIC-III demo vitals as the project's loader gives them (``svattn.data.icu``:
forward- and median-filled hourly rows, z-scored; exact copies of rows among them), in
one run and on one BLAS thread (libsvm runs on one):

* per case (the first ``--first`` rows, and the whole file; with ``--dedup`` each row
  once), ``SVDD(nu, gamma).fit``
  and ``OneClassSVM(nu, gamma, tol=1e-12, shrinking=False).fit`` (the same problem
  solved to the end) timed in alternation, ``--fits`` times each, and the default
  ``OneClassSVM(nu, gamma)`` (tol 1e-3: what users run); medians and the ratios;
* on the first case, ``--forgets`` forgets of a support vector each (drawn from the
  model's ``support_``, the fitted attributes' refresh and the certificate included):
  the first one after the fit, the median, the mean and the largest, against a refit (the
  median ``SVDD`` fit above, and ``OneClassSVM`` at its default tolerance on the
  rows held);
  beside them the passes over the margin block each forget took (the solver's counter)
  and, after the forgets, one such pass timed (``bench_stream_speed.removal_floor``):
  the forget's floor, and the first and median forget as multiples of it; and, paired,
  one such pass timed just before and just after each forget, each forget over the
  mean of its two (that mean ranged 8.7–14.0 ms within one run of 60 forgets on the
  distinct rows, 9.3–14.4 ms in another: two times taken a few ms apart share that
  drift), with each forget's count of tokens that joined the margin set (net, and
  every join: ``bench_stream_speed.margin_joins``) and the paired ratio's median by
  each count;
* after the forgets, the largest deviation of the decision function from a fresh
  ``SVDD(C=model.C_, gamma=model.gamma_).fit`` of the rows held, and of every group
  of identical rows' coefficient sum (the optimum fixes only the sum: copies share
  one budget, ``docs/design.md``);
* the path each fit took and the re-solves the forgets needed.

Compile time is paid by a warm-up fit and forget before anything is timed.

``--profile`` instead runs one fit of the first case and six support forgets under
cProfile and records the functions with the largest cumulative time (and the git
commit of the svattn it imported: run with ``PYTHONPATH`` at another checkout, it
profiles that code — how the cause of a slow fit is confirmed before and after a fix).

Usage::

    python benchmarks/bench_real_data.py
    python benchmarks/bench_real_data.py --gamma 1 --first 4000 --forgets 30 \\
        --json results/bench_real_data.json
    python benchmarks/bench_real_data.py --dedup --first 13551 --no-whole --fits 1 \\
        --json results/bench_real_data_dedup.json
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
from sklearn.svm import OneClassSVM
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).parent))
from bench_records import add_conditions, write_record  # noqa: E402
from bench_stream_speed import by_joined, paired_forget, removal_floor  # noqa: E402
from svattn import SVDD  # noqa: E402
from svattn.data.icu import default_slice_path, load_mimic3_vitals  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FULL = REPO.parent / "shared" / "data" / "icu" / "mimic3_demo_vitals.csv.gz"


def copy_groups(X: np.ndarray) -> np.ndarray:
    """Each row's group of identical rows (the index of its unique row)."""
    _, inverse = np.unique(X, axis=0, return_inverse=True)
    return inverse.ravel()


def timed(make):
    t = time.perf_counter()
    out = make()
    return out, time.perf_counter() - t


def fits(X: np.ndarray, nu: float, gamma: float, repeats: int) -> dict:
    """SVDD and OneClassSVM fits of X in alternation; medians and the last model."""
    ours, exact, default = [], [], []
    model = None
    for _ in range(repeats):
        model, t = timed(lambda: SVDD(nu=nu, gamma=gamma).fit(X))
        ours.append(t)
        _, t = timed(lambda: OneClassSVM(nu=nu, gamma=gamma, tol=1e-12,
                                         shrinking=False).fit(X))
        exact.append(t)
        _, t = timed(lambda: OneClassSVM(nu=nu, gamma=gamma).fit(X))
        default.append(t)
    part = model.memory_.partition()
    f, e, d = (float(np.median(v)) for v in (ours, exact, default))
    return {"n": len(X), "exact_copies": int(len(X) - len(np.unique(X, axis=0))),
            "gamma": gamma, "nu": nu, "fit_path": model.fit_path_,
            "margin": len(part["margin"]), "error": len(part["error"]),
            "svdd_fit_s": f, "svdd_fit_all_s": ours,
            "ocsvm_exact_fit_s": e, "ocsvm_default_fit_s": d,
            "fit_ratio_vs_ocsvm_exact": f / e, "fit_ratio_vs_ocsvm_default": f / d,
            "fit_resolves": int(model.memory_.n_resolves)}, model


def forgets(model: SVDD, X: np.ndarray, nu: float, count: int, seed: int) -> dict:
    """``count`` support forgets of ``model`` (fitted on X); timings and exactness."""
    rng = np.random.default_rng(seed)
    held = np.ones(len(X), bool)
    runs, refits = [], []
    resolves = model.memory_.n_resolves
    for k in range(count):
        victim = int(model.support_[rng.integers(len(model.support_))])
        runs.append(paired_forget(model, victim))
        held[victim] = False
        if k < 5:  # the baseline on the same rows, in alternation
            _, t = timed(lambda: OneClassSVM(nu=nu, gamma=model.gamma_).fit(X[held]))
            refits.append(t)
    fresh = SVDD(C=model.C_, gamma=model.gamma_).fit(X[held])
    probes = X[:: max(1, len(X) // 2000)]
    dev = float(np.abs(model.decision_function(probes) - fresh.decision_function(probes)).max())
    group = copy_groups(X[held])
    mine, theirs = np.zeros(len(group)), np.zeros(len(group))
    pos = {int(p): i for i, p in enumerate(np.flatnonzero(held))}
    mine[[pos[int(p)] for p in model.support_]] = model.dual_coef_.ravel()
    theirs[fresh.support_] = fresh.dual_coef_.ravel()
    sums = np.bincount(group, mine) - np.bincount(group, theirs)
    floor = float(np.median([removal_floor(model.memory_)[0] for _ in range(9)]))
    times, paired = [r.seconds for r in runs], [r.pass_s for r in runs]
    passes, joined, joins = ([r.passes for r in runs], [r.joined for r in runs],
                             [r.joins for r in runs])
    over_paired = np.array(times) / np.array(paired)
    return {"forgets": count, "first_forget_ms": 1e3 * times[0],
            # one pass over the margin block (n × |S|), after the forgets: a forget's floor
            "floor_pass_ms": 1e3 * floor,
            "forget_median_over_floor": float(np.median(times)) / floor,
            "first_forget_over_floor": times[0] / floor,
            "first_forget_over_median": times[0] / float(np.median(times)),
            # passes over the margin block each forget took (the solver's counter)
            "forget_passes_all": passes, "forget_passes_max": max(passes),
            "forget_median_ms": 1e3 * float(np.median(times)),
            # the mean: what a run of many forgets costs each (the median hides the rare
            # slow one, e.g. a uniqueness test beside tied tokens)
            "forget_mean_ms": 1e3 * float(np.mean(times)),
            "forget_mean_over_floor": float(np.mean(times)) / floor,
            # each forget over the mean of one pass timed just before and one just after it
            "paired_pass_ms_median": 1e3 * float(np.median(paired)),
            "paired_pass_ms_range": [1e3 * float(min(paired)), 1e3 * float(max(paired))],
            "forget_over_paired_pass_median": float(np.median(over_paired)),
            "forget_over_paired_pass_mean": float(np.mean(over_paired)),
            "forget_over_paired_pass_all": over_paired.tolist(),
            # tokens that joined the margin set in each forget, and the paired ratio's
            # median by that count (each join costs a product with the inverse, a read
            # of an |S|² half, and its rows in the uniqueness factor): net (in the set
            # after, not before), and every join (one that left again, or left and came
            # back, too: bench_stream_speed.margin_joins)
            "forget_joined_all": joined,
            "forget_over_paired_pass_by_joined": by_joined(joined, over_paired),
            "forget_joins_all": joins,
            "forget_over_paired_pass_by_joins": by_joined(joins, over_paired),
            "forget_max_ms": 1e3 * float(np.max(times)),
            "forget_all_ms": [1e3 * t for t in times],
            "ocsvm_default_refit_median_ms": 1e3 * float(np.median(refits)),
            "forget_resolves": int(model.memory_.n_resolves - resolves),
            "max_decision_dev_vs_fresh_fit": dev,
            # dual_coef_ is alpha / C: the sums' deviation in alpha's units
            "max_group_alpha_sum_dev_vs_fresh_fit": float(np.abs(sums).max()) * model.C_}


def profile(X: np.ndarray, nu: float, gamma: float, seed: int, top: int = 20) -> dict:
    """cProfile of one fit of ``X`` and six support forgets: the ``top`` functions by
    cumulative time of each, with call counts, and the commit of the svattn imported."""
    import cProfile
    import pstats
    import subprocess

    import svattn

    src = Path(svattn.__file__).resolve().parent
    commit = subprocess.run(["git", "-C", str(src), "rev-parse", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    with threadpool_limits(1):
        warm = SVDD(nu=0.2, gamma=gamma).fit(X[:600])  # compile, unprofiled
        warm.forget(indices=[int(warm.support_[0])])
        out = {"svattn_commit": commit, "n": len(X), "nu": nu, "gamma": gamma}
        rng = np.random.default_rng(seed)
        model = None
        for name in ("fit", "forgets"):
            prof = cProfile.Profile()
            t = time.perf_counter()
            prof.enable()
            if name == "fit":
                model = SVDD(nu=nu, gamma=gamma).fit(X)
            else:
                for _ in range(6):
                    model.forget(indices=[int(model.support_[rng.integers(len(
                        model.support_))])])
            prof.disable()
            total = time.perf_counter() - t
            stats = pstats.Stats(prof).stats
            rows = sorted(stats.items(), key=lambda kv: -kv[1][3])[:top]
            out[name] = {"seconds": total, "top_cumulative": [
                {"function": f"{Path(f).name}:{line}({fn})", "calls": int(v[1]),
                 "cumulative_s": float(v[3]), "own_s": float(v[2])}
                for (f, line, fn), v in rows]}
            if name == "fit":
                out["fit_path"] = model.fit_path_
        out["resolves"] = int(model.memory_.n_resolves)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", type=Path, default=FULL if FULL.exists() else default_slice_path())
    p.add_argument("--gamma", type=float, default=1.0)
    p.add_argument("--nu", type=float, default=0.05)
    p.add_argument("--first", type=int, default=4000, help="rows of the first case")
    p.add_argument("--fits", type=int, default=3, help="fits of each kind per case")
    p.add_argument("--forgets", type=int, default=30)
    p.add_argument("--no-whole", action="store_true", help="skip the whole file")
    p.add_argument("--dedup", action="store_true",
                   help="drop exact copies of rows first (each row once, in file order)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", action="store_true",
                   help="profile one fit and six forgets of the first case instead")
    p.add_argument("--json", type=Path, help="also write the rows (and this command) here")
    add_conditions(p)
    args = p.parse_args(argv)
    load_before = os.getloadavg()
    if args.profile:
        keys = np.ascontiguousarray(load_mimic3_vitals(args.data).standardised().keys)
        body = profile(keys[: args.first], args.nu, args.gamma, args.seed)
        if args.json:
            write_record(args.json, __file__, argv, {
                "conditions": args.conditions, "load_average_before": load_before, **body})
        return 0
    keys = np.ascontiguousarray(load_mimic3_vitals(args.data).standardised().keys)
    if args.dedup:
        keys = keys[np.sort(np.unique(keys, axis=0, return_index=True)[1])]
    cases = [("first", keys[: args.first])] + ([] if args.no_whole else [("whole", keys)])
    rows = []
    with threadpool_limits(1):
        warm = SVDD(nu=0.2, gamma=args.gamma).fit(keys[:600])  # compile, untimed
        for _ in range(3):
            warm.forget(indices=[int(warm.support_[0])])
        for name, X in cases:
            row, model = fits(X, args.nu, args.gamma, args.fits)
            row["case"] = name
            if name == "first" and args.forgets:
                row.update(forgets(model, X, args.nu, args.forgets, args.seed))
                row["svdd_refit_over_forget_median"] = (
                    1e3 * row["svdd_fit_s"] / row["forget_median_ms"])
                row["ocsvm_refit_over_forget_median"] = (
                    row["ocsvm_default_refit_median_ms"] / row["forget_median_ms"])
            rows.append(row)
            print(row, flush=True)
    print(f"\nMIMIC-III demo vitals (z-scored), nu = {args.nu}, gamma = {args.gamma}, "
          "one BLAS thread; medians")
    print("| rows (exact copies) | margin / error | SVDD.fit s (path) | OneClassSVM tol 1e-12 "
          "s | ratio | OneClassSVM default s | ratio |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n']} ({r['exact_copies']}) | {r['margin']} / {r['error']} | "
              f"{r['svdd_fit_s']:.2f} ({r['fit_path']}) | {r['ocsvm_exact_fit_s']:.2f} | "
              f"{r['fit_ratio_vs_ocsvm_exact']:.2f}× | {r['ocsvm_default_fit_s']:.2f} | "
              f"{r['fit_ratio_vs_ocsvm_default']:.2f}× |")
    for r in rows:
        if "forget_median_ms" in r:
            print(f"\nsupport forgets at n = {r['n']}: first {r['first_forget_ms']:.0f} ms, "
                  f"median {r['forget_median_ms']:.0f} ms, mean {r['forget_mean_ms']:.0f} ms, "
                  f"max {r['forget_max_ms']:.0f} ms "
                  f"(one pass {r['floor_pass_ms']:.1f} ms: median "
                  f"{r['forget_median_over_floor']:.1f}×, first "
                  f"{r['first_forget_over_floor']:.1f}×; paired with a pass just "
                  f"before and after each: median {r['forget_over_paired_pass_median']:.2f}×,"
                  f" mean {r['forget_over_paired_pass_mean']:.2f}×; by tokens joining the "
                  f"margin set: " + ", ".join(f"{k}: {v['median']:.2f}× ({v['forgets']})" for k, v
                                             in r['forget_over_paired_pass_by_joined'].items())
                  + ";"
                  f" at most {r['forget_passes_max']} passes) "
                  f"({r['forget_resolves']} re-solves); SVDD refit / forget "
                  f"{r['svdd_refit_over_forget_median']:.0f}×, OneClassSVM refit "
                  f"{r['ocsvm_default_refit_median_ms']:.0f} ms / forget "
                  f"{r['ocsvm_refit_over_forget_median']:.1f}×; vs a fresh fit: decision "
                  f"{r['max_decision_dev_vs_fresh_fit']:.1e}, group alpha sums "
                  f"{r['max_group_alpha_sum_dev_vs_fresh_fit']:.1e}")
    if args.json:
        write_record(args.json, __file__, argv, {
            "conditions": args.conditions, "load_average_before": load_before,
            "load_average_after": os.getloadavg(), "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
