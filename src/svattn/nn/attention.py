"""``sv_attention``: build the SV memory over the keys, then read it with the queries.

Layout ``[B, H, T, D]``: q ``[B, H, Tq, D]``, k ``[B, H, Tk, D]``, v ``[B, H, Tk, Dv]``,
alpha ``[B, H, Tk]``, output ``[B, H, Tq, Dv]``.

Precision: half-precision inputs (float16, bfloat16, or float32 under
``torch.autocast``) are solved and read in float32 with autocast off — the
solver's LU factorisations have no half-precision kernels, and FISTA and the
margin solve are not meant for them — and the output is cast back to the input
dtype (alpha stays float32). The hybrid mixer does the same.

Masks: ``key_mask`` (True = keep, broadcastable to ``[B, H, Tk]``) or torch's
``key_padding_mask`` (``[B, Tk]``, True = ignore, or a float mask of 0 = keep and
-inf = ignore, as :class:`torch.nn.MultiheadAttention` takes it); not both.
"""

from __future__ import annotations

import math

import torch

from svattn.exact.core.conventions import warmup_threshold
from svattn.exact.core.kernels import check_kernel
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

__all__ = ["sv_attention", "sv_attention_state", "check_params", "MODES"]

MODES = ("batched", "exact")
_HALF = (torch.float16, torch.bfloat16)


def _check_C(C: object) -> float:
    if isinstance(C, bool) or not isinstance(C, (int, float)):
        raise ValueError(f"C must be a positive real number, got {C!r}")
    C = float(C)
    if not (math.isfinite(C) and C > 0):
        raise ValueError(f"C must be a finite number > 0, got {C!r}")
    warmup_threshold(C)  # refuses a C too small for any memory to reach its optimum
    return C


def _autocast_on(device_type: str) -> bool:
    try:
        return torch.is_autocast_enabled(device_type)
    except TypeError:  # torch < 2.4 takes no device type
        return (torch.is_autocast_cpu_enabled() if device_type == "cpu"
                else torch.is_autocast_enabled())


def check_params(C: object, kernel: object, mode: object, gamma: object) -> float:
    """Check the memory's parameters, naming the one at fault; return ``float(C)``.

    Raises
    ------
    ValueError
        ``C`` not a finite number > 0, ``kernel`` not ``"rbf"`` / ``"exp"``, ``mode``
        not one of :data:`MODES`, or ``gamma`` neither None nor a finite number > 0.

    Examples
    --------
    >>> check_params(0.5, "rbf", "batched", None)
    0.5
    >>> check_params(0.5, "foo", "batched", None)
    Traceback (most recent call last):
        ...
    ValueError: kernel must be one of ('rbf', 'exp'), got 'foo'
    """
    C = _check_C(C)
    check_kernel(kernel, dot_form=True)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if gamma is not None and (isinstance(gamma, bool) or not isinstance(gamma, (int, float))
                              or not (math.isfinite(gamma) and gamma > 0)):
        raise ValueError(f"gamma must be > 0 (a finite number, or None for the default), "
                         f"got {gamma!r}")
    return C


def padding_to_key_mask(key_padding_mask: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """torch's ``key_padding_mask`` ``[B, Tk]`` (True, or -inf, = ignore) as a ``key_mask``
    ``[B, 1, Tk]`` (True = keep).

    Raises
    ------
    ValueError
        If the mask is not ``[B, Tk]`` for k's ``B`` and ``Tk``, or a float mask
        holds values other than 0 and -inf (an additive bias has no meaning for
        the SV memory's weights).

    Examples
    --------
    >>> k = torch.zeros(2, 3, 4, 8)
    >>> padding_to_key_mask(torch.tensor([[False] * 4, [False, False, True, True]]), k)[1]
    tensor([[ True,  True, False, False]])
    """
    B, _, Tk, _ = k.shape
    m = key_padding_mask
    if not isinstance(m, torch.Tensor) or tuple(m.shape) != (B, Tk):
        shape = tuple(m.shape) if isinstance(m, torch.Tensor) else type(m).__name__
        raise ValueError(f"key_padding_mask must be [B, Tk] = [{B}, {Tk}] (torch's convention: "
                         f"True = ignore), got {shape}")
    if m.dtype == torch.bool:
        return (~m).to(k.device).unsqueeze(1)
    if not m.is_floating_point():
        raise ValueError(f"key_padding_mask must be bool (True = ignore) or float (0 = keep, "
                         f"-inf = ignore), got dtype {m.dtype}")
    if not bool(((m == 0) | (m == float("-inf"))).all()):
        raise ValueError("key_padding_mask: a float mask may hold only 0 (keep) and -inf "
                         "(ignore); an additive bias has no meaning for SV weights")
    return (m == 0).to(k.device).unsqueeze(1)


def _resolve_masks(key_mask: torch.Tensor | None, key_padding_mask: torch.Tensor | None,
                   k: torch.Tensor) -> torch.Tensor:
    """One ``[B, H, Tk]`` keep-mask from either convention, rejecting ambiguous input."""
    if key_mask is not None and key_padding_mask is not None:
        raise ValueError("give key_mask (True = keep) or key_padding_mask (True = ignore), "
                         "not both")
    if key_padding_mask is not None:
        key_mask = padding_to_key_mask(key_padding_mask, k)
    elif (isinstance(key_mask, torch.Tensor) and key_mask.dim() == 2
          and key_mask.shape[0] != 1):
        # a [B, Tk] mask is what torch users pass; broadcasting would read it as [H, Tk]
        B, H, Tk, _ = k.shape
        what = ("is ambiguous: it broadcasts to [B, H, Tk] as one row per head [H, Tk]"
                if key_mask.shape[0] == H else f"does not broadcast to [B, H, Tk] = {[B, H, Tk]}")
        raise ValueError(
            f"key_mask of shape {tuple(key_mask.shape)} {what}; for one mask per batch row "
            "pass key_mask[:, None, :] (True = keep) or key_padding_mask [B, Tk] (torch's "
            "convention, True = ignore), for one per head key_mask[None]")
    return check_key_mask(key_mask, k)  # (B, H, Tk)


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
    key_padding_mask: torch.Tensor | None = None,
    finish: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, Partition, BatchedInfo | None]:
    """Like :func:`sv_attention`, returning ``(out, alpha, partition, info)``.

    ``info`` holds the batched solver's diagnostics (None in exact mode).
    ``solver`` and the keywords ``ridge``, ``ridge_steps``, ``max_iter``,
    ``refine``, ``finish``, ``key_mask``, ``key_padding_mask`` are as in
    :func:`sv_attention`.
    """
    check_qkv(q, k, v)
    C = check_params(C, kernel, mode, gamma)
    valid = _resolve_masks(key_mask, key_padding_mask, k)  # (B, H, Tk)
    dtype = q.dtype
    work = torch.promote_types(dtype, torch.float32)
    if dtype in _HALF or _autocast_on(q.device.type):
        # solved and read in float32, autocast off (module docstring); the output is cast back
        with torch.autocast(device_type=q.device.type, enabled=False):
            out, alpha, part, info = sv_attention_state(
                q.to(work), k.to(work), v.to(work), C=C, kernel=kernel, gamma=gamma, mode=mode,
                key_mask=valid, solver=solver, ridge=ridge, ridge_steps=ridge_steps,
                max_iter=max_iter, refine=refine, finish=finish,
            )  # fmt: skip
        return out.to(dtype), alpha, part, info
    solver = resolve_solver(
        solver, ridge=ridge, ridge_steps=ridge_steps, max_iter=max_iter, refine=refine,
        finish=finish,
    )  # its fields are checked at construction (SolverOptions)
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
    key_padding_mask: torch.Tensor | None = None,
    finish: str | None = None,
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
        ``"batched"``: FISTA, then each problem's SVDD optimum (verified; the
        default finish) or the paper's active set + ridged margin solve
        (``finish="approximate"``), all problems at once, differentiable.
        ``"exact"``: float64 exact solver per problem with an implicit backward.
    key_mask : bool Tensor broadcastable to ``[B, H, Tk]``, optional
        True where a key is present; absent keys get ``alpha = 0`` and no gradient.
        A 2-D mask must be ``[1, Tk]`` (a ``[B, Tk]`` one is refused as ambiguous).
    key_padding_mask : Tensor ``[B, Tk]``, optional
        torch's convention instead (:class:`torch.nn.MultiheadAttention`): bool with
        True = ignore, or float with 0 = keep and -inf = ignore. Not with ``key_mask``.
    return_alpha : bool
        Also return ``alpha`` ``[B, H, Tk]``.
    solver : SolverOptions, optional
        Options of the batched solver: FISTA iterations, the finish (the verified
        optimum, or ``"approximate"`` with its ridge, ridge steps and repair rounds);
        default :class:`~svattn.nn.SolverOptions()`. Ignored in exact mode.
    ridge, ridge_steps, max_iter, refine, finish : optional
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
        inputs, a bad or ambiguous key mask, or ``n·C < 1`` (infeasible memory).

    Notes
    -----
    float16 / bfloat16 inputs and autocast are solved in float32 (module docstring);
    ``out`` comes back in the input dtype (the autocast dtype under autocast).

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
        solver, ridge=ridge, ridge_steps=ridge_steps, max_iter=max_iter, refine=refine,
        finish=finish,
    )
    out, alpha, _, _ = sv_attention_state(
        q, k, v, C=C, kernel=kernel, gamma=gamma, mode=mode, key_mask=key_mask, solver=solver,
        key_padding_mask=key_padding_mask,
    )
    return (out, alpha) if return_alpha else out
