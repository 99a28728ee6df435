"""What ``verify_forget`` says of a stream forged to hold what its receipt says was
forgotten, or of a receipt shown with a stream that did not issue it: a later stream
holding the span again, a receipt of another stream signed by the same key, an edited
forget log entry with its sums recomputed, a forgotten key or value planted in a
reserve slot or a cached row, a NaN in a cached row. Never VERIFIED; the honest stream
still is. Comments say what each forgery got before it was caught; "(held)" marks the
ones refused from the start.
"""

from __future__ import annotations

import json
import shutil

import pytest

from stream_helpers import text_of, tiny_model
from svattn.lm.forget import verify_forget
from svattn.lm.stream import LMStream
from svattn.lm.stream_folder import write_manifest


def test_verify_forget_still_verifies_the_honest_stream(forgot):
    model, folder, receipt = forgot
    v = verify_forget(LMStream.load(folder, model), receipt)
    # every field checked; an unsigned stream's forget log: its authenticity unchecked
    assert v.ok and v.status == "UNCHECKED" and not v.verdict.unchecked, v.summary()
    assert "is unsigned" in v.verdict.authenticity_line()


# replay an honest receipt against a forged later state. The stream that forgot
# [10, 14) is rebuilt from the whole text (the forgotten bytes included) with the bytes
# after the span renumbered to fed positions 14..43, n_fed 44, [10, 14) listed as
# forgotten and the honest forget log copied; saved (digest and checksum recomputed)
# and loaded. Every load check holds (the positions and spans partition [0, n_fed)),
# and verify_forget, checking later, said VERIFIED (exit 0) over a stream that holds
# the very bytes the receipt says were forgotten. The forget log attests forgets, not
# feeds: checked later, the verdict now says that claim is unchecked (exit 3).
def test_a_forged_later_stream_holding_the_span_is_not_verified(forgot, tmp_path):
    model = forgot[0]
    text = text_of(40)
    real = model.stream()
    real.feed(text)
    receipt = real.forget(10, 14).receipt
    forged = model.stream()
    forged.feed(text)
    forged.n_fed = 44
    forged._origin = list(range(10)) + list(range(14, 44))
    forged.forgotten = [(10, 14)]
    forged.forget_log = [dict(e) for e in real.forget_log]
    forged.save(tmp_path / "forged")
    loaded = LMStream.load(tmp_path / "forged", model)
    assert text[10:14] in loaded.text  # the forgotten bytes are held
    assert verify_forget(loaded, receipt).status != "VERIFIED"


# (held) a signed receipt of one stream shown with another stream of the same
# model, text and span, signed by the same key: its body is not in that stream's log
def test_a_receipt_of_another_stream_with_the_same_key_fails(forgot):
    from svattn.exact.records.signing import generate_key

    model, key = forgot[0], generate_key()
    streams = []
    for _ in range(2):
        s = model.stream(signing_key=key)
        s.feed(text_of(40))
        streams.append((s, s.forget(10, 14).receipt))
    (a, ra), (b, rb) = streams
    assert verify_forget(a, ra, public_key=key.public_key()).status == "VERIFIED"
    assert verify_forget(b, ra, public_key=key.public_key()).status == "FAILED"


# (held) the forget log entry's span edited in stream.json, the chain, the
# digest and the checksum recomputed: the honest receipt fails against it
def test_an_edited_forget_log_entry_with_recomputed_sums_fails(forgot, tmp_path):
    from svattn.lm.forget import chained_digest, forget_entry_hash

    model, folder, receipt = forgot
    copy = tmp_path / "st"
    shutil.copytree(folder, copy)
    man = json.loads((copy / "stream.json").read_text())
    man["forget_log"][-1]["fed_span"] = [10, 13]
    man["digest"] = chained_digest(man["forget_log"][-1]["state"],
                                   forget_entry_hash(man["forget_log"][-1]))
    write_manifest(copy, man)
    loaded = LMStream.load(copy, model)
    assert verify_forget(loaded, receipt).status == "FAILED"


# after an honest forget, a reserve token (alpha 0) of each layer's first memory
# is overwritten with the key and value a span token had (taken from a stream of the
# whole text). Readouts, logits, the content digest and every count are unchanged, so
# verify_forget said VERIFIED over memories holding the forgotten span's key and value;
# it now compares every token's key and value with the fresh stream's
def _forgot_beside_whole():
    """A stream of a text with a distinctive span [10, 14) and the same text streamed
    with the span forgotten, with the forget's receipt: (whole, forgotten, receipt)."""
    model = tiny_model()
    text = text_of(10) + bytes(range(120, 124)) + text_of(26, seed=2)
    whole = model.stream()
    whole.feed(text)
    s = model.stream()
    s.feed(text)
    return whole, s, s.forget(10, 14).receipt


def test_a_memory_holding_a_forgotten_key_in_a_reserve_slot_fails():
    whole, s, receipt = _forgot_beside_whole()
    assert verify_forget(s, receipt).ok
    for li in range(2):
        src = whole.layers[li].mems[0].solver_state
        slot_of_span = src.id_to_slot[whole.layers[li].ids[0][11]]
        mem = s.layers[li].mems[0]
        ss = mem.solver_state
        slot = ss.id_to_slot[mem.partition()["reserve"][0]]
        ss.X[slot] = src.X[slot_of_span]
        ss.V[slot] = src.V[slot_of_span]
    v = verify_forget(s, receipt)
    assert v.status == "FAILED" and any("keys or values" in r for r in v.reasons), v.summary()


# after an honest forget, the cached key / value / rotated-key rows of position
# 0 (absorbed into the memories: out of every attention window) are overwritten with a
# span token's rows (layer 0's are a linear map of the forgotten byte's embedding). No
# logit moves, so verify_forget said VERIFIED while the caches (saved in the folder's
# arrays file) held the span; it now compares every cached row with the fresh stream's
@pytest.mark.parametrize("name", ["k", "v", "kr"])
def test_cached_rows_holding_a_forgotten_key_fail(name):
    whole, s, receipt = _forgot_beside_whole()
    for li in range(2):
        getattr(s.layers[li], name).buf[0] = getattr(whole.layers[li], name).buf[11]
    v = verify_forget(s, receipt)
    assert v.status == "FAILED" and any("keys or values" in r for r in v.reasons), v.summary()


# a NaN planted in a cached row of position 0: max() keeps the first of (0.0,
# NaN), so the deviation stayed 0 and passed "<= tol"
def test_a_nan_planted_in_a_cached_row_fails():
    model = tiny_model()
    s = model.stream()
    s.feed(text_of(40))
    receipt = s.forget(10, 14).receipt
    s.layers[1].k.buf[0, 0, 0] = float("nan")
    v = verify_forget(s, receipt)
    assert v.status == "FAILED", v.summary()
