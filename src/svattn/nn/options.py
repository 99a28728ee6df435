"""``SolverOptions``: the options of the batched SV-memory solver, as one value.

:func:`svattn.nn.batched.solve_batched` (FISTA, then a finish: the verified optimum,
or the paper's active-set repair and ridged margin solve) has five options. Every
layer above it
(:func:`svattn.nn.sv_attention`, :class:`svattn.nn.SVAttention`,
:class:`svattn.mixers.HybridSVAttention`) carries them as one frozen
:class:`SolverOptions` instead of threading four arguments by hand. The exact
path (``mode="exact"``) ignores them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

__all__ = ["FINISHES", "RIDGE_STEPS", "SolverOptions", "resolve_solver"]

# Iterated-ridge refinement steps of the margin solve (see ``batched._margin_solve``).
RIDGE_STEPS = 1
# The finishes after FISTA: the verified SVDD optimum, or the paper's approximate path.
FINISHES = ("optimum", "approximate")


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


@dataclass(frozen=True)
class SolverOptions:
    """Options of the batched solver (FISTA, then the finish).

    Every field is checked at construction (a precise ``ValueError`` naming it).

    Parameters
    ----------
    ridge : float
        ``"approximate"`` finish only: ridge on ``2 K_SS`` in the margin solve, in
        units of the largest kernel diagonal (default 1e-3). Must be ``> 0`` there
        (without it the margin system is singular on duplicate keys); ``>= 0``
        and unused with the ``"optimum"`` finish.
    ridge_steps : int
        ``"approximate"`` finish only: iterated-ridge refinement steps reusing the
        ridged factorization: each step shrinks the ridge's bias on alpha by
        ``ridge/(λ + ridge)`` per eigendirection of ``2 K_SS`` (0: one plain ridged
        solve, the cheapest to differentiate). Default :data:`RIDGE_STEPS` (1).
    max_iter : int
        FISTA iterations (default 20, ``>= 1``): exactly this many run, on every
        device (the ``"approximate"`` finish's retry runs ``2·max_iter`` more where
        the repair had not settled).
    refine : int
        ``"approximate"`` finish only: active-set repair rounds after FISTA
        (default 10; 0: the partition read off FISTA's iterate, one margin solve).
    finish : {"optimum", "approximate"}
        ``"optimum"`` (default): FISTA's iterate is a warm start; each problem is
        solved to its SVDD optimum in float64 (active set without ridge, exact
        duplicates merged), verified (box, sum, KKT), and re-solved by the exact
        oracle where the check fails (:mod:`svattn.nn.finish`). ``"approximate"``:
        the path of docs/design.md §5 as the paper states it (partition off FISTA,
        ``refine`` repair rounds, ridged margin solve), for ablations; its alpha
        may leave the box.

    Examples
    --------
    >>> SolverOptions()
    SolverOptions(ridge=0.001, ridge_steps=1, max_iter=20, refine=10, finish='optimum')
    >>> SolverOptions(refine=0).max_iter
    20
    >>> SolverOptions(ridge=0.0, finish="approximate")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
        ...
    ValueError: ridge must be > 0 with finish='approximate' ... needs no ridge
    """

    ridge: float = 1e-3
    ridge_steps: int = RIDGE_STEPS
    max_iter: int = 20
    refine: int = 10
    finish: str = "optimum"

    def __post_init__(self) -> None:
        r = self.ridge
        if isinstance(r, bool) or not isinstance(r, (int, float)) or not (0 <= r < float("inf")):
            raise ValueError(f"ridge must be a number >= 0, got {r!r}")
        if self.finish not in FINISHES:
            raise ValueError(f"finish must be one of {FINISHES}, got {self.finish!r}")
        if self.finish == "approximate" and not r > 0:
            raise ValueError(
                f"ridge must be > 0 with finish='approximate' (its margin system is singular "
                f"on duplicate keys without it), got {r!r}; finish='optimum' needs no ridge")
        if not _is_int(self.ridge_steps) or self.ridge_steps < 0:
            raise ValueError(f"ridge_steps must be an int >= 0, got {self.ridge_steps!r}")
        if not _is_int(self.max_iter) or self.max_iter < 1:
            raise ValueError(f"max_iter must be an int >= 1, got {self.max_iter!r}")
        if not _is_int(self.refine) or self.refine < 0:
            raise ValueError(f"refine must be an int >= 0, got {self.refine!r}")


def resolve_solver(
    solver: SolverOptions | None = None,
    *,
    ridge: float | None = None,
    ridge_steps: int | None = None,
    max_iter: int | None = None,
    refine: int | None = None,
    finish: str | None = None,
) -> SolverOptions:
    """``solver`` (default :class:`SolverOptions()`) with the given fields replaced.

    The keyword form is what public callers and saved configs use
    (e.g. ``HybridSVAttention(..., refine=0)`` from a JSON ``mixer_options``);
    a keyword that is None leaves the field of ``solver`` as it is.

    Raises
    ------
    ValueError
        If ``solver`` is neither None nor a :class:`SolverOptions`, or a field is
        out of range (:class:`SolverOptions`).

    Examples
    --------
    >>> resolve_solver(SolverOptions(ridge=0.0), max_iter=300)
    SolverOptions(ridge=0.0, ridge_steps=1, max_iter=300, refine=10, finish='optimum')
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
        "finish": finish,
    }
    overrides = {name: val for name, val in given.items() if val is not None}
    return replace(solver, **overrides) if overrides else solver
