"""The language model's training runs: ``train`` a CharLM on enwik8, ``eval`` a
checkpoint (bits per character; a recall run's model: query accuracy on its task),
``convert-checkpoint`` from an earlier svattn, and ``collect`` finished runs into a
results file (each record with the command that made it).

The trained recall grids are :mod:`svattn.cli.recall`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from svattn.cli.inputs import check_file, positive_int

__all__ = ["collect_arguments", "collect_run", "convert_arguments", "convert_run",
           "eval_arguments", "eval_run", "train_arguments", "train_run"]


def train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config", type=Path, metavar="CONFIG",
        help="training config (JSON; keys of svattn.lm.train.TrainConfig, e.g. configs/*.json)",
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a config key (VALUE parsed as JSON, else taken as a string); "
        "repeatable. A dotted KEY sets one entry of a mapping (--set hybrid.C=0.1); a "
        "mapping VALUE merges into the config's mapping key by key (--set "
        "'hybrid={\"C\":0.1}' keeps chunk and budget); {} empties it",
    )
    parser.add_argument(
        "--data", default=None, metavar="PATH",
        help="the enwik8 file (raw or .zip) to train on; same as --set data=PATH",
    )
    parser.add_argument(
        "--resume", action="store_true",
        help="continue from OUT_DIR/ckpt.pt when it exists (without it, an OUT_DIR that "
        "holds a checkpoint is refused)",
    )
    parser.add_argument(
        "--stop-after", type=positive_int, default=None, metavar="STEP",
        help="checkpoint and stop at this step (as if interrupted; resume later)",
    )
    parser.add_argument(
        "--record", type=Path, default=None, metavar="FILE",
        help="when the run ends, append its record (BPC, the exact command, the effective "
        "config) to this JSON list, e.g. results/lm.json",
    )


def _read_config(path: Path) -> dict:
    import json

    check_file(path, "CONFIG")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"CONFIG: {path} is not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"CONFIG: {path} holds a JSON {type(raw).__name__}; a training "
                         "config is a JSON object of TrainConfig keys")
    return raw


def train_run(args: argparse.Namespace) -> int:
    import json
    import os

    from svattn.experiments.runner import command_line
    from svattn.lm.records import append_records, read_records, run_record
    from svattn.lm.train import check_run, train
    from svattn.lm.train_config import TrainConfig, apply_overrides

    if args.record is not None:
        read_records(args.record)  # a bad results file fails now, not after training
    raw = _read_config(args.config)
    items = list(args.overrides) + ([f"data={json.dumps(args.data)}"] if args.data else [])
    cfg = TrainConfig.from_dict(apply_overrides(raw, items))
    check_run(cfg, resume=args.resume)  # bad input refused before the config is printed
    command = command_line(args._argv)
    rank0 = int(os.environ.get("RANK", "0")) == 0
    if rank0:
        print(f"config ({args.config} with {len(items)} override{'s' if len(items) != 1 else ''}"
              f"): {json.dumps(cfg.to_dict())}", flush=True)
    res = train(cfg, resume=args.resume, stop_after=args.stop_after,
                command=command)
    if rank0:
        print(
            f"{cfg.mixer}: {res.params:,} params, {res.tokens_seen:,} tokens "
            f"({res.train_tokens_per_s:,.0f} tokens/s) on {res.data}, final loss "
            f"{res.final_loss:.4f}; {res.describe_eval()}; checkpoint {res.checkpoint}; "
            f"effective config {Path(cfg.out_dir) / 'config.json'}"
        )
        if args.record is not None and res.steps < cfg.steps:
            print(f"not recorded in {args.record}: stopped at step {res.steps} of {cfg.steps} "
                  "(--resume finishes it; --record then records it)")
        elif args.record is not None:
            rec = run_record(cfg.out_dir)
            replaced = append_records([rec], args.record)
            print(f"{'replaced' if replaced else 'appended'} record {rec['id']} in {args.record}")
    return 0


def eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, metavar="CHECKPOINT",
                        help="a ckpt.pt of svattn train (BPC on enwik8), or a recall run's "
                             "ckpt.pt / model.pt (query accuracy on its own task)")
    parser.add_argument(
        "--data", type=Path, default=None, metavar="PATH",
        help="enwik8 file (raw or .zip; default: the run's data)",
    )
    parser.add_argument(
        "--split", nargs="+", default=None, choices=["train", "val", "test"],
        help="the splits to score (default: val test; a recall run's model: test)",
    )
    parser.add_argument(
        "--context", type=positive_int, default=None,
        help="context length (default: the model's block_size)",
    )
    parser.add_argument("--batch-size", type=positive_int, default=32,
                        help="sequences per evaluation batch (default 32)")
    parser.add_argument(
        "--max-bytes", type=positive_int, default=None,
        help="score only the first N bytes of each split (default: every byte; a recall "
        "run's model: its first N // context contexts, at least one)",
    )
    parser.add_argument(
        "--record", type=Path, default=None, metavar="FILE",
        help="append one 'eval' record per split (BPC, the exact command) to this JSON list, "
        "e.g. results/lm.json",
    )


def eval_run(args: argparse.Namespace) -> int:
    import json

    from svattn.experiments.runner import command_line
    from svattn.lm.bpc import evaluate_bpc
    from svattn.lm.load import load_checkpoint_for_eval, load_checkpoint_model
    from svattn.lm.records import append_records, eval_record

    check_file(args.checkpoint, "CHECKPOINT")
    if args.data is not None:
        check_file(args.data, "--data")
    model, cfg, ckpt = load_checkpoint_model(args.checkpoint)
    if cfg is None:  # a recall run's model: its own task
        return _eval_recall(args, model, ckpt)
    model, _, ckpt, ds = load_checkpoint_for_eval(args.checkpoint, args.data)
    context = args.context or model.cfg.block_size
    records = []
    for split in args.split or ["val", "test"]:
        lo, hi = ds.span(split, args.max_bytes)
        res = evaluate_bpc(model, ds.data, lo, hi, context=context, batch_size=args.batch_size)
        rec = {"split": split, "data": ds.label, "step": ckpt["step"], **res}
        print(json.dumps(rec))
        records.append(eval_record(args.checkpoint, rec, command=command_line(args._argv)))
    if args.record is not None:
        replaced = append_records(records, args.record)
        print(f"wrote {len(records)} eval record{'s' if len(records) != 1 else ''} to "
              f"{args.record}{f' (replacing {replaced})' if replaced else ''}")
    return 0


def _eval_recall(args: argparse.Namespace, model, ckpt: dict) -> int:
    """``svattn eval`` of a recall run's model: query accuracy on its own task."""
    import json

    from svattn.lm.recall import evaluate_recall

    for given, flag in ((args.data, "--data"), (args.context, "--context"),
                        (args.record, "--record")):
        if given is not None:
            raise ValueError(f"{flag}: {args.checkpoint} is a recall run's model, scored on "
                             f"its own task ({ckpt['run'].get('task')}); {flag} applies to "
                             "enwik8 checkpoints of svattn train (recall results are "
                             "collected by svattn recall collect)")
    seq = int(ckpt["model_config"]["block_size"])
    limit = None if args.max_bytes is None else max(1, args.max_bytes // seq)
    for split in args.split or ["test"]:
        print(json.dumps(evaluate_recall(model, ckpt, split=split, max_contexts=limit)))
    return 0


def convert_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("old", type=Path, metavar="OLD",
                        help="a checkpoint of an earlier svattn (UNPICKLED: only one you trust)")
    parser.add_argument("new", type=Path, metavar="NEW",
                        help="where to write the converted checkpoint (must not exist)")


def convert_run(args: argparse.Namespace) -> int:
    from svattn.lm.checkpoint import convert_checkpoint

    convert_checkpoint(args.old, args.new, warn=lambda message: print(
        f"svattn convert-checkpoint: warning: {message}", file=sys.stderr, flush=True))
    print(f"wrote {args.new}: it reads without unpickling objects (svattn generate, "
          "verify-forget, eval, train --resume)")
    return 0


def collect_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", type=Path, nargs="+", metavar="RUN_DIR",
                        help="out_dir of finished svattn train runs")
    parser.add_argument("--into", type=Path, required=True, metavar="FILE",
                        help="the JSON list of records to append to, e.g. results/lm.json")


def collect_run(args: argparse.Namespace) -> int:
    from svattn.lm.records import append_records, run_record

    for run in args.runs:
        if not run.is_dir():
            raise FileNotFoundError(f"RUN_DIR: no such folder: {run}")
    records = [run_record(run) for run in args.runs]  # all checked before any is written
    replaced = set(append_records(records, args.into))
    for rec in records:
        print(f"{'replaced' if rec['id'] in replaced else 'appended'} {rec['id']} "
              f"(command: {rec['command']})")
    print(f"wrote {args.into}")
    return 0
