"""Write the transparency log's mutation vectors (tests/exact/data/tlog_vectors.json).

In the style of transparency-dev/merkle's proof generator: for each valid inclusion and
consistency proof, its family of invalid ones (index +-1, tree size x2 and /2, wrong
leaf, wrong root, a bit flip in each path element, an element removed or inserted,
garbage before or after, the checkpoint signed by another key, a note signed by an
unknown key only, a signature bit flipped), each with the verdict svattn's verifier must
give (``tests/exact/test_tlog_vectors.py`` checks every one, and Go's
golang.org/x/mod/sumdb verifier refuses every invalid one where it applies).

The keys are derived from fixed labels and Ed25519 signs deterministically, so the file
is a function of this script: the test regenerates it and compares.

Usage::

    python scripts/make_tlog_vectors.py            # writes tests/exact/data/tlog_vectors.json
"""

from __future__ import annotations

import base64
import hashlib
import json
import sys
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from svattn.exact.records.merkle import MerkleTree, leaf_hash
from svattn.exact.records.note import NoteSigner
from svattn.exact.records.tlog import Checkpoint, consistency_proof_text, proof_text

OUT = Path(__file__).resolve().parents[1] / "tests" / "exact" / "data" / "tlog_vectors.json"
COMMAND = "python scripts/make_tlog_vectors.py"
ORIGIN = "svattn.audit/vectors"
SIZES = (1, 2, 3, 5, 8, 13)


def _key(label: str) -> Ed25519PrivateKey:
    return Ed25519PrivateKey.from_private_bytes(hashlib.sha256(label.encode()).digest())


LOG = NoteSigner(ORIGIN, _key("svattn tlog vectors: the log"))
IMPOSTOR = NoteSigner(ORIGIN, _key("svattn tlog vectors: another key, same name"))
STRANGER = NoteSigner("elsewhere.example/log", _key("svattn tlog vectors: a stranger"))


def _flip(h: bytes, bit: int = 0) -> bytes:
    b = bytearray(h)
    b[bit // 8 % len(b)] ^= 1 << (bit % 8)
    return bytes(b)


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def _inclusion_family(n: int, i: int, entries: list[bytes], tree: MerkleTree) -> list[dict]:
    path = tree.inclusion_path(i)
    note = Checkpoint(ORIGIN, n, tree.root()).sign([LOG])
    entry = entries[i]

    def vec(name, expect, *, index=i, p=path, cp=note, e=entry, text=None):
        return {"name": f"inclusion n{n} i{i} {name}", "kind": "inclusion",
                "proof": text if text is not None else proof_text(index, p, cp),
                "entry": _b64(e), "expect": expect}

    out = [vec("valid", "accepted"), vec("index+1", "inclusion failed", index=i + 1)]
    if i > 0:
        out.append(vec("index-1", "inclusion failed", index=i - 1))
    resigned = {"size*2": 2 * n, "size/2": n // 2}
    for label, size in resigned.items():
        if size != n:
            out.append(vec(label, "inclusion failed",
                           cp=Checkpoint(ORIGIN, size, tree.root()).sign([LOG])))
    out.append(vec("size edited under the signature", "bad signature",
                   cp=note.replace(f"\n{n}\n", f"\n{2 * n}\n", 1)))
    out.append(vec("wrong leaf", "inclusion failed", e=entry + b"x"))
    out.append(vec("wrong root", "inclusion failed",
                   cp=Checkpoint(ORIGIN, n, _flip(tree.root())).sign([LOG])))
    for k in range(len(path)):
        out.append(vec(f"bit flip in path[{k}]", "inclusion failed",
                       p=path[:k] + [_flip(path[k], 8 * k + 3)] + path[k + 1:]))
    if path:
        out.append(vec("first element removed", "inclusion failed", p=path[1:]))
        out.append(vec("last element removed", "inclusion failed", p=path[:-1]))
    out.append(vec("element inserted first", "inclusion failed", p=[tree.root()] + path))
    out.append(vec("element inserted last", "inclusion failed", p=path + [tree.root()]))
    good = proof_text(i, path, note)
    out.append(vec("garbage before", "malformed", text="\n" + good))
    out.append(vec("garbage after", "malformed", text=good + "garbage\n"))
    out.append(vec("signed by another key", "unknown key",
                   cp=Checkpoint(ORIGIN, n, tree.root()).sign([IMPOSTOR])))
    out.append(vec("unknown key only", "unknown key",
                   cp=Checkpoint(ORIGIN, n, tree.root()).sign([STRANGER])))
    sig_line = note.rsplit("\n— ", 1)[1].rstrip("\n")
    blob = base64.b64decode(sig_line.split(" ", 1)[1])
    bad = note.replace(sig_line.split(" ", 1)[1], _b64(blob[:4] + _flip(blob[4:], 9)))
    out.append(vec("signature bit flipped", "bad signature", cp=bad))
    return out


def _consistency_family(m: int, n: int, tree: MerkleTree) -> list[dict]:
    proof = tree.consistency_proof(m, n)
    old = Checkpoint(ORIGIN, m, tree.root(m)).sign([LOG])
    new = Checkpoint(ORIGIN, n, tree.root(n)).sign([LOG])

    def vec(name, expect, *, o=old, nw=new, p=proof):
        return {"name": f"consistency {m}->{n} {name}", "kind": "consistency", "old": o,
                "new": nw, "proof": consistency_proof_text(p), "expect": expect}

    out = [vec("valid", "accepted")]
    for label, size in {"old size+1": m + 1, "old size-1": m - 1}.items():
        if 0 < size < n and size != m:
            out.append(vec(label, "consistency failed",
                           o=Checkpoint(ORIGIN, size, tree.root(m)).sign([LOG])))
    out.append(vec("new size*2", "consistency failed",
                   nw=Checkpoint(ORIGIN, 2 * n, tree.root(n)).sign([LOG])))
    out.append(vec("wrong old root", "consistency failed",
                   o=Checkpoint(ORIGIN, m, _flip(tree.root(m))).sign([LOG])))
    out.append(vec("wrong new root", "consistency failed",
                   nw=Checkpoint(ORIGIN, n, _flip(tree.root(n))).sign([LOG])))
    for k in range(len(proof)):
        out.append(vec(f"bit flip in proof[{k}]", "consistency failed",
                       p=proof[:k] + [_flip(proof[k], 8 * k + 5)] + proof[k + 1:]))
    if proof:
        out.append(vec("last element removed", "consistency failed", p=proof[:-1]))
    out.append(vec("element inserted last", "consistency failed", p=proof + [tree.root(n)]))
    out.append(vec("new signed by another key", "unknown key",
                   nw=Checkpoint(ORIGIN, n, tree.root(n)).sign([IMPOSTOR])))
    out.append(vec("old edited under the signature", "bad signature",
                   o=old.replace(f"\n{m}\n", f"\n{m + 1}\n", 1)))
    out.append(vec("garbage after new", "malformed", nw=new + "garbage\n"))
    return out


def vectors() -> dict:
    """The whole vector file's content."""
    out: list[dict] = []
    for n in SIZES:
        entries = [b'{"op":"vector","seq":%d}' % i for i in range(n)]
        tree = MerkleTree([leaf_hash(e) for e in entries])
        for i in sorted({0, n // 2, n - 1}):
            out += _inclusion_family(n, i, entries, tree)
        for m in sorted({1, n // 2, n - 1} - {0}):
            if m < n:
                out += _consistency_family(m, n, tree)
    return {"command": COMMAND, "origin": ORIGIN, "vkey": LOG.verifier().to_string(),
            "vectors": out}


def main() -> int:
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(vectors(), indent=1, ensure_ascii=False) + "\n")
    data = vectors()["vectors"]
    print(f"wrote {OUT}: {len(data)} vectors, "
          f"{sum(v['expect'] == 'accepted' for v in data)} valid")
    return 0


if __name__ == "__main__":
    sys.exit(main())
