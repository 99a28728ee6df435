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

from svattn.exact.certificate import DeletionCertificate, commit_token
from svattn.exact.kernels import KERNELS, KernelOverflowError, default_gamma, kernel_matrix
from svattn.exact.memory import MarginSystem, SVDDMemory, UnknownTokenError
from svattn.exact.state import SlotState
from svattn.exact.verify import DeletionVerification, verify_deletion

__all__ = [
    "KERNELS",
    "DeletionCertificate",
    "DeletionVerification",
    "KernelOverflowError",
    "MarginSystem",
    "SVDDMemory",
    "SlotState",
    "UnknownTokenError",
    "commit_token",
    "default_gamma",
    "kernel_matrix",
    "solve_svdd",
    "verify_deletion",
]


from svattn.exact.oracle import solve_svdd
