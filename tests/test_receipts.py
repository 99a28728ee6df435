"""Every receipt svattn issues, against its declaration (issue #35).

The tamper harness enumerates each receipt type's fields from its ``CHECKS``
declaration (a new field cannot be missed: the declaration must name every dataclass
field), edits each to other values, and asks the type's verifier with and without the
audit log and the public key: every edit must be FAILED, or reported UNCHECKED with the
edited field among the unchecked ones. Never VERIFIED, and never a field reported
checked when its edit went through. Then one test per defect of the issue (each fails
on the tree before #35), and the design doc's table against the declarations.
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

from svattn import SVDD
from svattn.estimators import ForgetReceipt, verify_forget_receipt
from svattn.exact import DeletionCertificate, SVDDMemory
from svattn.exact.auditor.verify import verify_deletion, verify_erasure
from svattn.exact.records.certificate import ErasureReceipt
from svattn.exact.records.receipts import (
    checks_table,
    declaration_errors,
    edited_values,
    tamper_outcome,
)
from svattn.exact.records.signing import derive_tag_key, generate_key, sign, tag_hash
from svattn.exact.records.tlog import checkpoint_path
from svattn.lm import CharLM, CharLMConfig
from svattn.lm.forget import REFED, ModelErasureReceipt, verify_forget

TYPES = [DeletionCertificate, ErasureReceipt, ModelErasureReceipt, ForgetReceipt]
DESIGN = Path(__file__).resolve().parents[1] / "docs" / "design.md"


def assert_never_verified(verdict, name: str, setting: str) -> None:
    # FAILED, or the edit went through and the field says it was not checked
    assert tamper_outcome(verdict, name) in ("failed", "unchecked"), (name, setting, verdict)


# ------------------------------------------------------------------ the receipts


@pytest.fixture(scope="module")
def deletion(tmp_path_factory):
    log = tmp_path_factory.mktemp("del") / "audit.jsonl"
    key = generate_key()
    mem = SVDDMemory(0.1, audit_log=log, signing_key=key)
    ids = mem.extend(np.random.default_rng(0).normal(size=(40, 3)))
    mem.remove(ids[7])
    cert = mem.remove(mem.partition()["margin"][0])
    return mem, cert, log, key


@pytest.fixture(scope="module")
def erasure(tmp_path_factory):
    log = tmp_path_factory.mktemp("era") / "audit.jsonl"
    key = generate_key()
    mem = SVDDMemory(0.1, audit_log=log, signing_key=key)
    X = np.random.default_rng(1).normal(size=(36, 3))
    X[30] = X[2]  # subject c holds a copy of one of a's records: kept, and listed
    mem.extend(X, tags=["a"] * 6 + ["b"] * 24 + ["c"] * 6)
    receipt = mem.erase("a")
    assert receipt.copies_kept
    return mem, receipt, log, key


def tiny_model(seed: int = 0) -> CharLM:
    torch.manual_seed(seed)
    cfg = CharLMConfig(n_layer=1, n_embd=16, n_head=2, block_size=96, mixer="hybrid_sv",
                       mixer_options={"chunk": 8, "C": 0.25, "policy": "full"})
    return CharLM(cfg)


TEXT = b"the cat sat on the mat, the dog sat on the log"


@pytest.fixture(scope="module")
def model_erasure():
    key = generate_key()
    model = tiny_model()
    s = model.stream(signing_key=key)
    s.feed(TEXT)
    receipt = s.forget(10, 17).receipt
    return s, receipt, key


def test_an_unsigned_model_receipt_has_every_field_checked_by_its_stream_alone():
    s = tiny_model().stream()
    s.feed(TEXT[:26])  # shorter: each verification re-streams the text
    receipt = s.forget(10, 14).receipt
    assert receipt.signer is None and receipt.certificates()
    rep = verify_forget(s, receipt)
    # every field checked; the unsigned forget log's authenticity is not (exit 3)
    assert rep.ok and not rep.verdict.unchecked and rep.exit_status == 3, rep.summary()
    assert "is unsigned" in rep.verdict.authenticity_line()
    for name, value in _cases(receipt):
        forged = dataclasses.replace(receipt, **{name: value})
        assert_never_verified(verify_forget(s, forged).verdict, name, "unsigned")


@pytest.fixture(scope="module")
def estimator(tmp_path_factory):
    """Two signed, logged models, one after a forget by ids, one after a subject's."""
    key = generate_key()
    X = np.random.default_rng(2).normal(size=(40, 3))
    out = {}
    for kind in ("ids", "subject"):
        log = tmp_path_factory.mktemp("est") / "audit.jsonl"
        model = SVDD(nu=0.2, signing_key=key, audit_log=log).fit(
            X, ids=[f"row-{i}" for i in range(40)], subjects=["a"] * 4 + ["b"] * 36)
        receipt = model.forget(ids=["row-30", "row-11"]) if kind == "ids" else \
            model.forget(subject="a")
        out[kind] = (model, receipt, log)
    plain = SVDD(nu=0.2).fit(X)
    return out, key, plain, plain.forget(indices=[3, 11])


# ------------------------------------------------------------------ declarations


@pytest.mark.parametrize("kind", TYPES, ids=lambda k: k.__name__)
def test_every_field_is_declared_with_what_checks_it(kind):
    assert declaration_errors(kind) == []
    assert set(kind.CHECKS) == {f.name for f in dataclasses.fields(kind)}


def test_the_design_doc_holds_the_declared_table():
    """docs/design.md's table is the contract: it must be the declarations, verbatim."""
    assert checks_table(TYPES) in DESIGN.read_text()


def test_a_missing_declaration_is_named():
    @dataclasses.dataclass(frozen=True)
    class Half:
        CHECKS = {"a": ("state",), "b": (), "c": ("nonsense",)}
        a: int
        d: int

    errs = declaration_errors(Half)
    assert any("d: not declared" in e for e in errs) and any("b: nothing" in e for e in errs)
    assert any("unknown check 'nonsense'" in e for e in errs)
    assert any("c: declared, but no field" in e for e in errs)


# ------------------------------------------------------------------ tamper harness


def _cases(receipt):
    return [(f, v) for f in type(receipt).CHECKS for v in edited_values(getattr(receipt, f))]


@pytest.mark.parametrize("setting", ["state", "log", "key", "log+key"])
def test_tamper_deletion_certificate(deletion, setting):
    mem, cert, log, key = deletion
    kw = {"log": log if "log" in setting else None,
          "public_key": key.public_key() if "key" in setting else None}
    assert verify_deletion(mem, cert, retrain=False, **kw).ok  # the honest one passes
    for name, value in _cases(cert):
        forged = dataclasses.replace(cert, **{name: value})
        assert_never_verified(verify_deletion(mem, forged, retrain=False, **kw).verdict,
                              name, setting)


@pytest.mark.parametrize("setting", ["state", "log", "key", "log+key"])
def test_tamper_erasure_receipt(erasure, setting):
    mem, receipt, log, key = erasure
    kw = {"log": log if "log" in setting else None,
          "public_key": key.public_key() if "key" in setting else None}
    honest = verify_erasure(mem, receipt, retrain=False, **kw)
    assert honest.ok, honest.reasons
    for name, value in _cases(receipt):
        forged = dataclasses.replace(receipt, **{name: value})
        assert_never_verified(verify_erasure(mem, forged, retrain=False, **kw).verdict,
                              name, setting)


@pytest.mark.parametrize("setting", ["state", "key"])
def test_tamper_model_erasure_receipt(model_erasure, setting):
    s, receipt, key = model_erasure
    public = key.public_key() if setting == "key" else None
    honest = verify_forget(s, receipt, public_key=public)
    if public is None:  # a signed receipt: its signature is what only the key checks
        assert honest.ok and dict(honest.verdict.unchecked).keys() == {"signature"}
    else:
        assert honest.status == "VERIFIED", honest.summary()
    for name, value in _cases(receipt):
        forged = dataclasses.replace(receipt, **{name: value})
        assert_never_verified(verify_forget(s, forged, public_key=public).verdict, name,
                              setting)


def test_tamper_unsigned_estimator_forget_receipt(estimator):
    *_, model, receipt = estimator
    honest = verify_forget_receipt(model, receipt, retrain=False)
    assert honest.ok and honest.status == "UNCHECKED"  # no log, no signature: honest about it
    assert {"ids", "positions", "certificates"} <= dict(honest.verdict.unchecked).keys()
    for name, value in _cases(receipt):
        forged = dataclasses.replace(receipt, **{name: value})
        assert_never_verified(verify_forget_receipt(model, forged, retrain=False).verdict,
                              name, "state")


@pytest.mark.parametrize("kind", ["ids", "subject"])
@pytest.mark.parametrize("setting", ["state", "log", "key", "log+key"])
def test_tamper_estimator_forget_receipt(estimator, kind, setting):
    models, key, *_ = estimator
    model, receipt, log = models[kind]
    kw = {"log": log if "log" in setting else None,
          "public_key": key.public_key() if "key" in setting else None}
    honest = verify_forget_receipt(model, receipt, **kw)
    assert honest.ok, honest.reasons
    assert (honest.status == "VERIFIED") == ("key" in setting), honest.summary()
    for name, value in _cases(receipt):
        forged = dataclasses.replace(receipt, **{name: value})
        assert_never_verified(verify_forget_receipt(model, forged, retrain=False, **kw).verdict,
                              name, setting)


# ------------------------------------------------------------------ defects 1-4


def test_defect1_model_receipts_with_edited_spans_dropped_certificates_or_no_forget_fail(
        model_erasure):
    s, receipt, _ = model_erasure
    dropped = [{**m, "span_certificates": []} for m in receipt.memories]
    forged = {
        "fed_span": dataclasses.replace(receipt, fed_span=[11, 18]),
        "held_span": dataclasses.replace(receipt, held_span=[9, 16]),
        "n_forgotten": dataclasses.replace(receipt, n_forgotten=6),
        "certificates dropped": dataclasses.replace(receipt, memories=dropped),
        "memories dropped": dataclasses.replace(receipt, memories=[]),
        "fed_span a string": dataclasses.replace(receipt, fed_span="10:17"),
    }
    for what, r in forged.items():
        rep = verify_forget(s, r)
        assert not rep.ok and rep.status == "FAILED", what
    never = tiny_model().stream()  # fed the same text, never forgot anything
    never.feed(s.text)
    rep = verify_forget(never, receipt)
    assert not rep.ok and rep.status == "FAILED"
    assert any("never forgot" in r for r in rep.reasons), rep.reasons


def test_defect1_the_stream_digest_covers_forgotten_spans_and_fed_positions():
    a, b = tiny_model().stream(), tiny_model().stream()
    a.feed(TEXT)
    b.feed(TEXT[:10] + TEXT[17:])
    a.forget(10, 17)
    assert a.text == b.text and a.content_digest() == b.content_digest()
    assert a.digest() != b.digest()
    c = tiny_model().stream()
    c.feed(TEXT[:10] + TEXT[17:])
    c.n_fed += 1  # an edited count of fed bytes
    assert c.digest() != b.digest()


@pytest.mark.parametrize("edit", [
    {"memories": [{}]}, {"memories": "abc"}, {"fed_span": "10:17"}, {"repair": []},
    {"n_after": -1}, {"signature": None},
], ids=lambda e: "-".join(f"{k}={v!r}"[:20] for k, v in e.items()))
def test_defect2_malformed_model_receipts_raise_value_error(model_erasure, edit):
    _, receipt, _ = model_erasure
    data = {**json.loads(receipt.to_json()), **edit}
    with pytest.raises(ValueError, match="receipt: "):
        ModelErasureReceipt.from_json(json.dumps(data))


def test_defect2_a_certificate_with_an_unknown_field_is_refused(model_erasure, erasure):
    _, receipt, _ = model_erasure
    data = json.loads(receipt.to_json())
    data["memories"][0]["span_certificates"][0]["extra"] = 1
    with pytest.raises(ValueError, match=r"unknown fields \['extra'\]"):
        ModelErasureReceipt.from_json(json.dumps(data))
    data = json.loads(erasure[1].to_json())
    data["certificates"][0]["extra"] = 1
    with pytest.raises(ValueError, match=r"certificates\[0\].*unknown fields"):
        ErasureReceipt.from_json(json.dumps(data))


def test_defect3_a_relabelled_resigned_erasure_receipt_fails_against_the_log(erasure):
    mem, receipt, log, key = erasure
    other_key = generate_key()
    certs = [dict(c) for c in receipt.certificates]
    certs[0]["commitment"] = "0" * 64
    relabelled = dataclasses.replace(
        receipt, tag_hash=tag_hash(derive_tag_key(key), "z").hex(), certificates=certs,
        signer=None, signature=None)
    forged = sign(relabelled, other_key)
    rep = verify_erasure(mem, forged, retrain=False, log=log, public_key=other_key.public_key())
    assert not rep.ok and rep.status == "FAILED"
    # the erase record, its subject pruned, keeps the receipt's SHA-256: another receipt
    assert any("holds another receipt" in r for r in rep.reasons), rep.reasons


def test_defect3_every_certificate_of_an_erasure_is_checked(erasure):
    mem, receipt, log, _ = erasure
    certs = [dict(c) for c in receipt.certificates]
    certs[0]["kkt_residual_after"] = certs[0]["kkt_residual_after"] + 0.5  # not the last
    forged = dataclasses.replace(receipt, certificates=certs)
    rep = verify_erasure(mem, forged, retrain=False, log=log)
    # (the log's records of the removals were pruned with the subject: the receipt's
    # SHA-256 in the erase record binds every certificate)
    assert not rep.ok and any("holds another receipt" in r for r in rep.reasons)
    assert len(rep.removals) == len(receipt.erased_ids)
    certs = [dict(c) for c in receipt.certificates]
    certs[0]["partition_after"] = {**certs[0]["partition_after"],
                                   "margin": certs[0]["partition_after"]["margin"] + 1}
    rep = verify_erasure(mem, dataclasses.replace(receipt, certificates=certs), retrain=False)
    assert not rep.ok and any(r.startswith("certificates[0]:") for r in rep.reasons)


def test_defect4_an_edited_commitment_is_never_verified_from_the_state_alone(
        deletion, tmp_path, capsys):
    from svattn.cli import main

    mem, cert, log, _ = deletion
    state, path = tmp_path / "m.safetensors", tmp_path / "cert.json"
    mem.save(state)
    path.write_text(dataclasses.replace(cert, commitment="0" * 64).to_json())
    assert main(["verify-deletion", str(state), str(path)]) == 3
    out = capsys.readouterr().out
    assert "VERIFIED" not in out and "UNCHECKED" in out
    unchecked = next(line for line in out.splitlines() if line.startswith("fields UNCHECKED"))
    assert "commitment" in unchecked and "--log" in unchecked
    assert main(["verify-deletion", str(state), str(path), "--log", str(log)]) == 1


# ------------------------------------------------------------------ checked later


def test_a_model_receipt_is_checked_later_through_the_forget_log(model_erasure, tmp_path):
    s, receipt, key = model_erasure
    later = tiny_model().stream()
    later.feed(TEXT)
    first = later.forget(10, 17).receipt
    later.save(tmp_path / "st")
    later.feed(b" and more")
    later.forget(2, 4)  # an earlier span, after the first forget
    rep = verify_forget(later, first)
    # every field checks; what was fed since the forget the log does not attest
    assert rep.ok and rep.later and rep.status == "UNCHECKED", rep.summary()
    assert [name for name, _ in rep.verdict.unchecked] == [REFED]
    forged = dataclasses.replace(first, state_digest="0" * 64)
    assert verify_forget(later, forged).status == "FAILED"


def test_cli_signed_model_receipt_needs_the_public_key_to_be_verified(tmp_path, capsys):
    from svattn.cli import main
    from svattn.exact.records.signing import write_keypair
    from svattn.lm.train import TrainConfig

    model = tiny_model()
    ckpt = tmp_path / "ckpt.pt"
    torch.save({"config": TrainConfig().to_dict(), "model_config": model.cfg.to_dict(),
                "model": model.state_dict(), "step": 0}, ckpt)
    key, pub = write_keypair(tmp_path / "ctl")
    _, other = write_keypair(tmp_path / "other")
    st, r = tmp_path / "st", tmp_path / "r.json"
    assert main(["generate", str(ckpt), "--prompt", TEXT.decode(), "-n", "0", "--forget",
                 "4:9", "--receipt", str(r), "--save", str(st), "--signing-key", str(key)]) == 0
    assert ModelErasureReceipt.from_json(r.read_text()).signer is not None
    capsys.readouterr()
    verify = ["verify-forget", str(ckpt), str(st), str(r)]
    assert main(verify) == 3  # every field bound by the stream but the signature
    out = capsys.readouterr().out
    assert "VERIFIED" not in out and "signature" in out.split("fields UNCHECKED:")[1]
    assert main([*verify, "--public-key", str(pub)]) == 0
    assert "verdict:             VERIFIED" in capsys.readouterr().out
    assert main([*verify, "--public-key", str(other)]) == 1


def test_a_manifest_stripped_of_its_forget_log_is_refused(tmp_path):
    """The forget log binds the receipts to the saved stream: a manifest without it (or
    with another one) is refused, even with its checksum recomputed."""
    from svattn.lm.stream import LMStream, StreamStateError

    s = tiny_model().stream()
    s.feed(TEXT)
    s.forget(3, 5)
    s.save(tmp_path / "st")
    man_path = tmp_path / "st" / "stream.json"
    man = json.loads(man_path.read_text())
    for edit in ({"forget_log": None}, {"forget_log": []}, {"forget_log": ["x"]}):
        bad = {**man, **edit}
        bad.pop("manifest_sha256", None)
        from svattn.lm.stream_folder import manifest_sum

        bad["manifest_sha256"] = manifest_sum(bad)
        man_path.write_text(json.dumps(bad))
        with pytest.raises(StreamStateError):
            LMStream.load(tmp_path / "st", tiny_model())


def test_an_erasure_receipt_is_checked_later_against_the_log(tmp_path):
    log, key = tmp_path / "audit.jsonl", generate_key()
    mem = SVDDMemory(0.1, audit_log=log, signing_key=key)
    rng = np.random.default_rng(4)
    mem.extend(rng.normal(size=(30, 3)), tags=["a"] * 5 + ["b"] * 25)
    receipt = mem.erase("a")
    mem.extend(rng.normal(size=(5, 3)), tags=["b"] * 5)  # the memory moved on
    rep = verify_erasure(mem, receipt, log=log, public_key=key.public_key())
    assert rep.status == "VERIFIED", rep.summary()
    # without the key the log's checkpoint signature is unchecked: never a bare VERIFIED
    rep = verify_erasure(mem, receipt, log=log)
    assert rep.ok and rep.status == "UNCHECKED" and not rep.verdict.unchecked, rep.summary()
    assert "the signature of audit.jsonl.checkpoint" in rep.verdict.authenticity_line()
    assert verify_erasure(mem, receipt).status == "FAILED"  # without the log: not its state
    mem.extend(rng.normal(size=(1, 3)), tags=["a"])  # the subject's data is back
    assert verify_erasure(mem, receipt, log=log).status == "FAILED"


def test_an_erase_record_without_the_receipt_hash_leaves_two_fields_to_the_signature(
        tmp_path):
    """Logs written before #35 keep the tag hash, ids, signer and signature of an
    erasure, not the receipt's SHA-256: copies_kept and issued_at are then unchecked by
    the log (the signature still binds them)."""
    from svattn.exact.records.audit import canonical, record_hash

    log, key = tmp_path / "audit.jsonl", generate_key()
    src = Path(__file__).parent / "exact" / "data" / "audit_v2"  # a version-2 log goes on
    for name in ("audit.jsonl", "audit.jsonl.checkpoint", "state.safetensors"):
        shutil.copy(src / name, tmp_path / name)
    mem = SVDDMemory.load(tmp_path / "state.safetensors", audit_log=log, signing_key=key,
                          tag_key=b"fixture tag key 0123")
    mem.extend(np.random.default_rng(5).normal(size=(20, 3)), tags=["a"] * 4 + ["b"] * 16)
    receipt = mem.erase("a")
    mem.close_audit_log()
    records, prev = [], None
    for line in log.read_text().splitlines():  # rewrite as an older log would read
        rec = json.loads(line)
        if rec["op"] == "erase":
            del rec["erasure"]["receipt_sha256"]
        if prev is not None:
            rec["prev"] = prev
        rec["sha256"] = record_hash(rec)
        records.append(canonical(rec) + "\n")
        prev = hashlib.sha256(canonical(rec).encode()).hexdigest()  # chained by line
    log.write_text("".join(records))
    checkpoint_path(log).unlink()  # as such a log had none (its authenticity: unchecked)
    rep = verify_erasure(mem, receipt, retrain=False, log=log)
    assert rep.ok and rep.status == "UNCHECKED"
    assert {n for n, _ in rep.verdict.unchecked} >= {"copies_kept", "issued_at"}
    edited = dataclasses.replace(receipt, issued_at="2020-01-01T00:00:00+00:00")
    assert tamper_outcome(verify_erasure(mem, edited, retrain=False, log=log).verdict,
                          "issued_at") == "unchecked"
    assert verify_erasure(mem, edited, retrain=False, log=log,
                          public_key=key.public_key()).status == "FAILED"
