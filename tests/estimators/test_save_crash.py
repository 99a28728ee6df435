"""Crash points of :meth:`SVDD.save` after :meth:`SVDD.forget`, enumerated as SQLite tests
its commits (``crash_helpers.CrashingOS``): the save dies at its N-th write, fsync,
truncate, rename or unlink (the state file, its log line and checkpoint, the model file,
the rename that commits them), for every N, the pending call dropped, written or garbled.

After each crash the folder loads, to the model before the forget or after it (never
the new state file beside the old model file), the log continues from the new one and
refuses the old one, and once the folder is opened no file under it (the log included)
holds a forgotten row: its key bytes (float64) or its id; before the save landed, only
the old state and model files do.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from crash_helpers import (
    Crash,
    CrashingOS,
    crashing,
    enumerate_crashes,
    key_bytes,
    residue,
)
from svattn import SVDD
from svattn.estimators import saved as saved_module
from svattn.exact.records import audit as audit_module
from svattn.exact.records import fileformat
from svattn.exact.records import openings as openings_module
from svattn.exact.records import tlog as tlog_module
from svattn.exact.records.audit import AuditLogError
from svattn.exact.records.signing import generate_key

KEY = generate_key()
SUBJECT = "alice"
MODULES = (saved_module, fileformat, audit_module, tlog_module, openings_module)


@pytest.fixture(scope="module")
def deployed(tmp_path_factory):
    """A folder holding a model fitted with ids and subjects, its signed log beside it
    (inside the folder, so the scan reads it); the subject's row ids and key bytes; the
    rows' ids before and after the forget."""
    base = tmp_path_factory.mktemp("base")
    rng = np.random.default_rng(5)
    X = rng.normal(size=(36, 3))
    ids = [f"row-{i:04d}-{'x' if i % 6 == 1 else 'y'}" for i in range(36)]
    subjects = [SUBJECT if i % 6 == 1 else f"s{i % 4}" for i in range(36)]
    model = SVDD(nu=0.2, signing_key=KEY, audit_log=base / "model" / "audit.jsonl")
    (base / "model").mkdir()
    model.fit(X, ids=ids, subjects=subjects)
    model.save(base / "model")
    model.memory_.close_audit_log()
    gone = [i for i, s in enumerate(subjects) if s == SUBJECT]
    needles = key_bytes(X[gone]) + [ids[i].encode() for i in gone]
    held = residue(base / "model", needles)
    assert set(held) == {"memory.safetensors", "estimator.json"}, held  # the scan sees them
    before = list(model.ids_)
    after = [t for i, t in enumerate(ids) if i not in gone]
    return base / "model", needles, before, after


def _forget_and_save(base, folder, monkeypatch, fake: CrashingOS) -> None:
    """The user's sequence on a copy of ``base``: load with key and log, forget the
    subject, save under ``fake``; then the process dies (its log released)."""
    shutil.copytree(base, folder)
    model = SVDD.load(folder, signing_key=KEY, audit_log=folder / "audit.jsonl")
    model.forget(subject=SUBJECT)
    try:
        with crashing(monkeypatch, fake, MODULES):
            model.save(folder)
    finally:
        model.memory_.close_audit_log()


def _check_crashed(folder, needles, before, after) -> str:
    raw = residue(folder, needles)
    model = SVDD.load(folder)  # opens (finishing or discarding the interrupted save)
    got = list(model.ids_)
    assert got in (before, after)
    opened = residue(folder, needles)
    if got == after:
        assert opened == {}, opened
        live = SVDD.load(folder, signing_key=KEY, audit_log=folder / "audit.jsonl")
        live.memory_.close_audit_log()
        return "new"
    assert set(raw) <= {"memory.safetensors", "estimator.json"}, raw
    assert set(opened) == {"memory.safetensors", "estimator.json"}, opened
    with pytest.raises(AuditLogError, match="resurrect|does not verify"):
        SVDD.load(folder, signing_key=KEY, audit_log=folder / "audit.jsonl")
    return "old"


@pytest.mark.parametrize("all_modes", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_every_crash_point_of_a_save_after_a_forget_loads_old_or_new(deployed, tmp_path,
                                                                     monkeypatch, all_modes):
    """Every call dropped (a write also garbled; the last also written: a call written is
    the next one dropped); -m slow writes each call too."""
    base, needles, before, after = deployed
    trace, outcomes = enumerate_crashes(
        lambda folder, fake: _forget_and_save(base, folder, monkeypatch, fake),
        lambda folder: _check_crashed(folder, needles, before, after),
        tmp_path, all_modes=all_modes, raises=(Crash, AuditLogError))
    assert len(trace) >= 10, trace
    assert "new" in outcomes and "old" in outcomes, outcomes


def test_a_save_zeroes_the_files_it_replaced_and_leaves_only_its_own(deployed, tmp_path):
    base, needles, _, after = deployed
    folder = tmp_path / "m"
    shutil.copytree(base, folder)
    model = SVDD.load(folder, signing_key=KEY, audit_log=folder / "audit.jsonl")
    model.forget(subject=SUBJECT)
    sizes = {n: (folder / n).stat().st_size for n in ("estimator.json", "memory.safetensors")}
    olds = {n: open(folder / n, "rb") for n in sizes}  # the files the save replaces
    try:
        model.save(folder)
        for n, f in olds.items():  # overwritten with zeros once replaced
            assert f.read() == bytes(sizes[n]), n
    finally:
        for f in olds.values():
            f.close()
    model.memory_.close_audit_log()
    assert sorted(p.name for p in folder.iterdir()) == [
        "audit.jsonl", "audit.jsonl.checkpoint", "audit.jsonl.openings", "estimator.json",
        "memory.safetensors"]
    assert residue(folder, needles) == {}
    assert list(SVDD.load(folder).ids_) == after
    assert json.loads((folder / "estimator.json").read_text())["rows"]
