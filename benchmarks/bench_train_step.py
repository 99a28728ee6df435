"""Training step of a 2-layer CharLM: hybrid_sv ("support") against its matched sliding window.

For each (d_model, T, chunk) of the grid both models run forward + backward on
the same random bytes in one process, interleaved round by round (load from
other processes on a shared machine hits them alike). Reported per
configuration, eager and (with ``--compile``) under :func:`torch.compile`:

* seconds per step (median of ``--rounds`` rounds of ``--steps`` steps) and the
  ratio hybrid / sliding;
* aten ops per step, counted by :mod:`torch.profiler` over forward and backward:
  *calls* (aten events not nested in another aten op: what Python and autograd
  launch) and *events* (every ``aten::`` event, nested ones included).

Modes (``--modes``): ``eager``; ``solver-compiled`` (the hybrid's
``compile_solver=True``: each boundary's partition from one compiled kernel, the
rest eager; the sliding model is eager); ``compiled`` (``torch.compile(fullgraph=True)``
of both whole models). Compile time is excluded: each model is warmed up before timing.
The hybrid uses the LM's solver defaults (:data:`svattn.lm.configs.HYBRID_DEFAULTS`:
20 FISTA iterations, no repair rounds) with ``C = 2/chunk`` and ``budget = chunk/2``
(the issue-#25 setting at chunk 16: C = 1/8, budget 8, window 24), 2 heads, rope.
``--solver`` picks the solver settings: ``lm`` (the LM's defaults above) and/or
``default`` (:class:`svattn.nn.SolverOptions` defaults: 10 active-set repair
rounds, one iterated-ridge step; the setting issue #25 measured).

    python benchmarks/bench_train_step.py [--d-model 64 128 256] [--T 128 256 1024]
        [--chunk 16 32 64] [--batch 64] [--modes eager solver-compiled compiled]
        [--json results/bench_train_step.json]
"""

from __future__ import annotations

import argparse
import itertools
import platform
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_records import add_conditions, write_record  # noqa: E402
from step_timing import aten_calls, interleaved_medians  # noqa: E402
from svattn.lm import CharLM, CharLMConfig, mixer_config  # noqa: E402

# Solver settings: the LM's (HYBRID_DEFAULTS: 20 FISTA iterations, no repair, no ridge
# refinement) and the layer's own defaults (SolverOptions(): 10 repair rounds, 1 ridge step;
# what issue #25 measured).
SOLVERS = {"lm": {}, "default": {"max_iter": 20, "refine": 10, "ridge_steps": 1}}


MODES = ("eager", "solver-compiled", "compiled")


def build(
    mixer: str, d_model: int, T: int, chunk: int, seed: int, solver: str, mode: str = "eager"
) -> CharLM:
    torch.manual_seed(seed)
    cfg = CharLMConfig(n_layer=2, n_embd=d_model, n_head=2, block_size=T, rope=True)
    hyb = {"chunk": chunk, "C": 2.0 / chunk, "budget": chunk // 2, **SOLVERS[solver]}
    model = CharLM(mixer_config(cfg, mixer, hyb))
    if mode == "solver-compiled":
        for mod in model.modules():
            if hasattr(mod, "compile_solver"):
                mod.compile_solver = True
    return model


def make_step(model: CharLM, mode: str):
    fwd = torch.compile(model, fullgraph=True) if mode == "compiled" else model

    def step(x: torch.Tensor) -> None:
        _, loss = fwd(x[:, :-1], targets=x[:, 1:])
        model.zero_grad(set_to_none=True)
        loss.backward()

    return step


def run_config(
    d_model: int, T: int, chunk: int, solver: str, args: argparse.Namespace
) -> list[dict]:
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randint(0, 256, (args.batch, T + 1), generator=g)
    out = []
    for mode in args.modes:
        steps = {m: make_step(build(m, d_model, T, chunk, args.seed, solver, mode), mode)
                 for m in ("sliding", "hybrid_sv")}
        warm = {}
        for m, step in steps.items():  # warm-up (and compilation, timed apart)
            t0 = time.perf_counter()
            step(x)
            warm[m] = time.perf_counter() - t0
            step(x)
        calls = {m: aten_calls(lambda s=s: s(x)) for m, s in steps.items()}
        med, cmed = interleaved_medians({m: (lambda s=s: s(x)) for m, s in steps.items()},
                                        args.rounds, args.steps)
        rec = {
            "d_model": d_model, "T": T, "chunk": chunk, "C": 2.0 / chunk,
            "budget": chunk // 2, "window": chunk + chunk // 2, "batch": args.batch,
            "solver": solver, "mode": mode,
            "sliding_s_per_step": round(med["sliding"], 4),
            "hybrid_s_per_step": round(med["hybrid_sv"], 4),
            "ratio_hybrid_over_sliding": round(med["hybrid_sv"] / med["sliding"], 2),
            # CPU seconds of the process (less disturbed by time slicing on a shared machine)
            "sliding_cpu_s_per_step": round(cmed["sliding"], 4),
            "hybrid_cpu_s_per_step": round(cmed["hybrid_sv"], 4),
            "cpu_ratio_hybrid_over_sliding": round(cmed["hybrid_sv"] / cmed["sliding"], 2),
            # the first step: compilation included (modes other than eager)
            "sliding_first_step_s": round(warm["sliding"], 2),
            "hybrid_first_step_s": round(warm["hybrid_sv"], 2),
            "sliding_aten_calls": calls["sliding"][0],
            "hybrid_aten_calls": calls["hybrid_sv"][0],
            "sliding_aten_events": calls["sliding"][1],
            "hybrid_aten_events": calls["hybrid_sv"][1],
        }
        print(
            f"d={d_model:4d} T={T:5d} L={chunk:3d} {solver:7s} "
            f"{mode:15s}  "
            f"sliding {med['sliding']:.4f} s  hybrid {med['hybrid_sv']:.4f} s  "
            f"ratio {rec['ratio_hybrid_over_sliding']:.2f}x (CPU "
            f"{rec['cpu_ratio_hybrid_over_sliding']:.2f}x, first step "
            f"{rec['hybrid_first_step_s']:.1f} s)   aten calls (events) sliding "
            f"{calls['sliding'][0]} ({calls['sliding'][1]}) hybrid {calls['hybrid_sv'][0]} "
            f"({calls['hybrid_sv'][1]})",
            flush=True,
        )
        out.append(rec)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--d-model", type=int, nargs="+", default=[64, 128, 256])
    ap.add_argument("--T", type=int, nargs="+", default=[128, 256, 1024])
    ap.add_argument("--chunk", type=int, nargs="+", default=[16, 32, 64])
    ap.add_argument("--solver", nargs="+", choices=sorted(SOLVERS), default=["lm", "default"])
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=2, help="timed steps per model per round")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--modes", nargs="+", choices=MODES, default=["eager"],
                    help="eager; solver-compiled (the hybrid's compile_solver: the boundary "
                         "partitions compiled); compiled (torch.compile(fullgraph) of the "
                         "whole model; its compilation grows with T/chunk)")
    ap.add_argument("--json", type=Path, default=None, help="write the records here")
    add_conditions(ap)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    records = []
    for d, T, L, sol in itertools.product(args.d_model, args.T, args.chunk, args.solver):
        if L >= T:
            continue  # one chunk: the hybrid is causal softmax
        records += run_config(d, T, L, sol, args)
        if args.json:  # after every configuration: a cut-short run keeps what it measured
            write_record(args.json, __file__, argv, {
                "machine": f"{platform.machine()} CPU, {torch.get_num_threads()} threads",
                "conditions": args.conditions,
                "torch": torch.__version__,
                "records": records,
            })
    if args.json:
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
