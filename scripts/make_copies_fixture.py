"""Write the keys of one exact memory of a trained recall model (a test fixture).

    PYTHONPATH=src python scripts/make_copies_fixture.py \\
        results/recall_selection_models/selective-copy-T128-hybrid_sv-d64-lr0.003-s2.safetensors \\
        tests/exact/data/trained_copies --sequence 1 --layer 1 --head 1 \\
        --positions 0 5 10 12 14 32 35 56 65 69 76 81 82 83 84 85 86

The model (a cell of ``svattn recall run --grid selection``, its weights kept by the grid)
reads the batch of 16 test sequences of its own task that holds ``--sequence`` in float64
with its hybrid layers in ``mode="exact"`` (as ``benchmarks/train_vs_exact.py`` runs the
exact forward); a forward pre-hook on hybrid layer ``--layer`` takes the layer's input
and the layer's own projection (``qkv_heads``) gives its keys. Writes ``<prefix>.npz``
(``keys``: float64 ``[len(positions), Dh]``, the keys of head ``--head`` at
``--positions`` in that order; ``C`` and ``gamma``: the layer's) and ``<prefix>.json``
(the command, the model and the coordinates). ``tests/exact/test_copies_on_the_drive.py``
adds these keys one by one.

The fixture's positions are 17 of the 32 keys of the memory the exact forward built at
the boundary before chunk 6 (carried support and chunk 5 under the ``"support"``
policy): among them six keys equal to the kernel (they differ in the last bits), which,
added in this order, are what made the add path's margin system singular.
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

import numpy as np
import torch

from svattn.lm.recall import build_task, load_cell_model
from svattn.mixers import HybridSVAttention
from svattn.nn.common import resolve_gamma

BATCH = 16  # benchmarks/train_vs_exact.py's batch of the exact forward


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="a recall cell's <id>.safetensors")
    parser.add_argument("prefix", type=Path, help="writes <prefix>.npz and <prefix>.json")
    parser.add_argument("--sequence", type=int, required=True, help="test sequence index")
    parser.add_argument("--layer", type=int, required=True, help="hybrid layer index")
    parser.add_argument("--head", type=int, required=True)
    parser.add_argument("--positions", type=int, nargs="+", required=True)
    args = parser.parse_args(argv)
    model, run = load_cell_model(args.model)
    model = copy.deepcopy(model).to(torch.float64).eval()
    layers = [m for m in model.modules() if isinstance(m, HybridSVAttention)]
    if not 0 <= args.layer < len(layers):
        print(f"error: --layer {args.layer}: {args.model} has {len(layers)} hybrid layers",
              file=sys.stderr)
        return 2
    for m in layers:
        m.mode = "exact"
    data = build_task(run).build(run.seed)
    start = args.sequence - args.sequence % BATCH
    x = torch.as_tensor(data.test_inputs[start : start + BATCH])
    keys: list[torch.Tensor] = []
    lay = layers[args.layer]

    def grab(mod, inputs):
        _, k, _ = mod.qkv_heads(inputs[0])  # (B, H, T, Dh)
        keys.append(k.detach())

    hook = lay.register_forward_pre_hook(grab)
    with torch.no_grad():
        model(x)
    hook.remove()
    arr = keys[0][args.sequence - start, args.head, args.positions].numpy().astype(np.float64)
    gamma = resolve_gamma(lay.kernel, lay.gamma, arr.shape[-1])
    args.prefix.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.prefix.with_suffix(".npz"), keys=arr, C=float(lay.C),
                        gamma=float(gamma))
    meta = {
        "command": "PYTHONPATH=src python scripts/make_copies_fixture.py "
                   + " ".join(sys.argv[1:] if argv is None else argv),
        "model": args.model.name, "task": run.task, "seed": run.seed,
        "sequence": args.sequence, "layer": args.layer, "head": args.head,
        "positions": args.positions, "C": float(lay.C), "kernel": lay.kernel,
        "gamma": float(gamma), "shape": list(arr.shape),
    }
    args.prefix.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
