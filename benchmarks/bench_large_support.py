"""``svattn.SVDD`` against ``OneClassSVM`` where the support is large (issue #36).

The issue's stream: d = 8, ν = 0.05, 20 Gaussian clusters (centres N(0, 3²), unit
spread) with 2 % uniform outliers (:func:`streams.clustered_outliers`). Two regimes
per n: γ = 0.1 (hundreds of margin vectors) and γ = 0.01 (tens). Per (n, γ), in one
run and on one BLAS thread, each measurement alternating with its baseline so a slow
spell of a shared machine falls on both sides:

* ``SVDD(nu, gamma).fit`` against ``OneClassSVM(nu, gamma).fit`` (its defaults: what
  users run), medians of ``--fits`` each, and which path the fit took (``fit_path_``);
* ``forget`` of one sample (every other one a support vector; each put back untimed
  with ``partial_fit`` so n stays n) against ``OneClassSVM`` refit on the n − 1 rest;
* ``partial_fit`` of one row (the put-backs, timed) against a refit on n + 1 rows
  (the same refits: n ± 1 rows cost the same);
* the first forget after the fit (a support vector's) beside the median, and the passes
  over the margin block each support forget took (the solver's counter);
* the removal floor after them: one pass over the margin block of the kernel cache
  (:func:`bench_stream_speed.removal_floor`: every token's g, which a forget's
  certificate covers), and refit ÷ that pass — the most any forget that keeps g exact
  on every token could reach; and, paired, one such pass timed just before and just
  after each support forget, each forget over the mean of its two (the machine's
  bandwidth drifts over minutes; two times taken seconds apart share it), by the count
  of tokens that joined the margin set in it;
* ``decision_function`` of 2,000 probe rows, against ``OneClassSVM``'s;
* memory: the solver state's bytes per token (its numpy buffers: keys, the support's
  kernel columns, the bordered inverse; ``view.state_nbytes``);
* exactness: after the forgets, the largest deviation of the decision function from
  a fresh ``SVDD(C=model.C_, gamma=model.gamma_).fit`` of the rows held, and of α.

Compile time and the first imports are paid by a warm-up before anything is timed.

Usage::

    OMP_NUM_THREADS=1 python benchmarks/bench_large_support.py \\
        --sizes 2000 4000 8000 16000 32000 --json results/bench_large_support.json \\
        --plot results/bench_large_support.png
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
from bench_records import add_conditions, write_record  # noqa: E402
from bench_stream_speed import by_joined, paired_forget, removal_floor  # noqa: E402
from streams import clustered_outliers  # noqa: E402
from svattn import SVDD  # noqa: E402


def timed(f):
    t = time.perf_counter()
    out = f()
    return time.perf_counter() - t, out


def run_case(n: int, gamma: float, nu: float, *, fits: int, forgets: int, refits: int,
             seed: int) -> dict:
    X = clustered_outliers(n + forgets + 2000, 8, seed=seed)
    probes, extra, X = X[-2000:], X[n:n + forgets], X[:n]
    fit_s, oc_fit_s = [], []
    model = None
    for _ in range(fits):
        s, model = timed(lambda: SVDD(nu=nu, gamma=gamma).fit(X))
        fit_s.append(s)
        s, oc = timed(lambda: OneClassSVM(nu=nu, gamma=gamma).fit(X))
        oc_fit_s.append(s)
    sizes = {k: len(v) for k, v in model.memory_.partition().items()}
    fit_path = model.fit_path_
    dec_s, _ = timed(lambda: model.decision_function(probes))
    oc_dec_s, _ = timed(lambda: oc.decision_function(probes))
    rng = np.random.default_rng(seed)
    rows = {i: X[i] for i in range(n)}
    forget_s, add_s, refit_s, support, passes, paired = [], [], [], [], [], []
    joined: list[int] = []
    joins: list[int] = []
    for k in range(forgets):
        pool = model.support_ if k % 2 == 0 else np.fromiter(rows, np.int64)
        victim = int(pool[rng.integers(len(pool))])
        support.append(victim in set(model.support_.tolist()))
        f = paired_forget(model, victim, passes=support[-1])
        if support[-1]:
            paired.append(f.seconds / f.pass_s)
            joined.append(f.joined)
            joins.append(f.joins)
        passes.append(f.passes)
        assert f.receipt.certificates[0].kkt_residual_after <= model.tol
        forget_s.append(f.seconds)
        rows.pop(victim)
        if k < refits:
            rest = np.stack(list(rows.values()))
            s, _ = timed(lambda r=rest: OneClassSVM(nu=nu, gamma=gamma).fit(r))
            refit_s.append(s)
        row = extra[k]  # a new row keeps n at n
        s, _ = timed(lambda r=row: model.partial_fit(r[None, :]))
        add_s.append(s)
        rows[int(model.memory_.ids[-1])] = row
    floor_s = [removal_floor(model.memory_)[0] for _ in range(9)]
    held = np.stack(list(rows.values()))
    fresh = SVDD(C=model.C_, gamma=model.gamma_).fit(held)
    dev = float(np.abs(model.decision_function(probes) - fresh.decision_function(probes)).max())
    alpha_dev = float(np.abs(model.memory_.alpha - fresh.memory_.alpha).max())
    med = lambda a: float(np.median(a))  # noqa: E731
    r = {"n": n, "gamma": gamma, "nu": nu, "C": model.C_, "fit_path": fit_path,
         "margin": sizes["margin"], "error": sizes["error"],
         "svdd_fit_s": med(fit_s), "ocsvm_fit_s": med(oc_fit_s),
         "fit_ratio": med(fit_s) / med(oc_fit_s),
         "forget_median_ms": 1e3 * med(forget_s),
         "forget_support_median_ms": 1e3 * med([f for f, sv in zip(forget_s, support,
                                                                    strict=True) if sv]),
         # the first forget after the fit (a support vector's), not hidden in a median
         "first_forget_ms": 1e3 * forget_s[0],
         "first_over_median_support_forget": forget_s[0] / med(
             [f for f, sv in zip(forget_s, support, strict=True) if sv]),
         # passes over the margin block each support forget took (the solver's counter)
         "support_forget_passes": [p for p, sv in zip(passes, support, strict=True) if sv],
         "ocsvm_refit_median_ms": 1e3 * med(refit_s),
         "refit_over_forget": med(refit_s) / med(forget_s),
         # one pass over the margin block (the g of every token a forget's certificate
         # covers): the largest refit ÷ forget a forget with an exact g could reach
         "floor_pass_ms": 1e3 * med(floor_s),
         "refit_over_floor_pass": med(refit_s) / med(floor_s),
         "support_forget_over_floor_pass": med([f for f, sv in zip(forget_s, support,
                                                                   strict=True) if sv])
         / med(floor_s),
         "first_forget_over_floor_pass": forget_s[0] / med(floor_s),
         # each support forget over the mean of one pass just before and one just after it
         "support_forget_over_paired_pass_median": med(paired),
         "support_forget_over_paired_pass_mean": float(np.mean(paired)),
         "support_forget_over_paired_pass_all": paired,
         # tokens that joined the margin set in each support forget: net (in the set
         # after, not before), and every join (bench_stream_speed.margin_joins)
         "support_forget_joined_all": joined,
         "support_forget_over_paired_pass_by_joined": by_joined(joined, np.array(paired)),
         "support_forget_joins_all": joins,
         "support_forget_over_paired_pass_by_joins": by_joined(joins, np.array(paired)),
         "partial_fit_one_row_median_ms": 1e3 * med(add_s),
         "refit_over_partial_fit": med(refit_s) / med(add_s),
         "decision_2000_ms": 1e3 * dec_s, "ocsvm_decision_2000_ms": 1e3 * oc_dec_s,
         "fits": fits, "forgets": forgets, "refits": len(refit_s),
         "max_decision_dev_vs_fresh_fit": dev, "max_alpha_dev_vs_fresh_fit": alpha_dev,
         "fresh_fit_path": fresh.fit_path_,
         # the solver state's numpy buffers (keys, kernel cache of the support, inverse)
         "state_bytes_per_token": model.memory_.view.state_nbytes / len(model.memory_)}
    return r


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for gamma, style in ((0.1, "-"), (0.01, "--")):
        rs = sorted((r for r in rows if r["gamma"] == gamma), key=lambda r: r["n"])
        if not rs:
            continue
        n = [r["n"] for r in rs]
        m = int(np.median([r["margin"] for r in rs]))
        tag = f"γ={gamma} (~{m} margin)"
        axes[0].loglog(n, [r["svdd_fit_s"] for r in rs], "o" + style, label=f"SVDD.fit, {tag}")
        axes[0].loglog(n, [r["ocsvm_fit_s"] for r in rs], "s" + style, alpha=0.6,
                       label=f"OneClassSVM.fit, {tag}")
        axes[1].loglog(n, [r["forget_median_ms"] / 1e3 for r in rs], "o" + style,
                       label=f"SVDD.forget (one), {tag}")
        axes[1].loglog(n, [r["partial_fit_one_row_median_ms"] / 1e3 for r in rs], "^" + style,
                       label=f"SVDD.partial_fit (one row), {tag}")
        axes[1].loglog(n, [r["ocsvm_refit_median_ms"] / 1e3 for r in rs], "s" + style,
                       alpha=0.6, label=f"OneClassSVM refit, {tag}")
    for ax, title in zip(axes, ("fit", "one-sample update"), strict=True):
        ax.set_xlabel("n")
        ax.set_ylabel("seconds (median, one thread)")
        ax.set_title(title)
        ax.legend(fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
    fig.suptitle("d = 8, ν = 0.05, 20 clusters + 2 % uniform outliers, one thread", fontsize=9)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[2000, 4000, 8000, 16000])
    p.add_argument("--gammas", type=float, nargs="+", default=[0.1, 0.01])
    p.add_argument("--nu", type=float, default=0.05)
    p.add_argument("--fits", type=int, default=3)
    p.add_argument("--forgets", type=int, default=15)
    p.add_argument("--refits", type=int, default=5, help="baseline refits per case")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    p.add_argument("--plot", type=Path)
    add_conditions(p)
    args = p.parse_args(argv)
    if args.refits > args.forgets:
        p.error("--refits must be <= --forgets (each refit follows one forget)")
    rows = []
    with threadpool_limits(1):
        for gamma in args.gammas:  # compile and import, untimed: both paths, forget, add
            warm = SVDD(nu=0.1, gamma=gamma).fit(clustered_outliers(1200, 8, seed=99))
            for i in range(4):
                warm.forget(indices=[int(warm.support_[i])])
            warm.forget(indices=[int(np.setdiff1d(warm.memory_.ids, warm.support_)[0])])
            warm.partial_fit(clustered_outliers(3, 8, seed=98))
            OneClassSVM(nu=0.1, gamma=gamma).fit(clustered_outliers(300, 8, seed=97))
        for n in args.sizes:
            for gamma in args.gammas:
                r = run_case(n, gamma, args.nu, fits=args.fits, forgets=args.forgets,
                             refits=args.refits, seed=args.seed)
                rows.append(r)
                print(f"n={n:>6} γ={gamma}: margin {r['margin']}, fit {r['svdd_fit_s']:.2f} s "
                      f"vs {r['ocsvm_fit_s']:.2f} s ({r['fit_ratio']:.2f}x, {r['fit_path']}), "
                      f"forget {r['forget_median_ms']:.1f} ms (refit/forget "
                      f"{r['refit_over_forget']:.0f}x; support forget "
                      f"{r['support_forget_over_floor_pass']:.2f}x one pass after them, "
                      f"{r['support_forget_over_paired_pass_median']:.2f}x paired), partial_fit "
                      f"{r['partial_fit_one_row_median_ms']:.1f} ms, dev "
                      f"{r['max_decision_dev_vs_fresh_fit']:.1e}", flush=True)
                if args.json:  # written after every case: a long run keeps what it measured
                    write_record(args.json, __file__, argv, {"conditions": args.conditions,
                                                            "rows": rows, "complete": False})
    print(f"\nd = 8, ν = {args.nu}, one BLAS thread; ratios from this run")
    print("| n | γ | margin | SVDD.fit ÷ OneClassSVM.fit | refit ÷ forget | refit ÷ "
          "partial_fit | refit ÷ one pass (floor) | decision ms (OCSVM) | dev vs fresh fit "
          "| state B/token |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['n']} | {r['gamma']} | {r['margin']} | {r['fit_ratio']:.2f} "
              f"({r['svdd_fit_s']:.2f} / {r['ocsvm_fit_s']:.2f} s) | "
              f"{r['refit_over_forget']:.0f}× ({r['forget_median_ms']:.1f} ms) | "
              f"{r['refit_over_partial_fit']:.0f}× ({r['partial_fit_one_row_median_ms']:.1f} ms)"
              f" | {r['refit_over_floor_pass']:.0f}× ({r['floor_pass_ms']:.2f} ms)"
              f" | {r['decision_2000_ms']:.1f} ({r['ocsvm_decision_2000_ms']:.1f}) | "
              f"{r['max_decision_dev_vs_fresh_fit']:.1e} | {r['state_bytes_per_token']:.0f} |")
    if args.json:
        write_record(args.json, __file__, argv, {"conditions": args.conditions, "rows": rows,
                                                  "complete": True})
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
