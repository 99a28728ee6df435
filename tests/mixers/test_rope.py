"""Rotary positions: against explicit rotation matrices, and inside the softmax mixers.

Causality with rope on is checked by the shared mixer suite (test_mixers.py)."""

from __future__ import annotations

import math

import pytest
import torch

from svattn.lm import CharLM, CharLMConfig
from svattn.mixers import MIXERS, HybridSVAttention
from svattn.mixers.rope import ROPE_BASE, apply_rotary, apply_rotary_qk


def rotary_reference(x: torch.Tensor, offset: int = 0) -> torch.Tensor:
    """One explicit 2×2 rotation per (position, pair): pair i = (x_i, x_{i + Dh/2})."""
    B, H, T, Dh = x.shape
    half = Dh // 2
    out = torch.empty_like(x)
    for t in range(T):
        R = torch.zeros(Dh, Dh, dtype=x.dtype)
        for i in range(half):
            a = (offset + t) * ROPE_BASE ** (-2 * i / Dh)
            c, s = math.cos(a), math.sin(a)
            R[i, i], R[i, i + half] = c, -s
            R[i + half, i], R[i + half, i + half] = s, c
        out[:, :, t] = x[:, :, t] @ R.T
    return out


@pytest.mark.parametrize("offset", [0, 7])
def test_matches_rotation_matrices_values_and_gradients(offset):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 9, 8, generator=g, dtype=torch.float64, requires_grad=True)
    fast, slow = apply_rotary(x, offset), rotary_reference(x, offset)
    torch.testing.assert_close(fast, slow, rtol=0, atol=1e-12)
    w = torch.randn(fast.shape, generator=g, dtype=torch.float64)
    (gf,) = torch.autograd.grad((fast * w).sum(), x)
    (gs,) = torch.autograd.grad((slow * w).sum(), x)
    torch.testing.assert_close(gf, gs, rtol=0, atol=1e-12)


def test_scores_depend_on_distance_only_and_norms_are_kept():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 1, 1, 16, generator=g, dtype=torch.float64)
    k = torch.randn(1, 1, 1, 16, generator=g, dtype=torch.float64)
    near = (apply_rotary(q, 5) @ apply_rotary(k, 2).mT).item()
    far = (apply_rotary(q, 105) @ apply_rotary(k, 102).mT).item()
    assert near == pytest.approx(far, abs=1e-10)
    assert near != pytest.approx((apply_rotary(q, 5) @ apply_rotary(k, 3).mT).item(), abs=1e-6)
    x = torch.randn(2, 2, 30, 16, generator=g, dtype=torch.float64)
    torch.testing.assert_close(apply_rotary(x).norm(dim=-1), x.norm(dim=-1), rtol=1e-12, atol=0)


def test_bad_input():
    with pytest.raises(ValueError, match=r"x must have layout \[B, H, T, Dh\]"):
        apply_rotary(torch.randn(3, 8))
    with pytest.raises(ValueError, match="even head width"):
        apply_rotary(torch.randn(1, 1, 4, 5))
    with pytest.raises(ValueError, match=r"q and k must have one layout \[B, H, T, Dh\]"):
        apply_rotary_qk(torch.randn(1, 1, 4, 8), torch.randn(1, 1, 5, 8))
    with pytest.raises(ValueError, match="rope needs an even head width"):
        MIXERS["softmax"](d_model=6, n_heads=2, rope=True)
    with pytest.raises(ValueError, match="rope must be a bool"):
        MIXERS["sliding"](d_model=8, n_heads=2, window=4, rope=1)


def test_a_full_window_without_positions_is_an_unordered_set():
    """Why rope exists: NoPE sliding attention cannot see the order inside its window."""
    torch.manual_seed(0)
    x = torch.randn(1, 24, 16, dtype=torch.float64)
    perm = x.clone()
    perm[:, 16:23] = x[:, 16:23].flip(1)  # reorder the window of the last query, keep the query
    for rope, same in ((False, True), (True, False)):
        torch.manual_seed(3)
        mix = MIXERS["sliding"](d_model=16, n_heads=2, window=8, rope=rope).double()
        y, yp = mix(x)[:, -1], mix(perm)[:, -1]
        assert torch.allclose(y, yp, rtol=0, atol=1e-12) is same


def test_full_window_and_one_chunk_equal_rope_softmax():
    torch.manual_seed(1)
    ref = MIXERS["softmax"](d_model=16, n_heads=4, rope=True).double()
    state = ref.state_dict()
    sliding = MIXERS["sliding"](d_model=16, n_heads=4, window=64, rope=True).double()
    sliding.load_state_dict(state)
    hybrid = HybridSVAttention(16, 4, chunk=64, C=0.1, rope=True).double()
    hybrid.load_state_dict({**state, "gate": hybrid.gate.detach()})
    x = torch.randn(2, 40, 16, dtype=torch.float64)
    torch.testing.assert_close(sliding(x), ref(x), rtol=0, atol=1e-12)
    torch.testing.assert_close(hybrid(x), ref(x), rtol=0, atol=1e-12)


def test_hybrid_rope_moves_the_local_path_only():
    """With the gate saturated to the global path, rope changes chunk 0 only."""
    torch.manual_seed(2)
    plain = HybridSVAttention(16, 2, chunk=8, C=0.25, gate_init=60.0).double()
    rotary = HybridSVAttention(16, 2, chunk=8, C=0.25, gate_init=60.0, rope=True).double()
    rotary.load_state_dict(plain.state_dict())
    x = torch.randn(1, 32, 16, dtype=torch.float64)
    a, b = plain(x), rotary(x)
    torch.testing.assert_close(a[:, 8:], b[:, 8:], rtol=0, atol=1e-9)  # memory: content only
    assert not torch.allclose(a[:, 1:8], b[:, 1:8])  # chunk 0: local softmax, now positioned


def test_charlm_rope_option():
    cfg = CharLMConfig(n_layer=1, n_embd=16, n_head=2, block_size=32, rope=True)
    torch.manual_seed(0)
    plain = CharLM(CharLMConfig(n_layer=1, n_embd=16, n_head=2, block_size=32))
    torch.manual_seed(0)
    model = CharLM(cfg)
    assert model.num_params() == plain.num_params()  # no parameters added
    assert model.blocks[0].mix.rope and not plain.blocks[0].mix.rope
    with pytest.raises(ValueError, match="mixer 'deltanet' has no rotary option"):
        CharLM(CharLMConfig(n_layer=1, n_embd=16, n_head=2, mixer="deltanet", rope=True,
                            mixer_options={"chunk_size": 16}))  # fmt: skip
    with pytest.raises(ValueError, match=r"CharLMConfig.rope must be a bool"):
        CharLMConfig(rope="yes")
