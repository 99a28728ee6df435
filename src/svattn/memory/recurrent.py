"""Fixed-state streaming memories: DeltaNet and linear attention.

Their state does not grow with the stream, so ``budget`` is accepted for
the common constructor and **ignored**. ``state_floats()`` is the float
count of the state; ``tokens_kept()`` the equivalent number of key/value
pairs, ``ceil(floats / (d + dv))``.

The per-token step is a numpy float64 recurrence; ``write_many`` runs the
chunked operators of :mod:`svattn.ops` (float64) from the current state, so
both paths are checked against each other by the tests.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from svattn.memory.base import StreamingMemory
from svattn.ops import chunk_delta_rule, chunk_linear_attn


def _l2_normalize(x: np.ndarray, eps: float = 1e-12) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), eps)


def _elu_p1(x: np.ndarray) -> np.ndarray:
    return np.where(x > 0, x + 1.0, np.exp(np.minimum(x, 0.0)))


def _t(x: np.ndarray) -> torch.Tensor:
    """``[T, D]`` numpy → ``[1, 1, T, D]`` float64 tensor (the ops layout)."""
    return torch.from_numpy(np.ascontiguousarray(x))[None, None]


class DeltaNetMemory(StreamingMemory):
    """Delta-rule memory ``S ← S + beta (v − S k̂) k̂^T`` with L2-normalised keys.

    Read: ``o = S q̂`` (queries L2-normalised too, no extra scale), so a key
    written with ``beta = 1`` reads back its value exactly.

    Parameters
    ----------
    dim, value_dim
        Key and value widths.
    budget
        Ignored (fixed state of ``dim · value_dim`` floats); may be None.
    beta
        Write strength in ``(0, 2)``; default 1 (overwrite along the key).

    Examples
    --------
    >>> import numpy as np
    >>> mem = DeltaNetMemory(dim=3, value_dim=2, budget=None)
    >>> mem.write([1.0, 0.0, 0.0], [5.0, 6.0])
    >>> mem.read(np.array([[2.0, 0.0, 0.0]]))
    array([[5., 6.]])
    """

    has_hard_budget = False
    holds_tokens = False

    def __init__(
        self, *, dim: int, value_dim: int, budget: int | None = None, beta: float = 1.0
    ) -> None:
        super().__init__(dim=dim, value_dim=value_dim, budget=budget)
        beta = float(beta)
        if not 0.0 < beta < 2.0:
            raise ValueError(f"beta must lie in (0, 2), got {beta!r}")
        self.beta = beta
        self.state = np.zeros((self.dim, self.value_dim))  # S^T, (d, dv) as in svattn.ops

    def _reset(self) -> None:
        self.state[:] = 0.0

    def _is_empty(self) -> bool:
        return self.n_seen == 0

    def _write(self, key: np.ndarray, value: np.ndarray, query: np.ndarray) -> None:
        k = _l2_normalize(key)
        self.state += np.outer(k, self.beta * (value - k @ self.state))

    def _write_many(self, keys: np.ndarray, values: np.ndarray, queries: np.ndarray) -> None:
        t = keys.shape[0]
        if t == 0:
            return
        k = _t(_l2_normalize(keys))
        beta = torch.full((1, 1, t), self.beta, dtype=torch.float64)
        _, s = chunk_delta_rule(
            k, k, _t(values), beta,
            initial_state=torch.from_numpy(self.state)[None, None], output_final_state=True,
        )
        self.state = s[0, 0].numpy().copy()
        self.n_seen += t

    def _read(self, queries: np.ndarray) -> np.ndarray:
        return _l2_normalize(queries) @ self.state

    def state_floats(self) -> int:
        return self.dim * self.value_dim


class LinearAttentionMemory(StreamingMemory):
    """Linear attention with the ``elu + 1`` feature map and its normaliser.

    ``S ← S + phi(k) v^T``, ``z ← z + phi(k)``; read
    ``o = S^T phi(q) / (z·phi(q) + eps)``.

    Parameters
    ----------
    dim, value_dim
        Key and value widths.
    budget
        Ignored (fixed state of ``dim · value_dim + dim`` floats); may be None.
    eps
        Added to the normaliser.

    Examples
    --------
    >>> import numpy as np
    >>> mem = LinearAttentionMemory(dim=2, value_dim=1, budget=None)
    >>> mem.write_many(np.zeros((2, 2)), np.array([[1.0], [3.0]]))
    >>> np.round(mem.read(np.zeros((1, 2))), 6)
    array([[2.]])
    """

    has_hard_budget = False
    holds_tokens = False

    def __init__(
        self, *, dim: int, value_dim: int, budget: int | None = None, eps: float = 1e-6
    ) -> None:
        super().__init__(dim=dim, value_dim=value_dim, budget=budget)
        eps = float(eps)
        if not (math.isfinite(eps) and eps >= 0):
            raise ValueError(f"eps must be a finite float >= 0, got {eps!r}")
        self.eps = eps
        self.state = np.zeros((self.dim, self.value_dim))  # (d, dv)
        self.normalizer = np.zeros(self.dim)  # (d,)

    def _reset(self) -> None:
        self.state[:] = 0.0
        self.normalizer[:] = 0.0

    def _is_empty(self) -> bool:
        return self.n_seen == 0

    def _write(self, key: np.ndarray, value: np.ndarray, query: np.ndarray) -> None:
        f = _elu_p1(key)
        self.state += np.outer(f, value)
        self.normalizer += f

    def _write_many(self, keys: np.ndarray, values: np.ndarray, queries: np.ndarray) -> None:
        t = keys.shape[0]
        if t == 0:
            return
        f = _t(_elu_p1(keys))
        _, (s, z) = chunk_linear_attn(
            f, f, _t(values),
            initial_state=torch.from_numpy(self.state)[None, None],
            initial_normalizer=torch.from_numpy(self.normalizer)[None, None],
            output_final_state=True,
        )
        self.state = s[0, 0].numpy().copy()
        self.normalizer = z[0, 0].numpy().copy()
        self.n_seen += t

    def _read(self, queries: np.ndarray) -> np.ndarray:
        f = _elu_p1(queries)  # (m, d)
        return (f @ self.state) / (f @ self.normalizer + self.eps)[:, None]

    def state_floats(self) -> int:
        return self.dim * self.value_dim + self.dim
