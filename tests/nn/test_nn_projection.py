"""Capped-simplex projection: batched torch against the sort-based numpy reference."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from svattn.nn import project_capped_simplex
from svattn.nn.projection import project_capped_simplex_reference


@pytest.mark.parametrize("C", [0.02, 0.1, 0.34, 1.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
def test_matches_reference_with_masks(C, dtype):
    g = torch.Generator().manual_seed(1)
    v = (3 * torch.randn(40, 60, generator=g, dtype=torch.float64)).to(dtype)
    mask = torch.rand(40, 60, generator=g) > 0.3
    mask[:, :50] = True  # n >= 50, so n·C >= 1 for every C here
    x, tau = project_capped_simplex(v, C, mask)
    tol = 1e-14 if dtype == torch.float64 else 2e-6
    assert (x[~mask] == 0).all()
    assert ((x >= 0) & (x <= C)).all()
    for i in range(v.shape[0]):
        ref = project_capped_simplex_reference(v[i][mask[i]].double().numpy(), C)
        np.testing.assert_allclose(x[i][mask[i]].double().numpy(), ref, atol=tol, rtol=0)


def test_warm_start_and_ties():
    v = torch.tensor([[1.0, 1.0, 1.0, 1.0], [5.0, 5.0, 0.0, 0.0]], dtype=torch.float64)
    x, tau = project_capped_simplex(v, 0.5)
    torch.testing.assert_close(x, torch.tensor([[0.25] * 4, [0.5, 0.5, 0.0, 0.0]]).double())
    x2, _ = project_capped_simplex(v, 0.5, tau=tau + 3.0)  # a poor warm start
    torch.testing.assert_close(x2, x)


def test_exactly_feasible_box_puts_C_everywhere():
    v = torch.randn(3, 8, dtype=torch.float64)
    x, _ = project_capped_simplex(v, 1 / 8)
    torch.testing.assert_close(x, torch.full_like(x, 1 / 8))
