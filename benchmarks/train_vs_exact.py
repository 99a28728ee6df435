"""Trained recall models: the training forward against the exact float64 forward.

For each kept cell (``--models``: ``<id>.safetensors`` of a grid with ``save_models``)
the model reads the first ``--sequences`` test sequences of its own task three ways,
its hybrid layers' memories solved by

* ``exact``: ``mode="exact"`` in float64 (every boundary problem by the exact solver;
  the reference);
* ``optimum``: the batched training solver with its default finish
  (``SolverOptions()``: FISTA, then each problem's verified SVDD optimum), in float64
  and in float32 (the dtype the grid trained in);
* ``approximate``: the batched solver with the paper's finish the grid trained with
  (``finish="approximate"``, refine 0, no ridge steps), in float32.

Reported per model and path, against ``exact`` (a model on which the exact path itself
raises is recorded with its error, nothing compared): the share of positions whose argmax
agrees (all positions, and the scored query positions), the largest ``|Δ logit|``, and
the query accuracy of each path. The layers keep their policy (``"support"``).

    python benchmarks/train_vs_exact.py \\
        --models results/recall_selection_models/*hybrid_sv*.safetensors \\
        --sequences 64 --json results/train_vs_exact.json
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_records import add_conditions, portable_path, write_record  # noqa: E402
from svattn.lm.recall import IGNORE, build_task, load_cell_model  # noqa: E402
from svattn.mixers import HybridSVAttention  # noqa: E402
from svattn.nn import SolverOptions  # noqa: E402

APPROXIMATE = SolverOptions(finish="approximate", refine=0, ridge_steps=0)


def variant(model, dtype, mode: str, solver: SolverOptions | None):
    """A copy of ``model`` in ``dtype`` whose hybrid layers run ``mode`` / ``solver``."""
    twin = copy.deepcopy(model).to(dtype).eval()
    for mod in twin.modules():
        if isinstance(mod, HybridSVAttention):
            mod.mode = mode
            if solver is not None:
                mod.solver = solver
    return twin


def logits_of(model, x: torch.Tensor, batch: int = 16) -> torch.Tensor:
    with torch.no_grad():
        return torch.cat([model(x[i : i + batch])[0].double() for i in range(0, len(x), batch)])


def compare(ref: torch.Tensor, got: torch.Tensor, scored: torch.Tensor, y: torch.Tensor) -> dict:
    agree = ref.argmax(-1) == got.argmax(-1)
    return {"argmax_agreement": float(agree.double().mean()),
            "argmax_agreement_scored": float(agree[scored].double().mean()),
            "max_abs_dlogit": float((ref - got).abs().max()),
            "max_abs_dlogit_scored": float((ref - got)[scored].abs().max()),
            "accuracy": float((got.argmax(-1)[scored] == y[scored]).double().mean())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, nargs="+", required=True)
    parser.add_argument("--sequences", type=int, default=64)
    parser.add_argument("--json", type=Path, default=None)
    add_conditions(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    rows = []
    for path in args.models:
        model, run = load_cell_model(path)
        if not any(isinstance(m, HybridSVAttention) for m in model.modules()):
            continue
        data = build_task(run).build(run.seed)
        x = torch.as_tensor(data.test_inputs[: args.sequences])
        y = torch.as_tensor(data.test_targets[: args.sequences])
        scored = y != IGNORE
        t0 = time.perf_counter()
        row = {"model": portable_path(path), "run": run.run_id, "C": run.hybrid["C"],
               "sequences": len(x), "positions": int(y.numel()), "scored": int(scored.sum())}
        try:
            ref = logits_of(variant(model, torch.float64, "exact", None), x)
        except Exception as exc:  # the reference itself failed: recorded, nothing compared
            rows.append({**row, "exact_error": f"{type(exc).__name__}: {exc}"})
            print(rows[-1], flush=True)
            continue
        row = {**row, "exact_seconds": time.perf_counter() - t0,
               "exact_accuracy": float((ref.argmax(-1)[scored] == y[scored]).double().mean())}
        for name, dtype, solver in (("optimum_f64", torch.float64, SolverOptions()),
                                    ("optimum_f32", torch.float32, SolverOptions()),
                                    ("approximate_f32", torch.float32, APPROXIMATE)):
            got = logits_of(variant(model, dtype, "batched", solver), x)
            row[name] = compare(ref, got, scored, y)
        rows.append(row)
        print(row, flush=True)
    body = {"sequences": args.sequences, "threads": 1, "conditions": args.conditions,
            "solvers": {"optimum": repr(SolverOptions()), "approximate": repr(APPROXIMATE)},
            "rows": rows}
    if args.json:
        write_record(args.json, __file__, argv, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
