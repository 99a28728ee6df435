"""Cut the small data slices that the package ships (tests and the demo use them).

Run from the repository root::

    python scripts/make_slices.py [--source /work/shared/data/icu] [--stays 30]

It writes into ``src/svattn/data/slices/``:

* ``mimic3_demo_vitals_slice.csv.gz``: the header and every row of the first
  ``--stays`` ICU stays of ``mimic3_demo_vitals.csv.gz`` (the source is sorted
  by stay and time; "first" is file order, i.e. increasing ``icustay_id``).
  Rows are copied byte for byte, whole stays only. The gzip stream is written
  with ``mtime=0`` and no file name, so the output is byte-reproducible.
* ``MIMIC3_DEMO_LICENSE.md`` and ``CITATION``, copied unchanged: the data is
  under the Open Database License (ODbL) 1.0.
* ``SLICE.md``: how the slice was cut, with the sha256 of the source and of
  the slice.

The source's sha256 is checked against the one recorded in the project's
data README (``EXPECTED_SOURCE_SHA256``); pass ``--allow-other-source`` to cut
from a different file anyway (the new hash is then recorded in ``SLICE.md``).
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import io
import shutil
import sys
from pathlib import Path

SOURCE_NAME = "mimic3_demo_vitals.csv.gz"
SLICE_NAME = "mimic3_demo_vitals_slice.csv.gz"
EXPECTED_SOURCE_SHA256 = "cc06f2b9cc34148f088730817879dbe8431f2027278c9d43de3cca3d525c5834"
COPIED = ("MIMIC3_DEMO_LICENSE.md", "CITATION")
REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "src" / "svattn" / "data" / "slices"


def sha256(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def cut_first_stays(source: Path, n_stays: int) -> tuple[bytes, list[str], int]:
    """Header plus all rows of the first ``n_stays`` stays, as raw bytes.

    Returns the bytes, the stay ids kept, and the number of data rows.
    """
    with gzip.open(source, "rb") as handle:
        header = handle.readline()
        if not header.startswith(b"icustay_id,"):
            raise ValueError(f"{source}: expected a header starting with 'icustay_id,'")
        out = io.BytesIO()
        out.write(header)
        kept: list[str] = []
        rows = 0
        for line in handle:
            stay = line.split(b",", 1)[0].decode()
            if not kept or kept[-1] != stay:
                if stay in kept:
                    raise ValueError(f"{source}: stay {stay} is not contiguous; is it sorted?")
                if len(kept) == n_stays:
                    break
                kept.append(stay)
            out.write(line)
            rows += 1
    return out.getvalue(), kept, rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--source", type=Path, default=Path("/work/shared/data/icu"),
                        help="folder holding mimic3_demo_vitals.csv.gz, its licence and CITATION")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--stays", type=int, default=30, help="number of whole stays to keep")
    parser.add_argument("--allow-other-source", action="store_true",
                        help="cut even if the source's sha256 differs from the expected one")
    args = parser.parse_args(argv)
    if args.stays < 1:
        parser.error(f"--stays must be >= 1, got {args.stays}")

    source = args.source / SOURCE_NAME
    if not source.is_file():
        parser.error(f"--source: {source} does not exist")
    source_hash = sha256(source)
    if source_hash != EXPECTED_SOURCE_SHA256 and not args.allow_other_source:
        parser.error(
            f"{source} has sha256 {source_hash}, expected {EXPECTED_SOURCE_SHA256} "
            "(pass --allow-other-source to cut it anyway)"
        )

    data, kept, rows = cut_first_stays(source, args.stays)
    args.out.mkdir(parents=True, exist_ok=True)
    target = args.out / SLICE_NAME
    with open(target, "wb") as raw, gzip.GzipFile(
        filename="", mode="wb", fileobj=raw, mtime=0, compresslevel=9
    ) as gz:
        gz.write(data)
    for name in COPIED:
        shutil.copyfile(args.source / name, args.out / name)

    slice_hash = sha256(target)
    size = target.stat().st_size
    (args.out / "SLICE.md").write_text(
        f"""# Shipped data slices

## {SLICE_NAME}

A subset of whole ICU stays of the MIMIC-III Clinical Database Demo v1.4
vital signs, for the tests and `svattn demo`. Open Database License (ODbL) 1.0:
see `MIMIC3_DEMO_LICENSE.md`; cite as in `CITATION`.

- Source: `{SOURCE_NAME}`, sha256 `{source_hash}`.
- Cut by `scripts/make_slices.py --stays {args.stays}`: the header and every row
  of the first {len(kept)} stays in file order (the source is sorted by stay and
  time), copied byte for byte; gzip with mtime 0, level 9.
- {rows} rows, {len(kept)} stays, {size} bytes, sha256 `{slice_hash}`.
- Stays: {", ".join(kept)}.
""",
        encoding="utf-8",
    )
    print(f"wrote {target} ({size} bytes, {rows} rows, {len(kept)} stays)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
