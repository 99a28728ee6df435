"""The shared suite: every memory in ``MEMORIES`` obeys the streaming contract."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from memory_helpers import NAMES, build, stream
from svattn.memory import MEMORIES, causal_outputs

REQUIRED = {"sv", "h2o", "h2o_oracle", "snapkv", "sliding", "full", "deltanet", "linear"}


def test_registry_has_required_names():
    assert REQUIRED <= set(MEMORIES)


@pytest.mark.parametrize("name", NAMES)
def test_read_shapes_and_array_types(name):
    mem = build(name)
    assert mem.read(np.zeros((3, 8))).shape == (3, 5)  # empty memory reads zeros
    k, v, q = stream(0, 30, 8, 5)
    mem.write_many(k, v, q)
    out = mem.read(q[:7])
    assert isinstance(out, np.ndarray) and out.shape == (7, 5) and out.dtype == np.float64
    tq = torch.from_numpy(q[:7]).float()
    tout = mem.read(tq)
    assert isinstance(tout, torch.Tensor) and tout.shape == (7, 5) and tout.dtype == torch.float32
    np.testing.assert_allclose(tout.numpy(), mem.read(tq.double().numpy()), rtol=1e-6)


@pytest.mark.parametrize("name", NAMES)
def test_causality_future_tokens_never_change_earlier_outputs(name):
    k, v, q = stream(1, 40, 8, 5)
    base = causal_outputs(build(name), k, v, q)
    k2, v2, q2 = k.copy(), v.copy(), q.copy()
    k2[25:] += 3.0
    v2[25:] -= 2.0
    q2[25:] *= -1.0
    changed = causal_outputs(build(name), k2, v2, q2)
    np.testing.assert_array_equal(base[:25], changed[:25])
    assert not np.allclose(base[25:], changed[25:])


@pytest.mark.parametrize("name", NAMES)
def test_tokens_kept_within_budget(name):
    k, v, q = stream(2, 60, 8, 5)
    mem = build(name, budget=12)
    for t in range(60):
        mem.write(k[t], v[t], q[t])
        size = mem.tokens_kept()
        assert size >= 1 and size == math.ceil(size)
        if mem.has_hard_budget:
            assert size <= mem.budget
        if mem.holds_tokens:
            kept = mem.kept_positions()
            assert len(kept) == size
            assert np.all(np.diff(kept) > 0) and kept.min() >= 0 and kept.max() <= t


def test_sv_state_is_its_support_not_a_hard_budget():
    """SV has no hard cap: the support has at least ceil(1/C) and |E| <= 1/C tokens."""
    k, v, q = stream(3, 80, 8, 5)
    mem = build("sv", budget=12)
    assert not mem.has_hard_budget and mem.C == pytest.approx(2 / 12)
    mem.write_many(k, v, q)
    part = mem.memory.partition()
    assert part["reserve"] == []  # compacted: only the support is held
    assert mem.tokens_kept() == len(part["margin"]) + len(part["error"])
    assert mem.tokens_kept() >= math.ceil(1 / mem.C)
    assert len(part["error"]) <= 1 / mem.C + 1e-9


@pytest.mark.parametrize("name", NAMES)
def test_long_stream_has_no_nan(name):
    t = 8192
    k, v, q = stream(4, t, 16, 8)
    mem = build(name, d=16, dv=8, budget=64)
    # large logits stress the softmax memories; far-apart keys make every SV token margin
    s = 1.0 if name == "sv" else 3.0
    mem.write_many(k * s, v, q * s)
    assert mem.n_seen == t
    out = mem.read(np.concatenate([q[-64:] * s, np.zeros((1, 16))]))
    assert np.all(np.isfinite(out))
    if mem.has_hard_budget:
        assert mem.tokens_kept() <= 64


@pytest.mark.parametrize("name", NAMES)
def test_deterministic_under_seed(name):
    outs = []
    for _ in range(2):
        k, v, q = stream(5, 50, 8, 5)
        mem = build(name)
        mem.write_many(k, v, q)
        outs.append(
            (mem.read(q), mem.kept_positions() if mem.holds_tokens else None, mem.tokens_kept())
        )
    np.testing.assert_array_equal(outs[0][0], outs[1][0])
    if outs[0][1] is not None:
        np.testing.assert_array_equal(outs[0][1], outs[1][1])
    assert outs[0][2] == outs[1][2]


@pytest.mark.parametrize("name", NAMES)
def test_write_many_equals_repeated_write_and_reset(name):
    k, v, q = stream(6, 45, 8, 5)
    a, b = build(name), build(name)
    a.write_many(k, v, q)
    for t in range(45):
        b.write(k[t], v[t], q[t])
    assert a.n_seen == b.n_seen == 45
    np.testing.assert_allclose(a.read(q), b.read(q), rtol=1e-10, atol=1e-12)
    if a.holds_tokens:
        np.testing.assert_array_equal(a.kept_positions(), b.kept_positions())
    a.reset()
    assert a.n_seen == 0
    np.testing.assert_array_equal(a.read(q[:2]), np.zeros((2, 5)))
    a.write_many(k, v, q)
    np.testing.assert_allclose(a.read(q), b.read(q), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", NAMES)
def test_keys_stand_in_for_missing_queries(name):
    k, v, _ = stream(7, 30, 8, 5)
    a, b = build(name), build(name)
    a.write_many(k, v)
    b.write_many(k, v, k)
    np.testing.assert_array_equal(a.read(k), b.read(k))


@pytest.mark.parametrize("name", NAMES)
def test_unknown_option_is_rejected(name):
    with pytest.raises(TypeError, match="unexpected keyword argument 'windw'"):
        build(name, windw=3)


@pytest.mark.parametrize("name", NAMES)
def test_bad_input_raises_and_leaves_state(name):
    mem = build(name)
    k, v, q = stream(8, 20, 8, 5)
    mem.write_many(k, v, q)
    before = mem.read(q)
    with pytest.raises(ValueError, match=r"key must have shape \[8\]"):
        mem.write(np.zeros(7), np.zeros(5))
    with pytest.raises(ValueError, match=r"value must have shape \[5\]"):
        mem.write(np.zeros(8), np.zeros(6))
    with pytest.raises(ValueError, match=r"keys must have shape \[n, 8\]"):
        mem.write_many(np.zeros((3, 1, 8)), np.zeros((3, 5)))
    with pytest.raises(ValueError, match="same number of rows"):
        mem.write_many(np.zeros((3, 8)), np.zeros((4, 5)))
    with pytest.raises(ValueError, match=r"queries must have shape \[n, 8\]"):
        mem.read(np.zeros(8))
    with pytest.raises(ValueError, match="key must be finite"):
        mem.write(np.full(8, np.nan), np.zeros(5))
    assert mem.n_seen == 20
    np.testing.assert_array_equal(mem.read(q), before)


@pytest.mark.parametrize("name", NAMES)
def test_bad_dims_and_budget(name):
    with pytest.raises(ValueError, match="dim must be an int >= 1"):
        build(name, d=0)
    with pytest.raises(ValueError, match="value_dim must be an int >= 1"):
        build(name, dv=0)
    with pytest.raises(ValueError, match="budget must be an int >= 1"):
        build(name, budget=0)


@pytest.mark.parametrize("name", ["sliding", "h2o", "h2o_oracle", "snapkv"])
def test_window_larger_than_budget(name):
    with pytest.raises(ValueError, match=r"window \(13\) must be <= budget \(12\)"):
        build(name, budget=12, window=13)
