"""A state file (format 5) holds the kernel cache's recipe, not its values: ``load``
rebuilds the cache from the keys bit for bit, refuses a patch that moves an entry off
the keys' kernel, and files holding the values (formats 1-4) still load
(:mod:`svattn.exact.records.kcache`)."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from safetensors.numpy import load as st_load

from svattn.exact import SVDDMemory
from svattn.exact.records.fileformat import StateFileError, serialize, sha256_hex
from svattn.exact.records.schema import RECIPE_TENSORS


def _used_cache(mem: SVDDMemory) -> np.ndarray:
    ss = mem.solver_state
    used = np.flatnonzero(ss.slot_of_col[: ss.chi] >= 0)
    return ss.KC[np.ix_(ss.ordered_slots(), used)]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A batch fit, removals and rows added one at a time: all three routines' entries."""
    rng = np.random.default_rng(4)
    centres = 3.0 * rng.normal(size=(5, 4))
    X = centres[rng.integers(0, 5, 1230)] + rng.normal(size=(1230, 4))
    mem = SVDDMemory(C=1 / 60, gamma=0.5)
    mem.extend(X[:1200])
    for t in mem.partition()["margin"][:3]:
        mem.remove(t)
    for row in X[1200:]:
        mem.add(row)
    path = tmp_path_factory.mktemp("kcache") / "m.safetensors"
    mem.save(path)
    return mem, path


def _tensors_and_meta(path) -> tuple[dict, dict]:
    data = path.read_bytes()
    (hlen,) = struct.unpack("<Q", data[:8])
    meta = json.loads(json.loads(data[8: 8 + hlen])["__metadata__"]["svattn"])
    return dict(st_load(data)), meta


def test_a_state_file_holds_the_recipe_and_load_rebuilds_the_cache_bit_for_bit(saved):
    mem, path = saved
    t, _ = _tensors_and_meta(path)
    assert "kcache" not in t and set(RECIPE_TENSORS) <= set(t)
    ss = mem.solver_state
    assert path.stat().st_size < 8 * ss.n * ss.chi  # (smaller than the cache alone)
    got = SVDDMemory.load(path)
    assert np.array_equal(_used_cache(got), _used_cache(mem))
    tid = mem.partition()["margin"][0]
    twin = mem.copy()
    assert got.remove(tid).state_digest == twin.remove(tid).state_digest


def _rewrite(path, out, t: dict, meta: dict) -> None:
    meta = {**meta, "tensor_sha256": {k: sha256_hex(np.ascontiguousarray(v).tobytes())
                                      for k, v in t.items()}}
    out.write_bytes(serialize(t, meta))  # checksums recomputed: a "valid" file


def test_a_forged_patch_in_a_state_file_is_refused(saved, tmp_path):
    mem, path = saved
    t, meta = _tensors_and_meta(path)
    ss = mem.solver_state
    slot, col = int(ss.slot_of_col[0]), 1
    t["kcache_patch_slots"] = np.r_[t["kcache_patch_slots"], slot].astype(np.int32)
    t["kcache_patch_cols"] = np.r_[t["kcache_patch_cols"], col].astype(np.int32)
    t["kcache_patch"] = np.r_[t["kcache_patch"], ss.KC[slot, col] + 1e-6]
    bad = tmp_path / "bad.safetensors"
    _rewrite(path, bad, t, meta)
    with pytest.raises(StateFileError, match="patch moves an entry"):
        SVDDMemory.load(bad)


def test_a_format_4_file_with_the_caches_values_still_loads(saved, tmp_path):
    mem, path = saved
    t, meta = _tensors_and_meta(path)
    for name in RECIPE_TENSORS:
        del t[name]
    ss = mem.solver_state
    t["kcache"] = np.ascontiguousarray(ss.KC[np.ix_(ss.ordered_slots(), np.arange(ss.chi))])
    old = tmp_path / "v4.safetensors"
    _rewrite(path, old, t, {**meta, "format_version": 4})
    got = SVDDMemory.load(old)
    assert got.state_digest() == mem.state_digest()
    assert np.array_equal(_used_cache(got), _used_cache(mem))


@pytest.mark.parametrize("d", [1, 3])
def test_saving_and_pickling_one_dimensional_keys_leaves_the_keys(tmp_path, d):
    """Rebuilding the cache scrubs its transposed copy of the keys; at d = 1 the
    transpose of the key rows is already contiguous, so the copy must be made on purpose
    (a view was zeroed: the save wiped the memory's keys, its load refused the digest)."""
    import pickle

    X = np.random.default_rng(0).normal(size=(40, d))
    mem = SVDDMemory(C=0.1)
    mem.extend(X)
    keys = mem.keys.copy()
    mem.save(tmp_path / "s.safetensors")
    assert np.array_equal(mem.keys, keys)
    assert np.array_equal(SVDDMemory.load(tmp_path / "s.safetensors").keys, keys)
    twin = pickle.loads(pickle.dumps(mem))
    assert np.array_equal(mem.keys, keys) and np.array_equal(twin.keys, keys)
