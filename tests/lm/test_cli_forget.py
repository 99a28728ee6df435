"""The language model's forgetting on the command line: ``svattn forget`` on a saved
(deployed) stream folder, ``generate --forget-text``, and what ``verify-forget`` says
of the result (exit 0 verified, 3 unchecked, 1 failed, 2 malformed input).

Tiny hybrid checkpoints built here (seconds); every forget is checked by the auditor's
command, ``svattn verify-forget``.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from crash_helpers import Crash, CrashingOS, crashing, residue
from svattn.cli import main
from svattn.exact.records import fileformat
from svattn.lm import CharLM, CharLMConfig, stream_folder
from svattn.lm.stream import LMStream

PROMPT = "Patient Jane Doe, 54, tested HIV positive; Jane Doe's next visit: May."


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, CharLM]:
    from svattn.lm.train import TrainConfig

    tmp = tmp_path_factory.mktemp("cli_forget")
    torch.manual_seed(0)
    cfg = CharLMConfig(n_layer=1, n_embd=16, n_head=2, block_size=128, mixer="hybrid_sv",
                       mixer_options={"chunk": 8, "C": 0.25, "policy": "full"})
    model = CharLM(cfg)
    torch.save({"config": TrainConfig().to_dict(), "model_config": cfg.to_dict(),
                "model": model.state_dict(), "step": 0}, tmp / "ckpt.pt")
    assert main(["keygen", str(tmp / "ctl")]) == 0
    return tmp / "ckpt.pt", model


def deployed(ckpt, tmp_path: Path, *, signed: bool) -> Path:
    """A stream folder saved by generate after a first forget (signed or not)."""
    path, _ = ckpt
    argv = ["generate", str(path), "--prompt", PROMPT, "-n", "4", "--forget-text", "54",
            "--save", str(tmp_path / "st"), "--receipt", str(tmp_path / "r0.json")]
    if signed:
        argv += ["--signing-key", str(path.parent / "ctl.key")]
    assert main(argv) == 0
    return tmp_path / "st"


def test_a_signed_forget_on_a_saved_stream_verifies_with_exit_0(ckpt, tmp_path, capsys):
    path, model = ckpt
    st = deployed(ckpt, tmp_path, signed=True)
    capsys.readouterr()
    key, pub = str(path.parent / "ctl.key"), str(path.parent / "ctl.pub")
    assert main(["forget", str(path), str(st), "--text", "HIV positive", "--receipt",
                 str(tmp_path / "r1.json"), "--signing-key", key]) == 0
    out = capsys.readouterr().out
    held = LMStream.load(st, model).text
    assert "'HIV positive'" in out and "(signed)" in out and "fed [29, 41)" in out
    import hashlib

    assert f"remaining text SHA-256: {hashlib.sha256(held).hexdigest()}" in out
    # a second forget located in the held text: the bytes asked for, and only them
    a = held.find(b"Jane Doe's")
    assert main(["forget", str(path), str(st), "--span", f"{a}:{a + 10}", "--receipt",
                 str(tmp_path / "r2.json"), "--signing-key", key]) == 0
    assert "\"Jane Doe's\"" in capsys.readouterr().out
    want = PROMPT.encode().replace(b"54", b"").replace(b"HIV positive", b"").replace(
        b"Jane Doe's", b"")
    assert LMStream.load(st, model).text == want
    assert main(["verify-forget", str(path), str(st), str(tmp_path / "r2.json"),
                 "--public-key", pub]) == 0
    assert "VERIFIED" in capsys.readouterr().out
    # the earlier receipt is checked later, through the forget log: nothing fails
    assert main(["verify-forget", str(path), str(st), str(tmp_path / "r1.json"),
                 "--public-key", pub]) in (0, 3)


def test_forget_refuses_bad_requests_and_leaves_the_folder_unchanged(ckpt, tmp_path, capsys):
    path, _ = ckpt
    st = deployed(ckpt, tmp_path, signed=True)
    key = str(path.parent / "ctl.key")
    manifest = (st / "stream.json").read_bytes()
    (tmp_path / "kept.json").write_text("evidence")
    for extra, words in [
        (["--text", "Jane Doe", "--signing-key", key], "occurs 2 times .* ambiguous"),
        (["--text", "Bob", "--signing-key", key], "does not occur"),
        (["--text", "HIV"], "signs its receipts .* --signing-key"),
        (["--span", "0:999", "--signing-key", key], "reaches past"),
        (["--span", "2:5", "--occurrence", "1", "--signing-key", key], "--occurrence"),
    ]:
        assert main(["forget", str(path), str(st), "--receipt", str(tmp_path / "r.json"),
                     *extra]) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and re.search(words, err), err
        assert (st / "stream.json").read_bytes() == manifest
        assert not (tmp_path / "r.json").exists()
    # an existing receipt is evidence: refused untold, replaced with --force
    argv = ["forget", str(path), str(st), "--text", "HIV", "--receipt",
            str(tmp_path / "kept.json"), "--signing-key", key]
    assert main(argv) == 2 and "--force" in capsys.readouterr().err
    assert (tmp_path / "kept.json").read_text() == "evidence"
    assert (st / "stream.json").read_bytes() == manifest
    assert main([*argv, "--force"]) == 0
    assert json.loads((tmp_path / "kept.json").read_text())["n_forgotten"] == 3


def test_every_occurrence_gets_its_own_numbered_receipt(ckpt, tmp_path, capsys):
    path, model = ckpt
    st = deployed(ckpt, tmp_path, signed=False)
    assert main(["forget", str(path), str(st), "--text", "Jane Doe", "--occurrence", "all",
                 "--receipt", str(tmp_path / "r.json")]) == 0
    assert LMStream.load(st, model).text.count(b"Jane Doe") == 0
    for i in (1, 2):
        assert main(["verify-forget", str(path), str(st), str(tmp_path / f"r.{i}.json")]) in (
            0, 3)  # unsigned: the signature is what stays unchecked
        assert "FAILED" not in capsys.readouterr().out


def test_a_span_that_cuts_a_utf8_character_is_refused(ckpt, tmp_path, capsys):
    path, _ = ckpt
    argv = ["generate", str(path), "--prompt", "Müller 55-1234", "-n", "1", "--forget", "2:4"]
    assert main(argv) == 2 and "cuts the UTF-8 character at byte 2" in capsys.readouterr().err
    assert main([*argv[:-2], "--forget-text", " 55-1234"]) == 0
    out = capsys.readouterr().out
    assert "forgot held bytes [7, 15) (fed [7, 15)): ' 55-1234'" in out


def test_generate_forgets_only_what_was_asked_each_with_its_receipt(ckpt, tmp_path, capsys):
    path, model = ckpt
    st = deployed(ckpt, tmp_path, signed=False)
    s = LMStream.load(st, model)
    # one forget, one receipt: the sampled bytes are not forgotten behind the user's back
    assert len(s.forget_log) == 1 and s.forgotten == [(18, 20)]
    assert s.text == PROMPT.encode().replace(b"54", b"")


def test_generate_refuses_to_replace_a_receipt_or_a_saved_stream_untold(ckpt, tmp_path, capsys):
    path, _ = ckpt
    st = deployed(ckpt, tmp_path, signed=False)
    manifest, receipt = (st / "stream.json").read_bytes(), (tmp_path / "r0.json").read_bytes()
    base = ["generate", str(path), "--prompt", PROMPT, "-n", "2", "--forget", "0:3"]
    for extra, words in [(["--receipt", str(tmp_path / "r0.json")], "r0.json exists"),
                         (["--save", str(st)], "holds a saved stream")]:
        assert main([*base, *extra]) == 2
        assert words in capsys.readouterr().err
    assert (st / "stream.json").read_bytes() == manifest
    assert (tmp_path / "r0.json").read_bytes() == receipt
    assert main([*base, "--save", str(st), "--receipt", str(tmp_path / "r0.json"),
                 "--force"]) == 0


def test_verify_forget_an_edited_manifest_fails_and_an_unreadable_one_is_malformed(
        ckpt, tmp_path, capsys):
    path, _ = ckpt
    st = deployed(ckpt, tmp_path, signed=False)
    argv = ["verify-forget", str(path), str(st), str(tmp_path / "r0.json")]
    man = (st / "stream.json").read_text()
    (st / "stream.json").write_text(man.replace('"n_fed": 70', '"n_fed": 71'))
    assert '"n_fed": 70' in man
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "checksum differs" in out and "FAILED" in out
    (st / "stream.json").write_text(man[: len(man) // 2])  # not JSON: no manifest at all
    assert main(argv) == 2
    assert "not a stream manifest" in capsys.readouterr().err


def test_verify_forget_help_lists_the_exit_codes(capsys):
    with pytest.raises(SystemExit):
        main(["verify-forget", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for words in ("0 every field of the receipt checked and verified", "3 nothing failed",
                  "1 a check failed", "2 malformed input"):
        assert words in out


def test_an_unchecked_verdict_does_not_call_the_checked_equality_unchecked(ckpt):
    from svattn.lm.forget import verify_forget

    _, model = ckpt
    s = model.stream()
    s.feed(PROMPT.encode())
    receipt = s.forget_text("HIV positive").receipt
    s.feed(b" more")  # checked later: what was fed since stays unchecked
    rep = verify_forget(s, receipt)
    first = rep.summary().splitlines()[0]
    assert rep.status == "UNCHECKED" and rep.ok
    assert not first.startswith("UNCHECKED: the stream equals")
    assert "equals a fresh stream" in first and "(checked)" in first


def test_a_save_into_a_read_only_folder_says_so(ckpt, tmp_path, monkeypatch):
    from svattn.lm import stream_folder

    _, model = ckpt
    s = model.stream()
    s.feed(b"abc")
    real = os.open

    def read_only(p, flags, *args):  # what a read-only mount answers (root writes anyway)
        if str(p).endswith("stream.lock") and flags & (os.O_RDWR | os.O_CREAT):
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(p))
        return real(p, flags, *args)

    monkeypatch.setattr(stream_folder.os, "open", read_only)
    with pytest.raises(PermissionError, match="must be writable") as info:
        s.save(tmp_path / "st")
    assert "symlink" not in str(info.value) and "Read-only file system" in str(info.value)


@pytest.mark.parametrize("argv", [
    ["verify-forget", "nope.pt", "st", "r.json"],
    ["forget", "nope.pt", "st", "--text", "x", "--receipt", "r.json"],
])
def test_missing_paths_are_refused_before_the_heavy_imports(argv, tmp_path):
    import subprocess
    import sys

    code = ("import sys; from svattn.cli import main; rc = main(sys.argv[1:]); "
            "print(rc, 'torch' in sys.modules)")
    res = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                         cwd=tmp_path, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             sys.path)}, timeout=120)
    assert res.stdout.split() == ["2", "False"], (res.stdout, res.stderr)
    assert "CHECKPOINT: no such file" in res.stderr


def _span_rows(stream: LMStream, a: int, b: int) -> list[bytes]:
    """float64 bytes of every key, value, hidden state and logit of held positions
    [a, b) of ``stream`` (what its saved folder holds of them)."""
    rows = []
    for st in stream.layers:
        for name in ("k", "v", "kr"):
            cache = getattr(st, name)
            if cache is not None:
                for hd in range(cache.view().shape[1]):
                    rows += [cache.view()[p, hd].numpy().tobytes() for p in range(a, b)]
    return rows + [stream.all_logits()[p].numpy().tobytes() for p in range(a, b)]


@pytest.mark.parametrize("crash", [None, "dropped",
                                   pytest.param("written", marks=pytest.mark.slow)])
def test_forget_on_the_command_line_leaves_no_forgotten_byte_in_the_folder(
        ckpt, tmp_path, monkeypatch, capsys, crash):
    """``svattn forget`` as the user runs it, then a raw scan of every file of the stream
    folder: nothing of the span (its text, keys, values, hidden states, logits). With
    ``crash`` the process dies at the rename that commits the new manifest (before it,
    or just after): no receipt is filed, the folder loads to the stream before or after
    the forget, and once loaded (or forgotten again) it holds nothing of the span."""
    path, model = ckpt
    st = deployed(ckpt, tmp_path, signed=False)
    held = LMStream.load(st, model)
    a = held.text.find(b"HIV positive")
    # a row that a kept position holds too (a value of the first layer is its byte's
    # alone, and the span's letters occur elsewhere) is not the span's
    kept = set(_span_rows(held, 0, a)) | set(_span_rows(held, a + 12, len(held)))
    rows = [r for r in _span_rows(held, a, a + 12) if r not in kept]
    assert len(rows) > 12
    needles = [b"HIV positive", b"HIV pos", b"positive;"] + rows
    assert residue(st, needles), "the scan must see the span while it is held"
    argv = ["forget", str(path), str(st), "--text", "HIV positive", "--receipt",
            str(tmp_path / "r.json")]
    if crash is None:
        assert main(argv) == 0
    else:  # the new manifest's rename: the last rename of the save
        count, probe = CrashingOS(), tmp_path / "probe"  # the same save, on a copy
        shutil.copytree(st, probe)
        same = LMStream.load(probe, model)
        same.forget_text(b"HIV positive")
        with crashing(monkeypatch, count, (fileformat, stream_folder)):
            same.save(probe)
        n = len(count.trace) - count.trace[::-1].index("replace")
        with crashing(monkeypatch, CrashingOS(n, crash), (fileformat, stream_folder)), \
                pytest.raises(Crash):
            main(argv)
        assert not (tmp_path / "r.json").exists()  # never filed for an unsaved state
        again = LMStream.load(st, model)
        assert (b"HIV positive" in again.text) == (crash == "dropped")
        if crash == "dropped":
            assert main(argv) == 0
    capsys.readouterr()
    assert residue(st, needles) == {}
    assert b"HIV positive" not in LMStream.load(st, model).text
