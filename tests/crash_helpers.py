"""Crash points, enumerated as SQLite tests its commits: ``os`` as a writer sees it, dying
at its N-th mutating call (a write, fsync, truncate, rename or unlink), the pending call
dropped, written or garbled (a write cut short); and a scan of a folder's raw bytes for
what was forgotten.

A crash is a :class:`Crash` raised at that call; from then on the process is dead: every
later mutating call (and every ``open``, which may create or truncate) raises it again
and changes nothing, so no clean-up handler the writer runs as the exception unwinds can
touch the disk, as none would run when the process is killed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import struct
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest

CALLS = ("write", "fsync", "ftruncate", "replace", "rename", "unlink")
MODES = ("dropped", "written", "garbled")


class Crash(BaseException):
    """The process dies here (nothing after it changes the disk)."""


class CrashingOS:
    """``os`` as a writer sees it, dying at its ``n``-th mutating call (``n`` = 0: never;
    :attr:`calls` then counts them)."""

    def __init__(self, n: int = 0, mode: str = "dropped") -> None:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
        self.n, self.mode, self.calls, self.dead = n, mode, 0, False
        self.trace: list[str] = []  # the calls made, by name (for a failing case's message)

    def __getattr__(self, name):
        real = getattr(os, name)
        if name == "open":
            def opened(*args, **kw):
                if self.dead:
                    raise Crash("dead")
                return real(*args, **kw)
            return opened
        if name not in CALLS:
            return real

        def call(*args, **kw):
            if self.dead:
                raise Crash("dead")
            self.calls += 1
            self.trace.append(name)
            if self.calls != self.n:
                return real(*args, **kw)
            self.dead = True
            if self.mode == "written":
                real(*args, **kw)
            elif self.mode == "garbled" and name == "write":
                fd, data = args
                os.write(fd, bytes(data)[: max(1, len(data) // 2)])
            raise Crash(f"crash at call {self.n} ({name}, {self.mode})")

        return call


def crash_points(trace: list[str], steps=None, *, all_modes: bool = False
                 ) -> list[tuple[int, str]]:
    """``(n, mode)`` for each call ``n`` (1-based; ``steps``: those only) of a run's
    ``trace``: the call dropped; a write also garbled; the last call also written. A call
    written and the process dead is the next call dropped (nothing between two calls
    changes the disk, but an empty temporary file created), so that covers every state;
    ``all_modes`` adds each call written as well."""
    out = []
    for n in range(1, len(trace) + 1) if steps is None else steps:
        out.append((n, "dropped"))
        if trace[n - 1] == "write":
            out.append((n, "garbled"))
        if all_modes or n == len(trace):
            out.append((n, "written"))
    return out


def enumerate_crashes(run, check, tmp_path: Path, *, steps=None, all_modes: bool = False,
                      raises=Crash) -> tuple[list[str], list]:
    """Run ``run(folder, fake_os)`` once to its end to learn its trace, then once per
    crash point of that trace (:func:`crash_points`; ``steps(trace)``: those calls only),
    each in a fresh folder that ``check(folder)`` judges before it is removed; return
    the trace and each crash point's outcome."""
    counter = CrashingOS()
    run(tmp_path / "count", counter)
    outcomes = []
    chosen = None if steps is None else steps(counter.trace)
    for n, mode in crash_points(counter.trace, chosen, all_modes=all_modes):
        folder = tmp_path / f"c{n}{mode}"
        with pytest.raises(raises):
            run(folder, CrashingOS(n, mode))
        outcomes.append(check(folder))
        shutil.rmtree(folder)
    return counter.trace, outcomes


@contextlib.contextmanager
def crashing(monkeypatch, fake: CrashingOS, modules: Iterable) -> Iterator[CrashingOS]:
    """``fake`` as the ``os`` of each of ``modules`` inside the block (the real one after,
    whatever happens)."""
    modules = list(modules)
    for m in modules:
        monkeypatch.setattr(m, "os", fake)
    try:
        yield fake
    finally:
        for m in modules:
            monkeypatch.setattr(m, "os", os)


def key_bytes(rows) -> list[bytes]:
    """Each row's key as the bytes a file would hold it in (float64, little-endian)."""
    return [struct.pack(f"<{len(r)}d", *map(float, r)) for r in rows]


def residue(folder: Path, needles: Iterable[bytes]) -> dict[str, list[int]]:
    """Every file under ``folder`` (hidden, temporary and lock files, old generations,
    logs) whose raw bytes hold one of ``needles``: ``{relative path: [needle index]}``."""
    needles = [n for n in needles if n]
    out: dict[str, list[int]] = {}
    for p in sorted(Path(folder).rglob("*")):
        if p.is_symlink() or not p.is_file():
            continue
        data = p.read_bytes()
        hit = [i for i, n in enumerate(needles) if n in data]
        if hit:
            out[str(p.relative_to(folder))] = hit
    return out


__all__ = ["CALLS", "MODES", "Crash", "CrashingOS", "crash_points", "crashing", "key_bytes",
           "residue"]
