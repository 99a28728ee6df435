"""Training throughput of the paper's 3.22M CharLM: hybrid_sv vs matched sliding vs softmax.

One process measures all three, interleaved round by round (so load from other
processes on a shared machine hits them alike): a full training step (forward,
backward, clipping, AdamW) on random bytes, ``--batch`` × ``--block`` tokens.
Reports the median tokens/s per mixer and the ratios to softmax, and appends
the runs to ``results/lm.json``.

    python benchmarks/bench_lm_throughput.py [--rounds 3] [--steps 3] [--threads 2] [--rope]

``--rope`` gives every model rotary positions (``CharLMConfig.rope``; the
hybrid's local path only); its records get ids ``throughput/rope/<mixer>``.

``--lookback K`` also times our look-back variant of the hybrid (the local path
sees the K keys before its chunk; the SV budget drops by K so the state stays
that of the W = 128 window), as a fourth model in the same rounds; its record
has ``"variant": "lookbackK"``.

``--device cuda`` runs the models there (peak device memory per model is recorded);
``--out PATH`` writes the records to another JSON list than ``results/lm.json``.

``--collect RUN_DIR ...`` instead appends finished ``svattn train`` runs (their
``log.jsonl`` "final" records) to ``results/lm.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import sys
import time
from pathlib import Path

import torch

from svattn.lm import CharLM, mixer_config, preset
from svattn.lm.configs import HYBRID_DEFAULTS
from svattn.lm.model import positions_of

RESULTS = Path(__file__).resolve().parent.parent / "results" / "lm.json"
MIXERS = ("softmax", "sliding", "hybrid_sv")


def append_results(records: list[dict], path: Path = RESULTS) -> None:
    """Add records to the JSON list in ``path``, replacing ones with the same ``id``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    old = json.loads(path.read_text()) if path.exists() else []
    ids = {r["id"] for r in records}
    path.write_text(json.dumps([r for r in old if r.get("id") not in ids] + records, indent=2))


def step_fn(model: CharLM, opt: torch.optim.Optimizer, x: torch.Tensor):
    _, loss = model(x[:, :-1], targets=x[:, 1:])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()


def _models(args: argparse.Namespace) -> dict[str, tuple[str, dict | None]]:
    """Timed models: name -> (mixer, hybrid options or None for the defaults)."""
    out: dict[str, tuple[str, dict | None]] = {m: (m, None) for m in MIXERS}
    if args.lookback:
        budget = HYBRID_DEFAULTS["budget"] - args.lookback
        if budget < 1:
            raise SystemExit(f"--lookback must be below the budget "
                             f"{HYBRID_DEFAULTS['budget']}, got {args.lookback}")
        out[f"hybrid_sv+lookback{args.lookback}"] = (
            "hybrid_sv", {"budget": budget, "lookback": args.lookback})
    return out


def bench(args: argparse.Namespace) -> list[dict]:
    torch.manual_seed(args.seed)
    models = {}
    specs = _models(args)
    for name, (mixer, hybrid) in specs.items():
        cfg = preset("paper-3m", block_size=args.block, rope=args.rope)
        model = CharLM(mixer_config(cfg, mixer, hybrid)).to(args.device)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        models[name] = (model, opt)
    g = torch.Generator().manual_seed(args.seed)
    x = torch.randint(0, 256, (args.batch, args.block + 1), generator=g).to(args.device)
    tokens = args.batch * args.block
    cuda = torch.device(args.device).type == "cuda"
    peak: dict[str, float | None] = {}
    for name, (model, opt) in models.items():  # warm-up, and the peak memory of one step
        if cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
        step_fn(model, opt, x)
        peak[name] = torch.cuda.max_memory_allocated() / 2**20 if cuda else None
    rates: dict[str, list[float]] = {n: [] for n in models}
    for r in range(args.rounds):
        for name, (model, opt) in models.items():
            if cuda:
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.steps):
                step_fn(model, opt, x)
            if cuda:
                torch.cuda.synchronize()
            rates[name].append(tokens * args.steps / (time.perf_counter() - t0))
            print(f"round {r}: {name:10s} {rates[name][-1]:9.0f} tokens/s", flush=True)
    med = {n: statistics.median(v) for n, v in rates.items()}
    cmd = "python benchmarks/bench_lm_throughput.py " + shlex.join(sys.argv[1:])
    records = []
    for name, (mixer, hybrid) in specs.items():
        model = models[name][0]
        variant = {"variant": f"lookback{args.lookback}"} if hybrid else {}
        rec = {
            "id": f"throughput/rope/{name}" if args.rope else f"throughput/{name}",
            "kind": "throughput",
            "mixer": mixer,
            **variant,
            "mixer_options": model.cfg.mixer_options,
            "positions": positions_of(model.cfg),
            "params": model.num_params(),
            "tokens_seen": None,
            "val_bpc": None,
            "test_bpc": None,
            "train_tokens_per_s": round(med[name], 1),
            "tokens_per_s_rounds": [round(v, 1) for v in rates[name]],
            "slowdown_vs_softmax": round(med["softmax"] / med[name], 2),
            "batch": args.batch,
            "block_size": args.block,
            "threads": torch.get_num_threads(),
            "seed": args.seed,
            "data": "random bytes (throughput only)",
            "machine": (torch.cuda.get_device_name() if cuda else
                        f"{platform.machine()} CPU, {torch.get_num_threads()} threads, shared"),
            "device": str(args.device),
            "peak_mib": peak[name],
            "torch": torch.__version__,
            "command": cmd,
        }
        records.append(rec)
        print(
            f"{name:10s} params {rec['params']:,}  {med[name]:9.0f} tokens/s  "
            f"{rec['slowdown_vs_softmax']:.2f}x slower than softmax"
        )
    return records


def collect(run_dirs: list[str], command: str | None) -> list[dict]:
    records = []
    for d in run_dirs:
        lines = (Path(d) / "log.jsonl").read_text().splitlines()
        recs = [json.loads(x) for x in lines]
        cfg = [r for r in recs if r["kind"] == "config"][-1]
        final = [r for r in recs if r["kind"] == "final"][-1]
        step = recs[-1]["step"]
        evals = {r["split"]: r for r in recs if r["kind"] == "eval" and r["step"] == step}
        c = cfg["config"]
        opts = cfg["model_config"]["mixer_options"]
        # our variants of the paper's layer are named, so reports never pair them as the paper's
        variant = {"variant": f"lookback{opts['lookback']}"} if opts.get("lookback") else {}
        records.append(
            {
                "id": f"bpc/{Path(d).name}",
                "kind": "bpc",
                "mixer": c["mixer"],
                **variant,
                "mixer_options": opts,
                "positions": positions_of(cfg["model_config"]),
                "params": final["params"],
                "tokens_seen": final["tokens_seen"],
                "steps": final["step"],
                "val_bpc": final["val_bpc"],
                "test_bpc": final["test_bpc"],
                "eval_bytes": {s: e["bytes"] for s, e in evals.items()},
                "eval_every_byte": not any(e.get("partial") for e in evals.values()),
                "eval_context": cfg["model_config"]["block_size"],
                "train_tokens_per_s": round(final["train_tokens_per_s"], 1),
                "seed": c["seed"],
                "data": final["data"],
                "command": command or f"svattn train <config> --set out_dir={d}",
            }
        )
    return records


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=3, help="timed steps per mixer per round")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--block", type=int, default=256)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rope", action="store_true", help="rotary positions in every model")
    ap.add_argument("--lookback", type=int, default=0,
                    help="also time the hybrid with this local look-back (our variant)")
    ap.add_argument("--device", default="cpu", help="torch device of the models (cpu, cuda)")
    ap.add_argument("--out", type=Path, default=RESULTS, help="JSON list to append records to")
    ap.add_argument("--no-write", action="store_true", help="do not touch results/lm.json")
    ap.add_argument("--collect", nargs="+", metavar="RUN_DIR", default=None)
    ap.add_argument("--command", default=None, help="with --collect: the command to record")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    records = collect(args.collect, args.command) if args.collect else bench(args)
    if not args.no_write:
        append_results(records, args.out)
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
