"""``SVDDMemory.view``: the read-only API the core's consumers read (svattn.exact.view),
each answer checked against the memory's public properties or a slow reading of them."""

from __future__ import annotations

import numpy as np
import pytest

from svattn.exact import SVDDMemory
from svattn.exact.operations.scoring import mu_interval


@pytest.fixture(scope="module")
def mem():
    rng = np.random.default_rng(3)
    m = SVDDMemory(C=0.05, tag_key=b"view-test-tag-key-0123456789abcd")
    x = rng.normal(size=(120, 3))
    m.extend(x[:100], tags=[f"t{i % 4}" for i in range(100)])
    m.remove(5)
    m.remove(m.partition()["margin"][0])
    m.compact()
    m.extend(x[100:])
    return m


def test_ids_and_keys(mem):
    view = mem.view
    assert view.next_id == 120
    assert [i for i in range(130) if view.holds(i)] == mem.ids
    assert view.holds(np.int64(mem.ids[0])) and not view.holds(5)
    for pos in (0, len(mem) // 2, -1):
        got = view.key_of(mem.ids[pos])
        assert np.array_equal(got, mem.keys[pos])
        got[:] = 99.0  # a copy
    assert np.array_equal(view.key_of(mem.ids[0]), mem.keys[0])
    with pytest.raises(KeyError, match="token_id 5 is not held"):
        view.key_of(5)


def test_compaction_count_and_tags(mem):
    assert mem.view.n_compacted == 100 - 2 - len([i for i in mem.ids if i < 100]) > 0
    rng = np.random.default_rng(1)
    m = SVDDMemory(C=0.1, tag_key=b"view-test-tag-key-0123456789abcd")
    m.extend(rng.normal(size=(40, 2)), tags=[f"t{i % 3}" if i % 5 else None
                                             for i in range(40)])
    assert m.view.n_tagged("nobody") == 0
    for tag in ("t0", "t1"):
        n = m.view.n_tagged(tag)
        assert n > 0 and len(m.erase(tag).erased_ids) == n
        assert m.view.n_tagged(tag) == 0


def test_live_commitments_drop_a_removed_token():
    rng = np.random.default_rng(0)
    m = SVDDMemory(C=0.2)
    ids = m.extend(rng.normal(size=(30, 2)))
    before = m.view.live_commitments()
    assert len(before) == 30
    cert = m.remove(ids[7])
    assert cert.commitment in before
    assert m.view.live_commitments() == before - {cert.commitment}


def test_support_and_margin(mem):
    view = mem.view
    ids, keys, alpha = view.support()
    assert ids.dtype == np.int64 and list(ids) == sorted(mem.support_ids())
    pos = [mem.ids.index(int(i)) for i in ids]
    assert np.array_equal(keys, mem.keys[pos]) and np.array_equal(alpha, mem.alpha[pos])
    assert (alpha > 0).all()
    assert sorted(view.margin_ids()) == mem.partition()["margin"]
    assert view.n_margin == len(view.margin_ids()) == len(mem.partition()["margin"]) > 0
    assert view.margin_ids() == [int(i) for i in mem.margin_system().margin]
    assert view.mu_interval() == mu_interval(mem.solver_state) == (mem.mu, mem.mu)


def test_mu_interval_with_an_empty_margin_set():
    # C = 1/n: every token in the error set at alpha = C, the margin set empty
    m = SVDDMemory(C=0.25)
    m.extend(np.array([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]]))
    low, high = m.view.mu_interval()
    assert m.view.n_margin == 0 and high == m.mu and low == -np.inf


def test_counters_nbytes_and_the_cross_check(mem):
    view = mem.view
    c = view.counters()
    assert c["n_refactorizations"] == mem.n_refactorizations
    assert c["n_resolves"] == mem.n_resolves
    assert set(c) >= {"n_block_passes", "n_jumps", "n_jump_fallbacks"}
    assert all(isinstance(v, int) and v >= 0 for v in c.values())
    assert view.state_nbytes >= mem.keys.nbytes
    # the cache holds a column per support token, over every slot
    assert (view.state_nbytes > view.kernel_cache_nbytes
            >= 8 * len(mem) * len(mem.support_ids()) > 0)
    assert isinstance(view.has_kept_factor, bool)
    assert view.kkt_residual_all_columns() <= mem.tol


def test_the_view_follows_the_memory_and_cannot_write():
    m = SVDDMemory(C=0.5)
    view = m.view
    assert view.next_id == 0 and view.support()[0].size == 0
    m.extend(np.eye(3))
    assert view.next_id == 3 and view.holds(2)
    with pytest.raises(AttributeError):
        view.next_id = 7
    with pytest.raises(AttributeError):
        view.extra = 1
