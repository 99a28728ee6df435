"""The margin Gram copy, ``K_SS`` beside the kernel cache, and the factor of its
uniqueness test: scratch kept between operations.

Margin solves gather ``K_SS`` (the margin tokens' rows of their own cache columns) into
one scratch buffer, ``SlotState.kss``, that the iterative refinement, the uniqueness
Cholesky and the health check then read. Within an operation the copy is valid while
``kss_for`` is the current bordered inverse. Between operations it keeps only the block
of the margin set named by ``kss_ids`` (ids in margin order): a token's kernel values
never change while it lives and ids are never reused, so equal ids mean an equal block,
and the next removal's first solve reads it instead of gathering it again (at 16k rows
and ~300 margin tokens the gather is ~0.5 ms of scattered reads). Every other entry is
zeroed after each operation; a removal's contraction zeroes the removed token's row and
column (``compiled.segments.gram_drop``), so the copy holds kernel values of live
margin tokens only, as the cache does.

A large margin set also keeps the Cholesky factor of its uniqueness test
(:class:`KeptFactor`, ``SlotState.pd_factor``): the test asks that ``K_SS`` minus
``1e-10 · trace · I`` be positive definite, and a removal usually changes the margin
set by a token or two, so the factor is updated (a row deleted by Givens rotations, a
row appended by one forward substitution: O(|S|²)) instead of computed again (O(|S|³),
~1 ms at 300 tokens). It is kept for twice the test's shift: positive definite with
the larger shift implies it with the smaller, by a margin (1e-10 · trace) far above
the rounding of kernel entries computed by two formulas (Weyl), so the factor of a
matrix read earlier certifies the matrix now while the trace has not doubled.
Deleting a token's row leaves the unique factor of the others, which holds nothing of
it; the factor is dropped (scrubbed) after any operation that leaves one of its tokens
outside the margin set, so it only ever holds live margin tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def padded_square(n: int) -> np.ndarray:
    """Zeros for an n × n matrix, n rows of n + 8 columns (the first n used), so that
    rows are not a multiple of 4 KiB apart: at n = 512 (the cache's column count at 16k
    tokens) every row of a dense buffer maps to the same cache sets, and the column
    reads of a factorization evict each other (a row deletion ran 1.7× slower).
    C-ordered, unlike a view of its first n columns: compiled loops stay vectorized."""
    return np.zeros((n, n + 8))


@dataclass
class KeptFactor:
    """``L[:n, :n]``: the lower Cholesky factor of the symmetric part of the Gram block
    of the margin tokens ``ids`` (in the factor's order) minus ``shift · I``; ``updates``
    counts the rows deleted and appended since it was computed whole."""

    L: np.ndarray
    n: int
    ids: np.ndarray
    shift: float
    updates: int = 0

    def scrub(self) -> None:
        self.L[: self.n, : self.n] = 0.0
        self.n = 0


class MarginGramScratch:
    """The copy's methods, mixed into :class:`~svattn.exact.state.SlotState` (which
    holds the fields ``kss``, ``kss_for``, ``kss_ext``, ``kss_ids`` and ``pd_factor``)."""

    def gram_buffer(self) -> np.ndarray:
        """Where margin solves write ``K_SS``: room for every cache column."""
        if self.kss.shape[0] < self.ccap:
            self.release_margin_gram(keep=False)
            self.kss = padded_square(self.ccap)
        return self.kss

    def kept_margin_gram(self, written: int) -> None:
        """A margin solve wrote ``K_SS`` (up to ``written`` rows/columns) for the current Qinv."""
        self.kss_for = self.Qinv
        self.kss_ext = max(self.kss_ext, written)
        self.kss_ids = self.margin_ids()

    def margin_ids(self) -> np.ndarray:
        """The margin tokens' ids in margin order."""
        return self.slot_id[self.slot_of_col[: self.nS]]

    def margin_gram_kept(self) -> bool:
        """Whether ``kss[:nS, :nS]`` holds ``K_SS`` of the margin set in its current
        order: the ids it was gathered for are the margin's ids, in order (a token's
        kernel values are fixed while it lives, and ids are never reused)."""
        ids = self.kss_ids
        return (ids is not None and self.nS > 0 and len(ids) == self.nS
                and self.kss.shape[0] >= self.nS and bool((ids == self.margin_ids()).all()))

    def current_margin_gram(self) -> np.ndarray | None:
        """The last margin solve's ``K_SS`` when it is still current, else None."""
        if self.kss_for is self.Qinv and self.kss_ext >= self.nS:
            return self.kss[: self.nS, : self.nS]
        return None

    def release_margin_gram(self, *, keep: bool = True) -> None:
        """After an operation: keep (with ``keep``) the Gram block of the margin set
        when the copy holds it (:meth:`margin_gram_kept`: the next removal's first
        solve reads it instead of a gather), zero every other entry written — kernel
        values stay only in the cache, which removals scrub, and in this block of
        live margin tokens, which a removal's contraction scrubs (``gram_drop``). The
        kept factor stays while every token of it is in the margin set."""
        f = self.pd_factor
        if f is not None and not (keep and np.isin(f.ids, self.margin_ids()).all()):
            f.scrub()  # a token of it left the margin set (and may be removed later)
            self.pd_factor = None
        kept = keep and self.margin_gram_kept()
        ext, nS = self.kss_ext, self.nS if kept else 0
        if ext > nS:
            self.kss[nS:ext, :ext] = 0.0
            self.kss[:nS, nS:ext] = 0.0
        self.kss_for, self.kss_ext = None, nS
        if not kept:
            self.kss_ids = None



__all__ = ["KeptFactor", "MarginGramScratch", "padded_square"]
