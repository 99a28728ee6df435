"""Exact core at streaming speed: per-token ``add`` against its floor, ``extend``, and
removal against scikit-learn's retrain, each side by side in one run.

For each case (stream, n, C, gamma), d = 64, rbf gamma = 1/(10·d) (and one case at
1/d, whose support is ~300 margin tokens), one BLAS thread:

* ``extend`` tokens/s: a fresh memory ingesting the n keys in one call (the
  warm-up threshold solve included, as a user pays it);
* the measured memory: the first n − a keys by ``extend`` (untimed), then per-token
  ``add`` of the last a = min(``--adds``, n/4) keys, so that it holds n tokens when the
  removals are timed; one public call per add, and beside each
  add, in alternation, its *floor*: the same key's kernel row against the memory's
  cached columns (margin, error and standby tokens) and its g, one compiled call
  (``svattn.exact.backends.compiled.reserve.reserve_row``) — the least an add can compute to
  know where the token lands. Reported: tokens/s, mean and median per add and per
  floor, and the ratios (mean/mean: the stream's cost, drives and standby refreshes
  included; median/median: the typical add, a reserve add);
* removals of margin (and error) tokens, each added back untimed so the memory stays
  at n, in rounds alternating with scikit-learn ``OneClassSVM(tol=1e-8)`` fits on the
  memory's keys less one; the ratio is the median fit over the median removal;
* beside each margin removal its *floor* (:func:`removal_floor`): one pass over the
  margin block of the kernel cache and one Cholesky test of K_SS, what the
  certificate's KKT residual (over every token) and its uniqueness claim need at the
  least; reported with the ratio removal ÷ floor (medians);
* the first round's removals' alpha (``--oracle-checks`` per set) against an
  independent solve where the optimum is unique (the oracle ``solve_svdd``, at
  n ≤ ``--oracle-max-n``; untimed): max |Δalpha|.

Everything compiled is loaded (or compiled) on a small memory before any timing.
The streams are ``streams.redundant_stream(n_clusters=20, outlier_rate=0.02)`` and
``streams.gaussian_stream``.

Usage::

    python benchmarks/bench_stream_speed.py                 # the default cases
    python benchmarks/bench_stream_speed.py --quick         # n = 4k, redundant only
    python benchmarks/bench_stream_speed.py --json results/bench_stream_speed.json
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).parent))
from baselines import sklearn_retrain_seconds  # noqa: E402
from bench_records import add_conditions, write_record  # noqa: E402
from streams import gaussian_stream, redundant_stream  # noqa: E402
from svattn.exact import SVDDMemory  # noqa: E402
from svattn.exact.backends.compiled import columns, linalg, reserve  # noqa: E402
from svattn.exact.core.kernels import gram_matrix  # noqa: E402
from svattn.exact.oracle import solve_svdd  # noqa: E402
from svattn.exact.view import instrument  # noqa: E402

D = 64
G10, G1 = 1.0 / (10 * D), 1.0 / D
# (stream, n, C, gamma); the last: a support of ~300 margin tokens (gamma 1/d)
CASES = [("redundant", 4000, 0.01, G10), ("gaussian", 4000, 0.01, G10),
         ("redundant", 16000, 0.0025, G10), ("redundant", 16000, 0.01, G10),
         ("gaussian", 16000, 0.01, G10), ("redundant", 16000, 0.01, G1)]


def keys(stream: str, n: int, seed: int) -> np.ndarray:
    if stream == "redundant":
        return redundant_stream(n, D, n_clusters=20, outlier_rate=0.02, seed=seed)
    return gaussian_stream(n, D, seed=seed)


def floor_time(mem: SVDDMemory, x: np.ndarray) -> float:
    """The floor of one add: the key's kernel row against the cached columns and its g."""
    ss = instrument(mem)
    row = np.empty((max(ss.chi, 1), 1))
    t = time.perf_counter()
    reserve.reserve_row(x, ss.XC, ss.ac, ss.chi, ss.mu, ss.gamma_value, True, row)
    return time.perf_counter() - t


def removal_floor(mem: SVDDMemory) -> tuple[float, float]:
    """The least a certified removal reads and factors, timed on the memory as it is:
    one pass over the margin block of the kernel cache (``KC[:n, :|S|] @ w``, the
    compiled matvec a removal's segment uses: the end point's g for every token, which
    the certificate's KKT residual covers) and one Cholesky test of ``K_SS`` (the
    certificate's uniqueness claim). Returns ``(pass_s, cholesky_s)``."""
    ss = instrument(mem)
    nS = ss.nS
    t_pass = floor_pass(mem)
    kss = np.ascontiguousarray(ss.KC[ss.slot_of_col[:nS], :nS])
    t = time.perf_counter()
    linalg.positive_definite(kss, 1e-10)
    t_chol = time.perf_counter() - t
    kss.fill(0.0)
    return t_pass, t_chol


def floor_pass(mem: SVDDMemory) -> float:
    """The pass of :func:`removal_floor` alone (no Cholesky test, no |S|² copy: timed
    beside a forget, it leaves the allocator and the caches as the forget found them),
    in seconds."""
    ss = instrument(mem)
    nS, hi = ss.nS, ss.hi
    w, out = np.full(max(nS, 1), 1.0 / max(nS, 1)), np.zeros(hi)
    t = time.perf_counter()
    columns.add_block_matvec(ss.KC, w, nS, hi, out)
    t_pass = time.perf_counter() - t
    out.fill(0.0)
    return t_pass


def margin_joins(before: dict[str, list[int]], after: dict[str, list[int]],
                 n_events: int) -> tuple[int, int]:
    """Tokens that joined the margin set in one removal, from the memory's partition
    before and after it and its certificate's ``n_events``: ``(net, joins)``. ``net``
    counts the tokens in the margin set after and not before; ``joins`` every entry
    into it, a token that joined and left again, or left and joined again, included
    (a working set's end reports such set changes too). Each event moves one token
    across the margin set's border, c's exit aside, so ``joins − leaves`` is the net
    change and ``joins + leaves = n_events − 1``. A removal with no events (a reserve
    token's, or a batch re-solve: ``n_events`` ≤ 0) has ``joins = net``."""
    held = {t for ts in after.values() for t in ts}
    mb, ma = set(before["margin"]) & held, set(after["margin"])
    net, left = len(ma - mb), len(mb - ma)
    if n_events < 1:
        return net, net
    return net, max(net, (n_events - 1 + net - left) // 2)


@dataclass
class PairedForget:
    """One forget timed between passes (:func:`paired_forget`)."""

    receipt: Any  # the estimator's ForgetReceipt
    seconds: float  # the forget
    pass_s: float  # the mean of the passes just before and just after it (0.0: not timed)
    joined: int  # tokens in the margin set after it and not before
    joins: int  # every join into the margin set in it (:func:`margin_joins`)
    passes: int  # passes over the margin block it took (the solver's counter)


def paired_forget(model: Any, victim: int, *, passes: bool = True) -> PairedForget:
    """``model.forget`` of ``victim`` (an ``svattn.SVDD``) timed alone, with its joins
    into the margin set and the passes it took; with ``passes``, one
    :func:`floor_pass` timed just before it and one just after (the ratio paired with
    its own passes: the machine's bandwidth drifts within a run)."""
    mem = model.memory_
    counted, part_before = mem.view.counters()["n_block_passes"], mem.partition()
    before = floor_pass(mem) if passes else 0.0
    t = time.perf_counter()
    receipt = model.forget(indices=[victim])
    seconds = time.perf_counter() - t
    pass_s = 0.5 * (before + floor_pass(mem)) if passes else 0.0
    joined, joins = margin_joins(part_before, mem.partition(),
                                 receipt.certificates[0].n_events)
    return PairedForget(receipt, seconds, pass_s, joined, joins,
                        mem.view.counters()["n_block_passes"] - counted)


def by_joined(joined: list[int], ratios: np.ndarray) -> dict[str, dict]:
    """Per count of tokens joining the margin set (``"3+"``: three or more): how many
    forgets had it and their median ratio."""
    keys = np.minimum(np.asarray(joined), 3)
    return {(str(k) if k < 3 else "3+"): {"forgets": int((keys == k).sum()),
                                          "median": float(np.median(ratios[keys == k]))}
            for k in range(4) if (keys == k).any()}


def stream_adds(mem: SVDDMemory, xs: np.ndarray) -> tuple[list[float], list[float]]:
    """Per-token adds and, alternating with them, each key's floor."""
    adds, floors = [], []
    for x in xs:
        floors.append(floor_time(mem, x))
        t = time.perf_counter()
        mem.add(x)
        adds.append(time.perf_counter() - t)
    return adds, floors


def sklearn_fit(X: np.ndarray, C: float, gamma: float) -> float:
    """scikit-learn's retrain of ``X``, at the issue's tolerance (1e-8)."""
    return sklearn_retrain_seconds(X, C, gamma, tol=1e-8)


def removals(mem: SVDDMemory, which: str, count: int, rng, oracle: int,
             gamma: float, floors: list) -> tuple[list[float], float]:
    """``count`` removals from set ``which`` (each added back, untimed), each after its
    :func:`removal_floor` (appended to ``floors``); the max |Δalpha| against the
    oracle over the first ``oracle`` of them with a unique optimum (nan: none checked)."""
    out, dev = [], float("nan")
    for _ in range(count):
        pool = mem.partition()[which]
        if not pool:
            break
        tid = int(rng.choice(pool))
        key = mem.view.key_of(tid)
        floors.append(removal_floor(mem))
        t = time.perf_counter()
        cert = mem.remove(tid)
        out.append(time.perf_counter() - t)
        if oracle > 0 and cert.unique_optimum:
            oracle -= 1
            alpha = solve_svdd(gram_matrix(mem.keys, "rbf", gamma), mem.C)
            d_now = float(np.abs(alpha - mem.alpha).max())
            dev = d_now if np.isnan(dev) else max(dev, d_now)
        mem.add(key)
    return out, dev


def warm_up() -> None:
    """Load (or compile) every compiled kernel these cases use, on a small memory."""
    rng = np.random.default_rng(0)
    mem = SVDDMemory(0.05, gamma=1 / (10 * D))
    mem.extend(rng.normal(size=(200, D)))
    for x in rng.normal(size=(50, D)):
        mem.add(x)
    for which in ("margin", "error", "reserve"):
        if mem.partition()[which]:
            mem.remove(mem.partition()[which][0])
    floor_time(mem, rng.normal(size=D))
    removal_floor(mem)
    mem.readout(rng.normal(size=(2, D)))
    # the batch path of a large block (libsvm's first import and use, the finish): an
    # extend of n keys takes it, and no first use may fall inside its figure
    SVDDMemory(0.01, gamma=1 / (10 * D)).extend(rng.normal(size=(1200, D)))


def memory_before_adds(X: np.ndarray, n: int, adds: int, C: float, gamma: float
                       ) -> tuple[float, SVDDMemory]:
    """The seconds of a fresh memory's ``extend`` of ``X[:n]`` (timed, then dropped), and
    a memory holding ``X[:n - adds]``: its timed adds of ``X[n - adds:n]`` end at n
    tokens, so everything measured after them is measured at n."""
    fresh = SVDDMemory(C, gamma=gamma)
    t = time.perf_counter()
    fresh.extend(X[:n])
    extend_s = time.perf_counter() - t
    del fresh
    mem = SVDDMemory(C, gamma=gamma)
    mem.extend(X[: n - adds])
    return extend_s, mem


def run(stream: str, n: int, C: float, gamma: float, *, adds: int, rounds: int,
        per_round: int, oracle_checks: int, oracle_max_n: int, seed: int) -> dict:
    adds = min(adds, n // 4)  # the timed adds end at n tokens: removals are timed at n
    X = keys(stream, n, seed)
    extend_s, mem = memory_before_adds(X, n, adds, C, gamma)
    add_t, floor_t = stream_adds(mem, X[n - adds:])
    assert len(mem) == n
    part = {k: len(v) for k, v in mem.partition().items()}
    rng = np.random.default_rng(seed + 1)
    rm = {"margin": [], "error": []}
    floor_rm: list[tuple[float, float]] = []
    fits = []
    dev = float("nan")
    for r in range(rounds):
        for which in rm:  # the oracle checks the first round's removals (timed apart)
            checks = oracle_checks if r == 0 and n <= oracle_max_n else 0
            lat, dv = removals(mem, which, per_round, rng, checks, gamma,
                               floor_rm if which == "margin" else [])
            rm[which] += lat
            dev = dv if np.isnan(dev) else max(dev, dv) if not np.isnan(dv) else dev
        fits.append(sklearn_fit(mem.keys[1:], C, gamma))
    ms = 1e3
    med = {k: float(np.median(v)) * ms if v else None for k, v in rm.items()}
    fit_ms = float(np.median(fits)) * ms
    return {
        "stream": stream, "n": n, "adds": adds, "C": C, "d": D, "gamma": gamma,
        "margin": part["margin"], "error": part["error"], "reserve": part["reserve"],
        "extend_tok_s": n / extend_s,
        "add_tok_s": len(add_t) / sum(add_t),
        "add_mean_us": float(np.mean(add_t)) * 1e6,
        "add_median_us": float(np.median(add_t)) * 1e6,
        "floor_mean_us": float(np.mean(floor_t)) * 1e6,
        "floor_median_us": float(np.median(floor_t)) * 1e6,
        "add_over_floor_mean": float(np.mean(add_t) / np.mean(floor_t)),
        "add_over_floor_median": float(np.median(add_t) / np.median(floor_t)),
        "remove_margin_median_ms": med["margin"], "remove_error_median_ms": med["error"],
        "remove_margin_p90_ms": (float(np.percentile(rm["margin"], 90)) * ms
                                 if rm["margin"] else None),
        # the margin removals' floor: one pass over the margin block + one Cholesky
        "remove_floor_pass_ms": (float(np.median([f[0] for f in floor_rm])) * ms
                                 if floor_rm else None),
        "remove_floor_cholesky_ms": (float(np.median([f[1] for f in floor_rm])) * ms
                                     if floor_rm else None),
        "remove_over_floor": (float(np.median(rm["margin"])
                                    / np.median([f[0] + f[1] for f in floor_rm]))
                              if floor_rm else None),
        "removals": {k: len(v) for k, v in rm.items()},
        "sklearn_retrain_ms": fit_ms,
        "speedup_margin": fit_ms / med["margin"] if med["margin"] else None,
        "speedup_error": fit_ms / med["error"] if med["error"] else None,
        "max_alpha_dev_vs_oracle": dev, "kkt_residual": mem.kkt_residual(),
    }


def _f(x, spec: str) -> str:
    return "—" if x is None or (isinstance(x, float) and np.isnan(x)) else format(x, spec)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--adds", type=int, default=3000, help="per-token adds timed per case")
    p.add_argument("--rounds", type=int, default=5, help="removal rounds (one fit each)")
    p.add_argument("--per-round", type=int, default=6, help="removals per set per round")
    p.add_argument("--oracle-checks", type=int, default=2,
                   help="removals per set checked against the oracle (first round)")
    p.add_argument("--oracle-max-n", type=int, default=4000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="redundant n = 4k only")
    p.add_argument("--case", type=int, action="append", choices=range(len(CASES)),
                   help="run only these cases (indices into CASES; repeatable)")
    p.add_argument("--json", type=Path, help="also write the rows to this file")
    add_conditions(p)
    args = p.parse_args(argv)
    cases = CASES[:1] if args.quick else CASES
    if args.case:
        cases = [CASES[i] for i in args.case]
    rows = []
    with threadpool_limits(1):
        warm_up()
        for stream, n, C, gamma in cases:
            rows.append(run(stream, n, C, gamma, adds=args.adds, rounds=args.rounds,
                            per_round=args.per_round, oracle_checks=args.oracle_checks,
                            oracle_max_n=args.oracle_max_n, seed=args.seed))
            r = rows[-1]
            print(f"  {stream:9s} n={n:6d} C={C} gamma={gamma:.4g}: "
                  f"add {r['add_tok_s']:,.0f} tok/s "
                  f"({r['add_over_floor_mean']:.1f}× floor), extend {r['extend_tok_s']:,.0f} "
                  f"tok/s, remove margin {_f(r['remove_margin_median_ms'], '.3f')} ms",
                  flush=True)
    print(f"\nd = {D}, one BLAS thread, {platform.machine()}; "
          "floor = the key's kernel row against the cached columns and its g (one "
          "compiled call), timed beside each add")
    print("| stream | n | C | gamma | margin/error/reserve | add tok/s | add mean / median µs "
          "| floor mean / median µs | add ÷ floor (mean / median) | extend tok/s "
          "| remove margin / error ms (median) | removal floor: pass + Cholesky ms "
          "| remove ÷ floor | sklearn retrain ms | speed-up margin / error "
          "| max Δalpha vs oracle |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['stream']} | {r['n']} | {r['C']} | 1/{1 / r['gamma']:.0f} "
              f"| {r['margin']}/{r['error']}/{r['reserve']} | {r['add_tok_s']:,.0f} "
              f"| {r['add_mean_us']:.1f} / "
              f"{r['add_median_us']:.1f} | {r['floor_mean_us']:.2f} / {r['floor_median_us']:.2f}"
              f" | {r['add_over_floor_mean']:.1f}× / {r['add_over_floor_median']:.1f}× "
              f"| {r['extend_tok_s']:,.0f} | {_f(r['remove_margin_median_ms'], '.3f')} / "
              f"{_f(r['remove_error_median_ms'], '.3f')} "
              f"| {_f(r['remove_floor_pass_ms'], '.3f')} + "
              f"{_f(r['remove_floor_cholesky_ms'], '.3f')} "
              f"| {_f(r['remove_over_floor'], '.1f')}× | {r['sklearn_retrain_ms']:.0f} "
              f"| {_f(r['speedup_margin'], '.0f')}× / {_f(r['speedup_error'], '.0f')}× "
              f"| {_f(r['max_alpha_dev_vs_oracle'], '.1e')} |")
    if args.json:
        write_record(args.json, __file__, argv, {"conditions": args.conditions, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
