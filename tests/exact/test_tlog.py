"""Checkpoints and .tlog-proof files: written and parsed back exactly, verified, and every
altered one refused with its verdict."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from svattn.exact.records.merkle import EMPTY_ROOT
from svattn.exact.records.note import NoteSigner, TlogError, Verdict, add_signatures
from svattn.exact.records.tlog import (
    Checkpoint,
    consistency_proof_text,
    open_checkpoint,
    parse_consistency_proof,
    parse_proof,
    proof_text,
    verify_consistency_between,
    verify_proof,
)
from tlog_helpers import sample_log

ORIGIN = "svattn.audit/test"


@pytest.fixture(scope="module")
def signer():
    return NoteSigner(ORIGIN, Ed25519PrivateKey.generate())


def _verdict(fn, *args, **kw):
    with pytest.raises(TlogError) as e:
        fn(*args, **kw)
    return e.value.verdict


def test_checkpoint_body_is_the_c2sp_format_and_parses_back():
    cp = Checkpoint("example.com/behind-the-sofa", 20852163,
                    bytes.fromhex("0ac5186a91863e8e1d90c808014aa89bf5da8e3ee1d9f07630f0378f68f1ab62"))
    assert cp.body() == ("example.com/behind-the-sofa\n20852163\n"
                         "CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n")  # the spec's example
    assert Checkpoint.parse(cp.body()) == cp
    assert Checkpoint.parse("o\n0\n" + "47DEQpj8HBSa+/TImW+5JCeuQeRkm5NMpJWZG3hSuFU=\n").root \
        == EMPTY_ROOT


@pytest.mark.parametrize("body", [
    "o\n01\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n",  # leading zero
    "o\n-1\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n",
    "o\n1\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I\n",  # no padding
    "o\n1\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=",  # no final newline
    "o\n1\nAAAA\n",  # not 32 bytes
    "\n1\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n",  # empty origin
    "o\n1\nCsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I=\n\n",  # an empty extension line
    "o\n1\n",
], ids=["leading-zero", "negative", "unpadded", "no-newline", "short-root", "empty-origin",
        "empty-extension", "two-lines"])
def test_malformed_checkpoints_are_refused(body):
    assert _verdict(Checkpoint.parse, body) is Verdict.MALFORMED


def test_a_proof_file_round_trips_and_verifies_for_every_index(signer):
    entries, tree, note = sample_log(11, signer)
    for i, e in enumerate(entries):
        text = proof_text(i, tree.inclusion_path(i), note, extra=b"receipt" if i % 2 else None)
        assert text.startswith("c2sp.org/tlog-proof@v1\n")
        parsed = parse_proof(text)
        assert (parsed.index, list(parsed.path), parsed.checkpoint) == \
            (i, tree.inclusion_path(i), note)
        assert verify_proof(text, e, [signer.verifier()], ORIGIN).size == 11


def test_proof_refusals_carry_their_verdict(signer):
    entries, tree, note = sample_log(6, signer)
    text = proof_text(2, tree.inclusion_path(2), note)
    v = [signer.verifier()]
    assert _verdict(verify_proof, text, entries[3], v) is Verdict.INCLUSION_FAILED
    assert _verdict(verify_proof, "x" + text, entries[2], v) is Verdict.MALFORMED
    assert _verdict(verify_proof, text + "x\n", entries[2], v) is Verdict.MALFORMED
    other = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    assert _verdict(verify_proof, text, entries[2], [other.verifier()]) is Verdict.UNKNOWN_KEY
    forged = proof_text(2, tree.inclusion_path(2),
                        note.replace("\n6\n", "\n7\n"))  # the size edited under the signature
    assert _verdict(verify_proof, forged, entries[2], v) is Verdict.BAD_SIGNATURE
    assert _verdict(verify_proof, text, entries[2], v, "svattn.audit/other") is Verdict.MALFORMED


def test_a_witness_cosigned_checkpoint_still_verifies(signer):
    entries, tree, note = sample_log(5, signer)
    witness = NoteSigner("witness.example/w", Ed25519PrivateKey.generate())
    cosigned = add_signatures(note, [witness])
    text = proof_text(4, tree.inclusion_path(4), cosigned)
    assert verify_proof(text, entries[4], [signer.verifier()]).size == 5
    cp, opened = open_checkpoint(cosigned, [signer.verifier(), witness.verifier()])
    assert len(opened.verified) == 2


def test_consistency_between_signed_checkpoints(signer):
    _, tree, new = sample_log(9, signer)
    old = Checkpoint(ORIGIN, 4, tree.root(4)).sign([signer])
    proof = parse_consistency_proof(consistency_proof_text(tree.consistency_proof(4)))
    cp_old, cp_new = verify_consistency_between(old, new, proof, [signer.verifier()])
    assert (cp_old.size, cp_new.size) == (4, 9)
    forked = Checkpoint(ORIGIN, 4, tree.root(3)).sign([signer])  # a signed head of another history
    assert _verdict(verify_consistency_between, forked, new, proof, [signer.verifier()]) \
        is Verdict.CONSISTENCY_FAILED
    assert _verdict(verify_consistency_between, new, old, [], [signer.verifier()]) \
        is Verdict.CONSISTENCY_FAILED
    elsewhere = Checkpoint("svattn.audit/other", 4, tree.root(4)).sign([signer])
    assert _verdict(verify_consistency_between, elsewhere, new, proof, [signer.verifier()]) \
        is Verdict.MALFORMED
