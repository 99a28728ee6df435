"""Key generators shared by the svattn.nn tests. Layout [B, H, T, D]."""

from __future__ import annotations

import torch


def random_keys(B, H, T, D, *, seed=0, dtype=torch.float64, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return scale * torch.randn(B, H, T, D, generator=g, dtype=dtype)


def clustered_keys(B, H, T, D, *, n_clusters=4, spread=3.0, noise=0.5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    centers = spread * torch.randn(B, H, n_clusters, D, generator=g, dtype=dtype)
    which = torch.randint(0, n_clusters, (B, H, T, 1), generator=g).expand(B, H, T, D)
    return centers.gather(2, which) + noise * torch.randn(B, H, T, D, generator=g, dtype=dtype)
