"""LMStream folders as safe as memory states (issue #35, defects 5-8 and 12).

A save killed at any step (a forked child SIGKILLs itself at its k-th write, fsync,
rename or unlink) leaves a folder that loads, to the state before or after the save,
and after the next load or save no file in the folder holds a byte, key, value or
hidden state of a span forgotten before that save. One writer per folder; a save
deletes only files its manifests named; an edited manifest is refused; a byte outside
the vocabulary is refused before anything changes.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal

import pytest
import torch
from test_stream import SECRET, fresh_of, make, span_rows, text_of

from svattn.lm import CharLM, CharLMConfig
from svattn.lm.stream import LMStream, StreamStateError

MODEL = make()
TEXT = text_of(30) + SECRET + text_of(30, seed=2)
A, B = 30, 30 + len(SECRET)


def leaks(folder, rows) -> list[str]:
    """Files of ``folder`` holding the span's bytes (any 4 of them) or any of its rows."""
    out = []
    for p in sorted(folder.iterdir()):
        data = p.read_bytes()
        if any(SECRET[i : i + 4] in data for i in range(len(SECRET) - 3)) or \
                any(r in data for r in rows):
            out.append(p.name)
    return out


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A folder holding the stream with the secret, the stream after forgetting it,
    the digests before and after, and the span's rows."""
    base = tmp_path_factory.mktemp("base") / "st"
    s = fresh_of(MODEL, TEXT)
    s.save(base)
    before = s.digest()
    assert leaks(base, []), "the scan must see the span while it is held"
    s.forget(A, B)
    return base, s, before, s.digest(), span_rows(MODEL, TEXT, A, B)


# ----------------------------------------------------------------- killed saves

_STEPS = ("write", "fsync", "replace", "unlink")


def _killed_save(stream: LMStream | None, folder, k: int, at: str | None = None) -> int:
    """Save ``stream`` into ``folder`` in a forked child that SIGKILLs itself at its
    ``k``-th filesystem step (a write writes half its bytes first), or with ``at`` at
    the first rename of a file whose name starts with ``at``; return the number of
    steps the child took (k when killed, all of them when the save finished)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns
        try:
            os.close(r)
            real = {name: getattr(os, name) for name in _STEPS}
            count = [0]

            def step(name):
                def call(*args):
                    count[0] += 1
                    if count[0] == k or (at and name == "replace"
                                         and os.path.basename(args[0]).startswith(at)):
                        if name == "write":
                            real["write"](args[0], bytes(args[1])[: max(1, len(args[1]) // 2)])
                        os.kill(os.getpid(), signal.SIGKILL)
                    return real[name](*args)
                return call

            for name in _STEPS:
                setattr(os, name, step(name))
            if stream is None:  # a load (its clean-up of an interrupted save)
                LMStream.load(folder, MODEL)
            else:
                stream.save(folder)
            for name in _STEPS:
                setattr(os, name, real[name])
            os.write(w, str(count[0]).encode())
        finally:
            os._exit(0)
    os.close(w)
    _, status = os.waitpid(pid, 0)
    got = os.read(r, 64)
    os.close(r)
    if os.WIFSIGNALED(status):
        assert os.WTERMSIG(status) == signal.SIGKILL
        return k
    assert os.WIFEXITED(status) and got, status
    return int(got)


def _check_killed_at(saved, tmp_path, k: int) -> None:
    base, s, before, after, rows = saved
    folder = tmp_path / f"k{k}"
    shutil.copytree(base, folder)
    _killed_save(s, folder, k)
    loaded = LMStream.load(folder, MODEL)
    assert loaded.digest() in (before, after), k  # never a mix
    if loaded.digest() == after:  # the forget's save landed: nothing of the span is left
        assert leaks(folder, rows) == [], k
    else:  # it did not: only the state before it may hold the span
        assert loaded.text == TEXT
    named = _named(folder)
    assert sorted(p.name for p in folder.iterdir()) == named, k  # nothing else is left
    s.save(folder)  # the next save: nothing of the span anywhere
    assert leaks(folder, rows) == [], k
    assert LMStream.load(folder, MODEL).digest() == after


def _named(folder) -> list[str]:
    man = json.loads((folder / "stream.json").read_text())
    files = [man["arrays"]["file"]] + [m["file"] for lay in man["layers"]
                                       for m in lay["memories"]]
    return sorted(["stream.json", "stream.lock", *files])


def _steps(saved, tmp_path) -> int:
    base, s, *_ = saved
    folder = tmp_path / "count"
    shutil.copytree(base, folder)
    return _killed_save(s, folder, 10**9)


def test_a_save_killed_at_sampled_steps_leaves_no_forgotten_byte(saved, tmp_path):
    """A sample of the steps (every step under -m slow): the first and last of the
    save, around the new manifest, and inside the old generation's removal."""
    n = _steps(saved, tmp_path)
    assert n > 20
    for k in sorted({3, n // 3, n - 17, n - 15, n - 8, n}):
        _check_killed_at(saved, tmp_path, k)


@pytest.mark.slow
def test_a_save_killed_at_every_step_leaves_no_forgotten_byte(saved, tmp_path):
    n = _steps(saved, tmp_path)
    for k in range(1, n + 1):
        _check_killed_at(saved, tmp_path, k)


def test_the_old_generation_killed_before_removal_is_removed_by_load(saved, tmp_path):
    """Defect 5: killed after the new manifest, before the old files go."""
    base, s, _, after, rows = saved
    n = _steps(saved, tmp_path)
    folder = tmp_path / "st"
    for k in range(n, 0, -1):  # the last step that leaves the new manifest and old files
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(base, folder)
        _killed_save(s, folder, k)
        if leaks(folder, rows) and json.loads((folder / "stream.json").read_text()).get(
                "digest") == after:
            break
    else:
        pytest.fail("no step leaves the new manifest beside the old generation")
    assert LMStream.load(folder, MODEL).digest() == after
    assert leaks(folder, rows) == []


def test_a_load_killed_while_it_cleans_up_is_finished_by_the_next_one(saved, tmp_path):
    """The clean-up is idempotent: a load killed inside it leaves the manifest naming
    what is left, and the next load removes it."""
    base, s, _, after, rows = saved
    n = _steps(saved, tmp_path)
    folder = tmp_path / "st"
    shutil.copytree(base, folder)
    _killed_save(s, folder, n - 15)  # committed, the old generation not yet touched
    assert leaks(folder, rows)
    for k in (1, 2, 4, 7):  # zeroing a file, its fsync, an unlink, the next file
        _killed_save(None, folder, k)
    assert LMStream.load(folder, MODEL).digest() == after
    assert leaks(folder, rows) == []


def test_a_killed_temporary_file_is_swept_by_load_and_save(saved, tmp_path):
    """Defect 6: killed between a temporary file's fsync and its rename (the arrays'
    and a memory's), the next load or save removes it."""
    base, s, *_ = saved
    for how in ("load", "save"):
        for at in (".arrays.", ".memory.1.1."):
            folder = tmp_path / f"{how}{at}"
            shutil.copytree(base, folder)
            _killed_save(s, folder, 10**9, at=at)
            temps = [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]
            assert [t for t in temps if t.startswith(at)], temps  # the kill left it
            if how == "load":
                LMStream.load(folder, MODEL)
            else:
                s.save(folder)
            assert not [p.name for p in folder.iterdir() if p.name.endswith(".tmp")]
            assert sorted(p.name for p in folder.iterdir()) == _named(folder)


def test_a_temporary_file_of_an_older_save_holding_the_span_is_swept(saved, tmp_path):
    """A killed save of the stream while it still held the span left its arrays'
    temporary file (with the span's bytes); the save after the forget removes it."""
    base, s, _, after, rows = saved
    folder = tmp_path / "st"
    shutil.copytree(base, folder)
    held = LMStream.load(folder, MODEL)
    _killed_save(held, folder, 10**9, at=".arrays.")
    temps = [p for p in folder.iterdir() if p.name.startswith(".arrays.")]
    assert temps and SECRET in temps[0].read_bytes()
    s.save(folder)
    assert leaks(folder, rows) == []


# ----------------------------------------------------------------- writers

def test_a_second_writer_is_refused_and_changes_nothing(saved, tmp_path):
    base, s, before, *_ = saved
    folder = tmp_path / "st"
    shutil.copytree(base, folder)
    files = {p.name: p.read_bytes() for p in folder.iterdir()}
    fd = os.open(folder / "stream.lock", os.O_RDWR | os.O_CREAT)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # another process is saving
        with pytest.raises(StreamStateError, match="another process is saving"):
            s.save(folder)
        assert {p.name: p.read_bytes() for p in folder.iterdir()} == files
    finally:
        os.close(fd)
    s.save(folder)
    assert LMStream.load(folder, MODEL).digest() == s.digest()


def test_two_processes_saving_into_one_folder_never_break_it(saved, tmp_path):
    """Two forked writers save their streams into one folder, in turn, 4 times each:
    every save either lands or is refused as busy, and the folder loads to one of
    them with nothing else in it."""
    base, s, before, after, _ = saved
    folder = tmp_path / "st"
    shutil.copytree(base, folder)
    other = LMStream.load(folder, MODEL)  # the state before the forget
    pids = []
    for stream in (s, other):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                for _ in range(4):
                    try:
                        stream.save(folder)
                    except StreamStateError as exc:
                        if "another process is saving" not in str(exc):
                            code = 3
            except BaseException:  # noqa: BLE001 (any other failure fails the test)
                code = 4
            os._exit(code)
        pids.append(pid)
    for pid in pids:
        _, status = os.waitpid(pid, 0)
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    assert LMStream.load(folder, MODEL).digest() in (before, after)
    assert sorted(p.name for p in folder.iterdir()) == _named(folder)


def test_save_deletes_only_the_files_its_manifests_named(saved, tmp_path):
    """Defect 7: a user's own memory.* / arrays.* files in the folder stay."""
    base, s, *_ = saved
    folder = tmp_path / "st"
    shutil.copytree(base, folder)
    mine = {"memory.notes.safetensors": b"mine", "arrays.backup.safetensors": b"mine too",
            "memory.0.0.safetensors": b"a state of my own"}
    for name, data in mine.items():
        (folder / name).write_bytes(data)
    s.save(folder)
    s.save(folder)
    LMStream.load(folder, MODEL)
    for name, data in mine.items():
        assert (folder / name).read_bytes() == data


# ----------------------------------------------------------------- manifest

@pytest.mark.parametrize("edit", ["n_fed+1", "n_fed-1", "n_fed negative", "forgotten dropped",
                                  "forgotten moved", "forgotten added"])
def test_an_edited_manifest_is_refused(saved, tmp_path, edit):
    """Defect 8: the manifest's n_fed and forgotten spans are checked on load."""
    base, s, *_ = saved
    folder = tmp_path / "st"
    s.save(folder)
    man = json.loads((folder / "stream.json").read_text())
    assert man["n_fed"] == len(TEXT) and man["forgotten"] == [[A, B]]
    if edit == "n_fed+1":
        man["n_fed"] += 1
    elif edit == "n_fed-1":
        man["n_fed"] -= 1
    elif edit == "n_fed negative":
        man["n_fed"] = -5
    elif edit == "forgotten dropped":
        man["forgotten"] = []
    elif edit == "forgotten moved":
        man["forgotten"] = [[A + 1, B + 1]]
    else:
        man["forgotten"] = [[A, B], [B + 2, B + 3]]
    (folder / "stream.json").write_text(json.dumps(man))
    with pytest.raises(StreamStateError):
        LMStream.load(folder, MODEL)


def test_an_edited_manifest_with_its_checksum_recomputed_is_still_refused(saved, tmp_path):
    """The checksum is not a signature: the fed positions must still add up."""
    from svattn.lm.stream_folder import manifest_sum

    base, s, *_ = saved
    folder = tmp_path / "st"
    s.save(folder)
    man = json.loads((folder / "stream.json").read_text())
    man["n_fed"] += 3
    man["manifest_sha256"] = manifest_sum(man)
    (folder / "stream.json").write_text(json.dumps(man))
    with pytest.raises(StreamStateError, match="n_fed"):
        LMStream.load(folder, MODEL)


def test_a_manifest_naming_files_outside_the_folder_is_refused(saved, tmp_path):
    from svattn.lm.stream_folder import manifest_sum

    base, s, *_ = saved
    folder = tmp_path / "st"
    s.save(folder)
    victim = tmp_path / "victim.safetensors"
    victim.write_bytes(b"keep me")
    man = json.loads((folder / "stream.json").read_text())
    man["superseded"] = ["../victim.safetensors"]
    man["manifest_sha256"] = manifest_sum(man)
    (folder / "stream.json").write_text(json.dumps(man))
    with pytest.raises(StreamStateError, match="superseded"):
        LMStream.load(folder, MODEL)
    s.save(folder)
    assert victim.read_bytes() == b"keep me"


# ----------------------------------------------------------------- vocabulary

def test_a_byte_outside_the_vocabulary_is_refused_before_anything_changes():
    """Defect 12: feed of a byte >= vocab_size."""
    torch.manual_seed(0)
    model = CharLM(CharLMConfig(vocab_size=128, n_layer=1, n_embd=16, n_head=2,
                                block_size=64, mixer="hybrid_sv",
                                mixer_options={"chunk": 8, "C": 0.25, "policy": "full"}))
    s = model.stream()
    s.feed(b"abc")
    digest, logits = s.digest(), s.all_logits().clone()
    for bad in ("é".encode(), b"ok\x80", bytes([127, 255])):
        with pytest.raises(ValueError, match=r"outside this model's vocabulary of 128"):
            s.feed(bad)
        assert s.digest() == digest and torch.equal(s.all_logits(), logits)
    s.feed(b"d")  # still usable
    assert s.text == b"abcd"


def test_a_first_format_folder_is_refused_and_its_files_go_at_the_next_save(saved, tmp_path):
    base, s, *_ = saved
    folder = tmp_path / "st"
    folder.mkdir()
    old = {"arrays.0123456789ab.safetensors": SECRET * 3,
           "memory.1.0.0123456789ab.safetensors": SECRET * 2}
    for name, data in old.items():
        (folder / name).write_bytes(data)
    (folder / "memory.mine.safetensors").write_bytes(SECRET)  # a user's: stays
    (folder / "stream.json").write_text(json.dumps({
        "format": "svattn.LMStream", "version": 1,
        "arrays": {"file": "arrays.0123456789ab.safetensors", "sha256": "0" * 64},
        "layers": [{"memories": []}, {"memories": [
            {"file": "memory.1.0.0123456789ab.safetensors", "sha256": "0" * 64}]}]}))
    with pytest.raises(StreamStateError, match="earlier svattn"):
        LMStream.load(folder, MODEL)
    s.save(folder)
    assert not [n for n in old if (folder / n).exists()]
    assert (folder / "memory.mine.safetensors").read_bytes() == SECRET
    assert LMStream.load(folder, MODEL).digest() == s.digest()


def test_a_killed_first_save_is_refused_clearly_and_cleaned(saved, tmp_path):
    """Killed while writing into an empty folder: nothing to load, said so; the files it
    wrote (the stream's bytes) are removed by that load."""
    _, s, *_ = saved
    folder = tmp_path / "st"
    _killed_save(s, folder, 12)  # inside the memories' files
    assert len(list(folder.iterdir())) > 2
    with pytest.raises(StreamStateError, match="first save into this folder was interrupted"):
        LMStream.load(folder, MODEL)
    assert sorted(p.name for p in folder.iterdir()) == ["stream.json", "stream.lock"]
    s.save(folder)
    assert LMStream.load(folder, MODEL).digest() == s.digest()
