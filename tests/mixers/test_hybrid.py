"""HybridSVAttention: causality, reduction to softmax, memory policies, exact vs batched."""

from __future__ import annotations

import pytest
import torch

from svattn.mixers import MIXERS, HybridSVAttention, SoftmaxAttention
from svattn.mixers.hybrid import chunked_causal_softmax
from svattn.nn import SolverOptions, sv_attention_state


def identity_qkv(mix: HybridSVAttention) -> HybridSVAttention:
    """q = k = v = x (per head) and out = identity, so inputs are the keys themselves."""
    D = mix.d_model
    eye = torch.eye(D, dtype=mix.qkv.weight.dtype)
    with torch.no_grad():
        mix.qkv.weight.copy_(torch.cat([eye, eye, eye], 0))
        mix.out.weight.copy_(eye)
    return mix


def outlier_keys(T: int, L: int, D: int, radius: float, seed: int) -> torch.Tensor:
    """Per chunk: L/2 keys on a sphere of ``radius`` (random directions), L/2 near 0."""
    g = torch.Generator().manual_seed(seed)
    x = 0.05 * torch.randn(1, T, D, generator=g, dtype=torch.float64)
    for c in range(T // L):
        d = torch.randn(L // 2, D, generator=g, dtype=torch.float64)
        x[0, c * L : c * L + L // 2] = radius * d / d.norm(dim=-1, keepdim=True)
    return x


def reenters(x: torch.Tensor, L: int, C: float) -> bool:
    """Whether, under the "full" policy, a token once in the reserve set leaves it later."""
    k = x.unsqueeze(1)  # (1, 1, T, D)
    ever_r = torch.zeros(0, dtype=torch.bool)
    for end in range(L, x.shape[1] - L + 1, L):
        _, _, part, _ = sv_attention_state(k[:, :, :end], k[:, :, :end], k[:, :, :end], C=C)
        r = part.reserve[0, 0]
        if bool((ever_r & ~r[: ever_r.numel()]).any()):
            return True
        ever_r = torch.cat([ever_r, torch.zeros(L, dtype=torch.bool)]) | r
    return False


@pytest.mark.parametrize("policy", ["full", "support"])
def test_causal_by_perturbation(policy):
    torch.manual_seed(0)
    mix = HybridSVAttention(16, 2, chunk=8, C=0.25, policy=policy, budget=8).double()
    x = torch.randn(2, 45, 16, dtype=torch.float64)
    for t in (3, 8, 21, 40):  # inside chunk 0, at a boundary, mid-chunk, last chunk
        x2 = x.clone()
        x2[:, t:] = torch.randn_like(x2[:, t:])
        y, y2 = mix(x), mix(x2)
        torch.testing.assert_close(y[:, :t], y2[:, :t], rtol=0, atol=1e-10)
        assert not torch.allclose(y[:, t:], y2[:, t:])


@pytest.mark.parametrize("T", [17, 32])
def test_one_chunk_is_causal_softmax(T):
    torch.manual_seed(1)
    mix = HybridSVAttention(16, 4, chunk=32, C=0.1).double()
    ref = SoftmaxAttention(16, 4).double()
    ref.load_state_dict({k: v for k, v in mix.state_dict().items() if k != "gate"})
    x = torch.randn(3, T, 16, dtype=torch.float64)
    torch.testing.assert_close(mix(x), ref(x), rtol=0, atol=1e-12)


def test_gate_mixes_paths():
    torch.manual_seed(2)
    mix = HybridSVAttention(8, 2, chunk=4, C=0.25).double()
    x = torch.randn(1, 16, 8, dtype=torch.float64)
    with torch.no_grad():
        mix.gate.fill_(-50.0)  # global path off: local causal softmax inside each chunk
    y_local = mix(x)
    with torch.no_grad():
        mix.gate.fill_(50.0)
    y_global = mix(x)
    torch.testing.assert_close(y_local[:, :4], y_global[:, :4], rtol=0, atol=0)  # chunk 0
    assert not torch.allclose(y_local[:, 4:], y_global[:, 4:])
    mix(x).sum().backward()
    assert mix.gate.grad is not None and torch.isfinite(mix.gate.grad).all()


def test_support_equals_full_without_reentry():
    T, L, D, C = 48, 8, 6, 0.25
    x = outlier_keys(T, L, D, radius=3.0, seed=1)
    assert not reenters(x, L, C)  # the constructed case: no reserve token comes back
    kw = dict(chunk=L, C=C, budget=T)
    full = identity_qkv(HybridSVAttention(D, 1, policy="full", **kw).double())
    sup = identity_qkv(HybridSVAttention(D, 1, policy="support", **kw).double())
    y_full, y_sup = full(x), sup(x)
    assert sup.truncated_ == 0 and sup.kept_ < T - L  # reserve tokens were really dropped
    torch.testing.assert_close(y_sup, y_full, rtol=0, atol=1e-9)


def test_support_state_is_bounded():
    T, L, D, C, budget = 160, 8, 6, 0.25, 8
    x = outlier_keys(T, L, D, radius=0.5, seed=2)
    assert reenters(x[:, :48], L, C)  # here "support" is an approximation of "full"
    sup = identity_qkv(HybridSVAttention(D, 1, policy="support", chunk=L, C=C, budget=budget))
    y = sup(x.float())
    assert torch.isfinite(y).all()
    assert sup.state_floats(T) == 2 * (budget + L) * D
    assert sup.state_floats(5) == 2 * 5 * D
    assert sup.kept_ <= budget + L  # largest memory solved: carried <= budget, plus a chunk
    full = HybridSVAttention(D, 1, policy="full", chunk=L, C=C)
    assert full.state_floats(T) == 2 * T * D


def test_truncated_counts_the_last_forward_under_every_policy():
    T, L, D, C, budget = 64, 8, 6, 0.25, 4
    x = torch.randn(2, T, D, generator=torch.Generator().manual_seed(3))
    mix = HybridSVAttention(D, 1, policy="support", chunk=L, C=C, budget=budget)
    mix(x)
    assert mix.truncated_ > 0
    mix.policy = "full"  # the same weights read every earlier key: nothing is cut
    mix(x)
    assert mix.truncated_ == 0
    mix.policy = "support"
    mix(x)
    assert mix.truncated_ > 0
    mix(x[:, :L])  # one chunk: no memory at all
    assert mix.truncated_ == 0


@pytest.mark.parametrize("policy", ["full", "support"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf")], ids=["nan", "inf"])
def test_non_finite_input_is_refused_by_the_batched_memory(policy, bad):
    """Batched mode refuses a non-finite input as exact mode does (it returned a non-finite
    output, the solver's alpha summing to 0.5, without a word)."""
    T, L, D = 32, 8, 6
    mix = HybridSVAttention(D, 1, policy=policy, chunk=L, C=0.25)
    x = torch.randn(2, T, D, generator=torch.Generator().manual_seed(0))
    x[1, 12, 2] = bad
    with pytest.raises(ValueError, match="non-finite entries"):
        mix(x)
    assert torch.isfinite(mix(torch.nan_to_num(x, nan=0.0, posinf=0.0))).all()


@pytest.mark.parametrize("rope", [False, True], ids=["nope", "rope"])
@pytest.mark.parametrize("policy", ["full", "support"])
def test_exact_mode_agrees_with_batched(policy, rope):
    torch.manual_seed(3)
    kw = dict(chunk=8, C=0.2, policy=policy, budget=10, rope=rope)
    bat = HybridSVAttention(8, 2, mode="batched", **kw).double()
    ex = HybridSVAttention(8, 2, mode="exact", **kw).double()
    ex.load_state_dict(bat.state_dict())
    x = torch.randn(2, 30, 8, dtype=torch.float64)
    with torch.no_grad():
        y_b, y_e = bat(x), ex(x)
    assert (y_b - y_e).abs().max() <= 1e-3  # the ridge (1e-3) bounds the batched error


def test_registered_and_contract():
    assert MIXERS["hybrid_sv"] is HybridSVAttention
    mix = MIXERS["hybrid_sv"](d_model=16, n_heads=2, chunk=4, C=0.25)
    x = torch.randn(2, 13, 16, requires_grad=True)
    y = mix(x)
    assert y.shape == x.shape
    y.square().sum().backward()
    assert all(p.grad is not None for p in mix.parameters())


def test_solver_keywords_equal_solver_options():
    """The flat keywords of configs and checkpoints build the same SolverOptions."""
    torch.manual_seed(5)
    flat = HybridSVAttention(8, 2, chunk=4, C=0.25, max_iter=20, refine=0, ridge_steps=0).double()
    opts = SolverOptions(max_iter=20, refine=0, ridge_steps=0)
    packed = HybridSVAttention(8, 2, chunk=4, C=0.25, solver=opts).double()
    assert flat.solver == packed.solver == opts
    assert HybridSVAttention(8, 2, chunk=4, C=0.25).solver == SolverOptions()
    packed.load_state_dict(flat.state_dict())
    x = torch.randn(1, 14, 8, dtype=torch.float64)
    assert torch.equal(flat(x), packed(x))


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        (dict(chunk=0), "chunk must be an int >= 1"),
        (dict(chunk=4, C=0.1), r"C = 0.1 is infeasible for chunk = 4"),
        (dict(C=-1.0), "C must be a finite number > 0"),
        (dict(policy="lru"), "policy must be one of"),
        (dict(mode="fast"), "mode must be one of"),
        (dict(C=0.25, chunk=8, budget=2), r"budget must be an int >= ceil\(1/C\) = 4"),
        (dict(C=0.25, chunk=8, lookback=-1), "lookback must be an int >= 0"),
        (dict(C=0.25, chunk=8, lookback=2.0), "lookback must be an int >= 0"),
        (dict(C=0.25, chunk=8, compile_solver=1), "compile_solver must be a bool"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        HybridSVAttention(16, 2, **kwargs)


def masked_softmax_reference(q, k, v, chunk: int, lookback: int) -> torch.Tensor:
    """The local path written out: a dense mask, query t sees keys
    ``floor(t / chunk)·chunk − lookback .. t``."""
    T = q.shape[2]
    t = torch.arange(T)[:, None]
    j = torch.arange(T)[None, :]
    allowed = (j <= t) & (j >= (t // chunk) * chunk - lookback)
    scores = (q @ k.transpose(-1, -2)) / q.shape[-1] ** 0.5
    return torch.softmax(scores.masked_fill(~allowed, float("-inf")), -1) @ v


@pytest.mark.parametrize(("T", "chunk", "lookback"),
                         [(32, 8, 0), (32, 8, 3), (30, 8, 8), (37, 8, 13), (9, 16, 4)])
def test_local_path_with_lookback_matches_dense_mask(T, chunk, lookback):
    g = torch.Generator().manual_seed(T + lookback)
    q, k, v = (torch.randn(2, 3, T, 5, generator=g, dtype=torch.float64, requires_grad=True)
               for _ in range(3))
    fast = chunked_causal_softmax(q, k, v, chunk, lookback)
    ref = masked_softmax_reference(q, k, v, chunk, lookback)
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-12)
    w = torch.randn(fast.shape, generator=g, dtype=torch.float64)
    grads_fast = torch.autograd.grad((fast * w).sum(), (q, k, v))
    grads_ref = torch.autograd.grad((ref * w).sum(), (q, k, v))
    for a, b in zip(grads_fast, grads_ref, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)


def test_lookback_changes_only_chunk_starts_context_and_state():
    torch.manual_seed(4)
    kw = dict(chunk=8, C=0.25, budget=8, gate_init=-60.0)  # gate closed: local path only
    plain = HybridSVAttention(16, 2, **kw).double()
    back = HybridSVAttention(16, 2, lookback=4, **kw).double()
    back.load_state_dict(plain.state_dict())
    x = torch.randn(2, 24, 16, dtype=torch.float64)
    y0, y1 = plain(x), back(x)
    torch.testing.assert_close(y0[:, :8], y1[:, :8], rtol=0, atol=1e-12)  # chunk 0: nothing before
    assert not torch.allclose(y0[:, 8:], y1[:, 8:])
    assert back.state_floats(100) == 2 * (8 + 4 + 8) * 16
    assert "lookback=4" in repr(back)
    # causal with the lookback and both paths open (the shared mixer suite runs lookback = 0)
    both = HybridSVAttention(16, 2, chunk=8, C=0.25, budget=8, lookback=4, rope=True).double()
    for t in (5, 8, 13, 20):
        x2 = x.clone()
        x2[:, t:] = torch.randn_like(x2[:, t:])
        torch.testing.assert_close(both(x2)[:, :t], both(x)[:, :t], rtol=0, atol=1e-12)


@pytest.mark.slow
def test_compiled_boundary_solver_matches_eager():
    """compile_solver=True: the partitions from the compiled kernel, same layer output."""
    torch.manual_seed(6)
    kw = dict(chunk=8, C=0.25, budget=8, rope=True, max_iter=6, refine=2)
    eager = HybridSVAttention(8, 2, **kw)
    comp = HybridSVAttention(8, 2, compile_solver=True, **kw)
    comp.load_state_dict(eager.state_dict())
    x = torch.randn(2, 30, 8, requires_grad=True)
    from svattn.nn.common import no_host_reads

    with no_host_reads():  # eager on the compiled schedule (no CPU shortcuts)
        y_e = eager(x)
    y_c = comp(x)
    torch.testing.assert_close(y_c, y_e, rtol=2e-5, atol=2e-5)
    assert all(torch.equal(a, b) for a, b in zip(comp.last_partition_, eager.last_partition_,
                                                  strict=True))
    g_e, g_c = (torch.autograd.grad(y.square().sum(), x)[0] for y in (y_e, y_c))
    torch.testing.assert_close(g_c, g_e, rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("policy", ["support", "full"])
@pytest.mark.parametrize("kernel", ["rbf", "exp"])
def test_gradients_match_finite_differences(policy, kernel):
    """The whole layer (partitions fixed by the solver, alpha by the margin solve, its
    closed-form backward, the fused readout) against central differences in float64."""
    torch.manual_seed(3)
    mix = HybridSVAttention(8, 2, chunk=4, C=0.3, budget=4, policy=policy, kernel=kernel,
                            refine=10).double()
    x = (0.5 * torch.randn(1, 10, 8, dtype=torch.float64)).requires_grad_()
    assert torch.autograd.gradcheck(mix, (x,), eps=1e-6, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("T", [32, 30])  # whole chunks (the view-only path) and a short last one
def test_local_path_on_projection_views_matches_dense_mask(T):
    """q, k, v as split_heads gives them (strided views of one (B, T, 3·H·Dh) tensor)."""
    g = torch.Generator().manual_seed(T)
    qkv = torch.randn(2, T, 3 * 3 * 5, generator=g, dtype=torch.float64, requires_grad=True)
    q, k, v = (z.view(2, T, 3, 5).transpose(1, 2) for z in qkv.split(15, -1))
    fast = chunked_causal_softmax(q, k, v, 8, 0)
    ref = masked_softmax_reference(q, k, v, 8, 0)
    torch.testing.assert_close(fast, ref, rtol=0, atol=1e-12)
    w = torch.randn(fast.shape, generator=g, dtype=torch.float64)
    (g_fast,) = torch.autograd.grad((fast * w).sum(), qkv)
    (g_ref,) = torch.autograd.grad((ref * w).sum(), qkv)
    torch.testing.assert_close(g_fast, g_ref, rtol=0, atol=1e-12)


@pytest.mark.parametrize("layout", ["contiguous", "merge"])
def test_gate_mix_matches_reference(layout):
    """The CPU gate mixing (one Function) against the torch lerp form: values and grads."""
    from svattn.mixers.hybrid import gate_mix, gate_mix_reference

    torch.manual_seed(3)
    B, H, T, L, Dh = 2, 3, 20, 6, 5
    if layout == "merge":  # the local path's layout: (B, T, H, Dh) memory seen as (B, H, T, Dh)
        local = torch.randn(B, T, H, Dh, dtype=torch.float64).transpose(1, 2)
    else:
        local = torch.randn(B, H, T, Dh, dtype=torch.float64)
    local.requires_grad_(True)
    glob = torch.randn(B, H, T - L, Dh, dtype=torch.float64, requires_grad=True)
    gate = torch.randn(H, dtype=torch.float64, requires_grad=True)
    G = torch.randn(B, H, T, Dh, dtype=torch.float64)
    outs = []
    for fn in (gate_mix, gate_mix_reference):
        o = fn(local, glob, torch.sigmoid(gate))
        grads = torch.autograd.grad((o * G).sum(), (local, glob, gate))
        outs.append((o.detach(), *grads))
    for a, b in zip(*outs, strict=True):
        assert torch.allclose(a, b, rtol=0, atol=1e-13)
    assert outs[0][0].stride() == local.stride()  # the output in local's layout
    assert torch.autograd.gradcheck(lambda a, b, c: gate_mix(a, b, torch.sigmoid(c)),
                                    (local, glob, gate))
