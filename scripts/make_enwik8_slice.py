"""Cut the enwik8 slice that the package ships (LM tests and the demo use it).

Run from the repository root::

    python scripts/make_enwik8_slice.py [--source /work/shared/data/enwik8/enwik8_prefix.bin]
                                        [--bytes 200000]

It writes into ``src/svattn/data/slices/``:

* ``enwik8_prefix_slice.bin``: the first ``--bytes`` bytes of the enwik8
  prefix, copied byte for byte (raw, so it can be memory-mapped).
* ``ENWIK8_SLICE.md``: provenance, license, and the sha256 of source and slice.

The source's sha256 is checked against the one recorded in the project's
data README; pass ``--allow-other-source`` to cut from a different file.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
from pathlib import Path

SLICE_NAME = "enwik8_prefix_slice.bin"
EXPECTED_SOURCE_SHA256 = "d8b3b95fb4993726ea7dcc93ae3c9e08a1a04cc540d05d7656fd267cc8ab5d6a"
REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "src" / "svattn" / "data" / "slices"
DEFAULT_SOURCE = Path("/work/shared/data/enwik8/enwik8_prefix.bin")
MAX_BYTES = 200_000

NOTE = """# enwik8 slice

`{name}`: the first {n:,} bytes of `enwik8_prefix.bin` (itself the first 491
complete pages of enwik8, the Hutter-prize corpus: the first 10^8 bytes of an
English Wikipedia XML dump of 2006), raw, for the language-model tests and demo.
Text is Wikipedia content, licensed CC BY-SA / GFDL.

- Source: `enwik8_prefix.bin`, sha256 `{src_sha}`.
- Cut by `scripts/make_enwik8_slice.py --bytes {n}` (a plain byte prefix).
- Slice sha256 `{out_sha}`.
- `svattn.data.enwik8.load_enwik8` splits it 90/5/5 (label "enwik8 prefix").
"""


def sha256(data: bytes) -> str:
    """Hex sha256 of some bytes."""
    return hashlib.sha256(data).hexdigest()


def main(argv: list[str] | None = None) -> int:
    """Write the slice and its note; return the exit code."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    ap.add_argument("--bytes", type=int, default=MAX_BYTES)
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    ap.add_argument("--allow-other-source", action="store_true")
    args = ap.parse_args(argv)
    if not 0 < args.bytes <= MAX_BYTES:
        ap.error(f"--bytes must be in 1..{MAX_BYTES} (the slice ships with the package)")
    src = args.source.read_bytes()
    src_sha = sha256(src)
    if src_sha != EXPECTED_SOURCE_SHA256 and not args.allow_other_source:
        print(f"{args.source}: sha256 {src_sha} is not the expected prefix", file=sys.stderr)
        return 1
    out = src[: args.bytes]
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / SLICE_NAME).write_bytes(out)
    note = NOTE.format(name=SLICE_NAME, n=len(out), src_sha=src_sha, out_sha=sha256(out))
    (args.out / "ENWIK8_SLICE.md").write_text(note)
    print(f"wrote {args.out / SLICE_NAME} ({len(out):,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
