"""``HybridSVAttention``: chunked causal mixer, SV memory of the past + local softmax.

docs/design.md §5. The sequence ``x`` ``[B, T, D]`` is cut into chunks of ``L`` tokens
(the last one may be short). Per head, with ``q, k, v`` ``[B, H, T, Dh]`` from one
shared projection:

* **local path**: causal softmax attention inside the chunk (dense ``L × L``);
* **global path**: for chunk ``c >= 1`` the queries read an SV memory
  (:func:`svattn.nn.sv_attention`) solved at the boundary before chunk ``c``
  and frozen while chunk ``c`` is read: ``softmax_i(log alpha_i + log k(q, x_i)) · V``
  over the keys of earlier chunks only, so the layer is causal;
* **gate**: a learned per-head ``g_h = sigmoid(w_h)`` mixes them,
  ``o = g_h · global + (1 − g_h) · local``. Chunk 0 has no past and reads the
  local path only, so with ``L >= T`` the layer *is* causal softmax attention.

Memory policies (what the boundary problem before chunk ``c`` sees)
--------------------------------------------------------------------
``"full"``
    Every key of chunks ``0 .. c−1``. All boundaries are independent, so they
    are solved as **one** padded batched problem: keys ``[B, H·M, (M)·L, Dh]``
    for ``M = ⌈T/L⌉ − 1`` boundaries, with a key mask marking the prefix of
    each. Inference state: every key and value, ``2·T·D`` floats per layer.
``"support"``
    The previous boundary's kept tokens (margin ∪ error, i.e. ``alpha > 0``)
    plus the keys of chunk ``c − 1``. This is certified selection used as
    compression: reserve tokens have ``alpha = 0`` and change no readout of
    the previous memory, for any query. Dropping them is exact for the
    readout of chunk ``c − 1``, and it equals ``"full"`` at every later
    boundary as long as no dropped token would have re-entered the support
    (if the full problem keeps every earlier reserve token in its reserve set,
    its optimum satisfies the KKT conditions of the reduced problem too).
    When the kept set exceeds ``budget`` tokens, the ``budget`` tokens with the
    largest ``alpha`` are carried (the one step of this policy that is an
    approximation; it is counted in :attr:`HybridSVAttention.truncated_`).
    Boundaries are solved one after another, each batched over ``B·H``.
    Inference state: at most ``budget + L`` keys and values,
    ``2·min(T, budget + L)·D`` floats per layer — bounded.

The memory coefficients ``alpha`` (one float per kept token and head) are not
counted in :meth:`state_floats`, as the baselines' KV caches count keys and
values only.

``mode="batched"`` (default) runs the differentiable batched solver (FISTA, then by
default each problem's verified SVDD optimum, :class:`~svattn.nn.SolverOptions`);
``mode="exact"`` runs the float64 exact solver on every boundary
problem (slow; for inference, where deletion certificates rely on it). The
readout and gate are the same in both modes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from svattn.exact.core.conventions import warmup_threshold
from svattn.exact.core.kernels import check_kernel
from svattn.mixers.hybrid_state import HybridState, MemoryReads
from svattn.mixers.softmax import SoftmaxAttention
from svattn.mixers.state import attend_cached
from svattn.nn.attention import MODES, sv_attention_state
from svattn.nn.batched import (
    boundary_partition,
    compiled_boundary_partition,
    solve_batched,
)
from svattn.nn.common import Partition, host_reads, non_finite, resolve_gamma
from svattn.nn.gather_cpu import token_rows
from svattn.nn.margin import margin_solve_factored
from svattn.nn.options import SolverOptions, resolve_solver
from svattn.nn.readout import readout_fused

__all__ = ["HybridSVAttention", "POLICIES", "chunked_causal_softmax", "gate_mix",
           "gate_mix_reference"]

POLICIES = ("full", "support")

# Most kernel-matrix entries one batched solve of the "full" policy may hold.
GROUP_ENTRIES = 1 << 25


def chunked_causal_softmax(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, chunk: int, lookback: int = 0
) -> torch.Tensor:
    """Causal softmax attention inside each chunk of ``chunk`` tokens.

    ``q, k, v`` ``[B, H, T, Dh]`` → ``[B, H, T, Dh]``; query ``t`` sees keys
    ``floor(t / chunk)·chunk − lookback .. t`` (from 0 on): with ``lookback > 0``
    each chunk also sees the last ``lookback`` keys before it.
    """
    B, H, T, Dh = q.shape
    pad = (-T) % chunk
    if lookback == 0 and pad == 0:
        # chunks as batch entries, (B·N, H, L, ·): 4-D inputs take the fused (flash) kernel,
        # and for the heads of one (B, T, H·Dh) projection (q, k, v as split_heads gives
        # them) both this view and the output's way back are free of copies
        n = T // chunk

        def chunks(z: torch.Tensor) -> torch.Tensor:
            return z.unflatten(2, (n, chunk)).transpose(1, 2).reshape(B * n, H, chunk, -1)

        o = F.scaled_dot_product_attention(chunks(q), chunks(k), chunks(v), is_causal=True)
        return o.unflatten(0, (B, n)).transpose(1, 2).reshape(B, H, T, -1)
    if pad:  # padding sits at the end of the last chunk: causal masking hides it
        q, k, v = (F.pad(z, (0, 0, 0, pad)) for z in (q, k, v))
    n = (T + pad) // chunk
    if lookback == 0:  # chunks as heads: 4-D inputs take the fused (flash) kernel
        qc, kc, vc = (z.reshape(B, H * n, chunk, z.shape[-1]) for z in (q, k, v))
        o = F.scaled_dot_product_attention(qc, kc, vc, is_causal=True)  # (B, H·N, L, Dh)
        return o.reshape(B, H, n * chunk, -1)[:, :, :T]
    qc = q.reshape(B, H, n, chunk, Dh)  # (B, H, N, L, Dh)
    # chunk i reads keys [i·L − lookback, (i + 1)·L): windows of a left-padded sequence
    span = lookback + chunk
    kc, vc = (
        F.pad(z, (0, 0, lookback, 0)).unfold(2, span, chunk).transpose(-1, -2)
        for z in (k, v)
    )  # (B, H, N, lookback + L, Dh)
    row = torch.arange(chunk, device=q.device)[:, None]
    col = torch.arange(span, device=q.device)[None, :]
    first = chunk * torch.arange(n, device=q.device)[:, None, None] - lookback  # key 0's position
    mask = (col <= row + lookback) & (first + col >= 0)  # (N, L, lookback + L): causal, no pad
    o = F.scaled_dot_product_attention(qc, kc, vc, attn_mask=mask)  # (B, H, N, L, Dh)
    return o.reshape(B, H, n * chunk, -1)[:, :, :T]


def gate_mix_reference(local: torch.Tensor, glob: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """``g_h·global + (1 − g_h)·local`` from chunk 1 on, the local path alone on chunk 0.

    ``local`` ``(B, H, T, Dh)``, ``glob`` ``(B, H, T − L, Dh)`` (chunks 1..), ``g``
    ``(H,)``. The torch form (one ``lerp`` on the zero-padded global output): what
    accelerators and ``torch.compile`` run, and :func:`gate_mix`'s reference.
    """
    T, L = local.shape[2], local.shape[2] - glob.shape[2]
    glob = F.pad(glob, (0, 0, L, 0))  # (B, H, T, Dh), 0 on chunk 0
    after = (torch.arange(T, device=local.device) >= L).to(local.dtype).view(1, 1, T, 1)
    return torch.lerp(local, glob, g.view(1, -1, 1, 1) * after)


class _GateMix(torch.autograd.Function):
    """:func:`gate_mix_reference` without the padded copy of ``glob`` (CPU, eager).

    The output takes ``local``'s layout (the local path's is that of the heads' merge:
    ``merge_heads`` then needs no copy); chunk 0 is copied, the rest is one ``lerp``.
    Backward: ``g_local = G`` on chunk 0 and ``G·(1 − g)`` after, ``g_glob = G·g``,
    ``g_g = Σ G ⊙ (glob − local)`` over chunks 1.. (``lerp``'s own derivatives).
    """

    @staticmethod
    def forward(ctx, local, glob, g):
        L = local.shape[2] - glob.shape[2]
        w = g.view(1, -1, 1, 1)
        out = torch.empty_like(local)
        out[:, :, :L] = local[:, :, :L]
        torch.lerp(local[:, :, L:], glob, w, out=out[:, :, L:])
        ctx.save_for_backward(local, glob, g)
        return out

    @staticmethod
    def backward(ctx, grad):
        local, glob, g = ctx.saved_tensors
        L = local.shape[2] - glob.shape[2]
        w = g.view(1, -1, 1, 1)
        tail = grad[:, :, L:]
        g_local = g_glob = g_g = None
        if ctx.needs_input_grad[0]:
            g_local = torch.empty_like(grad)
            g_local[:, :, :L] = grad[:, :, :L]
            torch.mul(tail, 1.0 - w, out=g_local[:, :, L:])
        if ctx.needs_input_grad[1]:
            g_glob = tail * w
        if ctx.needs_input_grad[2]:
            g_g = (tail * (glob - local[:, :, L:])).sum((0, 2, 3))
        return g_local, g_glob, g_g


def gate_mix(local: torch.Tensor, glob: torch.Tensor, g: torch.Tensor) -> torch.Tensor:
    """:func:`gate_mix_reference`; on CPU in eager mode as one autograd Function
    (no zero-padded copy of ``glob``, the output in ``local``'s layout)."""
    if host_reads(local) and glob.shape[2] < local.shape[2]:
        return _GateMix.apply(local, glob, g)
    return gate_mix_reference(local, glob, g)


class HybridSVAttention(SoftmaxAttention):
    """Chunked hybrid of an SV memory of earlier chunks and local causal softmax.

    See the module docstring for the two paths, the gate and the memory
    policies. Obeys the mixer contract of :mod:`svattn.mixers.base`
    (``forward(x [B, T, D]) -> [B, T, D]``, causal; ``state_floats(T)``: floats of context state).
    The projections are those of :class:`~svattn.mixers.softmax.SoftmaxAttention`
    (``qkv``, ``out``), shared by both paths; the only extra parameters are the
    ``n_heads`` gate logits ``gate``.

    Parameters
    ----------
    d_model, n_heads : int
        Width and heads (``d_model`` divisible by ``n_heads``).
    chunk : int
        Chunk length ``L`` (``>= 1``).
    C : float
        Box of the SVDD dual. Every boundary problem needs ``n·C >= 1``; the
        smallest has ``n = L`` keys, so ``C >= 1/L`` is required. At least
        ``ceil(1/C)`` tokens carry weight in each memory.
    kernel : {"rbf", "exp"}
        Kernel of the memory and its readout.
    gamma : float, optional
        Kernel bandwidth (default ``1/Dh`` for rbf, ``1/sqrt(Dh)`` for exp).
    policy : {"full", "support"}
        Memory policy (module docstring).
    budget : int, optional
        Most tokens the ``"support"`` policy carries across a boundary
        (default ``4·ceil(1/C)``); also what the matched sliding-window baseline
        counts (window ``budget + L``). Must be ``>= ceil(1/C)``.
    mode : {"batched", "exact"}
        Solver of the boundary problems.
    solver : SolverOptions, optional
        Options of the batched solver (:class:`~svattn.nn.SolverOptions`:
        FISTA iterations and the finish: by default each boundary problem's SVDD
        optimum, verified; ``finish="approximate", refine=0`` is the training
        path of docs/design.md §5 as the paper writes it, FISTA → active set → one
        ridged margin solve). Default ``SolverOptions()``.
    ridge, ridge_steps, max_iter, refine, finish : optional
        Replace the matching field of ``solver`` (None: keep it). This flat
        form is what JSON configs and saved checkpoints (``mixer_options``,
        e.g. :data:`svattn.lm.configs.HYBRID_DEFAULTS`) pass.
    gate_init : float
        Initial gate logit (0 → both paths weighted 1/2).
    bias : bool
        Biases in the projections.
    rope : bool
        Rotary positions (:mod:`svattn.mixers.rope`) on the **local** path only.
        The memory stays a function of key content: the SVDD and its readout
        see the unrotated keys and queries.
    lookback : int
        Keys before the chunk that its local path also sees (default 0: the
        local path of docs/design.md §5, inside the chunk only). A variant of ours,
        not the paper's: a chunk's first queries otherwise have no recent
        context but what the memory kept. The state grows by ``lookback``
        tokens (``state_floats``; the matched window is ``budget + lookback + L``).
    compile_solver : bool
        ``"support"`` policy, batched mode: solve each boundary's partition (FISTA +
        repair, no grad) with :func:`svattn.nn.batched.compiled_boundary_partition`,
        compiled once per shape on first use (minutes on a CPU), then a few fused
        kernels per boundary instead of thousands of small ops. For training runs;
        the same results to rounding (default False).

    Attributes
    ----------
    last_partition_ : Partition or None
        Partition of the last boundary problem of the last call (detached).
    kept_ : int
        Largest number of tokens any boundary memory kept in the last call.
    truncated_ : int
        Boundaries (summed over batch and head) where ``"support"`` cut the kept set to
        ``budget`` in the last call (0 under ``"full"``, which never cuts).

    Examples
    --------
    >>> import torch
    >>> mix = HybridSVAttention(16, 2, chunk=8, C=0.25, policy="support", budget=8)
    >>> x = torch.randn(2, 30, 16)
    >>> mix(x).shape
    torch.Size([2, 30, 16])
    >>> mix.state_floats(30) == 2 * (8 + 8) * 16  # budget + L keys and values
    True
    >>> mix.kept_ <= 8 + 8  # a boundary memory: carried support (<= budget) + one chunk
    True
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        chunk: int = 64,
        C: float = 1.0 / 16,
        kernel: str = "rbf",
        gamma: float | None = None,
        policy: str = "support",
        budget: int | None = None,
        mode: str = "batched",
        solver: SolverOptions | None = None,
        ridge: float | None = None,
        ridge_steps: int | None = None,
        max_iter: int | None = None,
        refine: int | None = None,
        finish: str | None = None,
        gate_init: float = 0.0,
        bias: bool = False,
        rope: bool = False,
        lookback: int = 0,
        compile_solver: bool = False,
    ) -> None:
        super().__init__(d_model, n_heads, bias=bias, rope=rope)
        if isinstance(lookback, bool) or not isinstance(lookback, int) or lookback < 0:
            raise ValueError(f"lookback must be an int >= 0, got {lookback!r}")
        if isinstance(chunk, bool) or not isinstance(chunk, int) or chunk < 1:
            raise ValueError(f"chunk must be an int >= 1, got {chunk!r}")
        if (
            isinstance(C, bool)
            or not isinstance(C, (int, float))
            or not (math.isfinite(C) and C > 0)
        ):
            raise ValueError(f"C must be a finite number > 0, got {C!r}")
        if chunk * C < 1.0 - 1e-12:
            raise ValueError(
                f"C = {C} is infeasible for chunk = {chunk}: the first boundary memory holds "
                f"chunk keys and needs chunk·C >= 1, i.e. C >= {1.0 / chunk:.6g}"
            )
        check_kernel(kernel, dot_form=True)
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}")
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        min_support = warmup_threshold(C)  # the fewest tokens that can carry weight
        if budget is None:
            budget = 4 * min_support
        if isinstance(budget, bool) or not isinstance(budget, int) or budget < min_support:
            raise ValueError(
                f"budget must be an int >= ceil(1/C) = {min_support} (the memory keeps at "
                f"least that many tokens), got {budget!r}"
            )
        self.chunk, self.C, self.kernel, self.gamma = chunk, float(C), kernel, gamma
        self.policy, self.budget, self.mode = policy, budget, mode
        self.lookback = lookback
        if not isinstance(compile_solver, bool):
            raise ValueError(f"compile_solver must be a bool, got {compile_solver!r}")
        self.compile_solver = compile_solver
        self.solver = resolve_solver(
            solver, ridge=ridge, ridge_steps=ridge_steps, max_iter=max_iter, refine=refine,
            finish=finish,
        )
        self.gate = nn.Parameter(torch.full((n_heads,), float(gate_init)))
        self.last_partition_: Partition | None = None
        self._kept: torch.Tensor | int = 0  # tensors in the forward (no host sync there)
        self._truncated: torch.Tensor | int = 0

    # ----------------------------------------------------------------- paths

    @property
    def kept_(self) -> int:
        """Largest number of tokens any boundary memory kept in the last call."""
        return int(self._kept)  # the forward keeps it as a tensor: reading it here is the sync

    @property
    def truncated_(self) -> int:
        """Boundaries (summed over batch and head) where ``"support"`` cut the kept set."""
        return int(self._truncated)

    def _gamma(self, head_dim: int) -> float:
        return resolve_gamma(self.kernel, self.gamma, head_dim)

    def _solve(self, q, k, v, key_mask):
        """One padded batch of boundary problems: readout, alpha, partition.

        Batched mode calls the solver and the fused readout directly (the inputs
        are built here, so the public entry's checks would only re-read values on
        the host); exact mode goes through :func:`sv_attention_state` (float64 on
        the host by design).
        """
        if self.mode == "exact":
            out, alpha, part, _ = sv_attention_state(
                q, k, v, C=self.C, kernel=self.kernel, gamma=self.gamma, mode="exact",
                key_mask=key_mask,
            )  # fmt: skip
            return out, alpha, part
        B, H, n, Dh = k.shape
        gamma = self._gamma(Dh)
        valid = key_mask.expand(B, H, n)
        alpha, part, _ = solve_batched(
            k, self.C, kernel=self.kernel, gamma=gamma, valid=valid, solver=self.solver
        )
        return readout_fused(q, k, v, alpha, self.kernel, gamma), alpha, part

    def _global_full(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Chunks 1.. read memories over all earlier keys: padded batched problems.

        Boundaries are batched together in groups whose kernel matrices fit in
        ``GROUP_ENTRIES`` entries (one group for training-sized inputs).
        """
        B, H, T, Dh = q.shape
        L = self.chunk
        M = math.ceil(T / L) - 1  # boundaries; boundary m (0-based) precedes chunk m + 1
        qp = F.pad(q, (0, 0, 0, (M + 1) * L - T))[:, :, L:]  # (B, H, M·L, Dh)
        outs, kept_max, m0 = [], q.new_zeros((), dtype=torch.long), 0
        while m0 < M:
            m1 = m0 + 1  # grow the group while its padded Gram matrices fit
            while m1 < M and (m1 + 1 - m0) * B * H * ((m1 + 1) * L) ** 2 <= GROUP_ENTRIES:
                m1 += 1
            G, n = m1 - m0, m1 * L  # boundaries in the group; keys of its largest problem
            qb = qp[:, :, m0 * L : m1 * L].reshape(B, H * G, L, Dh)  # (B, H·G, L, Dh)
            kb = k[:, :, None, :n].expand(B, H, G, n, Dh).reshape(B, H * G, n, Dh)
            vb = v[:, :, None, :n].expand(B, H, G, n, v.shape[-1]).reshape(B, H * G, n, -1)
            pos = torch.arange(n, device=k.device)
            ends = L * torch.arange(m0 + 1, m1 + 1, device=k.device)
            mask = (pos[None, :] < ends[:, None]).repeat(H, 1)  # (H·G, n)
            out, _, part = self._solve(qb, kb, vb, mask.unsqueeze(0))  # (B, H·G, L, Dh)
            outs.append(out.reshape(B, H, G * L, -1))
            kept_max = torch.maximum(kept_max, part.kept().sum(-1).max())
            m0 = m1
        self._kept, self._truncated = kept_max, 0  # "full" keeps every key: nothing cut
        self.last_partition_ = Partition(*(s.detach().reshape(B, H, G, n)[:, :, -1] for s in part))
        return torch.cat(outs, 2)[:, :, : T - L]  # (B, H, T − L, Dh)

    def _global_support(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Boundary by boundary: carried support ∪ previous chunk, capped at ``budget``.

        Boundary ``m``'s problem has ``c_m + L`` key slots: ``c_m`` carried ones, then
        the previous chunk, with ``c_0 = 0`` and ``c_{m+1} = min(budget, c_m + L)``: all
        of boundary ``m``'s slots while they fit in ``budget``, else those of its
        ``budget`` largest alphas; a carried slot holding no kept token is masked. So
        the first boundaries are smaller than ``budget + L`` (the first holds just its
        chunk): a fixed ``budget + L`` layout would only add masked slots there. Each
        partition (FISTA + repair, no grad) must be solved before the next boundary's
        problem exists (the next key set *is* this one's support), so that part runs
        boundary after boundary, each batched over ``B·H``. What the gradient needs
        does not: the positions of every boundary's keys are recorded, and after the
        loop **one** differentiable margin solve and **one** fused readout per problem
        size (:meth:`_read_group`) give every chunk's output.
        """
        B, H, T, Dh = q.shape
        L, budget = self.chunk, self.budget
        P, M = B * H, math.ceil(T / L) - 1
        exact = self.mode == "exact"
        gamma = self._gamma(Dh)
        compiled = self.compile_solver and not torch.compiler.is_compiling()
        partition = compiled_boundary_partition() if compiled else boundary_partition
        # one compact copy of k and v each (gathers from the projection's strided view read
        # scattered rows and cost more than the copy); row (p, t) of the flattened
        # (P·T, ·) heads is p·T + t (nn.gather_cpu)
        k, v = k.contiguous(), v.contiguous()
        kd = k.detach()
        base = (T * torch.arange(P, device=k.device)).view(P, 1)
        chunk_pos = torch.arange(L, device=k.device).expand(P, L)
        cpos = torch.zeros(P, 0, dtype=torch.long, device=k.device)  # carried positions
        cval = torch.zeros(P, 0, dtype=torch.bool, device=k.device)  # real carried slots
        kept_max = torch.zeros((), dtype=torch.long, device=k.device)
        truncated = torch.zeros((), dtype=torch.long, device=k.device)
        groups: list[dict] = []  # runs of boundaries with one problem size
        outs, S, E, val = [], None, None, None
        for m in range(M):  # boundary m: keys of chunk m (and the carry), read by chunk m + 1
            pos = torch.cat([cpos, chunk_pos + m * L], -1)  # (P, n)
            val = torch.cat([cval, torch.ones_like(chunk_pos, dtype=torch.bool)], -1)
            n = pos.shape[-1]
            kk = token_rows(kd, (pos + base).reshape(-1)).view(P, n, Dh)
            if exact:
                q_m = q[:, :, (m + 1) * L : (m + 2) * L]
                o, alpha, part = self._solve(
                    q_m, token_rows(k, (pos + base).reshape(-1)).view(B, H, n, Dh),
                    token_rows(v, (pos + base).reshape(-1)).view(B, H, n, -1),
                    val.view(B, H, n),
                )  # fmt: skip
                outs.append(o)
                alpha, S, E = alpha.reshape(P, n).detach(), *(z.reshape(P, n) for z in part[:2])
            else:
                sol, K, d, _ = partition(kk, val, self.C, self.kernel, gamma, self.solver)
                alpha, S, E = sol.alpha, sol.margin, sol.error
                if not groups or groups[-1]["n"] != n:
                    groups.append({"n": n, "pos": [], "kmats": [], "solved": []})
                g = groups[-1]
                g["pos"].append(pos)
                g["kmats"].append((K, d, sol.error, sol.factors))
                g["solved"].append((sol.alpha, sol.mu))
            kept = S | E
            counts = kept.sum(-1)  # (P,)
            kept_max = torch.maximum(kept_max, counts.max())
            truncated = truncated + (counts > budget).sum()
            if n <= budget:  # every slot fits: carry them all (the unkept ones masked)
                cpos, cval = pos, kept
            else:  # the kept set, or its `budget` largest alphas; slot order is kept
                score = torch.where(kept, alpha, -torch.inf)
                top = score.topk(budget, dim=-1).indices.sort(-1).values  # (P, budget)
                cpos, cval = pos.gather(-1, top), kept.gather(-1, top)
        self._kept, self._truncated = kept_max, truncated
        n = S.shape[-1]
        R = val & ~S & ~E
        self.last_partition_ = Partition(*(z.detach().view(B, H, n) for z in (S, E, R)))
        if exact:
            return torch.cat(outs, 2)  # (B, H, T − L, Dh)
        qp = F.pad(q, (0, 0, 0, (M + 1) * L - T)) if (M + 1) * L > T else q
        # each group's query chunks (a split: its backward is one cat, no zero-filled copies)
        qs = torch.split(qp, [L] + [len(g["pos"]) * L for g in groups], dim=2)[1:]
        # every group's keys and values by position, in one differentiable gather each
        flat = [(torch.stack(g["pos"], 1) + base.unsqueeze(-1)).reshape(-1) for g in groups]
        sizes = [f.numel() for f in flat]
        flat = torch.cat(flat) if len(flat) > 1 else flat[0]
        kall = token_rows(k, flat, sizes)  # pieces: on CPU eager no cat in the backward
        vall = token_rows(v, flat, sizes)
        outs = [self._read_group(qg, kg, vg, g, gamma)
                for qg, kg, vg, g in zip(qs, kall, vall, groups, strict=True)]
        out = outs[0] if len(outs) == 1 else torch.cat(outs, 2)
        return out if M * L == T - L else out[:, :, : T - L]  # (B, H, T − L, Dh)

    def _read_group(self, qg: torch.Tensor, kg: torch.Tensor, vg: torch.Tensor, g: dict,
                    gamma: float) -> torch.Tensor:
        """Margin solve and readout of a run of ``G`` boundaries with one problem size.

        ``qg`` the queries of the chunks that read them ``(B, H, G·L, Dh)``, ``kg``/``vg``
        their keys and values ``(P·G·n, ·)`` in ``(P, G, n)`` order, ``g`` the run (size
        ``n``, and per boundary its positions, kernel matrices and solved alphas).
        Returns the outputs of those chunks, ``(B, H, G·L, Dh)``.
        """
        B, H, _, Dh = qg.shape
        P, L, n, G = B * H, self.chunk, g["n"], len(g["pos"])
        kb = kg.view(P * G, n, Dh)
        vb = vg.view(B, H * G, n, -1)
        # The partitions' final margin solves are the differentiable ones: their alphas,
        # with a backward that reuses each boundary's factorization (svattn.nn.margin).
        alpha, _ = margin_solve_factored(
            kb, torch.stack([z[0] for z in g["solved"]], 1).view(P * G, n),
            torch.stack([z[1] for z in g["solved"]], 1).view(P * G), self.C, self.kernel,
            gamma, g["kmats"])  # (P·G, n)
        qb = qg.reshape(B, H * G, L, Dh)
        out = readout_fused(qb, kb.view(B, H * G, n, Dh), vb, alpha.view(B, H * G, n),
                            self.kernel, gamma)  # (B, H·G, L, Dh)
        return out.reshape(B, H, G * L, -1)

    def _global(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # The memory is solved and read in (at least) float32, never under autocast:
        # FISTA, the active set and the margin solve are not meant for bf16.
        dtype = q.dtype
        work = torch.promote_types(dtype, torch.float32)
        # as sv_attention's checks: only where a read costs no sync
        bad = non_finite((("queries", q), ("keys", k), ("values", v)))
        if bad is not None:
            raise ValueError(f"the layer's {bad} have non-finite entries (nan or inf): the "
                             "input x or the layer's weights hold them")
        with torch.autocast(device_type=q.device.type, enabled=False):
            q, k, v = (z.to(work) for z in (q, k, v))
            glob = (self._global_full if self.policy == "full" else self._global_support)(q, k, v)
        return glob.to(dtype)  # (B, H, T − L, Dh)

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_heads(x)  # (B, H, T, Dh)
        T = q.shape[2]
        o = chunked_causal_softmax(*self.positioned(q, k), v, self.chunk, self.lookback)
        if T > self.chunk:
            # g·global + (1 − g)·local from chunk 1 on, the local path alone on chunk 0
            o = gate_mix(o, self._global(q, k, v), torch.sigmoid(self.gate).to(o.dtype))
        else:  # one chunk: causal softmax. The gate gets a zero gradient (DDP wants one).
            self._kept, self._truncated = 0, 0
            o = o + 0.0 * self.gate.sum()
        return self.out(self.merge_heads(o))

    # ------------------------------------------------------------ incremental inference
    streams = True
    _OWN_READS = MemoryReads()

    def stream_settings(self, *, full_policy: bool = False) -> dict:
        """``mode="exact"`` (the memories are exact), and ``policy="full"`` with
        ``full_policy``: the streaming state keeps every earlier chunk, so a rewind can
        cut it by exact removals (the ``"support"`` carry is not a function of the
        remaining text alone once a chunk was truncated to ``budget``).

        Raises
        ------
        ValueError
            ``policy="support"`` and ``full_policy`` False.
        """
        if self.policy != "full" and not full_policy:
            raise ValueError(
                f"this hybrid layer uses the policy {self.policy!r}; LMStream follows "
                "policy='full' (the memory keeps every earlier chunk, so forget can rewind it "
                "by exact removals). Stream it with full_policy=True (the same weights under "
                "policy='full'), or build the model with policy='full'")
        return {"mode": "exact", **({"policy": "full"} if full_policy else {})}

    def init_state(self) -> HybridState:
        """An empty :class:`~svattn.mixers.hybrid_state.HybridState` (policy ``"full"``)."""
        if self.policy != "full":
            raise ValueError(f"init_state streams policy='full' only, this layer's is "
                             f"{self.policy!r} (stream_settings(full_policy=True) switches it)")
        return HybridState(self)

    def mix_extend(self, state: HybridState, x: torch.Tensor,
                   reads: MemoryReads | None) -> torch.Tensor:
        """Chunk by chunk: the local path over the cache, and from chunk 1 on the gate
        with the memories' readout; chunk ``c``'s first query adds chunk ``c − 1`` to
        the memories (:meth:`HybridState.absorb`), as the ``"full"`` policy solves it."""
        reads = self._OWN_READS if reads is None else reads
        t0 = state.n
        q, k, v = self.qkv_heads(x[None])  # (1, H, m, Dh)
        qr, keys, vals = state.append(q, k, v)
        L, lb, end = self.chunk, self.lookback, t0 + q.shape[2]
        g = torch.sigmoid(self.gate).view(1, -1, 1, 1)  # (1, H, 1, 1)
        logw = reads.key_log_weights(keys.shape[2])
        outs = []
        for c in range(t0 // L, (end - 1) // L + 1):
            s, e = max(t0, c * L), min(end, (c + 1) * L)
            a, b = s - t0, e - t0
            local = attend_cached(qr[:, :, a:b], keys, vals, s,
                                  lambda t, c=c: 0 * t + c * L - lb, logw)
            if c == 0:
                outs.append(local)
                continue
            state.absorb(c * L)
            glob = torch.stack([
                torch.from_numpy(reads.memory_readout(state, hd, q[0, hd, a:b].numpy()))
                for hd in range(len(state.mems))])[None].to(local.dtype)  # (1, H, m, Dh)
            outs.append(g * glob + (1.0 - g) * local)
        return self.out(self.merge_heads(torch.cat(outs, 2)))[0]  # (m, D)

    def state_floats(self, seq_len: int) -> int:
        """Floats of keys and values kept for one sequence of ``seq_len`` tokens, per layer.

        ``"full"``: ``2·T·D``. ``"support"``: ``2·min(T, budget + lookback + L)·D``.
        """
        if self.policy == "full":
            return 2 * seq_len * self.d_model
        return 2 * min(seq_len, self.budget + self.lookback + self.chunk) * self.d_model

    def extra_repr(self) -> str:
        return (
            f"d_model={self.d_model}, n_heads={self.n_heads}, chunk={self.chunk}, C={self.C}, "
            f"kernel={self.kernel!r}, policy={self.policy!r}, budget={self.budget}, "
            f"mode={self.mode!r}, rope={self.rope}"
            + (f", lookback={self.lookback}" if self.lookback else "")
        )
