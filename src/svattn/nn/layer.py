"""``SVAttention``: a multi-head SV-Attention layer (projections, heads, memory, readout).

Inputs ``[B, T, d_model]`` (``batch_first=False``: ``[T, B, d_model]``, as
:class:`torch.nn.MultiheadAttention` takes them); internally ``[B, H, T, D]`` with
``D = d_model / n_heads``.
"""

from __future__ import annotations

import torch
from torch import nn

from svattn.nn.attention import check_params, sv_attention_state
from svattn.nn.common import Partition
from svattn.nn.masks import mha_attn_mask
from svattn.nn.options import SolverOptions, resolve_solver

__all__ = ["SVAttention"]


class SVAttention(nn.Module):
    """Multi-head support-vector attention.

    Queries (from ``x``) read, per head, the SV memory built from the keys and
    values of ``context`` (``x`` itself when no context is given) — like
    cross-attention over the context. Masks as :class:`torch.nn.MultiheadAttention`
    takes them (``key_padding_mask``, ``attn_mask``, ``is_causal``; see :meth:`forward`).
    With ``attn_mask`` or ``is_causal`` every query reads its own memory (``Tq``
    solves); for long causal sequences the chunked
    :class:`svattn.mixers.HybridSVAttention` solves one memory per chunk.

    Parameters
    ----------
    d_model : int
        Model width; must be divisible by ``n_heads``.
    n_heads : int
        Number of heads.
    C : float
        Box of the SVDD dual: at most ``⌊1/C⌋`` keys can be at the box, so ``C = 1/k``
        lets ``k`` keys carry all the weight (docs/usage.md, "Choosing C"). A memory
        over fewer than ``⌈1/C⌉`` keys has its box raised to ``1/n`` (uniform weights;
        :meth:`box_raised`).
    kernel : {"rbf", "exp"}
    mode : {"batched", "exact"}
    gamma : float, optional
        Kernel bandwidth (default from the head dim).
    solver : SolverOptions, optional
        Options of the batched solver (default :class:`~svattn.nn.SolverOptions()`:
        the verified optimum); ignored in exact mode.
    bias : bool
        Biases in the projections.
    batch_first : bool
        Inputs and output are ``[B, T, d_model]`` (the default); False:
        ``[T, B, d_model]`` (sequence first), as :class:`torch.nn.MultiheadAttention`
        with ``batch_first=False``. alpha and the partition are ``[B, H, Tk]`` either way.
    device, dtype : optional
        Factory arguments of the projections' parameters, as torch modules take them.

    Raises
    ------
    ValueError
        At construction, naming the parameter: shapes, ``C`` (a finite number
        > 0), ``kernel``, ``mode``, ``gamma``, ``batch_first``.

    Notes
    -----
    Half precision: bf16/fp16 weights and ``torch.autocast`` work; the memory is
    solved and read in float32 (:mod:`svattn.nn.attention`) and the output comes
    back in the input dtype. Masks: ``key_mask`` (True = keep) or torch's
    ``key_padding_mask`` (``[B, Tk]``, True = ignore), and per query ``attn_mask``
    (:class:`torch.nn.MultiheadAttention`'s convention: True = masked out) or
    ``is_causal``; conventions and the short-memory rule in :mod:`svattn.nn.masks`.

    Examples
    --------
    >>> import torch
    >>> layer = SVAttention(16, 2, C=0.2)
    >>> x = torch.randn(3, 10, 16)
    >>> layer(x).shape
    torch.Size([3, 10, 16])
    >>> layer.tokens_kept() <= 10
    True
    >>> out, alpha = layer(x, return_alpha=True)  # as sv_attention: (out, alpha)
    >>> alpha.shape, layer.last_partition_.margin.shape
    (torch.Size([3, 2, 10]), torch.Size([3, 2, 10]))
    >>> SVAttention(16, 2, C=0.2, dtype=torch.float64).q_proj.weight.dtype
    torch.float64
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        C: float,
        kernel: str = "rbf",
        mode: str = "batched",
        gamma: float | None = None,
        solver: SolverOptions | None = None,
        bias: bool = False,
        batch_first: bool = True,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
    ) -> None:
        super().__init__()
        if d_model < 1 or n_heads < 1 or d_model % n_heads:
            raise ValueError(
                f"d_model ({d_model}) must be a positive multiple of n_heads ({n_heads})"
            )
        C = check_params(C, kernel, mode, gamma)  # here, not first at forward
        if not isinstance(batch_first, bool):
            raise ValueError(f"batch_first must be a bool, got {batch_first!r}")
        self.batch_first = batch_first
        factory = {"device": device, "dtype": dtype}
        self.d_model, self.n_heads, self.head_dim = d_model, n_heads, d_model // n_heads
        self.C, self.kernel, self.mode, self.gamma = C, kernel, mode, gamma
        self.solver = resolve_solver(solver)
        self.q_proj = nn.Linear(d_model, d_model, bias=bias, **factory)
        self.k_proj = nn.Linear(d_model, d_model, bias=bias, **factory)
        self.v_proj = nn.Linear(d_model, d_model, bias=bias, **factory)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias, **factory)
        self.last_partition_: Partition | None = None

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.n_heads, self.head_dim).transpose(1, 2)  # (B, H, T, D)

    def forward(
        self,
        x: torch.Tensor,
        context: torch.Tensor | None = None,
        *,
        key_mask: torch.Tensor | None = None,
        key_padding_mask: torch.Tensor | None = None,
        attn_mask: torch.Tensor | None = None,
        is_causal: bool = False,
        return_alpha: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Attend from ``x`` ``[B, Tq, d_model]`` to ``context`` ``[B, Tk, d_model]``
        (``[Tq, B, d_model]`` and ``[Tk, B, d_model]`` with ``batch_first=False``).

        Returns the output (``x``'s layout), and with ``return_alpha`` the pair
        ``(out, alpha)``, alpha ``[B, H, Tk]`` — as :func:`~svattn.nn.sv_attention` and
        :class:`torch.nn.MultiheadAttention` (output, weights). The :class:`Partition`
        of the call is :attr:`last_partition_` (bool ``[B, H, Tk]`` each).
        ``key_mask`` (bool, broadcastable to ``[B, H, Tk]``) marks present keys;
        ``key_padding_mask`` (``[B, Tk]``, True = ignore: torch's convention) marks
        absent ones. Give at most one.

        ``attn_mask`` (``[Tq, Tk]`` or ``[B·H, Tq, Tk]``) as
        :class:`torch.nn.MultiheadAttention` takes it: bool with **True = masked out**
        (the opposite of :func:`~svattn.nn.sv_attention`'s SDPA convention), or float
        with 0 = allowed and -inf = masked. ``is_causal``: query ``i`` sees keys
        ``j <= i`` (alone: it is the mask, not a hint to go with ``attn_mask``). With
        either, alpha and the partition are ``[B, H, Tq, Tk]``, one memory per query.
        """
        ctx = x if context is None else context
        layout = "[B, T" if self.batch_first else "[T, B"
        for name, t in (("x", x), ("context", ctx)):
            if t.dim() != 3 or t.shape[-1] != self.d_model:
                raise ValueError(
                    f"{name} must be {layout}, d_model={self.d_model}] (batch_first="
                    f"{self.batch_first}), got {tuple(t.shape)}"
                )
        if not self.batch_first:  # (T, B, E) -> (B, T, E)
            x, ctx = x.transpose(0, 1), ctx.transpose(0, 1)
        if ctx.shape[0] != x.shape[0]:
            raise ValueError(f"x and context batch sizes differ: {x.shape[0]} vs {ctx.shape[0]}")
        q = self._heads(self.q_proj(x))  # (B, H, Tq, D)
        k = self._heads(self.k_proj(ctx))  # (B, H, Tk, D)
        v = self._heads(self.v_proj(ctx))  # (B, H, Tk, D)
        if attn_mask is not None:  # MHA's convention (True = masked out) -> SDPA's
            attn_mask = mha_attn_mask(attn_mask, x.shape[0], self.n_heads, q.shape[2],
                                      k.shape[2])
        o, alpha, part, _ = sv_attention_state(
            q, k, v, C=self.C, kernel=self.kernel, gamma=self.gamma, mode=self.mode,
            key_mask=key_mask, key_padding_mask=key_padding_mask, solver=self.solver,
            attn_mask=attn_mask, is_causal=is_causal,
        )  # fmt: skip
        self.last_partition_ = Partition(*(s.detach() for s in part))
        B, _, Tq, _ = o.shape
        out = self.out_proj(o.transpose(1, 2).reshape(B, Tq, self.d_model))  # (B, Tq, d_model)
        if not self.batch_first:
            out = out.transpose(0, 1)  # (Tq, B, d_model)
        return (out, alpha) if return_alpha else out

    def extra_repr(self) -> str:
        """The memory's parameters, shown by ``repr`` above the projections."""
        return (f"d_model={self.d_model}, n_heads={self.n_heads}, C={self.C:g}, "
                f"kernel={self.kernel!r}, gamma={self.gamma!r}, mode={self.mode!r}, "
                f"solver={self.solver!r}" + ("" if self.batch_first else ", batch_first=False"))

    def box_raised(self) -> torch.Tensor | None:
        """Memories of the last call over fewer than ``⌈1/C⌉`` keys, bool ``[B, H]``
        (``[B, H, Tq]`` with a per-query mask): their box was raised to ``1/n``, so their
        keys share the weight uniformly (:mod:`svattn.nn.masks`); None before a call."""
        if self.last_partition_ is None:
            return None
        return self.last_partition_.box_raised(self.C)

    def tokens_kept(self) -> int:
        """Tokens kept (margin ∪ error) by the largest (batch, head) memory of the last call."""
        if self.last_partition_ is None:
            return 0
        return int(self.last_partition_.kept().sum(-1).max())
