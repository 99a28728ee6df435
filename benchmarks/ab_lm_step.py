"""A/B of the 3.22M CharLM's training step on two source trees: hybrid_sv / softmax.

Each run is its own process with ``PYTHONPATH`` set to one tree's ``src`` (A, B, A,
B, ...). A run builds the ``paper-3m`` preset with the softmax mixer and with the
tree's hybrid defaults (``mixer_config``), times full training steps (forward,
backward, clipping, AdamW; random bytes, ``--batch`` × 256 tokens) interleaved
round by round, and counts the aten ops of one step of each model with
:mod:`torch.profiler` (launched calls: aten events not nested in another aten op;
exact on any machine, unlike the times). Reported per run: the median seconds per
step (wall clock and this process's CPU time) and the ratios hybrid / softmax; on a
shared machine only the ratios (and the counts) mean anything, the CPU-time ratio
least disturbed by time slicing.

With ``--trained DIR`` both models are first trained ``--train-steps`` steps on the
enwik8 prefix and timed on its text (``lm_trained.py``: the cost a training run pays
once the memory's support is no longer every key); the weights are cached in ``DIR``,
so train them once with ``--train-only`` while the machine is busy, then time.

Usage (the tree before a change checked out with ``git worktree add ../base REV``)::

    python benchmarks/ab_lm_step.py --a ../base --b . --pairs 3 --json results/ab_lm_step.json
    python benchmarks/ab_lm_step.py --train-only --trained runs/lm-step-trained
    python benchmarks/ab_lm_step.py --a . --b . --trained runs/lm-step-trained ...
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_trees import run_pairs, tree_fields  # noqa: E402
from bench_records import add_conditions, portable_path, write_record  # noqa: E402
from lm_trained import describe, model_pair, train_step  # noqa: E402
from step_timing import aten_calls, interleaved_medians  # noqa: E402


def worker(args: argparse.Namespace) -> dict:
    """One run in this process's tree: step times and aten calls of both models."""
    import torch

    torch.set_num_threads(1)
    models, x = model_pair(json.loads(args.hybrid_options), seed=args.seed,
                           batch=args.batch, trained=args.trained,
                           train_steps=args.train_steps)
    if args.train_only:
        return {"trained": [portable_path(p) for p in sorted(args.trained.glob("*.pt"))]}

    def step(mixer: str) -> None:
        train_step(*models[mixer], x)

    calls = {}
    for mixer in models:
        step(mixer)  # warm-up
        calls[mixer] = aten_calls(lambda m=mixer: step(m))[0]
    med, cmed = interleaved_medians({m: (lambda m=m: step(m)) for m in models}, args.rounds,
                                    args.steps)
    return {
        "mixer_options": models["hybrid_sv"][0].cfg.mixer_options,
        "softmax_s_per_step": round(med["softmax"], 4),
        "hybrid_s_per_step": round(med["hybrid_sv"], 4),
        "ratio_hybrid_over_softmax": round(med["hybrid_sv"] / med["softmax"], 3),
        # CPU seconds of this process (one thread): less sensitive to time slicing on a
        # shared machine than the wall clock
        "softmax_cpu_s_per_step": round(cmed["softmax"], 4),
        "hybrid_cpu_s_per_step": round(cmed["hybrid_sv"], 4),
        "cpu_ratio_hybrid_over_softmax": round(cmed["hybrid_sv"] / cmed["softmax"], 3),
        "softmax_aten_calls": calls["softmax"],
        "hybrid_aten_calls": calls["hybrid_sv"],
    }


def worker_args(args: argparse.Namespace) -> list[str]:
    """The command line of one run (:func:`worker`) in a tree."""
    trained = (["--trained", str(args.trained.resolve()), "--train-steps",
                str(args.train_steps)] if args.trained else [])
    return [str(Path(__file__).resolve()), "--worker", "--rounds", str(args.rounds),
            "--steps", str(args.steps), "--batch", str(args.batch), "--seed", str(args.seed),
            "--hybrid-options", args.hybrid_options, *trained]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--a", type=Path, help="the tree before (the baseline)")
    p.add_argument("--b", type=Path, help="the tree after")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=1, help="timed steps per model per round")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--hybrid-options", default="{}",
                   help="JSON options over the hybrid defaults (both trees)")
    p.add_argument("--trained", type=Path, default=None, metavar="DIR",
                   help="time models trained --train-steps steps on enwik8 (weights cached "
                        "in DIR) instead of freshly initialised ones on random bytes")
    p.add_argument("--train-steps", type=int, default=200)
    p.add_argument("--train-only", action="store_true",
                   help="train and cache the --trained weights in this tree, time nothing")
    p.add_argument("--json", type=Path)
    add_conditions(p, "--machine")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.train_steps < 1:
        p.error(f"--train-steps must be at least 1, got {args.train_steps}")
    if args.train_only and args.trained is None:
        p.error("--train-only needs --trained DIR")
    if args.worker or args.train_only:
        print(json.dumps(worker(args)))
        return 0
    if args.a is None or args.b is None:
        p.error("--a and --b are required")

    def show(i: int, side: str, r: dict) -> None:
        print(f"pair {i + 1}/{args.pairs} {side}: hybrid/softmax "
              f"{r['ratio_hybrid_over_softmax']:.3f} wall, "
              f"{r['cpu_ratio_hybrid_over_softmax']:.3f} CPU  "
              f"({r['hybrid_s_per_step']:.3f} s / "
              f"{r['softmax_s_per_step']:.3f} s)  aten calls hybrid "
              f"{r['hybrid_aten_calls']} softmax {r['softmax_aten_calls']}", flush=True)

    runs = run_pairs(args.a, args.b, worker_args(args), args.pairs, show)
    summary = {s: {"ratio_median": statistics.median(r["ratio_hybrid_over_softmax"]
                                                     for r in runs[s]),
                   "cpu_ratio_median": statistics.median(r["cpu_ratio_hybrid_over_softmax"]
                                                         for r in runs[s]),
                   "hybrid_aten_calls": runs[s][-1]["hybrid_aten_calls"],
                   "softmax_aten_calls": runs[s][-1]["softmax_aten_calls"]} for s in runs}
    print(json.dumps(summary))
    if args.json:
        write_record(args.json, __file__, argv, {
            **tree_fields(args.a, args.b),
            "machine": args.machine,
            "models": describe(args.trained, args.train_steps, args.batch),
            "summary": summary, "runs": runs})
    return 0


if __name__ == "__main__":
    sys.exit(main())
