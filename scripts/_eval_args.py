"""Command-line arguments shared by the scripts that evaluate trained checkpoints."""

from __future__ import annotations

import argparse
from pathlib import Path

import torch


def checkpoint_eval_parser(description: str, checkpoints_help: str,
                           out_default: str) -> argparse.ArgumentParser:
    """Checkpoints, the split to score (capped by ``--max-bytes``), batch size,
    torch threads and the output path."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("checkpoints", type=Path, nargs="+", help=checkpoints_help)
    p.add_argument("--split", default="val", choices=["train", "val", "test"])
    p.add_argument("--max-bytes", type=int, default=None, help="cap on the split (default: all)")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: default)")
    p.add_argument("--out", type=Path, default=Path(out_default))
    return p


def apply_threads(args: argparse.Namespace) -> None:
    """``--threads`` to torch (0 keeps torch's default)."""
    if args.threads:
        torch.set_num_threads(args.threads)
