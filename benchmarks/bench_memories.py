"""Streaming throughput of every memory in ``svattn.memory.MEMORIES`` (CPU, one run).

Each memory streams ``T`` tokens (keys, values and the stream's own queries,
``d = 64``) through ``write_many`` after a short warm-up, then answers 256
reads, on one thread. No memory holds more than O(T·d) floats. The exact SV memory is
time-capped (``--sv-seconds``): it reports the tokens it reached.

Usage::

    .venv/bin/python benchmarks/bench_memories.py [--tokens 16384] [--dim 64] [--budget 256]
"""

from __future__ import annotations

import os

# One BLAS/torch thread: the per-token work is small matrix products, for which
# thread start-up dominates (and shared machines make it erratic).
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from svattn.memory import MEMORIES  # noqa: E402


def bench(name: str, keys, values, queries, budget: int, sv_seconds: float) -> dict:
    t, d = keys.shape
    opts = {"oracle_queries": queries[-16:]} if name == "h2o_oracle" else {}
    mem = MEMORIES[name](dim=d, value_dim=values.shape[1], budget=budget, **opts)
    mem.write_many(keys[:256], values[:256], queries[:256])  # warm-up (lazy inits)
    mem.reset()
    block = 256 if name == "sv" else t
    start = time.perf_counter()
    done = 0
    while done < t:
        mem.write_many(keys[done : done + block], values[done : done + block],
                       queries[done : done + block])
        done = min(t, done + block)
        if name == "sv" and time.perf_counter() - start > sv_seconds:
            break
    write_s = time.perf_counter() - start
    start = time.perf_counter()
    out = mem.read(queries[-256:])
    read_s = time.perf_counter() - start
    assert np.all(np.isfinite(out))
    return {"name": name, "tokens": done, "tok_per_s": done / write_s,
            "reads_per_s": 256 / read_s, "tokens_kept": mem.tokens_kept()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=16384)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--budget", type=int, default=256)
    p.add_argument("--sv-seconds", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)
    keys = rng.normal(size=(args.tokens, args.dim))
    values = rng.normal(size=(args.tokens, args.dim))
    queries = rng.normal(size=(args.tokens, args.dim))
    print(f"T = {args.tokens}, d = dv = {args.dim}, budget = {args.budget}, float64, CPU, 1 thread")
    print(f"{'memory':<12}{'tokens':>8}{'write tok/s':>14}{'read q/s':>12}{'tokens_kept':>12}")
    for name in MEMORIES:
        r = bench(name, keys, values, queries, args.budget, args.sv_seconds)
        print(f"{r['name']:<12}{r['tokens']:>8}{r['tok_per_s']:>14,.0f}"
              f"{r['reads_per_s']:>12,.0f}{r['tokens_kept']:>12}")


if __name__ == "__main__":
    main()
