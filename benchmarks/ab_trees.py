"""Running one source tree's code in a subprocess, for the A/B benchmarks (``ab_*.py``)."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

from bench_records import portable_path


def tree_env(tree: Path) -> dict[str, str]:
    """The environment of a run on ``tree``: its ``src`` first on the path, one BLAS and
    OpenMP thread (the A/B runs compare one-thread costs)."""
    return dict(os.environ, PYTHONPATH=str(tree / "src"), OMP_NUM_THREADS="1",
                OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")


def tree_commit(tree: Path) -> str:
    """The tree's checked-out commit (short), ``+dirty`` with uncommitted changes."""
    def git(*a):
        return subprocess.run(["git", "-C", str(tree), *a], capture_output=True,
                              text=True).stdout.strip()
    dirty = git("status", "--porcelain", "--untracked-files=no")
    return git("rev-parse", "--short", "HEAD") + ("+dirty" if dirty else "")


def run_json(tree: Path, args: list[str]) -> dict:
    """Run ``python ARGS`` in ``tree`` (:func:`tree_env`); its last stdout line, as JSON."""
    out = subprocess.run([sys.executable, *args], cwd=tree, env=tree_env(tree), check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def tree_fields(a: Path, b: Path) -> dict[str, str]:
    """The two trees of an A/B for its record: paths relative to the repository, commits."""
    return {"a": portable_path(a), "b": portable_path(b),
            "a_commit": tree_commit(a), "b_commit": tree_commit(b)}


def run_pairs(a: Path, b: Path, args: list[str], pairs: int,
              show: Callable[[int, str, dict], None] | None = None) -> dict[str, list[dict]]:
    """``pairs`` alternating runs of ``python ARGS`` on A then B (:func:`run_json`);
    ``show(pair, side, result)`` after each run. Returns ``{"a": [...], "b": [...]}``."""
    runs: dict[str, list[dict]] = {"a": [], "b": []}
    for i in range(pairs):
        for side, tree in (("a", a), ("b", b)):
            runs[side].append(run_json(tree.resolve(), args))
            if show is not None:
                show(i, side, runs[side][-1])
    return runs


def median_ratios(runs: dict[str, list[dict]], keys: tuple[str, ...]) -> dict:
    """Per group of the runs' results (``{group: {key: value}}``) and key: the median
    over pairs of B / A."""
    return {g: {k: statistics.median(b[g][k] / a[g][k]
                                     for a, b in zip(runs["a"], runs["b"], strict=True))
                for k in keys} for g in runs["a"][0]}
