"""Write an audit log, its state and an erasure receipt with the svattn on PYTHONPATH:
the fixture tests/exact/data/audit_v1/ holds what svattn 0.1 before the Merkle log
(commit 38aa969, log format version 1) wrote, and tests/exact/data/audit_v2/ what the
Merkle log before salted commitments (commit 290cd52, version 2) wrote; the current
reader must still verify both.

Usage::

    git worktree add /tmp/v1 38aa969
    PYTHONPATH=/tmp/v1/src python scripts/make_audit_log_fixture.py tests/exact/data/audit_v1
    mkdir /tmp/v2 && git archive 290cd52 src | tar -x -C /tmp/v2
    PYTHONPATH=/tmp/v2/src python scripts/make_audit_log_fixture.py tests/exact/data/audit_v2
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

from svattn.exact import SVDDMemory


def main(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=False)
    rng = np.random.default_rng(0)
    mem = SVDDMemory(0.2, audit_log=out / "audit.jsonl", tag_key=b"fixture tag key 0123")
    ids = mem.extend(rng.normal(size=(24, 3)), tags=["alice"] * 4 + ["bob"] * 20)
    receipt = mem.erase("alice")
    mem.remove(ids[10])
    mem.save(out / "state.safetensors")
    mem.close_audit_log()
    (out / "erasure.json").write_text(receipt.to_json() + "\n")
    version = json.loads((out / "audit.jsonl").read_text().splitlines()[0])["version"]
    print(f"wrote {out}: audit.jsonl (log format version {version}), state.safetensors, "
          "erasure.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1])))
