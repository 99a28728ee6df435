"""JSON crafted to crash its reader or to be read two ways, in receipts and in the files
svattn reads: a number past the float range (10**400), a field named twice, nesting
100,000 deep. Each is refused with a ValueError naming what is wrong (a state file's
error, a stream folder's StreamStateError), and on the command line with exit 2 and one
line, never a traceback. Each case was accepted, or crashed, before its refusal; a
comment above each test says what it did.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from exact_helpers import HUGE
from stream_helpers import cell_model
from svattn.cli import main
from svattn.exact import DeletionCertificate, SVDDMemory
from svattn.exact.auditor.persist import save
from svattn.exact.records.certificate import ErasureReceipt
from svattn.lm.forget import ModelErasureReceipt
from svattn.lm.stream import LMStream, StreamStateError
from svattn.lm.train import load_checkpoint_model

# ----------------------------------------------- huge ints where a number goes

# a JSON int past the float range (10**400) in a certificate's C, gamma or
# KKT residual: math.isfinite raised OverflowError (a traceback, exit 1), not a refusal
@pytest.mark.parametrize("name", ["C", "gamma", "kkt_residual_after"])
def test_huge_int_in_a_certificate_is_refused(certificate, name):
    d = json.loads(certificate[1].to_json())
    d[name] = HUGE
    with pytest.raises(ValueError, match=name):
        DeletionCertificate.from_json(json.dumps(d))


# the same inside an erasure receipt's certificate
def test_huge_int_in_an_erasure_receipts_certificate_is_refused(certificate):
    cert = json.loads(certificate[1].to_json())
    cert["C"] = HUGE
    r = {"tag_hash": "ab" * 32, "erased_ids": [cert["removed_id"]], "certificates": [cert],
         "copies_kept": {}, "state_digest": "cd" * 32, "n_after": 19}
    with pytest.raises(ValueError, match="certificates"):
        ErasureReceipt.from_json(json.dumps(r))


# huge ints in a model receipt's wall times and KKT residuals
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


# verify-deletion on a certificate with a huge C: exit 2, no traceback
def test_cli_verify_deletion_huge_int_exits_2(certificate, tmp_path, capsys):
    mem, cert = certificate
    save(mem, tmp_path / "state.svdd")
    d = json.loads(cert.to_json())
    d["C"] = HUGE
    (tmp_path / "cert.json").write_text(json.dumps(d))
    assert main(["verify-deletion", str(tmp_path / "state.svdd"),
                 str(tmp_path / "cert.json")]) == 2
    assert "C must be a number" in capsys.readouterr().err


# ------------------------------------------------------- duplicated JSON keys

# a receipt naming a field twice: json.loads keeps the last, a person (or
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


# ------------------------------------------------------------ deep JSON nesting

DEEP = '{"a":' * 100_000 + "1" + "}" * 100_000


# a receipt JSON nested 100,000 deep: json.loads raised RecursionError (a
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


# the same nesting in a stream manifest, an audit log's record, a state file's
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

    path = cell_model(tmp_path / "cell.safetensors", model, model_config=DEEP)
    with pytest.raises(ValueError, match="cell model"):
        load_checkpoint_model(path)
