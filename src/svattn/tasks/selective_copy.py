"""Selective copying, trained: copy the few data tokens scattered in filler, in order.

The task of Gu & Dao (*Mamba*, 2023, §3.1; after Arjovsky et al.'s copying
task): a sequence of ``T`` tokens holds ``n`` data tokens (symbols drawn
uniformly, with repetition, from ``m`` data symbols) at random positions of
its first ``T − n`` tokens, filler everywhere else there; its last ``n``
positions hold a marker token, and at the ``j``-th marker the model must
output the ``j``-th data token. Only the marker positions are scored (every
other target is :data:`~svattn.tasks.base.IGNORE`); chance is ``1/m``.

Token ids: ``0`` filler, ``1`` marker, ``2 .. m + 1`` the data symbols.

Worked example (``T = 10``, ``n = 3``, ``m = 4``):

>>> cfg = SelectiveCopyConfig(seq_len=10, num_data=3, num_symbols=4, num_train=1, num_test=1)
>>> d = cfg.build(seed=0)
>>> d.train_inputs[0].tolist()  # data tokens among the first 7, then 3 markers
[0, 5, 4, 4, 0, 0, 0, 1, 1, 1]
>>> d.train_targets[0].tolist()[-3:]  # the data tokens, in order
[5, 4, 4]
>>> d.train_roles[0].tolist()  # 4 data, 5 marker, 0 filler
[0, 4, 4, 4, 0, 0, 0, 5, 5, 5]
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
import torch

from svattn.tasks.base import IGNORE, ROLES, RecallData, check_counts, gumbel_top_k

__all__ = ["SelectiveCopyConfig", "FILLER", "MARKER"]

FILLER, MARKER = 0, 1
FIRST_SYMBOL = 2


@dataclass(frozen=True)
class SelectiveCopyConfig:
    """Shape of a selective-copy data set.

    Parameters
    ----------
    seq_len : int
        Sequence length ``T``, the ``n`` output slots included; needs ``T >= 2n``.
    num_data : int
        Data tokens ``n`` per sequence (Mamba: 16).
    num_symbols : int
        Data symbols ``m`` (Mamba: 16); chance accuracy is ``1/m``.
    num_train, num_test : int
        Sequences per split.
    """

    seq_len: int = 256
    num_data: int = 16
    num_symbols: int = 16
    num_train: int = 10_000
    num_test: int = 1_000

    def __post_init__(self) -> None:
        check_counts(self, ("seq_len", "num_data", "num_symbols", "num_train", "num_test"))
        if self.seq_len < 2 * self.num_data:
            raise ValueError(f"SelectiveCopyConfig: seq_len ({self.seq_len}) must be >= "
                             f"2·num_data = {2 * self.num_data}")

    @property
    def vocab_size(self) -> int:
        """Filler, marker and the data symbols: ``m + 2``."""
        return self.num_symbols + FIRST_SYMBOL

    @property
    def chance(self) -> float:
        """Accuracy of guessing a symbol: ``1/m``."""
        return 1.0 / self.num_symbols

    def build(self, seed: int) -> RecallData:
        """Draw the train and test splits (independent streams of one seed)."""
        train = self._split(np.random.default_rng([seed, 0]), self.num_train)
        test = self._split(np.random.default_rng([seed, 1]), self.num_test)
        return RecallData(*train, *test, vocab_size=self.vocab_size)

    def to_dict(self) -> dict:
        """Plain-data form."""
        return asdict(self)

    def _split(self, rng: np.random.Generator, rows: int):
        T, n = self.seq_len, self.num_data
        region = T - n
        pos = np.sort(gumbel_top_k(rng, np.zeros(region), n, rows), axis=1)  # (N, n)
        sym = FIRST_SYMBOL + rng.integers(0, self.num_symbols, size=(rows, n))
        x = np.full((rows, T), FILLER, dtype=np.int64)
        y = np.full((rows, T), IGNORE, dtype=np.int64)
        role = np.full((rows, T), ROLES["filler"], dtype=np.int8)
        r = np.arange(rows)[:, None]
        x[r, pos], role[r, pos] = sym, ROLES["data"]
        x[:, region:], y[:, region:], role[:, region:] = MARKER, sym, ROLES["marker"]
        return torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(role)
