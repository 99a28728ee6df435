"""Tamper matrix of the deletion tooling: what an adversary edits, and what catches it.

One memory with an audit log and a signing key (n = 60, d = 3, C = 0.1), one
removal, its state saved. Then, each counted as detected / tried:

* every field of each of the four receipt types (``DeletionCertificate``,
  ``ErasureReceipt``, ``ModelErasureReceipt``, the estimator's ``ForgetReceipt``),
  enumerated from its ``CHECKS`` declaration (:mod:`svattn.exact.records.receipts`), edited
  (:func:`~svattn.exact.records.receipts.edited_values`) and checked with and without the
  log and the public key (where the type has them): each outcome is FAILED, reported
  unchecked (the field among the verdict's unchecked ones), VERIFIED or "claimed
  checked" (the last two must be 0);
* every byte of the receipt's JSON replaced (3 replacements a byte), with the
  public key (a malformed receipt, refused by ``from_json``, counts as caught);
* every byte of the state file replaced (``SVDDMemory.load`` must refuse it);
* every record of the log edited (its count changed), dropped, duplicated and
  swapped with the next, without and with re-hashing the record itself; its time
  edited and the whole chain re-hashed after it (with and without the log's Merkle
  checkpoint recomputed, unsigned); and a fabricated ``erase`` record appended:
  counted as caught by the chain alone, by the log's checkpoint with the key (no
  state), by the chain with the state (``verify_log``), as refused with the
  controller's key (the chain, the state, the log's checkpoint and the state's, their
  signatures: ``svattn audit verify LOG STATE --public-key``, exit 1) and as never
  verified without it (exit 1 or 3);
* each receipt type's ``.tlog-proof`` (``svattn audit prove LOG --receipt R``): every
  byte of its entry replaced, every hash of its inclusion path with one bit flipped,
  a hash removed or repeated, the index moved by one, the checkpoint's note signed by
  another key instead (``verify_proof`` with the controller's verifier key must
  refuse each);
* the costs: signing a receipt, checking a signature, ``verify_deletion``
  without and with the retrain.

Usage::

    python benchmarks/tamper_matrix.py --json results/trust/tamper_matrix.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from svattn.exact import DeletionCertificate, SVDDMemory, verify_deletion
from svattn.exact.auditor.verify import verify_erasure, verify_log
from svattn.exact.records.audit import canonical, record_hash
from svattn.exact.records.openings import openings_path
from svattn.exact.records.receipts import edited_values, tamper_outcome
from svattn.exact.records.signing import generate_key, sign, signature_errors

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_records import write_record  # noqa: E402


def _caught(fn) -> bool:
    try:
        return not fn()
    except (ValueError, TypeError, KeyError):
        return True


def field_matrix(receipt, verify, settings: dict) -> dict:
    """Per field of ``receipt`` (from its declaration), per setting: how many edits
    FAILED, were reported unchecked, VERIFIED, or passed with the field claimed checked."""
    out = {}
    for name in type(receipt).CHECKS:
        row = {}
        for setting, kw in settings.items():
            counts = {"failed": 0, "unchecked": 0, "VERIFIED": 0, "claimed checked": 0}
            for value in edited_values(getattr(receipt, name)):
                forged = dataclasses.replace(receipt, **{name: value})
                counts[tamper_outcome(verify(forged, **kw).verdict, name)] += 1
            row[setting] = counts
        out[name] = row
    return out


def four_types(mem, cert, log, key, tmp: Path, sources: list | None = None) -> dict:
    """The field matrix of every receipt type (``sources``: each receipt's
    ``(type, receipt file, log)`` appended, for :func:`proof_matrix`)."""
    import torch

    from svattn import SVDD
    from svattn.estimators import verify_forget_receipt
    from svattn.lm import CharLM, CharLMConfig
    from svattn.lm.forget import verify_forget

    public = key.public_key()
    both = {"state": {}, "log": {"log": log}, "public_key": {"public_key": public},
            "log+public_key": {"log": log, "public_key": public}}
    out = {"DeletionCertificate": field_matrix(
        cert, lambda r, **kw: verify_deletion(mem, r, retrain=False, **kw), both)}
    elog = tmp / "erasure.jsonl"
    emem = SVDDMemory(0.1, audit_log=elog, signing_key=key)
    X = np.random.default_rng(1).normal(size=(36, 3))
    X[30] = X[2]
    emem.extend(X, tags=["a"] * 6 + ["b"] * 24 + ["c"] * 6)
    receipt = emem.erase("a")
    sources = [] if sources is None else sources
    sources += [("DeletionCertificate", write_receipt(tmp / "cert.json", cert), log),
                ("ErasureReceipt", write_receipt(tmp / "erasure.json", receipt), elog)]
    eboth = {k: {**v, "log": elog} if "log" in v else v for k, v in both.items()}
    out["ErasureReceipt"] = field_matrix(
        receipt, lambda r, **kw: verify_erasure(emem, r, retrain=False, **kw), eboth)
    torch.manual_seed(0)
    cfg = CharLMConfig(n_layer=1, n_embd=16, n_head=2, block_size=96, mixer="hybrid_sv",
                       mixer_options={"chunk": 8, "C": 0.25, "policy": "full"})
    stream = CharLM(cfg).stream(signing_key=key)
    stream.feed(b"the cat sat on the mat, the dog sat on the log")
    for word in (b"log", b"dog", b"mat"):  # earlier forgets (after the span): its entry
        stream.forget_text(word)  # is the fourth of the forget log, its proof two hashes
    mreceipt = stream.forget(10, 17).receipt
    stream.save(tmp / "stream")
    sources.append(("ModelErasureReceipt", write_receipt(tmp / "model.json", mreceipt),
                    tmp / "stream"))
    out["ModelErasureReceipt"] = field_matrix(
        mreceipt, lambda r, **kw: verify_forget(stream, r, **kw),
        {"state": {}, "public_key": {"public_key": public}})
    for kind in ("ids", "subject"):  # the estimator's two forgets, each the model's last
        flog = tmp / f"estimator-{kind}.jsonl"
        model = SVDD(nu=0.2, signing_key=key, audit_log=flog).fit(
            np.random.default_rng(2).normal(size=(40, 3)),
            ids=[f"row-{i}" for i in range(40)], subjects=["a"] * 4 + ["b"] * 36)
        freceipt = model.forget(ids=["row-30", "row-11"]) if kind == "ids" else \
            model.forget(subject="a")
        sources.append((f"ForgetReceipt ({kind})",
                        write_receipt(tmp / f"forget-{kind}.json", freceipt), flog))
        fboth = {k: {**v, "log": flog} if "log" in v else v for k, v in both.items()}
        out[f"ForgetReceipt ({kind})"] = field_matrix(
            freceipt, lambda r, m=model, **kw: verify_forget_receipt(m, r, retrain=False, **kw),
            fboth)
    return out


def write_receipt(path: Path, receipt) -> Path:
    """Write ``receipt``'s JSON to ``path`` (for ``svattn audit prove --receipt``)."""
    path.write_text(receipt.to_json())
    return path


def proof_matrix(sources: list, key, tmp: Path) -> dict:
    """Per receipt type: its ``.tlog-proof`` (made by ``svattn audit prove``) accepted
    as made, and each mutation of it refused (detected / tried)."""
    import contextlib
    import io

    from svattn.cli import main as cli
    from svattn.exact.records.audit import verify_chain
    from svattn.exact.records.note import TlogError, parse_note, sign_note
    from svattn.exact.records.tlog import (
        controller_signer,
        controller_verifier,
        parse_proof,
        proof_text,
        verify_proof,
    )
    from svattn.lm.forget_log import entry_bytes
    from svattn.lm.stream_folder import read_manifest

    keys = [controller_verifier(key.public_key())]
    other = controller_signer(generate_key())
    out = {}
    for kind, receipt, log in sources:
        path = tmp / f"{receipt.stem}.tlog-proof"
        with contextlib.redirect_stdout(io.StringIO()):
            if cli(["audit", "prove", str(log), "--receipt", str(receipt), "-o",
                    str(path)]) != 0:
                raise RuntimeError(f"svattn audit prove refused {receipt}")
        proof = parse_proof(path.read_text())
        entries = ([entry_bytes(e) for e in read_manifest(log)["forget_log"]]
                   if log.is_dir() else verify_chain(log).entries)
        entry = entries[proof.index]
        verify_proof(proof, entry, keys)  # the proof as made: accepted (raises otherwise)
        body = parse_note(proof.checkpoint).text
        # the same checkpoint signed by another key; every byte of the entry; the path
        mutants = [(proof_text(proof.index, proof.path, sign_note(body, [other])), entry)]
        for i in range(len(entry)):
            mutants.append((proof, entry[:i] + bytes([entry[i] ^ 0x01]) + entry[i + 1:]))
        for k, h in enumerate(proof.path):
            flipped = proof.path[:k] + (bytes([h[0] ^ 0x80]) + h[1:],) + proof.path[k + 1:]
            mutants.append((proof_text(proof.index, flipped, proof.checkpoint), entry))
            mutants.append((proof_text(proof.index, proof.path[:k] + proof.path[k + 1:],
                                       proof.checkpoint), entry))
            mutants.append((proof_text(proof.index, proof.path[:k + 1] + proof.path[k:],
                                       proof.checkpoint), entry))
        for index in (proof.index - 1, proof.index + 1):
            if index >= 0:
                mutants.append((proof_text(index, proof.path, proof.checkpoint), entry))
        detected = 0
        for text, data in mutants:
            try:
                verify_proof(text, data, keys)
            except TlogError:
                detected += 1
        out[kind] = {"index": proof.index, "path_hashes": len(proof.path),
                     "entry_bytes": len(entry), "tried": len(mutants), "detected": detected}
    return out


def receipt_bytes(mem, cert, public) -> dict:
    text, tried, caught = cert.to_json(), 0, 0
    for i in range(len(text)):
        for c in "0x}":
            if text[i] == c:
                continue
            tried += 1
            edited = text[:i] + c + text[i + 1:]
            caught += _caught(lambda e=edited: verify_deletion(
                mem, DeletionCertificate.from_json(e), retrain=False, public_key=public).ok)
    return {"tried": tried, "detected": caught}


def state_bytes(path: Path) -> dict:
    data = path.read_bytes()
    bad = path.with_name("flipped.safetensors")
    tried = caught = 0
    for i in range(len(data)):
        tried += 1
        bad.write_bytes(data[:i] + bytes([data[i] ^ 0x5A]) + data[i + 1:])
        try:
            SVDDMemory.load(bad)
        except ValueError:  # StateFileError and its kinds
            caught += 1
    return {"tried": tried, "detected": caught, "bytes": len(data)}


ROW = ("tried", "chain_alone", "failed_with_key_without_state", "detected",
       "failed_with_key", "not_verified_without_key")


def log_records(log: Path, state: Path, key) -> dict:
    """Per way of tampering with the log: tried; caught by the chain alone
    (``chain_alone``), and with the checkpoint and the controller's key but no state
    (``failed_with_key_without_state``: exit 1 of ``svattn audit verify LOG
    --public-key``); caught by the chain with the state (``detected``), refused with
    the key (``failed_with_key``: exit 1 of ``svattn audit verify LOG STATE
    --public-key``) and never verified without it (``not_verified_without_key``: exit
    1 or 3)."""
    from svattn.exact.auditor.logcheck import check_authenticity
    from svattn.exact.records.tlog import CheckpointWriter, checkpoint_path, controller_verifier

    lines = log.read_text().splitlines()
    checkpoint = checkpoint_path(log).read_text()
    keys = [controller_verifier(key.public_key())]
    out = {}
    variants = {
        "edited": lambda i, ls: ls[:i] + [_edit(ls[i], rehash=False)] + ls[i + 1:],
        "edited_and_rehashed": lambda i, ls: ls[:i] + [_edit(ls[i], rehash=True)] + ls[i + 1:],
        "dropped": lambda i, ls: ls[:i] + ls[i + 1:],
        "duplicated": lambda i, ls: ls[: i + 1] + [ls[i]] + ls[i + 1:],
        "swapped_with_next": lambda i, ls: ls[:i] + [ls[i + 1], ls[i]] + ls[i + 2:],
        # the record's time edited (no count to betray it), the whole chain re-hashed
        "edited_chain_rehashed": lambda i, ls: _rechain(ls[:i] + [_retime(ls[i])]
                                                        + ls[i + 1:], i),
        "edited_chain_and_checkpoint_recomputed": lambda i, ls: _rechain(
            ls[:i] + [_retime(ls[i])] + ls[i + 1:], i),
    }
    bad = log.with_name("tampered.jsonl")
    # the openings beside it (the tampering is of the entries)
    openings_path(bad).write_bytes(openings_path(log).read_bytes())
    for name, make in variants.items():
        row = dict.fromkeys(ROW, 0)
        for i in range(len(lines) - (1 if name == "swapped_with_next" else 0)):
            tampered = make(i, list(lines))
            bad.write_text("".join(x + "\n" for x in tampered))
            if name.endswith("checkpoint_recomputed"):  # the forger's tree, unsigned
                writer = CheckpointWriter(bad, None)
                for line in tampered:
                    writer.add(line.encode())
                writer.write()
            else:
                checkpoint_path(bad).write_text(checkpoint)
            _count(row, bad, state, keys, verify_log, check_authenticity)
        out[name] = row
    row = dict.fromkeys(ROW, 0)
    bad.write_text("".join(x + "\n" for x in lines + [_fabricated_erase(lines)]))
    checkpoint_path(bad).write_text(checkpoint)
    _count(row, bad, state, keys, verify_log, check_authenticity)
    out["fabricated_erase_appended"] = row
    return out


def _count(row: dict, bad: Path, state: Path, keys, verify_log, check_authenticity) -> None:
    """Count one tampered log ``bad`` (its checkpoint beside it) into ``row``."""
    row["tried"] += 1
    chain = verify_log(bad)  # the chain alone (``svattn audit verify LOG``: no state)
    row["chain_alone"] += not chain.ok
    row["failed_with_key_without_state"] += not chain.ok or check_authenticity(
        bad, chain, keys).exit_status == 1
    rep = verify_log(bad, state)
    if not rep.ok:
        for k in ("detected", "failed_with_key", "not_verified_without_key"):
            row[k] += 1
    else:
        row["failed_with_key"] += check_authenticity(bad, rep, keys, state).exit_status == 1
        row["not_verified_without_key"] += check_authenticity(bad, rep, [], state
                                                              ).exit_status != 0


def _rechain(lines: list[str], start: int) -> list[str]:
    """Lines ``start`` on re-chained: each ``prev`` and ``sha256`` recomputed."""
    import hashlib

    out = list(lines)
    for i in range(max(start, 1), len(out)):
        rec = json.loads(out[i])
        rec["prev"] = hashlib.sha256(out[i - 1].encode()).hexdigest()
        rec["sha256"] = record_hash(rec)
        out[i] = canonical(rec)
    return out


def _fabricated_erase(lines: list[str]) -> str:
    """An ``erase`` record appended the way a forger can (no key): chained to the last,
    for a subject that never held the id (an untagged token)."""
    import hashlib

    last = json.loads(lines[-1])
    rec = {"op": "erase", "erasure": {"tag_hash": "ab" * 32, "erased_ids": [3],
                                      "ingested_at": [1], "signer": None, "signature": None,
                                      "receipt_sha256": "0" * 64},
           "seq": last["seq"] + 1, "prev": hashlib.sha256(lines[-1].encode()).hexdigest(),
           "time": last["time"], "digest": last["digest"], "n": last["n"],
           "next_id": last["next_id"]}
    rec["sha256"] = record_hash(rec)
    return canonical(rec)


def _retime(line: str) -> str:
    rec = json.loads(line)
    rec["time"] = "2000-01-01T00:00:00+00:00"
    rec["sha256"] = record_hash(rec)
    return canonical(rec)


def _edit(line: str, *, rehash: bool) -> str:
    rec = json.loads(line)
    rec["n"] = int(rec.get("n", 0)) + 1
    if rehash:
        rec["sha256"] = record_hash(rec)
    return canonical(rec)


def costs(mem, cert, key, repeats: int) -> dict:
    def per_call(fn) -> float:
        fn()
        t = time.perf_counter()
        for _ in range(repeats):
            fn()
        return 1e6 * (time.perf_counter() - t) / repeats

    public = key.public_key()
    return {
        "sign_us": per_call(lambda: sign(cert, key)),
        "check_signature_us": per_call(lambda: signature_errors(cert, public)),
        "verify_without_retrain_us": per_call(lambda: verify_deletion(mem, cert, retrain=False)),
        "verify_with_retrain_us": per_call(lambda: verify_deletion(mem, cert)),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", type=Path, help="also write the matrix (and this command) here")
    p.add_argument("--repeats", type=int, default=50)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        key = generate_key()
        log, state = tmp / "audit.jsonl", tmp / "m.safetensors"
        mem = SVDDMemory(0.1, audit_log=log, signing_key=key)
        ids = mem.extend(np.random.default_rng(0).normal(size=(60, 3)))
        mem.remove(ids[7])
        cert = mem.remove(mem.partition()["margin"][0])
        mem.save(state)
        sources: list = []
        report = {
            "receipt_fields": four_types(mem, cert, log, key, tmp, sources),
            "receipt_bytes_with_public_key": receipt_bytes(mem, cert, key.public_key()),
            "state_file_bytes": state_bytes(state),
            "log_records": log_records(log, state, key),
            "tlog_proofs": proof_matrix(sources, key, tmp),
            "costs": costs(mem, cert, key, args.repeats),
        }
    print("receipt fields: edits FAILED / reported unchecked / VERIFIED / claimed checked")
    for kind, rows in report["receipt_fields"].items():
        total: dict[str, dict[str, int]] = {}
        for row in rows.values():
            for setting, counts in row.items():
                t = total.setdefault(setting, dict.fromkeys(counts, 0))
                for k, v in counts.items():
                    t[k] += v
        for setting, t in total.items():
            print(f"  {kind:20s} {setting:15s} " + " / ".join(str(v) for v in t.values()))
    rb = report["receipt_bytes_with_public_key"]
    print(f"receipt bytes edited, public key: {rb['detected']} / {rb['tried']} detected")
    sb = report["state_file_bytes"]
    print(f"state file bytes flipped: {sb['detected']} / {sb['tried']} detected")
    for name, row in report["log_records"].items():
        print(f"log records {name}: of {row['tried']}, {row['chain_alone']} caught by the "
              f"chain alone, {row['failed_with_key_without_state']} by its checkpoint and the "
              f"key; with the state {row['detected']} caught by the chain, "
              f"{row['failed_with_key']} refused with the key, "
              f"{row['not_verified_without_key']} not verified without it")
    for kind, row in report["tlog_proofs"].items():
        print(f".tlog-proof of a {kind}: {row['detected']} / {row['tried']} mutants refused")
    print("costs: " + ", ".join(f"{k} {v:.0f}" for k, v in report["costs"].items()))
    if args.json:
        write_record(args.json, __file__, argv, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
