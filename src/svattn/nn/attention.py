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
-inf = ignore, as :class:`torch.nn.MultiheadAttention` takes it); not both. Per
query, ``attn_mask`` (SDPA's convention: True = takes part) or ``is_causal``: then
each query reads its own memory over the keys it sees, and alpha is
``[B, H, Tq, Tk]``. A memory over fewer than ``⌈1/C⌉`` keys gets its box raised to
``1/n`` (uniform weights; none: output 0). Conventions and the rule:
:mod:`svattn.nn.masks`.
"""

from __future__ import annotations

import math

import torch

from svattn.exact.core.conventions import warmup_threshold
from svattn.exact.core.kernels import check_kernel
from svattn.nn.batched import BatchedInfo
from svattn.nn.common import Partition, check_key_mask, check_qkv, host_reads, resolve_gamma
from svattn.nn.exact_fn import exact_alpha
from svattn.nn.masks import query_mask, raise_short, short_memories
from svattn.nn.options import SolverOptions, resolve_solver
from svattn.nn.readout import readout_fused, sv_readout_reference
from svattn.nn.working_set import solve_memory

__all__ = ["sv_attention", "sv_attention_state", "sv_attention_reference", "check_params", "MODES"]

MODES = ("batched", "exact")
_HALF = (torch.float16, torch.bfloat16)
# Per-query memories (attn_mask, is_causal) are solved in blocks of queries whose kernel
# matrices hold at most this many entries (as the hybrid's boundary groups).
QUERY_BLOCK_ENTRIES = 1 << 25


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
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    finish: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor, Partition, BatchedInfo | None]:
    """Like :func:`sv_attention`, returning ``(out, alpha, partition, info)``.

    ``info`` holds the batched solver's diagnostics (None in exact mode).
    ``solver`` and the keywords ``ridge``, ``ridge_steps``, ``max_iter``,
    ``refine``, ``finish``, ``key_mask``, ``key_padding_mask``, ``attn_mask``,
    ``is_causal`` are as in :func:`sv_attention`. The partition's sets are alpha's shape;
    :meth:`Partition.box_raised(C) <svattn.nn.common.Partition.box_raised>` flags the
    memories over fewer than ``⌈1/C⌉`` keys.
    """
    check_qkv(q, k, v)
    C = check_params(C, kernel, mode, gamma)
    valid = _resolve_masks(key_mask, key_padding_mask, k)  # (B, H, Tk)
    sees = query_mask(attn_mask, is_causal, q, k)  # None or (B, H, Tq, Tk)
    dtype = q.dtype
    work = torch.promote_types(dtype, torch.float32)
    if dtype in _HALF or _autocast_on(q.device.type):
        # solved and read in float32, autocast off (module docstring); the output is cast back
        with torch.autocast(device_type=q.device.type, enabled=False):
            out, alpha, part, info = sv_attention_state(
                q.to(work), k.to(work), v.to(work), C=C, kernel=kernel, gamma=gamma, mode=mode,
                key_mask=valid, solver=solver, ridge=ridge, ridge_steps=ridge_steps,
                max_iter=max_iter, refine=refine, finish=finish, attn_mask=sees,
            )  # fmt: skip
        return out.to(dtype), alpha, part, info
    solver = resolve_solver(
        solver, ridge=ridge, ridge_steps=ridge_steps, max_iter=max_iter, refine=refine,
        finish=finish,
    )  # its fields are checked at construction (SolverOptions)
    gamma = resolve_gamma(kernel, gamma, k.shape[-1])
    masked = key_mask is not None or key_padding_mask is not None
    if sees is None:
        return _memory_and_read(q, k, v, valid, C, kernel, gamma, mode, solver, masked)
    return _per_query(q, k, v, valid.unsqueeze(2) & sees, C, kernel, gamma, mode, solver)


def _memory_and_read(q, k, v, valid, C, kernel, gamma, mode, solver, masked):
    """One memory per (batch, head) over its ``valid`` keys, read by all its queries.

    Short memories (fewer than ``⌈1/C⌉`` keys) get the raised box of
    :mod:`svattn.nn.masks`; empty ones read 0. Without a mask every memory holds all
    ``Tk`` keys, so both are known from the shapes alone; on CPU in eager mode, where
    reading is free, the stand-ins are skipped when no memory is short (same result).
    """
    Tk, m = k.shape[2], warmup_threshold(C)
    n, short = short_memories(valid, C)  # (B, H) each, no host read
    if mode == "exact":
        alpha, part = exact_alpha(k, valid, C, kernel, gamma)  # raises short boxes itself
        info = None
    elif Tk < m:  # every memory is short: nothing to solve
        none = torch.zeros_like(valid)
        alpha, part = raise_short(k.new_zeros(valid.shape), Partition(none, none, none), valid,
                                  n, short)
        zero = torch.zeros((), dtype=torch.long, device=k.device)
        info = BatchedInfo(0, 0, k.new_zeros(()), zero, zero)
    elif not masked or (host_reads(valid) and not bool(short.any())):  # none is short
        alpha, part, info = solve_memory(k, C, kernel=kernel, gamma=gamma, valid=valid,
                                         solver=solver)
    else:  # short memories solve a stand-in over their first m slots, then are replaced
        first = torch.arange(Tk, device=k.device) < m
        alpha, part, info = solve_memory(
            k, C, kernel=kernel, gamma=gamma, valid=torch.where(short.unsqueeze(-1), first, valid),
            solver=solver, stand_in=short)  # fmt: skip
        alpha, part = raise_short(alpha, part, valid, n, short)
    # Reserve (and absent) tokens have alpha = 0, so log alpha = −inf gives them exactly
    # zero weight: reading all Tk keys keeps the size static (no host sync).
    if not masked:
        return readout_fused(q, k, v, alpha, kernel, gamma), alpha, part, info
    empty = (n == 0).unsqueeze(-1)  # an empty memory reads a stand-in, then outputs 0
    read = torch.where(empty, (torch.arange(Tk, device=k.device) == 0).to(alpha.dtype), alpha)
    out = readout_fused(q, k, v, read, kernel, gamma)  # (B, H, Tq, Dv)
    return torch.where(empty.unsqueeze(-1), 0.0, out), alpha, part, info


def _per_query(q, k, v, sees, C, kernel, gamma, mode, solver):
    """One memory per (batch, head, query) over the keys it ``sees`` ``[B, H, Tq, Tk]``:
    each query is a head of its own reading one memory, in blocks of queries whose kernel
    matrices fit in :data:`QUERY_BLOCK_ENTRIES` entries (as the hybrid's boundaries)."""
    B, H, Tq, D = q.shape
    Tk = k.shape[2]
    G = max(1, QUERY_BLOCK_ENTRIES // (B * H * Tk * Tk))  # queries per block
    outs, alphas, parts, infos = [], [], [], []
    for t0 in range(0, Tq, G):
        g = min(G, Tq - t0)
        qb = q[:, :, t0 : t0 + g].reshape(B, H * g, 1, D)  # (B, H·g, 1, D)
        kb = k.unsqueeze(2).expand(B, H, g, Tk, D).reshape(B, H * g, Tk, D)
        vb = v.unsqueeze(2).expand(B, H, g, Tk, v.shape[-1]).reshape(B, H * g, Tk, -1)
        ob, ab, pb, ib = _memory_and_read(qb, kb, vb, sees[:, :, t0 : t0 + g].reshape(B, H * g, Tk),
                                          C, kernel, gamma, mode, solver, True)
        outs.append(ob.view(B, H, g, -1))  # (B, H, g, Dv)
        alphas.append(ab.view(B, H, g, Tk))
        parts.append([s.view(B, H, g, Tk) for s in pb])
        infos.append(ib)
    part = Partition(*(torch.cat(sets, 2) for sets in zip(*parts, strict=True)))
    info = None if mode == "exact" else BatchedInfo(
        max(i.fista_iters for i in infos), max(i.refine_rounds for i in infos),
        torch.stack([i.max_kkt_violation for i in infos]).amax(),
        sum(i.box_violations for i in infos), sum(i.unsettled for i in infos))
    return torch.cat(outs, 2), torch.cat(alphas, 2), part, info


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
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    finish: str | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """Support-vector attention: queries read the SV memory built from the keys.

    For each (batch, head) the memory coefficients solve the SVDD dual
    ``min alpha^T K alpha − diag(K)^T alpha`` s.t. ``Σ alpha = 1, 0 <= alpha <= C``
    over the present keys; the output is
    ``softmax_i(log alpha_i + log k(q, x_i)) · V``. With ``attn_mask`` or
    ``is_causal`` each query has its own memory over the keys it sees.

    Parameters
    ----------
    q : Tensor ``[B, H, Tq, D]``
    k : Tensor ``[B, H, Tk, D]``
    v : Tensor ``[B, H, Tk, Dv]``
    C : float
        Box on each coefficient: ``C = 1/k`` lets ``k`` keys carry all the weight (at
        least ``⌈1/C⌉`` do). A memory over fewer keys has its box raised (Notes).
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
    attn_mask : Tensor broadcastable to ``[B, H, Tq, Tk]``, optional
        As :func:`torch.nn.functional.scaled_dot_product_attention`: bool with
        **True = takes part**, or float with 0 = takes part and -inf = masked. Query
        ``i`` reads a memory over the keys it may see (and ``key_mask`` /
        ``key_padding_mask`` keep); one memory per query costs ``Tq`` solves.
    is_causal : bool
        As SDPA: query ``i`` sees keys ``j <= i`` (top-left aligned). Not with
        ``attn_mask``. For long causal sequences the chunked
        :class:`svattn.mixers.HybridSVAttention` solves one memory per chunk instead.
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
    alpha : Tensor ``[B, H, Tk]`` (``[B, H, Tq, Tk]`` with ``attn_mask`` or ``is_causal``),
        only if ``return_alpha``

    Raises
    ------
    ValueError
        On shapes that are not ``[B, H, T, D]`` or do not match, non-finite
        inputs, a bad or ambiguous mask, or ``attn_mask`` with ``is_causal``.

    Notes
    -----
    float16 / bfloat16 inputs and autocast are solved in float32 (module docstring);
    ``out`` comes back in the input dtype (the autocast dtype under autocast).

    A memory over ``n`` keys with ``n·C < 1`` (a short sequence in a padded batch,
    an early query under ``is_causal``, or ``Tk < 1/C``) has its box raised to
    ``1/n``: each of its keys gets weight ``1/n`` exactly, masked keys 0, and no
    gradient flows through alpha (only through the readout, to present keys). A
    memory with no key outputs 0. ``sv_attention_state(...)[2].box_raised(C)`` flags
    them (:mod:`svattn.nn.masks`).

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
        key_padding_mask=key_padding_mask, attn_mask=attn_mask, is_causal=is_causal,
    )
    return (out, alpha) if return_alpha else out


def sv_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    C: float,
    kernel: str = "rbf",
    gamma: float | None = None,
    mode: str = "exact",
    solver: SolverOptions | None = None,
    key_padding_mask: torch.Tensor | None = None,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Masked SV attention by a slow loop: every memory solved alone on its unpadded keys.

    Reference for :func:`sv_attention` with masks (:mod:`svattn.nn.masks`) (tests compare values and
    gradients). For each batch row ``b``, head ``h`` and query ``i``, the keys it sees
    (not padded in ``key_padding_mask`` — bool, True = ignore —, ``attn_mask[.., i, j]``
    True — bool, SDPA's convention, broadcast to ``[B, H, Tq, Tk]`` —, ``j <= i`` under
    ``is_causal``) are gathered; with ``n >= ⌈1/C⌉`` of them the memory is
    ``sv_attention`` of that unpadded sequence alone, with ``1 <= n < ⌈1/C⌉`` it is
    uniform ``1/n``, with none the output is 0. Read by
    :func:`svattn.nn.readout.sv_readout_reference`.

    Returns
    -------
    out : Tensor ``[B, H, Tq, Dv]``
    alpha : Tensor ``[B, H, Tq, Tk]``, one memory per query
    """
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    m = warmup_threshold(C)
    outs, alphas = [], []
    for b in range(B):
        for h in range(H):
            for i in range(Tq):
                sees = [j for j in range(Tk)
                        if (key_padding_mask is None or not bool(key_padding_mask[b, j]))
                        and (attn_mask is None or bool(attn_mask.expand(B, H, Tq, Tk)[b, h, i, j]))
                        and (not is_causal or j <= i)]
                alpha = q.new_zeros(Tk)
                if not sees:
                    outs.append(v.new_zeros(v.shape[-1]))
                    alphas.append(alpha)
                    continue
                idx = torch.tensor(sees)
                q1, k1, v1 = q[b, h, i][None, None, None], k[b, h, idx][None, None], \
                    v[b, h, idx][None, None]
                if len(sees) < m:
                    a1 = torch.full((1, 1, len(sees)), 1.0 / len(sees), dtype=q.dtype)
                else:
                    _, a1 = sv_attention(q1, k1, v1, C=C, kernel=kernel, gamma=gamma, mode=mode,
                                         solver=solver, return_alpha=True)
                outs.append(sv_readout_reference(q1, k1, v1, a1, kernel=kernel,
                                                 gamma=gamma)[0, 0, 0])
                alphas.append(alpha.index_put((idx,), a1[0, 0]))
    out = torch.stack(outs).view(B, H, Tq, v.shape[-1])
    return out, torch.stack(alphas).view(B, H, Tq, Tk)
