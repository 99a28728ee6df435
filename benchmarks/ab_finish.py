"""A/B of the batched solver's finish in a recall model's training step: optimum / approximate.

The recall grid's cell (``svattn recall run --grid selection``: selective copy, T = 128,
d_model 64, 2 layers of 2 heads, batch 64, chunk 16, C = 1/8, budget 16, rotary
positions) is built twice with the same weights, once with each finish of
:class:`svattn.nn.SolverOptions` (``"optimum"``: the verified SVDD optimum;
``"approximate"``: the paper's path the grid trained with, 20 FISTA iterations, the
partition read off the iterate, one ridged margin solve). Both take full training
steps (forward, backward, AdamW) on the same batch of the task's training data,
interleaved round by round in one process on one thread. Two weight sets: the kept
trained cell (``--model``, its keys clustered and near-duplicated as training made
them) and a fresh initialisation of the same shape.

Reported per weight set: median seconds per step (wall clock and CPU time), the ratio
optimum / approximate, and, on the batch's boundary memories over every earlier key
(the ``"full"`` policy's problems, solved through the public
:func:`svattn.nn.sv_attention_state` with the optimum finish), how many problems fell
back to the exact oracle and how many were left unsettled.

    python benchmarks/ab_finish.py --model results/recall_selection_models/<cell>.safetensors \\
        --rounds 5 --steps 2 --json results/ab_finish.json
"""

from __future__ import annotations

import argparse
import copy
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_records import add_conditions, portable_path, write_record  # noqa: E402
from step_timing import interleaved_medians  # noqa: E402
from svattn.lm.recall import build_task, load_cell_model  # noqa: E402
from svattn.mixers import HybridSVAttention  # noqa: E402
from svattn.nn import sv_attention_state  # noqa: E402


def with_finish(model, finish: str):
    """A copy of ``model`` whose hybrid layers use ``finish``."""
    twin = copy.deepcopy(model)
    for mod in twin.modules():
        if isinstance(mod, HybridSVAttention):
            mod.solver = replace(mod.solver, finish=finish)
    return twin


@torch.no_grad()
def fallback_share(model, x) -> dict:
    """Problems the optimum finish solved, and how many fell back to the oracle, over the
    boundary memories of ``model``'s forward on ``x``: each hybrid layer's input is
    captured, projected with its ``qkv``, and every boundary's memory over every earlier
    key (the ``"full"`` policy's problems, of which the ``"support"`` policy solves
    subsets) is solved by the public :func:`svattn.nn.sv_attention_state` with the
    layer's solver, whose diagnostics count the fallbacks."""
    layers = [m for m in model.modules() if isinstance(m, HybridSVAttention)]
    seen: dict[int, torch.Tensor] = {}
    hooks = [m.register_forward_hook(lambda mod, args, out, i=i: seen.__setitem__(i, args[0]))
             for i, m in enumerate(layers)]
    try:
        model(x)
    finally:
        for h in hooks:
            h.remove()
    count = {"problems": 0, "fallbacks": 0, "unsettled": 0}
    for i, mix in enumerate(layers):
        q, k, v = mix.qkv_heads(seen[i])  # (B, H, T, Dh)
        L, T = mix.chunk, k.shape[2]
        for end in range(L, T, L):  # boundary before the chunk starting at `end`
            *_, info = sv_attention_state(q[:, :, end : end + L], k[:, :, :end],
                                          v[:, :, :end], C=mix.C, kernel=mix.kernel,
                                          gamma=mix.gamma, solver=mix.solver)
            count["problems"] += k.shape[0] * k.shape[1]
            count["fallbacks"] += int(info.fallbacks)
            count["unsettled"] += int(info.unsettled)
    return count


def time_pair(model, x, y, rounds: int, steps: int) -> dict:
    models = {f: with_finish(model, f) for f in ("optimum", "approximate")}
    opts = {f: torch.optim.AdamW(m.parameters(), lr=1e-4) for f, m in models.items()}
    for m in models.values():
        m.train()

    def step(f: str) -> None:
        _, loss = models[f](x, targets=y)
        opts[f].zero_grad(set_to_none=True)
        loss.backward()
        opts[f].step()

    for f in models:
        step(f)  # warm-up (numba kernels compiled and cached)
    wall, cpu = interleaved_medians({f: (lambda f=f: step(f)) for f in models}, rounds, steps)
    return {"seconds_per_step": wall, "cpu_seconds_per_step": cpu,
            "ratio_optimum_over_approximate": wall["optimum"] / wall["approximate"],
            "cpu_ratio_optimum_over_approximate": cpu["optimum"] / cpu["approximate"],
            "optimum_solves_full_policy": fallback_share(models["optimum"], x)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True, help="a recall cell's weights")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=2, help="steps per round")
    parser.add_argument("--json", type=Path, default=None)
    add_conditions(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    trained, run = load_cell_model(args.model)
    data = build_task(run).build(run.seed)
    x = torch.as_tensor(data.train_inputs[: run.batch_size])
    y = torch.as_tensor(data.train_targets[: run.batch_size])
    torch.manual_seed(run.seed)
    fresh = copy.deepcopy(trained)
    for mod in fresh.modules():
        if hasattr(mod, "reset_parameters"):
            mod.reset_parameters()
    rows = {}
    for name, model in (("trained", trained), ("fresh", fresh)):
        rows[name] = time_pair(model, x, y, args.rounds, args.steps)
        print(name, rows[name], flush=True)
    body = {"model": portable_path(args.model), "run": run.run_id, "batch": run.batch_size,
            "seq_len": run.seq_len, "threads": 1, "rounds": args.rounds,
            "steps_per_round": args.steps, "conditions": args.conditions, "rows": rows}
    if args.json:
        write_record(args.json, __file__, argv, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
