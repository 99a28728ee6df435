"""The uniqueness test beside tied tokens: on the kept factor against the whole test.

A support forget that leaves tokens tied at g = 0 (near-copies of margin tokens, which
the MIMIC-III demo vitals hold: forward- and median-filled hours) certifies uniqueness
on the margin set together with the tied tokens. The compiled backend appends the tied
tokens' rows to its kept factor of the margin block
(``compiled.tied_positive_definite``); the whole test (the reference's) gathers the
block from the keys and factors it whole. This runs ``--forgets`` support forgets of
``SVDD(nu, gamma)`` fitted on the distinct vitals rows (each row once, in file order)
and, after each one that leaves a tied token, times both on the same state in one run
(the kept factor's first: the whole test leaves the state as it was), with their
verdicts; beside them every forget's time (the tie forgets' among them), so the
effect on the mean forget shows.

Usage::

    python benchmarks/bench_tied_uniqueness.py --forgets 200 \\
        --json results/bench_tied_uniqueness.json
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
from svattn import SVDD  # noqa: E402
from svattn.data.icu import load_mimic3_vitals  # noqa: E402
from svattn.exact.backends import compiled, reference  # noqa: E402
from svattn.exact.operations import solver  # noqa: E402
from svattn.exact.view import instrument  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FULL = REPO.parent / "shared" / "data" / "icu" / "mimic3_demo_vitals.csv.gz"


def run(X: np.ndarray, nu: float, gamma: float, count: int, seed: int) -> dict:
    model = SVDD(nu=nu, gamma=gamma).fit(X)
    ss = instrument(model.memory_)  # (the two tests time the core's own functions)
    rng = np.random.default_rng(seed)
    times, ties = [], []
    for k in range(count):
        victim = int(model.support_[rng.integers(len(model.support_))])
        t = time.perf_counter()
        model.forget(indices=[victim])
        times.append(time.perf_counter() - t)
        tied = compiled.tied_slots(ss, solver.fresh_g(ss, compiled), 1e-9 * ss.scale)
        if not len(tied):
            continue
        t = time.perf_counter()
        kept = compiled.tied_positive_definite(ss, tied)
        t_kept = time.perf_counter() - t
        t = time.perf_counter()
        whole = reference.tied_block_test(ss, tied, compiled.positive_definite)
        t_whole = time.perf_counter() - t
        ties.append({"forget": k, "tied": int(len(tied)), "margin": int(ss.nS),
                     "kept_factor_ms": 1e3 * t_kept, "whole_test_ms": 1e3 * t_whole,
                     "verdict": bool(kept), "whole_verdict": bool(whole),
                     "forget_ms": 1e3 * times[-1]})
    ms = 1e3 * np.array(times)
    at = [t["forget"] for t in ties]
    rest = np.delete(ms, at)
    return {"n": len(X), "nu": nu, "gamma": gamma, "forgets": count,
            "forget_median_ms": float(np.median(ms)), "forget_mean_ms": float(ms.mean()),
            "forget_mean_without_tie_forgets_ms": float(rest.mean()),
            "tie_forgets": len(ties), "ties": ties,
            "verdicts_agree": all(t["verdict"] == t["whole_verdict"] for t in ties),
            # the whole test / the kept factor's, median over the tie forgets
            "whole_over_kept_median": float(np.median(
                [t["whole_test_ms"] / t["kept_factor_ms"] for t in ties])) if ties else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", type=Path, default=FULL)
    p.add_argument("--nu", type=float, default=0.05)
    p.add_argument("--gamma", type=float, default=1.0)
    p.add_argument("--forgets", type=int, default=200)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="also write the record (and this command) here")
    add_conditions(p)
    args = p.parse_args(argv)
    keys = np.ascontiguousarray(load_mimic3_vitals(args.data).standardised().keys)
    keys = keys[np.sort(np.unique(keys, axis=0, return_index=True)[1])]
    with threadpool_limits(1):
        warm = SVDD(nu=0.2, gamma=args.gamma).fit(keys[:600])  # compile, untimed
        for _ in range(3):
            warm.forget(indices=[int(warm.support_[0])])
        body = run(keys, args.nu, args.gamma, args.forgets, args.seed)
    for t in body["ties"]:
        print(f"forget {t['forget']}: {t['tied']} tied beside {t['margin']} margin tokens: "
              f"kept factor {t['kept_factor_ms']:.1f} ms ({t['verdict']}), whole test "
              f"{t['whole_test_ms']:.0f} ms ({t['whole_verdict']})")
    print(f"{body['forgets']} support forgets of {body['n']} distinct vitals rows: median "
          f"{body['forget_median_ms']:.1f} ms, mean {body['forget_mean_ms']:.1f} ms "
          f"({body['forget_mean_without_tie_forgets_ms']:.1f} without the "
          f"{body['tie_forgets']} that left tied tokens)")
    if args.json:
        write_record(args.json, __file__, argv, {"conditions": args.conditions, **body})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
