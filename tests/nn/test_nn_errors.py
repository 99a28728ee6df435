"""Bad input raises a precise ValueError."""

from __future__ import annotations

import pytest
import torch

from svattn.nn import SVAttention, sv_attention, sv_readout
from svattn.nn.common import no_host_reads, non_finite


def _qkv(B=1, H=2, Tq=4, Tk=10, D=3):
    return torch.randn(B, H, Tq, D), torch.randn(B, H, Tk, D), torch.randn(B, H, Tk, D)


def test_wrong_layout_and_mismatched_shapes():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match=r"k must have layout \[B, H, T, D\]"):
        sv_attention(q, k[0], v, C=0.5)
    with pytest.raises(ValueError, match=r"agree on \[B, H\]"):
        sv_attention(q, k.transpose(1, 2), v, C=0.5)  # [B, T, H, D] by mistake
    with pytest.raises(ValueError, match="feature dim D"):
        sv_attention(q[..., :2], k, v, C=0.5)
    with pytest.raises(ValueError, match="same number of tokens"):
        sv_attention(q, k, v[:, :, :7], C=0.5)
    with pytest.raises(ValueError, match="does not broadcast"):
        sv_attention(q, k, v, C=0.5, key_mask=torch.ones(3, 10, dtype=torch.bool))
    with pytest.raises(ValueError, match="share a dtype"):
        sv_attention(q.double(), k, v, C=0.5)
    with pytest.raises(ValueError, match=r"alpha must have shape \[B, H, Tk\]"):
        sv_readout(q, k, v, torch.ones(1, 2, 9))


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_non_finite_keys(bad):
    q, k, v = _qkv()
    k[0, 1, 4, 2] = bad
    with pytest.raises(ValueError, match="k has non-finite entries"):
        sv_attention(q, k, v, C=0.5)


def test_the_shared_finite_check_names_the_first_bad_tensor_where_reads_are_free():
    """svattn.nn.common.non_finite: check_qkv's and the hybrid mixer's one check."""
    q, k, v = _qkv()
    v[0, 0, 1, 0] = float("nan")
    k[0, 1, 2, 0] = float("inf")
    assert non_finite((("q", q), ("k", k), ("v", v))) == "k"
    assert non_finite((("q", q), ("v", v))) == "v"
    assert non_finite((("q", q),)) is None
    with no_host_reads():  # a read would synchronise: nothing is checked
        assert non_finite((("k", k),)) is None


def test_bad_options():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="mode must be one of"):
        sv_attention(q, k, v, C=0.5, mode="fast")
    with pytest.raises(ValueError, match="kernel must be one of"):
        sv_attention(q, k, v, C=0.5, kernel="laplace")
    with pytest.raises(ValueError, match="C must be a finite number > 0"):
        sv_attention(q, k, v, C=-1.0)
    with pytest.raises(ValueError, match="gamma must be > 0"):
        sv_attention(q, k, v, C=0.5, gamma=0.0)
    with pytest.raises(ValueError, match="multiple of n_heads"):
        SVAttention(10, 3, C=0.5)
    with pytest.raises(ValueError, match=r"x must be \[B, T, d_model=8\]"):
        SVAttention(8, 2, C=0.5)(torch.randn(2, 5, 6))
