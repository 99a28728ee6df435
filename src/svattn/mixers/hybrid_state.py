"""The inference state of :class:`~svattn.mixers.hybrid.HybridSVAttention`: a KV cache
for the local path and one exact, incremental :class:`svattn.exact.SVDDMemory` per head
for the global path.

The memories follow the ``"full"`` policy: when the first query of chunk ``c`` arrives
(:meth:`HybridState.absorb`), the keys and values of chunk ``c − 1`` are added to them,
so chunk ``c`` reads the exact optimum over every key of chunks ``0 .. c − 1``
(unrotated, as the batched forward solves it). :meth:`HybridState.rewind` cuts them
back by exact decremental removals (from a snapshot where one is nearer), which is how
:meth:`svattn.lm.stream.LMStream.forget` deletes a span (docs/streaming.md).
"""

from __future__ import annotations

import time

import numpy as np
import torch

from svattn.exact import SVDDMemory
from svattn.mixers.state import KVCache
from svattn.nn.common import resolve_gamma

__all__ = ["HybridState", "MemoryReads"]


class MemoryReads:
    """How the hybrid's incremental step reads what it holds; the default reads it as
    it is. A stream that reweighs what it holds (e.g. a decay baseline) passes an
    object overriding these two as ``extend(..., reads=)``."""

    def key_log_weights(self, n: int) -> torch.Tensor | None:
        """Shifts of the local path's key logits, ``[n]`` over held positions (None: none)."""
        return None

    def memory_readout(self, layer: HybridState, head: int, queries: np.ndarray) -> np.ndarray:
        """The global path's readout of ``head``'s memory in ``layer`` for ``queries``."""
        return layer.mems[head].readout(queries)


class HybridState(KVCache):
    """KV cache and per-head exact memories of one hybrid layer (module docstring).

    ``ids[h][p]`` is the memory token id of position ``p`` (for ``p < absorbed``);
    ``every`` (0: never) the positions between copies of the memories (``snaps``,
    boundary → copies holding the positions before it), set by the stream.
    """

    def __init__(self, mix) -> None:
        super().__init__("hybrid", mix.n_heads, mix.head_dim, mix.rope, mix.qkv.weight.dtype)
        gamma = resolve_gamma(mix.kernel, mix.gamma, mix.head_dim)
        self.mems = [SVDDMemory(mix.C, mix.kernel, gamma) for _ in range(mix.n_heads)]
        self.chunk = mix.chunk

    def absorb(self, upto: int) -> None:
        """Add chunks to the memories until they hold positions ``< upto``; copy them
        at every ``every``-th position (the snapshots :meth:`rewind` starts from)."""
        while self.absorbed < upto:
            lo, hi = self.absorbed, self.absorbed + self.chunk
            K = self.k.view()[lo:hi].numpy()  # (L, H, Dh)
            Vv = self.v.view()[lo:hi].numpy()
            for hd, mem in enumerate(self.mems):
                self.ids[hd].extend(mem.extend(K[:, hd], Vv[:, hd]))
            self.absorbed = hi
            if self.every and hi % self.every == 0:
                self.snaps[hi] = [mem.copy() for mem in self.mems]

    def rewind(self, a: int, *, resume: bool = False, layer: int = 0) -> list[dict]:
        """Cut back to the first ``a`` positions; return, per head, the removed positions
        and their deletion certificates (``layer`` names the layer in the records).

        The memories lose, by exact decremental removal, every token of positions
        ``>= ((a − 1) // L)·L``: what a fresh state fed ``a`` positions holds. With
        ``resume`` (more positions follow at once) they keep ``(a // L)·L``: what the
        next query, at position ``a``, reads (the same unless ``a`` ends a chunk, whose
        tokens are then not removed and re-added). The cache is truncated to ``a``."""
        self.check_usable()
        L = self.chunk
        keep = (a // L) * L if resume else ((a - 1) // L) * L if a else 0
        old = max(keep, self.absorbed)
        start = self._restore(keep)  # the memories now hold positions < start
        removed = []
        for hd, mem in enumerate(self.mems):
            ids = self.ids[hd][keep:]
            t0 = time.perf_counter()
            certs = mem.remove_many(reversed(ids)) if ids else []
            removed.append({"layer": layer, "head": hd, "positions": (keep, start),
                            "released": (start, old), "certificates": certs[::-1],
                            "seconds": time.perf_counter() - t0})
            del self.ids[hd][keep:]
        self.absorbed = min(self.absorbed, keep)
        self.truncate(a)
        return removed

    def _restore(self, keep: int) -> int:
        """Continue from the earliest snapshot at or after ``keep``, if it is earlier than
        the memories' end: the memories (and later snapshots) are released, which holds
        fewer tokens to remove. Snapshots after ``keep`` are dropped (they hold positions
        that move). Returns the end of what the memories now hold."""
        later = [b for b in self.snaps if keep <= b < self.absorbed]
        if later:
            b = min(later)
            self.mems = [m.copy() for m in self.snaps[b]] if b == keep else self.snaps.pop(b)
            for ids in self.ids:
                del ids[b:]
            self.absorbed = b
        for b in [b for b in self.snaps if b > keep]:
            del self.snaps[b]
        return max(keep, self.absorbed)
