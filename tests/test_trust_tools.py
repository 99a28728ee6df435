"""The trust benchmarks run (tiny sizes), so they cannot rot; their figures are made
by the full runs (results/trust/, the commands inside)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from script_helpers import load_script

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.slow  # the campaign's record is results/trust/fuzz_campaign.json
def test_fuzz_campaign_runs_and_finds_nothing_on_a_small_campaign(tmp_path):
    fuzz = load_script("benchmarks/fuzz_campaign.py")
    out = tmp_path / "fuzz.json"
    assert fuzz.main(["--streams", "6", "--ops", "8", "--kills", "1", "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["command"].startswith("python benchmarks/fuzz_campaign.py")
    # (an erase of a subject with no live token is skipped, not counted)
    assert r["operations"] == sum(r["ops"].values()) >= 30 and r["save_load_failed"] == []
    assert r["faults_survived"] == r["faults_injected"]
    assert r["killed_saves"]["erased_bytes_found"] == 0
    assert r["killed_saves"]["leftovers_after_next_save"] == 0
    assert r["max_alpha_dev_other"] <= 1e-8 and r["max_kkt_on_reference_gram"] <= 1e-10
    # the wrappers are gone: the backends are the modules' own functions again
    from svattn.exact.backends import compiled
    assert compiled.drive.__name__ == "drive" and compiled.drive.__qualname__ != "wrapped"


def test_the_fuzz_reference_is_exact_and_its_kkt_check_catches_a_wrong_alpha():
    import numpy as np

    fuzz = load_script("benchmarks/fuzz_campaign.py")
    from svattn.exact import solve_svdd

    x = np.random.default_rng(0).normal(size=(60, 3))
    K = fuzz.gram(x, "rbf", 1 / 3)
    a = fuzz.reference_alpha(K, 0.1)
    assert np.max(np.abs(a - solve_svdd(K, 0.1))) <= 1e-12
    assert fuzz.kkt_violation(K, 0.1, a) <= 1e-12
    M = np.flatnonzero((a > 1e-9) & (a < 0.1 - 1e-9))
    wrong = a.copy()
    wrong[M[0]] += 1e-6
    wrong[M[1]] -= 1e-6
    assert fuzz.kkt_violation(K, 0.1, wrong) > 1e-8


def test_trust_report_writes_every_section(tmp_path):
    report = load_script("scripts/trust_report.py")
    for name in ("fuzz_campaign.json", "tamper_matrix.json", "erase_cost.json"):
        src = REPO / "results" / "trust" / name
        if src.exists():
            (tmp_path / name).write_text(src.read_text())
    assert report.main(["--dir", str(tmp_path)]) == 0
    text = (tmp_path / "README.md").read_text()
    assert "Fuzz campaign" in text and "Tamper matrix" in text


def test_the_tamper_matrix_log_and_proof_rows_refuse_every_forgery(tmp_path):
    """The tamper matrix's log rows (each record edited, re-chained, the checkpoint
    recomputed, an erase appended) and proof rows (mutants of each receipt's
    .tlog-proof), on a small signed memory: every one refused with the key, none
    verified without it, every proof mutant refused."""
    import numpy as np

    from svattn.exact import SVDDMemory
    from svattn.exact.records.signing import generate_key

    tm = load_script("benchmarks/tamper_matrix.py")
    key = generate_key()
    log, state = tmp_path / "audit.jsonl", tmp_path / "m.safetensors"
    mem = SVDDMemory(0.2, audit_log=log, signing_key=key)
    ids = mem.extend(np.random.default_rng(0).normal(size=(12, 3)), tags=["a"] * 3 + [None] * 9)
    receipt = mem.erase("a")
    cert = mem.remove(ids[8])
    mem.save(state)
    rows = tm.log_records(log, state, key)
    assert rows["edited_chain_rehashed"]["tried"] == len(log.read_text().splitlines())
    for name, row in rows.items():
        assert row["failed_with_key"] == row["not_verified_without_key"] == row["tried"] > 0, name
        assert row["failed_with_key_without_state"] == row["tried"], name
    # the chain alone misses a re-chained edit; the log's signed checkpoint catches it
    assert rows["edited_chain_rehashed"]["chain_alone"] == 0
    sources = [("DeletionCertificate", tm.write_receipt(tmp_path / "c.json", cert), log),
               ("ErasureReceipt", tm.write_receipt(tmp_path / "e.json", receipt), log)]
    for kind, row in tm.proof_matrix(sources, key, tmp_path).items():
        assert row["detected"] == row["tried"] > row["entry_bytes"], kind
    mem.close_audit_log()
