"""How the batched SV memory tracks the exact one: partition agreement and readout
deviation against FISTA iterations, ridge, and iterated-ridge steps.

Run: ``.venv/bin/python benchmarks/batched_vs_exact.py`` (CPU, ~1 min).
Layout [B, H, T, D]; exact = ``mode="exact"`` (float64 certified solver).
"""

from __future__ import annotations

import argparse
import time

import torch

from svattn.nn import SolverOptions, sv_attention_state


def keys(kind: str, B: int, H: int, T: int, D: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if kind == "random":
        return torch.randn(B, H, T, D, generator=g, dtype=torch.float64)
    centers = 3.0 * torch.randn(B, H, 4, D, generator=g, dtype=torch.float64)
    which = torch.randint(0, 4, (B, H, T, 1), generator=g).expand(B, H, T, D)
    noise = 0.5 * torch.randn(B, H, T, D, generator=g, dtype=torch.float64)
    return centers.gather(2, which) + noise


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--T", type=int, default=256)
    ap.add_argument("--C", type=float, default=0.02)
    args = ap.parse_args()
    B, H, T, D = 2, 4, args.T, 16
    print(f"B={B} H={H} T={T} D={D} C={args.C} kernel=rbf")
    print(f"{'keys':9} {'dtype':7} {'iters':>5} {'refine':>6} {'ridge':>7} {'steps':>5} "
          f"{'partition':>9} {'max|da|':>9} {'max|do|':>9} {'used':>5} {'t(s)':>6}")  # fmt: skip
    for kind in ("random", "clustered"):
        k = keys(kind, B, H, T, D, 0)
        q = keys(kind, B, H, 64, D, 1)
        v = torch.randn(B, H, T, D, generator=torch.Generator().manual_seed(2), dtype=k.dtype)
        o_ex, a_ex, p_ex, _ = sv_attention_state(q, k, v, C=args.C, mode="exact")
        grid = [(it, rf, r, st, dt) for dt in (torch.float64, torch.float32)
                for it, rf in ((10, 0), (30, 0), (100, 0), (300, 0), (10, 10), (30, 10))
                for r, st in ((1e-3, 0),)]  # fmt: skip
        grid += [(300, 10, r, st, torch.float64) for r in (1e-2, 1e-3, 1e-4, 0.0) for st in (0, 1)]
        for it, rf, r, st, dt in grid:
            if r == 0.0 and st:
                continue
            t0 = time.perf_counter()
            o, a, p, info = sv_attention_state(
                q.to(dt), k.to(dt), v.to(dt), C=args.C,
                solver=SolverOptions(ridge=r, ridge_steps=st, max_iter=it, refine=rf),
            )  # fmt: skip
            dt_s = time.perf_counter() - t0
            agree = ((p.margin == p_ex.margin) & (p.error == p_ex.error)).double().mean()
            da = (a.double() - a_ex).abs().max()
            do = (o.double() - o_ex).abs().max()
            row = f"{kind:9} {str(dt)[6:]:7} {it:5d} {rf:6d} {r:7.0e} {st:5d} {float(agree):9.4f} "
            print(row + f"{float(da):9.2e} {float(do):9.2e} {info.fista_iters:5d} {dt_s:6.2f}")


if __name__ == "__main__":
    main()
