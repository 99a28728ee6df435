"""What every experiment shares: its run context, its result, intervals and figures.

An experiment module exposes ``NAME``, ``TITLE`` and ``run(ctx) -> ExperimentResult``;
:mod:`svattn.experiments.runner` writes the result as ``report.md``, ``metrics.json``
and the figures the experiment saved under ``ctx.out``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from svattn.memory import MEMORIES

# Verdict words used in every table (the README explains them).
REPRODUCED = "reproduced"
PARTLY = "partly reproduced"
NOT_REPRODUCED = "not reproduced"
NOT_RUN = "not yet run"
PENDING = "pending"


@dataclass(frozen=True)
class Context:
    """How an experiment is to be run.

    Attributes
    ----------
    out : Path
        The experiment's own output folder (exists).
    quick : bool
        Small shipped slices and synthetic data, a few seconds per experiment.
    seed : int
        Base seed; trial ``i`` uses ``seed + i`` or a generator spawned from it.
    data_dir : Path or None
        Folder with ``icu/`` and ``enwik8/`` (``../shared/data``); None when absent.
    command : str
        The command line that produced the run (quoted in the reports).
    repo_root : Path or None
        The repository (for ``results/lm.json``); None outside a checkout.
    """

    out: Path
    quick: bool
    seed: int
    data_dir: Path | None
    command: str
    repo_root: Path | None = None

    def rng(self, offset: int = 0) -> np.random.Generator:
        """A generator seeded by ``seed + offset``."""
        return np.random.default_rng(self.seed + offset)


@dataclass(frozen=True)
class Claim:
    """One row of a paper-versus-ours table."""

    claim: str
    paper: str
    ours: str
    verdict: str


@dataclass
class ExperimentResult:
    """An experiment's findings, written by the runner.

    Attributes
    ----------
    name, title : str
        CLI name and heading.
    what : str
        What was run (markdown paragraphs: data, sizes, rules, definitions).
    claims : list of Claim
        Rows of the paper-beside-ours table; all of them go to the top-level README.
    verdict : str
        One line.
    metrics : dict
        JSON-serialisable numbers (finite floats, ints, strings, bools, None, lists, dicts).
    tables : list of str
        Further markdown tables (detail).
    figures : list of str
        PNG file names inside the experiment folder.
    notes : list of str
        Where and why ours falls short of the paper, caveats.
    """

    name: str
    title: str
    what: str
    claims: list[Claim]
    verdict: str
    metrics: dict[str, Any]
    tables: list[str] = field(default_factory=list)
    figures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


# ----------------------------------------------------------------- statistics
def bootstrap_ci(
    values: Sequence[float] | np.ndarray,
    stat: Callable[[np.ndarray], float] = np.mean,
    *,
    level: float = 0.95,
    n_boot: int = 2000,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Point estimate and percentile bootstrap interval of ``stat`` over ``values``.

    Parameters
    ----------
    values : array_like of float, shape (n,)
        One number per trial, seed or unit (n >= 1; NaN not allowed).
    stat : callable
        Statistic of a 1-D array (default the mean).
    level : float
        Coverage of the interval, in (0, 1).
    n_boot : int
        Bootstrap resamples.
    seed : int
        Seed of the resampling.

    Returns
    -------
    (estimate, low, high) : tuple of float
        With one value the interval collapses to the value.

    Examples
    --------
    >>> est, lo, hi = bootstrap_ci([0.0, 1.0, 1.0, 1.0])
    >>> est, lo <= est <= hi
    (0.75, True)
    """
    x = np.asarray(values, dtype=np.float64).reshape(-1)
    if x.size == 0:
        raise ValueError("bootstrap_ci: values is empty")
    if not np.all(np.isfinite(x)):
        raise ValueError("bootstrap_ci: values must be finite")
    if not 0.0 < level < 1.0:
        raise ValueError(f"bootstrap_ci: level must lie in (0, 1), got {level}")
    est = float(stat(x))
    if x.size == 1:
        return est, est, est
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, x.size, size=(n_boot, x.size))
    boots = np.array([stat(x[i]) for i in idx])
    lo, hi = np.quantile(boots, [(1 - level) / 2, (1 + level) / 2])
    return est, float(lo), float(hi)


def ci_dict(values: Sequence[float] | np.ndarray, stat=np.mean, seed: int = 0) -> dict[str, Any]:
    """``{"value", "ci95": [lo, hi], "n"}`` of :func:`bootstrap_ci` (for metrics.json)."""
    est, lo, hi = bootstrap_ci(values, stat, seed=seed)
    return {"value": est, "ci95": [lo, hi], "n": int(np.size(values))}


def fmt_ci(d: dict[str, Any], digits: int = 2) -> str:
    """``0.86 [0.80, 0.91]`` from a :func:`ci_dict`."""
    v, (lo, hi) = d["value"], d["ci95"]
    return f"{v:.{digits}f} [{lo:.{digits}f}, {hi:.{digits}f}]"


def fmt_sci(x: float | None) -> str:
    """``1.2e-09`` (or ``n/a`` for None)."""
    return "n/a" if x is None else f"{x:.1e}"


def quantiles(values: Sequence[float] | np.ndarray) -> dict[str, float]:
    """Median, p95 and worst (max) of a sample, for deviation figures."""
    x = np.asarray(values, dtype=np.float64)
    return {
        "median": float(np.median(x)),
        "p95": float(np.quantile(x, 0.95)),
        "worst": float(np.max(x)),
        "n": int(x.size),
    }


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub markdown table (cells are ``str()``-ed; ``|`` escaped)."""

    def cell(x: object) -> str:
        return str(x).replace("|", "\\|").replace("\n", " ")

    lines = ["| " + " | ".join(cell(h) for h in header) + " |",
             "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


# -------------------------------------------------------------------- figures
def pyplot():
    """matplotlib's pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    return plt


QUICK_STAMP = "QUICK MODE: a machinery check, not a result"


def save_figure(fig, out: Path, name: str, caption: str, *, quick: bool = False) -> str:
    """Stamp ``caption`` (seed count, interval) under the figure, save it as PNG, close it.

    With ``quick`` (``svattn reproduce --quick``: a few steps on shipped slices) the
    caption starts with :data:`QUICK_STAMP` and the stamp is written across the figure,
    so a quick run's figure is never read as a result.

    Returns the file name (relative to ``out``).
    """
    plt = pyplot()
    if quick:
        caption = f"{QUICK_STAMP} (few steps, shipped slices). {caption}"
        fig.text(0.5, 0.5, QUICK_STAMP, fontsize=20, color="tab:red", alpha=0.3,
                 rotation=15, ha="center", va="center", weight="bold", zorder=10)
    import textwrap

    # wrapped to the figure's width (~19 characters per inch at 7 pt): never cut off
    lines = textwrap.wrap(caption, width=max(40, int(fig.get_figwidth() * 19)))
    fig.text(0.01, 0.005, "\n".join(lines), fontsize=7, color="0.3", ha="left", va="bottom")
    bottom = 0.04 * len(lines) * 3.6 / max(fig.get_figheight(), 1.0)
    fig.tight_layout(rect=(0, max(0.04, bottom), 1, 1))
    path = out / name
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return name


def progress(iterable, desc: str, total: int | None = None):
    """A tqdm progress bar on stderr (silent when stderr is not a terminal)."""
    from tqdm.auto import tqdm

    return tqdm(iterable, desc=desc, total=total, leave=False, disable=None)


def finite_or_none(x: float) -> float | None:
    """``float(x)`` when finite, else None (for optional metrics)."""
    x = float(x)
    return x if math.isfinite(x) else None


def matched_budget_positions(
    keys: np.ndarray,
    values: np.ndarray,
    C: float,
    methods: Sequence[str],
    seed: int,
    options: dict[str, dict] | None = None,
) -> tuple[dict[str, np.ndarray], int]:
    """Stream the rows into the SV memory, then into every other method at its size.

    The SV memory's final state size is everyone's budget (the matched-state
    comparison of the selection experiments). ``"sv"`` always runs; ``"random"``
    keeps a uniform random subset of the budget's size (``default_rng(seed)``);
    other names are memories of :data:`svattn.memory.MEMORIES`, built with
    ``options.get(name, {})`` as extra arguments.

    Returns
    -------
    (dict of str to ndarray, int)
        Stream positions kept per method, and the matched budget.
    """
    d, dv = keys.shape[1], values.shape[1]
    sv = MEMORIES["sv"](dim=d, value_dim=dv, budget=None, C=C)
    for t in range(len(keys)):
        sv.write(keys[t], values[t])
    budget = sv.tokens_kept()
    kept = {"sv": sv.kept_positions()}
    for name in methods:
        if name == "sv":
            continue
        if name == "random":
            kept[name] = np.random.default_rng(seed).choice(len(keys), size=budget, replace=False)
            continue
        mem = MEMORIES[name](dim=d, value_dim=dv, budget=budget, **(options or {}).get(name, {}))
        for t in range(len(keys)):
            mem.write(keys[t], values[t])
        kept[name] = mem.kept_positions()
    return kept, budget
