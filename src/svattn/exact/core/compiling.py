"""One line on stderr when numba must compile one of svattn's kernels.

numba keeps compiled kernels in a disk cache (``__pycache__`` beside the sources, or
``NUMBA_CACHE_DIR``); a kernel it finds there loads in milliseconds. Where the cache
holds none for this machine and numba version (a fresh clone without ``make setup``,
a new numba), the first operations compile them: up to a minute, silent but for this
message, printed once per process on the first compile of a kernel of ours (numba's
``numba:compile`` event fires on a cache miss only).

A kernel numba finds in its cache still costs a fresh process numba's own set-up on
the first load: ``Cache.load_overload`` refreshes the target context first, importing
and registering every typing and lowering registry numba has (0.4-0.5 s of CPU, most of
a first operation). Loading a compiled library needs none of them, only numba's runtime
(NRT): :func:`quick_load` gives a module's kernels a cache that loads without that
refresh (:class:`QuickLoadCache`); a kernel that must be compiled still gets it, from
numba's compiler. ``tests/exact/test_compiling.py`` holds a fresh process's quickly
loaded kernels to the same results as fully refreshed ones.

Examples
--------
>>> install() is install()  # one listener per process
True
"""

from __future__ import annotations

import functools
import sys

from numba.core import event
from numba.core.caching import FunctionCache
from numba.core.dispatcher import Dispatcher

MESSAGE = ("svattn: compiling numba kernels for this machine (first use only: up to a "
           "minute; cached on disk after; `make setup` does it ahead: `python -m "
           "svattn.exact.compile_kernels` and `python -m svattn.mixers.compile_kernels`)")


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


class QuickLoadCache(FunctionCache):
    """numba's disk cache of one kernel (``cache=True``), loading a cached kernel after
    initialising numba's runtime only, not the target context's registries (module
    docstring). Missing or stale entries compile as with numba's own cache."""

    def load_overload(self, sig, target_context):
        """The cached compile result of ``sig``, or None (numba then compiles it)."""
        from numba.core.runtime import nrt

        nrt.rtsys.initialize(target_context)  # (what a loaded library links against)
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)


def _quick_load_supported() -> bool:
    """Whether this numba has the cache internals :class:`QuickLoadCache` builds on
    (where one is missing, the kernels keep numba's own cache)."""
    from numba.core.runtime import nrt

    return all(hasattr(FunctionCache, name)
               for name in ("_load_overload", "_guard_against_spurious_io_errors")) \
        and hasattr(getattr(nrt, "rtsys", None), "initialize")


def quick_load(namespace: dict) -> int:
    """Give each numba kernel defined in ``namespace`` (a module's ``globals()``) with
    ``cache=True`` a :class:`QuickLoadCache`; return how many."""
    if not _quick_load_supported():
        return 0
    count = 0
    for obj in list(namespace.values()):
        if (isinstance(obj, Dispatcher) and type(obj._cache) is FunctionCache
                and obj.py_func.__module__ == namespace.get("__name__")):
            obj._cache = QuickLoadCache(obj.py_func)
            count += 1
    return count


__all__ = ["MESSAGE", "CompileNotice", "QuickLoadCache", "install", "quick_load"]
