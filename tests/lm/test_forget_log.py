"""A stream's forget log as a transparency log: its checkpoint against the log and the
controller's key, and what ``verify_forget`` says of each case (svattn.lm.forget_log)."""

from __future__ import annotations

import pytest
import torch

from svattn.exact.records.signing import generate_key
from svattn.lm import CharLM, CharLMConfig
from svattn.lm.forget import verify_forget
from svattn.lm.forget_log import check_checkpoint, checkpoint_of, origin_of, receipt_entry
from svattn.lm.stream import LMStream

TEXT = b"Patient Ann Lee, 54, seen in May; Ann Lee's next visit: June."


@pytest.fixture(scope="module")
def forgot():
    torch.manual_seed(0)
    cfg = CharLMConfig(vocab_size=128, n_layer=1, n_embd=16, n_head=2, block_size=96,
                       mixer="hybrid_sv", mixer_options={"chunk": 8, "C": 0.25,
                                                         "policy": "full"})
    model, key = CharLM(cfg).eval(), generate_key()
    s = model.stream(signing_key=key)
    s.feed(TEXT)
    first = s.forget_text(b"54").receipt
    second = s.forget_text(b"June").receipt
    return model, s, key, first, second


def test_the_checkpoint_is_the_logs_root_signed_by_the_streams_key(forgot):
    _, s, key, first, second = forgot
    assert [receipt_entry(s.forget_log, r) for r in (first, second)] == [0, 1]
    checked, failed, unchecked = check_checkpoint(s.forget_log, s.forget_checkpoint,
                                                  key.public_key())
    assert not failed and not unchecked and len(checked) == 2
    assert s.forget_checkpoint.startswith(origin_of(s.forget_log) + "\n2\n")
    assert verify_forget(s, second, public_key=key.public_key()).status == "VERIFIED"


def test_save_and_load_keep_the_signed_checkpoint(forgot, tmp_path):
    model, s, key, _, second = forgot
    s.save(tmp_path / "st")
    loaded = LMStream.load(tmp_path / "st", model)  # no key: the checkpoint stays signed
    assert loaded.forget_checkpoint == s.forget_checkpoint
    assert verify_forget(loaded, second, public_key=key.public_key()).status == "VERIFIED"


@pytest.mark.parametrize("case", ["no checkpoint", "unsigned", "no key"])
def test_what_cannot_be_checked_is_named_never_verified(forgot, case):
    _, s, key, _, second = forgot
    text = {"no checkpoint": None, "unsigned": checkpoint_of(s.forget_log),
            "no key": s.forget_checkpoint}[case]
    _, failed, unchecked = check_checkpoint(s.forget_log, text, None)
    assert not failed and len(unchecked) == 1
    old = s.forget_checkpoint
    try:
        s.forget_checkpoint = text
        v = verify_forget(s, second)
    finally:
        s.forget_checkpoint = old
    assert v.ok and v.status == "UNCHECKED" and v.verdict.authenticity_unchecked


@pytest.mark.parametrize("case", ["edited entry", "other key", "unsigned with a key",
                                  "a shorter checkpoint"])
def test_a_checkpoint_that_does_not_hold_fails(forgot, case):
    _, s, key, _, second = forgot
    log, text, public = [dict(e) for e in s.forget_log], s.forget_checkpoint, key.public_key()
    if case == "edited entry":
        log[0]["fed_span"] = [0, 1]
    elif case == "other key":
        public = generate_key().public_key()
    elif case == "unsigned with a key":
        text = checkpoint_of(log)
    else:
        text = checkpoint_of(log[:1], key)
    _, failed, _ = check_checkpoint(log, text, public)
    assert len(failed) == 1, case
    if case != "edited entry":  # (an edited entry fails the stream's own digest first)
        old = s.forget_checkpoint
        try:
            s.forget_checkpoint = text
            v = verify_forget(s, second, public_key=public)
        finally:
            s.forget_checkpoint = old
        assert v.status == "FAILED" and "the log's authenticity" in v.verdict.failed
