"""Adversarial review of the issue #35 work: crafted receipts, folders and checkpoints.

Each test names the attack it holds. A defect the review fixed has a plain test (it
failed before the fix); a defect left open is ``xfail(strict=True)`` with the reason.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_model

from svattn.cli import main
from svattn.exact import DeletionCertificate, SVDDMemory
from svattn.exact.auditor.persist import save
from svattn.exact.records.certificate import ErasureReceipt
from svattn.lm import CharLM, CharLMConfig
from svattn.lm.forget import ModelErasureReceipt, verify_forget
from svattn.lm.stream import LMStream, StreamStateError
from svattn.lm.stream_folder import write_manifest
from svattn.lm.train import RECALL_CELL, load_checkpoint_model

HUGE = 10**400  # a JSON int no float holds


def tiny_model(seed: int = 0) -> CharLM:
    torch.manual_seed(seed)
    cfg = CharLMConfig(vocab_size=128, n_layer=2, n_embd=16, n_head=2, block_size=64,
                       rope=True, mixer="hybrid_sv",
                       mixer_options={"chunk": 8, "C": 0.25, "policy": "full", "lookback": 3})
    return CharLM(cfg).eval()


def text_of(n: int, seed: int = 1) -> bytes:
    return bytes(np.random.default_rng(seed).integers(97, 110, n).tolist())


@pytest.fixture(scope="module")
def certificate():
    mem = SVDDMemory(C=0.2)
    ids = mem.extend(np.random.default_rng(1).normal(size=(20, 3)))
    return mem, mem.remove(ids[3])


@pytest.fixture(scope="module")
def forgot(tmp_path_factory):
    """A model, a stream that forgot [10, 14) saved in a folder, and the receipt."""
    model = tiny_model()
    s = model.stream()
    s.feed(text_of(40))
    receipt = s.forget(10, 14).receipt
    folder = tmp_path_factory.mktemp("st") / "stream"
    s.save(folder)
    return model, folder, receipt


# ----------------------------------------------- huge ints where a number goes

# attack: a JSON int past the float range (10**400) in a certificate's C, gamma or
# KKT residual: math.isfinite raised OverflowError (a traceback, exit 1), not a refusal
@pytest.mark.parametrize("name", ["C", "gamma", "kkt_residual_after"])
def test_huge_int_in_a_certificate_is_refused(certificate, name):
    d = json.loads(certificate[1].to_json())
    d[name] = HUGE
    with pytest.raises(ValueError, match=name):
        DeletionCertificate.from_json(json.dumps(d))


# attack: the same inside an erasure receipt's certificate
def test_huge_int_in_an_erasure_receipts_certificate_is_refused(certificate):
    cert = json.loads(certificate[1].to_json())
    cert["C"] = HUGE
    r = {"tag_hash": "ab" * 32, "erased_ids": [cert["removed_id"]], "certificates": [cert],
         "copies_kept": {}, "state_digest": "cd" * 32, "n_after": 19}
    with pytest.raises(ValueError, match="certificates"):
        ErasureReceipt.from_json(json.dumps(r))


# attack: huge ints in a model receipt's wall times and KKT residuals
@pytest.mark.parametrize("path", [("repair", "seconds", "rewind"),
                                  ("memories", 0, "max_kkt_residual"),
                                  ("memories", 0, "rewind_s")])
def test_huge_int_in_a_model_receipt_is_refused(forgot, path):
    d = json.loads(forgot[2].to_json())
    x = d
    for p in path[:-1]:
        x = x[p]
    x[path[-1]] = HUGE
    with pytest.raises(ValueError, match=str(path[0])):
        ModelErasureReceipt.from_json(json.dumps(d))


# attack: verify-deletion on a certificate with a huge C: exit 2, no traceback
def test_cli_verify_deletion_huge_int_exits_2(certificate, tmp_path, capsys):
    mem, cert = certificate
    save(mem, tmp_path / "state.svdd")
    d = json.loads(cert.to_json())
    d["C"] = HUGE
    (tmp_path / "cert.json").write_text(json.dumps(d))
    assert main(["verify-deletion", str(tmp_path / "state.svdd"),
                 str(tmp_path / "cert.json")]) == 2
    assert "C must be a number" in capsys.readouterr().err


# attack: a memory state file whose metadata carries a huge int as C, gamma, tol or
# kkt_residual (the metadata's own checksum recomputed; it is unkeyed): load raised
# OverflowError, so verify-deletion / verify-erasure printed a traceback
@pytest.mark.parametrize("name", ["C", "gamma", "tol", "kkt_residual"])
def test_a_state_file_with_a_huge_int_parameter_is_refused(certificate, tmp_path, capsys,
                                                            name):
    from safetensors.numpy import safe_open

    from svattn.exact.auditor.persist import load
    from svattn.exact.records.fileformat import serialize

    mem, cert = certificate
    save(mem, tmp_path / "m.svdd")
    with safe_open(str(tmp_path / "m.svdd"), "numpy") as fh:
        meta = json.loads(fh.metadata()["svattn"])
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118
    meta[name] = HUGE
    (tmp_path / "x.svdd").write_bytes(serialize(tensors, meta))
    with pytest.raises(ValueError):
        load(tmp_path / "x.svdd")
    (tmp_path / "cert.json").write_text(cert.to_json())
    assert main(["verify-deletion", str(tmp_path / "x.svdd"), str(tmp_path / "cert.json")]) == 2
    assert "Traceback" not in capsys.readouterr().err


# a state file's saved KKT residual may differ from the one recomputed on load by
# rounding only (another numpy or BLAS sums the terms in another order): a claim off by
# more — a hidden violation — is refused
@pytest.mark.parametrize(("shift", "loads"), [(0.0, True), (5e-17, True), (-5e-17, True),
                                              (1e-13, False), (-1e-9, False), (1e-3, False)])
def test_a_saved_kkt_residual_off_by_more_than_rounding_is_refused(certificate, tmp_path,
                                                                   shift, loads):
    from safetensors.numpy import safe_open

    from svattn.exact.auditor.persist import load
    from svattn.exact.records.fileformat import serialize

    mem, _ = certificate
    save(mem, tmp_path / "m.svdd")
    with safe_open(str(tmp_path / "m.svdd"), "numpy") as fh:
        meta = json.loads(fh.metadata()["svattn"])
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118
    meta["kkt_residual"] += shift
    (tmp_path / "x.svdd").write_bytes(serialize(tensors, meta))
    if loads:
        assert load(tmp_path / "x.svdd").state_digest() == mem.state_digest()
    else:
        with pytest.raises(ValueError, match="recomputed on load differs"):
            load(tmp_path / "x.svdd")


# attack: the same huge int given to the constructors
def test_huge_int_parameters_are_refused_by_the_constructors():
    from svattn import SVDD

    with pytest.raises(ValueError, match="C must be"):
        SVDDMemory(C=HUGE)
    with pytest.raises(ValueError, match="gamma must be"):
        SVDDMemory(C=0.5, gamma=HUGE)
    X = np.random.default_rng(0).normal(size=(10, 2))
    with pytest.raises(ValueError, match="C must be"):
        SVDD(C=HUGE).fit(X)
    with pytest.raises(ValueError, match="gamma must be"):
        SVDD(gamma=HUGE).fit(X)


# ------------------------------------------------------- duplicated JSON keys

# attack: a receipt naming a field twice: json.loads keeps the last, a person (or
# another parser) reading the file sees the first: the receipt says two things
def test_a_certificate_naming_a_field_twice_is_refused(certificate):
    text = certificate[1].to_json()
    twice = text[:-1] + ', "removed_id": 7}'
    with pytest.raises(ValueError, match="removed_id"):
        DeletionCertificate.from_json(twice)


def test_an_erasure_receipt_naming_a_field_twice_is_refused(certificate):
    cert = json.loads(certificate[1].to_json())
    r = {"tag_hash": "ab" * 32, "erased_ids": [cert["removed_id"]], "certificates": [cert],
         "copies_kept": {}, "state_digest": "cd" * 32, "n_after": 19}
    text = json.dumps(r)
    twice = text[:-1] + ', "n_after": 18}'
    with pytest.raises(ValueError, match="n_after"):
        ErasureReceipt.from_json(twice)


def test_a_model_receipt_naming_a_field_twice_is_refused(forgot):
    text = forgot[2].to_json()
    twice = text[:-1] + ', "n_forgotten": 3}'
    with pytest.raises(ValueError, match="n_forgotten"):
        ModelErasureReceipt.from_json(twice)


# ------------------------------------------------------------- stream folders

# attack: stream.json without its "digest", the checksum recomputed: KeyError traceback
def test_a_manifest_without_its_digest_is_refused(forgot, tmp_path):
    model, folder, _ = forgot
    copy = tmp_path / "st"
    shutil.copytree(folder, copy)
    man = json.loads((copy / "stream.json").read_text())
    man.pop("digest")
    write_manifest(copy, man)
    with pytest.raises(StreamStateError, match="digest"):
        LMStream.load(copy, model)


# ------------------------------------------------------------ crafted models

def _cell(path: Path, model: CharLM, **meta) -> Path:
    base = {"format": RECALL_CELL, "model_config": json.dumps(model.cfg.to_dict()),
            "run": json.dumps({"task": "mqar", "steps": 1})}
    base.update({k: v for k, v in meta.items() if v is not None})
    for k in [k for k, v in meta.items() if v is None]:
        base.pop(k)
    save_model(model, str(path), metadata=base)
    return path


# attack: a recall cell model (safetensors) with crafted metadata: a model_config that
# is a list or names an unknown field, no run, a run without steps, a config whose
# sizes are not the stored tensors'. Each raised TypeError/KeyError/RuntimeError (a
# traceback from svattn generate / verify-forget / eval)
CELL_EDITS = {
    "config a list": {"model_config": "[1, 2]"},
    "config unknown field": {"model_config": "UNKNOWN"},
    "no run": {"run": None},
    "run a list": {"run": "[]"},
    "run without steps": {"run": "{}"},
    "config of other sizes": {"model_config": "WIDER"},
}


def _crafted(model: CharLM, edit: dict) -> dict:
    cfg = model.cfg.to_dict()
    out = dict(edit)
    if out.get("model_config") == "UNKNOWN":
        out["model_config"] = json.dumps({**cfg, "evil": 1})
    if out.get("model_config") == "WIDER":
        out["model_config"] = json.dumps({**cfg, "n_embd": 32})
    return out


@pytest.mark.parametrize("case", sorted(CELL_EDITS))
def test_a_crafted_cell_model_is_refused(forgot, tmp_path, case):
    path = _cell(tmp_path / "cell.safetensors", forgot[0], **_crafted(forgot[0],
                                                                      CELL_EDITS[case]))
    with pytest.raises(ValueError, match="cell model"):
        load_checkpoint_model(path)


@pytest.mark.parametrize("command", ["generate", "verify-forget"])
def test_cli_on_a_crafted_cell_model_exits_2(forgot, tmp_path, capsys, command):
    model, folder, receipt = forgot
    path = _cell(tmp_path / "cell.safetensors", model, run="{}")
    (tmp_path / "r.json").write_text(receipt.to_json())
    argv = (["generate", str(path), "--prompt", "ab", "-n", "2"] if command == "generate"
            else ["verify-forget", str(path), str(folder), str(tmp_path / "r.json")])
    assert main(argv) == 2
    assert "cell model" in capsys.readouterr().err


# attack: a model_config naming huge sizes (n_embd 2**18: ~1.6e12 parameters) beside
# small tensors: the model was built (terabytes asked of the allocator) before any
# weight was compared. Now its size is counted on the meta device and refused.
def test_a_cell_model_config_naming_huge_sizes_is_refused_before_building(forgot, tmp_path):
    cfg = {**forgot[0].cfg.to_dict(), "n_embd": 1 << 18}
    path = _cell(tmp_path / "cell.safetensors", forgot[0], model_config=json.dumps(cfg))
    with pytest.raises(ValueError, match="parameters"):
        load_checkpoint_model(path)


def test_a_checkpoint_config_naming_huge_sizes_is_refused_before_building(forgot, tmp_path):
    model = forgot[0]
    path = tmp_path / "ckpt.pt"
    torch.save({"format": "svattn.RecallCheckpoint", "step": 1, "model": model.state_dict(),
                "model_config": {**model.cfg.to_dict(), "n_embd": 1 << 18}}, path)
    with pytest.raises(ValueError, match="parameters"):
        load_checkpoint_model(path)


def test_a_checkpoint_whose_model_is_not_tensors_is_refused(forgot, tmp_path):
    model = forgot[0]
    path = tmp_path / "ckpt.pt"
    torch.save({"format": "svattn.RecallCheckpoint", "step": 1, "model": [1, 2],
                "model_config": model.cfg.to_dict()}, path)
    with pytest.raises(ValueError, match="model"):  # held before the review too
        load_checkpoint_model(path)


def test_an_honest_cell_model_still_reads(forgot, tmp_path):
    model = forgot[0]
    path = _cell(tmp_path / "cell.safetensors", model)
    got, cfg, ck = load_checkpoint_model(path)
    assert cfg is None and ck["step"] == 1
    for (n, p), (m, q) in zip(got.state_dict().items(), model.state_dict().items(),
                              strict=True):
        assert n == m and torch.equal(p, q)


def test_verify_forget_still_verifies_the_honest_stream(forgot):
    model, folder, receipt = forgot
    v = verify_forget(LMStream.load(folder, model), receipt)
    # every field checked; an unsigned stream's forget log: its authenticity unchecked
    assert v.ok and v.status == "UNCHECKED" and not v.verdict.unchecked, v.summary()
    assert "is unsigned" in v.verdict.authenticity_line()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))


# ------------------------------------------------------------- checked later

# attack: replay an honest receipt against a forged later state. The stream that forgot
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


# attack (held): a signed receipt of one stream shown with another stream of the same
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


# attack (held): the forget log entry's span edited in stream.json, the chain, the
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


# attack: a symlink planted as the folder's stream.lock: save raised a bare OSError
# (ELOOP; a traceback from svattn generate --save), now a StreamStateError (exit 2);
# the symlink's target is never written
def test_a_symlinked_lock_file_is_refused_by_save(forgot, tmp_path, capsys):
    model = forgot[0]
    target = tmp_path / "target"
    target.write_bytes(b"keep")
    folder = tmp_path / "st"
    folder.mkdir()
    (folder / "stream.lock").symlink_to(target)
    s = model.stream()
    s.feed(text_of(20))
    with pytest.raises(StreamStateError, match="stream.lock"):
        s.save(folder)
    assert target.read_bytes() == b"keep"
    path = _cell(tmp_path / "cell.safetensors", model)
    assert main(["generate", str(path), "--prompt", "abcdefghijkl", "-n", "2", "--forget",
                 "2:6", "--save", str(folder)]) == 2
    assert "stream.lock" in capsys.readouterr().err


# attack: a stream folder whose held text has a byte outside the model's vocabulary
# (the arrays file, its SHA-256, the digest and the checksum recomputed): load took
# it, then forget failed midway with IndexError and left the stream unusable
def test_a_folder_holding_a_byte_outside_the_vocabulary_is_refused(forgot, tmp_path):
    import hashlib

    from safetensors.torch import load as st_load
    from safetensors.torch import save as st_save

    model, folder, _ = forgot
    copy = tmp_path / "st"
    shutil.copytree(folder, copy)
    man = json.loads((copy / "stream.json").read_text())
    path = copy / man["arrays"]["file"]
    arr = st_load(path.read_bytes())
    arr["tokens"][3] = 200
    data = st_save(arr)
    path.write_bytes(data)
    man["arrays"]["sha256"] = hashlib.sha256(data).hexdigest()
    honest = LMStream.load(folder, model)
    honest._tokens[3] = 200
    man["digest"] = honest.digest()  # what the crafted state digests to
    write_manifest(copy, man)
    with pytest.raises(StreamStateError, match="vocabulary"):
        LMStream.load(copy, model)


def _swap_memory(folder: Path, copy: Path, stream: LMStream, fake: SVDDMemory) -> None:
    """``folder`` copied to ``copy`` with layer 0 head 0's memory file replaced by
    ``fake`` (its SHA-256, the digest and the checksum recomputed)."""
    import hashlib

    shutil.copytree(folder, copy)
    man = json.loads((copy / "stream.json").read_text())
    entry = man["layers"][0]["memories"][0]
    (copy / entry["file"]).unlink()
    fake.save(copy / entry["file"])
    entry["sha256"] = hashlib.sha256((copy / entry["file"]).read_bytes()).hexdigest()
    man["digest"] = stream.digest()  # the content digest counts tokens, not their data
    write_manifest(copy, man)


def _fake_memory(mem: SVDDMemory, *, C: float, d: int) -> SVDDMemory:
    rng = np.random.default_rng(0)
    fake = SVDDMemory(C=C, kernel=mem.kernel, gamma=mem.gamma_value)
    n = max(mem.ids) + 1
    fake.extend(rng.normal(size=(n, d)), rng.normal(size=(n, mem.values.shape[1])))
    for t in sorted(set(range(n)) - set(mem.ids)):
        fake.remove(t)
    return fake


# attack: a stream folder whose memory file is another memory with the same token ids
# but keys of another dimension (or another C), its SHA-256 and the digest recomputed:
# load took it; forget then failed midway (ValueError: keys must have dimension 9),
# leaving the stream unusable, and verify_forget raised instead of saying FAILED
@pytest.mark.parametrize("edit", ["dimension", "C"])
def test_a_folder_with_a_memory_of_other_dimensions_is_refused(forgot, tmp_path, edit):
    model, folder, _ = forgot
    honest = LMStream.load(folder, model)
    mem = honest.layers[0].mems[0]
    fake = _fake_memory(mem, C=mem.C if edit == "dimension" else 0.5,
                        d=mem.dim + (1 if edit == "dimension" else 0))
    _swap_memory(folder, tmp_path / "st", honest, fake)
    with pytest.raises(StreamStateError, match="layer 0 head 0"):
        LMStream.load(tmp_path / "st", model)


# ------------------------------------------------------------ deep JSON nesting

DEEP = '{"a":' * 100_000 + "1" + "}" * 100_000


# attack: a receipt JSON nested 100,000 deep: json.loads raised RecursionError (a
# traceback from verify-deletion / verify-erasure / verify-forget), not a refusal
@pytest.mark.parametrize("kind", [DeletionCertificate, ErasureReceipt, ModelErasureReceipt])
def test_a_deeply_nested_receipt_is_refused(kind):
    with pytest.raises(ValueError, match="nested too deeply"):
        kind.from_json(DEEP)


def test_cli_verify_deletion_on_a_deeply_nested_certificate_exits_2(certificate, tmp_path,
                                                                    capsys):
    save(certificate[0], tmp_path / "state.svdd")
    (tmp_path / "cert.json").write_text(DEEP)
    assert main(["verify-deletion", str(tmp_path / "state.svdd"),
                 str(tmp_path / "cert.json")]) == 2
    assert "nested too deeply" in capsys.readouterr().err


# attack: the same nesting in a stream manifest, an audit log's record, a state file's
# metadata and a cell model's config
def test_deeply_nested_json_in_files_is_refused(forgot, certificate, tmp_path):
    from safetensors.numpy import safe_open
    from safetensors.numpy import save as np_save

    from svattn.exact.auditor.persist import load
    from svattn.exact.records.audit import verify_chain

    model, folder, _ = forgot
    copy = tmp_path / "st"
    shutil.copytree(folder, copy)
    (copy / "stream.json").write_text(DEEP)
    with pytest.raises(StreamStateError):
        LMStream.load(copy, model)

    log = tmp_path / "audit.jsonl"
    mem = SVDDMemory(C=0.2, audit_log=log)
    mem.extend(np.random.default_rng(0).normal(size=(5, 2)))
    with open(log, "a") as fh:
        fh.write(DEEP + "\n")
    rep = verify_chain(log)
    assert not rep.ok and "not valid JSON" in rep.error

    save(certificate[0], tmp_path / "m.svdd")
    with safe_open(str(tmp_path / "m.svdd"), "numpy") as fh:
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118
    (tmp_path / "x.svdd").write_bytes(np_save(tensors, metadata={"svattn": DEEP}))
    with pytest.raises(ValueError, match="metadata"):
        load(tmp_path / "x.svdd")

    path = _cell(tmp_path / "cell.safetensors", model, model_config=DEEP)
    with pytest.raises(ValueError, match="cell model"):
        load_checkpoint_model(path)


# attack: a signing stream saved and loaded: LMStream.load takes no signing key and the
# folder records none, so every later forget issues an unsigned receipt (verify-forget
# --public-key then says FAILED: "not signed"), and nothing could refuse a wrong key as
# SVDDMemory.load does (#35 item 9). Now the manifest records the signer's fingerprint
# and LMStream.load(..., signing_key=) refuses another controller's key
def test_a_loaded_signing_stream_keeps_signing(forgot, tmp_path):
    from svattn.exact.records.signing import generate_key

    model, key = forgot[0], generate_key()
    s = model.stream(signing_key=key)
    s.feed(text_of(40))
    s.forget(10, 14)
    s.save(tmp_path / "st")
    with pytest.raises(ValueError):
        LMStream.load(tmp_path / "st", model, signing_key=generate_key())
    t = LMStream.load(tmp_path / "st", model, signing_key=key)
    receipt = t.forget(20, 22).receipt
    assert verify_forget(t, receipt, public_key=key.public_key()).status == "VERIFIED"
    t.save(tmp_path / "st")  # the fingerprint is kept across saves
    assert LMStream.load(tmp_path / "st", model, signing_key=key)._signing_key is not None
    assert LMStream.load(tmp_path / "st", model)._signing_key is None  # reads unsigned


# attack: after an honest forget, a reserve token (alpha 0) of each layer's first memory
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


# attack: after an honest forget, the cached key / value / rotated-key rows of position
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


# attack: a NaN planted in a cached row of position 0: max() keeps the first of (0.0,
# NaN), so the deviation stayed 0 and passed "<= tol"
def test_a_nan_planted_in_a_cached_row_fails():
    model = tiny_model()
    s = model.stream()
    s.feed(text_of(40))
    receipt = s.forget(10, 14).receipt
    s.layers[1].k.buf[0, 0, 0] = float("nan")
    v = verify_forget(s, receipt)
    assert v.status == "FAILED", v.summary()


# attack (held): stream.json naming state files in another folder (a relative path, an
# absolute one), its checksum recomputed: refused before anything is read or removed
@pytest.mark.parametrize("name", ["../other/arrays.0123456789ab.safetensors",
                                  "/tmp/arrays.0123456789ab.safetensors",
                                  "arrays.0123456789ab.safetensors/../../x"])
def test_a_manifest_naming_files_elsewhere_is_refused(forgot, tmp_path, name):
    model, folder, _ = forgot
    copy = tmp_path / "st"
    shutil.copytree(folder, copy)
    man = json.loads((copy / "stream.json").read_text())
    man["arrays"]["file"] = name
    write_manifest(copy, man)
    with pytest.raises(StreamStateError):
        LMStream.load(copy, model)


# attack (held): a state file of the folder replaced by a symlink to a file elsewhere
# holding the same bytes, then a save: the symlink is unlinked, its target untouched
def test_a_symlinked_state_file_is_unlinked_not_followed(forgot, tmp_path):
    model, folder, _ = forgot
    copy = tmp_path / "st"
    shutil.copytree(folder, copy)
    man = json.loads((copy / "stream.json").read_text())
    name = man["arrays"]["file"]
    outside = tmp_path / "outside.safetensors"
    outside.write_bytes((copy / name).read_bytes())
    (copy / name).unlink()
    (copy / name).symlink_to(outside)
    s = LMStream.load(copy, model)  # same bytes: the checksum holds
    before = outside.read_bytes()
    s.save(copy)
    assert outside.read_bytes() == before and not (copy / name).exists()


# attack: --tol inf: every float comparison of verify-forget (logits, readouts, keys,
# caches) passes, and it printed VERIFIED (exit 0) whatever the floats held; a
# tolerance must be finite (verify-deletion / verify-erasure share the parser)
@pytest.mark.parametrize("command", ["verify-forget", "verify-deletion", "verify-erasure"])
def test_an_infinite_tolerance_is_a_usage_error(forgot, tmp_path, capsys, command):
    model, folder, receipt = forgot
    path = _cell(tmp_path / "cell.safetensors", model)
    (tmp_path / "r.json").write_text(receipt.to_json())
    argv = {"verify-forget": [str(path), str(folder)], "verify-deletion": [str(path)],
            "verify-erasure": [str(path)]}[command]
    with pytest.raises(SystemExit) as exc:
        main([command, *argv, str(tmp_path / "r.json"), "--tol", "inf"])
    assert exc.value.code == 2
    assert "finite" in capsys.readouterr().err


def _rehashed_log(src: Path, dst: Path, edit) -> None:
    """``src``'s records with ``edit(records)`` applied, the chain re-hashed from the
    first edited record on (an unkeyed chain: anyone can)."""
    import hashlib

    from svattn.exact.records.audit import canonical, record_hash

    recs = [json.loads(line) for line in src.read_text().splitlines()]
    first = edit(recs)
    prev = hashlib.sha256(canonical(recs[first - 1]).encode()).hexdigest()
    for rec in recs[first:]:
        rec["prev"] = prev
        rec["sha256"] = record_hash(rec)
        prev = hashlib.sha256(canonical(rec).encode()).hexdigest()
    dst.write_text("".join(canonical(r) + "\n" for r in recs))
    from svattn.exact.records.openings import openings_path

    if openings_path(src).exists():  # the openings, beside it (by record index)
        openings_path(dst).write_bytes(openings_path(src).read_bytes())


# attack: an audit log whose erase (or remove) record lacks its digest, the chain
# re-hashed: verify_chain accepts it, and verify_erasure / verify_deletion --log raised
# KeyError (a traceback); now the missing digest is a mismatch
def test_a_rehashed_log_record_without_its_digest_fails(tmp_path):
    from svattn.exact.auditor.verify import verify_deletion, verify_erasure
    from svattn.exact.records.audit import verify_chain
    from svattn.exact.records.signing import generate_key

    log = tmp_path / "audit.jsonl"
    mem = SVDDMemory(0.2, audit_log=log, signing_key=generate_key())
    mem.extend(np.random.default_rng(0).normal(size=(20, 2)), tags=["a"] * 3 + ["b"] * 17)
    receipt = mem.erase("a")

    def drop(op):
        def edit(recs):
            k = max(i for i, r in enumerate(recs) if r["op"] == op)
            recs[k].pop("digest")
            return k
        return edit

    _rehashed_log(log, tmp_path / "e.jsonl", drop("erase"))
    assert verify_chain(tmp_path / "e.jsonl").ok
    v = verify_erasure(mem, receipt, log=tmp_path / "e.jsonl", retrain=False)
    assert v.status == "FAILED" and any("state_digest" in r for r in v.reasons)

    mem.extend(np.random.default_rng(1).normal(size=(3, 2)))  # moved on: checked later
    cert = receipt.deletion_certificates()[-1]
    _rehashed_log(log, tmp_path / "r.jsonl", drop("remove"))
    if verify_chain(tmp_path / "r.jsonl").ok:  # (the chain may itself refuse it)
        v = verify_deletion(mem, cert, retrain=False, log=tmp_path / "r.jsonl")
        assert v.status == "FAILED"


# attack: the manifest's model_config edited (any value: a string for C, a huge
# vocab_size), the checksum recomputed: load never read it, so the folder loaded and
# verify-forget said VERIFIED beside a config that names another model
@pytest.mark.parametrize("edit", [("vocab_size", 2**63), ("dropout", [1, 2]), ("rope", None)])
def test_a_manifest_with_an_edited_model_config_is_refused(forgot, tmp_path, edit):
    model, folder, _ = forgot
    copy = tmp_path / "st"
    shutil.copytree(folder, copy)
    man = json.loads((copy / "stream.json").read_text())
    man["model_config"][edit[0]] = edit[1]
    write_manifest(copy, man)
    with pytest.raises(StreamStateError, match="model_config"):
        LMStream.load(copy, model)
