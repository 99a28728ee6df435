"""H2O, SnapKV, sliding window and full softmax on cases whose kept set is known."""

from __future__ import annotations

import numpy as np
import pytest

from memory_helpers import stream
from svattn.memory import (
    FullMemory,
    H2OMemory,
    H2OOracleMemory,
    SlidingWindowMemory,
    SnapKVMemory,
    snapkv_select,
)


def _magnet_stream(t: int = 120, d: int = 4, where: int = 5):
    """Weak keys except one strong key at ``where``; every query points at it."""
    rng = np.random.default_rng(0)
    keys = 0.01 * rng.normal(size=(t, d))
    keys[where] = [20.0, 0.0, 0.0, 0.0]
    queries = np.tile([1.0, 0.0, 0.0, 0.0], (t, 1))
    return keys, rng.normal(size=(t, 2)), queries


def test_h2o_keeps_the_key_that_receives_all_attention():
    keys, values, queries = _magnet_stream()
    mem = H2OMemory(dim=4, value_dim=2, budget=6, window=3)
    mem.write_many(keys, values, queries)
    kept = mem.kept_positions()
    assert 5 in kept
    assert set(range(117, 120)) <= set(kept)  # the recent window
    # the read is dominated by the magnet's value
    np.testing.assert_allclose(mem.read(queries[:1])[0], values[5], atol=1e-2)


def test_h2o_uniform_stream_keeps_first_heavy_hitters_and_recent_window():
    """Identical keys: every held token gets 1/n per step, so older tokens lead and the
    token leaving the window is always the one evicted."""
    mem = H2OMemory(dim=3, value_dim=1, budget=7, window=4)
    mem.write_many(np.ones((50, 3)), np.arange(50.0)[:, None])
    np.testing.assert_array_equal(mem.kept_positions(), [0, 1, 2, 46, 47, 48, 49])


def test_h2o_with_full_window_is_sliding_window():
    k, v, q = stream(0, 40, 4, 2)
    a = H2OMemory(dim=4, value_dim=2, budget=5, window=5)
    b = SlidingWindowMemory(dim=4, value_dim=2, budget=5)
    a.write_many(k, v, q)
    b.write_many(k, v, q)
    np.testing.assert_array_equal(a.kept_positions(), np.arange(35, 40))
    np.testing.assert_array_equal(a.read(q), b.read(q))


def test_h2o_oracle_keeps_what_the_future_query_wants():
    """The stream's own queries look elsewhere; only the oracle query finds position 7."""
    rng = np.random.default_rng(1)
    keys = 0.01 * rng.normal(size=(100, 4))
    keys[7] = [0.0, 0.0, 8.0, 0.0]
    own = np.tile([1.0, 0.0, 0.0, 0.0], (100, 1))
    oracle = np.array([[0.0, 0.0, 1.0, 0.0]])
    plain = H2OMemory(dim=4, value_dim=1, budget=6, window=3)
    orac = H2OOracleMemory(dim=4, value_dim=1, budget=6, window=3, oracle_queries=oracle)
    for mem in (plain, orac):
        mem.write_many(keys, np.zeros((100, 1)), own)
    assert 7 in orac.kept_positions()
    assert 7 not in plain.kept_positions()


def test_h2o_oracle_needs_queries_of_the_right_width():
    with pytest.raises(TypeError, match="oracle_queries"):
        H2OOracleMemory(dim=4, value_dim=1, budget=6)
    with pytest.raises(ValueError, match=r"oracle_queries must have shape \[n, 4\]"):
        H2OOracleMemory(dim=4, value_dim=1, budget=6, oracle_queries=np.zeros((2, 3)))


@pytest.mark.parametrize("pool", ["max", "avg"])
def test_snapkv_memory_keeps_the_attended_key(pool):
    keys, values, queries = _magnet_stream()
    mem = SnapKVMemory(dim=4, value_dim=2, budget=8, window=4, kernel=3, pool=pool)
    mem.write_many(keys, values, queries)
    kept = mem.kept_positions()
    assert 5 in kept and set(range(116, 120)) <= set(kept)


@pytest.mark.parametrize("pool", ["max", "avg"])
def test_snapkv_uniform_stream_keeps_the_recent_tokens(pool):
    mem = SnapKVMemory(dim=3, value_dim=1, budget=6, window=2, kernel=3, pool=pool)
    mem.write_many(np.ones((30, 3)), np.zeros((30, 1)))
    np.testing.assert_array_equal(mem.kept_positions(), np.arange(24, 30))


def test_snapkv_select_pools_neighbours_of_the_attended_key():
    """Max pooling with kernel 3 keeps the attended key and its two neighbours."""
    keys = np.zeros((40, 4))
    keys[10] = [8.0, 0.0, 0.0, 0.0]
    queries = np.tile([1.0, 0.0, 0.0, 0.0], (40, 1))
    kept = snapkv_select(keys, queries, budget=7, window=4, kernel=3, pool="max")
    np.testing.assert_array_equal(kept, [9, 10, 11, 36, 37, 38, 39])
    kept1 = snapkv_select(keys, queries, budget=5, window=4, kernel=1)
    np.testing.assert_array_equal(kept1, [10, 36, 37, 38, 39])
    short = snapkv_select(keys[:5], queries[:5], budget=7, window=4)
    np.testing.assert_array_equal(short, np.arange(5))


def test_snapkv_bad_options():
    with pytest.raises(ValueError, match="kernel must be odd"):
        SnapKVMemory(dim=2, value_dim=1, budget=8, kernel=4)
    with pytest.raises(ValueError, match="pool must be one of"):
        SnapKVMemory(dim=2, value_dim=1, budget=8, pool="mean")
    with pytest.raises(ValueError, match=r"window \(9\) must be <= budget \(8\)"):
        snapkv_select(np.zeros((20, 2)), np.zeros((20, 2)), budget=8, window=9)


def test_full_memory_is_softmax_attention():
    k, v, q = stream(3, 300, 6, 3)
    mem = FullMemory(dim=6, value_dim=3, budget=None)
    mem.write_many(k, v)
    logits = q @ k.T / np.sqrt(6)
    w = np.exp(logits - logits.max(1, keepdims=True))
    w /= w.sum(1, keepdims=True)
    np.testing.assert_allclose(mem.read(q), w @ v, rtol=1e-12, atol=1e-13)
    assert mem.tokens_kept() == 300 and mem.budget is None
    np.testing.assert_array_equal(mem.kept_positions(), np.arange(300))


def test_sliding_window_smaller_than_budget():
    mem = SlidingWindowMemory(dim=2, value_dim=1, budget=10, window=3)
    mem.write_many(np.zeros((8, 2)), np.zeros((8, 1)))
    np.testing.assert_array_equal(mem.kept_positions(), [5, 6, 7])
