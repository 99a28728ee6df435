"""The optimum finish on a working set (svattn.nn.working_set) against the full finish.

The reference is the batched solver's full path (every problem's ``n × n`` kernel matrix,
FISTA over all keys, the active set of svattn.nn.finish_cpu on all of them), reached by
raising :data:`~svattn.nn.working_set.WORKING_SET_MIN` above the problem size. The
working set is made small here (a start of a few keys, a few joining per round) so that
small problems take several rounds: the growth, the global KKT check and both fallbacks
run. Values, the partition, the diagnostics and every gradient are compared.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from nn_keys import clustered_keys, random_keys

from svattn.nn import sv_attention, sv_attention_state
from svattn.nn import working_set as ws
from svattn.nn.finish_cpu import copy_groups_reference
from svattn.nn.groups_cpu import copy_groups, sort_direction

REL = 64 * float(np.finfo(np.float32).eps)


def _with_copies(X: np.ndarray) -> np.ndarray:
    X = X.copy()
    X[10:20] = X[3]  # exact copies
    X[30] = X[4] * (1 + 1e-7)  # rounding-level copies
    X[31] = X[4] + 2e-6 * np.linalg.norm(X[4]) / np.sqrt(X.shape[1])
    X[40] = X[5] * (1 + 1e-3)  # near, but not a copy
    return X


@pytest.mark.parametrize("case", ["random", "copies", "all-equal", "orthogonal", "masked"])
def test_copy_groups_are_the_reference_groups(case):
    rng = np.random.default_rng(0)
    n, D = 300, 6
    X = rng.standard_normal((n, D)).astype(np.float32).astype(np.float64)
    valid = np.ones(n, dtype=bool)
    if case in ("copies", "masked"):
        X = _with_copies(X)
    if case == "all-equal":
        X[:] = X[0]
    if case == "orthogonal":  # every key orthogonal to the sort direction: no pruning
        u = sort_direction(D)
        X = _with_copies(X - np.outer(X @ u, u))
    if case == "masked":
        valid[::7] = False
        valid[3] = False  # a representative absent: its copies group without it
    got, want = copy_groups(X, valid, REL), copy_groups_reference(X, valid, REL)
    for g, w in zip(got, want, strict=True):
        np.testing.assert_array_equal(g, w)
    if case == "copies":
        assert got[1][3] == 11 and got[1][4] == 3 and got[1][5] == 1


@pytest.fixture
def small_sets(monkeypatch):
    """Working sets on problems of a few dozen keys: start at 8, 4 join per round."""
    monkeypatch.setattr(ws, "WORKING_SET_MIN", 16)
    monkeypatch.setattr(ws, "WORKING_SET_START", 8)
    monkeypatch.setattr(ws, "WORKING_SET_GROW", 4)
    return monkeypatch


def _both(monkeypatch, fn):
    """``fn()`` on working sets, then on the full path."""
    got = fn()
    with monkeypatch.context() as m:
        m.setattr(ws, "WORKING_SET_MIN", 10**9)
        want = fn()
    return got, want


def _run(q, k, v, C, kernel, **kw):
    """Output, alpha, partition, info and the gradients of a weighted loss."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out, alpha, part, info = sv_attention_state(q, k, v, C=C, kernel=kernel, **kw)
    w = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    grads = torch.autograd.grad((out * w).sum() + (alpha * alpha).sum(), (q, k, v))
    return out.detach(), alpha.detach(), part, info, grads


CASES = {
    "rbf-random": (lambda dt: random_keys(2, 2, 120, 4, seed=1, dtype=dt), 0.1, "rbf"),
    "rbf-clustered": (lambda dt: clustered_keys(1, 2, 150, 4, seed=2, dtype=dt), 0.05, "rbf"),
    "exp-errors": (lambda dt: random_keys(1, 2, 160, 4, seed=3, dtype=dt), 0.04, "exp"),
}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_values_partition_and_gradients_are_the_full_finishs(small_sets, case, dtype):
    make, C, kernel = CASES[case]
    k = make(dtype)
    k[:, :, 10:16] = k[:, :, 2:3]  # exact copies across the working set's edge
    B, H, T, D = k.shape
    q, v = random_keys(B, H, 9, D, seed=7, dtype=dtype), random_keys(B, H, T, 3, seed=8,
                                                                      dtype=dtype)
    rounds = []
    real = ws.working_set_optimum

    def spy(*a, **kw):
        res = real(*a, **kw)
        rounds.append(res[0].rounds.copy())
        return res

    small_sets.setattr(ws, "working_set_optimum", spy)
    got, want = _both(small_sets, lambda: _run(q, k, v, C, kernel))
    assert len(rounds) == 1
    if kernel == "rbf":  # (the exp kernel's first working set, its largest keys, holds it)
        assert rounds[0].max() >= 2  # a working set grew
    atol = 1e-12 if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(got[0], want[0], rtol=0, atol=atol)  # output
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=atol)  # alpha
    for a, b in zip(got[2], want[2], strict=True):  # margin, error, reserve
        assert bool((a == b).all())
    assert int(got[3].unsettled) == int(want[3].unsettled) == 0
    assert int(got[3].box_violations) == int(want[3].box_violations) == 0
    assert got[3].fista_iters == want[3].fista_iters
    assert float(got[3].max_kkt_violation) <= 1e-9
    for a, b in zip(got[4], want[4], strict=True):  # d q, d k, d v
        scale = float(b.abs().max())
        torch.testing.assert_close(a, b, rtol=0, atol=(1e-10 if dtype == torch.float64
                                                       else 1e-4) * scale)


def test_padded_keys_get_no_weight_and_match_the_full_finish(small_sets):
    k = random_keys(2, 2, 100, 4, seed=4)
    q, v = random_keys(2, 2, 5, 4, seed=5), random_keys(2, 2, 100, 3, seed=6)
    pad = torch.zeros(2, 100, dtype=torch.bool)
    pad[0, 70:] = True  # the first row's last 30 keys are padding
    got, want = _both(small_sets, lambda: _run(q, k, v, 0.05, "rbf", key_padding_mask=pad))
    assert float(got[1][0, :, 70:].abs().max()) == 0.0
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=1e-12)
    for a, b in zip(got[4], want[4], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-10 * float(b.abs().max()))
    assert float(got[4][1][0, :, 70:].abs().max()) == 0.0  # no gradient to padding


def test_gradients_match_finite_differences_through_the_working_set(small_sets):
    k = random_keys(1, 1, 40, 3, seed=10).requires_grad_(True)
    q, v = random_keys(1, 1, 4, 3, seed=11), random_keys(1, 1, 40, 2, seed=12)

    def f(k):
        return sv_attention(q, k, v, C=0.1, return_alpha=True)

    assert torch.autograd.gradcheck(f, (k,), eps=1e-6, atol=1e-6, rtol=1e-4)


def test_a_failed_working_set_solve_falls_back_to_the_oracle(small_sets):
    """The active set made to fail on every working set: the oracle solves it, the
    answer is still the full finish's, and the fallbacks are counted."""
    k = random_keys(1, 2, 60, 3, seed=20)
    q, v = random_keys(1, 2, 4, 3, seed=21), random_keys(1, 2, 60, 2, seed=22)
    real = ws.solve_reduced

    def fail(*a, **kw):
        x, mu, _ = real(*a, **kw)
        return x, mu, False

    small_sets.setattr(ws, "solve_reduced", fail)
    got, want = _both(small_sets, lambda: _run(q, k, v, 0.1, "rbf"))
    assert int(got[3].fallbacks) == 2 and int(got[3].unsettled) == 0
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=1e-9)


def test_a_working_set_that_has_not_converged_goes_to_the_oracle(small_sets):
    """One round from a start of 8 keys cannot hold the optimum: the full problem goes
    to the oracle, as the full finish's fallback, and gives its answer."""
    small_sets.setattr(ws, "WORKING_SET_ROUNDS", 1)
    k = random_keys(1, 1, 80, 3, seed=23)
    q, v = random_keys(1, 1, 4, 3, seed=24), random_keys(1, 1, 80, 2, seed=25)
    got, want = _both(small_sets, lambda: _run(q, k, v, 0.25, "rbf"))
    assert int(got[3].fallbacks) == 1 and int(got[3].unsettled) == 0
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=1e-9)


def test_long_memories_take_the_working_set_on_cpu(monkeypatch):
    """From WORKING_SET_MIN keys (CPU, eager, the optimum finish) and not below it, nor
    with the approximate finish."""
    calls = []
    real = ws.solve_working_set

    def spy(*a, **kw):
        calls.append(a[0].shape[2])
        return real(*a, **kw)

    monkeypatch.setattr(ws, "solve_working_set", spy)
    monkeypatch.setattr(ws, "WORKING_SET_MIN", 64)
    for T, finish in ((64, "optimum"), (63, "optimum"), (64, "approximate")):
        k = random_keys(1, 1, T, 3, seed=T)
        sv_attention(k, k, k, C=0.1, finish=finish)
    assert calls == [64]
