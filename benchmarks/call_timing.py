"""Timing the calls an operation makes, by wrapping the functions it calls
(``profile_removal.py``, ``profile_add.py``)."""

from __future__ import annotations

import time


def time_calls(owner, name: str, acc: dict, clock=time.perf_counter) -> None:
    """Replace ``owner.name`` by a wrapper that appends each call's seconds (by ``clock``)
    to ``acc[name]`` (a ``defaultdict(list)``); the caller's own patching, never undone:
    a profile runs in a process of its own."""
    real = getattr(owner, name)

    def wrapper(*a, **k):
        t = clock()
        try:
            return real(*a, **k)
        finally:
            acc[name].append(clock() - t)

    setattr(owner, name, wrapper)


__all__ = ["time_calls"]
