"""Byte-level enwik8: memory-mapped splits and the slice shipped for tests and the demo.

enwik8 is the first 10^8 bytes of an English Wikipedia XML dump (2006; the
Hutter prize corpus). Each byte is one token (vocabulary 256).

Splits
------
* The **full file** (exactly 100,000,000 bytes): the standard split, first
  90,000,000 bytes train, next 5,000,000 validation, last 5,000,000 test.
  Label ``"enwik8"``.
* **Any other length** (e.g. the 4,154,064-byte ``enwik8_prefix.bin`` of the
  project's data folder, or the shipped slice): first ``floor(0.90·n)`` bytes
  train, next ``floor(0.05·n)`` validation, the rest test. Label
  ``"enwik8 prefix"`` — results on it are not comparable with enwik8 figures.

The corpus is memory-mapped (``numpy.memmap``, read-only): the splits are views,
so data-parallel workers share the page cache instead of holding copies. A
``.zip`` (the distributed ``enwik8.zip``) is extracted once, next to the
archive (or into ``cache_dir``), by an atomic rename, and the extracted file
is mapped.
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import numpy as np

__all__ = [
    "ENWIK8_BYTES",
    "SLICE_NAME",
    "Enwik8",
    "load_enwik8",
    "slice_path",
]

ENWIK8_BYTES = 100_000_000
STANDARD_SPLIT = (90_000_000, 5_000_000, 5_000_000)
PREFIX_FRACTIONS = (0.90, 0.05)  # train, validation; test is the rest
SLICE_NAME = "enwik8_prefix_slice.bin"
SPLITS = ("train", "val", "test")


def slice_path() -> Path:
    """Path of the shipped slice (the first 200,000 bytes of the enwik8 prefix).

    Examples
    --------
    >>> slice_path().name
    'enwik8_prefix_slice.bin'
    """
    return Path(str(resources.files("svattn.data").joinpath("slices", SLICE_NAME)))


@dataclass(frozen=True)
class Enwik8:
    """A memory-mapped enwik8 file and its split.

    Attributes
    ----------
    path : Path
        The mapped raw file.
    data : numpy.ndarray (uint8, memmap)
        The whole corpus.
    bounds : dict
        ``split -> (start, stop)`` byte offsets for ``"train"``, ``"val"``, ``"test"``.
    label : str
        ``"enwik8"`` (standard split of the full file) or ``"enwik8 prefix"``.
    """

    path: Path
    data: np.ndarray
    bounds: dict[str, tuple[int, int]]
    label: str

    def split(self, name: str) -> np.ndarray:
        """The bytes of one split (a view of the memmap, no copy)."""
        start, stop = self.span(name)
        return self.data[start:stop]

    def span(self, name: str, max_bytes: int | None = None) -> tuple[int, int]:
        """``(start, stop)`` byte offsets of a split, cut to its first ``max_bytes``
        bytes when given (None or 0: the whole split)."""
        if name not in self.bounds:
            raise ValueError(f"split must be one of {SPLITS}, got {name!r}")
        start, stop = self.bounds[name]
        return start, min(stop, start + max_bytes) if max_bytes else stop

    def describe(self) -> str:
        """One line: label, file, and split sizes."""
        sizes = ", ".join(f"{k} {b - a:,}" for k, (a, b) in self.bounds.items())
        return f"{self.label} ({self.path.name}, {len(self.data):,} bytes: {sizes})"


def split_bounds(n: int) -> tuple[dict[str, tuple[int, int]], str]:
    """Split offsets and label for a corpus of ``n`` bytes (module docstring).

    Examples
    --------
    >>> split_bounds(100_000_000)[0]["test"]
    (95000000, 100000000)
    >>> split_bounds(1000)
    ({'train': (0, 900), 'val': (900, 950), 'test': (950, 1000)}, 'enwik8 prefix')
    """
    if n == ENWIK8_BYTES:
        a, b, _ = STANDARD_SPLIT
        return {"train": (0, a), "val": (a, a + b), "test": (a + b, n)}, "enwik8"
    n_train = int(PREFIX_FRACTIONS[0] * n)
    n_val = int(PREFIX_FRACTIONS[1] * n)
    if n_val < 2 or n - n_train - n_val < 2:
        raise ValueError(f"corpus of {n} bytes is too small for a 90/5/5 split")
    bounds = {
        "train": (0, n_train),
        "val": (n_train, n_train + n_val),
        "test": (n_train + n_val, n),
    }
    return bounds, "enwik8 prefix"


def _extract(zpath: Path, cache_dir: Path | None) -> Path:
    with zipfile.ZipFile(zpath) as zf:
        names = [i for i in zf.infolist() if not i.is_dir()]
        if not names:
            raise ValueError(f"{zpath}: the archive holds no file")
        member = next((i for i in names if Path(i.filename).name == "enwik8"), names[0])
        if cache_dir is not None:
            out_dir = cache_dir
        elif os.access(zpath.parent, os.W_OK):
            out_dir = zpath.parent
        else:
            out_dir = Path.home() / ".cache" / "svattn"
        out_dir.mkdir(parents=True, exist_ok=True)
        target = out_dir / Path(member.filename).name
        if target.exists() and target.stat().st_size == member.file_size:
            return target
        fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".enwik8-")
        try:
            with os.fdopen(fd, "wb") as out, zf.open(member) as src:
                while block := src.read(1 << 22):
                    out.write(block)
            os.replace(tmp, target)  # atomic: concurrent workers never see a partial file
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return target


def load_enwik8(path: str | os.PathLike, *, cache_dir: str | os.PathLike | None = None) -> Enwik8:
    """Memory-map an enwik8 file (raw or ``.zip``) and split it.

    Parameters
    ----------
    path : path-like
        The raw bytes (``enwik8``, ``enwik8_prefix.bin``, the shipped slice) or a
        ``.zip`` holding them.
    cache_dir : path-like, optional
        Where a ``.zip`` is extracted (default: next to it, or
        ``~/.cache/svattn`` when that folder is read-only).

    Returns
    -------
    Enwik8

    Raises
    ------
    FileNotFoundError
        When ``path`` does not exist.
    ValueError
        When the file is too small to split, or a zip holds nothing.

    Examples
    --------
    >>> ds = load_enwik8(slice_path())
    >>> ds.label, len(ds.data)
    ('enwik8 prefix', 200000)
    >>> bytes(ds.split("train")[:10])
    b'<mediawiki'
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"enwik8 file not found: {p}")
    if zipfile.is_zipfile(p):
        p = _extract(p, None if cache_dir is None else Path(cache_dir))
    n = p.stat().st_size
    bounds, label = split_bounds(n)
    data = np.memmap(p, dtype=np.uint8, mode="r", shape=(n,))
    return Enwik8(p, data, bounds, label)
