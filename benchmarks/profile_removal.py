"""Where a certified removal's time goes, part by part, at a given n.

Builds a memory of the redundant stream (d = 64, C = 0.01, rbf gamma = 1/(10·d), one
BLAS thread) holding n tokens, then removes ``--removals`` random margin tokens (each
key added back, timed apart), with the parts of each removal timed by wrapping the
functions :meth:`SVDDMemory.remove` calls: the compiled segments call
(``remove_by_segments``: its passes over the margin block, the error-sum sync, the
end point's checks, the certificate's facts), the checkpoint (copies of the per-slot
vectors), the copy check (``copies_outside``, one comparison of every row hash), the
set sizes before, the certificate's facts after (the digest) and the health and audit
hooks. Beside them: one pass over the margin block (``KC[:n, :|S|] @ w``), the unit a
removal's segments are made of. Medians, µs; the rest of a removal is Python between
these calls.

Usage::

    python benchmarks/profile_removal.py --n 64000 --json results/profile_removal_64k.json
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
import svattn.exact.backends.compiled as backend  # noqa: E402
from bench_records import add_conditions, write_record  # noqa: E402
from bench_stream_speed import G10, keys, removal_floor, warm_up  # noqa: E402
from call_timing import time_calls  # noqa: E402
from svattn.exact import SVDDMemory  # noqa: E402
from svattn.exact.core.state import SlotState  # noqa: E402
from svattn.exact.operations import rollback, solver  # noqa: E402


def profile(n: int, removals: int, seed: int) -> dict:
    mem = SVDDMemory(0.01, gamma=G10)
    mem.extend(keys("redundant", n, seed))
    acc: dict[str, list[float]] = collections.defaultdict(list)
    for name in ("set_sizes", "certificate_facts"):
        time_calls(solver, name, acc)
    time_calls(rollback, "checkpoint", acc)
    time_calls(backend, "remove_by_segments", acc)
    time_calls(SlotState, "copies_outside", acc)
    time_calls(SVDDMemory, "_after_op", acc)
    rng = np.random.default_rng(seed + 1)
    total, add_back = [], []
    per_removal: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(removals):
        tid = int(rng.choice(mem.partition()["margin"]))
        key = mem.view.key_of(tid)
        mark = {k: len(v) for k, v in acc.items()}
        t = time.perf_counter()
        mem.remove(tid)
        total.append(time.perf_counter() - t)
        for k, v in acc.items():  # the parts' calls made by this removal, summed
            per_removal[k].append(sum(v[mark.get(k, 0):]))
        t = time.perf_counter()
        mem.add(key)
        add_back.append(time.perf_counter() - t)
    passes = [removal_floor(mem)[0] for _ in range(20)]
    us = 1e6
    parts = {k: us * float(np.median(v)) for k, v in per_removal.items()}
    return {"n": len(mem), "margin": mem.view.n_margin, "removal_us": us * float(np.median(total)),
            "add_back_us": us * float(np.median(add_back)),
            "one_margin_pass_us": us * float(np.median(passes)), "parts_us": parts}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=64000)
    p.add_argument("--removals", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    add_conditions(p)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    with threadpool_limits(1):
        warm_up()  # compiled code loaded untimed
        res = profile(args.n, args.removals, args.seed)
    print(f"n = {res['n']}, {res['margin']} margin tokens: removal {res['removal_us']:.0f} µs "
          f"(median), add-back {res['add_back_us']:.0f} µs, one pass over the margin block "
          f"{res['one_margin_pass_us']:.0f} µs")
    for k, v in sorted(res["parts_us"].items(), key=lambda kv: -kv[1]):
        print(f"  {v:8.0f} µs  {k}")
    if args.json:
        write_record(args.json, __file__, argv, {"conditions": args.conditions, **res})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
