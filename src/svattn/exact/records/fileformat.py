"""The state file's bytes: safetensors, canonical JSON metadata, checksums, atomic writes.

File format (``format_version`` 5; versions 1-4 still load): one safetensors
file. Its tensors are :func:`~svattn.exact.records.schema.to_tensors`'s (the live tokens only, in id
order: a removed token's slot is never written). The header's ``__metadata__``
carries one string, ``svattn``: canonical JSON with the format name and
version, the state's fields (:func:`~svattn.exact.records.schema.to_tensors`), the digest, health,
KKT residual and audit-log head the memory adds, a SHA-256 per tensor, and
``meta_sha256`` (SHA-256 of the canonical JSON of all other fields).
:func:`read_state` re-checks the structure, the checksums and that the content
serialises back to exactly the file's bytes, so no flipped byte anywhere (header
padding included) goes unnoticed.

Writes are atomic: the bytes go to a temporary file in the same directory,
which is fsynced, renamed over the target, and the directory fsynced; then the
replaced file is overwritten with zeros. A crash at any point leaves either the old
file or the new one, never a mix.

The checksums detect corruption and naive tampering; they are not a signature
(anyone who can write the file can recompute them). The audit log anchors a
state to its hash-chained history (``docs/design.md`` §4).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import math
import os
import re
import stat
import struct
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np

from svattn.exact.core.kktsets import ERROR, MARGIN, RESERVE
from svattn.exact.operations.validation import optimality_error
from svattn.exact.records.schema import READS, SCHEMA_VERSION, TENSOR_DTYPES

FORMAT_NAME = "svattn.SVDDMemory"
FORMAT_VERSION = SCHEMA_VERSION


class StateFileError(ValueError):
    """A state file that cannot be loaded: corrupted, truncated, tampered or foreign."""


class StateVersionError(StateFileError):
    """A state file of another format or format version."""


def canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=False)


def sha256_hex(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def serialize(t: dict[str, np.ndarray], meta: dict[str, Any]) -> bytes:
    from safetensors.numpy import save as st_save

    # one metadata key: safetensors writes the metadata map in hash order
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    text = canonical({**body, "meta_sha256": sha256_hex(canonical(body).encode())})
    return st_save(t, metadata={"svattn": text})


def _leftover_name(name: str) -> re.Pattern:
    # what tempfile.mkstemp(prefix=f".{name}.", suffix=".tmp") names: 8 random characters
    return re.compile(rf"\.{re.escape(name)}\.[a-z0-9_]{{8}}\.tmp")


class SavedNotDurable(OSError):
    """The new file is in place (renamed over the old one, its record logged) but the
    directory could not be synced: it may not survive a power cut."""


def save_lock(path: Path, *, wait: bool = True) -> int:
    """``flock`` the state's directory (-1: another process holds it and ``wait`` is
    False). A save holds it from before its temporary file exists until after the
    rename, and the leftover cleanup takes it, so a cleanup never sees a live save's
    file (no lock file: the directory itself is the lock)."""
    fd = os.open(path.parent if str(path.parent) else Path("."), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except BlockingIOError:
        os.close(fd)
        return -1
    except BaseException:
        os.close(fd)
        raise
    return fd


def remove_leftovers(path: Path, *, locked: bool = False) -> list[Path]:
    """Zero and delete the temporary files of earlier saves of ``path`` that a killed
    process left beside it (they may hold tokens erased since); return them.

    Runs under the save lock of the state's directory (``locked``: the caller, a save,
    holds it; else it is taken here, and when another process holds it — a live save —
    nothing is touched). Files that cannot be removed (a read-only directory) are left
    and skipped.
    """
    directory = path.parent if str(path.parent) else Path(".")
    lock = -1
    if not locked:
        try:
            lock = save_lock(path, wait=False)
        except OSError:
            return []
        if lock < 0:  # a save is running: its temporary file is not a leftover
            return []
    try:
        return _remove_leftover_files(directory, _leftover_name(path.name))
    finally:
        if lock >= 0:
            os.close(lock)


def zero_file(path: Path, size: int) -> None:
    """Overwrite the first ``size`` bytes of the regular file ``path`` with zeros, in
    pieces, and fsync it (never following a symlink): what a file holding key data gets
    before it is deleted.

    Raises
    ------
    OSError
        If it cannot be opened, written in full or synced.
    """
    fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    try:
        _zero_fd(fd, size, path)
    finally:
        os.close(fd)


def remove_file(path: Path) -> bool:
    """Overwrite the regular file ``path`` with zeros, delete it and sync its folder;
    return False when it has another name (a hard link: it is only unlinked, its bytes
    stay under that name) or is not a regular file (a symlink: only the link goes).

    Raises
    ------
    OSError
        It cannot be overwritten or deleted.
    """
    info = path.lstat()
    whole = stat.S_ISREG(info.st_mode) and info.st_nlink == 1
    if whole:
        zero_file(path, info.st_size)
    os.unlink(path)
    _sync_directory(path)
    return whole


def _zero_fd(fd: int, size: int, what: object) -> None:
    os.lseek(fd, 0, os.SEEK_SET)
    left, zeros = size, b"\0" * (1 << 20)
    while left > 0:
        k = os.write(fd, zeros[: min(left, len(zeros))])
        if k <= 0:
            raise OSError(f"short write zeroing {what}")
        left -= k
    os.fsync(fd)


def _open_replaced(path: Path) -> int:
    """A write descriptor on the file ``path`` names now, to overwrite its bytes once a
    new file has replaced it: -1 when there is none, or it is not a regular file of
    ours with one link (a symlink's target, another name's file: never zeroed)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_NOFOLLOW)
    except OSError:
        return -1
    try:
        info = os.fstat(fd)
    except OSError:
        info = None
    if info is None or not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 \
            or info.st_uid != os.getuid():
        os.close(fd)
        return -1
    return fd


def _zero_replaced(fd: int) -> None:
    """Overwrite the replaced file (no name links to it any more) with zeros; best
    effort: the new file is in place and durable whatever happens here. -1: none."""
    if fd < 0:
        return
    try:
        info = os.fstat(fd)
        if info.st_nlink == 0:
            _zero_fd(fd, info.st_size, "the replaced file")
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_leftover_files(directory: Path, pattern: re.Pattern) -> list[Path]:
    removed = []
    try:
        names = [p for p in directory.iterdir() if pattern.fullmatch(p.name)]
    except OSError:
        return removed
    for p in names:
        try:
            info = p.lstat()
            # only what a save of ours leaves: a regular file, one link, our own (never
            # a symlink or a hard link to something else, which would be zeroed instead)
            if not stat.S_ISREG(info.st_mode) or info.st_nlink != 1 \
                    or info.st_uid != os.getuid():
                continue
            zero_file(p, info.st_size)  # overwrite first (the bytes are key data)
            os.unlink(p)
            removed.append(p)
        except OSError:
            continue
    return removed


def write_atomic(path: Path, data: bytes, *,
                 before_rename: Callable[[], None] | None = None, locked: bool = False) -> None:
    """Write ``data`` to ``path`` atomically (temp file, fsync, rename, fsync dir),
    under the state's save lock (``locked``: the caller holds it, as a ``before_rename``
    writing beside the file does), after removing the temporary files a killed earlier
    save left.

    ``before_rename`` runs once the bytes are durable and before they replace the
    file (a save's audit record): if it raises, the old file stays and the temporary
    one goes. After the rename only :class:`SavedNotDurable` can be raised.

    Once the new file is durable, the file it replaced (it may hold rows erased since)
    is overwritten with zeros through a descriptor opened before the rename (when it is
    a regular file of ours with no other name); killed before that, no name links to it.
    """
    directory = path.parent if str(path.parent) else Path(".")
    lock = -1 if locked else save_lock(path)
    old = -1
    try:
        remove_leftovers(path, locked=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".tmp")
        try:
            try:
                view = memoryview(data)
                while view:
                    k = os.write(fd, view)
                    if k <= 0:
                        raise OSError(f"short write to {tmp}")
                    view = view[k:]
                os.fsync(fd)
            finally:
                os.close(fd)
            if before_rename is not None:
                before_rename()
            old = _open_replaced(path)
            os.replace(tmp, path)
        except BaseException:
            if old >= 0:
                os.close(old)
                old = -1
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        _sync_directory(path)  # (failing: the old file is left whole, the rename may not last)
        replaced, old = old, -1  # (closed by _zero_replaced, whatever happens there)
        _zero_replaced(replaced)
    finally:
        if old >= 0:
            os.close(old)
        if lock >= 0:
            os.close(lock)


def replace_zeroing(src: Path, dst: Path) -> None:
    """Rename ``src`` over ``dst``, sync the folder, then overwrite the file ``dst`` named
    before with zeros (as :func:`write_atomic` does; never a symlink's target or a file
    with another name).

    Raises
    ------
    FileNotFoundError
        ``src`` is gone (nothing changed).
    SavedNotDurable
        Renamed, but the folder could not be synced (the old file is left whole).
    """
    old = _open_replaced(dst)
    try:
        os.replace(src, dst)
        _sync_directory(dst)
    except BaseException:
        if old >= 0:
            os.close(old)
        raise
    _zero_replaced(old)


def _sync_directory(path: Path) -> None:
    directory = path.parent if str(path.parent) else Path(".")
    try:
        dfd = os.open(directory, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(dfd)
    except OSError as exc:
        raise SavedNotDurable(exc.errno, f"{path} was saved, but syncing its directory "
                                         f"failed ({exc.strerror})") from exc
    finally:
        os.close(dfd)


def parse_header(data: bytes, where: str) -> tuple[dict[str, Any], int]:
    """Structural checks of a safetensors file; return (header, data offset)."""
    size = len(data)
    if size < 8:
        raise StateFileError(f"{where}: truncated: {size} bytes, a state file has at least 8")
    (hlen,) = struct.unpack("<Q", data[:8])
    if size > 8 and data[8:9] != b"{":  # a safetensors header is a JSON object
        raise StateFileError(f"{where}: not a state file (not safetensors: no JSON header "
                             "after the 8-byte length)")
    if hlen > size - 8:
        raise StateFileError(
            f"{where}: truncated: the header declares {hlen} bytes but only {size - 8} follow"
        )
    try:
        header = json.loads(data[8 : 8 + hlen].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise StateFileError(f"{where}: corrupted header (not valid JSON: {exc})") from None
    if not isinstance(header, dict):
        raise StateFileError(f"{where}: corrupted header (not a JSON object)")
    base = 8 + hlen
    end = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            lo, hi = (int(x) for x in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise StateFileError(f"{where}: corrupted header entry for tensor {name!r}") from None
        if not 0 <= lo <= hi:
            raise StateFileError(f"{where}: tensor {name!r} has invalid offsets [{lo}, {hi})")
        if base + hi > size:
            raise StateFileError(
                f"{where}: truncated: tensor {name!r} ends at byte {base + hi} "
                f"but the file has {size} bytes"
            )
        end = max(end, hi)
    if base + end != size:
        raise StateFileError(
            f"{where}: {size - base - end} unexpected trailing bytes after the tensor data"
        )
    return header, base


def read_metadata(header: dict[str, Any], where: str) -> dict[str, Any]:
    md = header.get("__metadata__")
    if not isinstance(md, dict) or "svattn" not in md:
        raise StateVersionError(f"{where}: not an svattn state file (no 'svattn' metadata)")
    text = md["svattn"]
    try:
        meta = json.loads(text)
    except (TypeError, json.JSONDecodeError, RecursionError) as exc:
        raise StateFileError(f"{where}: corrupted metadata (not valid JSON: {exc})") from None
    if not isinstance(meta, dict):
        raise StateFileError(f"{where}: corrupted metadata (not a JSON object)")
    if meta.get("format") != FORMAT_NAME:
        raise StateVersionError(
            f"{where}: not an svattn state file (format {meta.get('format')!r}, "
            f"expected {FORMAT_NAME!r})"
        )
    if meta.get("format_version") not in READS:
        raise StateVersionError(
            f"{where}: unsupported format version {meta.get('format_version')!r} "
            f"(this svattn reads versions {', '.join(map(str, READS))})"
        )
    body = {k: v for k, v in meta.items() if k != "meta_sha256"}
    if meta.get("meta_sha256") != sha256_hex(canonical(body).encode()):
        raise StateFileError(f"{where}: metadata checksum mismatch (the metadata was altered)")
    return meta


def check(cond: bool, where: str, msg: str) -> None:
    """Raise :class:`StateFileError` with ``where: msg`` unless ``cond``."""
    if not cond:
        raise StateFileError(f"{where}: {msg}")


# How far the KKT residual recomputed on load may lie from the saved one: rounding. The
# residual is a maximum of terms at rounding level (~1e-16), and another numpy or BLAS
# sums them in another order (a stream folder saved by one install recomputed 8.327e-17
# under another against a saved 8.327e-17, not bit for bit, and was refused); a claim
# off by more (a violation of 1e-14 or more hidden) is refused.
KKT_ROUNDING = 1e-14


def check_recomputed(t: dict[str, np.ndarray], meta: dict[str, Any], where: str, *,
                     digest: str, residual: float, margin_order: list[int]) -> None:
    """A loaded state's recomputed facts (its digest, KKT residual and margin order) and
    its tensors must be what the metadata records."""
    check(digest == meta["state_digest"], where,
          "state digest mismatch: the recomputed digest differs from the recorded one")
    ids = [int(i) for i in t["ids"]]
    check(ids == meta["ids"], where, "the id list in the metadata differs from the ids tensor")
    for name, code in (("margin", MARGIN), ("error", ERROR), ("reserve", RESERVE)):
        got = [i for i, s in zip(ids, t["state"], strict=True) if s == code]
        check(got == meta["partition"][name], where, f"the {name} set differs from the states")
    check(margin_order == meta["margin_order"], where,
          "margin order differs from the cache columns")
    saved = meta["kkt_residual"]
    off = math.inf
    if isinstance(saved, (int, float)) and not isinstance(saved, bool):
        try:
            off = abs(residual - float(saved))
        except OverflowError:  # an int no float holds
            pass
    check(off <= KKT_ROUNDING, where,
          f"KKT residual {residual:.3e} recomputed on load differs from the saved "
          + (f"{saved:.3e}" if isinstance(saved, float) else f"{saved!r:.40}"))


@contextlib.contextmanager
def inconsistent_state(where: str) -> Iterator[None]:
    """A loaded state's reading or checks failing on its content (a schema error, or a
    KeyError / TypeError / ValueError / IndexError) as :class:`StateFileError`."""
    from svattn.exact.records.schema import SchemaError

    try:
        yield
    except StateFileError:
        raise
    except SchemaError as exc:
        raise StateFileError(f"{where}: {exc}") from None
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        raise StateFileError(f"{where}: inconsistent state ({type(exc).__name__}: {exc})"
                             ) from None


def read_state(data: bytes, where: str) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Tensors and metadata of a state file's bytes, every checksum and the canonical
    form verified (the semantic checks are the caller's)."""
    from safetensors import SafetensorError
    from safetensors.numpy import load as st_load

    header, _ = parse_header(data, where)
    meta = read_metadata(header, where)
    try:
        t = st_load(data)
    except SafetensorError as exc:
        raise StateFileError(f"{where}: corrupted tensor data ({exc})") from None
    sums = meta.get("tensor_sha256")
    check(isinstance(sums, dict), where, "metadata lacks the tensor checksums")
    check(set(t) <= set(TENSOR_DTYPES), where,
          f"tensor set {sorted(t)} does not match the format ({sorted(TENSOR_DTYPES)})")
    check(set(sums) == set(t), where,
          f"tensor set {sorted(t)} does not match its checksums ({sorted(sums)})")
    for name in sorted(t):
        check(name in TENSOR_DTYPES and header[name]["dtype"] == TENSOR_DTYPES[name], where,
              f"tensor {name!r} has dtype {header[name]['dtype']}, expected "
              f"{TENSOR_DTYPES.get(name)}")
        check(sha256_hex(np.ascontiguousarray(t[name]).tobytes()) == sums[name], where,
              f"tensor {name!r} checksum mismatch (its bytes were altered)")
    # catch-all: the loaded content must serialise back to exactly these bytes
    if serialize(t, meta) != data:
        raise StateFileError(f"{where}: the file differs from the canonical serialisation of "
                             "its content (header bytes were altered)")
    return t, meta


def state_file_bytes(t: dict[str, np.ndarray], meta: dict[str, Any]) -> bytes:
    """The bytes of a state file: ``meta`` gains the format, version and checksums."""
    meta = {"format": FORMAT_NAME, "format_version": FORMAT_VERSION, **meta,
            "tensor_sha256": {k: sha256_hex(v.tobytes()) for k, v in t.items()}}
    return serialize(t, meta)


__all__ = ["FORMAT_NAME", "FORMAT_VERSION", "SavedNotDurable", "StateFileError",
           "StateVersionError", "canonical", "check", "check_recomputed", "parse_header",
           "read_metadata", "read_state", "remove_file", "remove_leftovers", "replace_zeroing",
           "save_lock", "serialize", "sha256_hex", "state_file_bytes", "write_atomic",
           "check_loaded_state", "zero_file"]


def check_loaded_state(ss, be, health, t: dict[str, np.ndarray], meta: dict, where: str, *,
                       digest: str, residual: float) -> None:
    """The semantic checks of a loaded state (``ss`` on backend ``be``, its health
    monitor ``health``), recomputed from its arrays: the health record, the stored
    digest, residual and margin order (:func:`check_recomputed`), and optimality.

    Raises
    ------
    StateFileError
        Naming the first check that fails.
    """
    try:
        health.restore(meta["health"], ss.Qinv)
    except (KeyError, TypeError, ValueError) as exc:
        raise StateFileError(f"{where}: inconsistent health record ({exc})") from None
    check_recomputed(t, meta, where, digest=digest, residual=residual,
                     margin_order=[int(ss.slot_id[s]) for s in ss.slot_of_col[: ss.nS]])
    wrong = optimality_error(ss, be)
    if wrong is not None:
        raise StateFileError(f"{where}: {wrong}")
