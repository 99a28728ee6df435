"""C2SP signed notes: Go's published example verifies here, notes signed here open, and
malformed, mis-signed or foreign notes are refused with their verdict."""

from __future__ import annotations

import base64

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from svattn.exact.records.note import (
    NoteSigner,
    NoteVerifier,
    TlogError,
    Verdict,
    add_signatures,
    key_id,
    open_note,
    parse_note,
    sign_note,
)

# golang.org/x/mod/sumdb/note's package documentation: a key pair and a note it signs
GO_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
GO_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
GO_TEXT = ("If you think cryptography is the answer to your problem,\n"
           "then you don't know what your problem is.\n")
GO_NOTE = GO_TEXT + "\n— PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKvqfqdngotpRZb6KE6RyyBwJnAM=\n"  # noqa: E501


def _go_signer():
    seed = base64.b64decode(GO_SKEY.split("+", 4)[-1])[1:]
    return NoteSigner("PeterNeumann", Ed25519PrivateKey.from_private_bytes(seed))


def test_go_published_example_opens_and_signs_byte_for_byte():
    v = NoteVerifier.from_string(GO_VKEY)
    assert v.key_id == 0xC74F20A3 and v.to_string() == GO_VKEY
    opened = open_note(GO_NOTE, [v])
    assert opened.text == GO_TEXT and [s.name for s in opened.verified] == ["PeterNeumann"]
    signer = _go_signer()
    assert signer.verifier() == v
    assert sign_note(GO_TEXT, [signer]) == GO_NOTE  # Ed25519 is deterministic


def test_a_verifier_key_whose_base64_holds_a_plus_parses():
    for _ in range(64):  # about 1 key in 2 has a "+" in its base64
        v = NoteSigner("n", Ed25519PrivateKey.generate()).verifier()
        assert NoteVerifier.from_string(v.to_string()) == v
        if "+" in v.to_string().split("+", 2)[2]:
            return
    raise AssertionError("no key with a plus in its base64 drawn")


def test_key_id_covers_name_type_and_key():
    raw = NoteVerifier.from_string(GO_VKEY).public_key
    assert key_id("PeterNeumann", raw) == 0xC74F20A3
    assert key_id("PeterNeumann2", raw) != 0xC74F20A3


def test_witness_cosignatures_are_ignored_unless_held():
    log, witness = _go_signer(), NoteSigner("witness.example/w1",
                                            Ed25519PrivateKey.generate())
    both = add_signatures(GO_NOTE, [witness])
    opened = open_note(both, [log.verifier()])
    assert [s.name for s in opened.unverified] == ["witness.example/w1"]
    opened = open_note(both, [log.verifier(), witness.verifier()])
    assert len(opened.verified) == 2


def test_a_note_signed_by_an_unknown_key_only_is_refused():
    other = NoteSigner("PeterNeumann", Ed25519PrivateKey.generate())  # same name, other key
    with pytest.raises(TlogError) as e:
        open_note(sign_note(GO_TEXT, [other]), [NoteVerifier.from_string(GO_VKEY)])
    assert e.value.verdict is Verdict.UNKNOWN_KEY


def test_a_held_key_whose_signature_fails_refuses_the_note():
    edited = GO_NOTE.replace("cryptography", "cryptographY")
    with pytest.raises(TlogError) as e:
        open_note(edited, [NoteVerifier.from_string(GO_VKEY)])
    assert e.value.verdict is Verdict.BAD_SIGNATURE


@pytest.mark.parametrize("msg", [
    GO_TEXT,  # no signatures
    GO_NOTE[:-1],  # no final newline
    GO_NOTE.replace("\n\n", "\n"),  # no blank line
    GO_NOTE.replace("— ", "-- "),  # not an em dash
    GO_NOTE.replace("— PeterNeumann ", "— Peter Neumann "),  # a space in the name
    GO_NOTE.replace("JnAM=", "JnAM"),  # base64 without padding
    GO_NOTE.replace("x08go/", "x08go\t"),  # a control character
    GO_NOTE + "garbage\n",  # a line after the signatures
    "junk" + GO_NOTE.replace("If you", "\x00If you"),
    GO_TEXT + "\n— PeterNeumann AAAA\n",  # 3 bytes: no room for a signature
    GO_TEXT + "\n" + "— a AAAAAAAA\n" * 101,  # too many signatures
], ids=["unsigned", "no-final-newline", "no-blank-line", "no-em-dash", "space-in-name",
        "unpadded-base64", "control-char", "trailing-garbage", "nul", "short-signature",
        "101-signatures"])
def test_malformed_notes_are_refused(msg):
    with pytest.raises(TlogError) as e:
        open_note(msg, [NoteVerifier.from_string(GO_VKEY)])
    assert e.value.verdict is Verdict.MALFORMED


def test_invalid_utf8_is_malformed():
    with pytest.raises(TlogError) as e:
        parse_note(GO_NOTE.encode() .replace(b"If", b"\xffIf"))
    assert e.value.verdict is Verdict.MALFORMED


@pytest.mark.parametrize("vkey", [
    GO_VKEY.replace("c74f20a3", "c74f20a4"),  # wrong id
    GO_VKEY.replace("c74f20a3", "C74F20A3"),  # not lowercase
    GO_VKEY.replace("+ARpc", "+Apc"),  # a key not 33 bytes
    GO_VKEY.replace("PeterNeumann", "Peter Neumann"),
    GO_VKEY + "+x",  # a plus in the key part: not base64
    "PeterNeumann+c74f20a3",
], ids=["wrong-id", "uppercase-id", "short-key", "space-in-name", "plus-in-key", "two-parts"])
def test_malformed_verifier_keys_are_refused(vkey):
    with pytest.raises(TlogError) as e:
        NoteVerifier.from_string(vkey)
    assert e.value.verdict is Verdict.MALFORMED


def test_signing_refuses_what_could_not_be_parsed_back():
    with pytest.raises(ValueError):
        sign_note("no newline", [_go_signer()])
    with pytest.raises(ValueError):
        NoteSigner("has+plus", Ed25519PrivateKey.generate())
