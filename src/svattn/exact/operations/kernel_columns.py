"""Kernel columns of rbf keys computed on first use and kept, for the batch finish
(:func:`svattn.exact.operations.batch.column_finish`): the margin set's kept, an error
token's computed a block at a time and summed, never kept (issue #51)."""

from __future__ import annotations

import numpy as np


class KernelColumns:
    """Kernel columns ``K[:, j]`` of rbf keys, computed on first use and kept.

    Stored as rows of a C-ordered ``(m, n)`` array (``rows[pos[j]] = K[:, j]``, K is
    symmetric): one block of new columns is one call of the compiled distance loop,
    and ``g`` over every token is one matrix-vector product over the kept rows. The
    values are those of the memory's cache columns (squared distances from
    differences, :func:`svattn.exact.core.kernels.kernel_matrix`), ``K_jj = 1`` exactly.
    """

    def __init__(self, X: np.ndarray, gamma: float, capacity: int = 64) -> None:
        self.X, self.gamma = X, gamma
        self.XT = np.array(X.T, order="C")  # the keys transposed (a copy, also at d = 1): scrubbed
        try:  # (the largest allocation of a batch solve: memory may run out here)
            self.pos = np.full(len(X), -1, dtype=np.int64)
            self.rows = np.zeros((max(capacity, 1), len(X)))
        except BaseException:
            self.XT.fill(0.0)  # no one else holds it to scrub
            raise
        self.m = 0

    def ensure(self, idx: np.ndarray) -> np.ndarray:
        """The row positions of ``idx`` (computing the missing ones in one block)."""
        from svattn.exact.core.kernels import sq_distances_t

        new = np.unique(idx[self.pos[idx] < 0])
        if len(new):
            if self.m + len(new) > len(self.rows):
                grown = np.zeros((max(2 * len(self.rows), self.m + len(new)), len(self.X)))
                grown[: self.m] = self.rows[: self.m]
                self.rows[: self.m].fill(0.0)
                self.rows = grown
            block = self.rows[self.m: self.m + len(new)]
            keys = self.X[new]
            try:  # kernel_matrix's values (rbf: distances from differences, then exp)
                sq_distances_t(keys, self.XT, out=block)
            finally:
                keys.fill(0.0)  # a copy of keys: freed holding none
            block *= -self.gamma
            np.exp(block, out=block)
            block[np.arange(len(new)), new] = 1.0
            self.pos[new] = self.m + np.arange(len(new))
            self.m += len(new)
        return self.pos[idx]

    def rows_of(self, idx: np.ndarray, block: int = 0):
        """``(part, rows)`` a block of ``idx`` at a time: the kernel rows of ``part`` (kept
        ones read in place, the others computed into a temporary as :meth:`ensure`
        computes them, zeroed once the caller moves on) — the columns of error tokens,
        which are summed, never kept (issue #51)."""
        from svattn.exact.core.kernels import sq_distances_t

        block = block or max(1, min(256, (1 << 22) // max(1, len(self.X))))  # ≤ 32 MB
        for p in idx[self.pos[idx] >= 0].tolist():  # (in place: no copy of kept rows)
            q = int(self.pos[p])
            yield np.array([p]), self.rows[q: q + 1]
        new = idx[self.pos[idx] < 0]
        if not len(new):
            return
        tmp = np.empty((min(block, len(new)), len(self.X)))
        try:
            for b in range(0, len(new), block):
                part = new[b: b + block]
                out = tmp[: len(part)]
                keys = self.X[part]
                try:
                    sq_distances_t(keys, self.XT, out=out)
                finally:
                    keys.fill(0.0)  # a copy of keys: freed holding none
                out *= -self.gamma
                np.exp(out, out=out)
                out[np.arange(len(part)), part] = 1.0
                yield part, out
        finally:
            tmp.fill(0.0)

    def release(self) -> None:
        """Hand the kept rows over (the caller owns them now): this holds none after."""
        self.rows = np.zeros((1, len(self.X)))
        self.pos.fill(-1)
        self.m = 0

    def scrub(self) -> None:
        """Zero the kept columns and the transposed keys (rows past ``m`` were never
        written)."""
        self.rows[: self.m].fill(0.0)
        self.XT.fill(0.0)


__all__ = ["KernelColumns"]
