"""What the kept recall models' memories select, measured on the SVDD optimum.

For each kept hybrid cell (``--models``: ``<id>.safetensors`` of a grid with
``save_models``) the first ``--sequences`` test sequences of its own task run through
the model in float64 with its hybrid layers in ``mode="exact"`` (the certified path;
a sequence on which it raises runs with the batched solver's verified-optimum finish
in float64 instead, counted), and each hybrid layer's last-boundary memory over every
earlier position is re-solved exactly by the certified solver (``SVDDMemory``) and by
the oracle (``solve_svdd``): :func:`svattn.lm.recall_memory.optimum_selection`.

Reported per model, per solver: support tokens per head by count, distinct keys per
head (exact copies merged), the alpha mass on the data tokens against their share of
the prefix, per layer and as means over layers and heads; the checks (KKT residuals,
box and sum, the objective gap between the two solvers, the share of memories whose
optimum is unique); and, beside them, the figures the grid recorded at training time
from its own solver (``--recorded``: the collected results file), which these replace.
Per box ``C``: means over the seeds.

    python benchmarks/selection_on_optimum.py \\
        --models results/recall_selection_models/*hybrid_sv*.safetensors \\
        --recorded results/recall_selection.json \\
        --sequences 16 --json results/selection_on_optimum.json
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_records import add_conditions, portable_path, write_record  # noqa: E402
from svattn.lm.recall import build_task, load_cell_model  # noqa: E402
from svattn.lm.recall_memory import (  # noqa: E402
    SOLVERS,
    optimum_selection,
    selection_summary,
)
from svattn.mixers import HybridSVAttention  # noqa: E402

#: The recorded (training-solver) figures copied beside the exact ones.
RECORDED = ("support_per_head", "distinct_support_per_head", "data_mass", "data_share")


def recorded_figures(path: Path | None) -> dict[str, dict]:
    """The grid's own per-cell figures (its training solver's), by cell id."""
    if path is None:
        return {}
    cells = json.loads(path.read_text())["cells"]
    return {r["id"]: {k: r.get(k) for k in RECORDED} for r in cells}


def by_box(rows: list[dict]) -> list[dict]:
    """Per box C: the models' summaries averaged over seeds (each solver)."""
    out = []
    for C in sorted({r["C"] for r in rows}, reverse=True):
        cell = [r for r in rows if r["C"] == C]
        row = {"C": C, "seeds": [r["seed"] for r in cell]}
        for name in SOLVERS:
            got = [r["summary"][name] for r in cell if name in r["summary"]]
            if got:
                row[name] = {k: float(np.mean([g[k] for g in got])) for k in got[0]}
                row[name]["models"] = len(got)
        row["recorded"] = ({k: float(np.mean([r["recorded"][k] for r in cell]))
                            for k in RECORDED}
                           if all(r["recorded"].get(k) is not None for r in cell
                                  for k in RECORDED) else None)
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, nargs="+", required=True)
    parser.add_argument("--sequences", type=int, default=16,
                        help="test sequences per model (default 16, the grid's inspection)")
    parser.add_argument("--recorded", type=Path, default=None,
                        help="the grid's collected results (its training-time figures)")
    parser.add_argument("--json", type=Path, default=None)
    add_conditions(parser)
    args = parser.parse_args(argv)
    if args.sequences < 1:
        parser.error("--sequences must be >= 1")
    torch.set_num_threads(1)
    recorded = recorded_figures(args.recorded)
    rows = []
    for path in args.models:
        model, run = load_cell_model(path)
        if not any(isinstance(m, HybridSVAttention) for m in model.modules()):
            continue
        data = build_task(run).build(run.seed)
        n = min(args.sequences, len(data.test_inputs))
        t0 = time.perf_counter()
        got = optimum_selection(model, data.test_inputs[:n], data.test_roles[:n])
        summary = {name: selection_summary(got["layers"], name) for name in SOLVERS
                   if all(name in x["by_solver"] for x in got["layers"])}
        rows.append({"model": portable_path(path), "run": run.run_id, "C": run.hybrid["C"],
                     "seed": run.seed, "sequences": n, "seconds": time.perf_counter() - t0,
                     "forward": got["forward"], "summary": summary,
                     "recorded": recorded.get(run.run_id, {}), "layers": got["layers"]})
        print({k: rows[-1][k] for k in ("run", "forward", "summary", "recorded")}, flush=True)
    body = {"sequences": args.sequences, "threads": 1, "conditions": args.conditions,
            "solvers": list(SOLVERS), "by_box": by_box(rows), "rows": rows}
    if args.recorded is not None:
        body["recorded_from"] = portable_path(args.recorded)
    if args.json:
        write_record(args.json, __file__, argv, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
