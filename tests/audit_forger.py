"""A forger's tools for an audit log (tests only): read a log's records with their
openings in place, without checking anything, and write records back as a coherent
version-3 log (each subject field sealed again under a fresh salt, the chain re-hashed,
``LOG.openings`` rewritten) — the attacker who rewrites the whole log consistently.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from svattn.exact.records.logverify import canonical, record_hash
from svattn.exact.records.openings import opening_line, openings_path, seal


def read_records(log: Path) -> list[dict]:
    """Each record of ``log`` as parsed, with its openings put back where they are found
    (a version-2 record's shape; nothing is checked)."""
    found: dict[tuple[int, int], object] = {}
    path = openings_path(log)
    if path.exists():
        for line in path.read_text().splitlines():
            o = json.loads(line)
            found[tuple(o["at"])] = o["value"]
    out = []
    for i, line in enumerate(log.read_text().splitlines()):
        rec = json.loads(line)
        if rec["op"] in ("add", "extend") and isinstance(rec.get("tokens"), list):
            rec["tokens"] = [found.get((i, r), c) for r, c in enumerate(rec["tokens"])]
        elif rec["op"] == "remove" and (i, 0) in found:
            rec["certificate"] = found[(i, 0)]
        elif rec["op"] == "erase" and isinstance(rec.get("erasure"), dict):
            er = dict(rec["erasure"])
            opening = er.pop("opening", None)
            rec["erasure"] = {**found.get((i, 0), {"opening": opening}), **er}
        out.append(rec)
    return out


_PRIVATE = ("tag_hash", "erased_ids", "signer", "signature")


def _seal_record(i: int, rec: dict, opens: list[bytes]) -> dict:
    """``rec`` with its subject fields sealed again (their openings added to ``opens``);
    a field that is already a bare commitment (a pruned one) stays as it is."""
    rec = {k: v for k, v in rec.items() if k != "sha256"}
    if rec["op"] in ("add", "extend") and isinstance(rec.get("tokens"), list):
        toks = []
        for r, tok in enumerate(rec["tokens"]):
            if not isinstance(tok, str):
                c, salt = seal(tok)
                opens.append(opening_line(i, r, salt, tok))
                tok = c
            toks.append(tok)
        rec["tokens"] = toks
    elif rec["op"] == "remove" and not isinstance(rec.get("certificate"), str | None):
        c, salt = seal(rec["certificate"])
        opens.append(opening_line(i, 0, salt, rec["certificate"]))
        rec["certificate"] = c
    elif rec["op"] == "erase" and isinstance(rec.get("erasure"), dict):
        er = dict(rec["erasure"])
        private = {k: er.pop(k) for k in _PRIVATE if k in er}
        if private:
            c, salt = seal(private)
            opens.append(opening_line(i, 0, salt, private))
            er["opening"] = c
        rec["erasure"] = er
    return rec


def write_records(log: Path, records: list[dict]) -> Path:
    """Write ``records`` (as :func:`read_records` gives them) as a version-3 log: subject
    fields sealed under fresh salts, ``prev`` / ``sha256`` recomputed."""
    lines, opens, prev = [], [], "0" * 64
    for i, rec in enumerate(records):
        rec = _seal_record(i, rec, opens)
        rec["prev"] = prev
        rec["sha256"] = record_hash(rec)
        text = canonical(rec)
        lines.append(text + "\n")
        prev = hashlib.sha256(text.encode()).hexdigest()
    log.write_text("".join(lines))
    openings_path(log).write_bytes(b"".join(opens))
    return log


def append_record(log: Path, fields: dict, *, openings: bool = True) -> None:
    """Append one record after the log's last (its fields as :func:`read_records` gives
    them; ``seq``, ``prev``, the counts and the digest from the last record): sealed, with
    its openings appended too unless ``openings`` is False (a forger who leaves it
    looking pruned). No key needed."""
    lines = log.read_text().splitlines()
    last = json.loads(lines[-1])
    i = last["seq"] + 1
    opens: list[bytes] = []
    rec = _seal_record(i, {**fields, "seq": i, "time": last["time"], "digest": last["digest"],
                           "n": last["n"], "next_id": last["next_id"]}, opens)
    rec["prev"] = hashlib.sha256(lines[-1].encode()).hexdigest()
    rec["sha256"] = record_hash(rec)
    log.write_text("\n".join(lines + [canonical(rec)]) + "\n")
    if openings:
        with open(openings_path(log), "ab") as fh:
            fh.write(b"".join(opens))
