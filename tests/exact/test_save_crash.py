"""Crash points of a state save that follows a forget, enumerated as SQLite tests its
commits (``crash_helpers.CrashingOS``): a memory with a signed audit log erases a data
subject, then :meth:`SVDDMemory.save` dies at its N-th write, fsync, truncate, rename or
unlink (the earlier killed save's temporary file zeroed and removed, the new file's
bytes and fsync, the save's log line and checkpoint, the rename, the folder's fsync),
for every N, the pending call dropped, written or garbled.

After each crash:

* the state file loads, to the state before the save or after it, never a mix;
* log and state agree: the new state continues its log (the checkpoint the state
  records is a signed root of the log's prefix), and the old one is refused by its log
  (it would resurrect the erased rows) and recovered from it, the erased rows removed
  again and the old file named as still holding them;
* no forgotten byte (the subject's keys as float64, its name) is in any file under the
  folder (temporary files, the log and its checkpoint included) unless the save did not
  land, and then only in the old state file itself.
"""

from __future__ import annotations

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
from svattn.exact import SVDDMemory
from svattn.exact.auditor.recovery import recover
from svattn.exact.records import audit as audit_module
from svattn.exact.records import fileformat
from svattn.exact.records import openings as openings_module
from svattn.exact.records import tlog as tlog_module
from svattn.exact.records.audit import AuditLogError, verify_chain
from svattn.exact.records.fileformat import parse_header, read_metadata
from svattn.exact.records.merkle import MerkleTree
from svattn.exact.records.signing import generate_key
from svattn.exact.records.tlog import controller_verifier, open_checkpoint

KEY = generate_key()
SUBJECT = "alice-subject"
MODULES = (fileformat, audit_module, tlog_module, openings_module)
LEFTOVER = ".m.safetensors.k1ll3d00.tmp"  # what a save killed before its rename leaves


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A folder holding a memory saved with its signed log, the subject's rows among
    its tokens; the subject's key bytes; the digests before and after the erase."""
    base = tmp_path_factory.mktemp("base")
    rng = np.random.default_rng(3)
    X = rng.normal(size=(40, 3))
    tags = [SUBJECT if i % 7 == 2 else ("bob" if i % 3 == 0 else None) for i in range(40)]
    mem = SVDDMemory(0.1, audit_log=base / "audit.jsonl", signing_key=KEY)
    mem.extend(X, tags=tags)
    mem.save(base / "m.safetensors")
    old = mem.state_digest()
    mem.close_audit_log()
    probe = tmp_path_factory.mktemp("probe") / "p"
    shutil.copytree(base, probe)
    mem = SVDDMemory.load(probe / "m.safetensors", audit_log=probe / "audit.jsonl",
                          signing_key=KEY)
    mem.erase(SUBJECT)
    new = mem.state_digest()
    mem.close_audit_log()
    needles = key_bytes(X[[i for i, t in enumerate(tags) if t == SUBJECT]]) + [SUBJECT.encode()]
    assert residue(base, needles) == {"m.safetensors": list(range(len(needles) - 1))}
    return base, needles, old, new


def _save_after_forget(base, folder, monkeypatch, fake: CrashingOS) -> None:
    """The user's sequence on a copy of ``base``: load with the log, a killed earlier
    save's temporary file (the state with the subject) beside the state, erase the
    subject, save under ``fake``; the process then dies (its log descriptor closed)."""
    shutil.copytree(base, folder)
    mem = SVDDMemory.load(folder / "m.safetensors", audit_log=folder / "audit.jsonl",
                          signing_key=KEY)
    shutil.copyfile(folder / "m.safetensors", folder / LEFTOVER)
    mem.erase(SUBJECT)
    try:
        with crashing(monkeypatch, fake, MODULES):
            mem.save(folder / "m.safetensors")
    finally:
        mem.close_audit_log()


def _check_crashed(folder, needles, old, new) -> str:
    """The checks after one crash; returns which state the folder holds."""
    state, log = folder / "m.safetensors", folder / "audit.jsonl"
    raw = residue(folder, needles)  # before anything opens (and cleans) the folder
    digest = SVDDMemory.load(state).state_digest()
    assert digest in (old, new)
    rep = verify_chain(log, allow_torn_tail=True)
    assert rep.ok, rep.error
    if digest == new:  # the save landed: nothing of the subject anywhere
        assert raw == {}, raw
        mem = SVDDMemory.load(state, audit_log=log, signing_key=KEY)  # state and log agree
        mem.close_audit_log()
        head = read_metadata(parse_header(state.read_bytes(), "s")[0], "s")["audit_head"]
        cp, _ = open_checkpoint(head["checkpoint"], [controller_verifier(KEY.public_key())])
        assert cp.root == MerkleTree(rep.leaves[:cp.size]).root()
        assert residue(folder, needles) == {}
        return "new"
    # the save did not land: only the old state (and the earlier killed save's file,
    # when the crash came before its removal) holds the subject
    assert set(raw) <= {"m.safetensors", LEFTOVER} and "m.safetensors" in raw, raw
    assert set(residue(folder, needles)) == {"m.safetensors"}  # load swept the leftover
    with pytest.raises(AuditLogError, match="resurrect|does not verify"):
        SVDDMemory.load(state, audit_log=log, signing_key=KEY)
    again, report = recover(state, log, folder / "recovered.jsonl", signing_key=KEY)
    assert again.state_digest() == new and len(report.replayed) == len(needles) - 1
    assert "old state file still holds" in report.summary()
    again.save(folder / "recovered.safetensors")
    again.close_audit_log()
    state.unlink()  # what the summary asks
    assert residue(folder, needles) == {}
    return "old"


@pytest.mark.parametrize("all_modes", [False, pytest.param(True, marks=pytest.mark.slow)])
def test_every_crash_point_of_a_save_after_a_forget_leaves_old_or_new(saved, tmp_path,
                                                                      monkeypatch, all_modes):
    """Every call dropped (a write also garbled; the last also written: a call written is
    the next one dropped); -m slow writes each call too."""
    base, needles, old, new = saved
    trace, outcomes = enumerate_crashes(
        lambda folder, fake: _save_after_forget(base, folder, monkeypatch, fake),
        lambda folder: _check_crashed(folder, needles, old, new),
        tmp_path, all_modes=all_modes, raises=(Crash, AuditLogError))
    # the leftover's zeroing, fsync and unlink; the file's write and fsync; the log
    # line's; the checkpoint's write, fsync, rename and the folder's fsync; the rename;
    # the folder's fsync; the replaced file's zeroing and fsync
    assert len(trace) >= 13, trace
    # both outcomes reached: a crash after the rename lands the save, one before does not
    assert outcomes.count("new") >= 2 and outcomes.count("old") >= len(trace) - 4, \
        outcomes


def test_the_replaced_state_file_is_overwritten_with_zeros(saved, tmp_path):
    """A save overwrites the file it replaced (read here through a descriptor opened
    before the save) with zeros once the new one is durable; a second name of that
    file (a hard link: someone's copy) keeps it whole."""
    base, needles, _, new = saved
    folder = tmp_path / "m"
    shutil.copytree(base, folder)
    state = folder / "m.safetensors"
    mem = SVDDMemory.load(state, audit_log=folder / "audit.jsonl", signing_key=KEY)
    size = state.stat().st_size
    with open(state, "rb") as before:
        mem.erase(SUBJECT)
        mem.save(state)
        assert before.read() == bytes(size)
    assert residue(folder, needles) == {} and SVDDMemory.load(state).state_digest() == new
    (folder / "copy").hardlink_to(state)
    mem.save(state)
    mem.close_audit_log()
    assert SVDDMemory.load(folder / "copy").state_digest() == new


def test_recover_on_the_command_line_removes_the_old_state_when_asked(saved, tmp_path,
                                                                     monkeypatch, capsys):
    """A save after a forget killed before its rename; ``svattn recover`` replays the
    erasure and says the old state still holds the rows, and with --remove-old-state
    overwrites and deletes it: then no file of the folder holds them."""
    from svattn.cli import main

    base, needles, _, new = saved
    folder = tmp_path / "m"
    counter = CrashingOS()
    _save_after_forget(base, tmp_path / "count", monkeypatch, counter)
    rename = len(counter.trace) - counter.trace[::-1].index("replace")  # the state's
    with pytest.raises(Crash):
        _save_after_forget(base, folder, monkeypatch, CrashingOS(rename, "dropped"))
    state, log = folder / "m.safetensors", folder / "audit.jsonl"
    args = ["recover", str(state), str(log), "--new-log", str(folder / "new.jsonl"),
            "--out", str(folder / "new.safetensors")]
    assert main(args) == 0
    assert "old state file still holds" in capsys.readouterr().out
    assert set(residue(folder, needles)) == {"m.safetensors"}
    for name in ("new.jsonl", "new.jsonl.checkpoint", "new.safetensors"):
        (folder / name).unlink()
    assert main([*args, "--remove-old-state"]) == 0
    out = capsys.readouterr().out
    assert "old state file, which held the" in out and "still holds" not in out
    assert not state.exists() and residue(folder, needles) == {}
    assert SVDDMemory.load(folder / "new.safetensors").state_digest() == new
