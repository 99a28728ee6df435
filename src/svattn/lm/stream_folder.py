"""The folder of a saved :class:`~svattn.lm.stream.LMStream`: its manifest, lock, crash
recovery and checks (:data:`FOLDER`). :meth:`LMStream.save` and :meth:`LMStream.load`
drive them; the state they write is each layer's own (its tensors by field name, and
the exact memories' state files).
"""

from __future__ import annotations

import bisect
import errno
import fcntl
import itertools
import json
import os
import re
import stat
import time
from pathlib import Path

from svattn.exact import SVDDMemory
from svattn.exact.records.fileformat import sha256_hex, write_atomic, zero_file

FORMAT = "svattn.LMStream"
VERSION = 2
MANIFEST = "stream.json"


class StreamStateError(ValueError):
    """A saved stream that cannot be loaded: missing, corrupted, or another model's."""


class StreamIntegrityError(StreamStateError):
    """A saved stream whose files do not hold together: a checksum or SHA-256 that
    differs, a listed file missing, a state inconsistent with its manifest or digest.
    Unlike a folder that is no stream at all (no manifest, not JSON, another format), this
    is what an edit or a corruption leaves: a verifier reports it as a failed check."""


FOLDER = """The folder of :meth:`LMStream.save` (format version 2).

* ``stream.json``: the manifest (canonical JSON plus ``manifest_sha256``, the SHA-256
  of the rest): the model, ``n_fed``, the forgotten spans, the digest, and the files of
  the state with their SHA-256 (``arrays.<gen>.safetensors``: text, fed positions,
  caches, hidden states; ``memory.<layer>.<head>.<gen>.safetensors``: one
  :class:`~svattn.exact.SVDDMemory` state each), plus two lists of file names:
  ``pending`` (the files a save in progress is writing) and ``superseded`` (the files
  of the save before, to delete). ``<gen>`` is fresh for every save.
* ``stream.lock``: the writer lock (``flock``): a save holds it throughout and refuses
  to start while another process holds it; a load waits for it, since it removes files.

A save (1) removes what an earlier interrupted save left, (2) rewrites the manifest
with its new files as ``pending``, (3) writes them (each atomically), (4) writes the
new manifest, naming the old files as ``superseded``, (5) overwrites and deletes those.
Killed anywhere, the manifest names every file that may hold bytes of another state
(the new ones as pending, or the old ones as superseded), and the next save or load
overwrites and deletes them, with their temporary files (``.<name>.<8 characters>.tmp``,
:func:`svattn.exact.records.fileformat.write_atomic`) and the manifest's. Nothing else in the
folder is touched. Load checks the manifest's checksum, that the held bytes' fed
positions and the forgotten spans partition ``[0, n_fed)``, every file's SHA-256, and
the digest.
"""

LOAD_WAIT = 30.0
"""Seconds :meth:`LMStream.load` waits for a save into the same folder to finish."""
LOCK = "stream.lock"
FILE_NAME = re.compile(r"(arrays|memory\.\d+\.\d+)\.[0-9a-f]{12}\.safetensors")
TEMP_NAME = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp")


class StreamBusyError(StreamStateError):
    """Another process holds the stream folder's lock (a save is writing it)."""


class FolderLock:
    """``flock`` of ``folder/stream.lock``: ``wait`` seconds at most (0: refuse at once).

    Where the lock file cannot be created or opened (a read-only folder), nothing can
    be written there either: the lock is not taken (``held`` False) and nothing is
    removed."""

    def __init__(self, folder: Path, *, wait: float) -> None:
        self.folder, self.wait, self.fd, self.held = folder, wait, -1, False

    def __enter__(self) -> FolderLock:
        try:
            self.fd = os.open(self.folder / LOCK, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            if self.wait == 0.0:  # a save: it would fail on the first write anyway
                if exc.errno == errno.ELOOP:  # a symlink planted as the lock
                    raise StreamStateError(
                        f"{self.folder / LOCK}: cannot open the folder's writer lock: it is "
                        "a symlink; it must be a regular file") from None
                raise PermissionError(
                    f"{self.folder}: cannot save a stream here: the folder's writer lock "
                    f"{LOCK} cannot be opened for writing ({exc.strerror or exc}); the "
                    "folder must be writable") from None
            try:  # a read-only folder: flock works on a read-only descriptor
                self.fd = os.open(self.folder / LOCK, os.O_RDONLY | os.O_NOFOLLOW)
            except OSError:
                return self
        deadline = time.monotonic() + self.wait
        while True:
            try:
                fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self.held = True
                return self
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    os.close(self.fd)
                    self.fd = -1
                    raise StreamBusyError(
                        f"{self.folder}: another process is saving a stream into this folder "
                        f"(it holds {LOCK}); one writer per folder: wait for it, or save "
                        "elsewhere") from None
                time.sleep(0.05)

    def __exit__(self, *exc) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # releases the flock
            self.fd = -1


def manifest_sum(man: dict) -> str:
    body = {k: v for k, v in man.items() if k != "manifest_sha256"}
    return sha256_hex(json.dumps(body, sort_keys=True, separators=(",", ":")).encode())


def write_manifest(folder: Path, man: dict) -> bytes:
    man = {**{k: v for k, v in man.items() if k != "manifest_sha256"}}
    man["manifest_sha256"] = manifest_sum(man)
    body = json.dumps(man, sort_keys=True, indent=1).encode()
    write_atomic(folder / MANIFEST, body)
    return body


def read_manifest(folder: Path) -> dict:
    """The checked manifest; :class:`StreamStateError` says what is wrong with it."""
    where = folder / MANIFEST
    try:
        man = json.loads(where.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise StreamStateError(f"{where}: not a stream manifest ({exc})") from None
    if not isinstance(man, dict) or (man.get("format"), man.get("version")) != (FORMAT,
                                                                               VERSION):
        got = (man.get("format"), man.get("version")) if isinstance(man, dict) else None
        hint = ("; it was saved by an earlier svattn (format version 1, no checksum): feed "
                "its text to a new stream and save that" if got == (FORMAT, 1) else "")
        raise StreamStateError(f"{where}: not an {FORMAT} version {VERSION} manifest "
                               f"(format, version: {got}){hint}")
    if man.get("manifest_sha256") != manifest_sum(man):
        raise StreamIntegrityError(f"{where}: the manifest's checksum differs from its "
                                   "content (edited or corrupted)")
    if "arrays" in man:
        try:
            files_of(man)
        except (KeyError, TypeError) as exc:
            raise StreamIntegrityError(f"{where}: the files of the state are not listed "
                                       f"({type(exc).__name__}: {exc})") from None
    for key in ("pending", "superseded"):
        names = man.get(key)
        if not isinstance(names, list) or not all(isinstance(n, str) and FILE_NAME.fullmatch(n)
                                                  for n in names):
            raise StreamIntegrityError(f"{where}: {key!r} must list files of a stream save, "
                                       f"got {names!r}")
    return man


def files_of(man: dict) -> list[str]:
    """The state files a manifest names (each checked to be a file name of a save)."""
    names = [man["arrays"]["file"]] + [m["file"] for lay in man["layers"]
                                       for m in lay["memories"]]
    for n in names:
        if not isinstance(n, str) or not FILE_NAME.fullmatch(n):
            raise StreamIntegrityError(f"{MANIFEST}: {n!r} is not a file name of a stream save")
    return names


def v1_files(folder: Path) -> list[str]:
    """The state files a version-1 manifest (no checksum, no pending list) names: the
    first version-2 save into its folder deletes them as superseded."""
    try:
        man = json.loads((folder / MANIFEST).read_bytes())
        if (man.get("format"), man.get("version")) != (FORMAT, 1):
            return []
        names = [man["arrays"]["file"]] + [m["file"] for lay in man["layers"]
                                           for m in lay["memories"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError):
        return []
    return [n for n in names if isinstance(n, str) and FILE_NAME.fullmatch(n)]


def recover(folder: Path, lock: FolderLock) -> tuple[dict | None, set[str]]:
    """Finish an interrupted save: overwrite and delete the files the manifest names as
    pending or superseded, and the temporary files of every name a save writes.

    Returns the manifest (None when there is none or it is unreadable) and the names
    that could not be removed (or, without the lock, that remain)."""
    try:
        man = read_manifest(folder) if (folder / MANIFEST).is_file() else None
    except StreamStateError:
        man = None
    names = {MANIFEST}
    doomed: set[str] = set()
    if man is not None:
        live = set(files_of(man)) if "arrays" in man else set()
        doomed = (set(man["pending"]) | set(man["superseded"])) - live
        names |= live | doomed
    temps = {}
    try:
        for p in folder.iterdir():
            m = TEMP_NAME.fullmatch(p.name)
            if m and m["name"] in names:
                temps[p.name] = m["name"]
    except OSError:
        pass
    present = sorted(n for n in doomed if os.path.lexists(folder / n)) + sorted(temps)
    failed = present if not lock.held else remove_named(folder, present)
    # what remains, by the name a manifest lists (a temporary file: the file it was for)
    return man, {temps.get(n, n) for n in failed}


def remove_named(folder: Path, names: list[str]) -> list[str]:
    """Overwrite (a regular file of ours with one link) and delete ``folder/name`` for
    each name; return those that could not be removed."""
    failed = []
    for name in names:
        p = folder / name
        try:
            info = p.lstat()
        except FileNotFoundError:
            continue
        except OSError:
            failed.append(name)
            continue
        try:
            if stat.S_ISREG(info.st_mode) and info.st_nlink == 1 and info.st_uid == os.getuid():
                zero_file(p, info.st_size)
            os.unlink(p)
        except OSError:
            failed.append(name)
    if len(failed) < len(names):
        try:
            dfd = os.open(folder, os.O_RDONLY)
            try:
                os.fsync(dfd)
            finally:
                os.close(dfd)
        except OSError:  # pragma: no cover
            pass
    return failed


def check_fed(man: dict) -> tuple[int, list[tuple[int, int]]]:
    """``n_fed`` and the forgotten spans of a manifest, checked: an int >= 0, and
    sorted, disjoint, non-empty spans inside ``[0, n_fed)``."""
    n_fed = man["n_fed"]
    if isinstance(n_fed, bool) or not isinstance(n_fed, int) or n_fed < 0:
        raise ValueError(f"n_fed must be an int >= 0, got {n_fed!r}")
    spans = man["forgotten"]
    if not isinstance(spans, list):
        raise ValueError(f"forgotten must be a list of [start, stop] spans, got {spans!r}")
    out: list[tuple[int, int]] = []
    for sp in spans:
        if not (isinstance(sp, list) and len(sp) == 2 and all(
                isinstance(x, int) and not isinstance(x, bool) for x in sp)
                and 0 <= sp[0] < sp[1] <= n_fed):
            raise ValueError(f"forgotten span {sp!r} is not [start, stop) with 0 <= start < "
                             f"stop <= n_fed = {n_fed}")
        if out and sp[0] < out[-1][1]:
            raise ValueError(f"forgotten spans {list(out[-1])} and {sp} overlap or are not "
                             "sorted")
        out.append((sp[0], sp[1]))
    return n_fed, out


def check_origin(origin: list[int], n_fed: int, forgotten: list[tuple[int, int]],
                  n_held: int) -> None:
    """The held bytes' fed positions and the forgotten spans must partition ``[0, n_fed)``."""
    if len(origin) != n_held:
        raise ValueError(f"{len(origin)} fed positions for {n_held} bytes held")
    if len(origin) + sum(b - a for a, b in forgotten) != n_fed:
        raise ValueError(f"n_fed = {n_fed} is not the {len(origin)} bytes held plus the "
                         f"{sum(b - a for a, b in forgotten)} forgotten")
    if any(b <= a for a, b in itertools.pairwise(origin)) or (
            origin and not 0 <= origin[0] <= origin[-1] < n_fed):
        raise ValueError(f"the held bytes' fed positions are not increasing inside "
                         f"[0, {n_fed})")
    for a, b in forgotten:
        i = bisect.bisect_left(origin, a)
        if i < len(origin) and origin[i] < b:
            raise ValueError(f"fed position {origin[i]} is held and inside the forgotten "
                             f"span [{a}, {b})")


def read_checked(folder: Path, entry: dict) -> bytes:
    name = entry["file"]
    if not isinstance(name, str) or not FILE_NAME.fullmatch(name):
        raise StreamIntegrityError(f"{folder / MANIFEST}: {name!r} is not a file name of "
                                   "a stream save")
    path = folder / name
    if not path.is_file():
        raise StreamIntegrityError(f"{path}: missing (the manifest lists it)")
    data = path.read_bytes()
    if sha256_hex(data) != entry["sha256"]:
        raise StreamIntegrityError(f"{path}: SHA-256 differs from the manifest's (corrupted "
                                   "or replaced)")
    return data


def load_memory(folder: Path, entry: dict) -> SVDDMemory:
    read_checked(folder, entry)
    try:
        return SVDDMemory.load(folder / entry["file"])
    except ValueError as exc:  # its SHA-256 matched the manifest's: a consistent edit
        raise StreamIntegrityError(str(exc)) from None
