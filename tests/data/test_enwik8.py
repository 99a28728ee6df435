"""enwik8 loader: splits, labels, zip input, errors; the shipped slice."""

from __future__ import annotations

import hashlib
import zipfile

import numpy as np
import pytest

from svattn.data.enwik8 import ENWIK8_BYTES, load_enwik8, slice_path, split_bounds


def test_shipped_slice():
    p = slice_path()
    assert p.stat().st_size == 200_000
    digest = hashlib.sha256(p.read_bytes()).hexdigest()
    assert digest == "20486802c948015c70e06b26ccd97cb8ae3f69b8c6731cf4c0a4d42481f54229"
    ds = load_enwik8(p)
    assert ds.label == "enwik8 prefix"
    assert ds.bounds == {
        "train": (0, 180_000),
        "val": (180_000, 190_000),
        "test": (190_000, 200_000),
    }
    assert isinstance(ds.data, np.memmap) and ds.data.dtype == np.uint8
    assert np.shares_memory(ds.split("val"), ds.data)  # views, no copies
    assert bytes(ds.split("train")[:10]) == b"<mediawiki"


def test_prefix_split_covers_every_byte():
    for n in (1000, 4_154_064, 99_999_999):
        b, label = split_bounds(n)
        assert label == "enwik8 prefix"
        assert b["train"][0] == 0 and b["train"][1] == b["val"][0]
        assert b["val"][1] == b["test"][0] and b["test"][1] == n
    assert split_bounds(4_154_064)[0]["val"] == (3_738_657, 3_738_657 + 207_703)


def test_full_file_gets_the_standard_split(tmp_path):
    p = tmp_path / "enwik8"
    with open(p, "wb") as fh:  # sparse: 10^8 bytes without writing them
        fh.truncate(ENWIK8_BYTES)
    ds = load_enwik8(p)
    assert ds.label == "enwik8"
    assert ds.bounds == {
        "train": (0, 90_000_000),
        "val": (90_000_000, 95_000_000),
        "test": (95_000_000, 100_000_000),
    }


def test_zip_is_extracted_once_and_mapped(tmp_path):
    raw = slice_path().read_bytes()[:5000]
    z = tmp_path / "enwik8.zip"
    with zipfile.ZipFile(z, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("enwik8", raw)
    cache = tmp_path / "cache"
    ds = load_enwik8(z, cache_dir=cache)
    assert ds.path == cache / "enwik8" and bytes(ds.data) == raw
    mtime = ds.path.stat().st_mtime_ns
    assert load_enwik8(z, cache_dir=cache).path.stat().st_mtime_ns == mtime  # reused


def test_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="enwik8 file not found"):
        load_enwik8(tmp_path / "nope")
    small = tmp_path / "small"
    small.write_bytes(b"x" * 20)
    with pytest.raises(ValueError, match="too small for a 90/5/5 split"):
        load_enwik8(small)
    with pytest.raises(ValueError, match="split must be one of"):
        load_enwik8(slice_path()).split("dev")
