"""Unlearning baselines, measured against a from-scratch retrain like exact removal.

Three ways to forget token ``c`` of an SV memory, all reported with the same
figures (:class:`DeviationReport`) against the retrained optimum on the
remaining tokens (:func:`retrain_state`, via the independent oracle
:func:`svattn.exact.oracle.solve_svdd`):

* exact removal: ``SVDDMemory.remove`` (:func:`exact_removal_state`);
* coefficient decay (:func:`coefficient_decay`): shrink ``alpha_c`` by a
  factor, renormalise, re-solve nothing;
* gradient ascent (:func:`gradient_ascent_unlearn`) for any trained
  ``nn.Module``: steps of −NLL on the forget tokens; compared to a retrained
  model on outputs only (it has no ``alpha``), so its other figures are NaN.

:func:`unlearning_table` puts exact removal and decay side by side.

Decision function convention (as ``SVDDMemory.decision_function``):
``f(x) = 2 Σ_i alpha_i k(x, x_i) − k(x, x) + mu``, positive inside.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from svattn.exact.core.conventions import is_feasible, mu_for_empty_margin
from svattn.exact.core.kernels import (
    biased_softmax_readout,
    decision_values,
    default_gamma,
    gram_matrix,
)


@dataclass(frozen=True)
class SVState:
    """A frozen set of SV coefficients over tokens: enough to read out and score.

    Attributes
    ----------
    ids
        Token ids, aligned with the rows below.
    keys, values
        ``[n, d]``, ``[n, dv]``.
    alpha
        ``[n]`` coefficients (summing to 1).
    mu
        The offset of the decision function.
    C, kernel, gamma
        The box bound and kernel the state belongs to.
    """

    ids: tuple[int, ...]
    keys: np.ndarray
    values: np.ndarray
    alpha: np.ndarray
    mu: float
    C: float
    kernel: str
    gamma: float

    @classmethod
    def from_memory(cls, memory) -> SVState:
        """Snapshot of an :class:`~svattn.exact.memory.SVDDMemory`."""
        keys = memory.keys
        gamma = memory.gamma if memory.gamma is not None else default_gamma(
            memory.kernel, keys.shape[1]
        )
        return cls(
            ids=tuple(memory.ids), keys=keys, values=memory.values, alpha=memory.alpha,
            mu=memory.mu, C=memory.C, kernel=memory.kernel, gamma=float(gamma),
        )

    def margin_mask(self, atol: float = 1e-12) -> np.ndarray:
        """``0 < alpha < C`` (with absolute tolerance ``atol``)."""
        return (self.alpha > atol) & (self.alpha < self.C - atol)

    def partition(self, atol: float = 1e-12) -> dict[str, list[int]]:
        """Ids of the margin, error and reserve sets read off ``alpha``."""
        out: dict[str, list[int]] = {"margin": [], "error": [], "reserve": []}
        for tid, a in zip(self.ids, self.alpha, strict=True):
            name = "reserve" if a <= atol else "error" if a >= self.C - atol else "margin"
            out[name].append(tid)
        return out

    def readout(self, queries: np.ndarray) -> np.ndarray:
        """``softmax_i(log alpha_i + log k(q, x_i)) · V`` over alpha > 0: ``[m, d] -> [m, dv]``."""
        q = np.atleast_2d(np.asarray(queries, dtype=np.float64))
        return biased_softmax_readout(q, self.keys, self.values, self.alpha, self.kernel,
                                      self.gamma)

    def decision_function(self, x: np.ndarray) -> np.ndarray:
        """``2 Σ alpha_i k(x, x_i) − k(x, x) + mu``; ``[m, d] -> [m]``."""
        x = np.atleast_2d(np.asarray(x, dtype=np.float64))
        return decision_values(x, self.keys, self.alpha, self.mu, self.kernel, self.gamma)


@dataclass(frozen=True)
class DeviationReport:
    """Deviation of an unlearned state from the retrained one (NaN: not applicable).

    Attributes
    ----------
    max_abs_alpha
        ``max |alpha − alpha_retrain|`` over the union of tokens (absent = 0).
    decision_max, decision_median
        ``|f(x) − f_retrain(x)|`` over the probes.
    readout_max, readout_median
        ``max_j |o(q) − o_retrain(q)|_j`` over the queries.
    partition_identical
        Margin/error/reserve sets equal (None when not applicable).
    """

    max_abs_alpha: float
    decision_max: float
    decision_median: float
    readout_max: float
    readout_median: float
    partition_identical: bool | None

    def as_row(self, method: str) -> dict[str, object]:
        """A table row ``{"method": ..., figure: value, ...}``."""
        return {"method": method, **self.__dict__}


def retrain_state(
    keys: np.ndarray, values: np.ndarray, ids: Sequence[int], C: float, kernel: str,
    gamma: float,
) -> SVState:
    """From-scratch solve on a token set (oracle ``solve_svdd``; warm-up below ``n·C < 1``)."""
    from svattn.exact.oracle import solve_svdd

    keys = np.asarray(keys, dtype=np.float64)
    n = keys.shape[0]
    if not is_feasible(n, C):
        alpha, mu = np.full(n, 1.0 / n), 0.0
    else:
        alpha, mu = solve_svdd(gram_matrix(keys, kernel, gamma), C, return_mu=True)
    return SVState(tuple(int(i) for i in ids), keys, np.asarray(values, dtype=np.float64),
                   np.asarray(alpha, dtype=np.float64), float(mu), float(C), kernel, float(gamma))


def _without(state: SVState, token_id: int) -> tuple[np.ndarray, int]:
    if token_id not in state.ids:
        raise ValueError(f"token_id {token_id} is not held by the memory (ids {list(state.ids)})")
    idx = state.ids.index(token_id)
    return np.delete(np.arange(len(state.ids)), idx), idx


def retrain_without(memory, token_id: int) -> SVState:
    """The retrained optimum of ``memory``'s tokens minus ``token_id`` (the reference)."""
    state = SVState.from_memory(memory)
    keep, _ = _without(state, token_id)
    return retrain_state(state.keys[keep], state.values[keep],
                         [state.ids[i] for i in keep], state.C, state.kernel, state.gamma)


def exact_removal_state(memory, token_id: int) -> SVState:
    """State after ``SVDDMemory.remove(token_id)`` on a copy (``memory`` is unchanged)."""
    mem = copy.deepcopy(memory)
    mem.remove(token_id)
    return SVState.from_memory(mem)


def coefficient_decay(memory, token_id: int, factor: float) -> SVState:
    """Coefficient-decay unlearning: ``alpha_c ← factor · alpha_c``, renormalise, no re-solve.

    ``mu`` is refitted so that the surviving margin tokens of the original
    partition sit on the boundary on average (the least-squares ``mu``);
    with no margin token left it follows the empty-margin convention on the
    error set. ``factor = 0`` drops the token.

    Parameters
    ----------
    memory
        An :class:`~svattn.exact.memory.SVDDMemory` (left unchanged).
    token_id
        The token to forget.
    factor
        Shrink factor in ``[0, 1]``.

    Returns
    -------
    SVState
        Has ``readout`` and ``decision_function``, like the memory.

    Examples
    --------
    >>> import numpy as np
    >>> from svattn.exact import SVDDMemory
    >>> mem = SVDDMemory(C=0.1)
    >>> ids = mem.extend(np.random.default_rng(0).normal(size=(60, 4)))
    >>> c = mem.support_ids()[0]
    >>> decayed = coefficient_decay(mem, c, 0.01)
    >>> exact = exact_removal_state(mem, c)
    >>> ref = retrain_without(mem, c)
    >>> probes = np.random.default_rng(1).normal(size=(50, 4))
    >>> bool(deviation_from_retrain(exact, ref, probes).decision_max < 1e-8)
    True
    >>> bool(deviation_from_retrain(decayed, ref, probes).decision_max > 1e-4)
    True
    """
    factor = float(factor)
    if not 0.0 <= factor <= 1.0:
        raise ValueError(f"factor must lie in [0, 1], got {factor!r}")
    state = SVState.from_memory(memory)
    keep, idx = _without(state, token_id)
    margin = state.margin_mask()
    alpha = state.alpha.copy()
    alpha[idx] *= factor
    rows = np.arange(len(alpha)) if factor > 0 else keep
    alpha = alpha[rows]
    if alpha.sum() <= 0:
        raise ValueError("decay leaves no weight: the forgotten token carried all of it")
    alpha /= alpha.sum()
    keys, values = state.keys[rows], state.values[rows]
    ids = tuple(state.ids[i] for i in rows)
    K = gram_matrix(keys, state.kernel, state.gamma)
    grad = 2.0 * (K @ alpha) - np.diag(K)
    surviving = margin[rows] & (np.asarray(ids) != token_id)
    if surviving.any():
        mu = float(np.mean(-grad[surviving]))
    else:
        err = alpha > 0
        mu = mu_for_empty_margin(grad[err])
    return SVState(ids, keys, values, alpha, mu, state.C, state.kernel, state.gamma)


def deviation_from_retrain(
    unlearned: SVState | nn.Module,
    retrained: SVState | nn.Module,
    probes: np.ndarray | torch.Tensor,
    queries: np.ndarray | torch.Tensor | None = None,
) -> DeviationReport:
    """The unlearning figures of ``unlearned`` against ``retrained``.

    Parameters
    ----------
    unlearned, retrained
        Two :class:`SVState` (all figures), or two ``nn.Module`` (outputs on
        ``probes`` only: ``readout_*``; the others are NaN / None).
    probes
        Points for the decision function (SV) or model inputs (modules).
    queries
        Readout queries (SV); the probes when None.

    Returns
    -------
    DeviationReport
    """
    if isinstance(unlearned, nn.Module) or isinstance(retrained, nn.Module):
        if not (isinstance(unlearned, nn.Module) and isinstance(retrained, nn.Module)):
            raise TypeError("compare two nn.Modules or two SVStates, not one of each")
        with torch.no_grad():
            x = torch.as_tensor(probes)
            diff = (unlearned(x) - retrained(x)).abs().flatten(1).max(dim=1).values
        nan = math.nan
        return DeviationReport(nan, nan, nan, float(diff.max()), float(diff.median()), None)
    probes = np.asarray(probes, dtype=np.float64)
    queries = probes if queries is None else np.asarray(queries, dtype=np.float64)
    ids = sorted(set(unlearned.ids) | set(retrained.ids))
    a = dict(zip(unlearned.ids, unlearned.alpha, strict=True))
    b = dict(zip(retrained.ids, retrained.alpha, strict=True))
    dalpha = max(abs(a.get(i, 0.0) - b.get(i, 0.0)) for i in ids)
    ddec = np.abs(unlearned.decision_function(probes) - retrained.decision_function(probes))
    dout = np.abs(unlearned.readout(queries) - retrained.readout(queries)).max(axis=1)
    return DeviationReport(
        float(dalpha), float(ddec.max()), float(np.median(ddec)),
        float(dout.max()), float(np.median(dout)),
        unlearned.partition() == retrained.partition(),
    )


def unlearning_table(
    memory,
    token_id: int,
    probes: np.ndarray,
    queries: np.ndarray | None = None,
    factors: Sequence[float] = (0.5, 0.1, 0.01, 0.0),
) -> list[dict[str, object]]:
    """Exact removal and coefficient decay of one token, as rows of one table."""
    ref = retrain_without(memory, token_id)
    rows = [deviation_from_retrain(exact_removal_state(memory, token_id), ref, probes, queries)
            .as_row("exact remove")]
    for f in factors:
        rep = deviation_from_retrain(coefficient_decay(memory, token_id, f), ref, probes, queries)
        rows.append(rep.as_row(f"decay x{f:g}"))
    return rows


def gradient_ascent_unlearn(
    model: nn.Module,
    loss_fn: Callable[[nn.Module, object], torch.Tensor],
    forget_batch: object,
    *,
    steps: int = 10,
    lr: float = 1e-3,
    inplace: bool = False,
) -> tuple[nn.Module, list[float]]:
    """Gradient-ascent unlearning: ``steps`` SGD steps on ``−loss_fn(model, forget_batch)``.

    Parameters
    ----------
    model
        A trained module (copied unless ``inplace``).
    loss_fn
        ``loss_fn(model, batch) -> scalar`` NLL of the batch (to be raised).
    forget_batch
        The tokens to forget, in whatever form ``loss_fn`` takes.
    steps, lr
        Number of steps and SGD learning rate.
    inplace
        Modify ``model`` itself.

    Returns
    -------
    model : nn.Module
        The unlearned model (in eval mode).
    losses : list of float
        The forget loss before each step and after the last.
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 0:
        raise ValueError(f"steps must be an int >= 0, got {steps!r}")
    if not (math.isfinite(lr) and lr > 0):
        raise ValueError(f"lr must be a finite float > 0, got {lr!r}")
    model = model if inplace else copy.deepcopy(model)
    model.train()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(model, forget_batch)
        if loss.dim() != 0:
            raise ValueError(f"loss_fn must return a scalar, got shape {tuple(loss.shape)}")
        losses.append(float(loss.detach()))
        (-loss).backward()
        opt.step()
    model.eval()
    with torch.no_grad():
        losses.append(float(loss_fn(model, forget_batch)))
    return model, losses
