"""The compiled error-sum sync's early return (``checks._in_sync``) against the full sync
it skips: the same arrays out, bit for bit, in every state the sync meets.

``_full_sync`` is ``checks.error_sum_sync`` as it was before the early return: its
Python text with ``_in_sync`` answering no. It is compared three ways: on the solver's own states at
every Python-level sync of long random operation sequences (add, extend, remove,
remove_many, erase by tag, compact, operations failed and restored; rbf and exp),
on crafted states (random token states, members and rebuild flags over a real cache:
DRIVEN and FREE slots, error tokens with and without a column past nS, members past
hi), and the compiled memory against the numpy reference backend over the same
sequences.
"""

from __future__ import annotations

import numpy as np
import pytest

from fault_injection import Injected, install_faults
from svattn.exact import OperationError, SVDDMemory
from svattn.exact.backends.compiled import checks
from svattn.exact.backends.compiled.columns import kernel_column
from svattn.exact.core.kktsets import DRIVEN, ERROR, FREE, MARGIN, RESERVE
from svattn.exact.view import instrument

_SYNC_TEXT = checks.error_sum_sync.py_func  # (taken before any test wraps the kernel)


def _full_sync(*args):
    """``checks.error_sum_sync`` without its early return: its own Python text run over
    its kernels, with ``_in_sync`` answering no for the call."""
    real = checks._in_sync
    checks._in_sync = lambda member, state, hi: False  # (the text looks it up per call)
    try:
        return _SYNC_TEXT(*args)
    finally:
        checks._in_sync = real


class _Spy:
    """Wraps ``checks.error_sum_sync``: each call also runs :func:`_full_sync` on copies
    of what it writes, and the two must agree bit for bit."""

    def __init__(self, real):
        self.real, self.early, self.full = real, 0, 0

    def __call__(self, esum, member, *rest):
        e2, m2 = esum.copy(), member.copy()
        want = _full_sync(e2, m2, *rest)
        got = self.real(esum, member, *rest)
        assert got == want
        assert np.array_equal(member, m2)
        assert esum.tobytes() == e2.tobytes()
        hi, rebuild = rest[8], rest[-1]
        if not rebuild and want == 0 and np.array_equal(member[:hi], rest[3][:hi] == ERROR):
            self.early += 1
        else:
            self.full += 1
        return got


def _stream(kernel: str, rng, n: int) -> np.ndarray:
    centers = rng.normal(size=(5, 4))
    x = centers[rng.integers(0, 5, n)] + 0.4 * rng.normal(size=(n, 4))
    x[rng.random(n) < 0.05] *= 2.5
    return 0.4 * x if kernel == "exp" else x


def _same(fast: SVDDMemory, ref: SVDDMemory) -> None:
    assert fast.ids == ref.ids
    assert fast.partition() == ref.partition()
    np.testing.assert_allclose(fast.alpha, ref.alpha, rtol=0, atol=1e-11)
    assert fast.kkt_residual() <= 1e-10 and ref.kkt_residual() <= 1e-10


def _op(mem: SVDDMemory, op: str, arg):
    if op == "add":
        return mem.add(arg[0], tag=arg[1])
    if op == "extend":
        return mem.extend(arg[0], tags=arg[1])
    if op == "remove":
        return mem.remove(arg)
    if op == "remove_many":
        return mem.remove_many(arg)
    if op == "erase":
        return mem.erase(arg)
    return mem.compact()


@pytest.mark.parametrize("kernel", ["rbf", "exp"])
def test_the_early_return_equals_the_full_sync_over_random_operations(monkeypatch, kernel):
    spy = _Spy(checks.error_sum_sync)
    monkeypatch.setattr(checks, "error_sum_sync", spy)
    faults = install_faults(monkeypatch)
    rng = np.random.default_rng(31 if kernel == "rbf" else 32)
    X = _stream(kernel, rng, 900)
    fast = SVDDMemory(0.03, kernel=kernel, tag_key=b"k" * 32)
    ref = SVDDMemory(0.03, kernel=kernel, backend="reference", tag_key=b"k" * 32)
    tags = [f"s{i}" for i in range(8)]
    first = [tags[i % 8] for i in range(120)]
    fast.extend(X[:120], tags=first)
    ref.extend(X[:120], tags=first)
    _same(fast, ref)
    j, failed, done = 120, 0, {}
    for _step in range(140):
        part = fast.partition()
        op = rng.choice(["add", "add", "extend", "remove", "remove", "remove_many",
                         "erase", "compact"], p=[.2, .1, .1, .2, .15, .1, .1, .05])
        if op in ("remove", "remove_many", "erase") and len(fast) < 40:
            op = "add"
        if op == "add":
            arg = (X[j], tags[rng.integers(8)] if rng.random() < 0.5 else None)
            j += 1
        elif op == "extend":
            m = int(rng.integers(2, 6))
            arg = (X[j:j + m], [tags[rng.integers(8)] for _ in range(m)])
            j += m
        elif op == "remove":  # a margin or error token mostly: the syncs with work
            pool = part["margin"] + part["error"] if rng.random() < 0.8 else fast.ids
            arg = int(pool[rng.integers(len(pool))])
        elif op == "remove_many":
            arg = [int(t) for t in rng.choice(fast.ids, 3, replace=False)]
        elif op == "erase":
            arg = tags[rng.integers(8)]
        else:
            arg = None
        try:
            _op(ref, op, arg)
        except ValueError:  # an erase of a tag no live token holds
            with pytest.raises(ValueError):
                _op(fast, op, arg)
            continue
        if rng.random() < 0.15:  # the compiled operation fails part-way and is restored
            before = fast.state_digest()
            faults.fail_at = faults.calls + int(rng.integers(1, 30))
            try:
                _op(fast, op, arg)
            except (Injected, OperationError):
                failed += 1
                assert fast.state_digest() == before
                faults.fail_at = -1
                _op(fast, op, arg)  # and then succeeds from the restored state
            faults.fail_at = -1
        else:
            _op(fast, op, arg)
        done[op] = done.get(op, 0) + 1
        _same(fast, ref)
        ss = instrument(fast)  # the state the early return relies on: no slot past hi used
        assert (ss.state[ss.hi:] == FREE).all()
        assert (ss.slot_of_col[: ss.chi] < ss.hi).all()
    assert failed >= 5 and len(done) == 6, (failed, done)
    assert spy.early >= 20 and spy.full >= 20, (spy.early, spy.full)


@pytest.mark.parametrize("kernel", ["rbf", "exp"])
def test_the_early_return_equals_the_full_sync_on_crafted_states(kernel):
    rng = np.random.default_rng(5 if kernel == "rbf" else 6)
    mem = SVDDMemory(0.03, kernel=kernel)
    mem.extend(_stream(kernel, rng, 200))
    for t in mem.partition()["reserve"][:10]:  # holes below hi
        mem.remove(t)
    ss = instrument(mem)
    hi, nS = ss.hi, ss.nS
    gamma = ss.gamma_value
    # columns past nS for some error tokens (an operation's shape: they keep theirs
    # until it ends); the cache grows to hold them
    err = np.flatnonzero(ss.state[:hi] == ERROR)
    assert len(err) >= 4 and nS >= 2
    ccap = nS + len(err) + 4
    KC = np.zeros((ss.KC.shape[0], ccap))
    KC[:, : ss.chi] = ss.KC[:, : ss.chi]
    soc = np.full(ccap, -1, np.int64)
    soc[: ss.chi] = ss.slot_of_col[: ss.chi]
    cos = ss.col_of_slot.copy()
    chi = ss.chi
    live = ss.live_slots()
    for s in err[::2]:
        col = chi
        tmp = np.zeros((hi, 1))
        kernel_column(tmp, ss.X, ss.diag, int(s), 0, hi, gamma, ss.is_rbf)
        KC[:hi, col] = np.where(ss.state[:hi] == FREE, 0.0, tmp[:, 0])
        soc[col], cos[s] = s, col
        chi += 1
    chi += 1  # a hole at the end of the used columns
    cases = 0
    for trial in range(300):
        state = ss.state.copy()
        member = ss.esum_member.copy()
        kind = trial % 6
        pick = rng.choice(live, int(rng.integers(1, 6)), replace=False)
        if kind == 0:  # in sync as found
            pass
        elif kind == 1:  # tokens change set: DRIVEN, MARGIN, RESERVE, ERROR
            state[pick] = rng.choice([DRIVEN, MARGIN, RESERVE, ERROR], len(pick))
        elif kind == 2:  # in sync after the change (members follow the error set)
            state[pick] = rng.choice([DRIVEN, MARGIN, RESERVE, ERROR], len(pick))
            member[:hi] = state[:hi] == ERROR
        elif kind == 3:  # a member freed (its slot wiped), or the last slot out of sync
            state[pick[0]] = FREE
            member[hi - 1] = not member[hi - 1]
        elif kind == 4:  # members past hi (never read), in sync below it
            member[hi:] = rng.random(len(member) - hi) < 0.5
        else:  # members toggled at random
            member[pick] = ~member[pick]
        for rebuild in (False, True):
            e1, m1 = ss.esum.copy(), member.copy()
            e2, m2 = ss.esum.copy(), member.copy()
            args = (KC, soc, cos, state, ss.X, ss.diag, nS, chi, hi, gamma, ss.is_rbf,
                    rebuild)
            got = checks.error_sum_sync(e1, m1, *args)
            want = _full_sync(e2, m2, *args)
            assert got == want, (trial, rebuild)
            assert np.array_equal(m1, m2), (trial, rebuild)
            assert e1.tobytes() == e2.tobytes(), (trial, rebuild)
            cases += 1
    assert cases == 600
