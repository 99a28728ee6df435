"""``svattn recall``: the trained recall grids (MQAR, selective copy) of
:mod:`svattn.lm.recall_grid`: ``run`` trains a grid's unfinished cells in resumable
pieces, ``collect`` writes the results file from the finished cells, ``restore`` writes a
results file's cells back into a runs folder, ``time`` measures each mixer's step.

Torch is imported when an action runs, never for ``--help``: the grids' names are
:data:`RECALL_GRIDS` here.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from svattn.cli.inputs import positive_int

__all__ = ["RECALL_GRIDS", "RECALL_RESULTS", "recall_arguments", "recall_run"]


#: The names of svattn.lm.recall_grid.GRIDS, here so that --help imports no torch
#: (tests/lm/test_recall.py holds the two equal).
RECALL_GRIDS = ("quick", "slice", "slice-128", "slice-128-lr3e-3", "slice-copy", "long-64",
                "long-64-full", "long-64-approximate", "long-128", "long-copy", "selection",
                "selection-approximate", "full")


RECALL_RESULTS = "results/recall.json"


def recall_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="recall_command", metavar="ACTION", required=True)
    run = sub.add_parser("run", help="train a grid's unfinished cells (one JSON per cell)")
    run.add_argument("--grid", default="slice", metavar="GRID",
                     help=f"a grid of svattn.lm.recall_grid.GRIDS: {', '.join(RECALL_GRIDS)} "
                     "(default slice)")
    run.add_argument("--out", type=Path, default=Path("runs/recall"), metavar="DIR",
                     help="folder of the cell files (default runs/recall)")
    run.add_argument("--only", default=None, metavar="FIELD=V[|V..],...",
                     help="cells whose fields match, e.g. task=mqar,seq_len=64|128 (C: the "
                     "hybrid's box)")
    run.add_argument("--limit", type=positive_int, default=None, metavar="N",
                     help="train at most N cells now (a resumable piece)")
    run.add_argument("--threads", type=positive_int, default=1,
                     help="torch CPU threads (default 1)")
    run.add_argument("--ckpt-every", type=positive_int, default=None, metavar="N",
                     help="train each cell resumably: a checkpoint in DIR/<cell id>/ every N "
                     "steps, from which an interrupted cell continues on the next call")
    col = sub.add_parser("collect", help="write the results file from the finished cells")
    col.add_argument("--runs", type=Path, nargs="+", default=[Path("runs/recall")],
                     metavar="DIR", help="one or more folders of finished cells (default: "
                     "runs/recall)")
    col.add_argument("--into", type=Path, default=None, metavar="FILE",
                     help=f"the results file to write (default {RECALL_RESULTS}, which is "
                     "a tracked record: replaced only when --into names it or with --force)")
    col.add_argument("--models-into", type=Path, default=None, metavar="DIR",
                     help="also copy the cells' kept weights (grids that keep them, e.g. "
                     "selection) into DIR")
    col.add_argument("--force", action="store_true",
                     help=f"replace {RECALL_RESULTS} when --into is not given")
    res = sub.add_parser("restore", help="write a results file's cells back into a runs "
                         "folder, so that run skips them (a grid resumed from its record)")
    res.add_argument("--from", dest="source", type=Path, required=True, metavar="FILE",
                     help="a results file written by collect")
    res.add_argument("--out", type=Path, required=True, metavar="DIR",
                     help="the runs folder that run --out DIR will resume")
    tim = sub.add_parser("time", help="seconds per training step of each mixer at a grid's sizes")
    tim.add_argument("--grid", default="full", metavar="GRID",
                     help="the grid whose cells are timed (default full)")
    tim.add_argument("--only", default=None, metavar="FIELD=V[|V..],...",
                     help="time only cells whose fields match, e.g. mixer=sliding")
    tim.add_argument("--steps", type=positive_int, default=3,
                     help="timed training steps per cell, after one warm step (default 3)")
    tim.add_argument("--threads", type=positive_int, default=1,
                     help="torch CPU threads (default 1)")
    tim.add_argument("--into", type=Path, default=None, metavar="FILE",
                     help="also write the timings as JSON")


def recall_run(args: argparse.Namespace) -> int:
    import json

    import torch

    from svattn.experiments.runner import command_line
    from svattn.lm.recall import step_seconds
    from svattn.lm.recall_grid import (
        GRIDS,
        collect,
        estimate_hours,
        parse_only,
        run_grid,
        select,
    )

    command = command_line(args._argv)
    if args.recall_command == "restore":
        from svattn.lm.recall_grid import restore

        if not args.source.is_file():
            raise FileNotFoundError(f"--from: no such file: {args.source}")
        written = restore(args.source, args.out)
        print(f"restored {len(written)} cells into {args.out}")
        return 0
    if args.recall_command == "collect":
        into = args.into
        if into is None:
            into = Path(RECALL_RESULTS)
            if into.exists() and not args.force:
                raise FileExistsError(f"{into} exists and is a tracked record: give --into "
                                      "FILE to write another file, or --force to replace it")
        res = collect(args.runs, into, command=command, models_into=args.models_into)
        print(f"collected {len(res['records'])} cells from "
              f"{', '.join(map(str, args.runs))}; wrote {into}")
        return 0
    if args.grid not in GRIDS:
        raise ValueError(f"--grid must be one of {sorted(GRIDS)}, got {args.grid!r}")
    torch.set_num_threads(args.threads)
    grid, only = GRIDS[args.grid], parse_only(args.only)
    if args.recall_command == "run":
        written = run_grid(grid, args.out, only=only, limit=args.limit, command=command,
                           log=lambda line: print(line, flush=True),
                           ckpt_every=args.ckpt_every)
        print(f"{len(written)} cells written to {args.out}")
        return 0
    seen, rows = set(), []
    for run in select(grid.runs(), only):  # one timing per (task, length, width, mixer)
        key = (run.task, run.seq_len, run.d_model, run.mixer)
        if key in seen:
            continue
        seen.add(key)
        sec = step_seconds(run, steps=args.steps)
        rows.append({"task": run.task, "seq_len": run.seq_len, "d_model": run.d_model,
                     "mixer": run.mixer, "batch_size": run.batch_size, "step_seconds": sec})
        print(f"{run.task:15s} T={run.seq_len:5d} d={run.d_model:4d} {run.mixer:10s} "
              f"{sec:8.3f} s/step", flush=True)
    est = estimate_hours(grid, rows)
    print(f"grid {args.grid}: about {est['total']:.1f} h on one core at these step times "
          f"({est['missing']} cells without a timing)")
    if args.into is not None:
        args.into.parent.mkdir(parents=True, exist_ok=True)
        args.into.write_text(json.dumps({"command": command, "grid": args.grid,
                                         "threads": args.threads, "timings": rows,
                                         "estimate_hours": est}, indent=1) + "\n")
    return 0
