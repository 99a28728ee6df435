"""Loading a repository script (``benchmarks/``, ``scripts/``) as a module in a test."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

REPO = Path(__file__).resolve().parents[1]


def load_script(relpath: str) -> ModuleType:
    """The script at ``REPO/relpath`` imported as a module named after its file (and
    registered in ``sys.modules``, which its dataclasses need)."""
    path = REPO / relpath
    spec = importlib.util.spec_from_file_location(path.stem, path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[path.stem] = mod
    spec.loader.exec_module(mod)
    return mod
