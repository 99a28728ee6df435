"""Crash points of a stream folder's save after :meth:`LMStream.forget`, enumerated as
SQLite tests its commits, in process (``crash_helpers.CrashingOS``: every later call of
the dead process changes nothing): the save stops at its N-th write, fsync, rename or
unlink, for every N, the pending call dropped, written or garbled (a write cut short).
(``test_stream_folder`` kills a forked child at sampled steps, a write cut short.)

After each crash the folder loads, to the stream before the forget or after it, and once
loaded no file under it (temporary files and the lock included) holds a byte, key, value,
hidden state or logit of the forgotten span, unless the save did not land (then the old
generation holds it: the state before the forget).
"""

from __future__ import annotations

import shutil

import pytest
from test_stream import SECRET, fresh_of, make, span_rows, text_of

from crash_helpers import CrashingOS, crashing, enumerate_crashes, residue
from svattn.exact.records import fileformat
from svattn.lm import stream as stream_module
from svattn.lm import stream_folder
from svattn.lm.stream import LMStream

MODEL = make()
TEXT = text_of(30) + SECRET + text_of(30, seed=2)
A, B = 30, 30 + len(SECRET)
MODULES = (fileformat, stream_folder, stream_module)


@pytest.fixture(scope="module")
def forgotten(tmp_path_factory):
    """A folder holding the stream with the span; the stream after forgetting it; the
    digests before and after; what the scan looks for (the span's 4-byte pieces, rows)."""
    base = tmp_path_factory.mktemp("base") / "st"
    s = fresh_of(MODEL, TEXT)
    s.save(base)
    before = s.digest()
    s.forget(A, B)
    needles = [SECRET[i : i + 4] for i in range(len(SECRET) - 3)] + span_rows(MODEL, TEXT, A, B)
    assert residue(base, needles), "the scan must see the span while it is held"
    return base, s, before, s.digest(), needles


def _crashed_save(forgotten, folder, monkeypatch, fake: CrashingOS) -> None:
    base, s, *_ = forgotten
    shutil.copytree(base, folder)
    with crashing(monkeypatch, fake, MODULES):
        s.save(folder)


def _check(forgotten, folder) -> str:
    _, _, before, after, needles = forgotten
    loaded = LMStream.load(folder, MODEL)  # finishes or discards the interrupted save
    assert loaded.digest() in (before, after)
    if loaded.digest() == after:
        assert residue(folder, needles) == {}
        return "new"
    assert loaded.text == TEXT
    return "old"


def _enumerate(forgotten, tmp_path, monkeypatch, steps, *, all_modes=False) -> list[str]:
    """Crash the save at each of ``steps(trace)`` (1-based call numbers, from the trace of
    a save run to its end; ``crash_helpers.crash_points``); return each outcome."""
    return enumerate_crashes(
        lambda folder, fake: _crashed_save(forgotten, folder, monkeypatch, fake),
        lambda folder: _check(forgotten, folder), tmp_path, steps=steps,
        all_modes=all_modes)[1]


def test_a_stream_save_crashed_at_sampled_points_loads_old_or_new(forgotten, tmp_path,
                                                                  monkeypatch):
    """The first call, every call of the commit (the new manifest's write, fsync, rename
    and the folder's fsync) and the first of the old generation's removal, and the last,
    each dropped (a write also garbled, the last call also written); every call in the
    three modes under -m slow."""
    def steps(trace):
        assert len(trace) > 20 and "unlink" in trace
        commit = len(trace) - trace[::-1].index("replace")  # the new manifest's rename
        return sorted({1, *range(commit - 2, commit + 5), len(trace)})

    outcomes = _enumerate(forgotten, tmp_path, monkeypatch, steps)
    assert "old" in outcomes and "new" in outcomes, outcomes


@pytest.mark.slow
def test_a_stream_save_crashed_at_every_point_loads_old_or_new(forgotten, tmp_path,
                                                              monkeypatch):
    outcomes = _enumerate(forgotten, tmp_path, monkeypatch,
                          lambda trace: range(1, len(trace) + 1), all_modes=True)
    assert "old" in outcomes and "new" in outcomes, outcomes
