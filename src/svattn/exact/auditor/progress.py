"""Progress of the auditor's checks for people: a ``progress(stage, done, total)``
callable (:data:`svattn.exact.auditor.optimality.Progress`) that prints to stderr once a
check has run a while, as the verifying commands do.

Examples
--------
>>> import io
>>> out = io.StringIO()
>>> p = StderrProgress(after=0.0, stream=out)
>>> p("KKT", 0, 13000); p("KKT", 13000, 13000)
>>> out.getvalue()
'checking KKT: 100 % (13,000 of 13,000 tokens)\\n'
"""

from __future__ import annotations

import sys
import time
from typing import TextIO


class StderrProgress:
    """Progress of a verifier's checks on stderr, once a check has run ``after`` seconds
    (then at most once a second, and at its end): ``checking KKT: 40 % (5,200 of 13,000
    tokens)``. A check that is one call (the oracle's solve, a large Cholesky factor) is
    announced as it starts.

    Parameters
    ----------
    after : float
        Seconds a check runs before its progress is shown (default 2).
    stream : text file, optional
        Where to print (default: ``sys.stderr`` at the time of printing).
    """

    _UNITS = {"KKT": "tokens", "uniqueness": "margin and tied tokens", "oracle": "tokens",
              "certificates": "certificates"}

    def __init__(self, after: float = 2.0, stream: TextIO | None = None) -> None:
        self._clock = time.perf_counter
        self._stream = stream
        self._after, self._stage, self._t0, self._last = after, None, 0.0, 0.0

    def __call__(self, stage: str, done: int, total: int) -> None:
        now = self._clock()
        if stage != self._stage:
            self._stage, self._t0, self._last = stage, now, 0.0
            if stage == "oracle" and done == 0:  # one solve: say so before it starts
                print(f"checking oracle: re-solving {total:,} tokens from scratch (dense "
                      "QP) ...", file=self._stream or sys.stderr, flush=True)
            elif stage == "uniqueness" and done == 0 and total >= 3000:  # one factorisation
                print(f"checking uniqueness: a Cholesky factor of K on {total:,} margin and "
                      "tied tokens ...", file=self._stream or sys.stderr, flush=True)
            return
        if now - self._t0 < self._after or (now - self._last < 1.0 and done < total):
            return
        self._last = now
        pct = 100 * done // max(total, 1)
        print(f"checking {stage}: {pct} % ({done:,} of {total:,} "
              f"{self._UNITS.get(stage, 'items')})", file=self._stream or sys.stderr, flush=True)


__all__ = ["StderrProgress"]
