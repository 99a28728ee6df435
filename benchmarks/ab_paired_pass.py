"""A/B: does the pass timed just before a support forget (``bench_large_support.py``'s
and ``bench_real_data.py``'s paired timing) speed the forget up by warming the caches?

The same support forgets (victims drawn from one seed) on two deep copies of one fit
(clustered rows, d = 8, ν = 0.05, γ = 0.1; one BLAS thread), one with
``bench_stream_speed.floor_pass`` run just before and just after each forget, one
without, in alternating order run after run; each run's median forget time, and per
run the median with ÷ the median without. Also, per run with the passes, the forgets
whose certificate reports more events than the tokens that changed set (a token that
changed set and back: ``bench_stream_speed.margin_joins`` counts its join).

    python benchmarks/ab_paired_pass.py 8000 40 8   # rows, forgets per run, runs
"""

from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).parent))
from bench_stream_speed import floor_pass, margin_joins  # noqa: E402
from streams import clustered_outliers  # noqa: E402
from svattn import SVDD  # noqa: E402


def run(model: SVDD, forgets: int, paired: bool, seed: int) -> tuple[np.ndarray, list]:
    """``forgets`` support forgets of a copy of ``model``: their times, and the
    ``(net, joins, moved, events)`` of each where events − 1 ≠ tokens moved."""
    m = copy.deepcopy(model)
    rng = np.random.default_rng(seed)
    times, odd = [], []
    for _ in range(forgets):
        victim = int(m.support_[rng.integers(len(m.support_))])
        before = m.memory_.partition()
        if paired:
            floor_pass(m.memory_)
        t = time.perf_counter()
        receipt = m.forget(indices=[victim])
        times.append(time.perf_counter() - t)
        if paired:
            floor_pass(m.memory_)
        after = m.memory_.partition()
        events = receipt.certificates[0].n_events
        where = {t: k for k, ts in after.items() for t in ts}
        moved = sum(where.get(t, k) != k for k, ts in before.items() for t in ts
                    if t != victim)
        if moved != events - 1:
            odd.append((*margin_joins(before, after, events), moved, events))
    return np.array(times), odd


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    n, forgets, runs = (int(a) for a in args)
    with threadpool_limits(1):
        model = SVDD(nu=0.05, gamma=0.1).fit(clustered_outliers(n, 8, seed=0))
        part = model.memory_.partition()
        print(f"n = {n}: margin {len(part['margin'])}, error {len(part['error'])}")
        med = {True: [], False: []}
        for r in range(runs):
            for paired in ((True, False) if r % 2 == 0 else (False, True)):
                t, odd = run(model, forgets, paired, seed=r)
                med[paired].append(float(np.median(t)))
                print(f"run {r} {'with' if paired else 'without'} passes: median "
                      f"{1e3 * np.median(t):.2f} ms, mean {1e3 * t.mean():.2f} ms"
                      + (f"; (net, joins, moved, events) where events − 1 ≠ moved: {odd}"
                         if paired and odd else ""), flush=True)
    ratio = np.array(med[True]) / np.array(med[False])
    print(f"with ÷ without, per run: {np.round(ratio, 3).tolist()}; "
          f"median {np.median(ratio):.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
