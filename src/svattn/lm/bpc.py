"""Bits per character of a byte-level model on a span of a corpus, every byte counted.

:func:`evaluate_bpc`: mean NLL in nats over **every byte** of a split, divided by ln 2.
The split is cut into consecutive blocks of ``context`` bytes; each block's inputs are
the ``context`` bytes before its targets (the first block starts with the byte before
the split), so a byte is predicted from the 1..context bytes preceding it in its block.
Under ``torchrun`` the ranks share the blocks and all-reduce the sums.
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from svattn.lm.device import autocast

__all__ = ["evaluate_bpc"]


@torch.no_grad()
def evaluate_bpc(
    model: nn.Module,
    data: np.ndarray,
    start: int,
    stop: int,
    *,
    context: int,
    batch_size: int = 32,
    device: torch.device | str = "cpu",
    precision: str = "fp32",
    rank: int = 0,
    world: int = 1,
    per_position: bool = False,
) -> dict:
    """Bits per character of ``model`` on bytes ``data[start:stop]``, every byte counted.

    ``model(idx [B, T]) -> logits [B, T, 256]`` (or a ``(logits, loss)`` tuple).
    The bytes are cut into consecutive blocks of ``context`` targets; a block's
    inputs are the ``context`` bytes just before its targets (for the first block
    that includes ``data[start − 1]``; when ``start == 0`` the first byte is
    predicted from an empty context by feeding byte 0 itself as a dummy input
    and scoring from the second position — i.e. byte 0 is then not scored).
    With ``world > 1`` rank ``r`` scores blocks ``r, r + world, ...`` and the sums
    are all-reduced.

    With ``per_position`` the result also holds ``bpc_by_position``: the BPC of
    the bytes scored at each offset ``0 .. context − 1`` of their block (how
    loss falls with the context a byte gets; for ``hybrid_sv``, where in its
    chunk), and ``bytes_by_position``.

    Returns
    -------
    dict
        ``bpc``, ``nll_nats`` (mean), ``bytes`` (scored), ``context``; with
        ``per_position`` also ``bpc_by_position`` and ``bytes_by_position`` (lists).

    Examples
    --------
    >>> import numpy as np, torch
    >>> uniform = lambda idx: torch.zeros(*idx.shape, 256)
    >>> data = np.arange(1000, dtype=np.uint8) % 251
    >>> round(evaluate_bpc(uniform, data, 100, 1000, context=64)["bpc"], 9)
    8.0
    """
    if not (0 <= start < stop <= len(data)):
        raise ValueError(f"need 0 <= start < stop <= len(data), got {start}, {stop}, {len(data)}")
    device = torch.device(device)
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    first = max(start, 1)  # first scored byte
    blocks = list(range(first, stop, context))
    nll = torch.zeros((), dtype=torch.float64)
    count = torch.zeros((), dtype=torch.float64)
    pos_nll = torch.zeros(context, dtype=torch.float64)
    pos_count = torch.zeros(context, dtype=torch.float64)
    mine = blocks[rank::world]
    for i in range(0, len(mine), batch_size):
        group = mine[i : i + batch_size]
        lens = [min(context, stop - b) for b in group]
        T = max(lens)
        x = np.zeros((len(group), T), dtype=np.int64)
        y = np.full((len(group), T), -1, dtype=np.int64)
        for j, (b, n) in enumerate(zip(group, lens, strict=True)):
            x[j, :n] = data[b - 1 : b - 1 + n]
            y[j, :n] = data[b : b + n]
        xt, yt = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
        with autocast(device, precision):
            out = model(xt)
        logits = out[0] if isinstance(out, tuple) else out  # (B, T, V)
        loss = F.cross_entropy(
            logits.double().reshape(-1, logits.shape[-1]), yt.reshape(-1),
            ignore_index=-1, reduction="none",
        ).reshape(len(group), T)  # fmt: skip
        nll += loss.sum().cpu()
        count += float(sum(lens))
        if per_position:
            pos_nll[:T] += loss.sum(0).cpu()
            pos_count[:T] += (yt >= 0).sum(0).double().cpu()
    if world > 1:
        import torch.distributed as dist

        both = torch.cat([torch.stack([nll, count]), pos_nll, pos_count]).to(device)
        dist.all_reduce(both)
        both = both.cpu()
        nll, count = both[0], both[1]
        pos_nll, pos_count = both[2 : 2 + context], both[2 + context :]
    if was_training:
        model.train()
    mean = float(nll / count)
    out = {"bpc": mean / math.log(2), "nll_nats": mean, "bytes": int(count), "context": context}
    if per_position:
        by_pos = pos_nll / pos_count.clamp(min=1) / math.log(2)
        out["bpc_by_position"] = [  # None where no byte sat at that offset
            float(b) if c else None for b, c in zip(by_pos, pos_count, strict=True)
        ]
        out["bytes_by_position"] = [int(c) for c in pos_count]
    return out
