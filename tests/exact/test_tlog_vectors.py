"""The mutation vectors (tests/exact/data/tlog_vectors.json, written by
scripts/make_tlog_vectors.py): every valid proof accepted, every mutant refused with its
verdict by svattn, and refused by Go's golang.org/x/mod/sumdb verifier too."""

from __future__ import annotations

import base64
import json
from collections import Counter
from pathlib import Path

import pytest

from script_helpers import load_script
from svattn.exact.records.note import NoteVerifier, TlogError
from svattn.exact.records.tlog import (
    parse_consistency_proof,
    verify_consistency_between,
    verify_proof,
)

DATA = Path(__file__).parent / "data" / "tlog_vectors.json"


@pytest.fixture(scope="module")
def vectors():
    return json.loads(DATA.read_text())


def _svattn_verdict(vec: dict, keys: list[NoteVerifier]) -> str:
    try:
        if vec["kind"] == "inclusion":
            verify_proof(vec["proof"], base64.b64decode(vec["entry"]), keys)
        else:
            verify_consistency_between(vec["old"], vec["new"],
                                       parse_consistency_proof(vec["proof"]), keys)
    except TlogError as exc:
        return exc.verdict.value
    return "accepted"


def test_the_vectors_are_what_the_script_writes(vectors):
    script = load_script("scripts/make_tlog_vectors.py")
    assert script.vectors() == vectors, f"regenerate: {vectors['command']}"


def test_every_vector_gets_its_verdict(vectors):
    keys = [NoteVerifier.from_string(vectors["vkey"])]
    got = {v["name"]: _svattn_verdict(v, keys) for v in vectors["vectors"]}
    wrong = {n: (got[n], v["expect"]) for v in vectors["vectors"]
             if got[(n := v["name"])] != v["expect"]}
    assert not wrong, wrong
    kinds = Counter(v["expect"] for v in vectors["vectors"])
    # every family is represented, and the mutants outnumber the valid proofs
    assert set(kinds) == {"accepted", "malformed", "bad signature", "unknown key",
                          "inclusion failed", "consistency failed"}
    assert sum(kinds.values()) - kinds["accepted"] > 10 * kinds["accepted"]


def test_go_accepts_the_valid_vectors_and_refuses_every_mutant(go_tlog, vectors):
    accepted_mutants, refused_valid = [], []
    for v in vectors["vectors"]:
        if v["kind"] == "inclusion":
            ok, out = go_tlog.run("proof", vectors["vkey"], v["proof"],
                                  base64.b64decode(v["entry"]))
        else:
            ok, out = go_tlog.run("consistency", vectors["vkey"], v["old"], v["new"],
                                  v["proof"])
        if ok and v["expect"] != "accepted":
            accepted_mutants.append(v["name"])
        if not ok and v["expect"] == "accepted":
            refused_valid.append((v["name"], out))
    assert not accepted_mutants and not refused_valid, (accepted_mutants, refused_valid)
