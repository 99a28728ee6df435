"""How the exact core's costs grow with n: add, removal, readout, memory, retrain.

For n in ``--sizes`` (default 1k, 4k, 16k, 64k), both streams (redundant: 20
clusters, 2 % outliers; Gaussian), d = 64, C = 0.01, rbf gamma = 1/(10·d), one BLAS
thread, on one memory per (stream, n):

* ``extend`` tokens/s: a fresh memory ingesting the n keys in one call;
* per add: the mean of a = min(``--adds``, n/4) per-token ``add`` calls, the last a of
  the n keys, into a memory holding the first n − a (drives and standby refreshes
  included), and their median (the typical reserve add); everything below is then
  measured on that memory of n tokens;
* per removal: the median of ``--removals`` margin-token removals (each key added
  back, untimed);
* per readout query: the median of single-query ``readout`` calls;
* bytes per token: the solver state's arrays (``SlotState``: keys, kernel-cache
  columns, per-slot vectors, bordered inverse) over n — numpy buffers only, not the
  Python objects (ids map, hashes) beside them;
* scikit-learn ``OneClassSVM(tol=1e-8)`` retrain on the memory's keys, in rounds
  alternating with the removals, up to ``--sklearn-max-n`` (above it, skipped: a
  libsvm fit at 64k takes minutes on this machine and would dominate the run).

Prints a table and the fitted growth exponent of each cost (least squares of
log time on log n); ``--json`` records the rows and exponents, ``--plot`` a log-log
figure.

Usage::

    python benchmarks/bench_scaling.py --json results/bench_scaling.json \\
        --plot results/bench_scaling.png
    python benchmarks/bench_scaling.py --replot results/bench_scaling.json \\
        --plot results/bench_scaling.png          # redraw from the record only
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).parent))
from bench_records import add_conditions, write_record  # noqa: E402
from bench_stream_speed import D, keys, memory_before_adds, sklearn_fit, warm_up  # noqa: E402
from svattn.exact import SVDDMemory  # noqa: E402

METRICS = ("add_mean_us", "add_median_us", "remove_median_ms", "readout_us",
           "sklearn_retrain_ms")


def state_bytes(mem: SVDDMemory) -> int:
    """Bytes of the numpy buffers the solver state holds."""
    return mem.view.state_nbytes


def run(stream: str, n: int, *, C: float, adds: int, removals: int, queries: int,
        rounds: int, sklearn_max_n: int, seed: int) -> dict:
    gamma = 1.0 / (10 * D)
    adds = min(adds, n // 4)  # the timed adds end at n tokens: the rest is measured at n
    X = keys(stream, n + queries, seed)
    extend_s, mem = memory_before_adds(X, n, adds, C, gamma)
    add_t = []
    for x in X[n - adds: n]:
        t = time.perf_counter()
        mem.add(x)
        add_t.append(time.perf_counter() - t)
    assert len(mem) == n
    Q = X[n:]
    read_t = []
    for q in Q:
        t = time.perf_counter()
        mem.readout(q)
        read_t.append(time.perf_counter() - t)
    rng = np.random.default_rng(seed + 1)
    rm_t, fits = [], []
    per = max(1, removals // rounds)
    for _ in range(rounds):
        for _ in range(per):
            pool = mem.partition()["margin"] or mem.partition()["error"]
            tid = int(rng.choice(pool))
            key = mem.view.key_of(tid)
            t = time.perf_counter()
            mem.remove(tid)
            rm_t.append(time.perf_counter() - t)
            mem.add(key)
        if n <= sklearn_max_n:
            fits.append(sklearn_fit(mem.keys[1:], C, gamma))
    part = {k: len(v) for k, v in mem.partition().items()}
    return {
        "stream": stream, "n": n, "adds": adds, "C": C, "gamma": gamma, "d": D, **part,
        "extend_tok_s": n / extend_s,
        "add_mean_us": float(np.mean(add_t)) * 1e6,
        "add_median_us": float(np.median(add_t)) * 1e6,
        "remove_median_ms": float(np.median(rm_t)) * 1e3,
        "readout_us": float(np.median(read_t)) * 1e6,
        "bytes_per_token": state_bytes(mem) / len(mem),
        "sklearn_retrain_ms": float(np.median(fits)) * 1e3 if fits else None,
        "kkt_residual": mem.kkt_residual(),
    }


def exponents(rows: list[dict]) -> dict:
    """Per stream and metric: the slope of log(cost) on log(n) (None: < 2 points)."""
    out: dict[str, dict] = {}
    for stream in sorted({r["stream"] for r in rows}):
        rs = [r for r in rows if r["stream"] == stream]
        out[stream] = {}
        for m in (*METRICS, "bytes_per_token"):
            pts = [(r["n"], r[m]) for r in rs if r[m]]
            out[stream][m] = (float(np.polyfit(np.log([p[0] for p in pts]),
                                               np.log([p[1] for p in pts]), 1)[0])
                              if len(pts) >= 2 else None)
    return out


def plot(rows: list[dict], path: Path, conditions: str | None = None):
    """A log-log panel per cost against n, both streams, each labelled with its fitted
    growth exponent; the title says what was measured and how. Returns the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [("add_mean_us", "add, mean (µs)"), ("remove_median_ms", "removal, median (ms)"),
              ("readout_us", "readout, one query (µs)"), ("bytes_per_token", "bytes / token"),
              ("sklearn_retrain_ms", "scikit-learn retrain (ms)")]
    exps = exponents(rows)
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 3.6))
    for ax, (m, label) in zip(axes, panels, strict=True):
        for stream, mark in (("redundant", "o-"), ("gaussian", "s--")):
            pts = [(r["n"], r[m]) for r in rows if r["stream"] == stream and r[m]]
            if pts:
                k = exps.get(stream, {}).get(m)
                tag = f"{stream}" + (f" (∝ n^{k:.2f})" if k is not None else "")
                ax.loglog(*zip(*pts, strict=True), mark, label=tag)
        ax.set_title(label, fontsize=10)
        ax.set_xlabel("n (tokens in the memory)")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    first = rows[0] if rows else {}
    title = (f"svattn's exact core: cost against n (d = {first.get('d', D)}, "
             f"C = {first.get('C', 0.01):g}, rbf, one BLAS thread; log-log)")
    fig.suptitle(title, fontsize=11)
    if conditions:
        fig.text(0.01, 0.005, f"conditions: {conditions}", fontsize=7, color="0.3",
                 ha="left", va="bottom")
    fig.tight_layout(rect=(0, 0.04 if conditions else 0, 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return fig


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1000, 4000, 16000, 64000])
    p.add_argument("--streams", nargs="+", default=["redundant", "gaussian"])
    p.add_argument("--C", type=float, default=0.01)
    p.add_argument("--adds", type=int, default=1000)
    p.add_argument("--removals", type=int, default=15)
    p.add_argument("--queries", type=int, default=200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--sklearn-max-n", type=int, default=16000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    p.add_argument("--plot", type=Path)
    p.add_argument("--replot", type=Path, metavar="RECORD",
                   help="measure nothing: draw --plot from the rows of a --json record")
    add_conditions(p)
    args = p.parse_args(argv)
    if args.replot is not None:
        if args.plot is None:
            p.error("--replot needs --plot PATH")
        import json

        record = json.loads(args.replot.read_text())
        plot(record["rows"], args.plot, record.get("conditions"))
        print(f"wrote {args.plot} from {args.replot}")
        return 0
    rows = []
    with threadpool_limits(1):
        warm_up()
        for n in args.sizes:
            for stream in args.streams:
                rows.append(run(stream, n, C=args.C, adds=args.adds, removals=args.removals,
                                queries=args.queries, rounds=args.rounds,
                                sklearn_max_n=args.sklearn_max_n, seed=args.seed))
                r = rows[-1]
                print(f"  {stream:9s} n={n:6d}: add {r['add_mean_us']:.0f} µs, remove "
                      f"{r['remove_median_ms']:.3f} ms, readout {r['readout_us']:.0f} µs, "
                      f"{r['bytes_per_token']:.0f} B/token", flush=True)
    exps = exponents(rows)
    print(f"\nd = {D}, C = {args.C}, rbf gamma = 1/(10·d), one BLAS thread")
    print("| stream | n | margin/error | extend tok/s | add mean / median µs | remove ms "
          "| readout µs | bytes/token | sklearn retrain ms |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        sk = "skipped" if r["sklearn_retrain_ms"] is None else f"{r['sklearn_retrain_ms']:.0f}"
        print(f"| {r['stream']} | {r['n']} | {r['margin']}/{r['error']} "
              f"| {r['extend_tok_s']:,.0f} | {r['add_mean_us']:.1f} / {r['add_median_us']:.1f} "
              f"| {r['remove_median_ms']:.3f} | {r['readout_us']:.0f} "
              f"| {r['bytes_per_token']:.0f} | {sk} |")
    print("\ngrowth exponents (cost ∝ n^k):")
    for stream, e in exps.items():
        print(f"  {stream}: " + ", ".join(
            f"{m} {v:.2f}" for m, v in e.items() if v is not None))
    if args.json:
        write_record(args.json, __file__, argv, {"conditions": args.conditions, "rows": rows,
                                                 "exponents": exps})
    if args.plot:
        plot(rows, args.plot, args.conditions)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
