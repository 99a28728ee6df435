"""Write a small state file and the digests of its continuation (a test fixture).

Run it with the svattn whose file format the fixture should freeze, e.g. the
last release of a format before a schema change:

    PYTHONPATH=<old checkout>/src python scripts/make_state_fixture.py tests/exact/data/v2

It writes ``<prefix>.safetensors`` (a memory with history: a clustered rbf stream
with outliers and values, removals of margin, error and reserve tokens, re-adds) and
``<prefix>.json``: the format version, the command, and after each step of a
fixed continuation (:func:`continue_memory`) the state digest and the SHA-256 of
alpha's bytes. ``tests/exact/test_state_fixture.py`` loads the file with today's
code and requires the saved digest: old files load.

With ``--continuation-of FILE`` it writes only ``<prefix>.json``: the continuation
of the memory saved in FILE with every step's ids, alpha and mu in full (JSON
floats round-trip exactly), so a later svattn whose kernel values differ at
rounding level (rbf distances from differences) can be compared to this code's
numbers with a tolerance instead of by hash:

    PYTHONPATH=<old checkout>/src python scripts/make_state_fixture.py \
        tests/exact/data/v2_continuation --continuation-of tests/exact/data/v2.safetensors

Only public API is used, so the script runs against any svattn version.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

import numpy as np

from svattn.exact import SVDDMemory


def build_memory() -> SVDDMemory:
    """The fixture's memory: 220 tokens of 6 clusters with outliers, then removals."""
    rng = np.random.default_rng(2026)
    centers = rng.normal(size=(6, 5))
    X = centers[rng.integers(0, 6, 220)] + 0.2 * rng.normal(size=(220, 5))
    X[rng.random(220) < 0.05] *= 3.0
    V = rng.normal(size=(220, 3))
    mem = SVDDMemory(0.02, standby=8)
    mem.extend(X[:180], V[:180])
    part = mem.partition()
    for t in part["margin"][:3] + part["error"][:2] + part["reserve"][:2]:
        mem.remove(t)
    for r in range(180, 220):
        mem.add(X[r], V[r])
    return mem


def continue_memory(mem: SVDDMemory) -> list[dict[str, str]]:
    """A fixed continuation; the digest and alpha's hash after each step."""
    return list(_continue_steps(mem))


def continuation_values(mem: SVDDMemory) -> list[dict]:
    """:func:`continue_memory`, with each step's live ids, alpha (in id order) and mu."""
    out = []
    for step, hashes in enumerate(_continue_steps(mem)):
        out.append({"step": step, **hashes, "ids": [int(i) for i in mem.ids],
                    "alpha": [float(a) for a in mem.alpha], "mu": float(mem.mu)})
    return out


def _continue_steps(mem: SVDDMemory):
    """:func:`continue_memory` one step at a time (the memory is stepped in between)."""
    rng = np.random.default_rng(7)
    for step in range(12):
        _step(mem, rng, step)
        yield {"digest": mem.state_digest(),
               "alpha_sha256": hashlib.sha256(mem.alpha.tobytes()).hexdigest()}


def _step(mem: SVDDMemory, rng: np.random.Generator, step: int) -> None:
    if step % 3 == 2:
        mem.add(rng.normal(size=5), rng.normal(size=3))
    else:
        part = mem.partition()
        pool = part["margin"] if step % 2 == 0 else (part["error"] or part["margin"])
        mem.remove(pool[len(pool) // 2])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("prefix", help="output path without suffix")
    ap.add_argument("--note", default="", help="recorded as is (e.g. which svattn wrote it)")
    ap.add_argument("--continuation-of", metavar="FILE", default=None,
                    help="write only the continuation of the memory saved in FILE, in full")
    args = ap.parse_args(argv)
    prefix = Path(args.prefix)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    command = "python scripts/make_state_fixture.py " + " ".join(argv or sys.argv[1:])
    if args.continuation_of is not None:
        record = {"command": command, "note": args.note, "source": args.continuation_of,
                  "continuation": continuation_values(SVDDMemory.load(args.continuation_of))}
        prefix.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
        print(f"wrote {prefix.with_suffix('.json')}")
        return 0
    mem = build_memory()
    state = prefix.with_suffix(".safetensors")
    mem.save(state)
    header = state.read_bytes()
    meta = json.loads(json.loads(header[8 : 8 + int.from_bytes(header[:8], "little")])
                      ["__metadata__"]["svattn"])
    record = {
        "command": command,
        "note": args.note,
        "format_version": meta["format_version"],
        "saved_digest": mem.state_digest(),
        "continuation": continue_memory(mem),
    }
    prefix.with_suffix(".json").write_text(json.dumps(record, indent=1) + "\n")
    print(f"wrote {state} (format {meta['format_version']}) and {prefix.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
