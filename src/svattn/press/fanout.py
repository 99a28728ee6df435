"""Many scorer presses at many compression ratios from one prefill (evaluation tool).

Inside ``with press(model):`` a kvpress press compresses each layer's cache in a forward
hook that runs after the layer's attention; the next layer's prefill reads the layer's
output hidden states, never the compressed cache. So every layer sees the same
``(module, hidden_states, keys, values, attentions, kwargs)`` whatever press is active,
and one prefill can serve many presses: :class:`FanOutPress` hands each layer's inputs
to every press's ``score`` and keeps, per ratio, the top ``n_kept`` keys of each head —
what :meth:`kvpress.ScorerPress.compress` does — while the model's own cache stays full.

Exactness conditions (``tests/press/test_fanout.py`` checks the caches and the greedy
tokens against ``with press(model):`` for every press the evaluation uses):

* a press's ``score`` must not depend on its ``compression_ratio`` (one score serves all
  ratios). :class:`~svattn.press.SVDDPress` with ``nu=None`` ties its box to the ratio
  and is refused; give it a fixed ``nu``;
* a press that draws from torch's global generator (kvpress's ``LeverageScorePress``
  sketches with ``torch.randn``) sees the stream it would see alone: each press gets its
  own copy of the generator's state as it was when the prefill reached the first layer,
  so seeding before the prefill reproduces the press run alone after the same seed.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from kvpress import BasePress, ScorerPress
from kvpress.utils import compute_n_kept
from torch import nn

from svattn.press.presses import SVDDPress

__all__ = ["FanOutPress", "rows_cache"]


@dataclass
class FanOutPress(BasePress):
    """Score once per press, keep each head's top keys at every ratio; leave the cache full.

    Parameters
    ----------
    presses : dict[str, kvpress.ScorerPress]
        The presses by name. Each one's score must not depend on ``compression_ratio``.
    ratios : tuple of float in [0, 1)
        The compression ratios to keep at.

    Attributes
    ----------
    kept : dict[(str, float), dict[int, (Tensor, Tensor)]]
        ``(name, ratio) -> {layer: (keys, values)}`` after a prefill: what
        ``with presses[name](model):`` at that ratio leaves in the layer's cache.
    seconds : dict[str, float]
        Time spent in each press's ``score`` over the prefill.

    Raises
    ------
    ValueError
        A press that is not a ``ScorerPress``, an ``SVDDPress`` whose box follows the
        ratio (``nu=None``), or a ratio outside [0, 1).

    Examples
    --------
    >>> fan = FanOutPress({"svdd": SVDDPress(nu=0.5), "knorm": KnormPress()},
    ...                   ratios=(0.25, 0.5))  # doctest: +SKIP
    >>> with fan(model):  # doctest: +SKIP
    ...     model.model(input_ids=context_ids, past_key_values=DynamicCache())
    >>> cache = rows_cache([fan.kept[("svdd", 0.5)], fan.kept[("knorm", 0.5)]])  # doctest: +SKIP
    """

    presses: dict = field(default_factory=dict)
    ratios: tuple = ()
    kept: dict = field(default_factory=dict, init=False, repr=False)
    seconds: dict = field(default_factory=dict, init=False, repr=False)
    _rng: dict = field(default_factory=dict, init=False, repr=False)

    def __post_init__(self):
        if not self.presses:
            raise ValueError("presses must name at least one press")
        for name, press in self.presses.items():
            if not isinstance(press, ScorerPress):
                raise ValueError(f"presses[{name!r}] must be a kvpress ScorerPress, "
                                 f"got {type(press).__name__}")
            if isinstance(press, SVDDPress) and press.nu is None:
                raise ValueError(f"presses[{name!r}]: an SVDDPress with nu=None scores by "
                                 f"its compression ratio; give it a fixed nu")
        if not self.ratios or not all(isinstance(r, (int, float)) and 0.0 <= r < 1.0
                                      for r in self.ratios):
            raise ValueError(f"ratios must be numbers in [0, 1), got {self.ratios!r}")

    def post_init_from_model(self, model) -> None:
        for press in self.presses.values():
            press.post_init_from_model(model)

    def _score(self, name: str, press: ScorerPress, *args) -> torch.Tensor:
        """``press.score(*args)`` on the press's own copy of torch's global generator."""
        outer = torch.get_rng_state()
        torch.set_rng_state(self._rng[name])
        try:
            return press.score(*args)
        finally:
            self._rng[name] = torch.get_rng_state()
            torch.set_rng_state(outer)

    def compress(self, module: nn.Module, hidden_states: torch.Tensor, keys: torch.Tensor,
                 values: torch.Tensor, attentions: torch.Tensor | None, kwargs: dict):
        if module.layer_idx == 0:  # a new prefill: every press starts from here
            start = torch.get_rng_state()
            self._rng = {name: start.clone() for name in self.presses}
            self.kept, self.seconds = {}, {}
        for name, press in self.presses.items():
            t0 = time.perf_counter()
            scores = self._score(name, press, module, hidden_states, keys, values,
                                 attentions, kwargs)
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
            for r in self.ratios:
                if r == 0:  # ScorerPress.compress leaves the cache as it is
                    kept = (keys, values)
                else:
                    idx = scores.topk(compute_n_kept(keys.shape[2], r), dim=-1).indices
                    idx = idx.unsqueeze(-1).expand(-1, -1, -1, module.head_dim)
                    kept = (keys.gather(2, idx).contiguous(), values.gather(2, idx).contiguous())
                self.kept.setdefault((name, r), {})[module.layer_idx] = kept
        return keys, values


def rows_cache(per_row: list[dict]):
    """One ``DynamicCache`` whose batch row ``i`` holds ``per_row[i]`` (``{layer: (k, v)}``).

    The rows must keep equally many tokens per layer (presses at one ratio do).

    Raises
    ------
    ValueError
        When the rows' layers or token counts differ.
    """
    from transformers import DynamicCache

    if not per_row:
        raise ValueError("per_row must hold at least one cache")
    layers = sorted(per_row[0])
    for i, row in enumerate(per_row):
        if sorted(row) != layers:
            raise ValueError(f"per_row[{i}] holds layers {sorted(row)}, row 0 holds {layers}")
        for layer in layers:
            if row[layer][0].shape != per_row[0][layer][0].shape:
                raise ValueError(f"per_row[{i}] layer {layer} has keys of shape "
                                 f"{tuple(row[layer][0].shape)}, row 0 "
                                 f"{tuple(per_row[0][layer][0].shape)}")
    cache = DynamicCache()
    for layer in layers:
        cache.update(torch.cat([row[layer][0] for row in per_row]),
                     torch.cat([row[layer][1] for row in per_row]), layer)
    return cache
