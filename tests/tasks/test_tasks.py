"""The synthetic recall tasks: shapes, vocabularies, scored positions, query law, seeds."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from svattn.tasks import IGNORE, ROLES, TASKS, MQARConfig, SelectiveCopyConfig
from svattn.tasks.base import gumbel_top_k


def _mqar(**kw) -> MQARConfig:
    base = dict(seq_len=128, num_kv_pairs=8, vocab_size=256, num_train=300, num_test=50)
    return MQARConfig(**{**base, **kw})


def test_mqar_shapes_and_dtypes():
    d = _mqar().build(0)
    assert d.train_inputs.shape == d.train_targets.shape == d.train_roles.shape == (300, 128)
    assert d.test_inputs.shape == (50, 128)
    assert d.train_inputs.dtype == d.train_targets.dtype == torch.int64
    assert int(d.train_inputs.min()) >= 0 and int(d.train_inputs.max()) < 256
    assert d.vocab_size == 256 and d.seq_len == 128


def test_mqar_keys_and_values_come_from_disjoint_halves():
    d = _mqar().build(1)
    x, role = d.train_inputs, d.train_roles
    keys, values = x[role == ROLES["key"]], x[role == ROLES["value"]]
    assert int(keys.min()) >= 1 and int(keys.max()) < 128
    assert int(values.min()) >= 128 and int(values.max()) < 256
    for row in range(20):  # distinct within a sequence
        k = x[row, 0:16:2]
        assert len(set(k.tolist())) == 8 and len(set(x[row, 1:16:2].tolist())) == 8


def test_mqar_scores_only_queries_and_their_target_is_the_keys_value():
    d = _mqar().build(2)
    x, y, role = d.train_inputs, d.train_targets, d.train_roles
    scored = y != IGNORE
    assert torch.equal(scored, role == ROLES["query"])
    assert int(scored.sum(1).min()) == int(scored.sum(1).max()) == 8  # each key asked once
    for row in range(30):
        pairs = dict(zip(x[row, 0:16:2].tolist(), x[row, 1:16:2].tolist(), strict=True))
        for t in torch.nonzero(scored[row]).flatten().tolist():
            assert t >= 16 and t % 2 == 0
            assert y[row, t].item() == pairs[x[row, t].item()]
        assert sorted(x[row][scored[row]].tolist()) == sorted(pairs)


def test_mqar_query_slots_follow_the_power_law():
    cfg = _mqar(seq_len=512, num_kv_pairs=4, num_train=4000, num_test=1)
    role = cfg.build(3).train_roles
    slot = (torch.nonzero(role == ROLES["query"])[:, 1] - 8) // 2  # 0-based slot
    counts = np.bincount(slot.numpy(), minlength=cfg.slots)
    # p(g) ∝ g^(a−1), a = 0.01: the first slot alone is ~15 %; uniform would be 0.4 %.
    first = counts[0] / counts.sum()
    assert 0.08 < first < 0.25
    quarter = cfg.slots // 4
    assert counts[:quarter].sum() > 3 * counts[-quarter:].sum()
    # a = 1 is uniform: the two ends of the slot range balance
    uni = _mqar(seq_len=512, num_kv_pairs=4, num_train=4000, power_a=1.0).build(3).train_roles
    s = ((torch.nonzero(uni == ROLES["query"])[:, 1] - 8) // 2).numpy()
    lo, hi = (s < quarter).sum(), (s >= cfg.slots - quarter).sum()
    assert abs(lo - hi) < 0.15 * (lo + hi)


def test_mqar_is_deterministic_per_seed_and_splits_differ():
    a, b, c = _mqar().build(5), _mqar().build(5), _mqar().build(6)
    assert torch.equal(a.train_inputs, b.train_inputs)
    assert torch.equal(a.test_targets, b.test_targets)
    assert not torch.equal(a.train_inputs, c.train_inputs)
    assert not torch.equal(a.train_inputs[:50], a.test_inputs)


@pytest.mark.parametrize("kw, word", [
    (dict(seq_len=63), "even"), (dict(num_kv_pairs=40), "4·n"),
    (dict(vocab_size=10), "vocab_size"), (dict(power_a=0.0), "power_a"),
    (dict(num_train=0), "num_train"),
], ids=["odd-T", "too-many-pairs", "small-vocab", "power-a", "no-train"])
def test_mqar_rejects_bad_configs(kw, word):
    with pytest.raises(ValueError, match=word):
        _mqar(**kw)


def test_selective_copy_targets_are_the_data_tokens_in_order():
    cfg = SelectiveCopyConfig(seq_len=96, num_data=8, num_symbols=6, num_train=200, num_test=20)
    d = cfg.build(0)
    x, y, role = d.train_inputs, d.train_targets, d.train_roles
    assert x.shape == (200, 96) and d.vocab_size == 8
    assert torch.equal(y != IGNORE, role == ROLES["marker"])
    assert torch.all(x[:, -8:] == 1) and torch.all(role[:, -8:] == ROLES["marker"])
    for row in range(50):
        data = x[row, :88][role[row, :88] == ROLES["data"]]
        assert data.numel() == 8 and torch.all(data >= 2) and torch.all(data < 8)
        assert torch.equal(y[row, -8:], data)  # in order of position
        assert torch.all(x[row, :88][role[row, :88] == ROLES["filler"]] == 0)
    assert cfg.chance == pytest.approx(1 / 6)


def test_selective_copy_positions_spread_over_the_whole_filler():
    cfg = SelectiveCopyConfig(seq_len=512, num_data=16, num_train=500, num_test=1)
    role = cfg.build(1).train_roles
    pos = torch.nonzero(role == ROLES["data"])[:, 1].numpy()
    assert pos.max() < 512 - 16
    hist = np.histogram(pos, bins=4, range=(0, 496))[0]
    assert hist.min() > 0.8 * hist.mean()  # uniform, not bunched at the start
    assert torch.equal(cfg.build(1).train_inputs, SelectiveCopyConfig(
        seq_len=512, num_data=16, num_train=500, num_test=1).build(1).train_inputs)


def test_selective_copy_rejects_too_short_sequences():
    with pytest.raises(ValueError, match="2·num_data"):
        SelectiveCopyConfig(seq_len=20, num_data=16)


def test_gumbel_top_k_matches_sequential_draws():
    p = np.array([0.5, 0.3, 0.15, 0.05])
    idx = gumbel_top_k(np.random.default_rng(0), np.log(p), 2, rows=20000)
    first = np.bincount(idx[:, 0], minlength=4) / 20000
    np.testing.assert_allclose(first, p, atol=0.015)
    # P(second = 1) = sum over first = j != 1 of p_j · p_1 / (1 − p_j)
    want = sum(p[j] * p[1] / (1 - p[j]) for j in (0, 2, 3))
    assert abs((idx[:, 1] == 1).mean() - want) < 0.015
    assert np.all(idx[:, 0] != idx[:, 1])


def test_registry_names_every_task():
    assert TASKS == {"mqar": MQARConfig, "selective-copy": SelectiveCopyConfig}
