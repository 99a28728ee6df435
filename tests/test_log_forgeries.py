"""The forgeries a hash-chained log let through, each tried on the command line against
every verifier it concerns: refused (exit 1) or named unchecked (exit 3), never exit 0.

1. One fabricated ``erase`` record appended to the audit log (no key needed) for a
   subject that never held the erased ids, with its fabricated erasure receipt.
2. A receipt and its log record edited together, the hash chain re-hashed and the
   Merkle tree's checkpoint recomputed (unsigned: the forger holds no key).
3. An unsigned model erasure receipt and a rewritten stream folder that holds the
   forgotten span again (the forget log's entry, its checkpoint and the receipt's
   digest recomputed to match).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from audit_forger import append_record, read_records, write_records
from svattn.cli import main
from svattn.exact import SVDDMemory
from svattn.exact.records.audit import canonical, record_hash, verify_chain
from svattn.exact.records.certificate import ErasureReceipt
from svattn.exact.records.openings import openings_path
from svattn.exact.records.signing import write_keypair
from svattn.exact.records.tlog import CheckpointWriter, checkpoint_path
from svattn.lm import CharLM, CharLMConfig
from svattn.lm.forget_log import checkpoint_of


@pytest.fixture(scope="module", params=["signed", "unsigned"])
def memory(request, tmp_path_factory):
    """A memory's log, state and receipts (signed with the controller's key, or not)."""
    d = tmp_path_factory.mktemp(f"forge_{request.param}")
    key, pub = write_keypair(d / "ctl")
    log, state = d / "audit.jsonl", d / "m.safetensors"
    mem = SVDDMemory(0.2, audit_log=log, signing_key=key if request.param == "signed" else None,
                     tag_key=None if request.param == "signed" else b"k" * 32)
    ids = mem.extend(np.random.default_rng(5).normal(size=(30, 3)),
                     tags=["alice"] * 5 + ["bob"] * 20 + [None] * 5)
    (d / "erasure.json").write_text(mem.erase("alice").to_json())
    (d / "cert.json").write_text(mem.remove(ids[27]).to_json())
    mem.save(state)
    mem.close_audit_log()
    return {"dir": d, "log": log, "state": state, "pub": pub, "ids": ids,
            "signed": request.param == "signed"}


def _copy(m: dict, tmp_path: Path) -> dict:
    out = dict(m)
    for name in ("log", "state"):
        out[name] = tmp_path / m[name].name
        shutil.copy(m[name], out[name])
    shutil.copy(checkpoint_path(m["log"]), checkpoint_path(out["log"]))
    if openings_path(m["log"]).exists():  # the subjects' sealed data, beside the log
        shutil.copy(openings_path(m["log"]), openings_path(out["log"]))
    return out


def _rehash(lines: list[str]) -> list[str]:
    """The records re-chained: every prev and sha256 recomputed (no key needed)."""
    out, prev = [], None
    for line in lines:
        rec = json.loads(line)
        if prev is not None:
            rec["prev"] = prev
        rec["sha256"] = record_hash(rec)
        out.append(canonical(rec))
        prev = hashlib.sha256(out[-1].encode()).hexdigest()
    return out


def _retree(log: Path, lines: list[str]) -> None:
    """Write ``lines`` as the log and its Merkle tree's checkpoint recomputed (unsigned)."""
    log.write_text("\n".join(lines) + "\n")
    writer = CheckpointWriter(log, None)
    for line in lines:
        writer.add(line.encode())
    writer.write()


def _keys(m: dict) -> list[list[str]]:
    return [[], ["--public-key", str(m["pub"])]]


def _never_0(argv: list[str], capsys, output: list | None = None) -> int:
    """Run the command; assert exit 1 or 3 and no VERIFIED verdict; return the status
    (and append the output to ``output``)."""
    status = main(argv)
    out = capsys.readouterr().out
    assert status in (1, 3), (status, out)
    assert "verdict:             VERIFIED" not in out and "verdict: VERIFIED" not in out
    if output is not None:
        output.append(out)
    return status


# ------------------------------------------------------------------ 1. an appended erase
def test_an_appended_fabricated_erase_is_never_exit_0(memory, tmp_path, capsys):
    f = _copy(memory, tmp_path)
    lines = f["log"].read_text().splitlines()
    last = json.loads(lines[-1])
    never = int(memory["ids"][29])  # untagged: never the fabricated subject's
    receipt = ErasureReceipt(tag_hash="ab" * 32, erased_ids=[never], certificates=[],
                             copies_kept={}, state_digest=last["digest"], n_after=last["n"])
    append_record(f["log"], {"op": "erase", "erasure": {
        "tag_hash": receipt.tag_hash, "erased_ids": [never], "ingested_at": [1],
        "signer": None, "signature": None, "receipt_sha256": receipt.sha256()}})
    (tmp_path / "fake.json").write_text(receipt.to_json())
    for keys in _keys(f):
        assert _never_0(["audit", "verify", str(f["log"]), *keys], capsys) == 1
        assert _never_0(["audit", "verify", str(f["log"]), str(f["state"]), *keys],
                        capsys) == 1
        _never_0(["verify-erasure", str(f["state"]), str(tmp_path / "fake.json"), "--log",
                  str(f["log"]), *keys], capsys)
    # the same record with its Merkle checkpoint recomputed: still refused
    _retree(f["log"], f["log"].read_text().splitlines())
    for keys in _keys(f):
        assert _never_0(["audit", "verify", str(f["log"]), str(f["state"]), *keys],
                        capsys) == 1


# ------------------------------------------------------------------ 2. receipt and log co-edited
@pytest.mark.parametrize("receipt", ["cert.json", "erasure.json"])
def test_a_receipt_and_log_co_edited_with_chain_and_tree_recomputed_is_never_exit_0(
        memory, receipt, tmp_path, capsys):
    f = _copy(memory, tmp_path)
    data = json.loads((memory["dir"] / receipt).read_text())
    records = read_records(f["log"])
    if receipt == "cert.json":  # a certificate: one field edited in both
        data["n_events"] += 1
        rec = next(r for r in records if r["op"] == "remove"  # (an erased one is pruned)
                   and isinstance(r["certificate"], dict)
                   and r["certificate"]["removed_id"] == data["removed_id"])
        rec["certificate"]["n_events"] = data["n_events"]
        command = "verify-deletion"
    else:  # an erasure receipt: its time edited, the record's receipt hash recomputed
        data["issued_at"] = "2020-01-01T00:00:00+00:00"
        edited = ErasureReceipt.from_json(json.dumps(data))
        rec = next(r for r in records if r["op"] == "erase")
        rec["erasure"]["receipt_sha256"] = edited.sha256()
        command = "verify-erasure"
    write_records(f["log"], records)  # sealed again, the chain re-hashed
    _retree(f["log"], f["log"].read_text().splitlines())
    assert verify_chain(f["log"]).ok  # the chain and the log's own checkpoint hold
    (tmp_path / receipt).write_text(json.dumps(data))
    base = [command, str(f["state"]), str(tmp_path / receipt), "--log", str(f["log"])]
    for keys in _keys(f):
        # the state's checkpoint (and, signed, the key) refuse the rewritten log
        assert _never_0([*base, *keys], capsys) == 1
        assert _never_0(["audit", "verify", str(f["log"]), str(f["state"]), *keys],
                        capsys) == 1


# ------------------------------------------------------------------ 3. a rewritten stream
@pytest.fixture(scope="module")
def lm(tmp_path_factory):
    from svattn.lm.train import TrainConfig

    d = tmp_path_factory.mktemp("forge_lm")
    torch.manual_seed(0)
    cfg = CharLMConfig(vocab_size=128, n_layer=1, n_embd=16, n_head=2, block_size=64,
                       mixer="hybrid_sv", mixer_options={"chunk": 8, "C": 0.25,
                                                         "policy": "full"})
    model = CharLM(cfg).eval()
    torch.save({"config": TrainConfig().to_dict(), "model_config": cfg.to_dict(),
                "model": model.state_dict(), "step": 0}, d / "ckpt.pt")
    return d / "ckpt.pt", model


def test_an_unsigned_receipt_with_a_rewritten_stream_holding_the_span_is_never_exit_0(
        lm, tmp_path, capsys):
    """The forger rebuilds the stream from the whole text (the span held again), with
    the span listed as forgotten, the honest forget log's entry given the forged state,
    the forget log's checkpoint recomputed, and the unsigned receipt's digest set to the
    forged stream's (the receipt's body hash leaves the digest out). Every load check
    and the re-stream hold: ``verify-forget`` said VERIFIED (exit 0). Only the forget
    log's authenticity cannot hold: an unsigned stream's is named unchecked (exit 3)."""
    ckpt, model = lm
    text = bytes(np.random.default_rng(1).integers(97, 110, 40).tolist())
    real = model.stream()
    real.feed(text)
    receipt = real.forget(10, 14).receipt
    assert receipt.signature is None
    forged = model.stream()
    forged.feed(text)
    forged.n_fed = 44
    forged._origin = list(range(10)) + list(range(14, 44))
    forged.forgotten = [(10, 14)]
    forged.forget_log = [{**real.forget_log[0], "state": forged.state_part()}]
    forged.forget_checkpoint = checkpoint_of(forged.forget_log)
    forged.save(tmp_path / "forged")
    (tmp_path / "r.json").write_text(
        dataclasses.replace(receipt, state_digest=forged.digest()).to_json())
    from svattn.lm.stream import LMStream

    assert text[10:14] in LMStream.load(tmp_path / "forged", model).text  # held again
    out: list[str] = []
    assert _never_0(["verify-forget", str(ckpt), str(tmp_path / "forged"),
                     str(tmp_path / "r.json")], capsys, out) == 3
    assert "the forget log's authenticity" in out[0] and "is unsigned" in out[0]
