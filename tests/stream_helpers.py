"""Shared helpers of the tests of crafted language-model files: a tiny streaming model,
a text for it, and a recall cell model (safetensors) written with chosen metadata."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_model

from svattn.lm import CharLM, CharLMConfig
from svattn.lm.train import RECALL_CELL


def tiny_model(seed: int = 0) -> CharLM:
    torch.manual_seed(seed)
    cfg = CharLMConfig(vocab_size=128, n_layer=2, n_embd=16, n_head=2, block_size=64,
                       rope=True, mixer="hybrid_sv",
                       mixer_options={"chunk": 8, "C": 0.25, "policy": "full", "lookback": 3})
    return CharLM(cfg).eval()


def text_of(n: int, seed: int = 1) -> bytes:
    return bytes(np.random.default_rng(seed).integers(97, 110, n).tolist())


def cell_model(path: Path, model: CharLM, **meta) -> Path:
    """``model`` saved at ``path`` as a recall cell model, its metadata edited by
    ``meta`` (a value of None removes that key)."""
    base = {"format": RECALL_CELL, "model_config": json.dumps(model.cfg.to_dict()),
            "run": json.dumps({"task": "mqar", "steps": 1})}
    base.update({k: v for k, v in meta.items() if v is not None})
    for k in [k for k, v in meta.items() if v is None]:
        base.pop(k)
    save_model(model, str(path), metadata=base)
    return path
