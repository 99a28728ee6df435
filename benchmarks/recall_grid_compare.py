"""A recall grid retrained with the optimum finish against the same grid trained with
the paper's approximate finish: accuracy per seed, and what the memories select.

Both grids are collected results files (``svattn recall collect``); cells are matched by
id (the same task, box, learning rate and seed: only the solver's finish differs). Per
cell and seed:

* test accuracy of each grid, with a 95 % Wilson interval over the scored positions of
  the test split (the positions of one sequence are not independent: the interval is a
  floor on the uncertainty, not a bound), and the difference new − old;
* per box: the mean over seeds with a 95 % t-interval (``mean_interval``, as the grid's
  summary), for the seeds both grids have and for each grid's own seeds, and the
  paired difference over the common seeds;
* what the memories select at the optimum, by count, by distinct key and by weight:
  ``--old-exact`` / ``--new-exact`` (records of ``benchmarks/selection_on_optimum.py``:
  the last-boundary memories re-solved by the certified solver), and the retrained
  grid's own inspection (its records re-solve exactly as well);
* the training forward against the exact float64 forward of the retrained models
  (``--new-agreement``: a ``benchmarks/train_vs_exact.py`` record).

Cells in one grid only are listed under ``only_old`` / ``only_new``. ``--progress DIR``
(the retrained grid's runs folder, ``svattn recall run --ckpt-every``) adds the cells
still training: from each ``DIR/<id>/log.jsonl``, the training loss at every checkpoint
step beside the old grid's recorded loss at the same step (the same initialisation and
batches: only the finish differs; each loss is one batch's), and the test accuracy at
the checkpoints (the old grid recorded its test accuracy at the end only).

    python benchmarks/recall_grid_compare.py \\
        --old results/recall_selection.json --new results/recall_selection_optimum.json \\
        --old-exact results/selection_on_optimum.json \\
        --new-exact results/selection_on_optimum_retrained.json \\
        --new-agreement results/train_vs_exact_retrained.json \\
        --json results/recall_selection_optimum_vs_approximate.json
    python benchmarks/recall_grid_compare.py --old results/recall_selection.json \\
        --progress runs/recall-selection-optimum runs/recall-selection-approximate \\
        --json results/recall_selection_optimum_progress.json   # cells still training
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_records import add_conditions, portable_path, write_record  # noqa: E402
from svattn.lm.checkpoint import read_checkpoint  # noqa: E402
from svattn.lm.recall import RecallRun, build_task  # noqa: E402
from svattn.lm.recall_grid import cell_measures, mean_interval  # noqa: E402
from svattn.nn import SolverOptions  # noqa: E402
from svattn.tasks import IGNORE  # noqa: E402

SELECTION = ("support_per_head", "distinct_support_per_head", "data_mass", "data_share")


def wilson(k: int, n: int, z: float = 1.959963984540054) -> list[float]:
    """95 % Wilson score interval of ``k`` successes in ``n`` trials.

    Examples
    --------
    >>> [round(x, 4) for x in wilson(90, 100)]
    [0.8256, 0.9448]
    """
    if n < 1:
        raise ValueError("wilson: n must be >= 1")
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return [mid - half, mid + half]


_SCORED: dict[str, int] = {}


def scored_positions(run: dict) -> int:
    """Scored positions of a run's test split (targets not IGNORE), by rebuilding it."""
    key = json.dumps({k: run[k] for k in ("task", "seq_len", "num_test", "num_train",
                                          "task_options", "seed")}, sort_keys=True)
    if key not in _SCORED:
        r = RecallRun.from_dict(run)
        data = build_task(r).build(r.seed)
        _SCORED[key] = int((data.test_targets != IGNORE).sum())
    return _SCORED[key]


def accuracy_row(rec: dict) -> dict:
    n = scored_positions(rec["run"])
    k = round(rec["accuracy"] * n)
    return {"accuracy": rec["accuracy"], "scored": n, "wilson95": wilson(k, n)}


def exact_selection(path: Path | None) -> dict[str, dict]:
    """Per cell id: a selection_on_optimum record's figures (certified solver)."""
    if path is None:
        return {}
    rows = json.loads(path.read_text())["rows"]
    return {r["run"]: {k: r["summary"]["memory"][k] for k in SELECTION}
            for r in rows if "memory" in r["summary"]}


def agreement(path: Path | None) -> dict[str, dict]:
    """Per cell id: a train_vs_exact record's optimum-finish rows against exact."""
    if path is None:
        return {}
    out = {}
    for r in json.loads(path.read_text())["rows"]:
        if "exact_error" in r:
            out[r["run"]] = {"exact_error": r["exact_error"]}
            continue
        out[r["run"]] = {"sequences": r["sequences"], "exact_accuracy": r["exact_accuracy"],
                         **{name: {k: r[name][k] for k in (
                             "argmax_agreement", "argmax_agreement_scored", "max_abs_dlogit",
                             "max_abs_dlogit_scored", "accuracy")}
                            for name in ("optimum_f64", "optimum_f32")}}
    return out


def _fmt(d: dict | None) -> str:
    if d is None:
        return "—"
    return f"{d['mean']:.3f}" + (f" [{d['ci95'][0]:.3f}, {d['ci95'][1]:.3f}]" if d["ci95"] else "")


def _interval(values: list[float]) -> dict | None:
    return mean_interval(values) if values else None


def compare(old: dict, new: dict, old_exact: dict, new_exact: dict, agree: dict) -> dict:
    olds = {r["id"]: r for r in old["records"]}
    news = {r["id"]: r for r in new["records"]}
    groups: dict[tuple, list[str]] = {}
    for rid, rec in sorted(news.items()):
        m = cell_measures(rec)
        groups.setdefault(_group(rec), []).append(rid)
    boxes = []
    for (task, seq_len, mixer, C), ids in sorted(
            groups.items(), key=lambda kv: (kv[0][:3], -(kv[0][3] or 0))):
        seeds = []
        for rid in ids:
            rec, m = news[rid], cell_measures(news[rid])
            row = {"id": rid, "seed": rec["run"]["seed"], "new": accuracy_row(rec),
                   "new_selection": {k: m.get(k) for k in SELECTION},
                   "new_solver": rec.get("solver"),
                   "new_train_seconds": rec.get("train_seconds")}
            if rid in olds:
                row["old"] = accuracy_row(olds[rid])
                row["new_minus_old"] = row["new"]["accuracy"] - row["old"]["accuracy"]
                # training loss at each recorded step (one batch's), old beside new
                was = dict(map(tuple, olds[rid].get("loss_curve", [])))
                row["loss_curve_new_old"] = [[k, v, was.get(k)]
                                             for k, v in rec.get("loss_curve", [])]
            if rid in old_exact:
                row["old_exact_selection"] = old_exact[rid]
            if rid in new_exact:
                row["new_exact_selection"] = new_exact[rid]
            if rid in agree:
                row["train_vs_exact"] = agree[rid]
            seeds.append(row)
        common = [r for r in seeds if "old" in r]
        old_ids = [i for i, r in olds.items() if _group(r) == (task, seq_len, mixer, C)]
        lrs = {news[i]["run"]["lr"] for i in ids}
        baselines: dict[str, list[float]] = {}  # the old grid's other mixers, same task
        for r in olds.values():
            if (r["run"]["task"], r["run"]["seq_len"]) == (task, seq_len) \
                    and r["run"]["mixer"] != mixer and r["run"]["lr"] in lrs:
                baselines.setdefault(r["run"]["mixer"], []).append(r["accuracy"])
        boxes.append({
            "task": task, "seq_len": seq_len,
            "mixer": mixer, "C": C, "seeds": [r["seed"] for r in seeds],
            "old_other_mixers_same_lr": {k: _interval(v) for k, v in sorted(baselines.items())},
            "new": _interval([r["new"]["accuracy"] for r in seeds]),
            "old_same_seeds": _interval([r["old"]["accuracy"] for r in common]),
            "old_all_seeds": _interval([olds[i]["accuracy"] for i in sorted(old_ids)]),
            "new_minus_old_paired": _interval([r["new_minus_old"] for r in common]),
            "rows": seeds})
    return {"boxes": boxes,
            "only_old": sorted(set(olds) - set(news)),
            "only_new": sorted(set(news) - set(olds))}


def _group(rec: dict) -> tuple:
    """A cell's box: task, length, mixer and C (its seeds and finish aside)."""
    return (rec["run"]["task"], rec["run"]["seq_len"], rec["run"]["mixer"],
            cell_measures(rec)["C"])


def progress(old: dict, folder: Path, finished: set[str]) -> list[dict]:
    """The cells of ``folder`` still training (no finished record in ``finished``):
    loss per checkpoint step beside the old grid's at the same step, test accuracy, and
    the finish the cell trains with (its checkpoint's run)."""
    olds = {r["id"]: r for r in old["records"]}
    out = []
    for log in sorted(folder.glob("*/log.jsonl")):
        rid = log.parent.name
        if rid in finished:
            continue
        steps = {}
        for line in log.read_text().splitlines():
            row = json.loads(line)
            steps[row["step"]] = row
        was = dict(map(tuple, olds[rid]["loss_curve"])) if rid in olds else {}
        rows = [{"step": k, "loss": steps[k]["loss"], "old_loss": was.get(k),
                 "test_accuracy": steps[k]["accuracy"],
                 "train_seconds": steps[k]["train_seconds"]} for k in sorted(steps)]
        run = read_checkpoint(log.parent / "ckpt.pt")["run"]
        out.append({"id": rid, "folder": portable_path(folder),
                    "finish": run["hybrid"].get("finish", SolverOptions().finish),
                    "steps_done": max(steps) if steps else 0,
                    "old_accuracy": olds[rid]["accuracy"] if rid in olds else None,
                    "curve": rows})
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--old", type=Path, required=True)
    parser.add_argument("--new", type=Path, default=None,
                        help="the retrained grid's collected results (absent: none finished)")
    parser.add_argument("--progress", type=Path, nargs="+", default=None, metavar="DIR",
                        help="runs folders of cells still training (the retrained grid's, "
                        "a control's)")
    parser.add_argument("--old-exact", type=Path, default=None)
    parser.add_argument("--new-exact", type=Path, default=None)
    parser.add_argument("--new-agreement", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    add_conditions(parser)
    args = parser.parse_args(argv)
    if args.new is None and args.progress is None:
        parser.error("give --new, --progress or both")
    old = json.loads(args.old.read_text())
    new = json.loads(args.new.read_text()) if args.new else {"records": []}
    body = compare(old, new, exact_selection(args.old_exact), exact_selection(args.new_exact),
                   agreement(args.new_agreement))
    if args.progress is not None:
        body["in_progress"] = []
        for folder in args.progress:
            if not folder.is_dir():
                parser.error(f"--progress: no such folder: {folder}")
            body["in_progress"] += progress(old, folder, {r["id"] for r in new["records"]}
                                            if folder == args.progress[0] else set())
        for cell in body["in_progress"]:
            print(cell["id"], [(r["step"], round(r["loss"], 3), r["old_loss"] and
                                round(r["old_loss"], 3)) for r in cell["curve"]], flush=True)
    for box in body["boxes"]:
        others = ", ".join(f"{k} {_fmt(v)}" for k, v in box["old_other_mixers_same_lr"].items())
        print(f"{box['task']} T={box['seq_len']} {box['mixer']} C={box['C']}: "
              f"seeds {box['seeds']}: new {_fmt(box['new'])}, "
              f"old (same seeds) {_fmt(box['old_same_seeds'])}, paired new − old "
              f"{_fmt(box['new_minus_old_paired'])}"
              + (f"; old grid's other mixers: {others}" if others else ""), flush=True)
        for r in box["rows"]:
            print(f"  s{r['seed']}: new {r['new']['accuracy']:.4f} old "
                  f"{r.get('old', {}).get('accuracy', float('nan')):.4f}", flush=True)
    body = {"old": portable_path(args.old),
            "new": portable_path(args.new) if args.new else None,
            "progress": [portable_path(f) for f in args.progress] if args.progress else None,
            "old_exact": portable_path(args.old_exact) if args.old_exact else None,
            "new_exact": portable_path(args.new_exact) if args.new_exact else None,
            "new_agreement": (portable_path(args.new_agreement) if args.new_agreement
                              else None),
            "old_command": old.get("command"), "new_command": new.get("command"),
            "conditions": args.conditions, **body}
    if args.json:
        write_record(args.json, __file__, argv, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
