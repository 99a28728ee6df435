"""DeltaNet and linear-attention memories against the naive operators of svattn.ops."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from memory_helpers import stream
from svattn.memory import DeltaNetMemory, LinearAttentionMemory, causal_outputs
from svattn.ops import elu_feature_map, naive_recurrent_delta_rule, naive_recurrent_linear_attn


def _t(x):
    return torch.from_numpy(x)[None, None]  # (1, 1, T, D)


@pytest.mark.parametrize("beta", [1.0, 0.3])
def test_deltanet_memory_matches_naive_delta_rule(beta):
    k, v, q = stream(0, 50, 6, 4)
    got = causal_outputs(DeltaNetMemory(dim=6, value_dim=4, budget=None, beta=beta), k, v, q)
    kn, qn = F.normalize(_t(k), dim=-1), F.normalize(_t(q), dim=-1)
    ref, _ = naive_recurrent_delta_rule(
        qn, kn, _t(v), torch.full((1, 1, 50), beta, dtype=torch.float64), scale=1.0
    )
    np.testing.assert_allclose(got, ref[0, 0].numpy(), rtol=1e-12, atol=1e-12)


def test_linear_memory_matches_naive_linear_attention():
    k, v, q = stream(1, 50, 6, 4)
    got = causal_outputs(LinearAttentionMemory(dim=6, value_dim=4, budget=None), k, v, q)
    ref, _ = naive_recurrent_linear_attn(elu_feature_map(_t(q)), elu_feature_map(_t(k)), _t(v))
    np.testing.assert_allclose(got, ref[0, 0].numpy(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cls", [DeltaNetMemory, LinearAttentionMemory], ids=["deltanet", "linear"])
def test_fixed_tokens_kept_ignores_budget(cls):
    a = cls(dim=8, value_dim=4, budget=3)
    b = cls(dim=8, value_dim=4, budget=None)
    a.write_many(*stream(2, 100, 8, 4)[:2])
    assert a.tokens_kept() == b.tokens_kept() == -(-a.state_floats() // 12)
    with pytest.raises(NotImplementedError, match="holds no tokens"):
        a.kept_positions()


def test_deltanet_bad_beta():
    with pytest.raises(ValueError, match=r"beta must lie in \(0, 2\)"):
        DeltaNetMemory(dim=2, value_dim=2, budget=None, beta=2.0)
