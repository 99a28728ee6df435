"""What every benchmark's ``--json`` record starts with: the command that wrote it."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any


def portable_path(arg: str | os.PathLike) -> str:
    """``arg`` as a record keeps it: an absolute path of this machine becomes relative to
    the working directory (the repository root, where benchmarks run), anything else
    stays as given — a record must not name one machine's folders."""
    text = os.fspath(arg)
    return os.path.relpath(text) if os.path.isabs(text) else text


SHARED = "a shared machine (other jobs running)"


def add_conditions(parser: argparse.ArgumentParser, flag: str = "--conditions") -> None:
    """The option that records the machine's load during a run (``flag``'s value goes
    into the record; the default says the machine was shared)."""
    parser.add_argument(flag, default=SHARED, help="the machine's load during the run, "
                        "as recorded")


def write_record(path: Path, script: str, argv: list[str] | None, body: dict[str, Any]
                 ) -> None:
    """Write ``{"command": ..., **body}`` to ``path`` (its folder made): ``command`` is
    ``python benchmarks/<script> <args>`` as run (``argv``, else the process's own),
    absolute paths among the arguments written relative (:func:`portable_path`)."""
    cmd = f"python benchmarks/{Path(script).name} " + shlex.join(
        portable_path(a) for a in (sys.argv[1:] if argv is None else argv))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"command": cmd, **body}, indent=1) + "\n")
