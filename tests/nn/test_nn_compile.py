"""``torch.compile(fullgraph=True)`` of the batched solver and of the hybrid layer.

``fullgraph=True`` fails on any graph break, so these tests are what keeps
host reads (``.item()``, Python branches on tensor values) out of the batched
path. The default suite traces with the ``eager`` backend (dynamo's capture
alone, seconds); the inductor runs are marked ``slow`` (minutes of compilation).
Compiled and eager must agree to the dtype's tolerance, values and gradients,
and both against the references (the exact path, the numpy projection).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from nn_keys import random_keys

from svattn.mixers import HybridSVAttention
from svattn.nn import SolverOptions, project_capped_simplex, sv_attention_state
from svattn.nn.common import no_host_reads
from svattn.nn.projection import project_capped_simplex_reference

TOL = {torch.float32: 2e-5, torch.float64: 1e-10}
SMALL = SolverOptions(max_iter=6, refine=2, ridge_steps=1)
BACKENDS = ["eager", pytest.param("inductor", marks=pytest.mark.slow)]


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def _close(a, b, dtype):
    torch.testing.assert_close(a, b, rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_projection_compiles_and_matches_reference(backend, dtype):
    g = torch.Generator().manual_seed(0)
    v = (2 * torch.randn(6, 20, generator=g, dtype=torch.float64)).to(dtype)
    mask = torch.rand(6, 20, generator=g) > 0.2
    mask[:, :12] = True
    proj = torch.compile(project_capped_simplex, fullgraph=True, backend=backend)
    x, _ = proj(v, 0.1, mask)
    for i in range(6):
        ref = project_capped_simplex_reference(v[i][mask[i]].double().numpy(), 0.1)
        np.testing.assert_allclose(x[i][mask[i]].double().numpy(), ref, atol=TOL[dtype], rtol=0)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_sv_attention_compiles_one_graph(backend, dtype):
    k = random_keys(2, 2, 20, 4, seed=1, dtype=dtype).requires_grad_(True)
    q = random_keys(2, 2, 5, 4, seed=2, dtype=dtype)
    v = random_keys(2, 2, 20, 3, seed=3, dtype=dtype)
    mask = torch.ones(2, 1, 20, dtype=torch.bool)
    mask[0, :, 15:] = False

    def run(q, k, v):
        out, alpha, part, _ = sv_attention_state(q, k, v, C=0.25, key_mask=mask, solver=SMALL)
        return out, alpha, part.margin, part.error

    compiled = torch.compile(run, fullgraph=True, backend=backend)
    got = compiled(q, k, v)
    with no_host_reads():  # eager on the compiled schedule (no CPU shortcuts)
        ref = run(q, k, v)
    for a, b in zip(got[:2], ref[:2], strict=True):
        _close(a, b, dtype)
    assert torch.equal(got[2], ref[2]) and torch.equal(got[3], ref[3])
    w = torch.randn(got[0].shape, dtype=dtype, generator=torch.Generator().manual_seed(4))
    (g_c,) = torch.autograd.grad((got[0] * w).sum() + got[1].square().sum(), k)
    (g_e,) = torch.autograd.grad((ref[0] * w).sum() + ref[1].square().sum(), k)
    _close(g_c, g_e, dtype)
    # and both against the exact path, as tests/nn/test_nn_batched.py holds the eager one
    o_ex, a_ex, _, _ = sv_attention_state(q.double(), k.detach().double(), v.double(), C=0.25,
                                          key_mask=mask, mode="exact")
    assert (got[0].double() - o_ex).abs().max() <= 1e-2


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("policy", ["support", "full"])
def test_hybrid_forward_compiles_one_graph(backend, policy):
    torch.manual_seed(0)
    mix = HybridSVAttention(8, 2, chunk=8, C=0.25, budget=8, policy=policy, rope=True,
                            solver=SMALL)
    x = torch.randn(2, 26, 8, requires_grad=True)
    compiled = torch.compile(mix, fullgraph=True, backend=backend)
    y_c = compiled(x)
    kept_c = mix.kept_
    with no_host_reads():  # eager on the compiled schedule (no CPU shortcuts)
        y_e = mix(x)
    _close(y_c, y_e, torch.float32)
    assert kept_c == mix.kept_
    w = torch.randn(y_e.shape, generator=torch.Generator().manual_seed(5))
    grads_c = torch.autograd.grad((y_c * w).sum(), [x, *mix.parameters()])
    grads_e = torch.autograd.grad((y_e * w).sum(), [x, *mix.parameters()])
    for a, b in zip(grads_c, grads_e, strict=True):
        _close(a, b, torch.float32)


def test_sv_attention_module_compiles_one_graph():
    """#23: the module's input checks broke the graph 26 times (``.item()``) and
    ``fullgraph=True`` failed at ``torch.isfinite(t).all()``; they are host reads only
    in eager mode on CPU tensors now (``svattn.nn.common.host_reads``)."""
    from svattn.nn import SVAttention

    torch.manual_seed(0)
    layer = SVAttention(16, 2, C=0.25)
    x = torch.randn(2, 12, 16, requires_grad=True)
    compiled = torch.compile(layer, fullgraph=True, backend="eager")
    y, y_ref = compiled(x), layer(x)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    (g,) = torch.autograd.grad(y.square().sum(), x)
    (g_ref,) = torch.autograd.grad(y_ref.square().sum(), x)
    torch.testing.assert_close(g, g_ref, rtol=1e-4, atol=1e-5)
