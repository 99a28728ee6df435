"""Per-operation trace of the exact memory on a fixed seeded stream: after each add or
removal, the state digest, the removal's certificate (partition, KKT residual, events,
uniqueness, digest), the health record and the counters, hashed into one line per
operation. Two checkouts that print the same final hash computed every one of these
numbers bit for bit alike (issue #38: "behaviour and every number unchanged")::

    PYTHONPATH=src python benchmarks/op_trace.py --backend compiled --ops 2000
    PYTHONPATH=src python benchmarks/op_trace.py --backend reference --ops 2000

The stream is :func:`benchmarks.soak_exact`'s (``streams.redundant_stream``, the live
set drifting around ``--live``), with a small gamma so that most support tokens are
margin tokens (removals then take every path: segments, the kept factor, the event
loop). ``--out FILE`` writes the per-operation hashes.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

import numpy as np
from threadpoolctl import threadpool_limits

sys.path.insert(0, str(Path(__file__).resolve().parent))
from streams import redundant_stream  # noqa: E402
from svattn.exact import SVDDMemory  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", type=int, default=2000)
    ap.add_argument("--live", type=int, default=400)
    ap.add_argument("--d", type=int, default=8)
    ap.add_argument("--C", type=float, default=0.02)
    ap.add_argument("--gamma-d", type=float, default=0.03)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", choices=("compiled", "reference"), default="compiled")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(args.seed)
    pool = redundant_stream(args.ops + args.live, args.d, seed=args.seed)
    mem = SVDDMemory(args.C, gamma=1.0 / (args.gamma_d * args.d), backend=args.backend)
    total = hashlib.sha256()
    lines = []
    with threadpool_limits(1):
        mem.extend(pool[: args.live])
        nxt = args.live
        for _ in range(args.ops):
            p_add = 0.5 + 0.4 * np.tanh((args.live - len(mem)) / (0.05 * args.live))
            if rng.random() < p_add:
                record = f"add {mem.add(pool[nxt])}"
                nxt += 1
            else:
                sup = rng.random() < 0.3
                ids = mem.support_ids() if sup else mem.ids
                c = mem.remove(int(ids[rng.integers(len(ids))]))
                record = (f"remove {c.removed_id} {c.partition_after} "
                          f"{c.kkt_residual_after.hex()} {c.n_events} {c.unique_optimum} "
                          f"{c.state_digest}")
            h = mem.health
            record += (f" | {mem.state_digest()} {h.cond1.hex()} {h.inv_residual.hex()} "
                       f"{h.n_checks} {h.n_drift_refactorizations} "
                       f"{mem.n_refactorizations} {mem.n_resolves}")
            line = hashlib.sha256(record.encode()).hexdigest()[:16]
            lines.append(line)
            total.update(line.encode())
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")
    print(f"{args.backend}: {args.ops} ops, n={len(mem)}, |S|={mem.view.n_margin}, "
          f"refactorizations {mem.n_refactorizations}, health checks {mem.health.n_checks}, "
          f"trace {total.hexdigest()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
