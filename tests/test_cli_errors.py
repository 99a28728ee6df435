"""Every usage error of the command line: input → exit status and the words of its one line.

Exit 2 is a usage error (one line on stderr, ``svattn CMD: error: ...``, never a
traceback; a malformed receipt is one); exit 1 a check that ran and failed; exit 3 a
verification where nothing failed but some receipt field was not checked (issue #35:
never a bare VERIFIED over an unchecked field). Each row is a case a new user hit
(issue #23). Placeholders in ``argv`` (``{state}``, ``{dir}``, ...) are files made
once by the ``files`` fixture.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from stream_helpers import cell_model
from svattn.cli import main
from svattn.exact import SVDDMemory

TINY = {"model": "tiny", "mixer": "hybrid_sv", "model_overrides": {"block_size": 32},
        "hybrid": {"chunk": 16, "C": 0.0625, "budget": 16}, "steps": 2, "batch_size": 4,
        "warmup": 1, "final_eval": False, "progress": False, "threads": 1}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("cli_errors")
    rng = np.random.default_rng(0)
    mem = SVDDMemory(C=0.1, audit_log=tmp / "log.jsonl")
    ids = mem.extend(rng.normal(size=(40, 3)))
    (tmp / "cert.json").write_text(mem.remove(ids[2]).to_json())
    mem.save(tmp / "state.safetensors")
    other = SVDDMemory(C=0.2)  # another C: the certificate's parameters differ
    other.extend(rng.normal(size=(40, 3)))
    other.save(tmp / "other_c.safetensors")
    other = SVDDMemory(C=0.1, gamma=3.0)  # another gamma
    other.extend(rng.normal(size=(40, 3)))
    other.save(tmp / "other_gamma.safetensors")
    (tmp / "trunc.safetensors").write_bytes((tmp / "state.safetensors").read_bytes()[:300])
    (tmp / "dir").mkdir()
    (tmp / "list.json").write_text("[1, 2]")
    (tmp / "ten.json").write_text(json.dumps({**TINY, "steps": "ten"}))
    (tmp / "tiny.json").write_text(json.dumps(TINY))
    (tmp / "file.txt").write_text("a file, not a folder\n")
    (tmp / "script.py").write_text("print('not a state file')\n")
    _stream_files(tmp)
    _erasure_files(tmp, rng)
    return {p.stem: p for p in tmp.iterdir()} | {"tmp": tmp}


def _stream_files(tmp: Path) -> None:
    """Two tiny hybrid checkpoints (policies "full" and "support"), a saved stream after a
    forget, its receipt, and the receipt of another forget (for generate, verify-forget)."""
    from svattn.lm import CharLM, CharLMConfig
    from svattn.lm.train import TrainConfig

    torch.manual_seed(0)
    for policy in ("full", "support"):
        cfg = CharLMConfig(n_layer=1, n_embd=16, n_head=2, block_size=64, mixer="hybrid_sv",
                           mixer_options={"chunk": 8, "C": 0.25, "policy": policy, "budget": 8})
        model = CharLM(cfg)
        torch.save({"config": TrainConfig().to_dict(), "model_config": cfg.to_dict(),
                    "model": model.state_dict(), "step": 0}, tmp / f"hyb_{policy}.pt")
    s, other = model.stream(full_policy=True), model.stream(full_policy=True)
    s.feed(b"the cat sat on the mat, the dog sat on the log")
    other.feed(s.text)
    receipt = json.loads(s.forget(4, 8).receipt.to_json())
    (tmp / "receipt.json").write_text(json.dumps(receipt))
    (tmp / "receipt_other.json").write_text(other.forget(4, 9).receipt.to_json())
    s.save(tmp / "stream")
    # malformed receipts (issue #35): each must be refused in one line, exit 2
    cert = receipt["memories"][0]["span_certificates"][0]
    for name, edit in (("mem_empty", {"memories": [{}]}), ("mem_str", {"memories": "abc"}),
                       ("span_str", {"fed_span": "4:8"}),
                       ("cert_unknown", {"memories": [{**receipt["memories"][0],
                                                       "span_certificates": [
                                                           {**cert, "extra": 1}]}]})):
        (tmp / f"receipt_{name}.json").write_text(json.dumps({**receipt, **edit}))


def _erasure_files(tmp: Path, rng: np.random.Generator) -> None:
    """A signed, logged memory after one erasure: its state, log, key, the receipt, and
    the receipt with a malformed certificate."""
    from svattn.exact.records.signing import write_keypair

    key, pub = write_keypair(tmp / "ctl")
    (tmp / "ctl_pub.pem").write_bytes(pub.read_bytes())
    mem = SVDDMemory(C=0.1, audit_log=tmp / "elog.jsonl", signing_key=key)
    mem.extend(rng.normal(size=(30, 3)), tags=["a"] * 5 + ["b"] * 25)
    receipt = mem.erase("a")
    mem.save(tmp / "estate.safetensors")
    (tmp / "ereceipt.json").write_text(receipt.to_json())
    bad = json.loads(receipt.to_json())
    bad["certificates"][1] = {}
    (tmp / "ereceipt_bad.json").write_text(json.dumps(bad))


def _fmt(argv: list[str], files: dict[str, Path]) -> list[str]:
    out = []
    for arg in argv:
        for name, path in files.items():
            arg = arg.replace("{" + name + "}", str(path))
        out.append(arg)
    return out


TRAIN = ["train", "{tiny}", "--set", "out_dir={tmp}/run"]
CASES = [
    # (id, argv, exit status, words the message must contain)
    ("verify-deletion-state-dir", ["verify-deletion", "{dir}", "{cert}"], 2,
     ["STATE", "is a directory"]),
    ("verify-deletion-cert-dir", ["verify-deletion", "{state}", "{dir}"], 2,
     ["CERTIFICATE", "is a directory"]),
    ("verify-deletion-log-dir", ["verify-deletion", "{state}", "{cert}", "--log", "{dir}"], 2,
     ["--log", "is a directory"]),
    ("verify-deletion-log-not-a-log",
     ["verify-deletion", "{state}", "{cert}", "--log", "{cert}"], 2,
     ["not an svattn audit log"]),
    ("verify-deletion-foreign-file", ["verify-deletion", "{script}", "{cert}"], 2,
     ["not a state file", "not safetensors"]),
    ("verify-deletion-other-C", ["verify-deletion", "{other_c}", "{cert}"], 1,
     ["parameters DIFFER", "C: the certificate says 0.1, the memory has 0.2"]),
    ("verify-deletion-other-gamma", ["verify-deletion", "{other_gamma}", "{cert}"], 1,
     ["parameters DIFFER", "gamma: the certificate says"]),
    ("verify-deletion-commit-key-dir",
     ["verify-deletion", "{state}", "{cert}", "--commit-key", "{dir}"], 2,
     ["--commit-key", "is a directory"]),
    ("verify-deletion-commit-key-not-a-key",
     ["verify-deletion", "{state}", "{cert}", "--commit-key", "{cert}"], 2,
     ["not a commitment key"]),
    ("audit-log-dir", ["audit", "verify", "{dir}"], 2, ["LOG", "is a directory"]),
    ("audit-state-dir", ["audit", "verify", "{log}", "{dir}"], 2, ["STATE", "is a directory"]),
    ("audit-json-not-a-log", ["audit", "verify", "{cert}"], 2,
     ["LOG", "not an svattn audit log"]),
    ("audit-truncated-state", ["audit", "verify", "{log}", "{trunc}"], 2,
     ["STATE", "truncated"]),
    ("eval-memory-state", ["eval", "{state}"], 2,
     ["not a checkpoint of svattn train", "SV memory state file"]),
    ("eval-script", ["eval", "{script}"], 2, ["not a checkpoint", "not a torch.save archive"]),
    ("train-json-list", ["train", "{list}"], 2, ["CONFIG", "JSON list", "JSON object"]),
    ("train-steps-abc", [*TRAIN, "--set", "steps=abc"], 2, ["steps must be an int >= 1", "'abc'"]),
    ("train-steps-ten", ["train", "{ten}"], 2, ["steps must be an int >= 1", "'ten'"]),
    ("train-batch-size-0", [*TRAIN, "--set", "batch_size=0"], 2,
     ["batch_size must be an int >= 1, got 0"]),
    ("train-hybrid-C-negative", [*TRAIN, "--set", 'hybrid={"C": -1}'], 2,
     ["hybrid:", "C must be", "-1"]),
    ("train-hybrid-dotted-unknown", [*TRAIN, "--set", "hybrid.Cx=1"], 2,
     ["hybrid:", "'Cx'"]),
    ("train-dotted-through-number", [*TRAIN, "--set", "steps.x=1"], 2,
     ["--set steps.x", "steps is 2, not a mapping"]),
    ("train-missing-data", [*TRAIN, "--set", "data=no/such/enwik8"], 2,
     ["data: enwik8 file not found", "--set data=PATH"]),
    ("train-data-flag-missing", [*TRAIN, "--data", "no/such/enwik8"], 2,
     ["data: enwik8 file not found: no/such/enwik8"]),
    ("train-model-overrides-unknown", [*TRAIN, "--set", "model_overrides.rop=true"], 2,
     ["model_overrides:", "rop"]),
    ("train-config-not-json", ["train", "{script}"], 2, ["CONFIG", "not valid JSON"]),
    ("reproduce-out-is-file", ["reproduce", "--quick", "--out", "{file}"], 2,
     ["--out", "is a file"]),
    ("demo-out-is-file", ["demo", "--stays", "1", "--out", "{file}"], 2,
     ["out:", "is a file"]),
    ("train-record-not-a-list", [*TRAIN, "--record", "{cert}"], 2,
     ["--record", "not the list of records"]),
    ("collect-not-a-run", ["collect", "{dir}", "--into", "{tmp}/lm.json"], 2,
     ["RUN_DIR", "no log.jsonl"]),
    ("recall-unknown-grid", ["recall", "run", "--grid", "huge", "--out", "{tmp}/r"], 2,
     ["--grid must be one of", "'huge'"]),
    ("recall-only-unknown-field", ["recall", "run", "--grid", "quick", "--only", "colour=red",
                                   "--out", "{tmp}/r"], 2, ["--only", "'colour'"]),
    ("recall-collect-empty", ["recall", "collect", "--runs", "{dir}", "--into",
                              "{tmp}/recall.json"], 2, ["runs:", "no finished cell"]),
    ("generate-support-policy", ["generate", "{hyb_support}", "--prompt", "hi"], 2,
     ["policy 'support'", "--full-policy"]),
    ("generate-forget-past-prompt", ["generate", "{hyb_full}", "--prompt", "hello", "--forget",
                                     "3:9"], 2, ["--forget 3:9", "prompt's 5 bytes"]),
    ("generate-empty-prompt", ["generate", "{hyb_full}", "--prompt", ""], 2,
     ["prompt is empty"]),
    ("generate-receipt-without-forget", ["generate", "{hyb_full}", "--prompt", "hi",
                                         "--receipt", "{tmp}/r.json"], 2, ["give --forget"]),
    ("generate-memory-state", ["generate", "{state}", "--prompt", "hi"], 2,
     ["not a checkpoint of svattn train"]),
    ("generate-negative-temperature", ["generate", "{hyb_full}", "--prompt", "hi",
                                       "--temperature", "-1"], 2, ["--temperature", ">= 0"]),
    ("verify-forget-no-folder", ["verify-forget", "{hyb_full}", "{tmp}/none", "{receipt}"], 2,
     ["STREAM: no such folder"]),
    ("verify-forget-not-a-receipt", ["verify-forget", "{hyb_full}", "{stream}", "{list}"], 2,
     ["receipt: not a svattn.ModelErasureReceipt"]),
    ("verify-forget-not-a-stream", ["verify-forget", "{hyb_full}", "{dir}", "{receipt}"], 2,
     ["no saved stream"]),
    ("verify-forget-other-model", ["verify-forget", "{hyb_full}", "{stream}", "{receipt}"], 2,
     ["read by the model with digest"]),
    ("verify-forget-memories-empty", ["verify-forget", "{hyb_support}", "{stream}",
                                      "{receipt_mem_empty}"], 2, ["memories[0] must be"]),
    ("verify-forget-memories-str", ["verify-forget", "{hyb_support}", "{stream}",
                                    "{receipt_mem_str}"], 2, ["memories must be a list"]),
    ("verify-forget-span-str", ["verify-forget", "{hyb_support}", "{stream}",
                                "{receipt_span_str}"], 2, ["fed_span must be"]),
    ("verify-forget-cert-unknown-field", ["verify-forget", "{hyb_support}", "{stream}",
                                          "{receipt_cert_unknown}"], 2,
     ["span_certificates[0]", "unknown fields ['extra']"]),
    ("verify-deletion-unchecked", ["verify-deletion", "{state}", "{cert}"], 3,
     ["UNCHECKED", "commitment", "--log", "--public-key"]),
    ("verify-deletion-with-log", ["verify-deletion", "{state}", "{cert}", "--log", "{log}"], 3,
     ["audit log UNCHECKED: log.jsonl.checkpoint is unsigned",
      "verdict:             UNCHECKED: the audit log's authenticity",
      "receipt's fields all checked and held"]),
    ("verify-erasure-logged", ["verify-erasure", "{estate}", "{ereceipt}", "--log", "{elog}"],
     3, ["the signature of elog.jsonl.checkpoint", "5 certificates checked"]),
    ("verify-erasure-logged-signed", ["verify-erasure", "{estate}", "{ereceipt}", "--log",
                                      "{elog}", "--public-key", "{ctl_pub}"],
     0, ["verdict:             VERIFIED", "audit log checked: elog.jsonl.checkpoint is signed"]),
    ("verify-erasure-signed", ["verify-erasure", "{estate}", "{ereceipt}", "--public-key",
                               "{ctl_pub}"], 0, ["verdict:             VERIFIED"]),
    ("verify-erasure-state-only", ["verify-erasure", "{estate}", "{ereceipt}"], 3,
     ["UNCHECKED", "tag_hash", "--log"]),
    ("verify-erasure-malformed", ["verify-erasure", "{estate}", "{ereceipt_bad}"], 2,
     ["certificates[1]", "missing fields"]),
    ("verify-erasure-other-state", ["verify-erasure", "{state}", "{ereceipt}"], 1,
     ["FAILED"]),
    ("verify-forget-other-receipt", ["verify-forget", "{hyb_support}", "{stream}",
                                     "{receipt_other}"], 1, ["FAILED", "fed_span"]),
    ("verify-forget-ok", ["verify-forget", "{hyb_support}", "{stream}", "{receipt}"], 3,
     ["UNCHECKED: nothing failed and the stream equals a fresh stream",
      "span certificates checked: 8", "the forget log's authenticity"]),
]


@pytest.mark.parametrize(("argv", "status", "words"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_cli_error_table(argv, status, words, files, capsys) -> None:
    assert main(_fmt(argv, files)) == status
    captured = capsys.readouterr()
    if status == 2:
        err = captured.err.strip()
        assert len(err.splitlines()) == 1 and err.startswith("svattn ") and ": error: " in err
        assert "Traceback" not in captured.err
    else:
        err = captured.out
        assert status != 3 or "VERIFIED" not in err  # never a bare VERIFIED over unchecked
    for word in words:
        assert word in err, (word, err)
    assert not (files["tmp"] / "run").exists()  # a refused config leaves no run folder


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a torch build without CUDA")
def test_train_cuda_on_a_cpu_build(files, capsys) -> None:
    assert main(_fmt([*TRAIN, "--set", "device=cuda"], files)) == 2
    err = capsys.readouterr().err
    assert "device: 'cuda' asked" in err and "no usable CUDA" in err
    assert not (files["tmp"] / "run").exists()


def test_audit_wording(files, capsys) -> None:
    """One certificate is "1 deletion certificate"; a state that does not load names no
    record (was "BROKEN at record None")."""
    from svattn.exact.auditor.verify import verify_log

    assert main(_fmt(["audit", "verify", "{log}", "{state}"], files)) == 3  # unsigned
    out = capsys.readouterr().out
    assert "1 deletion certificate consistent" in out and "certificates" not in out
    summary = verify_log(files["log"], files["trunc"]).summary()
    assert summary.startswith("BROKEN: state ") and "truncated" in summary
    assert "None" not in summary


def test_help_and_usage_errors_import_no_torch() -> None:
    """``svattn --help``, every ``svattn CMD --help`` and argparse's usage errors parse
    without importing torch, numba or scipy (each costs seconds before the first word)."""
    import subprocess
    import sys

    code = """
import sys
from svattn.cli import COMMANDS, main
calls = [["--help"], ["demo", "--bogus"], ["recall", "run", "--help"],
         ["recall", "collect", "--help"], ["recall", "time", "--help"]]
calls += [[c.name, "--help"] for c in COMMANDS]
for argv in calls:
    try:
        main(argv)
    except SystemExit:
        pass
print(sorted(m for m in ("torch", "numba", "scipy", "sklearn") if m in sys.modules))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-2000:]


# --tol inf: every float comparison of verify-forget (logits, readouts, keys,
# caches) passes, and it printed VERIFIED (exit 0) whatever the floats held; a
# tolerance must be finite (verify-deletion / verify-erasure share the parser)
@pytest.mark.parametrize("command", ["verify-forget", "verify-deletion", "verify-erasure"])
def test_an_infinite_tolerance_is_a_usage_error(forgot, tmp_path, capsys, command):
    model, folder, receipt = forgot
    path = cell_model(tmp_path / "cell.safetensors", model)
    (tmp_path / "r.json").write_text(receipt.to_json())
    argv = {"verify-forget": [str(path), str(folder)], "verify-deletion": [str(path)],
            "verify-erasure": [str(path)]}[command]
    with pytest.raises(SystemExit) as exc:
        main([command, *argv, str(tmp_path / "r.json"), "--tol", "inf"])
    assert exc.value.code == 2
    assert "finite" in capsys.readouterr().err
