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

``mode="batched"`` (default) runs the differentiable FISTA + active-set +
ridge path; ``mode="exact"`` runs the float64 exact solver on every boundary
problem (slow; for inference, where deletion certificates rely on it). The
readout and gate are the same in both modes.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from svattn.exact.conventions import warmup_threshold
from svattn.mixers.softmax import SoftmaxAttention
from svattn.nn.attention import MODES, sv_attention_state
from svattn.nn.common import Partition, gather_rows
from svattn.nn.options import SolverOptions, resolve_solver

__all__ = ["HybridSVAttention", "POLICIES", "chunked_causal_softmax"]

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
    if pad:  # padding sits at the end of the last chunk: causal masking hides it
        q, k, v = (F.pad(z, (0, 0, 0, pad)) for z in (q, k, v))
    n = (T + pad) // chunk
    qc = q.reshape(B, H, n, chunk, Dh)  # (B, H, N, L, Dh)
    if lookback == 0:
        kc, vc = (z.reshape(B, H, n, chunk, z.shape[-1]) for z in (k, v))
        o = F.scaled_dot_product_attention(qc, kc, vc, is_causal=True)  # (B, H, N, L, Dh)
        return o.reshape(B, H, n * chunk, -1)[:, :, :T]
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
        ridge, iterated-ridge steps, FISTA iterations, active-set repair rounds;
        ``refine=0`` is the training path of docs/design.md §5 as written,
        FISTA → active set → one margin solve). Default ``SolverOptions()``.
    ridge, ridge_steps, max_iter, refine : optional
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

    Attributes
    ----------
    last_partition_ : Partition or None
        Partition of the last boundary problem of the last call (detached).
    kept_ : int
        Largest number of tokens any boundary memory kept in the last call.
    truncated_ : int
        Boundaries (summed over batch and head) where ``"support"`` cut the kept set to ``budget``.

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
        gate_init: float = 0.0,
        bias: bool = False,
        rope: bool = False,
        lookback: int = 0,
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
        self.solver = resolve_solver(
            solver, ridge=ridge, ridge_steps=ridge_steps, max_iter=max_iter, refine=refine
        )
        self.gate = nn.Parameter(torch.full((n_heads,), float(gate_init)))
        self.last_partition_: Partition | None = None
        self.kept_ = 0
        self.truncated_ = 0

    # ----------------------------------------------------------------- paths

    def _solve(self, q, k, v, key_mask):
        # The memory is solved and read in (at least) float32, never under autocast:
        # FISTA, the active set and the margin solve are not meant for bf16.
        dtype = q.dtype
        work = torch.promote_types(dtype, torch.float32)
        with torch.autocast(device_type=q.device.type, enabled=False):
            out, alpha, part, _ = sv_attention_state(
                q.to(work), k.to(work), v.to(work), C=self.C, kernel=self.kernel,
                gamma=self.gamma, mode=self.mode, key_mask=key_mask, solver=self.solver,
            )  # fmt: skip
        return out.to(dtype), alpha, part

    def _global_full(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Chunks 1.. read memories over all earlier keys: padded batched problems.

        Boundaries are batched together in groups whose kernel matrices fit in
        ``GROUP_ENTRIES`` entries (one group for training-sized inputs).
        """
        B, H, T, Dh = q.shape
        L = self.chunk
        M = math.ceil(T / L) - 1  # boundaries; boundary m (0-based) precedes chunk m + 1
        qp = F.pad(q, (0, 0, 0, (M + 1) * L - T))[:, :, L:]  # (B, H, M·L, Dh)
        outs, kept_max, m0 = [], 0, 0
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
            kept_max = max(kept_max, int(part.kept().sum(-1).max()))
            m0 = m1
        self.kept_ = kept_max
        self.last_partition_ = Partition(*(s.detach().reshape(B, H, G, n)[:, :, -1] for s in part))
        return torch.cat(outs, 2)[:, :, : T - L]  # (B, H, T − L, Dh)

    def _global_support(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """Boundary by boundary: carried support ∪ previous chunk, capped at ``budget``."""
        B, H, T, Dh = q.shape
        L = self.chunk
        P = B * H
        ck = k.new_zeros(B, H, 0, Dh)  # carried keys (B, H, s, Dh)
        cv = v.new_zeros(B, H, 0, v.shape[-1])
        cm = torch.zeros(B, H, 0, dtype=torch.bool, device=k.device)
        outs = []
        self.kept_, self.truncated_ = 0, 0
        for start in range(L, T, L):
            kk = torch.cat([ck, k[:, :, start - L : start]], 2)  # (B, H, s + L, Dh)
            vv = torch.cat([cv, v[:, :, start - L : start]], 2)
            mm = torch.cat([cm, cm.new_ones(B, H, L)], 2)
            o, alpha, part = self._solve(q[:, :, start : start + L], kk, vv, mm)
            outs.append(o)  # (B, H, ≤L, Dh)
            kept = part.kept()  # (B, H, n)
            counts = kept.sum(-1)
            self.kept_ = max(self.kept_, int(counts.max()))
            self.last_partition_ = Partition(*(s.detach() for s in part))
            n = kk.shape[2]
            if int(counts.max()) > self.budget:
                self.truncated_ += int((counts > self.budget).sum())
                score = torch.where(kept, alpha.detach(), -1.0)
                top = score.topk(self.budget, dim=-1).indices.sort(-1).values  # (B, H, budget)
                keep = torch.zeros_like(kept).scatter(-1, top, True) & kept
            else:
                keep = kept
            idx, sval = gather_rows(keep.reshape(P, n))  # (P, s)
            s = idx.shape[-1]
            ck = kk.reshape(P, n, Dh).gather(1, idx[..., None].expand(P, s, Dh))
            cv = vv.reshape(P, n, -1).gather(1, idx[..., None].expand(P, s, vv.shape[-1]))
            ck, cv = ck.reshape(B, H, s, Dh), cv.reshape(B, H, s, -1)
            cm = sval.reshape(B, H, s)
        return torch.cat(outs, 2)  # (B, H, T − L, Dh)

    def mix(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv_heads(x)  # (B, H, T, Dh)
        T = q.shape[2]
        o = chunked_causal_softmax(*self.positioned(q, k), v, self.chunk, self.lookback)
        if T > self.chunk:
            glob = (
                self._global_full(q, k, v)
                if self.policy == "full"
                else (self._global_support(q, k, v))
            )  # (B, H, T − L, Dh)
            g = torch.sigmoid(self.gate).to(o.dtype).view(1, -1, 1, 1)  # (1, H, 1, 1)
            L = self.chunk
            o = torch.cat([o[:, :, :L], g * glob + (1.0 - g) * o[:, :, L:]], 2)
        else:  # one chunk: causal softmax. The gate gets a zero gradient (DDP wants one).
            self.kept_, self.truncated_ = 0, 0
            o = o + 0.0 * self.gate.sum()
        return self.out(self.merge_heads(o))

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
