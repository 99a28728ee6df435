"""``SolverOptions``: the options of the batched SV-memory solver, as one value.

:func:`svattn.nn.batched.solve_batched` (FISTA, active-set repair, ridged
margin solve) has four numeric options. Every layer above it
(:func:`svattn.nn.sv_attention`, :class:`svattn.nn.SVAttention`,
:class:`svattn.mixers.HybridSVAttention`) carries them as one frozen
:class:`SolverOptions` instead of threading four arguments by hand. The exact
path (``mode="exact"``) ignores them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["RIDGE_STEPS", "SolverOptions", "resolve_solver"]

# Iterated-ridge refinement steps of the margin solve (see ``batched._margin_solve``).
RIDGE_STEPS = 1


@dataclass(frozen=True)
class SolverOptions:
    """Options of the batched solver (FISTA + active set + ridged margin solve).

    Parameters
    ----------
    ridge : float
        Ridge on ``2 K_SS`` in the margin solve, in units of the largest
        kernel diagonal (default 1e-3). Must be ``>= 0``; checked where the
        solver runs (:func:`svattn.nn.sv_attention_state`).
    ridge_steps : int
        Iterated-ridge refinement steps reusing the ridged factorization: each
        step shrinks the ridge's bias on alpha by ``ridge/(λ + ridge)`` per
        eigendirection of ``2 K_SS`` (0: one plain ridged solve, the cheapest
        to differentiate). Default :data:`RIDGE_STEPS` (1).
    max_iter : int
        FISTA iteration cap of the first attempt (default 20).
    refine : int
        Active-set repair rounds after FISTA (default 10; 0: FISTA, the
        partition read off its iterate, one margin solve).

    Examples
    --------
    >>> SolverOptions()
    SolverOptions(ridge=0.001, ridge_steps=1, max_iter=20, refine=10)
    >>> SolverOptions(refine=0).max_iter
    20
    """

    ridge: float = 1e-3
    ridge_steps: int = RIDGE_STEPS
    max_iter: int = 20
    refine: int = 10


def resolve_solver(
    solver: SolverOptions | None = None,
    *,
    ridge: float | None = None,
    ridge_steps: int | None = None,
    max_iter: int | None = None,
    refine: int | None = None,
) -> SolverOptions:
    """``solver`` (default :class:`SolverOptions()`) with the given fields replaced.

    The keyword form is what public callers and saved configs use
    (e.g. ``HybridSVAttention(..., refine=0)`` from a JSON ``mixer_options``);
    a keyword that is None leaves the field of ``solver`` as it is.

    Raises
    ------
    ValueError
        If ``solver`` is neither None nor a :class:`SolverOptions`.

    Examples
    --------
    >>> resolve_solver(SolverOptions(ridge=0.0), max_iter=300)
    SolverOptions(ridge=0.0, ridge_steps=1, max_iter=300, refine=10)
    """
    if solver is None:
        solver = SolverOptions()
    elif not isinstance(solver, SolverOptions):
        raise ValueError(f"solver must be a SolverOptions or None, got {type(solver).__name__}")
    given = {
        "ridge": ridge,
        "ridge_steps": ridge_steps,
        "max_iter": max_iter,
        "refine": refine,
    }
    overrides = {name: val for name, val in given.items() if val is not None}
    return replace(solver, **overrides) if overrides else solver
