"""The support read from the cache's columns (``SlotState.cached_support_slots``, what
readouts, ``decision_function``, ``support_ids`` and the estimator use) against the
scan of every slot (``support_slots``, the reference backend's): the same array after
every kind of operation — warm-up, adds, extends, removals of each set, erasure,
compaction, a save and load, a copy to the other backend."""

from __future__ import annotations

import numpy as np
import pytest

from svattn.exact import SVDDMemory


def _same(mem: SVDDMemory) -> int:
    ss = mem.solver_state
    scan, cached = ss.support_slots(), ss.cached_support_slots()
    np.testing.assert_array_equal(cached, scan)
    return len(scan)


@pytest.mark.parametrize("kernel,standby", [("rbf", 16), ("rbf", 0), ("exp", 4)])
def test_cached_support_equals_the_scan_through_every_operation(tmp_path, kernel, standby):
    rng = np.random.default_rng(7)
    d = 5
    centers = rng.normal(size=(4, d))

    def rows(m):
        x = centers[rng.integers(0, 4, m)] + 0.3 * rng.normal(size=(m, d))
        out = rng.random(m) < 0.1
        x[out] = 2.5 * rng.normal(size=(int(out.sum()), d))
        return 0.3 * x if kernel == "exp" else x

    key = b"support-slots-test-tag-key-01234"
    mem = SVDDMemory(0.08, kernel=kernel, standby=standby, tag_key=key)
    sizes = []
    for x in rows(8):  # warm-up: every live slot is in the support
        mem.add(x)
        sizes.append(_same(mem))
    mem.extend(rows(60), tags=["a" if i % 5 == 0 else None for i in range(60)])
    sizes.append(_same(mem))
    for step in range(120):
        op = rng.integers(0, 4)
        part = mem.partition()
        if op == 0 or len(mem) < 30:
            mem.add(rows(1)[0])
        elif op == 1 and part["margin"]:
            mem.remove(int(rng.choice(part["margin"])))
        elif op == 2 and part["error"]:
            mem.remove(int(rng.choice(part["error"])))
        elif part["reserve"]:
            mem.remove(int(rng.choice(part["reserve"])))
        sizes.append(_same(mem))
        if step == 60:
            mem.erase("a")
            sizes.append(_same(mem))
    x = rows(1)
    before = mem.readout(x)
    mem.compact()
    sizes.append(_same(mem))
    np.testing.assert_array_equal(mem.readout(x), before)  # reserve tokens carry no weight
    path = tmp_path / "m.svdd"
    mem.save(path)
    loaded = SVDDMemory.load(path, tag_key=key)
    sizes.append(_same(loaded))
    np.testing.assert_array_equal(loaded.readout(x), mem.readout(x))
    sizes.append(_same(mem.copy(backend="reference")))
    ref = SVDDMemory(0.08, kernel=kernel, standby=standby, backend="reference")
    ref.extend(rows(40))
    for _ in range(30):
        ref.add(rows(1)[0])
        part = ref.partition()
        if part["margin"]:
            ref.remove(int(rng.choice(part["margin"])))
        sizes.append(_same(ref))
    assert min(sizes) >= 1 and max(sizes) > 8  # supports of many sizes were compared
