"""``scripts/gpu_check.sh --dry-run``: every step of the GPU check, tiny and on cpu.

The full dry run (four steps, ~20 CPU-seconds) runs under ``-m slow``. The default suite
(issue #37) checks the script's syntax, its usage error, the commands its dry run issues
(recorded by a stand-in interpreter that runs nothing) and replays one of them, the
layer benchmark, with the real interpreter. Step 1's tests (``test_nn_device.py``,
``test_nn_sync.py`` on cpu) are themselves in the default suite.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import svattn

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu_check.sh"

# stands in for $PYTHON: writes its arguments (and the test device) to a numbered file
# in $RECORD, reads the here-document it is given, and succeeds
_RECORDER = r"""#!/usr/bin/env bash
n=$(ls "$RECORD" | wc -l)
printf '%s\0' "SVATTN_TEST_DEVICE=${SVATTN_TEST_DEVICE-}" "$@" > "$RECORD/$(printf %03d "$n")"
cat > /dev/null
"""


def _env(python: str) -> dict[str, str]:
    src = str(Path(svattn.__file__).resolve().parents[1])  # this checkout's svattn
    return {**os.environ, "PYTHON": python,
            "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}


def _check_layers(out: Path) -> None:
    layers = json.loads((out / "bench_layers.json").read_text())
    assert "bench_layers.py" in layers["command"]
    assert {(r["dtype"], r["what"]) for r in layers["rows"]} == {
        (d, w) for d in ("fp32", "bf16") for w in ("op", "layer")}


def test_gpu_check_script_parses_and_refuses_an_unknown_option():
    subprocess.run(["bash", "-n", str(SCRIPT)], check=True, timeout=30)
    r = subprocess.run(["bash", str(SCRIPT), "--dry-rnu"], env=_env(sys.executable), cwd=ROOT,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 2
    assert r.stderr.startswith("usage: ") and "[--dry-run] [--out DIR]" in r.stderr


@pytest.mark.slow  # runs the script's layer step; the usage test above stays default
def test_gpu_check_dry_run_commands_and_its_layer_step(tmp_path):
    record, out = tmp_path / "calls", tmp_path / "out"
    record.mkdir()
    recorder = tmp_path / "python"
    recorder.write_text(_RECORDER)
    recorder.chmod(0o755)
    r = subprocess.run(["bash", str(SCRIPT), "--dry-run", "--out", str(out)],
                       env={**_env(str(recorder)), "RECORD": str(record)}, cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    calls = [p.read_text().split("\0")[:-1] for p in sorted(record.iterdir())]
    # step 1: the device tests on cpu; its record; steps 2 and 3 on cpu; the summary
    assert [c[1:3] for c in calls] == [["-m", "pytest"], ["-", str(out)],
                                       ["benchmarks/bench_layers.py", "--device"],
                                       ["benchmarks/bench_lm_throughput.py", "--device"],
                                       ["-", str(out)]]
    assert calls[0][0] == "SVATTN_TEST_DEVICE=cpu"
    assert {"tests/nn/test_nn_device.py", "tests/nn/test_nn_sync.py"} <= set(calls[0])
    assert calls[2][3] == calls[3][3] == "cpu"
    assert calls[4][3] == "1"  # the summary is told it is a dry run
    # step 2 as the script issues it, with the real interpreter
    subprocess.run([sys.executable, *calls[2][1:]], check=True, env=_env(sys.executable),
                   cwd=ROOT, capture_output=True, timeout=300)
    _check_layers(out)


@pytest.mark.slow
def test_gpu_check_dry_run(tmp_path):
    subprocess.run(["bash", str(SCRIPT), "--dry-run", "--out", str(tmp_path)], check=True,
                   env=_env(sys.executable), cwd=ROOT, capture_output=True, timeout=300)
    tests = json.loads((tmp_path / "nn_tests.json").read_text())
    assert tests["tests"] > 0 and tests["failures"] == tests["errors"] == 0
    _check_layers(tmp_path)
    lm = json.loads((tmp_path / "lm_throughput.json").read_text())
    assert {r["mixer"] for r in lm} == {"softmax", "sliding", "hybrid_sv"}
    summary = (tmp_path / "SUMMARY.md").read_text()
    assert "dry run" in summary and "9125" in summary
