"""A trained model's boundary problems and the distance of a batched answer to the oracle.

Shared by ``benchmarks/finish_trained_keys.py`` and ``tests/nn/test_nn_finish.py``
(which loads this file with ``script_helpers.load_script``). The problems are those of
``tests/nn/data/trained_keys.*`` (the keys a trained selective-copy hybrid's layers
build their memories from, written by ``scripts/make_trained_keys_fixture.py``:
clusters of exact and rounding-level duplicates, near-singular kernel matrices). The
reference is :func:`svattn.exact.oracle.solve_svdd` (Clarabel, then an exact
active-set polish) on each problem's float64 kernel matrix.

Where keys are copies of one another only their summed weight is determined (the
objective and every readout see the sum; the oracle itself notes that alpha is not
unique there), so alpha is compared summed over each cluster of keys closer than
:data:`SAME` relative to their norm; everywhere else key by key.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from svattn.exact.core.kernels import kernel_matrix
from svattn.exact.oracle import solve_svdd
from svattn.nn import SolverOptions

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "nn" / "data" / "trained_keys"
#: Keys closer than this (relative) count as one for the comparison: their split is
#: not determined to 1e-6 by float64 data (float32 rounding of one computation is 1e-7).
SAME = 1e-6
#: How far outside ``[0, C]`` an alpha may be before it counts as outside the box.
BOX = 1e-9
#: The trained model's own solver, as its grid trained it (docs/design.md §5 as written).
PAPER = SolverOptions(finish="approximate", refine=0, ridge_steps=0)


def read_fixture(path: Path = FIXTURE) -> tuple[np.ndarray, dict]:
    """The fixture's keys ``(sequence, layer, head, T, Dh)`` float32 and its metadata
    (``C``, ``gamma``, ``kernel``, ``chunk``, the command that wrote it)."""
    meta = json.loads(path.with_suffix(".json").read_text())
    keys = np.load(path.with_suffix(".npz"))["keys"]
    return keys, meta


def prefix_problems(keys: np.ndarray, L: int, dtype,
                    boundaries: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``boundaries`` (default all) boundary problems of the "full" policy (the
    keys of chunks 0 .. c−1) of the given key rows (R, T, Dh), batched as
    ``[1, R·M, T', Dh]`` with a key mask."""
    R, T, Dh = keys.shape
    M = T // L - 1 if boundaries is None else boundaries
    T = (M + 1) * L
    keys = keys[:, :T]
    k = torch.from_numpy(keys).to(dtype)[:, None].expand(R, M, T, Dh).reshape(1, R * M, T, Dh)
    ends = L * torch.arange(1, M + 1)
    valid = (torch.arange(T)[None] < ends[:, None]).repeat(R, 1)[None]  # (1, R·M, T)
    return k, valid


def key_clusters(X: np.ndarray) -> np.ndarray:
    """Labels of the clusters of keys within :data:`SAME` (relative) of each other."""
    n = len(X)
    lab = -np.ones(n, dtype=int)
    norms = np.linalg.norm(X, axis=1)
    c = 0
    for i in range(n):
        if lab[i] >= 0:
            continue
        lab[i], todo = c, [i]
        while todo:
            j = todo.pop()
            near = np.linalg.norm(X - X[j], axis=1) <= SAME * np.maximum(norms, norms[j])
            new = np.flatnonzero(near & (lab < 0))
            lab[new] = c
            todo.extend(new.tolist())
        c += 1
    return lab


def distance_to_oracle(k: torch.Tensor, valid: torch.Tensor, alpha: torch.Tensor, C: float,
                       kernel: str, gamma: float) -> np.ndarray:
    """Per problem: L1 distance of alpha to solve_svdd's, summed over key clusters."""
    kn = k.detach().double().reshape(-1, *k.shape[-2:]).numpy()
    vn = valid.expand(k.shape[:-1]).reshape(-1, k.shape[-2]).numpy()
    an = alpha.detach().double().reshape(-1, k.shape[-2]).numpy()
    out = []
    for X, v, a in zip(kn, vn, an, strict=True):
        X = X[v]
        ref = solve_svdd(kernel_matrix(X, X, kernel, gamma), C)
        lab = key_clusters(X)
        out.append(np.abs(np.bincount(lab, ref) - np.bincount(lab, a[v])).sum())
    return np.array(out)


def outside_box(alpha: torch.Tensor, valid: torch.Tensor, C: float) -> torch.Tensor:
    """Per problem: whether some alpha is below 0 or above C by more than :data:`BOX`."""
    bad = ((alpha < -BOX) | (alpha > C + BOX)) & valid.expand(alpha.shape)
    return bad.any(-1)
