"""Running one source tree's code in a subprocess, for the A/B benchmarks (``ab_*.py``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


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
