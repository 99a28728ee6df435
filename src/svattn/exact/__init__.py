"""The certified core: exact float64 SVDD memory (numpy, scipy, numba; never torch).

Examples
--------
>>> import numpy as np
>>> from svattn.exact import SVDDMemory, verify_deletion
>>> mem = SVDDMemory(C=0.1)
>>> ids = mem.extend(np.random.default_rng(0).normal(size=(100, 8)))
>>> cert = mem.remove(ids[0])
>>> verify_deletion(mem, cert).ok
True
"""

from svattn.exact.certificate import (
    DeletionCertificate,
    DeletionVerification,
    commit_token,
    verify_deletion,
)
from svattn.exact.kernels import KERNELS, KernelOverflowError, default_gamma, kernel_matrix
from svattn.exact.memory import MarginSystem, SVDDMemory, UnknownTokenError

__all__ = [
    "KERNELS",
    "DeletionCertificate",
    "DeletionVerification",
    "KernelOverflowError",
    "MarginSystem",
    "SVDDMemory",
    "UnknownTokenError",
    "commit_token",
    "default_gamma",
    "kernel_matrix",
    "solve_svdd",
    "verify_deletion",
]


def __getattr__(name: str):
    # the oracle is imported lazily: it pulls in the QP solver
    if name == "solve_svdd":
        from svattn.exact.oracle import solve_svdd

        return solve_svdd
    raise AttributeError(f"module 'svattn.exact' has no attribute {name!r}")
