"""Unlearning baselines: coefficient decay and gradient ascent, against a retrain."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from svattn.exact import SVDDMemory
from svattn.unlearning import (
    SVState,
    coefficient_decay,
    deviation_from_retrain,
    exact_removal_state,
    gradient_ascent_unlearn,
    retrain_without,
    unlearning_table,
)


@pytest.fixture(scope="module")
def memory():
    rng = np.random.default_rng(0)
    mem = SVDDMemory(C=0.1)
    mem.extend(rng.normal(size=(70, 4)), rng.normal(size=(70, 3)))
    return mem


PROBES = np.random.default_rng(1).normal(size=(40, 4))


def test_snapshot_matches_memory(memory):
    state = SVState.from_memory(memory)
    np.testing.assert_allclose(state.readout(PROBES), memory.readout(PROBES), atol=1e-13)
    np.testing.assert_allclose(
        state.decision_function(PROBES), memory.decision_function(PROBES), atol=1e-13
    )


def test_exact_removal_matches_retrain_and_decay_does_not(memory):
    c = memory.support_ids()[0]
    ref = retrain_without(memory, c)
    exact = deviation_from_retrain(exact_removal_state(memory, c), ref, PROBES)
    assert exact.partition_identical
    assert exact.max_abs_alpha < 1e-9 and exact.decision_max < 1e-9 and exact.readout_max < 1e-9
    decay = deviation_from_retrain(coefficient_decay(memory, c, 0.01), ref, PROBES)
    assert decay.decision_max > 1e-4 and decay.readout_max > 1e-4 and decay.max_abs_alpha > 1e-4
    assert c in memory.ids  # the memory itself was not touched


def test_decay_keeps_a_distribution_and_factor_one_is_identity(memory):
    c = memory.support_ids()[1]
    same = coefficient_decay(memory, c, 1.0)
    np.testing.assert_allclose(same.alpha, memory.alpha, atol=1e-15)
    np.testing.assert_allclose(same.readout(PROBES), memory.readout(PROBES), atol=1e-13)
    dropped = coefficient_decay(memory, c, 0.0)
    assert c not in dropped.ids and dropped.alpha.sum() == pytest.approx(1.0, abs=1e-14)


def test_reserve_token_removal_is_exact_for_both(memory):
    """A reserve token has alpha = 0: decay and removal leave the retrained state."""
    r = memory.partition()["reserve"][0]
    ref = retrain_without(memory, r)
    for state in (coefficient_decay(memory, r, 0.0), exact_removal_state(memory, r)):
        rep = deviation_from_retrain(state, ref, PROBES)
        assert rep.readout_max < 1e-9 and rep.max_abs_alpha < 1e-9


def test_table_rows_share_one_schema(memory):
    rows = unlearning_table(memory, memory.support_ids()[2], PROBES, factors=(0.5, 0.0))
    assert [r["method"] for r in rows] == ["exact remove", "decay x0.5", "decay x0"]
    assert len({tuple(r) for r in rows}) == 1


def test_bad_unlearning_input(memory):
    with pytest.raises(ValueError, match=r"factor must lie in \[0, 1\]"):
        coefficient_decay(memory, memory.ids[0], 1.5)
    with pytest.raises(ValueError, match="token_id 10000 is not held"):
        coefficient_decay(memory, 10000, 0.5)


def _train_classifier(x, y, seed=0, steps=60):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 16), nn.Tanh(), nn.Linear(16, 3))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return model.eval()


def _nll(model, batch):
    x, y = batch
    return nn.functional.cross_entropy(model(x), y)


def test_gradient_ascent_raises_forget_loss_and_reports_output_deviation(memory):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(120, 4, generator=g)
    y = torch.randint(0, 3, (120,), generator=g)
    model = _train_classifier(x, y)
    forget = (x[:10], y[:10])
    before = [p.clone() for p in model.parameters()]
    unlearned, losses = gradient_ascent_unlearn(model, _nll, forget, steps=5, lr=0.1)
    assert losses[-1] > losses[0] and len(losses) == 6
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))
    retrained = _train_classifier(x[10:], y[10:])
    rep = deviation_from_retrain(unlearned, retrained, x[:20])
    assert math.isfinite(rep.readout_max) and rep.readout_max > 0
    assert math.isnan(rep.max_abs_alpha) and rep.partition_identical is None
    with pytest.raises(ValueError, match="steps must be an int >= 0"):
        gradient_ascent_unlearn(model, _nll, forget, steps=-1)
    with pytest.raises(TypeError, match="two nn.Modules or two SVStates"):
        deviation_from_retrain(unlearned, SVState.from_memory(memory), x)
