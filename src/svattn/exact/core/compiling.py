"""One line on stderr when numba must compile one of svattn's kernels.

numba keeps compiled kernels in a disk cache (``__pycache__`` beside the sources, or
``NUMBA_CACHE_DIR``); a kernel it finds there loads in milliseconds. Where the cache
holds none for this machine and numba version (a fresh clone without ``make setup``,
a new numba), the first operations compile them: up to a minute, silent but for this
message, printed once per process on the first compile of a kernel of ours (numba's
``numba:compile`` event fires on a cache miss only).

Examples
--------
>>> install() is install()  # one listener per process
True
"""

from __future__ import annotations

import functools
import sys

from numba.core import event

MESSAGE = ("svattn: compiling numba kernels for this machine (first use only: up to a "
           "minute; cached on disk after; `make setup` or `python -m "
           "svattn.exact.compile_kernels` does it ahead)")


class CompileNotice(event.Listener):
    """Prints :data:`MESSAGE` to stderr on the first compile of a kernel of svattn's."""

    def __init__(self) -> None:
        self.said = False

    def on_start(self, ev: event.Event) -> None:
        if self.said:
            return
        func = getattr((ev.data or {}).get("dispatcher"), "py_func", None)
        if getattr(func, "__module__", "").startswith("svattn."):
            self.said = True
            print(MESSAGE, file=sys.stderr, flush=True)

    def on_end(self, ev: event.Event) -> None:
        pass


@functools.cache
def install() -> CompileNotice:
    """Register the notice with numba (once per process); return it."""
    notice = CompileNotice()
    event.register("numba:compile", notice)
    return notice


__all__ = ["MESSAGE", "CompileNotice", "install"]
