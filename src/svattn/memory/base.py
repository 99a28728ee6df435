"""The streaming memory contract shared by SV-Attention and every baseline.

A streaming memory receives tokens one at a time (key ``[d]``, value
``[dv]``, optionally the token's own query ``[d]``) and answers reads
``queries [m, d] -> outputs [m, dv]`` from what it still holds.

Contract
--------
``MEMORIES[name](dim=d, value_dim=dv, budget=b, **options)`` builds one;
unknown options raise ``TypeError`` (constructors take explicit keywords).

``reset()``
    Forget everything; stream positions restart at 0.
``write(key, value, query=None)`` / ``write_many(keys, values, queries=None)``
    Append tokens. Score-based eviction (H2O, SnapKV) uses the stream's own
    queries; without them the keys stand in as queries. ``write_many`` is
    exactly a loop of ``write`` (the same kept set, the same state).
``read(queries)``
    ``[m, d] -> [m, dv]``; numpy in gives numpy (float64) out, torch in
    gives torch out (the input's dtype and device). An empty memory reads 0.
``tokens_kept()``
    Key/value pairs held (token memories) or the *equivalent* number of
    pairs, ``ceil(floats / (d + dv))`` (fixed-state memories);
    ``state_floats()`` gives the float count for every memory.
``budget``
    The hard cap on ``tokens_kept()`` where the method has one
    (``has_hard_budget``); memories without one document what ``budget``
    means for them.
``kept_positions()``
    Stream positions (0-based since the last ``reset``) still held, for
    memories that hold tokens (``holds_tokens``); others raise
    ``NotImplementedError``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import ClassVar, TypeVar

import numpy as np
import torch

ArrayT = TypeVar("ArrayT", np.ndarray, torch.Tensor)

# Queries per block in softmax reads: keeps read memory O(block · n), not O(m · n).
READ_BLOCK = 1024


def check_positive_int(name: str, value: object, minimum: int = 1) -> int:
    """Return ``value`` if it is an int ``>= minimum``, else raise ``ValueError``."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return int(value)


def as_matrix(name: str, x: object, cols: int) -> np.ndarray:
    """``x`` (numpy or torch) as a float64 ``[rows, cols]`` array, or a precise ``ValueError``."""
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu", torch.float64).numpy()
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 2 or arr.shape[1] != cols:
        raise ValueError(f"{name} must have shape [n, {cols}], got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite")
    return arr


def as_vector(name: str, x: object, size: int) -> np.ndarray:
    """``x`` (numpy or torch) as a float64 ``[size]`` array, or a precise ``ValueError``."""
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu", torch.float64).numpy()
    arr = np.asarray(x, dtype=np.float64)
    if arr.shape != (size,):
        raise ValueError(f"{name} must have shape [{size}], got {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite")
    return arr


def like(out: np.ndarray, template: object) -> np.ndarray | torch.Tensor:
    """Return ``out`` as the same kind of array as ``template`` (torch: dtype and device)."""
    if isinstance(template, torch.Tensor):
        return torch.from_numpy(out).to(device=template.device, dtype=template.dtype)
    return out


def softmax_read(
    queries: np.ndarray, keys: np.ndarray, values: np.ndarray, scale: float
) -> np.ndarray:
    """Softmax attention ``softmax(scale · Q K^T) V`` in query blocks (max-subtracted).

    ``queries [m, d]``, ``keys [n, d]``, ``values [n, dv]`` → ``[m, dv]``.
    """
    out = np.empty((queries.shape[0], values.shape[1]))
    for lo in range(0, queries.shape[0], READ_BLOCK):
        logits = queries[lo : lo + READ_BLOCK] @ keys.T  # (block, n)
        logits *= scale
        logits -= logits.max(axis=1, keepdims=True)
        np.exp(logits, out=logits)
        logits /= logits.sum(axis=1, keepdims=True)
        out[lo : lo + READ_BLOCK] = logits @ values
    return out


class StreamingMemory(ABC):
    """Base class of every streaming memory (see the module docstring for the contract).

    Subclasses implement ``_reset``, ``_write``, ``_read``, ``state_floats``
    and, if they hold tokens, ``kept_positions``. The public methods here
    validate inputs (leaving the state untouched on bad input) and convert
    between numpy and torch.
    """

    #: ``tokens_kept() <= budget`` always holds.
    has_hard_budget: ClassVar[bool] = True
    #: ``kept_positions()`` is available.
    holds_tokens: ClassVar[bool] = True

    def __init__(self, *, dim: int, value_dim: int, budget: int | None) -> None:
        self.dim = check_positive_int("dim", dim)
        self.value_dim = check_positive_int("value_dim", value_dim)
        if budget is None and self.has_hard_budget:
            raise ValueError(f"{type(self).__name__} needs a budget (an int >= 1), got None")
        self.budget = None if budget is None else check_positive_int("budget", budget)
        self.n_seen = 0

    # -- contract ---------------------------------------------------------
    def reset(self) -> None:
        """Forget every token; stream positions restart at 0."""
        self.n_seen = 0
        self._reset()

    def write(self, key: object, value: object, query: object | None = None) -> None:
        """Append one token (``key [d]``, ``value [dv]``, optional own ``query [d]``)."""
        k = as_vector("key", key, self.dim)
        v = as_vector("value", value, self.value_dim)
        q = k if query is None else as_vector("query", query, self.dim)
        self._write(k, v, q)
        self.n_seen += 1

    def write_many(self, keys: object, values: object, queries: object | None = None) -> None:
        """Append ``T`` tokens: ``keys [T, d]``, ``values [T, dv]``, ``queries [T, d]`` or None.

        Equivalent to ``write`` on each row in order.
        """
        k = as_matrix("keys", keys, self.dim)
        v = as_matrix("values", values, self.value_dim)
        q = k if queries is None else as_matrix("queries", queries, self.dim)
        if v.shape[0] != k.shape[0] or q.shape[0] != k.shape[0]:
            raise ValueError(
                f"keys, values and queries must have the same number of rows, got "
                f"{k.shape[0]}, {v.shape[0]}, {q.shape[0]}"
            )
        self._write_many(k, v, q)

    def read(self, queries: ArrayT) -> ArrayT:
        """Outputs ``[m, dv]`` for ``queries [m, d]`` (same array type as the input)."""
        q = as_matrix("queries", queries, self.dim)
        if self._is_empty():
            out = np.zeros((q.shape[0], self.value_dim))
        else:
            out = self._read(q)
        return like(out, queries)

    def tokens_kept(self) -> int:
        """Key/value pairs held, or the equivalent ``ceil(floats / (d + dv))``."""
        return math.ceil(self.state_floats() / (self.dim + self.value_dim))

    @abstractmethod
    def state_floats(self) -> int:
        """Number of floats the memory's state holds."""

    def kept_positions(self) -> np.ndarray:
        """Stream positions still held, ascending (token memories only)."""
        raise NotImplementedError(f"{type(self).__name__} holds no tokens")

    # -- for subclasses ---------------------------------------------------
    @abstractmethod
    def _reset(self) -> None: ...

    @abstractmethod
    def _write(self, key: np.ndarray, value: np.ndarray, query: np.ndarray) -> None: ...

    def _write_many(self, keys: np.ndarray, values: np.ndarray, queries: np.ndarray) -> None:
        for t in range(keys.shape[0]):
            self._write(keys[t], values[t], queries[t])
            self.n_seen += 1

    @abstractmethod
    def _read(self, queries: np.ndarray) -> np.ndarray: ...

    @abstractmethod
    def _is_empty(self) -> bool: ...

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(dim={self.dim}, value_dim={self.value_dim}, "
            f"budget={self.budget}, n_seen={self.n_seen}, tokens_kept={self.tokens_kept()})"
        )


def causal_outputs(
    memory: StreamingMemory,
    keys: object,
    values: object,
    queries: object | None = None,
) -> np.ndarray:
    """Stream tokens through ``memory``, reading each token's query right after writing it.

    Returns ``[T, dv]``: row ``t`` is what the memory answers at step ``t``
    (a causal sequence output, as an attention layer would produce).
    """
    k = as_matrix("keys", keys, memory.dim)
    v = as_matrix("values", values, memory.value_dim)
    q = k if queries is None else as_matrix("queries", queries, memory.dim)
    out = np.empty((k.shape[0], memory.value_dim))
    for t in range(k.shape[0]):
        memory.write(k[t], v[t], q[t])
        out[t] = memory.read(q[t : t + 1])[0]
    return out
