"""What every benchmark's ``--json`` record starts with: the command that wrote it."""

from __future__ import annotations

import json
import shlex
import sys
from pathlib import Path
from typing import Any


def write_record(path: Path, script: str, argv: list[str] | None, body: dict[str, Any]
                 ) -> None:
    """Write ``{"command": ..., **body}`` to ``path`` (its folder made): ``command`` is
    ``python benchmarks/<script> <args>`` as run (``argv``, else the process's own)."""
    cmd = f"python benchmarks/{Path(script).name} " + shlex.join(
        sys.argv[1:] if argv is None else argv)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"command": cmd, **body}, indent=1) + "\n")
