"""svattn's checkpoints, signed notes, inclusion and consistency proofs verified by an
implementation sharing no code with svattn: Go's golang.org/x/mod/sumdb/note and
golang.org/x/mod/sumdb/tlog (the Go checksum database's own verifier, RFC 6962 hashing).
Skipped, naming what is missing, without the Go toolchain or the x/mod source."""

from __future__ import annotations

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from svattn.exact.records.note import NoteSigner, add_signatures
from svattn.exact.records.tlog import Checkpoint, consistency_proof_text, proof_text
from tlog_helpers import sample_log

ORIGIN = "svattn.audit/independent"


@pytest.fixture(scope="module")
def signer():
    return NoteSigner(ORIGIN, Ed25519PrivateKey.generate())


def test_go_opens_svattn_checkpoints_and_refuses_an_edited_one(go_tlog, signer):
    vkey = signer.verifier().to_string()
    _, _, note = sample_log(7, signer, ORIGIN)
    ok, out = go_tlog.run("note", vkey, note)
    assert ok, out
    witness = NoteSigner("witness.example/w", Ed25519PrivateKey.generate())
    ok, out = go_tlog.run("note", vkey, add_signatures(note, [witness]))
    assert ok and "1 other signatures ignored" in out, out
    ok, out = go_tlog.run("note", vkey, note.replace("\n7\n", "\n8\n"))
    assert not ok and "invalid signature" in out, out
    other = NoteSigner(ORIGIN, Ed25519PrivateKey.generate())
    ok, out = go_tlog.run("note", other.verifier().to_string(), note)
    assert not ok and "no verifiable signatures" in out, out


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 13, 21], ids=lambda n: f"n{n}")
def test_go_verifies_every_svattn_inclusion_proof(go_tlog, signer, n):
    vkey = signer.verifier().to_string()
    entries, tree, note = sample_log(n, signer, ORIGIN)
    for i, entry in enumerate(entries):
        ok, out = go_tlog.run("proof", vkey, proof_text(i, tree.inclusion_path(i), note), entry)
        assert ok, (i, out)
    wrong = entries[0] + b" "
    ok, out = go_tlog.run("proof", vkey, proof_text(0, tree.inclusion_path(0), note), wrong)
    assert not ok and "inclusion" in out, out


@pytest.mark.parametrize("n", [2, 3, 8, 13], ids=lambda n: f"n{n}")
def test_go_verifies_every_svattn_consistency_proof(go_tlog, signer, n):
    vkey = signer.verifier().to_string()
    _, tree, new = sample_log(n, signer, ORIGIN)
    for m in range(1, n + 1):
        old = Checkpoint(ORIGIN, m, tree.root(m)).sign([signer])
        ok, out = go_tlog.run("consistency", vkey, old, new,
                              consistency_proof_text(tree.consistency_proof(m)))
        assert ok, (m, out)
    forked = Checkpoint(ORIGIN, 1, tree.root(2)).sign([signer])
    ok, out = go_tlog.run("consistency", vkey, forked, new,
                          consistency_proof_text(tree.consistency_proof(1)))
    assert not ok and "consistency" in out, out
