"""SVDD presses in kvpress's contract (needs the ``press`` extra: kvpress, transformers).

* :class:`SVDDPress` — a ``kvpress.ScorerPress``: ``score`` returns the SVDD rank of every
  key of every head, shape ``(batch, kv_heads, tokens)``, higher = keep; the base class
  keeps the top ``(1 − compression_ratio)·n`` of each head during prefill, inside
  ``with press(model):``.
* :class:`SVDDThresholdPress` — keeps exactly each head's support (``α > 0``) and masks
  the reserve through kvpress's head-wise key mask (``module.masked_key_indices``, read
  by kvpress's patched attention functions at decoding: an ``sdpa`` model, not
  ``eager``). Its compression ratio is what the data gives (at most ``1 − ν``).

This module imports kvpress at import time; :mod:`svattn.press` loads it only when one
of these names is asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from kvpress import BasePress, ScorerPress
from kvpress.presses.base_press import is_prefilling
from kvpress.utils import extract_keys_and_values
from torch import nn

from svattn.press.scoring import HeadRanking, rank_head

__all__ = ["SVDDPress", "SVDDThresholdPress", "svdd_rankings"]


def svdd_rankings(keys: torch.Tensor, nu: float, gamma: float | None = None
                  ) -> list[list[HeadRanking]]:
    """:func:`~svattn.press.scoring.rank_head` for every (batch, head) of ``keys``.

    Parameters
    ----------
    keys : Tensor, shape (batch, kv_heads, tokens, head_dim)
    nu, gamma
        As in :func:`~svattn.press.scoring.rank_head`.
    """
    if keys.ndim != 4:
        raise ValueError(f"keys must have shape (batch, kv_heads, tokens, head_dim), "
                         f"got {tuple(keys.shape)}")
    X = keys.detach().to("cpu", torch.float64).numpy()
    return [[rank_head(X[b, h], nu=nu, gamma=gamma) for h in range(X.shape[1])]
            for b in range(X.shape[0])]


def _check_nu(nu: object, name: str, allow_none: bool) -> None:
    if nu is None and allow_none:
        return
    if not (isinstance(nu, (int, float)) and not isinstance(nu, bool) and 0.0 < nu <= 1.0):
        raise ValueError(f"{name} must be a number in (0, 1]{' or None' if allow_none else ''}, "
                         f"got {nu!r}")


@dataclass
class SVDDPress(ScorerPress):
    """Evict each head's keys in the SVDD order: reserve first, the support last.

    Parameters
    ----------
    compression_ratio : float in [0, 1)
        Fraction of each head's keys removed at prefill.
    nu : float in (0, 1], optional
        The box ``C = 1 / (ν·n)``. Default ``1 − compression_ratio``: the support then
        holds at least the kept budget, and the keys kept are the support's top by α.
    gamma : float, optional
        rbf bandwidth; default ``1 / (head_dim · var(keys))`` per head.

    Examples
    --------
    >>> press = SVDDPress(compression_ratio=0.5)  # doctest: +SKIP
    >>> with press(model):  # doctest: +SKIP
    ...     model.model(input_ids=context_ids, past_key_values=cache)
    """

    compression_ratio: float = 0.0
    nu: float | None = None
    gamma: float | None = None

    def __post_init__(self):
        if not (isinstance(self.compression_ratio, (int, float))
                and 0.0 <= self.compression_ratio < 1.0):
            raise ValueError(f"compression_ratio must be a number in [0, 1), "
                             f"got {self.compression_ratio!r}")
        _check_nu(self.nu, "nu", allow_none=True)

    def box_nu(self) -> float:
        """The ``ν`` in use (``1 − compression_ratio`` unless given)."""
        return float(self.nu) if self.nu is not None else 1.0 - float(self.compression_ratio)

    def score(self, module: nn.Module, hidden_states: torch.Tensor, keys: torch.Tensor,
              values: torch.Tensor, attentions: torch.Tensor | None, kwargs) -> torch.Tensor:
        """The SVDD rank of every key, shape ``(batch, kv_heads, tokens)``, higher = keep."""
        ranks = svdd_rankings(keys, self.box_nu(), self.gamma)
        out = np.stack([np.stack([r.score for r in row]) for row in ranks])
        return torch.as_tensor(out, dtype=keys.dtype, device=keys.device)


@dataclass
class SVDDThresholdPress(BasePress):
    """Keep exactly each head's SVDD support; mask its reserve (``α = 0``).

    Parameters
    ----------
    nu : float in (0, 1]
        The box ``C = 1 / (ν·n)``: each head keeps at least ``ν·n`` keys.
    gamma : float, optional
        rbf bandwidth; default ``1 / (head_dim · var(keys))`` per head.

    Attributes
    ----------
    compression_ratios : dict[int, float]
        The fraction of keys masked in each layer at the last prefill.
    """

    nu: float = 0.5
    gamma: float | None = None
    compression_ratios: dict[int, float] = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self):
        _check_nu(self.nu, "nu", allow_none=False)

    @property
    def compression_ratio(self) -> float:
        """The mean fraction of keys masked over the layers of the last prefill."""
        if not self.compression_ratios:
            raise RuntimeError("no prefill has run under this press yet")
        return sum(self.compression_ratios.values()) / len(self.compression_ratios)

    def forward_hook(self, module: nn.Module, input: list[torch.Tensor], kwargs: dict,
                     output: list):
        hidden_states = kwargs["hidden_states"]
        if not is_prefilling(kwargs["cache_position"], hidden_states.shape[1]):
            return output
        keys, _ = extract_keys_and_values(kwargs["past_key_values"], module.layer_idx)
        ranks = svdd_rankings(keys, self.nu, self.gamma)
        reserve = torch.as_tensor(np.stack([np.stack([~r.support for r in row]) for row in ranks]))
        b, h, t = torch.where(reserve.to(keys.device))
        module.masked_key_indices = [b, h, t] if len(t) else None
        self.compression_ratios[module.layer_idx] = len(t) / reserve.numel()
        return output
