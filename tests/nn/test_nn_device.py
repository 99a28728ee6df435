"""The batched path on a device: tensors stay there, nothing is read back (issue #24).

Runs on ``$SVATTN_TEST_DEVICE`` (default ``cpu``); ``scripts/gpu_check.sh`` runs it
with ``cuda``. On CPU the accelerator's schedule is forced with ``no_host_reads``.
"""

from __future__ import annotations

import os

import pytest
import torch
from nn_keys import random_keys
from sync_guard import host_reads_of

from svattn.mixers import HybridSVAttention
from svattn.nn import SolverOptions, SVAttention, sv_attention_state
from svattn.nn.common import no_host_reads

DEVICE = torch.device(os.environ.get("SVATTN_TEST_DEVICE", "cpu"))
SOLVER = SolverOptions(max_iter=20, refine=3, finish="approximate")  # no host reads at all

if DEVICE.type == "cuda" and not torch.cuda.is_available():
    pytest.skip("SVATTN_TEST_DEVICE=cuda but no CUDA device", allow_module_level=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_sv_attention_on_device_matches_cpu(dtype):
    k = random_keys(2, 2, 40, 4, seed=1)
    q, v = random_keys(2, 2, 6, 4, seed=2), random_keys(2, 2, 40, 3, seed=3)
    ref, a_ref, _, _ = sv_attention_state(q, k, v, C=0.1, solver=SOLVER)  # float64 on CPU
    qd, kd, vd = (z.to(DEVICE, dtype) for z in (q, k, v))
    kd.requires_grad_(True)
    with no_host_reads():
        out, alpha, part, info = sv_attention_state(qd, kd, vd, C=0.1, solver=SOLVER)
        seen = host_reads_of(lambda: out.sum().backward())
    assert seen == []
    for t in (out, alpha, part.margin, info.unsettled, kd.grad):
        assert t.device.type == DEVICE.type
    assert out.dtype == alpha.dtype == dtype
    tol = 1e-3 if dtype == torch.float32 else 1e-9
    assert (out.double().cpu() - ref).abs().max() <= tol
    assert (alpha.double().cpu() - a_ref).abs().max() <= tol


def test_layers_forward_backward_on_device():
    torch.manual_seed(0)
    hyb = HybridSVAttention(16, 2, chunk=8, C=0.25, budget=8, rope=True,
                            solver=SOLVER).to(DEVICE)
    lay = SVAttention(16, 2, C=0.2, solver=SOLVER).to(DEVICE)
    x = torch.randn(2, 30, 16, device=DEVICE, requires_grad=True)
    with no_host_reads():
        for layer in (hyb, lay):
            seen = host_reads_of(lambda layer=layer: layer(x).square().sum().backward())
            assert seen == [], type(layer).__name__
    assert x.grad.device.type == DEVICE.type and torch.isfinite(x.grad).all()
    assert hyb.last_partition_.margin.device.type == DEVICE.type


def test_the_optimum_finish_reads_the_host_once_per_solve_and_matches_cpu():
    """The default finish makes one host round trip per solve (the finish operator)
    and nothing else; its answer is the CPU one."""
    k = random_keys(2, 2, 40, 4, seed=1)
    q, v = random_keys(2, 2, 6, 4, seed=2), random_keys(2, 2, 40, 3, seed=3)
    ref, a_ref, _, _ = sv_attention_state(q, k, v, C=0.1)
    qd, kd, vd = (z.to(DEVICE) for z in (q, k, v))
    kd.requires_grad_(True)
    with no_host_reads():
        seen = host_reads_of(lambda: sv_attention_state(qd, kd, vd, C=0.1)[0].sum().backward())
        out, alpha, _, info = sv_attention_state(qd, kd, vd, C=0.1)
    assert seen == ["svattn.finish_optimum"]
    assert alpha.device.type == DEVICE.type and int(info.unsettled) == 0
    assert (out.cpu() - ref).abs().max() <= 1e-12
    assert (alpha.cpu() - a_ref).abs().max() <= 1e-12
