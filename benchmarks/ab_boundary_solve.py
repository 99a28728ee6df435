"""A/B of one boundary's margin solve and readout on two source trees (CPU, training).

Each run is its own process on one tree's ``src`` (:mod:`ab_trees`, one thread). It
builds ``P`` = 64 kernel problems of ``n`` = 128 float32 keys of width 64 (the 3.22M
LM's boundary memories: 16 sequences x 4 heads, budget 64 + chunk 64) and, for each
margin-set share in ``--shares``, times (medians of ``--reps``):

* ``solve``: :func:`svattn.nn.margin.solve_system` in its CPU eager form (the system
  gathered to the largest ``|S|``, factored, solved: what each boundary's partition
  ends with) plus one adjoint solve on its factors (what the backward adds);
* ``readout``: :func:`svattn.nn.readout.readout_fused` forward and backward for 64
  queries per problem, with alpha positive on the same share of the keys.

At initialisation every key of these memories is in ``S``; after a few hundred
training steps the share is ~0.3–0.4 (the largest of a batch 0.4–0.7). Reported per
run the medians in ms and, per share, the ratios B / A of each pair (only ratios
within a pair mean anything on a shared machine).

Usage (the tree before a change checked out with ``git worktree add ../base REV``)::

    python benchmarks/ab_boundary_solve.py --a ../base --b . --pairs 3 \\
        --json results/ab_boundary_solve.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_trees import median_ratios, run_pairs, tree_fields  # noqa: E402
from bench_records import add_conditions, write_record  # noqa: E402

P, N, D, L = 64, 128, 64, 64


def _median_ms(fn, reps: int) -> float:
    fn()  # warm (compiled code loads on first use)
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return round(1e3 * statistics.median(times), 4)


def worker(shares: list[float], reps: int, seed: int) -> dict:
    """Median ms of the solve and of the readout at each share (module docstring)."""
    import torch

    from svattn.nn.batched import kernel_problem
    from svattn.nn.margin import solve_system
    from svattn.nn.readout import readout_fused

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(seed)
    X = 0.3 * torch.randn(P, N, D, generator=g)
    K, d, _ = kernel_problem(X, torch.ones(P, N, dtype=torch.bool), "rbf", 1.0 / D)
    q = torch.randn(P // 4, 4, L, D, generator=g, requires_grad=True)
    k = X.view(P // 4, 4, N, D).clone().requires_grad_(True)
    v = torch.randn(P // 4, 4, N, D, generator=g, requires_grad=True)
    out = {}
    for share in shares:
        S = torch.rand(P, N, generator=g) < share
        S[:, 0] = True
        E = torch.zeros_like(S)

        def solve(S=S, E=E):
            _, _, f = solve_system(K, d, S, E, 1.0 / 16, 1e-3, 0, True)
            if hasattr(f, "solve"):  # the backward's adjoint solve
                f.solve(f.zs[-1])
            else:  # trees before Factors.solve: LU factors only
                torch.linalg.lu_solve(f.LU, f.piv, f.zs[-1])

        alpha = torch.where(S, torch.rand(P, N, generator=g) + 0.1, 0.0)
        alpha = (alpha / alpha.sum(-1, keepdim=True)).view(P // 4, 4, N).requires_grad_(True)

        def read(alpha=alpha):
            o = readout_fused(q, k, v, alpha, "rbf", 1.0 / D)
            o.sum().backward()

        out[f"{share:g}"] = {"solve_ms": _median_ms(solve, reps),
                             "readout_ms": _median_ms(read, reps)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--a", type=Path, help="the tree before (the baseline)")
    p.add_argument("--b", type=Path, help="the tree after")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--shares", type=float, nargs="+", default=[1.0, 0.6, 0.35])
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path)
    add_conditions(p)
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if any(not 0 < s <= 1 for s in args.shares):
        p.error(f"--shares must lie in (0, 1], got {args.shares}")
    if args.worker:
        print(json.dumps(worker(args.shares, args.reps, args.seed)))
        return 0
    if args.a is None or args.b is None:
        p.error("--a and --b are required")
    cmd = [str(Path(__file__).resolve()), "--worker", "--reps", str(args.reps), "--seed",
           str(args.seed), "--shares", *map(str, args.shares)]

    last_a: dict = {}

    def show(i: int, side: str, r: dict) -> None:
        if side == "a":
            last_a.update(r)
            return
        print(f"pair {i + 1}/{args.pairs}: " + "  ".join(
            f"share {s}: solve {last_a[s]['solve_ms']:.2f} -> {r[s]['solve_ms']:.2f} ms, "
            f"readout {last_a[s]['readout_ms']:.2f} -> {r[s]['readout_ms']:.2f}"
            for s in r), flush=True)

    runs = run_pairs(args.a, args.b, cmd, args.pairs, show)
    ratios = median_ratios(runs, ("solve_ms", "readout_ms"))
    print(json.dumps({"median_ratio_b_over_a": ratios}))
    if args.json:
        write_record(args.json, __file__, argv, {
            **tree_fields(args.a, args.b),
            "conditions": args.conditions, "problems": {"P": P, "n": N, "D": D, "queries": L},
            "median_ratio_b_over_a": ratios, "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
