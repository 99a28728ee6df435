"""The model a :class:`~svattn.lm.stream.LMStream` runs: its float64 streaming copy
(:func:`exact_copy`, the reference the stream equals) and its digest
(:func:`model_digest`, which a saved stream and a receipt record).
"""

from __future__ import annotations

import copy
import hashlib
import json

import torch
from torch import nn

__all__ = ["exact_copy", "model_digest"]

F64 = torch.float64


def model_digest(model: nn.Module) -> str:
    """SHA-256 of a model's configuration and parameters (as float64 bytes).

    Two models with the same digest compute the same stream; :meth:`LMStream.load`
    and ``svattn verify-forget`` refuse a stream whose model has another digest.
    """
    h = hashlib.sha256()
    h.update(json.dumps(model.cfg.to_dict(), sort_keys=True).encode())
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().to("cpu", F64).contiguous().numpy().tobytes())
    return h.hexdigest()


def exact_copy(model: nn.Module, *, full_policy: bool = False) -> nn.Module:
    """A float64, eval-mode copy of ``model`` whose forward computes what its streaming
    step does: every mixer's :meth:`~svattn.mixers.SequenceMixer.stream_settings` applied
    (the hybrid layers in ``mode="exact"``; with ``full_policy`` also ``policy="full"``,
    same weights).

    This is the reference the stream equals (``exact_copy(model)(x)``).

    Raises
    ------
    ValueError
        A mixer that does not stream with these settings (a hybrid layer with
        ``policy="support"`` and ``full_policy`` False); the message names the layer.
    """
    settings = []
    for i, block in enumerate(model.blocks):
        try:
            settings.append(block.mix.stream_settings(full_policy=full_policy))
        except ValueError as exc:
            raise ValueError(f"layer {i} of this model: {exc}") from None
    ref = copy.deepcopy(model).to(dtype=F64).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    for block, changes in zip(ref.blocks, settings, strict=True):
        for name, value in changes.items():
            setattr(block.mix, name, value)
    return ref
