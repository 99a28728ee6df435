"""Run experiments and write their reports: ``svattn reproduce``.

Layout of the output folder::

    OUT/README.md                  one row per paper claim: claim | paper | ours | verdict
    OUT/<name>/report.md           what ran, the command, paper-beside-ours table, verdict
    OUT/<name>/metrics.json        every number of the report (finite, or null when absent)
    OUT/<name>/*.png               figures (seed count and interval stamped on each)
"""

from __future__ import annotations

import importlib
import json
import math
import os
import platform
import shlex
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from svattn.experiments._common import Claim, Context, ExperimentResult, markdown_table
from svattn.experiments.catalog import EXPERIMENTS

#: CLI name -> module (each has ``NAME``, ``TITLE`` and ``run(ctx)``), in report order.
VERDICTS = (
    "**reproduced**: ours meets the paper's figure by the rule stated in the experiment's "
    "report; **partly reproduced**: the direction holds, the size does not (or only on some "
    "sets); **not reproduced**: ours contradicts the paper; **differs**: a different regime "
    "(e.g. ours is better or the setting differs), explained in the report; **not yet run**: "
    "its inputs do not exist yet; **pending**: needs a component not built yet."
)


def repo_root() -> Path | None:
    """The checkout holding this package (``src/svattn/experiments`` -> root), if any."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / "pyproject.toml").exists() else None


def default_data_dir() -> Path | None:
    """``../shared/data`` next to the repository (or the working directory), if present."""
    candidates = []
    root = repo_root()
    if root is not None:
        candidates.append(root.parent / "shared" / "data")
    candidates.append(Path.cwd().parent / "shared" / "data")
    return next((c for c in candidates if c.is_dir()), None)


def portable_path(path: Path | None, root: Path | None = None) -> str | None:
    """``path`` as results record it: relative to the repository root (``root``, default
    :func:`repo_root`) when there is one, so no machine's absolute path is committed.

    Examples
    --------
    >>> portable_path(Path("/work/shared/data"), Path("/work/svattn"))
    '../shared/data'
    >>> portable_path(None) is None
    True
    """
    if path is None:
        return None
    root = repo_root() if root is None else root
    if root is None:
        return str(path)
    return os.path.relpath(Path(path).absolute(), Path(root).absolute())


def resolve_names(names: Sequence[str]) -> list[str]:
    """Validate experiment names (empty: all), keep the report order.

    Examples
    --------
    >>> resolve_names(["secret", "forgetting"])
    ['forgetting', 'secret']
    """
    if not names:
        return list(EXPERIMENTS)
    unknown = [n for n in names if n not in EXPERIMENTS]
    if unknown:
        raise ValueError(f"unknown experiment(s) {unknown}; choose from {list(EXPERIMENTS)}")
    return [n for n in EXPERIMENTS if n in set(names)]


def _check_json(value: Any, where: str) -> Any:
    """Reject NaN/inf and non-JSON types with the offending path."""
    if isinstance(value, dict):
        return {str(k): _check_json(v, f"{where}.{k}") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_check_json(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return int(value)
    if hasattr(value, "item"):  # numpy scalar
        return _check_json(value.item(), where)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"metrics: {where} is {value} (every number must be finite)")
        return value
    raise TypeError(f"metrics: {where} has type {type(value).__name__}, not JSON")


def write_report(result: ExperimentResult, ctx: Context, seconds: float) -> None:
    """Write ``report.md`` and ``metrics.json`` of one experiment into ``ctx.out``."""
    metrics = _check_json(
        {"name": result.name, "title": result.title, "mode": "quick" if ctx.quick else "full",
         "seed": ctx.seed, "command": ctx.command, "seconds": round(seconds, 2),
         "data_dir": None if ctx.quick else portable_path(ctx.data_dir, ctx.repo_root),
         "claims": [asdict(c) for c in result.claims], "verdict": result.verdict,
         "metrics": result.metrics, "figures": result.figures},
        result.name,
    )
    (ctx.out / "metrics.json").write_text(json.dumps(metrics, indent=2, allow_nan=False) + "\n")
    data_text = (portable_path(ctx.data_dir, ctx.repo_root) if ctx.data_dir and not ctx.quick
                 else "shipped slices / synthetic")
    lines = [
        f"# {result.name}: {result.title}", "",
        *([QUICK_NOTE, ""] if ctx.quick else []),
        f"**Verdict.** {result.verdict}", "",
        "## Paper vs ours", "",
        markdown_table(["claim", "paper", "ours", "verdict"],
                       [[c.claim, c.paper, c.ours, c.verdict] for c in result.claims]),
        "", "## What was run", "", result.what, "",
        "Command (from the repository root):", "", "```", ctx.command, "```", "",
        f"Mode: {'quick' if ctx.quick else 'full'}; base seed {ctx.seed}; data: "
        f"{data_text}; "
        f"{seconds:.1f} s on {platform.machine()} ({platform.python_implementation()} "
        f"{platform.python_version()}).", "",
    ]
    if result.tables:
        lines += ["## Detail", ""]
        for table in result.tables:
            lines += [table, ""]
    if result.figures:
        lines += ["## Figures", ""]
        lines += [f"![{f}]({f})" for f in result.figures] + [""]
    if result.notes:
        lines += ["## Where ours differs, and why", ""]
        lines += [f"* {note}" for note in result.notes] + [""]
    (ctx.out / "report.md").write_text("\n".join(lines))


MACHINERY = "machinery check"
QUICK_NOTE = ("**Quick mode is a machinery check**: every experiment runs end to end on the "
              "shipped slices and synthetic data, with models trained for a few steps, so no "
              "number here bears on the paper and no row gets a paper verdict. Full mode "
              "(without `--quick`) gives the verdicts.")


def as_machinery_check(result: ExperimentResult) -> ExperimentResult:
    """A quick run's result with no paper verdict: every claim's verdict and the
    experiment's become :data:`MACHINERY` (a failure stays a failure).

    Examples
    --------
    >>> r = ExperimentResult(name="x", title="X", what="", verdict="reproduced",
    ...                      claims=[Claim("c", "1", "2", "reproduced")], metrics={})
    >>> q = as_machinery_check(r)
    >>> q.verdict, q.claims[0].verdict, r.claims[0].verdict
    ('machinery check: ran end to end', 'machinery check', 'reproduced')
    """
    if result.verdict.startswith("FAILED"):
        return result
    claims = [replace(c, verdict=MACHINERY) for c in result.claims]
    notes = list(result.notes)
    if not any(word in result.verdict.lower() for word in ("reproduced", "differs", "partly")):
        # a plain summary of what the run measured (no paper verdict in it) stays readable
        notes.insert(0, f"What the quick run measured (not a paper verdict): {result.verdict}")
    return replace(result, claims=claims, notes=notes, verdict=f"{MACHINERY}: ran end to end")


def _failed(name: str, title: str, exc: BaseException) -> ExperimentResult:
    tb = "".join(traceback.format_exception(exc)).strip()
    return ExperimentResult(
        name=name, title=title, what=f"The experiment raised an error:\n\n```\n{tb}\n```",
        claims=[Claim(title, "—", f"error: {type(exc).__name__}: {exc}", "failed")],
        verdict=f"FAILED: {type(exc).__name__}: {exc}", metrics={"error": str(exc)},
    )


def write_readme(out: Path) -> Path:
    """Rebuild ``OUT/README.md`` from every ``OUT/<name>/metrics.json`` present.

    Experiments run separately into the same folder (e.g. a rerun of one of
    them) all appear, each with the command that produced it.
    """
    found = []
    for name in dict.fromkeys(EXPERIMENTS):
        path = out / name / "metrics.json"
        if path.exists():
            found.append(json.loads(path.read_text()))
    rows = [[f"[{m['name']}]({m['name']}/report.md): {c['claim']}", c["paper"], c["ours"],
             c["verdict"]] for m in found for c in m["claims"]]
    commands = list(dict.fromkeys(m["command"] for m in found))
    modes = sorted({m["mode"] for m in found})
    total = sum(m["seconds"] for m in found)
    lines = [
        "# Reproducing *Forgetful Attention* (Ramesh, 2026) with svattn", "",
        f"Mode: **{' + '.join(modes)}**; {len(found)} experiments; {total:.0f} s of compute in "
        "all.", "",
        "Produced by (from the repository root):", "", "```", *commands, "```", "",
        *([QUICK_NOTE, ""] if "quick" in modes else []),
        markdown_table(["claim", "paper", "ours", "verdict"], rows), "",
        "Verdicts: " + VERDICTS, "",
        "Each experiment's folder has the full report (what ran, definitions, detail tables, "
        "figures with their seed counts and intervals, and where ours differs and why) and "
        "`metrics.json`.", "",
        markdown_table(["experiment", "verdict", "seconds", "seed"],
                       [[f"[{m['name']}]({m['name']}/report.md)", m["verdict"],
                         f"{m['seconds']:.1f}", m["seed"]] for m in found]), "",
    ]
    path = out / "README.md"
    path.write_text("\n".join(lines))
    return path


def reproduce(
    names: Sequence[str] = (),
    *,
    quick: bool = False,
    out: str | Path = "reproduce-out",
    seed: int = 0,
    data_dir: str | Path | None = None,
    command: str | None = None,
    log=None,
) -> list[ExperimentResult]:
    """Run experiments, write each one's report and the top-level README.

    Parameters
    ----------
    names : sequence of str
        CLI names of :data:`EXPERIMENTS` (empty: all).
    quick : bool
        Shipped slices and synthetic data only; well under a minute in all.
    out : path
        Output folder (created).
    seed : int
        Base seed.
    data_dir : path, optional
        Folder with ``icu/`` and ``enwik8/``; default :func:`default_data_dir`.
    command : str, optional
        The command line to quote in the reports.
    log : text stream, optional
        Progress lines (default stderr).

    Returns
    -------
    list of ExperimentResult
        An experiment that raised is reported as failed (and the others still run).

    Examples
    --------
    >>> import tempfile
    >>> with tempfile.TemporaryDirectory() as d:  # doctest: +SKIP
    ...     results = reproduce(["secret"], quick=True, out=d)
    """
    log = sys.stderr if log is None else log
    selected = resolve_names(names)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    if data_dir is None:
        data = default_data_dir()
    else:
        data = Path(data_dir)
        if not data.is_dir():
            raise FileNotFoundError(f"--data-dir: '{data}' is not a folder")
    if command is None:
        command = "svattn reproduce " + " ".join(
            [*selected] + (["--quick"] if quick else []) + [f"--seed {seed}", f"--out {out}"])
    root = repo_root()
    done: list[ExperimentResult] = []
    for name in selected:
        ctx = Context(out=out / name, quick=quick, seed=seed, data_dir=data, command=command,
                      repo_root=root)
        ctx.out.mkdir(parents=True, exist_ok=True)
        print(f"[reproduce] {name} ...", file=log, flush=True)
        start = time.perf_counter()
        try:
            module = importlib.import_module(EXPERIMENTS[name])
            result = module.run(ctx) if name != "throughput" else module.run_throughput(ctx)
        except Exception as exc:  # report it and go on with the others
            result = _failed(name, name, exc)
        if quick:
            result = as_machinery_check(result)
        seconds = time.perf_counter() - start
        write_report(result, ctx, seconds)
        print(f"[reproduce] {name}: {seconds:.1f} s — {result.verdict}", file=log, flush=True)
        done.append(result)
    write_readme(out)
    return done


THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def command_line(argv: Sequence[str]) -> str:
    """``svattn <argv>`` shell-quoted, prefixed by the thread-pinning variables that are set."""
    env = [f"{v}={shlex.quote(os.environ[v])}" for v in THREAD_VARS if v in os.environ]
    return " ".join([*env, "svattn", *(shlex.quote(a) for a in argv)])
