"""The "support" policy's training path against a plain boundary-by-boundary reference.

The reference writes the policy as its docstring states it, with the fixed layout of
``budget`` carried slots (masked where no kept token fills one) plus the chunk at every
boundary, one public :func:`svattn.nn.sv_attention_state` call per boundary (its own
margin solve and readout). The layer solves smaller first boundaries, groups the
boundaries by problem size and runs one margin solve and one readout per group; values
and gradients must agree to rounding.
"""

from __future__ import annotations

import pytest
import torch

from svattn.mixers import HybridSVAttention
from svattn.mixers.hybrid import chunked_causal_softmax
from svattn.nn import sv_attention_state


def support_reference(mix: HybridSVAttention, x: torch.Tensor) -> torch.Tensor:
    """``mix(x)`` for the ``"support"`` policy, boundary by boundary (fixed layout)."""
    q, k, v = mix.qkv_heads(x)  # (B, H, T, Dh)
    B, H, T, Dh = q.shape
    L, budget = mix.chunk, mix.budget
    local = chunked_causal_softmax(*mix.positioned(q, k), v, L, mix.lookback)
    if T <= L:
        return mix.out(mix.merge_heads(local))
    cpos = torch.zeros(B, H, budget, dtype=torch.long)
    cval = torch.zeros(B, H, budget, dtype=torch.bool)
    outs = []
    for m in range(-(-T // L) - 1):
        pos = torch.cat([cpos, torch.arange(m * L, (m + 1) * L).expand(B, H, L)], -1)
        val = torch.cat([cval, torch.ones(B, H, L, dtype=torch.bool)], -1)
        take = pos.unsqueeze(-1).expand(-1, -1, -1, Dh)
        kk, vv = k.gather(2, take), v.gather(2, take)
        out, alpha, part, _ = sv_attention_state(
            q[:, :, (m + 1) * L : (m + 2) * L], kk, vv, C=mix.C, kernel=mix.kernel,
            gamma=mix.gamma, key_mask=val, solver=mix.solver)
        outs.append(out)
        kept = part.kept()
        score = torch.where(kept, alpha.detach(), -torch.inf)
        top = score.topk(budget, dim=-1).indices.sort(-1).values
        cpos, cval = pos.gather(-1, top), kept.gather(-1, top)
    glob = torch.cat(outs, 2)
    g = torch.sigmoid(mix.gate).view(1, -1, 1, 1)
    o = torch.cat([local[:, :, :L], g * glob + (1.0 - g) * local[:, :, L:]], 2)
    return mix.out(mix.merge_heads(o))


@pytest.mark.parametrize(
    ("T", "chunk", "budget", "kw"),
    [
        (45, 8, 8, {}),  # budget = L: boundary sizes 8, 16, 16, ...
        (45, 8, 12, {"refine": 2, "ridge_steps": 1}),  # budget > L: 8, 16, 20, 20, ...
        (40, 8, 20, {"kernel": "exp"}),  # 8, 16, 24, 28
        (30, 8, 4, {"rope": True}),  # budget < L: 8, 12, 12
        (16, 8, 8, {}),  # one boundary
    ],
)
def test_support_path_matches_reference(T, chunk, budget, kw):
    torch.manual_seed(T + budget)
    mix = HybridSVAttention(12, 2, chunk=chunk, C=0.25, budget=budget, policy="support",
                            gate_init=0.4, **kw).double()
    x = torch.randn(2, T, 12, dtype=torch.float64, requires_grad=True)
    y, y_ref = mix(x), support_reference(mix, x)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=1e-10)
    w = torch.randn(y.shape, dtype=torch.float64)
    params = [x, mix.qkv.weight, mix.out.weight, mix.gate]
    grads = torch.autograd.grad((y * w).sum(), params)
    grads_ref = torch.autograd.grad((y_ref * w).sum(), params)
    for a, b in zip(grads, grads_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-9)
