"""Compile (or load from numba's disk cache) the batched training solver's CPU kernels.

The exact core's kernels compile in :mod:`svattn.exact.compile_kernels`; the batched
solver (:mod:`svattn.nn`: FISTA's partition loop, the repair, the verified finish, the
compact system and the readout) has kernels of its own, which a first training step or
a first ``svattn generate`` of a hybrid model otherwise compiles inside the run. ``make
setup`` runs both, so that no first operation and no timing contains compile time.

Usage::

    python -m svattn.mixers.compile_kernels
"""

from __future__ import annotations

import time

import torch

from svattn.mixers.hybrid import HybridSVAttention
from svattn.nn import SolverOptions, sv_attention


def compile_all() -> float:
    """Run the batched solver forward and backward on tiny inputs in the dtypes and
    finishes training and inference use; return seconds."""
    t0 = time.perf_counter()
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        for solver in (SolverOptions(), SolverOptions(finish="approximate", refine=0),
                       SolverOptions(finish="approximate", refine=2, ridge_steps=1)):
            q, k, v = (torch.randn(2, 2, 12, 4, generator=gen, dtype=dtype, requires_grad=True)
                       for _ in range(3))
            for causal in (False, True):
                out = sv_attention(q, k, v, C=0.25, solver=solver, is_causal=causal)
                out.sum().backward()
            for policy in ("support", "full"):
                layer = HybridSVAttention(8, 2, chunk=4, C=0.25, policy=policy,
                                          solver=solver).to(dtype)
                x = torch.randn(2, 12, 8, generator=gen, dtype=dtype, requires_grad=True)
                layer(x).sum().backward()
                with torch.no_grad():
                    layer.eval()(x)
    return time.perf_counter() - t0


def main() -> int:
    seconds = compile_all()
    print(f"svattn: the batched solver's compiled kernels are ready ({seconds:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
