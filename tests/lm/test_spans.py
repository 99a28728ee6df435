"""Forgetting addressed as the caller sees the stream: positions in ``s.text`` now (held
positions), an exact byte string in it (``forget_text``), and what each forget hands
back (``svattn.lm.spans``): the removed bytes, its spans, its receipts.

The reference is a fresh stream fed the text without the bytes asked for; every
receipt must verify (``verify_forget``).
"""

from __future__ import annotations

import pickle

import pytest
import torch

from svattn.lm import CharLM, CharLMConfig
from svattn.lm.forget import verify_forget
from svattn.lm.spans import choose, fed_runs, occurrences

TOL = 1e-9
RECORD = b"Patient Jane Doe, 54, tested HIV positive on 2021-03-02; next visit May. "


@pytest.fixture(scope="module")
def model() -> CharLM:
    torch.manual_seed(0)
    cfg = CharLMConfig(n_layer=2, n_embd=16, n_head=2, block_size=256, mixer="hybrid_sv",
                       mixer_options={"chunk": 8, "C": 0.25, "policy": "full", "lookback": 3},
                       rope=True)
    m = CharLM(cfg)
    with torch.no_grad():  # layers that matter (as tests/lm/test_stream.py)
        for block in m.blocks:
            block.mix.gate.fill_(0.5)
            block.mix.qkv.weight.mul_(10.0)
    return m


def fresh(model: CharLM, text: bytes):
    s = model.stream()
    s.feed(text)
    return s


def assert_is_fresh_stream_of(s, model: CharLM, text: bytes) -> None:
    f = fresh(model, text)
    assert s.text == text and s.content_digest() == f.content_digest()
    assert (s.all_logits() - f.all_logits()).abs().max() <= TOL


def test_two_successive_forgets_located_in_the_held_text_remove_exactly_those_bytes(model):
    s = fresh(model, RECORD)
    for needle in (b"Jane Doe", b"HIV positive"):  # the second located after the first
        a = s.text.find(needle)
        before = s.text
        r = s.forget(a, a + len(needle))
        assert r.removed == needle and s.text == before[:a] + before[a + len(needle):]
        assert r.spans[0].held_span == (a, a + len(needle)) == tuple(r.receipt.held_span)
        v = verify_forget(s, r.receipt)  # unsigned: only the log's authenticity unchecked
        assert v.ok and not v.verdict.unchecked, v.summary()
    want = RECORD.replace(b"Jane Doe", b"").replace(b"HIV positive", b"")
    assert_is_fresh_stream_of(s, model, want)
    # the fed span of the second forget is where it was fed, not where it is held
    assert s.forgotten == [(8, 16), (29, 41)]


def test_two_forget_texts_remove_exactly_those_bytes_and_verify(model):
    s = fresh(model, RECORD)
    first = s.forget_text(b"Jane Doe")
    second = s.forget_text("HIV positive")  # a str is its UTF-8 bytes
    assert (first.removed, second.removed) == (b"Jane Doe", b"HIV positive")
    assert second.describe().splitlines()[0] == ("forgot held [21, 33) (fed [29, 41)): "
                                                 "b'HIV positive'")
    assert second.spans[0].fed_span == (29, 41) and second.spans[0].held_span == (21, 33)
    assert_is_fresh_stream_of(s, model, RECORD.replace(b"Jane Doe", b"").replace(
        b"HIV positive", b""))
    for r in (first, second):  # the first is checked later, through the forget log
        assert verify_forget(s, r.receipt).ok
    import hashlib

    assert second.text_sha256 == hashlib.sha256(s.text).hexdigest()


def test_a_span_across_an_earlier_forget_is_removed_as_two_runs_each_with_a_receipt(model):
    s = fresh(model, RECORD)
    s.forget_text(b", 54,")  # "Doe tested": held contiguous, fed in two runs
    a = s.text.find(b"Doe tested")
    r = s.forget(a, a + len(b"Doe tested"))
    assert r.removed == b"Doe tested"
    assert [p.removed for p in r.spans] == [b"Doe", b" tested"]
    assert [p.fed_span for p in r.spans] == [(13, 16), (21, 28)]
    assert [p.held_span for p in r.spans] == [(13, 16), (16, 23)]
    with pytest.raises(ValueError, match="2 runs"):
        _ = r.receipt
    assert_is_fresh_stream_of(s, model, RECORD.replace(b"Doe, 54, tested", b""))
    for receipt in r.receipts:
        assert verify_forget(s, receipt).ok, verify_forget(s, receipt).summary()


def test_forget_text_picks_the_nth_or_every_occurrence(model):
    text = b"ann met bob; bob met cy; cy met bob. "
    s = fresh(model, text)
    r = s.forget_text(b"bob", occurrence=1)
    assert r.spans[0].held_span == (13, 16) and s.text == text[:13] + text[16:]
    r = s.forget_text(b"met", occurrence="all")
    assert [p.held_span for p in r.spans] == [(4, 7), (14, 17), (25, 28)]
    assert r.removed == b"metmetmet" and len(r.receipts) == 3
    want = b"ann  bob;   cy; cy  bob. "
    assert s.text == (text[:13] + text[16:]).replace(b"met", b"") == want
    assert_is_fresh_stream_of(s, model, want)
    assert all(verify_forget(s, x).ok for x in r.receipts)


@pytest.mark.parametrize("needle, occurrence, words", [
    (b"bob", None, r"occurs 3 times in the held text \(at offsets 8, 13, 32\): ambiguous"),
    (b"zed", None, "does not occur in the stream's held text"),
    (b"bob", 3, r"occurrence 3: b'bob' occurs 3 times .* counted from 0"),
    (b"", None, "needle is empty"),
    (b"bob", -1, "occurrence must be None, 'all' or an int >= 0"),
    (b"bob", "every", "occurrence must be"),
    (7, None, "needle must be bytes or a str"),
])
def test_forget_text_refuses_absent_ambiguous_or_bad_requests_and_changes_nothing(
        model, needle, occurrence, words):
    s = fresh(model, b"ann met bob; bob met cy; cy met bob. ")
    before = (s.digest(), s.all_logits().clone(), pickle.dumps(s.layers[1].mems[0].ids))
    with pytest.raises(ValueError, match=words):
        s.forget_text(needle, occurrence=occurrence)
    assert (s.digest(), pickle.dumps(s.layers[1].mems[0].ids)) == (before[0], before[2])
    assert torch.equal(s.all_logits(), before[1]) and s.forget_log == []


def test_neither_the_receipt_nor_the_saved_folder_holds_the_removed_bytes(model, tmp_path):
    secret = b"\xc9\xca\xcb\xcc\xcd\xce"  # bytes found nowhere else in the text
    s = fresh(model, RECORD[:30] + secret + RECORD[30:])
    r = s.forget_text(secret)
    assert r.removed == secret  # handed to the caller ...
    s.save(tmp_path / "st")
    saved = b"".join(p.read_bytes() for p in (tmp_path / "st").iterdir())
    for blob in (r.receipt.to_json().encode(), saved):  # ... and kept nowhere else
        assert secret not in blob and secret[:3] not in blob and secret[3:] not in blob


def test_fed_runs_and_occurrences_are_what_they_say():
    origin = [0, 1, 2, 6, 7, 9]
    assert fed_runs(origin, 0, 6) == [((0, 3), (0, 3)), ((3, 5), (6, 8)), ((5, 6), (9, 10))]
    assert fed_runs(origin, 1, 2) == [((1, 2), (1, 2))]
    assert occurrences(b"aaaa", b"aa") == [0, 2]  # not overlapping, as bytes.count
    assert choose(b"aaaa", b"aa", "all") == [0, 2]
    assert choose(b"xaay", b"aa", None) == [1]
