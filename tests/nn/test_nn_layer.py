"""SVAttention: shapes, state size, certified selection (dropping reserve tokens)."""

from __future__ import annotations

import pytest
import torch

from svattn.nn import SVAttention

TOL = {torch.float32: 1e-6, torch.float64: 1e-12}


def _layer(n_heads, mode, dtype, C=0.1, seed=0):
    torch.manual_seed(seed)
    return SVAttention(16, n_heads, C=C, mode=mode).to(dtype)


@pytest.mark.parametrize("mode", ["batched", "exact"])
def test_shapes_and_tokens_kept(mode):
    layer = _layer(2, mode, torch.float64)
    x = torch.randn(3, 9, 16, dtype=torch.float64)
    ctx = torch.randn(3, 30, 16, dtype=torch.float64)
    out, alpha = layer(x, ctx, return_alpha=True)
    part = layer.last_partition_
    assert out.shape == (3, 9, 16) and alpha.shape == (3, 2, 30)
    kept = (part.margin | part.error).sum(-1)
    assert layer.tokens_kept() == int(kept.max())
    assert (alpha > 0).sum(-1).max() <= layer.tokens_kept()
    assert ((part.margin.int() + part.error.int() + part.reserve.int()) == 1).all()


@pytest.mark.parametrize("mode", ["batched", "exact"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_dropping_reserve_tokens_leaves_output_unchanged(mode, dtype):
    """Certified selection: a one-head layer, reserve tokens physically removed."""
    layer = _layer(1, mode, dtype)
    x = torch.randn(2, 7, 16, dtype=dtype)
    ctx = torch.randn(1, 60, 16, dtype=dtype).expand(2, 60, 16)
    out, alpha = layer(x, ctx, return_alpha=True)
    part = layer.last_partition_
    keep = ~part.reserve[0, 0]
    assert part.reserve.sum() > 0 and (part.reserve[0] == part.reserve[1]).all()
    out2 = layer(x, ctx[:, keep])
    torch.testing.assert_close(out2, out, rtol=0, atol=TOL[dtype])


@pytest.mark.parametrize("mode", ["batched", "exact"])
def test_masking_reserve_tokens_per_head_leaves_output_unchanged(mode):
    layer = _layer(2, mode, torch.float64)
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    ctx = torch.randn(2, 50, 16, dtype=torch.float64)
    out = layer(x, ctx)
    out2 = layer(x, ctx, key_mask=~layer.last_partition_.reserve)
    torch.testing.assert_close(out2, out, rtol=0, atol=1e-12)


def test_gradients_reach_all_projections():
    layer = _layer(2, "batched", torch.float32)
    layer(torch.randn(2, 20, 16)).square().sum().backward()
    for name, p in layer.named_parameters():
        assert p.grad is not None and p.grad.abs().max() > 0, name


def test_return_alpha_gives_out_and_alpha_as_sv_attention_does():
    # the layer returned (out, alpha, partition) where sv_attention returns (out, alpha)
    from svattn.nn import sv_attention

    layer = _layer(2, "batched", torch.float64)
    x = torch.randn(2, 12, 16, dtype=torch.float64)
    got = layer(x, return_alpha=True)
    q = torch.randn(2, 2, 12, 8, dtype=torch.float64)
    assert len(got) == len(sv_attention(q, q, q, C=0.1, return_alpha=True)) == 2
    out, alpha = got
    assert out.shape == (2, 12, 16) and alpha.shape == (2, 2, 12)
    assert torch.equal(alpha > 0, layer.last_partition_.kept() & (alpha > 0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_factory_arguments_make_the_parameters_on_that_device_and_dtype(dtype):
    layer = SVAttention(16, 2, C=0.2, device="cpu", dtype=dtype)
    for name, p in layer.named_parameters():
        assert (p.device.type, p.dtype) == ("cpu", dtype), name
    assert layer(torch.randn(2, 6, 16, dtype=dtype)).dtype == dtype


@pytest.mark.parametrize("mode", ["batched", "exact"])
def test_a_sequence_first_layer_reads_t_b_e_inputs(mode):
    # a (T, B, E) input was silently read as (B, T, E): batch_first=False reads it as
    # torch.nn.MultiheadAttention(batch_first=False) does
    torch.manual_seed(3)
    first = SVAttention(16, 2, C=0.1, mode=mode, dtype=torch.float64)
    seq = SVAttention(16, 2, C=0.1, mode=mode, dtype=torch.float64, batch_first=False)
    seq.load_state_dict(first.state_dict())
    x = torch.randn(3, 9, 16, dtype=torch.float64)  # (B, T, E)
    ctx = torch.randn(3, 20, 16, dtype=torch.float64)
    pad = torch.zeros(3, 20, dtype=torch.bool)
    pad[1, 15:] = True
    out, alpha = first(x, ctx, key_padding_mask=pad, return_alpha=True)
    out_s, alpha_s = seq(x.transpose(0, 1), ctx.transpose(0, 1), key_padding_mask=pad,
                         return_alpha=True)
    assert out_s.shape == (9, 3, 16) and alpha_s.shape == (3, 2, 20)
    torch.testing.assert_close(out_s, out.transpose(0, 1), rtol=0, atol=1e-12)
    torch.testing.assert_close(alpha_s, alpha, rtol=0, atol=1e-12)
    assert "batch_first=False" in repr(seq)


def test_batch_first_must_be_a_bool():
    with pytest.raises(ValueError, match="batch_first must be a bool, got 'no'"):
        SVAttention(16, 2, C=0.1, batch_first="no")
