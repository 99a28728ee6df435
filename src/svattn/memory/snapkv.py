"""SnapKV (Li et al., 2024): observation-window scoring with 1-D pooling.

The one-shot rule (:func:`snapkv_select`): the last ``w`` queries of a
prompt (the observation window) attend causally (softmax) over the prompt;
each prefix token's score is the attention it receives summed over the
window; scores are smoothed by 1-D pooling (``max`` or ``avg``, kernel
``k``, stride 1, same length); the top prefix tokens are kept together with
the window itself.

:class:`SnapKVMemory` applies the same rule at every step of a stream: when
the cache overflows, the current window (the last ``w`` tokens and their
queries) scores the held prefix and the lowest pooled score is evicted.
"""

from __future__ import annotations

import numpy as np

from svattn.memory.base import as_matrix, check_positive_int
from svattn.memory.kv import KVMemory

POOLS = ("max", "avg")


def pool1d(scores: np.ndarray, kernel: int, pool: str) -> np.ndarray:
    """Stride-1 same-length pooling of ``scores [n]``; edges use the in-range part only."""
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")
    n = scores.shape[0]
    half = kernel // 2
    if kernel == 1 or n == 0:
        return scores.copy()
    fill = -np.inf if pool == "max" else np.nan
    padded = np.full(n + 2 * half, fill)
    padded[half : half + n] = scores
    win = np.lib.stride_tricks.sliding_window_view(padded, 2 * half + 1)  # (n, 2·half+1)
    return win.max(axis=1) if pool == "max" else np.nanmean(win, axis=1)


def snapkv_scores(
    keys: np.ndarray,
    window_queries: np.ndarray,
    *,
    scale: float,
    kernel: int = 7,
    pool: str = "max",
) -> np.ndarray:
    """Pooled SnapKV scores of the prefix tokens.

    Parameters
    ----------
    keys
        ``[n, d]`` all tokens in position order; the last ``w`` are the window.
    window_queries
        ``[w, d]`` the window's queries; query ``j`` sees tokens ``<= n − w + j``.
    scale
        Softmax scale.
    kernel, pool
        1-D pooling kernel (odd) and kind.

    Returns
    -------
    numpy.ndarray
        ``[n − w]`` pooled scores of the prefix.
    """
    n, w = keys.shape[0], window_queries.shape[0]
    logits = (window_queries @ keys.T) * scale  # (w, n)
    # causal inside the window: query j sees prefix + window tokens 0..j
    logits[:, n - w :][np.triu(np.ones((w, w), dtype=bool), 1)] = -np.inf
    logits -= logits.max(axis=1, keepdims=True)
    attn = np.exp(logits)
    attn /= attn.sum(axis=1, keepdims=True)
    return pool1d(attn[:, : n - w].sum(axis=0), kernel, pool)


def snapkv_select(
    keys: object,
    queries: object,
    budget: int,
    *,
    window: int = 32,
    kernel: int = 7,
    pool: str = "max",
    scale: float | None = None,
) -> np.ndarray:
    """One-shot SnapKV compression of a prompt: positions to keep, ascending.

    Parameters
    ----------
    keys, queries
        ``[n, d]`` the prompt's keys and queries.
    budget
        Tokens kept in all, ``window <= budget``.
    window
        Observation window ``w``: the last ``w`` tokens (always kept) and
        their queries (the scorers).
    kernel, pool, scale
        Pooling kernel (odd), ``"max"``/``"avg"``, softmax scale
        (``1/sqrt(d)`` when None).

    Returns
    -------
    numpy.ndarray
        Kept positions: the top ``budget − w`` prefix tokens by pooled score
        (ties: the most recent) and the window.
    """
    budget = check_positive_int("budget", budget)
    window, kernel = _check_window_kernel(window, kernel, pool, budget)
    k = np.asarray(keys, dtype=np.float64)
    if k.ndim != 2:
        raise ValueError(f"keys must have shape [n, d], got {k.shape}")
    q = as_matrix("queries", queries, k.shape[1])
    if q.shape[0] != k.shape[0]:
        raise ValueError(f"queries must have {k.shape[0]} rows like keys, got {q.shape[0]}")
    n = k.shape[0]
    if n <= budget:
        return np.arange(n)
    scale = 1.0 / np.sqrt(k.shape[1]) if scale is None else float(scale)
    scores = snapkv_scores(k, q[n - window :], scale=scale, kernel=kernel, pool=pool)
    # stable sort of −score from the newest backwards: ties keep the most recent
    order = (n - window - 1) - np.argsort(-scores[::-1], kind="stable")
    top = np.sort(order[: budget - window])
    return np.concatenate([top, np.arange(n - window, n)])


def _check_window_kernel(window: int, kernel: int, pool: str, budget: int) -> tuple[int, int]:
    window = check_positive_int("window", window)
    if window > budget:
        raise ValueError(f"window ({window}) must be <= budget ({budget})")
    kernel = check_positive_int("kernel", kernel)
    if kernel % 2 == 0:
        raise ValueError(f"kernel must be odd (same-length pooling), got {kernel}")
    if pool not in POOLS:
        raise ValueError(f"pool must be one of {POOLS}, got {pool!r}")
    return window, kernel


class SnapKVMemory(KVMemory):
    """SnapKV applied at every overflow of a streaming cache.

    Parameters
    ----------
    dim, value_dim
        Key and value widths.
    budget
        Hard cap on pairs held (an int >= 1).
    window
        Observation window ``w <= budget``; ``min(32, max(1, budget // 2))``
        when None. The last ``w`` tokens are never evicted.
    kernel
        Odd pooling kernel (default 7).
    pool
        ``"max"`` (default) or ``"avg"``.
    scale
        Softmax scale, ``1/sqrt(dim)`` by default.

    Notes
    -----
    Each overflow costs ``O(w · budget · d)``; the oldest token is evicted
    on ties.

    Examples
    --------
    >>> import numpy as np
    >>> mem = SnapKVMemory(dim=2, value_dim=1, budget=4, window=2, kernel=1)
    >>> mem.write_many(np.zeros((10, 2)), np.zeros((10, 1)))  # uniform attention
    >>> mem.kept_positions()
    array([6, 7, 8, 9])
    """

    def __init__(
        self,
        *,
        dim: int,
        value_dim: int,
        budget: int,
        window: int | None = None,
        kernel: int = 7,
        pool: str = "max",
        scale: float | None = None,
    ) -> None:
        super().__init__(dim=dim, value_dim=value_dim, budget=budget, scale=scale)
        if window is None:
            window = min(32, max(1, self.budget // 2))
        self.window, self.kernel = _check_window_kernel(window, kernel, pool, self.budget)
        self.pool = pool
        self._queries = np.zeros((self.window, self.dim))  # ring of the last w queries

    def _reset(self) -> None:
        super()._reset()
        self._queries[:] = 0.0

    def _write(self, key: np.ndarray, value: np.ndarray, query: np.ndarray) -> None:
        s = self.store
        s.append(key, value, self.n_seen)
        self._queries[self.n_seen % self.window] = query
        if s.n > self.budget:
            # the window's queries in position order, (w, d)
            order = (self.n_seen + 1 + np.arange(self.window)) % self.window
            scores = snapkv_scores(
                s.keys[: s.n], self._queries[order], scale=self.scale,
                kernel=self.kernel, pool=self.pool,
            )
            s.delete(int(np.argmin(scores)))
