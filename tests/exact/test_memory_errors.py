"""Bad input gets a precise error and leaves the memory unchanged (the constructors'
parameters included, for SVDD too)."""

from __future__ import annotations

import numpy as np
import pytest

from exact_helpers import HUGE, snapshot
from svattn.exact import KernelOverflowError, SVDDMemory, UnknownTokenError


@pytest.fixture
def mem() -> SVDDMemory:
    m = SVDDMemory(0.1)
    m.extend(np.random.default_rng(0).normal(size=(40, 3)))
    m.remove(5)
    return m


@pytest.mark.parametrize(
    "call, exc, match",
    [
        (lambda m: m.add([np.nan, 0.0, 0.0]), ValueError, "key must be finite"),
        (lambda m: m.add([np.inf, 0.0, 0.0]), ValueError, "key must be finite"),
        (lambda m: m.add([0.0, 0.0]), ValueError, "dimension d=3, got 2"),
        (lambda m: m.add(np.zeros((1, 3))), ValueError, r"key must be 1-D \(d,\)"),
        (lambda m: m.add("abc"), TypeError, "key must be an array of real numbers"),
        (lambda m: m.extend(np.zeros(3)), ValueError, r"keys must be 2-D \(n, d\)"),
        (lambda m: m.extend(np.zeros((2, 2, 3))), ValueError, r"keys must be 2-D"),
        (lambda m: m.extend(np.r_[np.zeros((3, 3)), [[0, np.nan, 0]]]), ValueError, "finite"),
        (lambda m: m.extend(np.zeros((2, 3)), np.zeros((2, 3))), ValueError, "keys as values"),
        (lambda m: m.remove(5), UnknownTokenError, "token_id 5 is not in the memory .it was"),
        (lambda m: m.remove(99), UnknownTokenError, "was never added"),
        (lambda m: m.remove(-1), UnknownTokenError, "was never added"),
        (lambda m: m.remove(1.0), TypeError, "token_id must be an int"),
        (lambda m: m.remove_many([1, 2, 1]), ValueError, "lists id 1 twice"),
        (lambda m: m.remove_many([1, 5]), UnknownTokenError, "token_id 5"),
        (lambda m: m.readout(np.zeros((2, 4))), ValueError, r"queries must have shape \(m, 3\)"),
        (lambda m: m.readout([[np.nan, 0, 0]]), ValueError, "queries must be finite"),
    ],
    ids=lambda p: p if isinstance(p, str) else "",
)
def test_bad_input_raises_and_leaves_state(mem, call, exc, match):
    before = snapshot(mem)
    with pytest.raises(exc, match=match):
        call(mem)
    assert snapshot(mem) == before
    mem.add(np.zeros(3))  # still fully usable
    assert mem.kkt_residual() <= 1e-10


class _OutOfMemoryRows(list):
    """Valid rows whose conversion to an array runs out of memory (as a conversion of
    rows too large for the process would)."""

    def __array__(self, dtype=None, copy=None):
        raise MemoryError("the rows do not fit")


@pytest.mark.parametrize(("call", "rows"), [
    (lambda m, r: m.extend(r), [[0.1, 0.2, 0.3], [0.0, 1.0, 0.5]]),
    (lambda m, r: m.add(r), [0.1, 0.2, 0.3]),
    (lambda m, r: m.extend(np.zeros((1, 3)), r), [[0.1, 0.2, 0.3]]),
    (lambda m, r: m.readout(r), [[0.1, 0.2, 0.3]]),
], ids=["extend", "add", "values", "readout"])
def test_running_out_of_memory_on_valid_rows_is_not_called_a_type_error(call, rows):
    # is_numeric caught every exception of the conversion, so valid keys that did not
    # fit were refused as "not an array of real numbers" (a TypeError about the data)
    m = SVDDMemory(0.1)
    m.extend(np.random.default_rng(0).normal(size=(40, 3)), np.zeros((40, 3)))
    before = snapshot(m)
    with pytest.raises(MemoryError, match="do not fit"):
        call(m, _OutOfMemoryRows(rows))
    assert snapshot(m) == before


def test_unknown_token_error_is_both_key_and_value_error(mem):
    with pytest.raises(KeyError):
        mem.remove(12345)
    with pytest.raises(ValueError):
        mem.remove(12345)


def test_remove_from_empty_memory():
    m = SVDDMemory(0.5)
    with pytest.raises(UnknownTokenError, match="the memory is empty"):
        m.remove(0)
    with pytest.raises(ValueError, match="memory is empty"):
        m.readout(np.zeros((1, 2)))


@pytest.mark.parametrize("C", [0, -1.0, float("nan"), float("inf")])
def test_bad_C(C):
    with pytest.raises(ValueError, match="C must be a finite number > 0"):
        SVDDMemory(C)


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="kernel must be one of"):
        SVDDMemory(0.1, kernel="poly")
    with pytest.raises(ValueError, match="gamma must be None or a finite number > 0"):
        SVDDMemory(0.1, gamma=-1.0)
    with pytest.raises(ValueError, match="tol must be"):
        SVDDMemory(0.1, tol=0.0)
    with pytest.raises(TypeError, match="C must be a positive real number"):
        SVDDMemory("0.1")


def test_values_required_once_given():
    m = SVDDMemory(0.2)
    m.add([0.0, 1.0], [1.0, 2.0, 3.0])
    before = snapshot(m)
    with pytest.raises(ValueError, match="value is required"):
        m.add([1.0, 0.0])
    with pytest.raises(ValueError, match="dimension dv=3, got 2"):
        m.add([1.0, 0.0], [1.0, 2.0])
    with pytest.raises(ValueError, match="value must be finite"):
        m.add([1.0, 0.0], [1.0, np.nan, 2.0])
    assert snapshot(m) == before


def test_exp_kernel_overflow_is_refused_and_state_kept():
    m = SVDDMemory(0.2, kernel="exp", gamma=1.0)
    m.extend(np.random.default_rng(1).normal(size=(10, 2)))
    before = snapshot(m)
    with pytest.raises(KernelOverflowError, match="exp kernel overflows float64"):
        m.add([30.0, 0.0])  # gamma·x·x = 900 > log(max float64)
    with pytest.raises(ValueError):  # KernelOverflowError is a ValueError
        m.extend(np.array([[0.0, 0.0], [0.0, 40.0]]))
    assert snapshot(m) == before
    assert len(m) == 10


def test_repr_names_parameters_and_sizes_but_no_data():
    X = np.random.default_rng(4).normal(size=(40, 3)) + 123.456
    mem = SVDDMemory(0.1, standby=4)
    mem.extend(X)
    text = repr(mem)
    part = mem.partition()
    for piece in ("C=0.1", "kernel='rbf'", "standby=4", "backend='compiled'", "n=40",
                  f"margin={len(part['margin'])}", f"reserve={len(part['reserve'])}"):
        assert piece in text, (piece, text)
    assert "123" not in text  # no key digits
    warm = SVDDMemory(0.1)
    warm.extend(X[:3])  # n·C < 1: the uniform warm-up state
    assert "n=3" in repr(warm) and "warm-up" in repr(warm)


@pytest.mark.slow  # test_keys_and_numeric_edges.py covers such diagonals by default
def test_exp_kernel_keys_with_diagonals_over_many_orders_of_magnitude_solve_exactly():
    # gamma·‖x‖² ≈ 100 on average (K_ii from e^10 to e^300 in one memory): the batch
    # solve's active-set finish cycled between infeasible partitions (62 of 100 such
    # 17-key extends raised RuntimeError) and the kept inverse lost its pivots (numba's
    # ZeroDivisionError); now every one ends exact
    worst = 0.0
    for seed in range(30):
        rng = np.random.default_rng(seed)
        X = rng.normal(size=(17, 3))
        gamma = 1 / np.sqrt(3)
        X *= np.sqrt(100 / gamma / (X**2).sum(1).mean())
        mem = SVDDMemory(C=0.1, kernel="exp")
        mem.extend(X)
        mem.remove(mem.support_ids()[0])
        worst = max(worst, mem.kkt_residual())
    assert worst <= 1e-10


def test_rbf_near_copies_never_raise_mid_operation():
    for seed in range(20):
        rng = np.random.default_rng(seed)
        base = rng.normal(size=(25, 2))
        X = np.concatenate([base, base + 1e-9 * rng.normal(size=base.shape)])
        mem = SVDDMemory(0.05, gamma=1.0)
        ids = mem.extend(X[rng.permutation(len(X))])
        for t in ids[:10]:
            mem.remove(t)
        assert len(mem) == 40


# the same huge int given to the constructors
def test_huge_int_parameters_are_refused_by_the_constructors():
    from svattn import SVDD

    with pytest.raises(ValueError, match="C must be"):
        SVDDMemory(C=HUGE)
    with pytest.raises(ValueError, match="gamma must be"):
        SVDDMemory(C=0.5, gamma=HUGE)
    X = np.random.default_rng(0).normal(size=(10, 2))
    with pytest.raises(ValueError, match="C must be"):
        SVDD(C=HUGE).fit(X)
    with pytest.raises(ValueError, match="gamma must be"):
        SVDD(gamma=HUGE).fit(X)
