"""Saving and loading an :class:`~svattn.exact.memory.SVDDMemory` (atomic, verified).

:func:`save` writes one safetensors file whose tensors are the solver state's
(:func:`svattn.exact.records.schema.to_tensors`: the file schema, version 5, which
holds the kernel cache's recipe, not its values, and :func:`load` rebuilds it from the
keys; versions 1-4 still load) and whose metadata carries the state's fields, its
digest, health, KKT residual, the audit-log head and checksums
(:mod:`svattn.exact.records.fileformat`). :func:`load` re-checks all of it, recomputes
the digest and the KKT residual from the loaded arrays, and requires the file
to be byte-identical to the canonical serialisation of its content, so no
flipped byte anywhere (header padding included) goes unnoticed. A loaded
memory continues bit-identically.

Writes are atomic: temporary file in the same directory, fsync, rename, fsync
of the directory. The checksums detect corruption and naive tampering; they
are not a signature. The audit log (:mod:`svattn.exact.records.audit`) anchors a state
to its hash-chained history.

Examples
--------
>>> import os, tempfile
>>> import numpy as np
>>> from svattn.exact import SVDDMemory
>>> mem = SVDDMemory(C=0.1)
>>> ids = mem.extend(np.random.default_rng(0).normal(size=(50, 3)))
>>> path = os.path.join(tempfile.mkdtemp(), "mem.safetensors")
>>> _ = save(mem, path)
>>> same = load(path)
>>> same.state_digest() == mem.state_digest(), bool((same.alpha == mem.alpha).all())
(True, True)
"""

from __future__ import annotations

import os

from svattn.exact.memory import SVDDMemory
from svattn.exact.records.fileformat import FORMAT_VERSION, StateFileError, StateVersionError


def save(memory: SVDDMemory, path: str | os.PathLike[str]) -> str:
    """Save a memory atomically to a safetensors file; return the file's SHA-256.

    Parameters
    ----------
    memory : SVDDMemory
    path : path-like
        Target file; it is replaced atomically (the old file stays intact
        when anything fails or the process dies mid-save).

    Returns
    -------
    str
        SHA-256 (hex) of the bytes written.

    Raises
    ------
    OSError
        When writing fails (disk full, permissions); the previous file is
        untouched and no temporary file is left behind.

    Examples
    --------
    >>> import os, tempfile
    >>> mem = SVDDMemory(C=0.5)
    >>> _ = mem.extend([[0.0, 1.0], [1.0, 0.0], [1.0, 1.0]])
    >>> len(save(mem, os.path.join(tempfile.mkdtemp(), "m.safetensors")))
    64
    """
    return memory.save(path)


def load(path: str | os.PathLike[str], *, audit_log: str | os.PathLike[str] | None = None
         ) -> SVDDMemory:
    """Load a memory saved by :func:`save`, verifying everything: :meth:`SVDDMemory.load`
    (its parameters, and the errors it raises).

    Examples
    --------
    >>> import os, tempfile
    >>> path = os.path.join(tempfile.mkdtemp(), "m.safetensors")
    >>> with open(path, "wb") as f:
    ...     _ = f.write(b"\\x05")
    >>> load(path)
    Traceback (most recent call last):
    ...
    svattn.exact.records.fileformat.StateFileError: ...: truncated: 1 bytes, a state file has at least 8
    """  # noqa: E501 (a doctest's exception line)
    return SVDDMemory.load(path, audit_log=audit_log)


__all__ = ["FORMAT_VERSION", "StateFileError", "StateVersionError", "load", "save"]
