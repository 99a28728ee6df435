"""The folder :meth:`SVDD.save <svattn.estimators.SVDD.save>` writes and
:meth:`SVDD.load <svattn.estimators.SVDD.load>` reads.

``memory.safetensors`` is the exact memory's own state file
(:meth:`svattn.exact.SVDDMemory.save`: atomic, verified on load, its save recorded in
the audit log); ``estimator.json`` holds what the estimator adds: its parameters,
``C_``, ``gamma_``, ``fit_path_``, the feature names, the rows' ids per token
(:class:`~svattn.estimators.rows.RowLedger`), and the state file's digest and SHA-256,
which tie the two files together. Nothing in it is unpickled. The folder holds the
remaining rows and their ids: personal data. It never holds a key.
"""

from __future__ import annotations

import json
import numbers
import os
from pathlib import Path

from svattn.exact import SVDDMemory
from svattn.exact.records.certificate import finite_number, no_duplicate_keys
from svattn.exact.records.fileformat import sha256_hex

MODEL_FORMAT, MODEL_VERSION = "svattn.SVDD", 1
STATE_FILE, MODEL_FILE = "memory.safetensors", "estimator.json"


def model_folder(path) -> Path:
    """``path`` as a folder to save into (made when missing; a file is refused)."""
    folder = Path(path)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file; save takes a folder")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def write_model_file(folder: Path, fields: dict) -> None:
    """``estimator.json`` with ``fields`` (format and version added), written atomically
    (a temporary file, synced, renamed over the old one)."""
    meta = {"format": MODEL_FORMAT, "version": MODEL_VERSION, **fields}
    text = json.dumps(meta, sort_keys=True, allow_nan=False, default=json_number)
    tmp = folder / f".{MODEL_FILE}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, folder / MODEL_FILE)
    finally:
        tmp.unlink(missing_ok=True)


def read_model_file(path) -> tuple[dict, str, Path]:
    """``estimator.json`` of the folder ``path``, its form checked: ``(fields, where,
    state file path)``.

    Raises
    ------
    FileNotFoundError
        No such folder, or a file missing in it.
    ValueError
        Not JSON, or a field of the wrong form (named).
    """
    folder = Path(path)
    meta_path, state_path = folder / MODEL_FILE, folder / STATE_FILE
    if not folder.is_dir():
        raise FileNotFoundError(f"no such model folder: {folder}")
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
              "feature_names_in_", "rows", "state_digest", "state_sha256"}


def check_meta(meta, where: str) -> None:
    """``estimator.json``'s form (each field named)."""
    if not isinstance(meta, dict) or meta.get("format") != MODEL_FORMAT:
        raise ValueError(f"{where}: not an svattn SVDD model file (format "
                         f"{MODEL_FORMAT!r} expected)")
    if meta.get("version") != MODEL_VERSION:
        raise ValueError(f"{where}: model file version {meta.get('version')!r} is not "
                         f"supported (expected {MODEL_VERSION})")
    missing, unknown = sorted(_META_KEYS - set(meta)), sorted(set(meta) - _META_KEYS)
    if missing or unknown:
        raise ValueError(f"{where}: missing fields {missing}, unknown fields {unknown}")
    if not isinstance(meta["params"], dict):
        raise ValueError(f"{where}: params must be an object")
    for name in ("C_", "gamma_"):
        v = meta[name]
        if not (isinstance(v, (int, float)) and not isinstance(v, bool) and finite_number(v)
                and v > 0):
            raise ValueError(f"{where}: {name} must be a number > 0, got {v!r}")
    if meta["fit_path_"] not in ("incremental", "libsvm+exact"):
        raise ValueError(f"{where}: fit_path_ must be 'incremental' or 'libsvm+exact'")
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
    if memory.C != min(float(meta["C_"]), 1.0):
        raise ValueError(f"{where}: C_ is not the state file's C ({memory.C!r})")
    if memory.dim is not None and memory.gamma_value != meta["gamma_"]:
        raise ValueError(f"{where}: gamma_ is not the state file's gamma")
    if memory.dim is not None and memory.dim != meta["n_features_in_"]:
        raise ValueError(f"{where}: n_features_in_ is not the state file's dimension")



__all__ = ["MODEL_FILE", "MODEL_FORMAT", "MODEL_VERSION", "STATE_FILE", "check_against_memory",
           "check_meta", "check_state_file", "json_number", "model_folder", "read_model_file",
           "write_model_file"]
