"""Shared helpers of the svattn.lm tests."""

from __future__ import annotations

import json
from pathlib import Path

from svattn.lm.train import TrainConfig

TINY_HYBRID = {"chunk": 16, "C": 1.0 / 16, "budget": 16}


def tiny_config(out_dir: Path, mixer: str = "softmax", **kw) -> TrainConfig:
    """A tiny, fast run on the shipped slice (T = 32, 2 layers of width 32)."""
    base = dict(
        model="tiny", mixer=mixer, hybrid=dict(TINY_HYBRID),
        model_overrides={"block_size": 32}, out_dir=str(out_dir), steps=50, batch_size=8,
        lr=3e-3, min_lr=3e-4, warmup=5, log_every=1, final_eval=False, progress=False,
        threads=1,
    )  # fmt: skip
    base.update(kw)
    return TrainConfig.from_dict(base)


def read_log(out_dir: Path, kind: str | None = None) -> list[dict]:
    lines = (Path(out_dir) / "log.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines]
    return [r for r in recs if kind is None or r["kind"] == kind]
