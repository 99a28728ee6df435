"""A third kernel defined only in the tests, to hold the kernel-object contract
(``svattn.exact.core.kernels.Kernel``): one class, registered, and nothing else edited."""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager

from svattn.exact.core import kernels
from svattn.exact.core.kernels import Kernel


class DampedExpKernel(Kernel):
    """``k(x, y) = exp(gamma·x·y − (gamma/4)(‖x‖² + ‖y‖²))``: the exp kernel times the
    rank-one positive factor ``f(x) f(y)``, ``f = exp(−gamma‖·‖²/4)`` (positive
    definite); neither unit diagonal nor translation invariant, ``log k(x, x) =
    (gamma/2)‖x‖²``. No compiled variant."""

    name = "damped-exp"

    def default_gamma(self, dim: int) -> float:
        return 1.0 / math.sqrt(dim)

    def dot_form(self, gamma: float) -> tuple[float, float]:
        return gamma, 0.25 * gamma


TOY = DampedExpKernel()


@contextmanager
def registered(kernel: Kernel = TOY) -> Iterator[Kernel]:
    """``kernel`` registered for the block (the registry as it was afterwards)."""
    kernels.register_kernel(kernel)
    try:
        yield kernel
    finally:
        del kernels._REGISTRY[kernel.name]
