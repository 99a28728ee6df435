"""KV-cache compression by the SVDD order of each head's keys, in kvpress's contract.

* :func:`rank_head` / :func:`rank_head_reference` — the SVDD order of one head's keys
  (numpy; the fast path and the oracle beside it). Need only this package.
* :class:`SVDDPress`, :class:`SVDDThresholdPress` — presses for a transformers model
  (``with press(model):``); :class:`FanOutPress` — many presses at many ratios from one
  prefill, for evaluations (:mod:`svattn.press.fanout`). They need the ``press`` extra
  (``pip install -e ".[press]"``: kvpress, transformers); importing :mod:`svattn.press`
  does not, and asking for them without it raises an :class:`ImportError` that says so.

On a softmax model the SVDD order is a ranking: the certificate of the SV memory
(reserve weight exactly zero for every query) holds only where the SV readout is the
attention, which a pretrained softmax model's is not (docs/press.md).
"""

import importlib

from svattn.press.scoring import HeadRanking, rank_head, rank_head_reference, svdd_box

__all__ = ["FanOutPress", "HeadRanking", "SVDDPress", "SVDDThresholdPress", "rank_head",
           "rank_head_reference", "rows_cache", "svdd_box", "svdd_rankings"]

_NEEDS_KVPRESS = {"SVDDPress": "presses", "SVDDThresholdPress": "presses",
                  "svdd_rankings": "presses", "FanOutPress": "fanout", "rows_cache": "fanout"}


def __getattr__(name: str):
    if name in _NEEDS_KVPRESS:
        try:
            module = importlib.import_module(f"svattn.press.{_NEEDS_KVPRESS[name]}")
        except ImportError as exc:
            raise ImportError(
                f"svattn.press.{name} needs kvpress and transformers: "
                f'pip install -e ".[press]" ({exc})'
            ) from exc
        return getattr(module, name)
    raise AttributeError(f"module 'svattn.press' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
