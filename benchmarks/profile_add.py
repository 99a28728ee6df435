"""Where a per-token ``add``'s time goes, by kind of add and part by part, at a given n.

Builds a memory of ``--n`` − ``--adds`` keys of a stream (d = 64, C = 0.01, rbf
gamma = 1/(10·d), one BLAS thread) with ``extend`` (untimed), then adds the next
``--adds`` keys one public ``add`` each, with the parts of each add timed by wrapping
the functions the add path calls. Each add is one of three kinds:

* *reserve*: the streaming fast path stored it (``fastpath.store_reserve``);
* *driven*: it lay outside the description and was driven in (``solver.add_one``);
* *general*: the fast path declined a row that then landed in the reserve set (a
  standby refresh was due, or the slot table grew).

For each kind: how many, its share of all the adds' time, its median and mean. For
driven adds, the mean of each part, disjoint: the checkpoint, the commitment, the fast
path's attempt, the general path's scoring (``reserve_block``), the row's store
(``store_row``) and bookkeeping (``record_rows``), the token's own kernel column
(``alloc_col``), the drive (the compiled event loop), the finish (polish and KKT
check), the standby refresh, the health and audit hooks; "other" is the rest (Python
between these calls). Beside them, two floors timed on the same memory: the key's
kernel row against the cached columns and its g (``compiled.reserve.reserve_row``,
what ``bench_stream_speed.py`` calls the add's floor), and the token's three digests
(``fastpath.token_digests``: set-hash summand, row hash, commitment), which every add
computes in Python. Medians, means in µs. The wrappers themselves add to what they
time (~3 µs to a reserve add's median, ~60 µs to a driven add's, in one check at 4k):
read the split here, and the bare figures in ``bench_stream_speed.py``.

Usage::

    python benchmarks/profile_add.py --n 4000 --json results/profile_add_4k.json
"""

from __future__ import annotations

import argparse
import collections
import sys
import time
import timeit
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))
import svattn.exact.backends.compiled as backend  # noqa: E402
from bench_records import add_conditions, write_record  # noqa: E402
from bench_stream_speed import G10, floor_time, keys, warm_up  # noqa: E402
from call_timing import time_calls  # noqa: E402
from svattn.exact import SVDDMemory, fastpath, memory  # noqa: E402
from svattn.exact.operations import ingest, rollback, solver  # noqa: E402

# the parts of a driven add, disjoint (none calls another), in the order the add runs
PARTS = (
    (rollback, "checkpoint"), (memory, "commit_tokens"), (fastpath, "store_reserve"),
    (backend, "reserve_block"), (backend, "store_row"), (solver, "record_rows"),
    (backend, "alloc_col"), (backend, "drive"), (solver, "finish_op"),
    (backend, "refresh_standby"), (SVDDMemory, "_after_op"), (fastpath, "mark_tokens"),
)
# what tells the kinds apart (timed too, but not parts: each holds some of them)
MARKERS = ((solver, "add_one"), (ingest, "add_rows"))


def profile(stream: str, n: int, adds: int, seed: int) -> dict:
    X = keys(stream, n, seed)
    mem = SVDDMemory(0.01, gamma=G10)
    mem.extend(X[: n - adds])
    acc: dict[str, list[float]] = collections.defaultdict(list)
    for owner, name in PARTS + MARKERS:
        time_calls(owner, name, acc)
    kinds: dict[str, list[tuple[float, dict]]] = collections.defaultdict(list)
    floors = []
    for x in X[n - adds:]:
        floors.append(floor_time(mem, x))
        acc.clear()
        t = time.perf_counter()
        mem.add(x)
        total = time.perf_counter() - t
        kind = ("driven" if "add_one" in acc else "general" if "add_rows" in acc
                else "reserve")
        kinds[kind].append((total, {k: sum(v) for k, v in acc.items()}))
    digests = [min(timeit.repeat(lambda x=x, i=i: fastpath.token_digests(i, x, None, None),
                                 number=1, repeat=3))
               for i, x in enumerate(X[n - adds:])]  # after the adds: apart from their timing
    grand = sum(t for rows in kinds.values() for t, _ in rows)
    us = 1e6
    out: dict = {"stream": stream, "n": len(mem), "margin": mem.view.n_margin,
                 "adds": adds, "mean_add_us": us * grand / adds,
                 "floor_kernel_row_us": us * float(np.median(floors)),
                 "floor_digests_us": us * float(np.median(digests)), "kinds": {}}
    for kind, rows in sorted(kinds.items()):
        times = np.array([t for t, _ in rows])
        entry = {"count": len(rows), "share_of_time": float(times.sum() / grand),
                 "median_us": us * float(np.median(times)), "mean_us": us * float(times.mean())}
        if kind == "driven":
            parts = {name: us * float(np.mean([p.get(name, 0.0) for _, p in rows]))
                     for _, name in PARTS}
            parts["other (Python between the parts)"] = entry["mean_us"] - sum(parts.values())
            entry["parts_mean_us"] = parts
        out["kinds"][kind] = entry
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, default=4000)
    p.add_argument("--adds", type=int, default=1500)
    p.add_argument("--stream", action="append", choices=("redundant", "gaussian"))
    p.add_argument("--seed", type=int, default=0)
    add_conditions(p)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    results = []
    with threadpool_limits(1):
        warm_up()  # compiled code loaded untimed
        for stream in args.stream or ["redundant", "gaussian"]:
            res = profile(stream, args.n, args.adds, args.seed)
            results.append(res)
            print(f"{stream} n = {res['n']} ({res['margin']} margin tokens), {args.adds} adds: "
                  f"mean {res['mean_add_us']:.1f} µs; floors: kernel row "
                  f"{res['floor_kernel_row_us']:.1f} µs, three digests "
                  f"{res['floor_digests_us']:.1f} µs")
            for kind, e in res["kinds"].items():
                print(f"  {kind:8s} {e['count']:5d} adds, {100 * e['share_of_time']:5.1f} % of "
                      f"the time, median {e['median_us']:7.1f} µs, mean {e['mean_us']:7.1f} µs")
                for part, v in sorted(e.get("parts_mean_us", {}).items(), key=lambda kv: -kv[1]):
                    print(f"      {v:8.1f} µs  {part}")
    if args.json:
        write_record(args.json, __file__, argv, {"conditions": args.conditions,
                                                  "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
