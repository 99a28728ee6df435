"""No host synchronisation in the batched forward and backward (issue #24).

Under :func:`svattn.nn.common.no_host_reads` the CPU runs what an accelerator
runs: no value checks, no early exits. A dispatch mode then records every op
that reads a tensor value on the host (``.item()``, ``bool(t)``, ``nonzero``...):
there must be none, and putting one back into the solver must be caught.
"""

from __future__ import annotations

import pytest
import torch
from nn_keys import random_keys
from sync_guard import host_reads_of

import svattn.nn.batched as batched
from svattn.mixers import HybridSVAttention
from svattn.nn import SolverOptions, SVAttention, sv_attention, sv_attention_state
from svattn.nn.common import host_reads, no_host_reads

SOLVERS = {"lm": SolverOptions(max_iter=5, refine=0, ridge_steps=0, finish="approximate"),
           "repair": SolverOptions(max_iter=5, refine=3, ridge_steps=1, finish="approximate")}


def _sv_attention_step(solver):
    k = random_keys(2, 2, 24, 4, seed=1).requires_grad_(True)
    q, v = random_keys(2, 2, 5, 4, seed=2), random_keys(2, 2, 24, 3, seed=3)
    mask = torch.ones(2, 1, 24, dtype=torch.bool)
    mask[1, :, 20:] = False

    def step():
        out = sv_attention(q, k, v, C=0.2, key_mask=mask, solver=solver)
        out.square().sum().backward()

    return step


def _masked_step(solver):
    """A padded batch with a sequence shorter than 1/C, read causally: the short
    memories' stand-ins and the empty-row guard add no host read either."""
    k = random_keys(3, 2, 8, 4, seed=1).requires_grad_(True)
    q, v = random_keys(3, 2, 8, 4, seed=2), random_keys(3, 2, 8, 3, seed=3)
    padding = torch.arange(8)[None, :] >= torch.tensor([8, 2, 0])[:, None]

    def step():
        out = sv_attention(q, k, v, C=0.2, key_padding_mask=padding, is_causal=True,
                           solver=solver)
        out.square().sum().backward()

    return step


def _layer_step(solver):
    torch.manual_seed(0)
    layer = SVAttention(8, 2, C=0.2, solver=solver).double()
    x = torch.randn(2, 12, 8, dtype=torch.float64)
    return lambda: layer(x).square().sum().backward()


def _hybrid_step(solver, policy):
    torch.manual_seed(0)
    mix = HybridSVAttention(8, 2, chunk=8, C=0.25, budget=8, policy=policy, rope=True,
                            solver=solver)
    x = torch.randn(2, 30, 8)
    return lambda: mix(x).square().sum().backward()


STEPS = {
    "sv_attention": _sv_attention_step,
    "sv_attention-masked": _masked_step,
    "SVAttention": _layer_step,
    "hybrid-support": lambda s: _hybrid_step(s, "support"),
    "hybrid-full": lambda s: _hybrid_step(s, "full"),
}


@pytest.mark.parametrize("solver", sorted(SOLVERS))
@pytest.mark.parametrize("what", sorted(STEPS))
def test_no_host_reads_in_forward_and_backward(what, solver):
    step = STEPS[what](SOLVERS[solver])
    with no_host_reads():
        assert host_reads_of(step) == []


def test_an_item_put_back_into_the_solver_is_caught(monkeypatch):
    """The guard is not vacuous: one ``.item()`` in FISTA shows up, in every layer."""
    fista = batched.fista

    def fista_with_item(K, d, C, valid, **kw):
        a, it = fista(K, d, C, valid, **kw)
        if float(a.sum()) < 0:  # a host read, as an early exit would do
            raise AssertionError("unreachable")
        return a, it

    monkeypatch.setattr(batched, "fista", fista_with_item)
    for name, make in STEPS.items():
        with no_host_reads():
            seen = host_reads_of(make(SOLVERS["lm"]))
        assert "aten._local_scalar_dense" in seen, name


@pytest.mark.parametrize("n", [24, 40], ids=["dense", "compact"])
def test_cpu_shortcuts_change_nothing(n):
    """On CPU (eager) the repair stops once settled, the retry is skipped when every
    problem settled, and from DENSE_CPU_MAX keys on the margin systems are gathered
    to their size: the result of the static schedule an accelerator runs (bit for bit
    on the dense form, to rounding on the compact one)."""
    assert host_reads(torch.zeros(1)) and (n > batched.DENSE_CPU_MAX) == (n == 40)
    k = random_keys(2, 2, n, 4, seed=5)
    q, v = random_keys(2, 2, 6, 4, seed=6), random_keys(2, 2, n, 3, seed=7)
    opts = SolverOptions(max_iter=10, refine=10, finish="approximate")
    fast = sv_attention_state(q, k, v, C=0.1, solver=opts)
    with no_host_reads():
        static = sv_attention_state(q, k, v, C=0.1, solver=opts)
    for a, b in zip(fast[2], static[2], strict=True):  # the partition
        assert torch.equal(a, b)
    tol = 0.0 if n == 24 else 1e-12
    for a, b in zip(fast[:2], static[:2], strict=True):  # output, alpha
        torch.testing.assert_close(a, b, rtol=0, atol=tol)


def test_large_problems_read_the_margin_size():
    """Above DENSE_MAX keys the margin system is gathered to its size: the one
    documented host read of the eager path."""
    n = batched.DENSE_MAX + 8
    k = random_keys(1, 1, n, 4, seed=8, dtype=torch.float32)
    q, v = random_keys(1, 1, 3, 4, seed=9, dtype=torch.float32), random_keys(1, 1, n, 2, seed=10)
    solver = SolverOptions(max_iter=3, refine=0, finish="approximate")
    with no_host_reads():
        seen = host_reads_of(lambda: sv_attention(q, k, v.float(), C=0.05, solver=solver))
    assert seen and set(seen) == {"aten._local_scalar_dense"}
