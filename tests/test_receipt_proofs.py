"""Every receipt type's log entry exported as a ``c2sp.org/tlog-proof@v1`` file (``svattn
audit prove ... --receipt``) and verified by svattn (``svattn audit check-proof``) and by
Go's golang.org/x/mod/sumdb (``tests/exact/tlogcheck``), which shares no code with it:
the deletion certificate and the erasure receipt (the memory's audit log), the
estimator's forget receipt (by ids and by subject: its model's audit log) and the
language model's erasure receipt (its stream's forget log)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from svattn import SVDD
from svattn.cli import main
from svattn.exact import SVDDMemory
from svattn.exact.records.signing import write_keypair
from svattn.lm import CharLM, CharLMConfig
from svattn.lm.stream import LMStream


def _stream_model() -> CharLM:
    torch.manual_seed(0)
    cfg = CharLMConfig(vocab_size=128, n_layer=1, n_embd=16, n_head=2, block_size=64,
                       mixer="hybrid_sv", mixer_options={"chunk": 8, "C": 0.25,
                                                         "policy": "full"})
    return CharLM(cfg).eval()


@pytest.fixture(scope="module")
def receipts(tmp_path_factory):
    """Under one controller key: a memory's certificate and erasure receipt, an
    estimator's forget receipts (ids, subject) and a stream's model erasure receipt,
    each beside the log that records it."""
    d = tmp_path_factory.mktemp("proofs")
    key, _ = write_keypair(d / "ctl")
    rng = np.random.default_rng(3)
    out = {"vkey": Path(f"{d / 'ctl'}.vkey"), "dir": d}
    # the exact memory
    mem = SVDDMemory(0.2, audit_log=d / "mem.jsonl", signing_key=key)
    ids = mem.extend(rng.normal(size=(24, 3)), tags=["ann"] * 4 + [None] * 20)
    (d / "erasure.json").write_text(mem.erase("ann").to_json())
    (d / "cert.json").write_text(mem.remove(ids[10]).to_json())
    mem.close_audit_log()
    out["cert.json"] = out["erasure.json"] = d / "mem.jsonl"
    # the estimator
    model = SVDD(nu=0.3, signing_key=str(key), audit_log=d / "est.jsonl").fit(
        rng.normal(size=(40, 3)), subjects=[f"s{i % 8}" for i in range(40)])
    (d / "forget_ids.json").write_text(model.forget(ids=[1, 7, 9]).to_json())
    (d / "forget_subject.json").write_text(model.forget(subject="s3").to_json())
    model.memory_.close_audit_log()
    out["forget_ids.json"] = out["forget_subject.json"] = d / "est.jsonl"
    # the language model's stream
    s = _stream_model().stream(signing_key=key)
    s.feed(b"the patient Ann Lee, 54, was seen in May")
    (d / "model.json").write_text(s.forget_text(b"Ann Lee").receipts[0].to_json())
    s.feed(b"; later visits in June")
    s.forget_text(b"June")  # another entry after it
    s.save(d / "stream")
    out["model.json"] = d / "stream"
    return out


@pytest.mark.parametrize("receipt", ["cert.json", "erasure.json", "forget_ids.json",
                                     "forget_subject.json", "model.json"])
def test_every_receipt_types_tlog_proof_verifies_here_and_in_go(go_tlog, receipts, receipt,
                                                                tmp_path, capsys):
    log, vkey = receipts[receipt], receipts["vkey"]
    proof, entry = tmp_path / "r.tlog-proof", tmp_path / "entry"
    assert main(["audit", "prove", str(log), "--receipt", str(receipts["dir"] / receipt),
                 "-o", str(proof)]) == 0
    index = int(proof.read_text().split("index ", 1)[1].split("\n", 1)[0])
    capsys.readouterr()
    assert main(["audit", "entry", str(log), str(index)]) == 0
    entry.write_bytes(capsys.readouterr().out.encode())
    record = json.loads(entry.read_bytes())
    want = {"cert.json": "remove", "erasure.json": "erase", "forget_ids.json": "remove",
            "forget_subject.json": "erase"}.get(receipt)
    if want is None:  # the stream's forget log: the entry holding the receipt's body
        from svattn.lm.forget import ModelErasureReceipt

        body = ModelErasureReceipt.from_json((receipts["dir"] / receipt).read_text())
        assert record["receipt"] == body.body_sha256()
    else:
        assert record["op"] == want
    assert main(["audit", "check-proof", str(proof), str(entry), "--vkey", str(vkey)]) == 0
    ok, out = go_tlog.run("proof", vkey.read_text(), proof.read_bytes(), entry.read_bytes())
    assert ok, out
    # the proof of another entry: refused by both
    other = tmp_path / "other"
    assert main(["audit", "entry", str(log), str(index - 1 if index else 1)]) == 0
    other.write_bytes(capsys.readouterr().out.encode())
    assert main(["audit", "check-proof", str(proof), str(other), "--vkey", str(vkey)]) == 1
    assert not go_tlog.run("proof", vkey.read_text(), proof.read_bytes(),
                           other.read_bytes())[0]


def test_go_opens_the_streams_forget_log_checkpoint(go_tlog, receipts, capsys):
    """Under keygen's .vkey and under the forget log's own key (svattn audit vkey)."""
    from svattn.lm.stream_folder import read_manifest

    note = read_manifest(receipts["dir"] / "stream")["forget_checkpoint"]
    assert main(["audit", "vkey", str(receipts["dir"] / "stream"), "--public-key",
                 str(receipts["dir"] / "ctl.pub")]) == 0
    own = capsys.readouterr().out.strip()
    assert own.startswith(note.split("\n", 1)[0] + "+")  # key name = the log's origin
    for vkey in (receipts["vkey"].read_text(), own):
        ok, out = go_tlog.run("note", vkey, note)
        assert ok, out


def test_the_forget_receipt_proof_is_of_its_last_removal(receipts):
    """By ids, the proved entry records the receipt's last certificate, whose digest is
    the receipt's (its prev hash chains the earlier removals)."""
    from svattn.estimators import ForgetReceipt
    from svattn.exact.records.audit import verify_chain

    receipt = ForgetReceipt.from_json((receipts["dir"] / "forget_ids.json").read_text())
    recs = [r for r in verify_chain(receipts["forget_ids.json"]).records if r["op"] == "remove"]
    assert [r["certificate"]["removed_id"] for r in recs[:3]] == list(receipt.positions)
    assert recs[2]["digest"] == receipt.state_digest


def test_an_unsigned_streams_proof_is_refused_as_unsigned(tmp_path, capsys):
    s = _stream_model().stream()
    s.feed(b"a short text to forget a word of")
    (tmp_path / "r.json").write_text(s.forget_text(b"word").receipts[0].to_json())
    s.save(tmp_path / "st")
    assert main(["audit", "prove", str(tmp_path / "st"), "--receipt",
                 str(tmp_path / "r.json")]) == 2
    assert "unsigned" in capsys.readouterr().err
    assert LMStream.load(tmp_path / "st", _stream_model()).forget_checkpoint is not None
