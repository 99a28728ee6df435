"""A tiny character-level attention model, trained for seconds, to get learned keys.

Stand-in for the paper's CharLM while ``svattn.lm`` is not available: one
causal softmax attention layer plus an MLP over byte embeddings, trained with
Adam on next-byte prediction. Its layer-0 key projections of a held-out window
are "learned keys" for the forgetting experiment.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn


class TinyCharLM(nn.Module):
    """Byte embedding + learned positions, one attention layer, an MLP, a byte head.

    Shapes: ``idx [B, T]`` (int64) -> logits ``[B, T, 256]``.
    """

    def __init__(self, d_model: int = 32, d_head: int = 16, context: int = 64) -> None:
        super().__init__()
        self.emb = nn.Embedding(256, d_model)
        self.pos = nn.Embedding(context, d_model)
        self.ln1 = nn.LayerNorm(d_model)
        self.q = nn.Linear(d_model, d_head, bias=False)
        self.k = nn.Linear(d_model, d_head, bias=False)
        self.v = nn.Linear(d_model, d_head, bias=False)
        self.o = nn.Linear(d_head, d_model, bias=False)
        self.ln2 = nn.LayerNorm(d_model)
        self.mlp = nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.GELU(),
                                 nn.Linear(4 * d_model, d_model))
        self.head = nn.Linear(d_model, 256)
        self.context = context

    def keys(self, idx: torch.Tensor) -> torch.Tensor:
        """Layer-0 keys ``[B, T, d_head]``."""
        t = idx.shape[1]
        x = self.emb(idx) + self.pos(torch.arange(t))  # (B, T, D)
        return self.k(self.ln1(x))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        x = self.emb(idx) + self.pos(torch.arange(t))  # (B, T, D)
        h = self.ln1(x)
        q, k, v = self.q(h), self.k(h), self.v(h)  # (B, T, dh)
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(att)
        x = x + self.mlp(self.ln2(x))
        return self.head(x)  # (B, T, 256)


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
    """Train :class:`TinyCharLM` on ``text`` and return the keys of held-out windows.

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
    model = TinyCharLM(context=context)
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
            loss = nn.functional.cross_entropy(model(x).reshape(-1, 256), y.reshape(-1))
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
        keys = model.keys(held.reshape(n_windows, context)).reshape(-1, model.k.out_features)
    # the same byte at the same position gives the same key: keep distinct keys only
    keys = keys.double().numpy()
    _, first = np.unique(keys, axis=0, return_index=True)
    keys = keys[np.sort(first)][:n_keys]
    bpc = float(loss.detach()) / math.log(2)
    return LearnedKeys(keys, steps, seconds, bpc, model.k.out_features)
