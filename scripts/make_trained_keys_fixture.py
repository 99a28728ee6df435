"""Write the keys a trained recall model's hybrid layers build their memories from (a test fixture).

    PYTHONPATH=src python scripts/make_trained_keys_fixture.py \\
        results/recall_selection_models/\\
selective-copy-T128-hybrid_sv-C0.125-d64-lr0.003-s0.safetensors \\
        tests/nn/data/trained_keys --sequences 4

The model (a cell of ``svattn recall run --grid selection``, its weights kept by the grid)
reads the first ``--sequences`` test sequences of its own task in float32, as it was
trained; a forward pre-hook on each hybrid layer takes the layer's input and the
layer's own projection (``qkv_heads``) gives its keys ``[B, H, T, Dh]``. Every
boundary problem of the ``"full"`` policy is a prefix of them (the keys of chunks
``0 .. c−1``). Writes ``<prefix>.npz`` (``keys``: float32 ``[sequences, layers, H, T,
Dh]``) and ``<prefix>.json`` (the command, the model, chunk, C, kernel and gamma).
``tests/nn/test_nn_finish.py`` solves these problems.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from svattn.lm.recall import build_task, load_cell_model
from svattn.mixers import HybridSVAttention
from svattn.nn.common import resolve_gamma


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="a recall cell's <id>.safetensors")
    parser.add_argument("prefix", type=Path, help="writes <prefix>.npz and <prefix>.json")
    parser.add_argument("--sequences", type=int, default=4)
    args = parser.parse_args(argv)
    model, run = load_cell_model(args.model)
    layers = [m for m in model.modules() if isinstance(m, HybridSVAttention)]
    if not layers:
        print(f"error: {args.model} has no hybrid layer", file=sys.stderr)
        return 2
    data = build_task(run).build(run.seed)
    x = torch.as_tensor(data.test_inputs[: args.sequences])
    keys: list[torch.Tensor] = []

    def grab(mod, inputs):
        _, k, _ = mod.qkv_heads(inputs[0])  # (B, H, T, Dh)
        keys.append(k.detach())

    hooks = [m.register_forward_pre_hook(grab) for m in layers]
    with torch.no_grad():
        model(x)
    for h in hooks:
        h.remove()
    arr = torch.stack(keys, 1).numpy().astype(np.float32)  # (B, layers, H, T, Dh)
    lay = layers[0]
    args.prefix.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(args.prefix.with_suffix(".npz"), keys=arr)
    meta = {
        "command": "PYTHONPATH=src python scripts/make_trained_keys_fixture.py "
                   + " ".join(sys.argv[1:] if argv is None else argv),
        "model": args.model.name, "task": run.task, "seed": run.seed,
        "sequences": args.sequences, "chunk": lay.chunk, "C": lay.C, "kernel": lay.kernel,
        "gamma": resolve_gamma(lay.kernel, lay.gamma, arr.shape[-1]), "shape": list(arr.shape),
    }
    args.prefix.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    print(json.dumps(meta))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
