"""Inference state of a mixer for one sequence: what ``init_state`` returns and ``extend`` grows.

:class:`Rows` is an append-only row buffer that zeroes what it drops (so a removed
row stays nowhere in the object); :class:`KVCache` is the state of the softmax family
(keys, values, and the rotated keys when ``rope``). Subclasses add their own state:
:class:`svattn.mixers.hybrid.HybridState` (one exact SVDD memory per head),
:class:`svattn.mixers.recurrent.RecurrentState` (a fixed matrix per head).

Every state answers the same questions whatever the mixer, so a stream over layers of
different kinds needs no switch on the kind: ``n`` (positions held), ``rewind``
(cut back to a prefix; the removals' records), and the exact-memory fields ``mems``,
``ids``, ``absorbed``, ``chunk``, ``every`` and ``snaps`` (empty or 0 for a mixer
without exact memories).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from svattn.mixers.rope import apply_rotary

__all__ = ["KVCache", "MixerState", "Rows", "attend_cached"]

F64 = torch.float64


class Rows:
    """Rows ``[n, *shape]`` (float64 or int) with amortised appends; truncation and
    growth zero what they drop, so no removed row stays in the object."""

    def __init__(self, shape: tuple[int, ...], dtype=F64) -> None:
        self.buf = torch.zeros((0, *shape), dtype=dtype)
        self.n = 0

    def append(self, x: torch.Tensor) -> None:
        need = self.n + x.shape[0]
        if need > self.buf.shape[0]:
            new = torch.zeros((max(need, 2 * self.buf.shape[0], 16), *self.buf.shape[1:]),
                              dtype=self.buf.dtype)
            new[: self.n] = self.buf[: self.n]
            self.buf.zero_()
            self.buf = new
        self.buf[self.n : need] = x
        self.n = need

    def view(self) -> torch.Tensor:
        return self.buf[: self.n]

    def truncate(self, n: int) -> None:
        self.buf[n : self.n] = 0
        self.n = n

    def __getstate__(self) -> dict:  # pickled without the spare capacity
        return {"buf": self.buf[: self.n].clone(), "n": self.n}


class MixerState:
    """Base of every mixer's inference state (one sequence, one layer).

    Attributes
    ----------
    kind : str
        What holds it: ``softmax``, ``sliding``, ``hybrid``, ``deltanet`` or ``linear``.
    mems, ids, absorbed, chunk, every, snaps
        Exact memories (:class:`svattn.exact.SVDDMemory`, one per head), the token id
        of every position they hold (``ids[h][p]``), how many positions they hold, the
        chunk they grow by, the positions between snapshots of them (0: none) and the
        snapshots by boundary. Empty (or 0) here; :class:`~svattn.mixers.hybrid.HybridState`
        fills them.
    broken : str or None
        Why the state refuses work (:meth:`check_usable`): an extend that failed after it
        began to change the state (``SequenceMixer.extend``); None while usable.
    """

    kind = ""

    def __init__(self, n_heads: int) -> None:
        self.mems: list = []
        self.ids: list[list[int]] = [[] for _ in range(n_heads)]
        self.absorbed = 0
        self.chunk = 0
        self.every = 0
        self.snaps: dict[int, list] = {}
        self.broken: str | None = None

    def check_usable(self) -> None:
        """Raise ``RuntimeError`` if an interrupted extend left this state part-changed."""
        if self.broken is not None:
            raise RuntimeError(f"this {self.kind} state is unusable: {self.broken}; start "
                               "from a fresh init_state")

    @property
    def n(self) -> int:  # pragma: no cover - abstract
        """Positions held."""
        raise NotImplementedError

    def arrays(self) -> dict[str, torch.Tensor]:
        """The state's tensors by field name (what a stream saves; the exact memories
        are saved apart)."""
        raise NotImplementedError  # pragma: no cover - abstract

    def load_arrays(self, arrays: dict[str, torch.Tensor], n: int) -> None:
        """Fill a fresh state from :meth:`arrays` of a state of ``n`` positions.

        Raises
        ------
        KeyError, ValueError
            A field missing, or of another shape.
        """
        raise NotImplementedError  # pragma: no cover - abstract

    def rewind_point(self, a: int) -> int:
        """The furthest position ``<= a`` that :meth:`rewind` can cut back to (here ``a``:
        a state that keeps every position)."""
        return a

    def rewind(self, a: int, *, resume: bool = False, layer: int = 0) -> list[dict]:
        """Cut the state back to the first ``a`` positions (a :meth:`rewind_point`);
        return the records of what exact memories removed (``layer`` names the layer in
        them). ``resume``: more positions follow at once."""
        raise NotImplementedError  # pragma: no cover - abstract


class KVCache(MixerState):
    """The KV cache of a softmax-family mixer: per position its keys (unrotated, and
    rotated when ``rope``) and values, ``[n, H, Dh]`` each, in ``dtype`` (the mixer's)."""

    def __init__(self, kind: str, n_heads: int, head_dim: int, rope: bool,
                 dtype: torch.dtype = F64) -> None:
        super().__init__(n_heads)
        self.kind = kind
        self.rope = bool(rope)
        shape = (n_heads, head_dim)
        self.k = Rows(shape, dtype)  # unrotated keys (the memory's; the cache's without rope)
        self.v = Rows(shape, dtype)
        self.kr = Rows(shape, dtype) if self.rope else None  # rotated keys

    @property
    def n(self) -> int:
        return self.k.n

    def append(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Cache the keys and values ``[1, H, m, Dh]`` of positions ``n .. n + m − 1``;
        return the queries positioned (rotated when ``rope``) and every cached key (as
        the softmax reads them) and value, ``[1, H, n + m, Dh]``."""
        t0 = self.n
        self.k.append(k[0].transpose(0, 1))
        self.v.append(v[0].transpose(0, 1))
        qr = q
        if self.rope:
            qr = apply_rotary(q, offset=t0)
            self.kr.append(apply_rotary(k, offset=t0)[0].transpose(0, 1))
        keys = (self.kr if self.rope else self.k).view().permute(1, 0, 2)[None]  # (1, H, n, Dh)
        vals = self.v.view().permute(1, 0, 2)[None]
        return qr, keys, vals

    def arrays(self) -> dict[str, torch.Tensor]:
        names = ("k", "v", "kr") if self.rope else ("k", "v")
        return {name: getattr(self, name).view() for name in names}

    def load_arrays(self, arrays: dict[str, torch.Tensor], n: int) -> None:
        for name in self.arrays():
            rows = getattr(self, name)
            rows.append(arrays[name])
            if rows.n != n:
                raise ValueError(f"{rows.n} cached rows of {name} for {n} positions")

    def truncate(self, n: int) -> None:
        for rows in (self.k, self.v, self.kr):
            if rows is not None:
                rows.truncate(n)

    def rewind(self, a: int, *, resume: bool = False, layer: int = 0) -> list[dict]:
        self.check_usable()
        self.truncate(a)
        return []


def attend_cached(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, t0: int, lo,
                  logw: torch.Tensor | None = None) -> torch.Tensor:
    """Softmax attention of queries at positions ``t0 ..`` over cached keys ``[lo(t), t]``.

    ``q`` ``[1, H, m, Dh]``, ``k, v`` ``[1, H, n, Dh]`` (``n >= t0 + m``); scale ``1/sqrt(Dh)``.
    ``logw`` ``[n]`` (optional) shifts the logit of key ``j`` by ``logw[j]``.
    """
    m = q.shape[2]
    t = torch.arange(t0, t0 + m)[:, None]
    first = max(0, int(lo(t0)))
    j = torch.arange(first, t0 + m)[None, :]
    mask = (j <= t) & (j >= lo(t))  # (m, keys)
    if logw is not None:
        mask = torch.where(mask, logw[first : t0 + m][None, :], -math.inf).to(q.dtype)
    return F.scaled_dot_product_attention(q, k[:, :, first : t0 + m], v[:, :, first : t0 + m],
                                          attn_mask=mask)  # (1, H, m, Dh)
