"""``scripts/gpu_check.sh --dry-run``: every step of the GPU check, tiny and on cpu."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import svattn

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_check_dry_run(tmp_path):
    src = str(Path(svattn.__file__).resolve().parents[1])  # this checkout's svattn
    env = {**os.environ, "PYTHON": sys.executable,
           "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), "--dry-run", "--out",
                    str(tmp_path)], check=True, env=env, cwd=ROOT, capture_output=True,
                   timeout=300)
    tests = json.loads((tmp_path / "nn_tests.json").read_text())
    assert tests["tests"] > 0 and tests["failures"] == tests["errors"] == 0
    layers = json.loads((tmp_path / "bench_layers.json").read_text())
    assert "bench_layers.py" in layers["command"]
    assert {(r["dtype"], r["what"]) for r in layers["rows"]} == {
        (d, w) for d in ("fp32", "bf16") for w in ("op", "layer")}
    lm = json.loads((tmp_path / "lm_throughput.json").read_text())
    assert {r["mixer"] for r in lm} == {"softmax", "sliding", "hybrid_sv"}
    summary = (tmp_path / "SUMMARY.md").read_text()
    assert "dry run" in summary and "9125" in summary
