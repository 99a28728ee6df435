"""Byte-level language modelling with pluggable sequence mixers.

* :mod:`svattn.lm.model` — :class:`CharLM` and :class:`CharLMConfig`.
* :mod:`svattn.lm.configs` — named shapes (``paper-3m``, ``10m``, ``tiny``) and the
  matched-state sliding-window baseline.
* :mod:`svattn.lm.train` — training (AdamW, warmup + cosine, clipping, bf16 autocast,
  checkpoints with resume, DDP under ``torchrun``) and bits-per-character evaluation.
"""

from svattn.lm.configs import PRESETS, matched_sliding, mixer_config, preset
from svattn.lm.model import CharLM, CharLMConfig

__all__ = ["PRESETS", "CharLM", "CharLMConfig", "matched_sliding", "mixer_config", "preset"]
