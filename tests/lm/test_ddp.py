"""DDP under real ``torchrun``: 2 CPU processes (gloo) equal one process with the whole batch."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from lm_helpers import tiny_config


def test_two_processes_equal_one_with_the_doubled_batch(tmp_path):
    steps, batch = 4, 8  # global batch 8: 4 rows per rank under torchrun
    # No biases: the key bias has a zero gradient in exact arithmetic (softmax is
    # shift-invariant), so its gradient is rounding noise that Adam would scale up
    # to a full step, differently for different reduction orders. Float64: in
    # float32 the two reduction orders of a gradient with cancellation differ by
    # ~4e-6 relative on some CPUs (seen: one weight of 4096 off by 2.2e-6 after 4
    # Adam steps), which is rounding, not a DDP bug; in float64 the gap is 1e-15.
    cfg = tiny_config(
        tmp_path / "single", "softmax", steps=steps, batch_size=batch, warmup=2,
        model_overrides={"block_size": 32, "bias": False}, precision="fp64",
        final_eval=True, eval_max_bytes=3000, eval_batch_size=8,  # sharded eval, all-reduced
    )  # fmt: skip
    cfg_path = tmp_path / "cfg.json"
    cfg_path.write_text(json.dumps({**cfg.to_dict(), "out_dir": str(tmp_path / "ddp")}))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        "-m", "svattn.cli", "train", str(cfg_path),
    ]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    log = [json.loads(x) for x in (tmp_path / "ddp" / "log.jsonl").read_text().splitlines()]
    assert log[0]["kind"] == "config" and log[0]["world"] == 2

    from svattn.lm.train import train

    res = train(cfg)  # one process, the whole global batch of 8
    a = torch.load(tmp_path / "ddp" / "ckpt.pt", weights_only=False)
    b = torch.load(tmp_path / "single" / "ckpt.pt", weights_only=False)
    assert a["step"] == b["step"] == steps and a["tokens_seen"] == b["tokens_seen"]
    for k in b["model"]:
        assert a["model"][k].dtype == torch.float64, k
        torch.testing.assert_close(a["model"][k], b["model"][k], rtol=1e-10, atol=1e-12, msg=k)
    final = [r for r in log if r["kind"] == "final"][-1]
    assert final["val_bpc"] == pytest.approx(res.val_bpc, rel=1e-10)
    assert final["test_bpc"] == pytest.approx(res.test_bpc, rel=1e-10)
