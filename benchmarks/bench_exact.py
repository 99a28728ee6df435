"""Exact core: ingest speed and exact removal against retraining from scratch, in one run.

For n in {1k, 4k, 16k}, d = 64, on a redundant stream (clusters plus rare
outliers) and a Gaussian one, this prints

* ingest tokens/s of ``SVDDMemory.extend``;
* median and p99 latency of removing a margin token and an error token
  (each removal returns its certificate; the key is added back afterwards so
  the memory stays at n tokens, and that add-back is timed apart: it is where
  the memory refreshes its standby columns);
* the same removals and add-backs on a memory without standby columns
  (``standby=0``), in the same rounds: what the standby columns trade;
* the time to retrain without one token from scratch, with the independent
  oracle ``solve_svdd`` (Gram matrix included) and with scikit-learn's
  ``OneClassSVM`` (libsvm), and the ratio of the faster retrain to the median
  removal;
* max |alpha − alpha_retrain| after all removals (oracle at n <= 4k);
* the median margin removal again with the numpy reference backend
  (``mem.copy(backend="reference")``: the event loop, one array call per step,
  and the polish), on the same memory, as a ratio to the compiled removal
  (segment by segment).

BLAS runs on one thread (threadpoolctl) so the figures are per core. The
compiled loop is compiled (or loaded from numba's cache) on a small memory
before anything is timed. Removals and scikit-learn fits are timed in
alternating rounds (``--rounds``), so a slow spell of a shared machine falls
on both sides of the ratio.

Usage::

    python benchmarks/bench_exact.py              # the full table (a few minutes)
    python benchmarks/bench_exact.py --quick      # n = 1k only
    python benchmarks/bench_exact.py --json results/bench_exact.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).parent))
from baselines import sklearn_retrain_seconds  # noqa: E402
from streams import gaussian_stream, redundant_stream  # noqa: E402
from svattn.exact import SVDDMemory  # noqa: E402
from svattn.exact.core.kernels import gram_matrix  # noqa: E402
from svattn.exact.oracle import solve_svdd  # noqa: E402


def _removal_latencies(mem: SVDDMemory, which: str, count: int, rng,
                       events: list[tuple[int, int]] | None = None,
                       adds: list[float] | None = None) -> list[float]:
    out = []
    for _ in range(count):
        pool = mem.partition()[which]
        if not pool:
            break
        tid = int(rng.choice(pool))
        key = mem.view.key_of(tid)
        passes = mem.view.counters()["n_block_passes"]
        t = time.perf_counter()
        cert = mem.remove(tid)
        out.append(time.perf_counter() - t)
        if events is not None:
            events.append((cert.n_events, mem.view.counters()["n_block_passes"] - passes))
        t = time.perf_counter()
        mem.add(key)  # back to n tokens (timed apart: standby upkeep happens here)
        if adds is not None:
            adds.append(time.perf_counter() - t)
    return out


def _oracle_retrain(X: np.ndarray, C: float, gamma: float) -> tuple[float, np.ndarray]:
    t = time.perf_counter()
    alpha = solve_svdd(gram_matrix(X, "rbf", gamma), C)
    return time.perf_counter() - t, alpha


def _interleaved(mem: SVDDMemory, plain: SVDDMemory, removals: int, rounds: int, C: float,
                 gamma: float, rng, events: dict[str, list[tuple[int, int]]],
                 lat: dict[str, list[float]]
                 ) -> tuple[list[float], list[float]]:
    """Removal and add-back latencies into ``lat`` (``margin``, ``error``, ``add``,
    and the same with ``plain_`` for the memory without standby columns), sklearn
    retrain times (one per round) and the per-round ratio of the retrain to that
    round's median margin removal; each removal's solver events go to ``events``."""
    fits, ratios = [], []
    per = max(1, removals // rounds)
    for _ in range(rounds):
        m = _removal_latencies(mem, "margin", per, rng, events["margin"], lat["add"])
        lat["error"] += _removal_latencies(mem, "error", per, rng, events["error"], lat["add"])
        for which in ("margin", "error"):
            lat["plain_" + which] += _removal_latencies(plain, which, per, rng,
                                                        adds=lat["plain_add"])
        # one token fewer, as after a removal
        fits.append(sklearn_retrain_seconds(mem.keys[1:], C, gamma, tol=1e-10))
        lat["margin"] += m
        ratios.append(fits[-1] / float(np.median(m)))
    return fits, ratios


def _warm_up() -> None:
    """Compile (or load from cache) the numba event loop before timing."""
    mem = SVDDMemory(0.1)
    ids = mem.extend(np.random.default_rng(0).normal(size=(64, 4)))
    for t in ids[:8]:
        mem.remove(t)


def run(n: int, stream: str, *, d: int, C: float, removals: int, oracle_max_n: int,
        seed: int, rounds: int = 5) -> dict:
    X = (redundant_stream if stream == "redundant" else gaussian_stream)(n, d, seed=seed)
    rng = np.random.default_rng(seed)
    mem = SVDDMemory(C)
    t = time.perf_counter()
    mem.extend(X)
    ingest = n / (time.perf_counter() - t)
    sizes = {k: len(v) for k, v in mem.partition().items()}
    gamma = 1.0 / d
    plain = SVDDMemory(C, standby=0)  # the same memory without standby columns
    plain.extend(X)
    events: dict[str, list[tuple[int, int]]] = {"margin": [], "error": []}
    lat: dict[str, list[float]] = {k: [] for k in ("margin", "error", "add", "plain_margin",
                                                   "plain_error", "plain_add")}
    fits, ratios = _interleaved(mem, plain, removals, rounds, C, gamma, rng, events, lat)
    lat_m, lat_e = lat["margin"], lat["error"]
    ref = mem.copy(backend="reference")  # the numpy reference of the same removals
    lat_ref = _removal_latencies(ref, "margin", removals, rng)
    mem = ref.copy(backend="compiled")
    keys = mem.keys
    row: dict = {
        "stream": stream, "n": n, "d": d, "C": C, "ingest_tok_s": ingest, **sizes,
        "remove_margin_median_ms": 1e3 * float(np.median(lat_m)),
        "remove_margin_p99_ms": 1e3 * float(np.percentile(lat_m, 99)),
        "remove_margin_numpy_median_ms": 1e3 * float(np.median(lat_ref)),
        "remove_error_median_ms": 1e3 * float(np.median(lat_e)) if lat_e else None,
        "remove_error_p99_ms": 1e3 * float(np.percentile(lat_e, 99)) if lat_e else None,
        "kkt_residual": mem.kkt_residual(), "resolves": mem.n_resolves,
        # solver events (set changes and the token's exit) and passes over the margin
        # block (path segments and active-set steps) per removal: what a removal costs
        "events_per_margin_removal": float(np.mean([e for e, _ in events["margin"]])),
        "events_per_error_removal": (float(np.mean([e for e, _ in events["error"]]))
                                     if events["error"] else None),
        "passes_per_margin_removal": float(np.mean([p for _, p in events["margin"]])),
        "passes_per_error_removal": (float(np.mean([p for _, p in events["error"]]))
                                     if events["error"] else None),
        "removals_by_active_set_step": mem.view.counters()["n_jumps"],
        "active_set_steps_left_to_the_path": mem.view.counters()["n_jump_fallbacks"],
        # the trade standby columns make: removal latency against add-back (upkeep) time
        "add_back_median_ms": 1e3 * float(np.median(lat["add"])),
        "no_standby_remove_margin_median_ms": _ms_median(lat["plain_margin"]),
        "no_standby_remove_error_median_ms": _ms_median(lat["plain_error"]),
        "no_standby_add_back_median_ms": _ms_median(lat["plain_add"]),
        # mean time of one removal plus its add-back, over both kinds of removal
        "cycle_mean_ms": 1e3 * float(np.mean(lat_m + lat_e) + np.mean(lat["add"])),
        "no_standby_cycle_mean_ms": 1e3 * float(
            np.mean(lat["plain_margin"] + lat["plain_error"]) + np.mean(lat["plain_add"])),
    }
    row["sklearn_retrain_ms"] = 1e3 * float(np.median(fits))
    # how much the ratio moves between rounds on a shared machine
    row["sklearn_over_margin_by_round"] = [round(float(r), 1) for r in ratios]
    retrains = [row["sklearn_retrain_ms"]]
    if n <= oracle_max_n:
        t_or, alpha_r = _oracle_retrain(keys, C, gamma)
        row["oracle_retrain_ms"] = 1e3 * t_or
        row["max_alpha_dev_vs_oracle"] = float(np.max(np.abs(mem.alpha - alpha_r)))
        retrains.append(row["oracle_retrain_ms"])
    else:
        row["oracle_retrain_ms"] = None  # a dense n×n QP: not run at this size
        row["max_alpha_dev_vs_oracle"] = None
    fastest = min(retrains)
    row["speedup_margin"] = fastest / row["remove_margin_median_ms"]
    row["compiled_vs_numpy"] = row["remove_margin_numpy_median_ms"] / row["remove_margin_median_ms"]
    if lat_e:
        row["speedup_error"] = fastest / row["remove_error_median_ms"]
    return row


def _ms_median(x: list[float]) -> float | None:
    return 1e3 * float(np.median(x)) if x else None


def _fmt(x, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000, 16000])
    p.add_argument("--d", type=int, default=64)
    p.add_argument("--C", type=float, default=0.01)
    p.add_argument("--removals", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5,
                   help="removal blocks alternating with scikit-learn fits (one fit each)")
    p.add_argument("--oracle-max-n", type=int, default=4000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="n = 1000 only, 20 removals")
    p.add_argument("--json", type=Path, help="also write the rows to this file")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.removals = [1000], 20
    rows = []
    with threadpool_limits(1):
        _warm_up()
        for n in args.sizes:
            for stream in ("redundant", "gaussian"):
                rows.append(run(n, stream, d=args.d, C=args.C, removals=args.removals,
                                oracle_max_n=args.oracle_max_n, seed=args.seed,
                                rounds=args.rounds))
                r = rows[-1]
                print(f"  {stream:9s} n={n:6d}: ingest {r['ingest_tok_s']:,.0f} tok/s, "
                      f"remove margin {r['remove_margin_median_ms']:.3f} ms", flush=True)
    print()
    print(f"d = {args.d}, C = {args.C}, rbf gamma = 1/d, one BLAS thread")
    print("| stream | n | margin/error/reserve | ingest tok/s | remove margin ms (p50/p99) "
          "| remove error ms (p50/p99) | sklearn retrain ms | oracle retrain ms "
          "| speed-up margin / error | max Δalpha vs oracle | KKT | numpy-loop remove ms "
          "(compiled ×) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['stream']} | {r['n']} | {r['margin']}/{r['error']}/{r['reserve']} "
            f"| {r['ingest_tok_s']:,.0f} "
            f"| {r['remove_margin_median_ms']:.3f} / {r['remove_margin_p99_ms']:.3f} "
            f"| {_fmt(r['remove_error_median_ms'], '.3f')} "
            f"/ {_fmt(r['remove_error_p99_ms'], '.3f')} "
            f"| {r['sklearn_retrain_ms']:.1f} | {_fmt(r['oracle_retrain_ms'], '.1f')} "
            f"| {r['speedup_margin']:.0f}× / {_fmt(r.get('speedup_error'), '.0f')}× "
            f"| {_fmt(r['max_alpha_dev_vs_oracle'], '.1e')} | {r['kkt_residual']:.1e} "
            f"| {r['remove_margin_numpy_median_ms']:.3f} ({r['compiled_vs_numpy']:.1f}×) |"
        )
    print("\nper removal, mean margin / error: solver events (set changes and the token's "
          "exit); passes over the margin block (path segments and active-set steps):")
    for r in rows:
        print(f"  {r['stream']:9s} n={r['n']:6d}: events {r['events_per_margin_removal']:.2f} / "
              f"{_fmt(r['events_per_error_removal'], '.2f')}; passes "
              f"{r['passes_per_margin_removal']:.2f} / "
              f"{_fmt(r['passes_per_error_removal'], '.2f')}; finished by an active-set step "
              f"{r['removals_by_active_set_step']} (steps left to the path "
              f"{r['active_set_steps_left_to_the_path']})")
    print("\nstandby columns (kernel columns of the 16 reserve tokens nearest the boundary,"
          " refreshed after adds)\nagainst the same memory without them, in the same rounds "
          "(ms):")
    print("| stream | n | remove margin p50 with / without | remove error p50 with / without "
          "| add-back p50 with / without | remove + add-back mean with / without |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['stream']} | {r['n']} | {r['remove_margin_median_ms']:.3f} / "
            f"{_fmt(r['no_standby_remove_margin_median_ms'], '.3f')} "
            f"| {_fmt(r['remove_error_median_ms'], '.3f')} / "
            f"{_fmt(r['no_standby_remove_error_median_ms'], '.3f')} "
            f"| {r['add_back_median_ms']:.3f} / {_fmt(r['no_standby_add_back_median_ms'], '.3f')} "
            f"| {r['cycle_mean_ms']:.3f} / {r['no_standby_cycle_mean_ms']:.3f} |"
        )
    print("\nsklearn retrain / median margin removal, round by round:")
    for r in rows:
        print(f"  {r['stream']:9s} n={r['n']:6d}: "
              + ", ".join(f"{x:.0f}×" for x in r["sklearn_over_margin_by_round"]))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
