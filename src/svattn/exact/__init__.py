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

from svattn.exact.core.kernels import KERNELS, KernelOverflowError, default_gamma, kernel_matrix
from svattn.exact.core.state import SlotState
from svattn.exact.memory import MarginSystem, OperationError, SVDDMemory, UnknownTokenError
from svattn.exact.records.certificate import DeletionCertificate, commit_token

__all__ = [
    "KERNELS",
    "DeletionCertificate",
    "DeletionVerification",
    "KernelOverflowError",
    "MarginSystem",
    "OperationError",
    "SVDDMemory",
    "SlotState",
    "UnknownTokenError",
    "commit_token",
    "default_gamma",
    "kernel_matrix",
    "solve_svdd",
    "verify_deletion",
]


def __getattr__(name: str):
    # the auditor's side on first use: the oracle pulls in scipy.sparse and the QP
    # solver (~0.3 s), which the solver itself never needs
    if name == "solve_svdd":
        from svattn.exact.oracle import solve_svdd

        return solve_svdd
    if name in ("verify_deletion", "DeletionVerification"):
        from svattn.exact.auditor import verify

        return getattr(verify, name)
    raise AttributeError(f"module 'svattn.exact' has no attribute {name!r}")
