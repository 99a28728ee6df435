"""``sv_attention``: build the SV memory over the keys, then read it with the queries.

Layout ``[B, H, T, D]``: q ``[B, H, Tq, D]``, k ``[B, H, Tk, D]``, v ``[B, H, Tk, Dv]``,
alpha ``[B, H, Tk]``, output ``[B, H, Tq, Dv]``.
"""

from __future__ import annotations

import math

import torch

from svattn.nn.batched import BatchedInfo, solve_batched
from svattn.nn.common import (
    Partition,
    check_feasible,
    check_key_mask,
    check_qkv,
    resolve_gamma,
)
from svattn.nn.exact_fn import exact_alpha
from svattn.nn.options import SolverOptions, resolve_solver
from svattn.nn.readout import readout_fused

__all__ = ["sv_attention", "sv_attention_state", "MODES"]

MODES = ("batched", "exact")


def _check_C(C: object) -> float:
    if isinstance(C, bool) or not isinstance(C, (int, float)):
        raise ValueError(f"C must be a positive real number, got {C!r}")
    C = float(C)
    if not (math.isfinite(C) and C > 0):
        raise ValueError(f"C must be a finite number > 0, got {C!r}")
    return C


def sv_attention_state(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    C: float,
    kernel: str = "rbf",
    gamma: float | None = None,
    mode: str = "batched",
    key_mask: torch.Tensor | None = None,
    solver: SolverOptions | None = None,
    ridge: float | None = None,
    ridge_steps: int | None = None,
    max_iter: int | None = None,
    refine: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor, Partition, BatchedInfo | None]:
    """Like :func:`sv_attention`, returning ``(out, alpha, partition, info)``.

    ``info`` holds the batched solver's diagnostics (None in exact mode).
    ``solver`` and the keywords ``ridge``, ``ridge_steps``, ``max_iter``,
    ``refine`` are as in :func:`sv_attention`.
    """
    check_qkv(q, k, v)
    C = _check_C(C)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    solver = resolve_solver(
        solver, ridge=ridge, ridge_steps=ridge_steps, max_iter=max_iter, refine=refine
    )
    ridge = solver.ridge
    if not (isinstance(ridge, (int, float)) and ridge >= 0):
        raise ValueError(f"ridge must be a number >= 0, got {ridge!r}")
    valid = check_key_mask(key_mask, k)  # (B, H, Tk)
    check_feasible(valid, C)
    gamma = resolve_gamma(kernel, gamma, k.shape[-1])
    if mode == "exact":
        alpha, part = exact_alpha(k, valid, C, kernel, gamma)
        info = None
    else:
        alpha, part, info = solve_batched(
            k, C, kernel=kernel, gamma=gamma, valid=valid, solver=solver
        )
    # Reserve (and absent) tokens have alpha = 0, so log alpha = −inf gives them exactly
    # zero weight: reading all Tk keys keeps the size static (no host sync).
    out = readout_fused(q, k, v, alpha, kernel, gamma)  # (B, H, Tq, Dv)
    return out, alpha, part, info


def sv_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    C: float,
    kernel: str = "rbf",
    gamma: float | None = None,
    mode: str = "batched",
    key_mask: torch.Tensor | None = None,
    return_alpha: bool = False,
    solver: SolverOptions | None = None,
    ridge: float | None = None,
    ridge_steps: int | None = None,
    max_iter: int | None = None,
    refine: int | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Support-vector attention: queries read the SV memory built from the keys.

    For each (batch, head) the memory coefficients solve the SVDD dual
    ``min alpha^T K alpha − diag(K)^T alpha`` s.t. ``Σ alpha = 1, 0 <= alpha <= C``
    over the present keys; the output is
    ``softmax_i(log alpha_i + log k(q, x_i)) · V``.

    Parameters
    ----------
    q : Tensor ``[B, H, Tq, D]``
    k : Tensor ``[B, H, Tk, D]``
    v : Tensor ``[B, H, Tk, Dv]``
    C : float
        Box on each coefficient; needs ``n·C >= 1`` for the ``n`` present keys.
    kernel : {"rbf", "exp"}
        ``exp(-gamma‖x − y‖²)`` or ``exp(gamma x·y)``.
    gamma : float, optional
        Default ``1/D`` (rbf) or ``1/sqrt(D)`` (exp).
    mode : {"batched", "exact"}
        ``"batched"``: FISTA + active set + ridge-regularised margin solve, all
        problems at once on k's device, differentiable through autograd.
        ``"exact"``: float64 exact solver per problem with an implicit backward.
    key_mask : bool Tensor broadcastable to ``[B, H, Tk]``, optional
        True where a key is present; absent keys get ``alpha = 0`` and no gradient.
    return_alpha : bool
        Also return ``alpha`` ``[B, H, Tk]``.
    solver : SolverOptions, optional
        Options of the batched solver: ridge, ridge steps, FISTA iteration cap,
        active-set repair rounds (default :class:`~svattn.nn.SolverOptions()`:
        1e-3, 1, 20, 10). Ignored in exact mode.
    ridge, ridge_steps, max_iter, refine : optional
        Shorthands that replace the matching field of ``solver``
        (``sv_attention(q, k, v, C=C, ridge=0.0)``); None leaves it as it is.

    Returns
    -------
    out : Tensor ``[B, H, Tq, Dv]``
    alpha : Tensor ``[B, H, Tk]``, only if ``return_alpha``

    Raises
    ------
    ValueError
        On shapes that are not ``[B, H, T, D]`` or do not match, non-finite
        inputs, a bad key mask, or ``n·C < 1`` (infeasible memory).

    Examples
    --------
    >>> import torch
    >>> g = torch.Generator().manual_seed(0)
    >>> q, k, v = (torch.randn(1, 2, 16, 4, generator=g) for _ in range(3))
    >>> out, alpha = sv_attention(q, k, v, C=0.25, return_alpha=True)
    >>> out.shape, alpha.shape
    (torch.Size([1, 2, 16, 4]), torch.Size([1, 2, 16]))
    >>> bool(torch.allclose(alpha.sum(-1), torch.ones(1, 2)))
    True
    """
    solver = resolve_solver(
        solver, ridge=ridge, ridge_steps=ridge_steps, max_iter=max_iter, refine=refine
    )
    out, alpha, _, _ = sv_attention_state(
        q, k, v, C=C, kernel=kernel, gamma=gamma, mode=mode, key_mask=key_mask, solver=solver
    )
    return (out, alpha) if return_alpha else out
