"""Token storage for the KV-cache memories, and the two ends of the scale:
full softmax (no eviction) and a sliding window."""

from __future__ import annotations

import math

import numpy as np

from svattn.memory.base import StreamingMemory, check_positive_int, softmax_read


class KVStore:
    """Keys, values, positions (and per-token extras) in stream order, with O(n·d) delete.

    Arrays grow by doubling; ``n`` rows are live, ordered by position.
    """

    def __init__(self, dim: int, value_dim: int, extra_cols: int = 0, capacity: int = 16):
        self.dim, self.value_dim, self.extra_cols = dim, value_dim, extra_cols
        self.keys = np.empty((capacity, dim))
        self.values = np.empty((capacity, value_dim))
        self.positions = np.empty(capacity, dtype=np.int64)
        self.extra = np.zeros((capacity, extra_cols))
        self.n = 0

    def append(self, key: np.ndarray, value: np.ndarray, position: int) -> int:
        """Add a token at the end; return its row."""
        if self.n == self.keys.shape[0]:
            cap = 2 * self.n
            for name in ("keys", "values", "positions", "extra"):
                old = getattr(self, name)
                new = np.zeros((cap, *old.shape[1:]), dtype=old.dtype)
                new[: self.n] = old[: self.n]
                setattr(self, name, new)
        i = self.n
        self.keys[i], self.values[i], self.positions[i] = key, value, position
        self.extra[i] = 0.0
        self.n += 1
        return i

    def delete(self, i: int) -> None:
        """Remove row ``i``, keeping the others in order."""
        n = self.n
        for arr in (self.keys, self.values, self.positions, self.extra):
            arr[i : n - 1] = arr[i + 1 : n]
        self.n -= 1

    def clear(self) -> None:
        self.n = 0


def check_scale(scale: float | None, dim: int) -> float:
    """Softmax scale: ``1/sqrt(dim)`` when None, else a positive finite float."""
    if scale is None:
        return 1.0 / math.sqrt(dim)
    scale = float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be a positive finite float, got {scale!r}")
    return scale


class KVMemory(StreamingMemory):
    """A memory holding key/value pairs, read by softmax attention over them.

    ``tokens_kept()`` is the number of pairs held; ``state_floats()`` is
    ``pairs · (d + dv)``.
    """

    def __init__(
        self,
        *,
        dim: int,
        value_dim: int,
        budget: int | None,
        scale: float | None = None,
        extra_cols: int = 0,
    ) -> None:
        super().__init__(dim=dim, value_dim=value_dim, budget=budget)
        self.scale = check_scale(scale, self.dim)
        # per-token bookkeeping columns (eviction scores) beside keys and values
        self.store = KVStore(self.dim, self.value_dim, extra_cols)

    def _reset(self) -> None:
        self.store.clear()

    def _is_empty(self) -> bool:
        return self.store.n == 0

    def _read(self, queries: np.ndarray) -> np.ndarray:
        n = self.store.n
        return softmax_read(queries, self.store.keys[:n], self.store.values[:n], self.scale)

    def tokens_kept(self) -> int:
        """Key/value pairs held."""
        return self.store.n

    def state_floats(self) -> int:
        return self.store.n * (self.dim + self.value_dim)

    def kept_positions(self) -> np.ndarray:
        return self.store.positions[: self.store.n].copy()


class FullMemory(KVMemory):
    """Full softmax attention: keeps every token (no eviction).

    ``budget`` is accepted for the common constructor and **ignored**: the
    state grows with the stream (``tokens_kept() == tokens written``).

    Parameters
    ----------
    dim, value_dim
        Key and value widths.
    budget
        Ignored (may be None).
    scale
        Softmax scale, ``1/sqrt(dim)`` by default.

    Examples
    --------
    >>> import numpy as np
    >>> mem = FullMemory(dim=4, value_dim=2, budget=None)
    >>> mem.write_many(np.eye(4), np.arange(8.0).reshape(4, 2))
    >>> mem.read(np.zeros((1, 4)))  # uniform attention: the mean value
    array([[3., 4.]])
    """

    has_hard_budget = False

    def _write(self, key: np.ndarray, value: np.ndarray, query: np.ndarray) -> None:
        self.store.append(key, value, self.n_seen)


class SlidingWindowMemory(KVMemory):
    """Sliding-window softmax attention: keeps the last ``window`` tokens.

    Parameters
    ----------
    dim, value_dim
        Key and value widths.
    budget
        Hard cap on pairs held (an int >= 1).
    window
        Tokens kept, ``1 <= window <= budget``; ``budget`` when None.
    scale
        Softmax scale, ``1/sqrt(dim)`` by default.

    Examples
    --------
    >>> import numpy as np
    >>> mem = SlidingWindowMemory(dim=2, value_dim=1, budget=3)
    >>> mem.write_many(np.zeros((5, 2)), np.arange(5.0)[:, None])
    >>> mem.kept_positions()
    array([2, 3, 4])
    """

    def __init__(
        self,
        *,
        dim: int,
        value_dim: int,
        budget: int,
        window: int | None = None,
        scale: float | None = None,
    ) -> None:
        super().__init__(dim=dim, value_dim=value_dim, budget=budget, scale=scale)
        window = self.budget if window is None else check_positive_int("window", window)
        if window > self.budget:
            raise ValueError(f"window ({window}) must be <= budget ({self.budget})")
        self.window = window

    def _write(self, key: np.ndarray, value: np.ndarray, query: np.ndarray) -> None:
        if self.store.n == self.window:
            self.store.delete(0)
        self.store.append(key, value, self.n_seen)
