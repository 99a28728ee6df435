"""Learned keys: key projections of the project's CharLM, trained here for seconds.

A one-block :class:`~svattn.lm.CharLM` (softmax mixer, d = 32) is trained with
Adam on next-byte prediction; its block-0 key projections of held-out windows
are the "learned keys" of the forgetting experiment. The paper used its
3.22M-parameter CharLM; this one is far smaller (and trained far shorter).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch

from svattn.lm import CharLM, CharLMConfig


@dataclass(frozen=True)
class LearnedKeys:
    """Keys from :func:`learned_keys` and how the model that made them was trained."""

    keys: np.ndarray
    steps: int
    seconds: float
    train_bpc: float
    d_head: int


def learned_keys(
    text: bytes, n_keys: int, *, steps: int = 200, seed: int = 0, context: int = 64,
    batch: int = 32,
) -> LearnedKeys:
    """Train a small :class:`~svattn.lm.CharLM` on ``text``; return keys of held-out windows.

    The model is the project's CharLM (one softmax block, d = 32, 2 heads,
    learned positions); the keys are head 0's key projections in block 0.

    The last ``2 · ceil(n_keys / context)`` windows of ``context`` bytes are
    held out; the model trains on the rest for ``steps`` Adam steps. The keys
    are the first ``n_keys`` distinct layer-0 keys of the held-out windows
    (the same byte at the same position gives the same key; copies are
    dropped, so fewer than ``n_keys`` may come back on repetitive text).

    Examples
    --------
    >>> out = learned_keys(b"abcabcabd" * 200, 40, steps=5)
    >>> out.keys.shape
    (40, 16)
    """
    if len(text) < 4 * context + 2 * n_keys + 2 * context:
        raise ValueError(f"text: need at least {6 * context + 2 * n_keys} bytes, got {len(text)}")
    torch.manual_seed(seed)
    data = torch.tensor(list(text), dtype=torch.long)
    n_windows = 2 * math.ceil(n_keys / context)  # spare windows: duplicates are dropped
    held = data[-n_windows * context :]
    train = data[: -n_windows * context]
    model = CharLM(CharLMConfig(n_layer=1, n_embd=32, n_head=2, block_size=context,
                                pos_emb=True, mixer="softmax"))
    params = list(model.parameters())
    # plain Adam by hand: torch.optim's first step imports the compiler stack (seconds)
    m1 = [torch.zeros_like(p) for p in params]
    m2 = [torch.zeros_like(p) for p in params]
    lr, b1, b2, eps = 3e-3, 0.9, 0.999, 1e-8
    gen = torch.Generator().manual_seed(seed)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matrices: threads only contend
    start = time.perf_counter()
    loss = torch.tensor(float("nan"))
    try:
        for step in range(1, steps + 1):
            ix = torch.randint(0, len(train) - context - 1, (batch,), generator=gen)
            x = torch.stack([train[i : i + context] for i in ix])  # (B, T)
            y = torch.stack([train[i + 1 : i + context + 1] for i in ix])
            _, loss = model(x, targets=y)
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, g, a, b in zip(params, grads, m1, m2, strict=True):
                    a.mul_(b1).add_(g, alpha=1 - b1)
                    b.mul_(b2).addcmul_(g, g, value=1 - b2)
                    denom = (b / (1 - b2**step)).sqrt_().add_(eps)
                    p.addcdiv_(a, denom, value=-lr / (1 - b1**step))
    finally:
        torch.set_num_threads(threads)
    seconds = time.perf_counter() - start
    with torch.no_grad():
        keys = _layer0_keys(model, held.reshape(n_windows, context))  # (B·T, d_head)
    d_head = keys.shape[1]
    # the same byte at the same position gives the same key: keep distinct keys only
    keys = keys.double().numpy()
    _, first = np.unique(keys, axis=0, return_index=True)
    keys = keys[np.sort(first)][:n_keys]
    bpc = float(loss.detach()) / math.log(2)
    return LearnedKeys(keys, steps, seconds, bpc, d_head)


def _layer0_keys(model: CharLM, idx: torch.Tensor) -> torch.Tensor:
    """Head-0 key projections of the first block's attention, ``[B·T, d_head]``."""
    T = idx.shape[1]
    x = model.wte(idx) + model.wpe(torch.arange(T))  # (B, T, D)
    block = model.blocks[0]
    _, k, _ = block.mix.qkv_heads(block.ln_1(x))  # (B, H, T, Dh)
    return k[:, 0].reshape(-1, k.shape[-1])
