"""Multi-query associative recall (MQAR), as zoology defines it.

After Arora, Eyuboglu et al., *Zoology: measuring and improving recall in
efficient language models* (2023), and their generator
``zoology/data/multiquery_ar.py`` (HazyResearch/zoology), rewritten here with
numpy's ``Generator`` and vectorised draws:

* keys come from the lower half of the vocabulary (``1 .. V/2 − 1``), values
  from the upper half (``V/2 .. V − 1``); ``n`` distinct keys and ``n``
  distinct values per sequence;
* the ``n`` key-value pairs open the sequence, ``k₁ v₁ k₂ v₂ …`` (``2n`` tokens);
* the rest holds ``(T − 2n) / 2`` even slots; each key is asked again once, in
  a slot drawn without replacement with probability ``∝ g^(a−1)`` for slot
  ``g = 1, 2, …`` (a power law: most queries come soon after the pairs, a few
  far away; ``a = 1`` is uniform);
* at a query position the target is the key's value; every other target is
  :data:`~svattn.tasks.base.IGNORE`, so loss and accuracy see queries only;
* every other position is filler, drawn uniformly from ``1 .. V − 1``
  (zoology's ``random_non_queries``; filler may repeat a key or value token).

Worked example (``V = 16``, ``n = 2``, ``T = 12``): keys from 1..7, values from 8..15.

>>> cfg = MQARConfig(seq_len=12, num_kv_pairs=2, vocab_size=16, num_train=1, num_test=1)
>>> d = cfg.build(seed=0)
>>> x, y = d.train_inputs[0].tolist(), d.train_targets[0].tolist()
>>> x[:4]  # k1 v1 k2 v2
[4, 12, 3, 14]
>>> [(t, x[t], y[t]) for t in range(12) if y[t] != IGNORE]  # (position, key asked, its value)
[(4, 4, 12), (10, 3, 14)]
>>> d.train_roles[0].tolist()  # 1 key, 2 value, 3 query, 0 filler
[1, 2, 1, 2, 3, 0, 0, 0, 0, 0, 3, 0]
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from svattn.tasks.base import IGNORE, ROLES, RecallData, check_counts, gumbel_top_k

__all__ = ["MQARConfig", "IGNORE"]


@dataclass(frozen=True)
class MQARConfig:
    """Shape of an MQAR data set.

    Parameters
    ----------
    seq_len : int
        Sequence length ``T`` (even).
    num_kv_pairs : int
        Key-value pairs ``n`` per sequence; needs ``4n <= T``.
    vocab_size : int
        ``V`` (even; keys and values draw from its two halves). Zoology uses 8192.
    power_a : float
        Exponent ``a`` of the query slot law ``p(g) ∝ g^(a−1)`` (zoology: 0.01).
    num_train, num_test : int
        Sequences per split.
    """

    seq_len: int = 64
    num_kv_pairs: int = 4
    vocab_size: int = 8192
    power_a: float = 0.01
    num_train: int = 10_000
    num_test: int = 1_000

    def __post_init__(self) -> None:
        check_counts(self, ("seq_len", "num_kv_pairs", "vocab_size", "num_train", "num_test"))
        if self.seq_len % 2 or self.vocab_size % 2:
            raise ValueError(f"MQARConfig: seq_len ({self.seq_len}) and vocab_size "
                             f"({self.vocab_size}) must be even")
        n = self.num_kv_pairs
        if 4 * n > self.seq_len:
            raise ValueError(f"MQARConfig: {n} pairs and their queries need seq_len >= 4·n "
                             f"= {4 * n}, got {self.seq_len}")
        if n > self.vocab_size // 2 - 1:
            raise ValueError(f"MQARConfig: {n} distinct keys need vocab_size >= 2·(n + 1) "
                             f"= {2 * (n + 1)}, got {self.vocab_size}")
        if not (isinstance(self.power_a, int | float) and 0 < self.power_a <= 1):
            raise ValueError(f"MQARConfig.power_a must lie in (0, 1], got {self.power_a!r}")

    @property
    def slots(self) -> int:
        """Query slots after the pairs: ``(T − 2n) / 2``."""
        return (self.seq_len - 2 * self.num_kv_pairs) // 2

    def slot_probabilities(self) -> np.ndarray:
        """``p(g) ∝ g^(a−1)`` over slots ``g = 1 .. slots`` (index ``g − 1``)."""
        p = np.arange(1, self.slots + 1, dtype=np.float64) ** (self.power_a - 1.0)
        return p / p.sum()

    def build(self, seed: int) -> RecallData:
        """Draw the train and test splits (independent streams of one seed)."""
        train = self._split(np.random.default_rng([seed, 0]), self.num_train)
        test = self._split(np.random.default_rng([seed, 1]), self.num_test)
        return RecallData(*train, *test, vocab_size=self.vocab_size)

    def to_dict(self) -> dict:
        """Plain-data form."""
        return asdict(self)

    def _split(self, rng: np.random.Generator, rows: int):
        T, n, V = self.seq_len, self.num_kv_pairs, self.vocab_size
        half = V // 2
        keys = 1 + gumbel_top_k(rng, np.zeros(half - 1), n, rows)  # (N, n) in 1 .. V/2 − 1
        values = half + gumbel_top_k(rng, np.zeros(V - half), n, rows)  # (N, n) in V/2 .. V − 1
        slots = gumbel_top_k(rng, np.log(self.slot_probabilities()), n, rows)  # (N, n)
        x = rng.integers(1, V, size=(rows, T))  # filler everywhere first
        y = np.full((rows, T), IGNORE, dtype=np.int64)
        role = np.full((rows, T), ROLES["filler"], dtype=np.int8)
        x[:, 0 : 2 * n : 2], x[:, 1 : 2 * n : 2] = keys, values
        role[:, 0 : 2 * n : 2], role[:, 1 : 2 * n : 2] = ROLES["key"], ROLES["value"]
        qpos = 2 * n + 2 * slots  # (N, n): query j asks key j
        r = np.arange(rows)[:, None]
        x[r, qpos], y[r, qpos], role[r, qpos] = keys, values, ROLES["query"]
        return (torch.from_numpy(x.astype(np.int64)), torch.from_numpy(y),
                torch.from_numpy(role))
