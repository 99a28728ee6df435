"""What the commands check of their input before they run: argparse types for counts
and tolerances, and the usage errors for a file that must exist (an audit log, one that
looks like one).

A failed check is a usage error: argparse's for a type (exit 2, the flag named), and
``ValueError`` or ``FileNotFoundError`` for a file, which :func:`svattn.cli.main` prints
as one line and exits 2.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

__all__ = ["check_audit_log", "check_file", "nonnegative_int", "positive_float",
           "positive_int"]


def positive_int(text: str) -> int:
    """argparse type: an integer >= 1 (a count: ``--stays``, ``--limit``)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def positive_float(text: str) -> float:
    """argparse type: a finite number > 0 (``--C``, ``--tol``)."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    if value == float("inf"):  # --tol inf would compare no float
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def nonnegative_int(text: str) -> int:
    """argparse type: an integer >= 0 (``generate -n``, an occurrence)."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


# argparse names the type in its message for a value that is no number at all ("argument
# --stays: invalid _positive_int value: 'abc'"): the names the command line has printed
positive_int.__name__ = "_positive_int"
positive_float.__name__ = "_positive_float"
nonnegative_int.__name__ = "_nonnegative_int"


def check_file(path: Path | None, what: str) -> None:
    """Usage errors for a path that should be an existing file (``None``: nothing given)."""
    if path is None:
        return
    if not path.exists():
        raise FileNotFoundError(f"{what}: no such file: {path}")
    if path.is_dir():
        raise ValueError(f"{what}: {path} is a directory, not a file")


def check_audit_log(path: Path) -> None:
    """A usage error unless ``path`` looks like an svattn audit log (its first line is the
    log's ``open`` record). A log whose records were edited still passes, and the
    verifiers name the broken record."""
    check_file(path, "LOG")
    with open(path, "rb") as fh:
        first = fh.readline(1 << 16)
    try:
        rec = json.loads(first)
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
        rec = None
    if not (isinstance(rec, dict) and rec.get("format") == "svattn.audit"
            or b"svattn.audit" in first):
        raise ValueError(f"LOG: {path} is not an svattn audit log (its first line is not "
                         "the log's 'open' record)")
