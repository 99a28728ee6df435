"""Byte-level language modelling with pluggable sequence mixers.

* :mod:`svattn.lm.model` — :class:`CharLM` and :class:`CharLMConfig`.
* :mod:`svattn.lm.configs` — named shapes (``paper-3m``, ``10m``, ``tiny``) and the
  matched-state sliding-window baseline.
* :mod:`svattn.lm.loop` — the optimiser set-up (AdamW, warmup + cosine, clipping) and
  the training loop that :mod:`svattn.lm.train` and :mod:`svattn.lm.recall` share.
* :mod:`svattn.lm.train` — training of the language model (checkpoints with resume,
  DDP under ``torchrun``); its settings, :class:`~svattn.lm.train_config.TrainConfig`
  with ``--set`` overrides, in :mod:`svattn.lm.train_config`; its rank, device and bf16
  autocast in :mod:`svattn.lm.device`; bits-per-character evaluation in
  :mod:`svattn.lm.bpc`; a trained model read back from its file in :mod:`svattn.lm.load`.
* :mod:`svattn.lm.stream` — :class:`~svattn.lm.stream.LMStream` (``CharLM.stream()``):
  feed, generate and forget on the model's own step (``CharLM.extend``); its folder
  format, lock and load checks in :mod:`svattn.lm.stream_folder`, what a forget names
  and returns (:class:`~svattn.lm.spans.ForgetResult`) in :mod:`svattn.lm.spans`, its
  receipts and their verification in :mod:`svattn.lm.forget`, the float64 model it
  runs in :mod:`svattn.lm.exact_model`.
"""

from svattn.lm.configs import PRESETS, matched_sliding, mixer_config, preset
from svattn.lm.model import CharLM, CharLMConfig

__all__ = ["PRESETS", "CharLM", "CharLMConfig", "matched_sliding", "mixer_config", "preset"]
