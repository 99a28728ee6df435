"""H2O heavy-hitter eviction (Zhang et al., 2023), and its oracle-query variant.

Rule (per token, streaming): the incoming token's query attends (softmax,
causal, itself included) over the cache plus the new token; each held key
adds the attention it received to its cumulative score. When more than
``budget`` tokens are held, the token with the lowest cumulative score
outside the ``window`` most recent tokens is evicted (ties: the oldest).
The cache then holds ``budget − window`` heavy hitters plus the recent window.
"""

from __future__ import annotations

import numpy as np

from svattn.memory.base import as_matrix, check_positive_int
from svattn.memory.kv import KVMemory


def _softmax_rows(logits: np.ndarray) -> np.ndarray:
    """Softmax along axis 0 (over cached tokens) of ``logits [n]`` or ``[n, m]``."""
    w = np.exp(logits - logits.max(axis=0, keepdims=True))
    w /= w.sum(axis=0, keepdims=True)
    return w


class H2OMemory(KVMemory):
    """H2O: cumulative received attention picks heavy hitters, plus a recent window.

    Parameters
    ----------
    dim, value_dim
        Key and value widths.
    budget
        Hard cap on pairs held (an int >= 1).
    window
        Recent tokens always kept, ``0 <= window <= budget``; ``budget // 2``
        when None (H2O's even split between heavy hitters and recent tokens).
    scale
        Softmax scale, ``1/sqrt(dim)`` by default.

    Examples
    --------
    >>> import numpy as np
    >>> keys = np.zeros((20, 2)); keys[3] = [10.0, 0.0]  # position 3 draws the attention
    >>> mem = H2OMemory(dim=2, value_dim=1, budget=4, window=2)
    >>> mem.write_many(keys, np.zeros((20, 1)), queries=np.tile([1.0, 0.0], (20, 1)))
    >>> 3 in mem.kept_positions()
    True
    """

    def __init__(
        self,
        *,
        dim: int,
        value_dim: int,
        budget: int,
        window: int | None = None,
        scale: float | None = None,
        extra_cols: int = 1,
    ) -> None:
        # extra column: the cumulative attention score (H2O), or oracle logits
        super().__init__(
            dim=dim, value_dim=value_dim, budget=budget, scale=scale, extra_cols=extra_cols
        )
        window = self.budget // 2 if window is None else check_positive_int("window", window, 0)
        if window > self.budget:
            raise ValueError(f"window ({window}) must be <= budget ({self.budget})")
        self.window = window

    def _scores(self, query: np.ndarray) -> np.ndarray:
        """Update and return the eviction scores of the ``n`` held tokens."""
        s = self.store
        n = s.n
        attn = _softmax_rows((s.keys[:n] @ query) * self.scale)  # (n,)
        s.extra[:n, 0] += attn
        return s.extra[:n, 0]

    def _write(self, key: np.ndarray, value: np.ndarray, query: np.ndarray) -> None:
        s = self.store
        s.append(key, value, self.n_seen)
        scores = self._scores(query)
        if s.n > self.budget:
            candidates = s.n - self.window  # rows [0, candidates) may be evicted
            s.delete(int(np.argmin(scores[:candidates])))


class H2OOracleMemory(H2OMemory):
    """H2O with oracle query access: heavy hitters scored by the future queries.

    The eviction score of a held token is the softmax attention it receives
    from the given ``oracle_queries`` (over the cache plus the incoming
    token, summed over the queries), recomputed at every eviction. The
    stream's own queries are not used. Recent ``window`` as in
    :class:`H2OMemory`.

    Parameters
    ----------
    dim, value_dim, budget, window, scale
        As in :class:`H2OMemory`.
    oracle_queries
        ``[m, d]`` the queries that will be asked (required).
    """

    def __init__(
        self,
        *,
        dim: int,
        value_dim: int,
        budget: int,
        oracle_queries: object,
        window: int | None = None,
        scale: float | None = None,
    ) -> None:
        q = as_matrix("oracle_queries", oracle_queries, check_positive_int("dim", dim))
        if q.shape[0] < 1:
            raise ValueError("oracle_queries must hold at least one query, got 0 rows")
        self.oracle_queries = q
        # extra columns: logits of each held token against every oracle query, (n, m)
        super().__init__(
            dim=dim, value_dim=value_dim, budget=budget, window=window, scale=scale,
            extra_cols=q.shape[0],
        )

    def _scores(self, query: np.ndarray) -> np.ndarray:
        s = self.store
        n = s.n
        s.extra[n - 1] = (self.oracle_queries @ s.keys[n - 1]) * self.scale
        return _softmax_rows(s.extra[:n]).sum(axis=1)  # (n,)
