"""Torch conventions of ``SVAttention`` / ``sv_attention`` (issue #23): half precision
and autocast, torch's ``key_padding_mask``, constructor validation, ``repr``."""

from __future__ import annotations

import pytest
import torch

from svattn.nn import SVAttention, sv_attention


def _layer(seed: int = 0, **kw) -> SVAttention:
    torch.manual_seed(seed)
    return SVAttention(16, 2, C=kw.pop("C", 0.2), **kw)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
def test_half_precision_weights_run_in_float32_and_return_the_input_dtype(dtype):
    layer = _layer()
    x = torch.randn(2, 10, 16)
    ref = layer(x.to(dtype).float())  # the same (rounded) input, float32 weights
    half = layer.to(dtype)
    out = half(x.to(dtype))
    assert out.dtype == dtype
    out.float().square().sum().backward()
    assert half.q_proj.weight.grad.dtype == dtype and torch.isfinite(half.q_proj.weight.grad).all()
    # only the projections' rounding differs: the memory itself is solved in float32
    assert torch.allclose(out.float(), ref, atol=0.1, rtol=0.1)


def test_autocast_bf16():
    layer = _layer()
    x = torch.randn(2, 10, 16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    assert out.dtype == torch.bfloat16
    assert torch.allclose(out.float(), layer(x), atol=0.1, rtol=0.1)


def test_functional_half_inputs():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4, generator=g) for _ in range(3))
    out, alpha = sv_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), C=0.25,
                              return_alpha=True)
    assert out.dtype == torch.bfloat16 and alpha.dtype == torch.float32
    ref = sv_attention(q.bfloat16().float(), k.bfloat16().float(), v.bfloat16().float(), C=0.25)
    assert torch.allclose(out.float(), ref, atol=1e-2)


@pytest.mark.parametrize("mode", ["batched", "exact"])
def test_key_padding_mask_means_what_torch_means(mode):
    """True = ignore, [B, Tk]: a padded row equals the same row with the padding cut off."""
    layer = _layer(mode=mode).double()
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    ctx = torch.randn(2, 12, 16, dtype=torch.float64)
    pad = torch.zeros(2, 12, dtype=torch.bool)
    pad[1, 8:] = True  # row 1 has 8 real keys
    out = layer(x, ctx, key_padding_mask=pad)
    cut = layer(x[1:], ctx[1:, :8])
    assert torch.allclose(out[1:], cut, atol=1e-6)
    assert torch.equal(out, layer(x, ctx, key_mask=~pad[:, None, :]))
    # torch's float form: 0 = keep, -inf = ignore
    additive = torch.zeros(2, 12, dtype=torch.float64).masked_fill(pad, float("-inf"))
    assert torch.equal(out, layer(x, ctx, key_padding_mask=additive))
    # and torch's MultiheadAttention drops the same keys: its output ignores them too
    mha = torch.nn.MultiheadAttention(16, 2, batch_first=True).double()
    a = mha(x, ctx, ctx, key_padding_mask=pad)[0][1:]
    b = mha(x[1:], ctx[1:, :8], ctx[1:, :8])[0]
    assert torch.allclose(a, b, atol=1e-10)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(key_mask=torch.ones(2, 12, dtype=torch.bool)),
         r"key_mask of shape \(2, 12\) is ambiguous.*key_padding_mask"),
        (dict(key_mask=torch.ones(3, 12, dtype=torch.bool)),
         r"key_mask of shape \(3, 12\) does not broadcast"),
        (dict(key_mask=torch.ones(2, 1, 12, dtype=torch.bool),
              key_padding_mask=torch.zeros(2, 12, dtype=torch.bool)), "not both"),
        (dict(key_padding_mask=torch.zeros(2, 2, 12, dtype=torch.bool)),
         r"key_padding_mask must be \[B, Tk\] = \[2, 12\]"),
        (dict(key_padding_mask=torch.zeros(2, 11, dtype=torch.bool)),
         r"key_padding_mask must be \[B, Tk\] = \[2, 12\].*got \(2, 11\)"),
        (dict(key_padding_mask=torch.zeros(2, 12, dtype=torch.int64)), "bool .* or float"),
        (dict(key_padding_mask=torch.full((2, 12), -1.0)), r"only 0 \(keep\) and -inf"),
    ],
    ids=["2d-key-mask-B-equals-H", "2d-key-mask-B", "both", "3d-padding", "wrong-Tk",
         "int-padding", "additive-bias"],
)
def test_ambiguous_or_bad_masks_are_refused(kwargs, match):
    layer = _layer()
    x, ctx = torch.randn(2, 5, 16), torch.randn(2, 12, 16)
    with pytest.raises(ValueError, match=match):
        layer(x, ctx, **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(C=-1), "C must be a finite number > 0"),
        (dict(C=float("nan")), "C must be a finite number > 0"),
        (dict(C="big"), "C must be a positive real number"),
        (dict(kernel="foo"), r"kernel must be one of \('rbf', 'exp'\), got 'foo'"),
        (dict(mode="fast"), "mode must be one of"),
        (dict(gamma=-2.0), "gamma must be > 0"),
    ],
    ids=["C-negative", "C-nan", "C-string", "kernel", "mode", "gamma"],
)
def test_constructor_validates(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SVAttention(16, 2, **{"C": 0.2, **kwargs})


def test_repr_names_the_memory_parameters():
    text = repr(SVAttention(16, 2, C=0.125, kernel="exp", mode="exact"))
    for word in ("d_model=16", "n_heads=2", "C=0.125", "kernel='exp'", "mode='exact'",
                 "gamma=None", "SolverOptions(ridge=0.001"):
        assert word in text, text
