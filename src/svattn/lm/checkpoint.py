"""Reading checkpoints without running code, and the one place that unpickles.

A checkpoint (``svattn train``'s ``ckpt.pt``, the recall runs' ``ckpt.pt`` and
``model.pt``) is a ``torch.save`` archive of plain data: tensors, dicts, lists,
tuples, strings, numbers. :func:`read_checkpoint` reads it with
``torch.load(weights_only=True)``, PyTorch's restricted unpickler, which builds
only those and refuses every other Python object, so a crafted checkpoint cannot
run code on the machine that reads it (``svattn generate``, ``verify-forget``,
``eval``, and training's ``--resume`` all read through it).

Checkpoints written by earlier versions of ``svattn train`` hold numpy's random
state as a numpy array (a pickled numpy object): they are refused, with the
command that converts them. :func:`convert_checkpoint` (``svattn
convert-checkpoint OLD NEW``) is the one place in svattn that unpickles
(``weights_only=False``): it warns, reads the old file, turns the numpy state into
plain data, checks that the result reads back under ``weights_only=True``, and
writes it atomically to a new file. Run it only on checkpoints whose origin you
trust: unpickling a crafted file runs its code.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import tempfile
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

__all__ = ["CONVERT", "CheckpointError", "UnsafeCheckpointError", "convert_checkpoint",
           "numpy_state_from_plain", "numpy_state_to_plain", "read_checkpoint"]

CONVERT = "svattn convert-checkpoint"
"""The command that converts a checkpoint of an earlier svattn (it unpickles)."""


class CheckpointError(ValueError):
    """A file that is not a checkpoint svattn can read."""


class UnsafeCheckpointError(CheckpointError):
    """A checkpoint holding pickled Python objects beyond plain data: not unpickled."""


def numpy_state_to_plain(state: tuple) -> dict[str, Any]:
    """``np.random.get_state()`` as plain data (a checkpoint stores it so)."""
    name, keys, pos, has_gauss, cached = state
    return {"name": str(name), "keys": torch.from_numpy(np.asarray(keys, dtype=np.int64)),
            "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)}


def numpy_state_from_plain(state: dict[str, Any]) -> tuple:
    """The tuple ``np.random.set_state`` takes, from :func:`numpy_state_to_plain`."""
    return (state["name"], state["keys"].numpy().astype(np.uint32), state["pos"],
            state["has_gauss"], state["cached_gaussian"])


def _head(path: Path) -> bytes:
    with open(path, "rb") as fh:
        return fh.read(4096)


def read_checkpoint(path: str | os.PathLike[str], *, map_location: Any = "cpu") -> Any:
    """The content of a ``torch.save`` checkpoint, read without unpickling objects.

    Raises
    ------
    FileNotFoundError
        No such file.
    UnsafeCheckpointError
        The archive pickles Python objects other than plain data (a checkpoint of
        an earlier svattn, or a crafted one); the message names the conversion
        command. Nothing in it was run.
    CheckpointError
        Not a ``torch.save`` archive (an SV memory state, a bare pickle, a
        truncated file).
    """
    path = Path(path)
    head = _head(path)
    if not head.startswith(b"PK"):  # torch.save writes a zip archive
        if len(head) > 8 and head[8:9] == b"{" and b'"svattn"' in head:
            raise CheckpointError(f"{path}: it is an SV memory state file (read it with "
                                  "svattn verify-deletion or svattn audit verify), not a "
                                  "checkpoint")
        raise CheckpointError(f"{path}: not a torch.save archive (a checkpoint is a zip "
                              "archive; this file is not read further)")
    try:
        return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        what = f"it pickles {found.group(1)}" if found else "it pickles Python objects"
        raise UnsafeCheckpointError(
            f"{path}: {what}, not only tensors and plain data. svattn reads checkpoints "
            "without unpickling objects, since unpickling can run code. A checkpoint of "
            "an earlier svattn (whose random state is a pickled numpy array): if you "
            f"trust where it came from, convert it once with `{CONVERT} {path} NEW` "
            "and use NEW") from None
    except Exception as exc:  # noqa: BLE001 (torch raises many kinds for a bad archive)
        raise CheckpointError(f"{path}: torch.load failed ({type(exc).__name__}: "
                              f"{' '.join(str(exc).split())[:300]})") from None


def _plain(obj: Any, where: str) -> Any:
    """``obj`` with numpy's random state and numpy values made plain data."""
    if isinstance(obj, dict):
        return {k: (numpy_state_to_plain(v) if k == "numpy" and isinstance(v, tuple)
                    and len(v) == 5 and isinstance(v[1], np.ndarray)
                    else _plain(v, f"{where}.{k}")) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(obj)]
    if isinstance(obj, tuple):
        return tuple(_plain(v, f"{where}[{i}]") for i, v in enumerate(obj))
    if isinstance(obj, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(obj))
    if isinstance(obj, np.generic):
        return obj.item()
    return obj


def convert_checkpoint(old: str | os.PathLike[str], new: str | os.PathLike[str], *,
                       warn: Callable[[str], None] | None = None) -> dict:
    """Convert a checkpoint of an earlier svattn into one :func:`read_checkpoint` reads.

    **This unpickles** ``old`` (``torch.load(weights_only=False)``): a crafted file runs
    its code here. It is the one place in svattn that does; once the paths are checked
    and before reading, it warns (``warn(message)``; default a :class:`UserWarning`).
    Numpy's random state and other numpy values become plain data; the result must
    read back under ``weights_only=True`` before it is written (atomically) to
    ``new``, which must not exist.

    Returns
    -------
    dict
        ``{"old", "new", "keys"}``: the paths and the checkpoint's top-level keys.

    Raises
    ------
    FileNotFoundError
        ``old`` does not exist.
    FileExistsError
        ``new`` exists (it is never overwritten).
    CheckpointError
        ``old`` is not a checkpoint (no model and model configuration), or what it
        holds cannot be made plain data.
    """
    old, new = Path(old), Path(new)
    if not old.is_file():
        raise FileNotFoundError(f"OLD: no such file: {old}")
    if new.exists():
        raise FileExistsError(f"NEW: {new} exists; give a new path (it is never overwritten)")
    if not _head(old).startswith(b"PK"):
        raise CheckpointError(f"OLD: {old} is not a torch.save archive")
    message = (f"unpickling {old}: this runs any code the file holds; convert only "
               "checkpoints whose origin you trust")
    if warn is None:
        warnings.warn(message, UserWarning, stacklevel=2)
    else:
        warn(message)
    try:
        ck = torch.load(old, map_location="cpu", weights_only=False)
    except Exception as exc:  # noqa: BLE001
        raise CheckpointError(f"OLD: torch.load failed ({type(exc).__name__}: {exc})") from None
    if not isinstance(ck, dict) or not {"model", "model_config"} <= set(ck):
        raise CheckpointError(f"OLD: {old} is not a checkpoint of svattn (a dict with "
                              "'model' and 'model_config')")
    out = _plain(ck, "checkpoint")
    buf = io.BytesIO()
    torch.save(out, buf)
    data = buf.getvalue()
    try:
        torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL ([\w.]+)", str(exc))
        raise CheckpointError(f"OLD: {old} holds objects that are not plain data "
                              f"({found.group(1) if found else exc}); not converted") from None
    new.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=new.parent, prefix=f".{new.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.link(tmp, new)  # never over an existing file
    finally:
        os.unlink(tmp)
    return {"old": str(old), "new": str(new), "keys": sorted(ck)}
