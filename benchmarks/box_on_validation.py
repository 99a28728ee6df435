"""The box C of the kept selective-copy hybrids chosen on a validation split, not the test.

The selection grid (``svattn recall run --grid selection``) trained the hybrid at
C ∈ {1/4, 1/8, 1/16} (3 seeds each, weights kept); its best box by mean *test*
accuracy, C = 1/8, gave the ≈ 0.99 quoted against the paper, and the box fixed
before it (C = 1/16, the grid's base) gave less. Here each kept model is scored on a
**validation split** drawn from the task with another seed
(:func:`svattn.lm.recall_selection.validation_split`: seed + 1000, independent of the
run's train and test draws; rows also present in the run's train or test split are
counted) and on its test split, both under two forwards:

* ``as_trained``: the grid's own forward, float32, the batched solver with the finish
  the grid trained with (``--trained-finish``): the paper's (``approximate``, refine
  0, no ridge steps, the model's ``max_iter``; the selection grid of 2026-12-02) or
  the optimum (a grid retrained with the default finish, where the two forwards are
  the same); it gives the recorded test accuracies;
* ``optimum``: float32, the batched solver's verified-optimum finish
  (``SolverOptions(max_iter=...)``), the certified function to ~1e-4 in the logits
  (``results/train_vs_exact.json``).

For each forward the box is chosen on validation (:func:`choose_box`: per seed, among
that seed's three models, and overall, by mean over seeds) and its test accuracy is
reported beside the fixed box (``--fixed``, default 1/16) and the best box on test.
The verdict names the condition under which the chosen box wins (C = 1/n_data, the
task's number of data tokens). Only boxes with a model for every seed present are
compared (a grid retrained in part: the others are listed under ``incomplete_boxes``
with their rows); a fixed box that is not among them is reported as missing.

    python benchmarks/box_on_validation.py \\
        --models results/recall_selection_models/*hybrid_sv*.safetensors \\
        --json results/box_on_validation.json
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_records import add_conditions, portable_path, write_record  # noqa: E402
from svattn.lm.recall import build_task, load_cell_model, query_accuracy  # noqa: E402
from svattn.lm.recall_grid import mean_interval  # noqa: E402
from svattn.lm.recall_selection import (  # noqa: E402
    VALIDATION_SEED_OFFSET,
    choose_box,
    validation_split,
)
from svattn.mixers import HybridSVAttention  # noqa: E402
from svattn.nn import SolverOptions  # noqa: E402

FORWARDS = ("as_trained", "optimum")


def with_forward(model, name: str, trained_finish: str = "approximate"):
    """A float32 copy of ``model`` whose hybrid layers run the ``name`` forward
    (``as_trained``: the ``trained_finish`` the grid trained with)."""
    twin = copy.deepcopy(model).to(torch.float32).eval()
    for mod in twin.modules():
        if isinstance(mod, HybridSVAttention):
            mod.mode = "batched"
            it = mod.solver.max_iter
            mod.solver = (SolverOptions(finish="approximate", refine=0, ridge_steps=0,
                                        max_iter=it)
                          if name == "as_trained" and trained_finish == "approximate"
                          else SolverOptions(max_iter=it))
    return twin


def overlap(rows: torch.Tensor, *splits: torch.Tensor) -> int:
    """Rows of ``rows`` that also occur in any of ``splits`` (exact equality)."""
    seen = {r.numpy().tobytes() for s in splits for r in s}
    return sum(r.numpy().tobytes() in seen for r in rows)


def fraction(C: float) -> str:
    return f"1/{round(1 / C)}" if abs(1 / C - round(1 / C)) < 1e-9 else f"{C:g}"


def verdict(forward: dict, fixed: float, n_data: int) -> str:
    """One sentence: which box validation chose, against the fixed box and the best on
    test, and the condition it met (C = 1/n_data)."""
    chosen, best = forward["chosen_overall"], forward["best_on_test"]
    cond = ("C = 1/n_data" if abs(chosen["C"] - 1 / n_data) < 1e-12 else
            f"C = {fraction(chosen['C'])}, not 1/n_data = 1/{n_data}")
    against = (f"the fixed box C = {fraction(fixed)}'s {forward['fixed']['test']['mean']:.3f}"
               if forward["fixed"] is not None else
               f"the fixed box C = {fraction(fixed)}: not among the compared boxes")
    only = " (the only box compared)" if len(forward["by_box"]) == 1 else ""
    return (f"validation chose C = {fraction(chosen['C'])}{only} ({cond}, n_data = {n_data} "
            f"data tokens): test {chosen['test']['mean']:.3f} against {against}, and the "
            f"best box on test, C = {fraction(best['C'])}, {best['test']['mean']:.3f}"
            + (" (the same box)" if best["C"] == chosen["C"] else ""))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, nargs="+", required=True)
    parser.add_argument("--fixed", type=float, default=1 / 16,
                        help="the box set before training (default 1/16, the grid's base)")
    parser.add_argument("--trained-finish", choices=("approximate", "optimum"),
                        default="approximate",
                        help="the finish the models trained with (the as_trained forward)")
    parser.add_argument("--note", default=None, help="what is not done, as recorded")
    parser.add_argument("--json", type=Path, default=None)
    add_conditions(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    models, n_data = [], set()
    for path in args.models:
        model, run = load_cell_model(path)
        if any(isinstance(m, HybridSVAttention) for m in model.modules()):
            models.append((path, model, run))
            n_data.add(run.task_options["num_data"])
    if len(n_data) != 1:
        parser.error(f"the models' tasks differ in num_data: {sorted(n_data)}")
    (n_data,) = n_data
    rows = []
    for path, model, run in models:
        data = build_task(run).build(run.seed)
        vx, vy, _ = validation_split(run)
        row = {"model": portable_path(path), "run": run.run_id, "C": run.hybrid["C"],
               "seed": run.seed, "validation_seed": run.seed + VALIDATION_SEED_OFFSET,
               "validation_rows": len(vx), "test_rows": len(data.test_inputs),
               "validation_rows_in_train_or_test": overlap(vx, data.train_inputs,
                                                           data.test_inputs)}
        for name in FORWARDS:
            twin = with_forward(model, name, args.trained_finish)
            t0 = time.perf_counter()
            row[name] = {"validation": query_accuracy(twin, vx, vy),
                         "test": query_accuracy(twin, data.test_inputs, data.test_targets),
                         "seconds": time.perf_counter() - t0}
        rows.append(row)
        print({k: row[k] for k in ("run", "validation_rows_in_train_or_test", *FORWARDS)},
              flush=True)
    seeds = sorted({r["seed"] for r in rows})
    cell = {(r["C"], r["seed"]): r for r in rows}
    every = sorted({r["C"] for r in rows}, reverse=True)
    boxes = [C for C in every if all((C, s) in cell for s in seeds)]
    incomplete = {C: sorted(s for s in seeds if (C, s) in cell)
                  for C in every if C not in boxes}
    if not boxes:
        parser.error(f"no box has a model for every seed {seeds}: {incomplete}")
    forwards = {}
    for name in FORWARDS:
        val = {C: {s: cell[C, s][name]["validation"] for s in seeds} for C in boxes}
        test = {C: {s: cell[C, s][name]["test"] for s in seeds} for C in boxes}
        pick = choose_box(val)
        best_test = max(boxes, key=lambda C: np.mean(list(test[C].values())))

        def box_row(C, test=test, val=val):
            return {"C": C, "validation": mean_interval([val[C][s] for s in seeds]),
                    "test": mean_interval([test[C][s] for s in seeds])}

        per_seed = {s: {"C": C, "validation": val[C][s], "test": test[C][s]}
                    for s, C in pick["per_seed"].items()}
        forwards[name] = {
            "by_box": [box_row(C) for C in boxes],
            "chosen_per_seed": per_seed,
            "chosen_per_seed_test": mean_interval([v["test"] for v in per_seed.values()]),
            "chosen_overall": box_row(pick["overall"]),
            "fixed": box_row(args.fixed) if args.fixed in boxes else None,
            "best_on_test": box_row(best_test),
            "ties": pick["ties"]}
        forwards[name]["verdict"] = verdict(forwards[name], args.fixed, n_data)
        print(name, forwards[name]["verdict"], flush=True)
    body = {"threads": 1, "conditions": args.conditions, "fixed": args.fixed,
            "trained_finish": args.trained_finish, "n_data": n_data,
            "validation_seed_offset": VALIDATION_SEED_OFFSET, "boxes_compared": boxes,
            "incomplete_boxes": {f"{C:g}": s for C, s in incomplete.items()},
            "forwards": forwards, "rows": rows}
    if args.note:
        body["not_done"] = args.note
    if args.json:
        write_record(args.json, __file__, argv, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
