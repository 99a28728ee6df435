"""Which keys each SV memory holds: torch's mask conventions, and memories with too few keys.

Layout ``[B, H, T, D]``. A memory is built per (batch, head) over the keys it may
see; with a per-query mask (``attn_mask`` or ``is_causal``) per (batch, head, query).

**Conventions** (torch's, each where torch has it):

* ``key_mask`` — svattn's own: bool, broadcastable to ``[B, H, Tk]``, True = keep.
* ``key_padding_mask`` ``[B, Tk]`` — :class:`torch.nn.MultiheadAttention`'s: bool with
  True = ignore, or float with 0 = keep and -inf = ignore.
* ``attn_mask`` of the functional :func:`svattn.nn.sv_attention` — as
  :func:`torch.nn.functional.scaled_dot_product_attention`: broadcastable to
  ``[B, H, Tq, Tk]``, bool with **True = takes part**, or float with 0 = takes part
  and -inf = masked.
* ``attn_mask`` of the layer :class:`svattn.nn.SVAttention` — as
  :class:`torch.nn.MultiheadAttention`: ``[Tq, Tk]`` or ``[B·H, Tq, Tk]``, bool with
  **True = masked out**, or float as above (:func:`mha_attn_mask` turns it into
  the functional's form).
* ``is_causal`` — as SDPA: query ``i`` sees keys ``j <= i`` (the top-left aligned
  ``ones(Tq, Tk).tril()``); not together with ``attn_mask``.

A float mask may hold only 0 and -inf: an additive bias has no meaning for the
memory's weights, so other values are refused.

**Short memories.** A memory over ``n`` keys is feasible only for ``n·C >= 1``
(``n >= ⌈1/C⌉``, :func:`~svattn.exact.core.conventions.warmup_threshold`). A memory
with ``1 <= n < ⌈1/C⌉`` present keys — a short sequence in a padded batch, an early
query under ``is_causal`` — gets its box raised to ``1/n``, the smallest box that
holds the mass: every present key then has weight ``1/n`` exactly (the only feasible
point, as it already is at ``n·C = 1``), masked keys 0, and ``alpha`` is constant,
so gradients reach the keys through the readout only. Its partition puts every
present key in the error set (``alpha`` at the raised box);
:meth:`~svattn.nn.common.Partition.box_raised` flags such memories. A memory with no
present key reads nothing: output 0 and alpha 0 (as
:func:`~torch.nn.functional.scaled_dot_product_attention` does for a fully masked
row). The rule is per memory, so a sequence's output does not depend on what it is
batched with: :func:`svattn.nn.attention.sv_attention_reference` solves every memory
alone.
"""

from __future__ import annotations

import torch

from svattn.exact.core.conventions import warmup_threshold
from svattn.nn.common import Partition, host_reads

__all__ = [
    "causal_mask",
    "mha_attn_mask",
    "query_mask",
    "short_memories",
    "raise_short",
]


def _float_keep(m: torch.Tensor, name: str) -> torch.Tensor:
    """A float mask of 0 (keep) and -inf (masked) as bool keep; anything else refused."""
    if host_reads(m) and not bool(((m == 0) | (m == float("-inf"))).all()):
        raise ValueError(f"{name}: a float mask may hold only 0 (keep) and -inf (masked); an "
                         "additive bias has no meaning for SV weights")
    return m == 0


def causal_mask(Tq: int, Tk: int, device: torch.device | str | None = None) -> torch.Tensor:
    """``[Tq, Tk]`` bool, True where query ``i`` may see key ``j``: ``j <= i`` (SDPA's
    ``is_causal``, top-left aligned).

    Examples
    --------
    >>> causal_mask(3, 3).int()
    tensor([[1, 0, 0],
            [1, 1, 0],
            [1, 1, 1]], dtype=torch.int32)
    """
    return torch.ones(Tq, Tk, dtype=torch.bool, device=device).tril()


def query_mask(attn_mask: torch.Tensor | None, is_causal: bool, q: torch.Tensor,
               k: torch.Tensor) -> torch.Tensor | None:
    """The keys each query may see, bool ``[B, H, Tq, Tk]`` (True = takes part), from the
    functional's ``attn_mask`` (SDPA's convention) or ``is_causal``; None for neither.

    Raises
    ------
    ValueError
        Both given, ``is_causal`` not a bool, a mask of another dtype or a shape that
        does not broadcast to ``[B, H, Tq, Tk]``, or a float mask with values other
        than 0 and -inf.
    """
    if not isinstance(is_causal, bool):
        raise ValueError(f"is_causal must be a bool, got {is_causal!r}")
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    if attn_mask is not None and is_causal:
        raise ValueError("give attn_mask or is_causal, not both (is_causal alone applies the "
                         "causal mask, as scaled_dot_product_attention)")
    if is_causal:
        return causal_mask(Tq, Tk, k.device).expand(B, H, Tq, Tk)
    if attn_mask is None:
        return None
    if not isinstance(attn_mask, torch.Tensor):
        raise ValueError(f"attn_mask must be a tensor, got {type(attn_mask).__name__}")
    if attn_mask.dtype == torch.bool:
        keep = attn_mask
    elif attn_mask.is_floating_point():
        keep = _float_keep(attn_mask, "attn_mask")
    else:
        raise ValueError(f"attn_mask must be bool (True = takes part) or float (0 = takes "
                         f"part, -inf = masked), got dtype {attn_mask.dtype}")
    try:
        return keep.to(k.device).expand(B, H, Tq, Tk)
    except RuntimeError:
        raise ValueError(f"attn_mask of shape {tuple(attn_mask.shape)} does not broadcast to "
                         f"[B, H, Tq, Tk] = {[B, H, Tq, Tk]}") from None


def mha_attn_mask(attn_mask: torch.Tensor, B: int, H: int, Tq: int,
                  Tk: int) -> torch.Tensor:
    """:class:`torch.nn.MultiheadAttention`'s ``attn_mask`` (``[Tq, Tk]`` or ``[B·H, Tq, Tk]``;
    bool True = masked out, float 0 / -inf) as the functional's: bool, True = takes part,
    ``[1, 1, Tq, Tk]`` or ``[B, H, Tq, Tk]``.

    Raises
    ------
    ValueError
        Another shape or dtype, or a float mask with values other than 0 and -inf.

    Examples
    --------
    >>> m = torch.ones(2, 2, dtype=torch.bool).triu(1)  # MHA's causal mask: True above
    >>> mha_attn_mask(m, 1, 1, 2, 2).int()
    tensor([[[[1, 0],
              [1, 1]]]], dtype=torch.int32)
    """
    shapes = ((Tq, Tk), (B * H, Tq, Tk))
    if not isinstance(attn_mask, torch.Tensor) or tuple(attn_mask.shape) not in shapes:
        got = tuple(attn_mask.shape) if isinstance(attn_mask, torch.Tensor) else type(attn_mask)
        raise ValueError(f"attn_mask must be [Tq, Tk] = {[Tq, Tk]} or [B·H, Tq, Tk] = "
                         f"{[B * H, Tq, Tk]} (nn.MultiheadAttention's convention: True = "
                         f"masked out), got {got}")
    if attn_mask.dtype == torch.bool:
        keep = ~attn_mask
    elif attn_mask.is_floating_point():
        keep = _float_keep(attn_mask, "attn_mask")
    else:
        raise ValueError(f"attn_mask must be bool (True = masked out) or float (0 = takes "
                         f"part, -inf = masked), got dtype {attn_mask.dtype}")
    return keep.view(1, 1, Tq, Tk) if keep.dim() == 2 else keep.view(B, H, Tq, Tk)


def short_memories(valid: torch.Tensor, C: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Present keys per memory ``n`` (long ``[...]``) and which memories are short
    (``n < ⌈1/C⌉``, bool ``[...]``) of a keep-mask ``valid`` ``[..., Tk]`` (no host read)."""
    n = valid.sum(-1)
    return n, n < warmup_threshold(C)


def raise_short(alpha: torch.Tensor, part: Partition, valid: torch.Tensor,
                n: torch.Tensor, short: torch.Tensor) -> tuple[torch.Tensor, Partition]:
    """Alpha and partition with the short memories' box raised to ``1/n`` (module
    docstring): weight ``1/n`` on every present key, all of them in the error set.

    ``alpha`` from a solve in which the short memories were stand-ins
    (:func:`svattn.nn.batched.solve_batched`'s ``stand_in``): replaced there.
    """
    s = short.unsqueeze(-1)
    uniform = valid.to(alpha.dtype) / n.clamp_min(1).unsqueeze(-1).to(alpha.dtype)
    alpha = torch.where(s, uniform, alpha)
    none = torch.zeros_like(valid)
    return alpha, Partition(torch.where(s, none, part.margin), torch.where(s, valid, part.error),
                            torch.where(s, none, part.reserve))
