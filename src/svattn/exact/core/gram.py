"""Scratch of the margin solves kept beside the solver state: the margin Gram copy
and the factor of the uniqueness test.

Margin solves gather ``K_SS`` (the margin tokens' rows of their own cache columns) into
one scratch buffer, ``SlotState.kss``, that the iterative refinement, the uniqueness
test and the health check then read; it is valid while ``kss_for`` is the current
bordered inverse and is zeroed after every operation (kernel values stay only in the
cache, which removals scrub). Its rows are padded off multiples of 4 KiB
(:func:`padded_square`).

A large margin set keeps the Cholesky factor of its uniqueness test between operations
(:class:`KeptFactor`, ``SlotState.pd_factor``): the test asks that ``K_SS`` minus
``1e-10 · trace · I`` be positive definite, and a removal usually changes the margin
set by a token or two, so the factor is updated (a deleted row made a hole by Givens
rotations in place, closed later all at once (:meth:`KeptFactor.compact`), a
row appended by one forward substitution: O(|S|²)) instead of computed again (O(|S|³),
~1 ms at 300 tokens). It is kept for twice the test's shift: positive definite with
the larger shift implies it with the smaller, by a margin (1e-10 · trace) far above
the rounding of kernel entries computed by two formulas (Weyl), so the factor of a
matrix read earlier certifies the matrix now while the trace has not doubled.
Deleting a token's row leaves the unique factor of the others, which in exact
arithmetic holds nothing of it (its rounding does, as the bordered inverse's downdate's
does). After any operation that leaves some of its tokens outside the margin set, their
rows are deleted the same way (a few; more, and the factor is dropped, scrubbed), so it
only ever holds live margin tokens.

The Gram copy itself is kept between operations too while it is current (``kss_for`` is
the bordered inverse in use; its block then holds the live margin tokens only, in margin
order, exactly the values a gather would read): after a removal or an add the next
removal's first segment solves with it instead of gathering ``K_SS`` again. The gather's
reads are scattered over the cache's rows, one cache miss each: 3 ms at 781 margin tokens
and 4k tokens (issue #36's clustered stream), more than the removal's pass over the whole
margin block (1.1 ms); at 16k tokens with ~300 margin tokens it was ~0.3 ms, when keeping
the block was measured and first taken out (0.98–1.01×). Whatever lies outside the
block, a removed margin token's row and column included (the removal's downdate moves
them last), is zeroed after every operation (:meth:`MarginGramScratch.release_margin_gram`),
and a copy that is not current is zeroed whole: kernel values of a token that left the
margin set stay only in the cache, which removals scrub.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def padded_square(n: int, *, columns: bool = False) -> np.ndarray:
    """Zeros for an n × n matrix, n rows of n + 8 columns (the first n used), so that
    rows are not a multiple of 4 KiB apart: at n = 512 (the cache's column count at 16k
    tokens) every row of a dense buffer maps to the same cache sets, and the column
    reads of a factorization evict each other (a row deletion ran 1.7× slower).
    C-ordered, unlike a view of its first n columns: compiled loops stay vectorized.
    ``columns``: the same, column-major (Fortran order, n + 8 rows of n columns: a
    column's entries adjacent), the kept factor's order (:class:`KeptFactor`)."""
    if columns:
        return np.zeros((n + 8, n), order="F")
    return np.zeros((n, n + 8))


def locate(ids: np.ndarray, among: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where each of ``ids`` sits in ``among`` (distinct ids), by one sort of ``among``:
    ``(found, position)``, the position meaningful where found (``np.isin`` took
    ~140 µs at 300 ids, and the kept factor asks after every operation)."""
    if not len(among):
        return np.zeros(len(ids), dtype=bool), np.zeros(len(ids), dtype=np.int64)
    order = np.argsort(among)
    at = np.minimum(np.searchsorted(among[order], ids), len(among) - 1)
    return among[order][at] == ids, order[at]


HOLE = -1  # a kept factor's id of a row whose token was deleted (token ids are >= 0)


@dataclass
class KeptFactor:
    """``L[:n, :n]``: the lower Cholesky factor of the symmetric part of the Gram block
    of the margin tokens ``ids`` (in the factor's order) minus ``shift · I``, column-major
    (``padded_square(..., columns=True)``: the row deletion's rotations and the appended
    rows' substitution run down adjacent entries); ``updates`` counts the rows deleted
    and appended since it was computed whole."""

    L: np.ndarray
    n: int  # rows in use, holes included
    ids: np.ndarray  # by row; HOLE where a deleted token's row is a hole
    shift: float
    updates: int = 0
    seen: np.ndarray | None = None  # the margin ids (in order) it was last found within
    holes: int = 0

    @property
    def size(self) -> int:
        """The tokens factored: the rows in use less the holes."""
        return self.n - self.holes

    def live(self) -> np.ndarray:
        """The rows that hold a token (not a hole), as a mask over ``ids``."""
        return self.ids != HOLE

    def within(self, margin_ids: np.ndarray) -> bool:
        """Whether every token of the factor is in the margin set ``margin_ids``: at once
        when the margin is the one last seen (a reserve add leaves it as it was), else
        by :func:`locate`."""
        seen = self.seen
        if seen is not None and len(seen) == len(margin_ids) and (seen == margin_ids).all():
            return True
        if not locate(self.ids[self.live()], margin_ids)[0].all():
            return False
        self.seen = margin_ids.copy()
        return True

    def trim(self, margin_ids: np.ndarray, delete_rows) -> bool:
        """Make holes of the rows of the tokens not in ``margin_ids`` (``delete_rows(L,
        rows, n)``, the compiled :func:`~svattn.exact.backends.compiled.linalg.chol_holes`)
        when they are at most ``max(2, size // 32)`` (the update budget of
        :func:`svattn.exact.backends.compiled.margin_positive_definite`) and some token stays;
        False, nothing changed, otherwise."""
        found = locate(self.ids, margin_ids)[0] | ~self.live()
        gone = np.flatnonzero(~found)
        if len(gone) > max(2, self.size // 32) or len(gone) >= self.size:
            return False
        if len(gone):
            self.n = int(delete_rows(self.L, gone.astype(np.int64), self.n))
        self.ids = self.ids.copy()
        self.ids[gone] = HOLE
        self.holes += len(gone)
        self.updates += len(gone)
        self.seen = None
        return True

    def compact(self, close) -> None:
        """Close the holes (``close(L, n, live)``, the compiled
        :func:`~svattn.exact.backends.compiled.linalg.chol_compact`: one read and write
        of the factor)."""
        if self.holes:
            live = self.live()
            self.n = int(close(self.L, self.n, live))
            self.ids = self.ids[live]
            self.holes = 0

    def scrub(self, rows: int | None = None) -> None:
        """Zero the factor's block, or its first ``rows`` rows and columns when an update
        that failed wrote past ``n``."""
        m = self.n if rows is None else max(self.n, rows)
        self.L[:m, :m] = 0.0
        self.n = 0


class MarginGramScratch:
    """The scratch's methods, mixed into :class:`~svattn.exact.core.state.SlotState` (which
    holds the fields ``kss``, ``kss_for``, ``kss_ext``, ``qwork``, ``qwork_for``,
    ``qwork_n`` and ``pd_factor``)."""

    @staticmethod
    def empty_scratch() -> dict:
        """The scratch fields, empty (a new state, a pickle, a state pickled before one
        of them existed)."""
        return {"kss": np.zeros((0, 0)), "kss_for": None, "kss_ext": 0,
                "qwork": np.zeros((0, 0)), "qwork_for": None, "qwork_n": 0, "pd_factor": None,
                "qspare": np.zeros(0)}

    def gram_buffer(self) -> np.ndarray:
        """Where margin solves write ``K_SS``: room for every cache column."""
        if self.kss.shape[0] < self.ccap:
            self._zero_margin_gram()
            self.kss = padded_square(self.ccap)
        return self.kss

    def bordered_buffer(self) -> tuple[np.ndarray, bool]:
        """The removal's work copy of the bordered inverse, room for every cache column,
        ``(ccap + 1)²`` (padded, :func:`padded_square`), and whether its leading block is
        a copy of the current inverse already. The compiled removal solves against the
        inverse itself (``backends/compiled/schur.py``) and fills this buffer only where
        its segment loop goes on past the first segment, zeroing it before it returns:
        between operations it is all zeros (``qwork_for`` None)."""
        if self.qwork.shape[0] < self.ccap + 1:
            self.qwork.fill(0.0)
            self.qwork = padded_square(self.ccap + 1)
            self.qwork_for, self.qwork_n = None, 0
        current = (self.qwork_for is not None and self.qwork_for is self.Qinv
                   and self.qwork_n == self.nS + 1)
        return self.qwork, current

    def kept_bordered_copy(self, nS: int) -> None:
        """A removal left the leading ``(nS + 1)²`` block of its work copy equal to the
        inverse it made (now ``Qinv``), zeros elsewhere (none at all when ``nS`` is 0)."""
        self.qwork_for, self.qwork_n = (self.Qinv, nS + 1) if nS else (None, 0)

    def _zero_bordered_copy(self) -> None:
        if self.qwork_n:
            m = self.qwork_n
            self.qwork[:m, :m] = 0.0
        self.qwork_for, self.qwork_n = None, 0

    def kept_margin_gram(self, written: int) -> None:
        """A margin solve wrote ``K_SS`` (up to ``written`` rows/columns) for the current Qinv."""
        self.kss_for = self.Qinv
        self.kss_ext = max(self.kss_ext, written)

    def margin_ids(self) -> np.ndarray:
        """The margin tokens' ids in margin order."""
        return self.slot_id[self.slot_of_col[: self.nS]]

    def current_margin_gram(self) -> np.ndarray | None:
        """The last margin solve's ``K_SS`` when it is still current, else None."""
        if self.kss_for is self.Qinv and self.kss_ext >= self.nS:
            return self.kss[: self.nS, : self.nS]
        return None

    def release_margin_gram(self, trim=None) -> None:
        """After an operation: keep the Gram copy's block while it is current (the live
        margin tokens' values, as a gather reads them), zeroing every entry outside it
        (a removed margin token's row and column among them), else zero it whole; the
        same for the removal's copy of the bordered inverse (the removal itself zeroes
        what lies outside the inverse it made); keep the uniqueness factor while every
        token of it is in the margin set. Rows of tokens that left the margin set are
        made holes (``trim(factor, margin_ids)``, the compiled backend's
        :func:`~svattn.exact.backends.compiled.trim_factor`: O(|S|²) each, where dropping
        the factor cost the next removal a whole O(|S|³) factorization, 16-37 ms at 781
        margin tokens), a few at most; else the factor is dropped (one of them may be
        removed later)."""
        f = self.pd_factor
        if f is not None:
            margin = self.margin_ids()
            if not f.within(margin) and not (trim is not None and trim(f, margin)):
                self.drop_factor()
        if self.qwork_for is not None and self.qwork_for is not self.Qinv:
            self._zero_bordered_copy()  # (a copy of an inverse that is gone)
        nS = self.nS
        if self.kss_for is not None and self.kss_for is self.Qinv and nS \
                and self.kss_ext >= nS:
            ext = self.kss_ext
            if ext > nS:
                self.kss[nS:ext, :ext] = 0.0
                self.kss[:nS, nS:ext] = 0.0
            self.kss_ext = nS
            return
        self._zero_margin_gram()

    def drop_factor(self, rows: int | None = None) -> None:
        """Scrub and forget the kept factor (``rows``: see :meth:`KeptFactor.scrub`)."""
        if self.pd_factor is not None:
            self.pd_factor.scrub(rows)
            self.pd_factor = None

    def _zero_margin_gram(self) -> None:
        if self.kss_ext:
            ext = self.kss_ext
            self.kss[:ext, :ext] = 0.0
        self.kss_for, self.kss_ext = None, 0


__all__ = ["HOLE", "KeptFactor", "MarginGramScratch", "locate", "padded_square"]
