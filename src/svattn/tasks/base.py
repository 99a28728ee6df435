"""What every synthetic recall task returns: :class:`RecallData`, and the role codes.

A task is one small module with a config dataclass whose ``build(seed)`` draws
train and test tensors (zoology's convention, HazyResearch/zoology
``zoology/data``). Inputs and targets are ``[N, T]`` int64; a target is
:data:`IGNORE` wherever no prediction is scored, so
``torch.nn.functional.cross_entropy`` (whose default ``ignore_index`` it is)
and the accuracy both see the scored positions only.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["IGNORE", "ROLES", "RecallData", "check_counts", "gumbel_top_k"]

#: Target of a position that is not scored (``F.cross_entropy``'s default ``ignore_index``).
IGNORE = -100

#: Role code of each position in :attr:`RecallData.train_roles` / ``test_roles``.
ROLES: dict[str, int] = {
    "filler": 0,  # noise between the tokens that matter
    "key": 1,  # MQAR: a key of a key-value pair
    "value": 2,  # MQAR: the value that follows it
    "query": 3,  # MQAR: a key asked again (scored: its target is the value)
    "data": 4,  # selective copy: a token to be copied
    "marker": 5,  # selective copy: an output slot (scored: its target is a data token)
}


@dataclass(frozen=True)
class RecallData:
    """Train and test split of a recall task.

    Attributes
    ----------
    train_inputs, test_inputs : torch.Tensor of int64, shape (N, T)
        Token ids in ``[0, vocab_size)``.
    train_targets, test_targets : torch.Tensor of int64, shape (N, T)
        The token to predict at each position, :data:`IGNORE` where none is scored.
    train_roles, test_roles : torch.Tensor of int8, shape (N, T)
        What each position is (codes of :data:`ROLES`), for inspection.
    vocab_size : int
        Size of the vocabulary the model needs.
    """

    train_inputs: torch.Tensor
    train_targets: torch.Tensor
    train_roles: torch.Tensor
    test_inputs: torch.Tensor
    test_targets: torch.Tensor
    test_roles: torch.Tensor
    vocab_size: int

    @property
    def seq_len(self) -> int:
        """Sequence length ``T``."""
        return int(self.train_inputs.shape[1])


def gumbel_top_k(rng: np.random.Generator, log_p: np.ndarray, k: int, rows: int) -> np.ndarray:
    """``rows`` draws of ``k`` distinct indices of ``log_p`` without replacement.

    The Gumbel-top-k trick: the ``k`` largest of ``log_p + Gumbel`` are
    distributed as ``k`` successive draws without replacement, each from the
    renormalised remaining probabilities (what ``numpy``'s ``choice(replace=False, p=p)``
    does one row at a time), but vectorised over rows.

    Returns
    -------
    ndarray of int64, shape (rows, k)
        In draw order (the most likely first).

    Examples
    --------
    >>> idx = gumbel_top_k(np.random.default_rng(0), np.zeros(10), 3, rows=2)
    >>> idx.shape, all(len(set(r)) == 3 for r in idx)
    ((2, 3), True)
    """
    if not 0 <= k <= log_p.size:
        raise ValueError(f"k must lie in [0, {log_p.size}], got {k}")
    scores = log_p[None, :] + rng.gumbel(size=(rows, log_p.size))
    return np.argsort(-scores, axis=1, kind="stable")[:, :k].astype(np.int64)


def check_counts(cfg, names: tuple[str, ...]) -> None:
    """Each of ``cfg``'s fields ``names`` must be an int >= 1 (``ValueError`` naming the
    config class and the field otherwise)."""
    for name in names:
        val = getattr(cfg, name)
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ValueError(f"{type(cfg).__name__}.{name} must be an int >= 1, got {val!r}")
