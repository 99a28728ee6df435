"""Where a training step of the 3.22M CharLM goes: the per-function profile of both models.

For the ``paper-3m`` preset with the softmax mixer and with the hybrid (the tree's
``mixer_config`` defaults), ``--steps`` full training steps each (forward, backward,
clipping, AdamW; random bytes, ``--batch`` × 256 tokens, one thread) run under
:mod:`cProfile` after ``--warmup`` untimed ones. Reported per model: the step's CPU
seconds and the ``--top`` functions by their own time per step (torch's C functions —
``linear``, ``bmm``, ``linalg_lu_factor_ex``, the autograd engine's backward — and the
compiled loops the CPU path calls, e.g. ``partition_cpu._loop``). The autograd engine's
``run_backward`` holds every backward kernel launched from C++ (the linear layers'
among them), so it is one line, not split by op. Profiling adds a few percent per
Python call; the ratios between lines are what this is for (``docs/design.md``, the
training path). Times are of one thread on whatever else the machine runs: pause
other jobs for figures worth quoting.

Usage::

    python benchmarks/profile_lm_step.py --json results/profile_lm_step.json
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_records import add_conditions, write_record  # noqa: E402
from lm_trained import describe, model_pair, train_step  # noqa: E402


def _label(func: tuple[str, int, str]) -> str:
    """``file:line(name)`` with the path cut to what follows ``site-packages/`` or ``src/``."""
    path, line, name = func
    for cut in ("site-packages/", "src/"):
        if cut in path:
            path = path.split(cut, 1)[1]
    return f"{path}:{line}({name})" if line else name


def profile_model(mixer: str, *, batch: int, steps: int, warmup: int, top: int,
                  seed: int, trained: Path | None = None, train_steps: int = 200) -> dict:
    """The profile of ``steps`` training steps of one model (see the module docs)."""
    models, x = model_pair({}, seed=seed, batch=batch, trained=trained,
                           train_steps=train_steps, mixers=(mixer,))

    def step() -> None:
        train_step(*models[mixer], x)

    for _ in range(warmup):
        step()
    prof = cProfile.Profile()
    c0 = time.process_time()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    cpu = (time.process_time() - c0) / steps
    stats = pstats.Stats(prof).stats  # {func: (cc, nc, tottime, cumtime, callers)}
    rows = sorted(((_label(f), s[1] / steps, s[2] / steps) for f, s in stats.items()),
                  key=lambda r: -r[2])[:top]
    return {"mixer": mixer, "cpu_s_per_step": round(cpu, 4),
            "top": [{"function": f, "calls_per_step": round(c, 1), "ms_per_step": round(1e3 * t, 2)}
                    for f, c, t in rows]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--trained", type=Path, default=None, metavar="DIR",
                   help="profile models trained --train-steps steps on enwik8 (weights "
                        "cached in DIR; see lm_trained.py)")
    p.add_argument("--train-steps", type=int, default=200)
    add_conditions(p)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(1)
    out = [profile_model(m, batch=args.batch, steps=args.steps, warmup=args.warmup,
                         top=args.top, seed=args.seed, trained=args.trained,
                         train_steps=args.train_steps) for m in ("softmax", "hybrid_sv")]
    for prof in out:
        print(f"\n{prof['mixer']}: {prof['cpu_s_per_step']:.3f} s of CPU per step (profiled)")
        for r in prof["top"]:
            print(f"  {r['ms_per_step']:8.2f} ms  {r['calls_per_step']:7.1f} calls  "
                  f"{r['function']}")
    if args.json:
        write_record(args.json, __file__, argv, {
            "conditions": args.conditions,
            "models": describe(args.trained, args.train_steps, args.batch), "profiles": out})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
