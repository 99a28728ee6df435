"""Adapter of the exact SV memory (:class:`svattn.exact.memory.SVDDMemory`) to the contract.

No second implementation: every write is ``SVDDMemory.add`` followed by
``compact()`` (certified selection: reserve tokens have alpha = 0 exactly,
so dropping them leaves the readout unchanged for every query), and
``read`` is ``SVDDMemory.readout``.

Budget
------
SV has **no hard budget** (``has_hard_budget = False``): its state is the
support, margin ∪ error, whose size the box ``C`` sets (at least
``ceil(1/C)`` tokens carry weight, at most ``1/C`` sit at the bound). The
``budget`` argument only picks the default ``C = 2 / budget``, i.e. at
least ``budget / 2`` support tokens; an explicit ``C`` overrides it and
``budget`` is then ignored. ``tokens_kept()`` is the number of tokens held
(the support, plus during warm-up every token).

Streaming note: compacting after each write makes the memory online —
a reserve token dropped at step t is gone even if later tokens would have
pulled it into the support of the full-set optimum. With
``compact=False`` the memory keeps every token and stays the exact
optimum over the whole stream.
"""

from __future__ import annotations

import numpy as np

from svattn.memory.base import StreamingMemory, check_positive_int


class SVMemory(StreamingMemory):
    """SV-Attention streaming memory (exact SVDD, float64).

    Parameters
    ----------
    dim, value_dim
        Key and value widths.
    budget
        Used only for the default ``C = 2 / budget`` (see module notes); may be
        None when ``C`` is given.
    C
        Box bound of the SVDD dual; overrides ``budget``.
    kernel, gamma, tol
        Passed to :class:`~svattn.exact.memory.SVDDMemory`.
    compact
        Drop reserve tokens after every write (default True).

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> mem = SVMemory(dim=4, value_dim=2, budget=8)
    >>> mem.write_many(rng.normal(size=(100, 4)), rng.normal(size=(100, 2)))
    >>> mem.tokens_kept() >= 4  # at least ceil(1/C) = budget / 2 tokens carry weight
    True
    >>> mem.read(rng.normal(size=(3, 4))).shape
    (3, 2)
    """

    has_hard_budget = False

    def __init__(
        self,
        *,
        dim: int,
        value_dim: int,
        budget: int | None,
        C: float | None = None,
        kernel: str = "rbf",
        gamma: float | None = None,
        tol: float = 1e-10,
        compact: bool = True,
    ) -> None:
        if C is None:
            if budget is None:
                raise ValueError("SVMemory needs C or a budget (to pick C = 2 / budget)")
            C = 2.0 / check_positive_int("budget", budget)
        super().__init__(dim=dim, value_dim=value_dim, budget=budget)
        self._options = {"C": C, "kernel": kernel, "gamma": gamma, "tol": tol}
        self.compact = bool(compact)
        # imported here so the baselines stay importable without the exact core
        from svattn.exact.memory import SVDDMemory

        self._cls = SVDDMemory
        self.memory = SVDDMemory(C, kernel, gamma, tol=tol)
        self.C = self.memory.C

    def _reset(self) -> None:
        self.memory = self._cls(**self._options)

    def _is_empty(self) -> bool:
        return len(self.memory) == 0

    def _write(self, key: np.ndarray, value: np.ndarray, query: np.ndarray) -> None:
        # ids are 0, 1, 2, ... in insertion order: id == stream position since reset
        self.memory.add(key, value)
        if self.compact:
            self.memory.compact()

    def _read(self, queries: np.ndarray) -> np.ndarray:
        return self.memory.readout(queries)

    def tokens_kept(self) -> int:
        """Tokens held: the support (margin ∪ error), or every token in warm-up."""
        return len(self.memory)

    def state_floats(self) -> int:
        return len(self.memory) * (self.dim + self.value_dim + 1)  # key, value, alpha

    def kept_positions(self) -> np.ndarray:
        return np.asarray(self.memory.ids, dtype=np.int64)
