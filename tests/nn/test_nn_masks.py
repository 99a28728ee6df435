"""Masks as torch takes them, and memories over fewer than ⌈1/C⌉ keys.

The masked fast path (padded, batched, one memory per query) is compared on values
and every gradient with :func:`svattn.nn.attention.sv_attention_reference`, which solves
each memory alone on its unpadded keys; the mask conventions are compared with
torch's own functions (which keys get weight in SDPA and in MultiheadAttention).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from nn_keys import random_keys

from svattn.nn import SolverOptions, SVAttention, sv_attention, sv_attention_state
from svattn.nn.attention import sv_attention_reference

C = 0.3  # ⌈1/C⌉ = 4 keys for a memory of its own
TOL = {"exact": 1e-9, "batched": 1e-6}
SOLVER = SolverOptions(ridge=0.0, max_iter=200)  # batched without ridge: the exact optimum


def _qkv(B=3, H=2, Tq=6, Tk=6, D=3, seed=0):
    q, k = random_keys(B, H, Tq, D, seed=seed), random_keys(B, H, Tk, D, seed=seed + 1)
    v = random_keys(B, H, Tk, 2, seed=seed + 2)
    return q, k, v


def _padding(lengths, Tk):
    """torch's key_padding_mask (True = ignore) for sequences of these lengths."""
    return torch.arange(Tk)[None, :] >= torch.tensor(lengths)[:, None]


def _grads(out, *ts):
    w = torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)
    return torch.autograd.grad((out * w).sum(), ts)


def _compare_with_reference(mode, **masks):
    q, k, v = (t.requires_grad_(True) for t in _qkv())
    solver = SOLVER if mode == "batched" else None
    out, alpha = sv_attention(q, k, v, C=C, mode=mode, solver=solver, return_alpha=True,
                              **masks)
    ref, alpha_ref = sv_attention_reference(q, k, v, C=C, mode=mode, solver=solver, **masks)
    tol = TOL[mode]
    torch.testing.assert_close(out, ref, rtol=0, atol=tol)
    if alpha.dim() == 3:  # one memory per (batch, head): every query reads it
        alpha = alpha.unsqueeze(2).expand_as(alpha_ref)
    torch.testing.assert_close(alpha, alpha_ref, rtol=0, atol=tol)
    for g, g_ref in zip(_grads(out, q, k, v), _grads(ref, q, k, v), strict=True):
        torch.testing.assert_close(g, g_ref, rtol=0, atol=10 * tol)


@pytest.mark.parametrize("mode", ["exact", "batched"])
def test_padded_batch_equals_each_sequence_solved_alone(mode):
    """Lengths 6 (a full memory), 2 (short: < ⌈1/C⌉ = 4 keys) and 4 (exactly 1/C
    rounded up): values and gradients of q, k, v equal the per-sequence loop."""
    _compare_with_reference(mode, key_padding_mask=_padding([6, 2, 4], 6))


@pytest.mark.parametrize("mode", ["exact", "batched"])
def test_causal_equals_each_prefix_solved_alone(mode):
    """is_causal, with padding: query i reads a memory over keys j <= i (short for i < 3)."""
    _compare_with_reference(mode, is_causal=True, key_padding_mask=_padding([6, 5, 6], 6))


@pytest.mark.parametrize("mode", ["exact", "batched"])
def test_attn_mask_equals_each_row_solved_alone(mode):
    g = torch.Generator().manual_seed(4)
    sees = torch.rand(3, 1, 6, 6, generator=g) < 0.8  # SDPA's convention: True = takes part
    _compare_with_reference(mode, attn_mask=sees)


@pytest.mark.parametrize("mode", ["exact", "batched"])
def test_short_memory_shares_the_mass_and_masked_keys_get_nothing(mode):
    """A sequence of 2 real keys with C = 0.3 (needs 4): weight 1/2 each exactly, 0 on
    padding, flagged by box_raised; gradients reach only its real keys and values.
    Before, this batch raised "infeasible memory"."""
    q, k, v = (t.requires_grad_(True) for t in _qkv())
    kpm = _padding([6, 2, 4], 6)
    out, alpha, part, _ = sv_attention_state(q, k, v, C=C, mode=mode, key_padding_mask=kpm)
    assert torch.equal(alpha[1, :, :2], torch.full((2, 2), 0.5, dtype=alpha.dtype))
    assert torch.equal(alpha[1, :, 2:], torch.zeros(2, 4, dtype=alpha.dtype))
    assert torch.equal(alpha[2, :, 4:], torch.zeros(2, 2, dtype=alpha.dtype))
    assert part.box_raised(C).tolist() == [[False, False], [True, True], [False, False]]
    assert torch.equal(part.error[1], ~kpm[1].expand(2, 6))  # every real key at the raised box
    assert not (part.margin[1].any() or part.reserve[1].any())
    gq, gk, gv = _grads(out, q, k, v)
    assert torch.isfinite(gq).all()
    for g in (gk, gv):
        assert torch.equal(g[1, :, 2:], torch.zeros_like(g[1, :, 2:]))
        assert g[1, :, :2].abs().amax() > 0


@pytest.mark.parametrize("mode", ["exact", "batched"])
def test_a_sequence_alone_shorter_than_one_over_C_is_uniform(mode):
    """The rule is per memory, not per batch: 3 keys with C = 0.3 alone (no mask)."""
    q, k, v = _qkv(B=1, Tk=3)
    out, alpha = sv_attention(q, k, v, C=C, mode=mode, return_alpha=True)
    torch.testing.assert_close(alpha, torch.full_like(alpha, 1 / 3), rtol=0, atol=0)
    ref, _ = sv_attention_reference(q, k, v, C=C, mode=mode)
    torch.testing.assert_close(out, ref, rtol=0, atol=1e-12)


def test_empty_memory_reads_zero_as_sdpa_does():
    """A sequence with no key: output 0 and alpha 0 (SDPA gives 0 for a fully masked row),
    and no nan reaches any gradient."""
    q, k, v = (t.requires_grad_(True) for t in _qkv())
    kpm = _padding([6, 0, 3], 6)
    out, alpha = sv_attention(q, k, v, C=C, key_padding_mask=kpm, return_alpha=True)
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=~kpm[:, None, None, :])
    assert torch.equal(sdpa[1], torch.zeros_like(sdpa[1]))
    assert torch.equal(out[1], torch.zeros_like(out[1])) and not alpha[1].any()
    for g in _grads(out, q, k, v):
        assert torch.isfinite(g).all()
        assert not g[1].any()


def _sdpa_sees(q, k, **masks):
    """The keys each query attends to in torch's own SDPA: its weights, read with
    identity values, are > 0 exactly there."""
    B, H, Tk = k.shape[0], k.shape[1], k.shape[2]
    eye = torch.eye(Tk, dtype=k.dtype).expand(B, H, Tk, Tk)
    return F.scaled_dot_product_attention(q, k, eye, **masks) > 0


@pytest.mark.parametrize("kind", ["bool", "float", "causal", "causal-rectangular"])
def test_functional_masks_follow_sdpa(kind):
    Tq = 4 if kind == "causal-rectangular" else 6
    q, k, v = _qkv(Tq=Tq)
    g = torch.Generator().manual_seed(5)
    sees = torch.rand(3, 2, Tq, 6, generator=g) < 0.7
    masks = {"bool": {"attn_mask": sees},
             "float": {"attn_mask": torch.zeros(sees.shape, dtype=q.dtype).masked_fill(
                 ~sees, float("-inf"))}}.get(kind, {"is_causal": True})
    _, _, part, _ = sv_attention_state(q, k, v, C=C, **masks)
    assert torch.equal(part.present(), _sdpa_sees(q, k, **masks))


def _mha_sees(x, n_heads, **masks):
    """The keys each query attends to in torch's MultiheadAttention, ``[B, H, Tq, Tk]``."""
    mha = torch.nn.MultiheadAttention(x.shape[-1], n_heads, batch_first=True,
                                      dtype=x.dtype)
    _, w = mha(x, x, x, average_attn_weights=False, **masks)
    return w > 0


@pytest.mark.parametrize("kind", ["2d", "3d", "float", "padding", "padding+2d"])
def test_layer_masks_follow_multihead_attention(kind):
    """SVAttention takes attn_mask as nn.MultiheadAttention does (True = masked out;
    [Tq, Tk] or [B·H, Tq, Tk]): the keys each memory holds are those MHA attends to."""
    torch.manual_seed(0)
    B, H, T, E = 2, 2, 6, 8
    x = torch.randn(B, T, E, dtype=torch.float64)
    g = torch.Generator().manual_seed(6)
    banned = torch.rand(B * H, T, T, generator=g) > 0.7
    banned[..., 0] = False  # every query keeps a key (MHA gives nan for a fully masked row)
    masks = {"2d": {"attn_mask": banned[0]}, "3d": {"attn_mask": banned},
             "float": {"attn_mask": torch.zeros(T, T, dtype=x.dtype).masked_fill(
                 banned[1], float("-inf"))},
             "padding": {"key_padding_mask": _padding([6, 3], T)},
             "padding+2d": {"key_padding_mask": _padding([6, 3], T),
                            "attn_mask": banned[0]}}[kind]
    layer = SVAttention(E, H, C=C, dtype=torch.float64)
    layer(x, **masks)
    held = layer.last_partition_.present()
    held = held if held.dim() == 4 else held.unsqueeze(2).expand(B, H, T, T)
    assert torch.equal(held, _mha_sees(x, H, **masks))


def test_layer_causal_equals_the_functional_reference():
    torch.manual_seed(1)
    layer = SVAttention(6, 2, C=C, mode="exact", dtype=torch.float64)
    x = torch.randn(2, 5, 6, dtype=torch.float64)
    out, alpha = layer(x, is_causal=True, return_alpha=True)
    assert alpha.shape == (2, 2, 5, 5) and layer.box_raised().shape == (2, 2, 5)
    assert layer.box_raised()[:, :, :3].all() and not layer.box_raised()[:, :, 3:].any()
    q, k, v = (layer._heads(p(x)) for p in (layer.q_proj, layer.k_proj, layer.v_proj))
    ref, alpha_ref = sv_attention_reference(q, k, v, C=C, is_causal=True)
    torch.testing.assert_close(alpha, alpha_ref, rtol=0, atol=1e-9)
    torch.testing.assert_close(out, layer.out_proj(ref.transpose(1, 2).reshape(2, 5, 6)),
                               rtol=0, atol=1e-9)


def test_bad_masks_are_refused_by_name():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="attn_mask or is_causal, not both"):
        sv_attention(q, k, v, C=C, attn_mask=torch.ones(6, 6, dtype=torch.bool), is_causal=True)
    with pytest.raises(ValueError, match="only 0 .* and -inf"):
        sv_attention(q, k, v, C=C, attn_mask=torch.full((6, 6), 0.5, dtype=q.dtype))
    with pytest.raises(ValueError, match=r"does not broadcast to \[B, H, Tq, Tk\]"):
        sv_attention(q, k, v, C=C, attn_mask=torch.ones(5, 6, dtype=torch.bool))
    with pytest.raises(ValueError, match="is_causal must be a bool"):
        sv_attention(q, k, v, C=C, is_causal=1)
    layer = SVAttention(4, 2, C=C)
    with pytest.raises(ValueError, match=r"attn_mask must be \[Tq, Tk\].*True = masked out"):
        layer(torch.randn(2, 6, 4), attn_mask=torch.ones(2, 6, 6, dtype=torch.bool))
