"""How much a trained hybrid leans on its SV memory: learned gates, and BPC with the
global path switched off.

For each ``hybrid_sv`` checkpoint it prints the gate ``sigmoid(w_h)`` of every layer
and head (the weight of the global SV path against the chunk-local softmax), then
evaluates the split twice, every byte counted: as trained, and with every gate
forced to 0 so that each query reads its local path only. The difference is what
the SV memory adds to the trained model (its other weights were trained with the
memory present, so this is an upper bound on what a local-only model of the same
weights loses, not a comparison with a model trained without it).

    python scripts/ablate_hybrid_gate.py runs/rope3500_hybrid_sv/ckpt.pt \\
        runs/rope3500_hybrid_sv_lookback/ckpt.pt --out results/lm_gate_ablation.json
    python scripts/ablate_hybrid_gate.py runs/t1024s600_hybrid_sv_lookback/ckpt.pt --append
"""

from __future__ import annotations

import json

import torch
from _eval_args import apply_threads, checkpoint_eval_parser

from svattn.lm.train import evaluate_bpc, load_checkpoint_for_eval
from svattn.mixers.hybrid import HybridSVAttention

# sigmoid(-60) underflows float32 to ~1e-26: the global path's weight is 0 to rounding
_OFF = -60.0


def gates(model: torch.nn.Module) -> list[list[float]]:
    """``sigmoid(gate)`` per hybrid layer, per head."""
    return [torch.sigmoid(m.gate.detach()).tolist() for m in model.modules()
            if isinstance(m, HybridSVAttention)]


def main(argv: list[str] | None = None) -> int:
    parser = checkpoint_eval_parser(__doc__.splitlines()[0], "ckpt.pt files of hybrid_sv runs",
                                    "results/lm_gate_ablation.json")
    parser.add_argument("--append", action="store_true",
                        help="keep the records already in --out (a checkpoint measured again "
                             "replaces its old record)")
    args = parser.parse_args(argv)
    apply_threads(args)
    records = []
    for path in args.checkpoints:
        model, cfg, ckpt, ds = load_checkpoint_for_eval(path)
        if model.cfg.mixer != "hybrid_sv":
            raise ValueError(f"{path} is a {model.cfg.mixer!r} model, expected hybrid_sv")
        lo, hi = ds.span(args.split, args.max_bytes)
        context = model.cfg.block_size
        g = gates(model)
        row = {"checkpoint": str(path), "step": ckpt["step"], "seed": cfg.seed,
               "mixer_options": model.cfg.mixer_options, "split": args.split,
               "data": ds.label, "context": context, "gates": g}
        for name in ("as_trained", "global_off"):
            if name == "global_off":
                for m in model.modules():
                    if isinstance(m, HybridSVAttention):
                        m.gate.data.fill_(_OFF)
            with torch.no_grad():
                res = evaluate_bpc(model, ds.data, lo, hi, context=context,
                                   batch_size=args.batch_size)
            row[name] = {"bpc": res["bpc"], "bytes": res["bytes"]}
        row["bpc_added_by_global_off"] = row["global_off"]["bpc"] - row["as_trained"]["bpc"]
        records.append(row)
        mean_gate = sum(sum(h) for h in g) / sum(len(h) for h in g)
        print(f"{path}: mean gate {mean_gate:.3f}; {args.split} BPC "
              f"{row['as_trained']['bpc']:.4f} as trained, "
              f"{row['global_off']['bpc']:.4f} with the SV path off "
              f"({row['bpc_added_by_global_off']:+.4f})", flush=True)
    if args.append and args.out.exists():
        fresh = {r["checkpoint"] for r in records}
        kept = [r for r in json.loads(args.out.read_text()) if r["checkpoint"] not in fresh]
        records = kept + records
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(records, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
