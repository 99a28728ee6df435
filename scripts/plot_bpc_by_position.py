"""BPC by offset in the evaluation block, for trained checkpoints, as one PNG (and JSON).

The evaluation cuts a split into blocks of ``context`` bytes; the byte at
offset ``t`` of a block is predicted from ``t`` bytes of context. This draws
the BPC of each offset, one line per checkpoint, with the hybrid's chunk
boundaries marked: there a ``hybrid_sv`` query's local softmax starts over and
everything older comes from the (position-free) SV memory.

    python scripts/plot_bpc_by_position.py runs/rope3500_hybrid_sv/ckpt.pt \\
        runs/rope3500_sliding/ckpt.pt --split val --out results/lm_bpc_by_position.png
"""

from __future__ import annotations

import json

import matplotlib
import torch

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from _eval_args import apply_threads, checkpoint_eval_parser  # noqa: E402

from svattn.lm.model import positions_of  # noqa: E402
from svattn.lm.train import evaluate_bpc, load_checkpoint_for_eval  # noqa: E402


def label_of(model_cfg, step: int, seed: int | None = None) -> str:
    """``mixer[ lookback K] (positions[, seed s]) @ step``."""
    pos = positions_of(model_cfg).replace("none", "NoPE")
    lookback = (model_cfg.mixer_options or {}).get("lookback", 0)
    variant = f" lookback {lookback}" if lookback else ""  # our variant of the hybrid
    where = pos if seed is None else f"{pos}, seed {seed}"
    return f"{model_cfg.mixer}{variant} ({where}) @ step {step}"


def main(argv: list[str] | None = None) -> int:
    args = checkpoint_eval_parser(__doc__.splitlines()[0], "ckpt.pt files of svattn train",
                                  "results/lm_bpc_by_position.png").parse_args(argv)
    apply_threads(args)
    fig, ax = plt.subplots(figsize=(7.5, 4.5))
    records, chunks = [], set()
    for i, path in enumerate(args.checkpoints):
        model, cfg, ckpt, ds = load_checkpoint_for_eval(path)
        lo, hi = ds.span(args.split, args.max_bytes)
        context = model.cfg.block_size
        with torch.no_grad():
            res = evaluate_bpc(model, ds.data, lo, hi, context=context,
                               batch_size=args.batch_size, per_position=True)
        label = label_of(model.cfg, ckpt["step"], getattr(cfg, "seed", None))
        print(f"{label}: {args.split} BPC {res['bpc']:.4f} over {res['bytes']:,} bytes")
        ax.plot(range(context), res["bpc_by_position"], color=f"C{i}", lw=1.0,
                label=f"{label}: {res['bpc']:.3f}")
        if model.cfg.mixer == "hybrid_sv":
            chunks.add(int(model.cfg.mixer_options["chunk"]))
        records.append({"checkpoint": str(path), "label": label, "split": args.split,
                        "data": ds.label, **res})
    for L in sorted(chunks):
        for b in range(L, max(r["context"] for r in records), L):
            ax.axvline(b, color="grey", lw=0.6, ls=":")
    ax.set_xlabel(f"offset in the evaluation block (bytes of context); dotted: hybrid chunk "
                  f"boundaries {sorted(chunks) or ''}")
    ax.set_ylabel(f"{args.split} bits per byte")
    ax.set_title("BPC by context position")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    args.out.with_suffix(".json").write_text(json.dumps(records, indent=1) + "\n")
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
