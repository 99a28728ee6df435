"""SV readout: softmax attention with an additive ``log alpha`` bias.

``o(q) = Σ_i alpha_i k(q, x_i) v_i / Σ_i alpha_i k(q, x_i)``
``     = softmax_i(log alpha_i + log k(q, x_i)) · V`` (tokens with alpha_i = 0 masked).

Layout ``[B, H, T, D]``. Two implementations:

* :func:`sv_readout_reference` — plain, max-subtracted softmax; obviously correct.
* :func:`sv_readout` — on :func:`torch.nn.functional.scaled_dot_product_attention`
  with a float mask (for training on CPU: :mod:`svattn.nn.readout_cpu`, the same
  arithmetic with an explicit backward). For rbf, ``log k = −gamma(‖q‖² + ‖x‖² − 2 q·x)``; the
  ``‖q‖²`` term is constant along each softmax row and cancels, leaving scores
  ``2·gamma·q·x`` plus the per-key bias ``log alpha − gamma‖x‖²``. For exp the
  scores are ``gamma·q·x`` with bias ``log alpha``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from svattn.nn.common import check_qkv, host_reads, log_kernel, resolve_gamma
from svattn.nn.readout_cpu import explicit_readout, readout_bias

__all__ = ["sv_readout", "sv_readout_reference", "log_alpha"]


def log_alpha(alpha: torch.Tensor) -> torch.Tensor:
    """``log alpha`` with ``-inf`` (and zero gradient) where ``alpha <= 0``."""
    pos = alpha > 0
    safe = torch.where(pos, alpha, torch.ones_like(alpha))
    return torch.where(pos, safe.log(), torch.full_like(alpha, float("-inf")))


def _check_alpha(alpha: torch.Tensor, k: torch.Tensor) -> None:
    if not isinstance(alpha, torch.Tensor) or alpha.shape != k.shape[:3]:
        raise ValueError(
            f"alpha must have shape [B, H, Tk] = {list(k.shape[:3])}, got "
            f"{tuple(alpha.shape) if isinstance(alpha, torch.Tensor) else type(alpha).__name__}"
        )
    if host_reads(alpha) and not bool((alpha > 0).any(-1).all()):
        raise ValueError("alpha must have a positive entry in every (batch, head)")


def sv_readout_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    alpha: torch.Tensor,
    *,
    kernel: str = "rbf",
    gamma: float | None = None,
) -> torch.Tensor:
    """Readout by an explicit max-subtracted softmax (reference for :func:`sv_readout`).

    Same parameters and result as :func:`sv_readout`.
    """
    check_qkv(q, k, v)
    _check_alpha(alpha, k)
    gamma = resolve_gamma(kernel, gamma, q.shape[-1])
    logits = log_kernel(q, k, kernel, gamma) + log_alpha(alpha).unsqueeze(-2)  # (B, H, Tq, Tk)
    logits = logits - logits.amax(-1, keepdim=True).detach()
    w = logits.exp()
    w = w / w.sum(-1, keepdim=True)
    return w @ v  # (B, H, Tq, Dv)


def sv_readout(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    alpha: torch.Tensor,
    *,
    kernel: str = "rbf",
    gamma: float | None = None,
) -> torch.Tensor:
    """Read an SV memory: ``softmax(log alpha + log k(q, x)) · V`` on fused attention.

    Parameters
    ----------
    q : Tensor ``[B, H, Tq, D]``
        Queries.
    k : Tensor ``[B, H, Tk, D]``
        Keys of the memory.
    v : Tensor ``[B, H, Tk, Dv]``
        Values of the memory.
    alpha : Tensor ``[B, H, Tk]``
        Memory coefficients (``>= 0``; tokens with ``alpha = 0`` are masked out).
        Gradients flow to ``alpha`` where it is positive.
    kernel : {"rbf", "exp"}
        ``exp(-gamma‖q − x‖²)`` or ``exp(gamma q·x)``.
    gamma : float, optional
        Bandwidth; default ``1/D`` (rbf) or ``1/sqrt(D)`` (exp).

    Returns
    -------
    Tensor ``[B, H, Tq, Dv]``

    Examples
    --------
    >>> import torch
    >>> q = torch.zeros(1, 1, 1, 2)
    >>> k = torch.tensor([[[[0.0, 0.0], [1.0, 0.0]]]])
    >>> v = torch.tensor([[[[1.0], [0.0]]]])
    >>> sv_readout(q, k, v, torch.tensor([[[0.5, 0.0]]]))  # only token 0 carries weight
    tensor([[[[1.]]]])
    """
    check_qkv(q, k, v)
    _check_alpha(alpha, k)
    return readout_fused(q, k, v, alpha, kernel, resolve_gamma(kernel, gamma, q.shape[-1]))


def _explicit(q, k, v, alpha) -> bool:
    """Whether :func:`readout_fused` runs :func:`explicit_readout` (training on CPU)."""
    return (q.device.type == "cpu" and q.dtype in (torch.float32, torch.float64)
            and torch.is_grad_enabled() and not torch.compiler.is_compiling()
            and any(t.requires_grad for t in (q, k, v, alpha)))


def readout_fused(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    alpha: torch.Tensor,
    kernel: str,
    gamma: float,
) -> torch.Tensor:
    """:func:`sv_readout` without input checks (internal hot path).

    For training on CPU (eager, float32/64, some input needing a gradient) the same
    readout runs as :func:`svattn.nn.readout_cpu.explicit_readout`: attention would
    take its math path there (a bias with a gradient), which costs more.
    """
    if _explicit(q, k, v, alpha):
        return explicit_readout(q, k, v, alpha, kernel, gamma)
    bias, scale = readout_bias(log_alpha(alpha), k, kernel, gamma)  # (B, H, Tk)
    B, H, Tq, _ = q.shape
    mask = bias.unsqueeze(-2).expand(B, H, Tq, k.shape[2])  # (B, H, Tq, Tk)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
