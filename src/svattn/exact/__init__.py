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

import importlib
import importlib.abc
import importlib.util
import sys

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


# Where issue #38 moved the modules of the flat layout (0c63920 and before): a pickle
# names its classes by module (a memory's or a fitted svattn.SVDD's state is a
# ``svattn.exact.state.SlotState``), so the old names import the moved modules.
MOVED = {"state": "core.state", "states": "core.kktsets", "results": "core.errors",
         "kernels": "core.kernels", "gram": "core.gram", "cache": "core.cache",
         "hashes": "core.hashes", "conventions": "core.conventions",
         "outcome": "core.outcome", "backend": "backends.protocol",
         "reference": "backends.reference", "compiled": "backends.compiled",
         **{f"compiled.{m}": f"backends.compiled.{m}" for m in (
             "checks", "codes", "columns", "events", "linalg", "reserve", "segments")},
         **{m: f"operations.{m}" for m in (
             "batch", "health", "ingest", "rollback", "solver", "validation")},
         **{m: f"records.{m}" for m in (
             "audit", "certificate", "fileformat", "receipts", "signing")},
         **{m: f"auditor.{m}" for m in ("logcheck", "persist", "recovery", "verify")}}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports ``svattn.exact.<old>`` as the module it moved to (:data:`MOVED`): the same
    module object, so its classes are the ones today's code uses. First on
    ``sys.meta_path`` (a moved package's submodule would otherwise be found by path under
    the alias and loaded twice); it answers only the names of :data:`MOVED`."""

    def find_spec(self, fullname, path, target=None):
        old = fullname.removeprefix(__name__ + ".")
        if old != fullname and old in MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        return importlib.import_module(f"{__name__}.{MOVED[spec.name[len(__name__) + 1:]]}")

    def exec_module(self, module) -> None:
        pass

    def get_code(self, fullname):  # ``python -m`` an old name: "No code object available"
        return None


if not any(isinstance(f, _MovedModules) for f in sys.meta_path):
    sys.meta_path.insert(0, _MovedModules())


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
