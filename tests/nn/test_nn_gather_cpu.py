"""nn.gather_cpu: token rows in pieces (one Function, no cat) against the torch form."""

from __future__ import annotations

import pytest
import torch

from svattn.nn.gather_cpu import token_rows, token_rows_reference


def heads(B, T, H, D, dtype, layout):
    """(B, H, T, D) as the mixers see it: a split of a (B, T, 3·H·D) projection, or plain."""
    if layout == "projection":
        y = torch.randn(B, T, 3 * H * D, dtype=dtype)
        return y.split(H * D, -1)[1].unflatten(-1, (H, D)).transpose(1, 2)
    return torch.randn(B, H, T, D, dtype=dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", ["projection", "contiguous"])
def test_token_rows_matches_reference(dtype, layout):
    torch.manual_seed(0)
    B, T, H, D = 3, 11, 2, 5
    z = heads(B, T, H, D, dtype, layout).requires_grad_(True)
    flat = torch.randint(0, B * H * T, (70,))  # repeats: the backward accumulates
    G = torch.randn(70, D, dtype=dtype)
    got, want = [], []
    for fn, acc in ((token_rows, got), (token_rows_reference, want)):
        out = fn(z, flat, [70])[0]  # one piece: the Function's path on CPU
        (g,) = torch.autograd.grad((out * G).sum(), z)
        acc += [out.detach(), g]
    tol = 1e-13 if dtype == torch.float64 else 1e-5
    for a, b in zip(got, want, strict=True):
        assert torch.allclose(a, b, rtol=0, atol=tol)
    assert torch.equal(got[0], want[0])  # a copy: bit for bit
    with torch.no_grad():
        assert torch.equal(token_rows(z, flat), want[0])
    if dtype == torch.float64:
        assert torch.autograd.gradcheck(lambda x: token_rows(x, flat), (z,))


@pytest.mark.parametrize("use", [(0, 1, 2), (2,)])
def test_token_rows_pieces(use):
    """With ``sizes``: separate pieces, gradients of unused pieces treated as zero."""
    torch.manual_seed(1)
    z = heads(2, 9, 3, 4, torch.float64, "projection").requires_grad_(True)
    flat = torch.randint(0, 2 * 3 * 9, (50,))
    sizes = [20, 0, 30] if len(use) == 1 else [10, 25, 15]
    res = []
    for fn in (token_rows, token_rows_reference):
        pieces = fn(z, flat, sizes)
        assert [p.shape[0] for p in pieces] == sizes
        loss = sum((pieces[i] * (i + 1.0)).sin().sum() for i in use if sizes[i])
        (g,) = torch.autograd.grad(loss, z)
        res.append((torch.cat([p.detach() for p in pieces]), g))
    assert torch.equal(res[0][0], res[1][0])
    assert torch.allclose(res[0][1], res[1][1], rtol=0, atol=1e-13)
    with pytest.raises(ValueError, match="sum"):
        token_rows(z, flat, [10, 10])
