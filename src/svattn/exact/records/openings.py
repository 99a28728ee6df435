"""The openings of an audit log's salted commitments, kept beside the log and prunable.

From log format version 3 an entry never holds a subject's data itself: where a version-2
entry held a token's id, commitment and subject tag hash, a removal's certificate or an
erasure's subject, it holds a **salted commitment** to it (:func:`seal`)::

    SHA-256("svattn-opening-v1|" || salt || canonical JSON of the value)   (hex)

with a fresh 32-byte salt. The value and its salt (the *opening*) are written to
``LOG.openings``, one line per commitment (canonical JSON, :func:`opening_line`)::

    {"at":[<entry index>,<slot>],"salt":"<64 hex>","value":{...}}

The Merkle leaf hashes the entry, so deleting an opening (:func:`prune_openings`) leaves
every leaf, checkpoint, inclusion and consistency proof as it was, and what the log
then keeps of the value is a hash under a salt nobody holds any more: no guess of the
data can be tested against it.

Writes: appended and fsynced before the entry that commits to them (an entry never
commits to an opening that is not on disk); a prune rewrites the file without the pruned
lines (temporary file, fsync, rename, fsync of the folder), then overwrites the pruned
lines' bytes in the replaced file with zeros before letting it go.

Examples
--------
>>> c, salt = seal({"id": 3})
>>> opening_matches(c, salt, {"id": 3}), opening_matches(c, salt, {"id": 4})
(True, False)
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Iterable
from pathlib import Path
from typing import Any

OPENINGS_SUFFIX = ".openings"  # LOG.openings, beside the log
_LABEL = b"svattn-opening-v1|"
_HEX = frozenset("0123456789abcdef")


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)


def commitment_of(salt: str, value: Any) -> str:
    """The salted commitment (hex) of ``value`` under ``salt`` (hex)."""
    return hashlib.sha256(_LABEL + bytes.fromhex(salt) + _canonical(value).encode()).hexdigest()


def seal(value: Any) -> tuple[str, str]:
    """``(commitment, salt)`` of ``value`` under a fresh 32-byte salt (both hex)."""
    salt = secrets.token_bytes(32).hex()
    return commitment_of(salt, value), salt


def is_commitment(text: Any) -> bool:
    """Whether ``text`` has the form of a commitment (64 lower-case hex digits)."""
    return isinstance(text, str) and len(text) == 64 and set(text) <= _HEX


def opening_matches(commitment: str, salt: Any, value: Any) -> bool:
    """Whether ``salt`` and ``value`` open ``commitment``."""
    if not (isinstance(salt, str) and len(salt) == 64 and set(salt) <= _HEX):
        return False
    try:
        return commitment_of(salt, value) == commitment
    except (TypeError, ValueError):
        return False


def openings_path(log: str | os.PathLike[str]) -> Path:
    """Where a log's openings are kept: ``LOG.openings``."""
    return Path(f"{os.fspath(log)}{OPENINGS_SUFFIX}")


def opening_line(index: int, slot: int, salt: str, value: Any) -> bytes:
    """One line of ``LOG.openings`` (with its newline)."""
    return (_canonical({"at": [index, slot], "salt": salt, "value": value}) + "\n").encode()


def read_openings(log: str | os.PathLike[str]
                  ) -> tuple[dict[tuple[int, int], list[tuple[Any, Any]]], list[str], bool]:
    """The openings beside ``log``: ``(at -> [(salt, value), ...], problems, torn)``.

    A missing file holds none. A line that is not an opening (not JSON, another shape) is
    a problem, named by its line number; ``torn``: the last line has no newline (a crash
    cut its append: no entry commits to it)."""
    path = openings_path(log)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return {}, [], False
    found: dict[tuple[int, int], list[tuple[Any, Any]]] = {}
    problems = []
    lines = data.split(b"\n")
    for n, raw in enumerate(lines[:-1], 1):
        try:
            rec = json.loads(raw.decode("utf-8"))
            at = rec["at"]
            key = (at[0], at[1])
            if not (isinstance(rec, dict) and set(rec) == {"at", "salt", "value"}
                    and len(at) == 2 and all(isinstance(a, int) and not isinstance(a, bool)
                                             for a in key)):
                raise ValueError
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError, KeyError,
                IndexError, TypeError, ValueError):
            problems.append(f"{path.name} line {n}: not an opening")
            continue
        found.setdefault(key, []).append((rec["salt"], rec["value"]))
    return found, problems, bool(lines[-1])


def append_openings(log: str | os.PathLike[str], lines: list[bytes]) -> None:
    """Append opening lines to ``LOG.openings`` and fsync them (the folder too when the
    file is new)."""
    if not lines:
        return
    path = openings_path(log)
    new = not path.exists()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        view = memoryview(b"".join(lines))
        while view:
            k = os.write(fd, view)
            if k <= 0:
                raise OSError("short write")
            view = view[k:]
        os.fsync(fd)
    finally:
        os.close(fd)
    if new:
        fsync_dir(path)


def openings_size(log: str | os.PathLike[str]) -> int:
    """The size of ``LOG.openings`` (0 when absent): a mark to truncate back to."""
    try:
        return openings_path(log).stat().st_size
    except FileNotFoundError:
        return 0


def truncate_openings(log: str | os.PathLike[str], size: int) -> None:
    """Cut ``LOG.openings`` back to ``size`` bytes (an operation undone), zeroing the cut
    bytes first so that no undone opening stays in the file's blocks."""
    path = openings_path(log)
    if not path.exists() or path.stat().st_size == size:
        return
    fd = os.open(path, os.O_RDWR)
    try:
        end = os.fstat(fd).st_size
        if end > size:
            os.pwrite(fd, bytes(end - size), size)
            os.fsync(fd)
        os.ftruncate(fd, size)
        os.fsync(fd)
    finally:
        os.close(fd)


def prune_openings(log: str | os.PathLike[str], drop: Iterable[tuple[int, int]],
                   below: int | None = None) -> int:
    """Delete the openings at ``drop`` (and, with ``below``, those of entries at or past
    it: openings of an operation that never reached the log) from ``LOG.openings``.

    The file is replaced atomically by one without those lines; the replaced file's
    bytes of the deleted lines are then overwritten with zeros and synced, and a
    temporary file a crash left behind is removed. Returns the lines deleted."""
    path = openings_path(log)
    tmp = path.with_name(f".{path.name}.tmp")
    if tmp.exists():
        _zero_unlink(tmp)
    if not path.exists():
        return 0
    drop = {(int(k), int(r)) for k, r in drop}
    fd = os.open(path, os.O_RDWR)
    try:
        data = os.pread(fd, os.fstat(fd).st_size, 0)
        keep, cut, offset = [], [], 0
        for raw in data.split(b"\n")[:-1]:
            end = offset + len(raw) + 1
            try:
                at = json.loads(raw)["at"]
                key = (at[0], at[1])
            except (ValueError, KeyError, IndexError, TypeError, RecursionError):
                key = None  # not an opening: kept, for the verifier to name
            if key is not None and (key in drop or below is not None and key[0] >= below):
                cut.append((offset, end))
            else:
                keep.append(data[offset:end])
            offset = end
        tail = data[offset:]
        if not cut and not tail:
            return 0
        if tail:  # a torn last line (a crash mid-append): no entry commits to it
            cut.append((offset, len(data)))
        out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(out, b"".join(keep))
            os.fsync(out)
        finally:
            os.close(out)
        os.replace(tmp, path)
        fsync_dir(path)
        for start, end in cut:  # the replaced file: no pruned byte left in its blocks
            os.pwrite(fd, bytes(end - start), start)
        os.fsync(fd)
        return len(cut)
    finally:
        os.close(fd)


def _zero_unlink(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDWR)
        try:
            os.pwrite(fd, bytes(os.fstat(fd).st_size), 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        path.unlink()
    except FileNotFoundError:
        pass


def fsync_dir(path: Path) -> None:
    """fsync the folder holding ``path`` (so a rename or a new file in it is durable);
    a folder that cannot be opened is left alone."""
    try:
        fd = os.open(path.parent if str(path.parent) else ".", os.O_RDONLY)
    except OSError:  # pragma: no cover
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = ["OPENINGS_SUFFIX", "append_openings", "commitment_of", "fsync_dir", "is_commitment",
           "opening_line", "opening_matches", "openings_path", "openings_size",
           "prune_openings", "read_openings", "seal", "truncate_openings"]
