"""Fuzzing the public API: only documented exceptions, and no state change on error."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from persist_helpers import live_state
from svattn.exact import SVDDMemory, UnknownTokenError
from svattn.exact.auditor.persist import StateFileError

# documented: TypeError / ValueError (UnknownTokenError, KernelOverflowError and
# StateFileError are ValueErrors)
DOCUMENTED = (TypeError, ValueError)

SPECIAL = [0.0, -0.0, 5e-324, -1e-310, 2.2e-308, 1e-160, 1e150, -1e154, 1e200, 1e300,
           -1.7e308, np.nan, np.inf, -np.inf]
floats = st.one_of(
    st.floats(-3, 3, allow_nan=False),
    st.floats(-3, 3, allow_nan=False),
    st.sampled_from(SPECIAL),
    st.floats(allow_nan=True, allow_infinity=True),
)


@st.composite
def arrays(draw, d: int, batch: bool):
    """Mostly well-formed arrays of dimension d, sometimes the wrong shape or type."""
    kind = draw(st.sampled_from(["ok"] * 6 + ["shape", "list", "str", "none", "int"]))
    n = draw(st.integers(1, 4)) if batch else None
    dd = d if kind != "shape" else draw(st.integers(0, 4))
    shape = (n, dd) if batch else (dd,)
    if kind == "shape" and draw(st.booleans()):
        shape = (2, 2, dd) if batch else (1, dd)
    size = int(np.prod(shape))
    vals = draw(st.lists(floats, min_size=size, max_size=size))
    arr = np.array(vals, dtype=np.float64).reshape(shape)
    if kind == "list":
        return arr.tolist()
    if kind == "str":
        return "abc"
    if kind == "none":
        return None
    if kind == "int":
        return arr.astype(np.int64) if np.isfinite(arr).all() and np.abs(arr).max(
            initial=0) < 1e9 else arr
    return arr


token_ids = st.one_of(st.integers(-3, 40), st.sampled_from([2**63, -(2**70), 1.0, True, "1",
                                                            None, np.int64(1), np.uint8(2)]))


def _snap(mem):
    return (len(mem), mem.solver_state.next_id, mem.state_digest(), live_state(mem))


@settings(max_examples=int(os.environ.get("SVATTN_FUZZ_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_random_call_sequences(data, tmp_path_factory):
    d = data.draw(st.integers(1, 4), label="d")
    C = data.draw(st.sampled_from([0.05, 0.2, 0.5, 1.0]), label="C")
    kernel = data.draw(st.sampled_from(["rbf", "rbf", "exp"]), label="kernel")
    mem = SVDDMemory(C, kernel)
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    # a healthy population first (so removals have something to hit)
    base = rng.normal(size=(data.draw(st.integers(0, 30), label="n0"), d)) * 0.5
    if len(base):
        mem.extend(base)
    tmp = tmp_path_factory.mktemp("fuzz")
    for step in range(data.draw(st.integers(1, 12), label="steps")):
        op = data.draw(st.sampled_from(["add", "extend", "remove", "remove_many", "compact",
                                        "readout", "decision", "save_load", "add_ok"]))
        before = _snap(mem)
        try:
            if op == "add":
                mem.add(data.draw(arrays(d, False)))
            elif op == "add_ok":
                mem.add(rng.normal(size=d) * data.draw(st.sampled_from([1e-3, 0.5, 1, 3])))
            elif op == "extend":
                mem.extend(data.draw(arrays(d, True)))
            elif op == "remove":
                mem.remove(data.draw(token_ids))
            elif op == "remove_many":
                mem.remove_many(data.draw(st.lists(token_ids, max_size=4)))
            elif op == "compact":
                mem.compact()
            elif op in ("readout", "decision"):
                q = data.draw(arrays(d, True))
                out = mem.readout(q) if op == "readout" else mem.decision_function(q)
                assert np.isfinite(out).all()
            else:
                path = tmp / f"s{step}.safetensors"
                mem.save(path)
                got = SVDDMemory.load(path)
                assert _snap(got)[:3] == before[:3]
        except DOCUMENTED as exc:
            assert _snap(mem) == before, f"{op} raised {exc!r} and changed the state"
            continue
        # after a success the memory is sound
        if len(mem):
            assert np.isfinite(mem.alpha).all() and np.isfinite(mem.mu)
            live = mem.solver_state.live_slots()
            assert np.isfinite(mem.solver_state.KC[live][:, : mem.solver_state.chi]).all()
            assert np.isfinite(mem.solver_state.g[live]).all()
            assert mem.kkt_residual() <= 1e-8, (op, mem.kkt_residual())


def test_documented_exception_types():
    assert issubclass(UnknownTokenError, ValueError)
    assert issubclass(StateFileError, ValueError)


@pytest.mark.parametrize("bad", [[1e200, 0.0], [1e-320, 1e300], [1.7e308, -1.7e308]])
def test_huge_keys_are_refused_or_handled(bad):
    mem = SVDDMemory(0.5)
    mem.extend(np.random.default_rng(0).normal(size=(4, 2)))
    before = _snap(mem)
    try:
        mem.add(bad)
    except DOCUMENTED:
        assert _snap(mem) == before
    else:
        assert np.isfinite(mem.alpha).all() and mem.kkt_residual() <= 1e-8
        assert mem.alpha[-1] > 0  # a far outlier carries weight


def test_huge_queries_are_refused():
    mem = SVDDMemory(0.5)
    mem.extend(np.random.default_rng(0).normal(size=(4, 2)))
    with pytest.raises(ValueError, match="queries are too large"):
        mem.readout([[1e200, 0.0]])
    assert np.isfinite(mem.readout([[1e100, 0.0]])).all()
