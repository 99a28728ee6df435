"""What model-level forgetting costs: ``LMStream.forget`` against re-streaming from scratch.

A CharLM of the paper's 3.22M shape (4 layers, d = 256, 4 heads; hybrid_sv with
chunk 64, C = 1/16, ``policy="full"``) reads the first ``--tokens`` bytes of enwik8
(the shared prefix, else the slice shipped with svattn). For a span of ``--span``
bytes at the start, the middle, three quarters in ("late") and the end of the stream
(the end's span lies in chunks no memory holds yet):

* ``forget``: an identical copy of the stream forgets the span (rewind by exact
  decremental removals, from the first memory snapshot at or after the span's chunk
  with ``--snapshot-every N`` > 0, then replay of the bytes after it), timed in its
  two parts and per layer;
* ``restream``: a fresh stream (no snapshots: the cheapest) reads the text without
  the span, from scratch;
* both are compared: max |logit difference| over every position (must be <= 1e-9).

Without ``--checkpoint`` the model is randomly initialised (seed 0): no trained
hybrid checkpoint ships with the repository. Costs depend on the model through the
memories' support sizes; layer 0's keys are a function of the byte alone (no
positions), so its memories hold many exact duplicates.

Usage::

    python benchmarks/bench_forget.py --tokens 1024 --json results/bench_forget.json
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
from pathlib import Path

import torch

from svattn.data.enwik8 import slice_path
from svattn.experiments.runner import portable_path
from svattn.lm import CharLM, mixer_config, preset

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_records import write_record  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared" / "data" / "enwik8" / "enwik8_prefix.bin"


def build_model(checkpoint: Path | None, seed: int) -> tuple[CharLM, str]:
    if checkpoint is not None:
        from svattn.lm.train import load_checkpoint_model

        model, _, _ = load_checkpoint_model(checkpoint)
        return model, f"trained checkpoint {portable_path(checkpoint)}"
    torch.manual_seed(seed)
    cfg = mixer_config(preset("paper-3m"), "hybrid_sv", {"policy": "full"})
    return CharLM(cfg), f"randomly initialised paper-3m hybrid_sv (seed {seed}), policy 'full'"


def per_layer(receipt) -> dict[str, float]:
    """Seconds of the rewind's removals, summed over each layer's heads."""
    out: dict[str, float] = {}
    for m in receipt.memories:
        out[str(m["layer"])] = out.get(str(m["layer"]), 0.0) + m["rewind_s"]
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=1024, help="stream length (default 1024)")
    ap.add_argument("--span", type=int, default=32, help="bytes forgotten (default 32)")
    ap.add_argument("--checkpoint", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--snapshot-every", type=int, default=4,
                    help="LMStream snapshot_every: memory copies every N chunks (0: none)")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model, model_note = build_model(args.checkpoint, args.seed)
    data_path = SHARED if SHARED.exists() else slice_path()
    text = data_path.read_bytes()[: args.tokens]
    full_policy = any(getattr(b.mix, "policy", "full") != "full" for b in model.blocks)
    base = model.stream(full_policy=full_policy, snapshot_every=args.snapshot_every)
    t0 = time.perf_counter()
    base.feed(text)
    feed_s = time.perf_counter() - t0
    print(f"fed {len(text)} bytes in {feed_s:.1f} s", flush=True)
    n, w = len(text), args.span
    rows = []
    spots = (("start", 0), ("middle", (n - w) // 2), ("late", 3 * (n - w) // 4), ("end", n - w))
    for where, start in spots:
        s = copy.deepcopy(base)
        t0 = time.perf_counter()
        receipt = s.forget(start, start + w).receipt
        forget_s = time.perf_counter() - t0
        fresh = model.stream(full_policy=full_policy, snapshot_every=0)  # the cheapest
        t0 = time.perf_counter()
        fresh.feed(text[:start] + text[start + w :])
        restream_s = time.perf_counter() - t0
        dev = float((s.all_logits() - fresh.all_logits()).abs().max())
        row = {"where": where, "span": [start, start + w], "forget_s": forget_s,
               "rewind_s": receipt.repair["seconds"]["rewind"],
               "replay_s": receipt.repair["seconds"]["replay"], "restream_s": restream_s,
               "ratio_forget_over_restream": forget_s / restream_s,
               "replayed_bytes": receipt.repair["replayed"],
               "rewound_tokens_per_memory": {k: v[1] - v[0]
                                             for k, v in receipt.repair["rewound"].items()},
               "rewind_s_per_layer": per_layer(receipt),
               "span_certificates": sum(len(m["span_certificates"]) for m in receipt.memories),
               "max_logit_deviation": dev,
               "digest_equal": s.content_digest() == fresh.content_digest()}
        rows.append(row)
        print(f"{where:>6}: forget {forget_s:.2f} s (rewind {row['rewind_s']:.2f}, replay "
              f"{row['replay_s']:.2f}) vs restream {restream_s:.2f} s: ratio "
              f"{row['ratio_forget_over_restream']:.2f}; max |dlogit| {dev:.1e}; rewind by "
              f"layer {', '.join(f'{v:.2f}' for v in row['rewind_s_per_layer'].values())} s",
              flush=True)
    support = [[len(m.support_ids()) for m in st.mems] for st in base.layers]
    body = {"model": model_note, "params": model.num_params(), "data": portable_path(data_path),
            "tokens": n, "span": w, "snapshot_every": args.snapshot_every, "feed_s": feed_s,
            "support_per_memory": support,
            "threads": 1, "rows": rows}
    if args.json is not None:
        write_record(args.json, __file__, argv, body)
    return body


if __name__ == "__main__":
    main()
