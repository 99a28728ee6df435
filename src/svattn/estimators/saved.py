"""The folder :meth:`SVDD.save <svattn.estimators.SVDD.save>` writes and
:meth:`SVDD.load <svattn.estimators.SVDD.load>` reads.

``memory.safetensors`` is the exact memory's own state file
(:meth:`svattn.exact.SVDDMemory.save`: atomic, verified on load, its save recorded in
the audit log); ``estimator.json`` holds what the estimator adds: its parameters,
``C_``, ``gamma_``, ``fit_path_``, the feature names, the rows' ids per token
(:class:`~svattn.estimators.rows.RowLedger`), and the state file's digest and SHA-256,
which tie the two files together. Nothing in it is unpickled. The folder holds the
remaining rows and their ids: personal data. It never holds a key.

A save is atomic across the two files. The new ``estimator.json`` is first written
(durably, :func:`~svattn.exact.records.fileformat.write_atomic`) as
``estimator.next.json``, naming the new state file's SHA-256; then the state file is
renamed over the old one (the commit); then ``estimator.next.json`` over
``estimator.json`` (each replaced file then overwritten with zeros: they hold the rows
and ids forgotten since). Killed anywhere, :func:`finish_save` (run by the next save and load)
completes the save when the state file in place is the one ``estimator.next.json``
names, and otherwise overwrites and deletes it: the folder loads to the model before the
save or after it, never a mix, and once opened no file in it holds a row or an id the
save had forgotten.
"""

from __future__ import annotations

import json
import numbers
import os
from pathlib import Path

from svattn.exact import SVDDMemory
from svattn.exact.records import fileformat
from svattn.exact.records.certificate import finite_number, no_duplicate_keys
from svattn.exact.records.fileformat import SavedNotDurable, sha256_hex, write_atomic

MODEL_FORMAT, MODEL_VERSION = "svattn.SVDD", 1
STATE_FILE, MODEL_FILE = "memory.safetensors", "estimator.json"
NEXT_FILE = "estimator.next.json"
"""The model file of a save in progress (its state file not yet, or just, committed)."""
LEGACY_TEMP = f".{MODEL_FILE}.tmp"  # the temporary name earlier versions wrote it under


def model_folder(path) -> Path:
    """``path`` as a folder to save into (made when missing; a file is refused)."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file; save takes a folder")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def model_file_bytes(fields: dict) -> bytes:
    """``estimator.json``'s bytes for ``fields`` (format and version added)."""
    meta = {"format": MODEL_FORMAT, "version": MODEL_VERSION, **fields}
    return json.dumps(meta, sort_keys=True, allow_nan=False, default=json_number).encode()


def save_model(folder: Path, memory: SVDDMemory, fields: dict) -> str:
    """Save ``memory`` and ``estimator.json`` (``fields``, the state file's SHA-256 added)
    into ``folder``, atomically across the two (the module's protocol); return the SHA-256.

    ``estimator.json`` is durable (as ``estimator.next.json``) before the state file it
    describes replaces the old one, and replaces it after: killed in between, the next
    load or save finishes the save (:func:`finish_save`)."""
    finish_save(folder)  # what an interrupted save left
    try:
        digest = memory.save(folder / STATE_FILE, before_commit=lambda sha: write_next_model_file(
            folder, model_file_bytes({**fields, "state_sha256": sha})))
    except SavedNotDurable:  # committed: the model file follows
        commit_model_file(folder)
        raise
    except BaseException:
        discard_next_model_file(folder)
        raise
    commit_model_file(folder)
    return digest


def write_next_model_file(folder: Path, data: bytes) -> None:
    """Write ``estimator.next.json`` atomically and durably: the state save's
    ``before_commit``, run under the folder's save lock, which the save holds."""
    write_atomic(folder / NEXT_FILE, data, locked=True)


def commit_model_file(folder: Path) -> None:
    """Replace ``estimator.json`` with ``estimator.next.json``, sync the folder, then
    overwrite the old one with zeros. Idempotent: a missing next file (another process
    finished this save) is done already."""
    try:  # the old estimator.json (it holds the ids of rows forgotten since) is zeroed
        fileformat.replace_zeroing(folder / NEXT_FILE, folder / MODEL_FILE)
    except FileNotFoundError:  # finished meanwhile by a load
        return


def discard_next_model_file(folder: Path) -> None:
    """Overwrite and delete ``estimator.next.json`` (a save that failed before its
    commit); best effort: what cannot be removed, the next save or load removes."""
    try:
        _zero_and_delete(folder / NEXT_FILE)
    except OSError:
        pass


def finish_save(folder: Path) -> Path:
    """Complete or discard what an interrupted save left in ``folder``; return the model
    file to read (``estimator.next.json`` only where the folder cannot be written).

    ``estimator.next.json`` naming the SHA-256 of the state file in place: that save
    committed, and the next file replaces ``estimator.json``; naming another: the save
    did not commit, and it is overwritten and deleted, as are the temporary files of
    both names. The stale file is only removed while no save holds the folder's save
    lock (a save between writing it and its commit holds it)."""
    nxt, state = folder / NEXT_FILE, folder / STATE_FILE
    lock = _try_lock(folder)
    try:
        if lock >= 0:
            for name in (MODEL_FILE, NEXT_FILE, STATE_FILE):
                fileformat.remove_leftovers(folder / name, locked=True)
        if not nxt.is_file():
            committed = False
        else:
            committed = state.is_file() and _names_state(nxt, sha256_hex(state.read_bytes()))
        try:
            if lock >= 0:
                _zero_and_delete(folder / LEGACY_TEMP)
            if committed:
                commit_model_file(folder)
            elif lock >= 0:
                _zero_and_delete(nxt)
        except OSError:  # a read-only folder: read what the committed save wrote
            return nxt if committed else folder / MODEL_FILE
        return folder / MODEL_FILE
    finally:
        if lock >= 0:
            os.close(lock)


def _names_state(path: Path, sha: str) -> bool:
    try:
        return json.loads(path.read_bytes()).get("state_sha256") == sha
    except (OSError, ValueError, AttributeError, RecursionError):
        return False


def _try_lock(folder: Path) -> int:
    """The folder's save lock (:func:`svattn.exact.records.fileformat.save_lock`), -1 when
    another process holds it or it cannot be taken."""
    try:
        return fileformat.save_lock(folder / STATE_FILE, wait=False)
    except OSError:
        return -1


def _zero_and_delete(path: Path) -> None:
    """Overwrite ``path`` with zeros and delete it
    (:func:`~svattn.exact.records.fileformat.remove_file`); a missing file is nothing to
    do."""
    try:
        fileformat.remove_file(path)
    except FileNotFoundError:
        pass


def read_model_file(path) -> tuple[dict, str, Path]:
    """``estimator.json`` of the folder ``path``, its form checked: ``(fields, where,
    state file path)``; an interrupted save is finished or discarded first
    (:func:`finish_save`).

    Raises
    ------
    FileNotFoundError
        No such folder, or a file missing in it.
    ValueError
        Not JSON, or a field of the wrong form (named).
    """
    folder = Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"no such model folder: {folder}")
    meta_path, state_path = finish_save(folder), folder / STATE_FILE
    for p in (meta_path, state_path):
        if not p.is_file():
            raise FileNotFoundError(f"{folder} is not a saved SVDD: no {p.name} in it")
    where = str(meta_path)
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"),
                          object_pairs_hook=no_duplicate_keys)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"{where}: not a model file ({exc})") from None
    check_meta(meta, where)
    return meta, where, state_path


def check_state_file(meta: dict, state_path: Path, where: str) -> None:
    """The state file beside ``estimator.json`` is the one it was saved with."""
    if sha256_hex(state_path.read_bytes()) != meta["state_sha256"]:
        raise ValueError(f"{where}: {STATE_FILE} is not the state file this model was "
                         "saved with (its SHA-256 differs: replaced, or a save was "
                         "interrupted between the two files; save again)")


def json_number(value):
    """``json.dumps``' ``default``: numpy numbers as Python ones."""
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f"cannot save a parameter of type {type(value).__name__}")


_META_KEYS = {"format", "version", "params", "C_", "gamma_", "fit_path_", "n_features_in_",
              "feature_names_in_", "rows", "state_digest", "state_sha256", "sample_weight"}
_OPTIONAL = {"sample_weight"}  # absent: every row weight 1 (files saved before weights)


def check_meta(meta, where: str) -> None:
    """``estimator.json``'s form (each field named)."""
    if not isinstance(meta, dict) or meta.get("format") != MODEL_FORMAT:
        raise ValueError(f"{where}: not an svattn SVDD model file (format "
                         f"{MODEL_FORMAT!r} expected)")
    if meta.get("version") != MODEL_VERSION:
        raise ValueError(f"{where}: model file version {meta.get('version')!r} is not "
                         f"supported (expected {MODEL_VERSION})")
    missing = sorted(_META_KEYS - _OPTIONAL - set(meta))
    unknown = sorted(set(meta) - _META_KEYS)
    if missing or unknown:
        raise ValueError(f"{where}: missing fields {missing}, unknown fields {unknown}")
    if not isinstance(meta["params"], dict):
        raise ValueError(f"{where}: params must be an object")
    for name in ("C_", "gamma_"):
        v = meta[name]
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and finite_number(v)
                and v > 0):
            raise ValueError(f"{where}: {name} must be a number > 0, got {v!r}")
    if meta["fit_path_"] not in ("incremental", "libsvm+exact", "warm", "reference"):
        raise ValueError(f"{where}: fit_path_ must be 'incremental', 'libsvm+exact', 'warm' "
                         "or 'reference'")
    weights = meta.get("sample_weight", {"uniform": 1.0})
    unit = weights.get("uniform") if isinstance(weights, dict) else None
    if not (weights == {"weighted": True} or (
            isinstance(weights, dict) and set(weights) == {"uniform"} and isinstance(
                unit, (int, float)) and not isinstance(unit, bool) and finite_number(unit)
            and unit > 0)):
        raise ValueError(f"{where}: sample_weight must be {{\"uniform\": w > 0}} or "
                         "{\"weighted\": true}")
    n = meta["n_features_in_"]
    if not (isinstance(n, int) and not isinstance(n, bool) and n >= 1):
        raise ValueError(f"{where}: n_features_in_ must be an int >= 1")
    names = meta["feature_names_in_"]
    if names is not None and not (isinstance(names, list) and len(names) == n
                                  and all(isinstance(s, str) for s in names)):
        raise ValueError(f"{where}: feature_names_in_ must be null or {n} strings")
    for name in ("state_digest", "state_sha256"):
        v = meta[name]
        if not (isinstance(v, str) and len(v) == 64 and set(v) <= set("0123456789abcdef")):
            raise ValueError(f"{where}: {name} must be 64 lowercase hex digits")


def check_against_memory(meta, memory: SVDDMemory, where: str) -> None:
    """``estimator.json`` describes the memory loaded beside it."""
    if meta["state_digest"] != memory.state_digest():
        raise ValueError(f"{where}: state_digest is not the state file's")
    if memory.kernel != meta["params"].get("kernel", "rbf"):
        raise ValueError(f"{where}: params.kernel is not the state file's kernel")
    weights = meta.get("sample_weight", {"uniform": 1.0})
    if "weighted" in weights:
        if memory.C != meta["C_"]:
            raise ValueError(f"{where}: C_ is not the weighted state's unit box")
    elif memory.C != min(float(meta["C_"]) * weights["uniform"], 1.0):
        raise ValueError(f"{where}: C_ is not the state file's C ({memory.C!r})")
    if memory.dim is not None and memory.gamma_value != meta["gamma_"]:
        raise ValueError(f"{where}: gamma_ is not the state file's gamma")
    if memory.dim is not None and memory.dim != meta["n_features_in_"]:
        raise ValueError(f"{where}: n_features_in_ is not the state file's dimension")



__all__ = ["MODEL_FILE", "MODEL_FORMAT", "MODEL_VERSION", "NEXT_FILE", "STATE_FILE",
           "check_against_memory", "check_meta", "check_state_file", "commit_model_file",
           "discard_next_model_file", "finish_save", "json_number", "model_file_bytes",
           "model_folder", "read_model_file", "save_model", "write_next_model_file"]
