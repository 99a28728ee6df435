"""The set-up's second compiling step (python -m svattn.mixers.compile_kernels): the
batched training solver's kernels, so that a first training step compiles nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from svattn.exact.core.compiling import MESSAGE
from svattn.mixers import compile_kernels

SRC = str(Path(__file__).resolve().parents[2] / "src")
# a training step of a small hybrid language model, the default solver, float32
STEP = ("import torch\n"
        "from svattn.mixers.hybrid import HybridSVAttention\n"
        "layer = HybridSVAttention(16, 2, chunk=8, C=0.125, policy='support')\n"
        "x = torch.randn(4, 32, 16, requires_grad=True)\n"
        "layer(x).pow(2).mean().backward()\n")


def test_compile_kernels_runs_and_says_so(capsys):
    assert compile_kernels.main() == 0
    assert "compiled kernels are ready" in capsys.readouterr().out


@pytest.mark.slow  # ~60 s: compiles the batched solver's kernels into an empty cache
def test_after_the_set_up_a_training_step_compiles_nothing(tmp_path):
    env = dict(os.environ, PYTHONPATH=SRC, NUMBA_CACHE_DIR=str(tmp_path))
    run = [sys.executable, "-c", STEP]
    first = subprocess.run(run, env=env, check=True, capture_output=True, text=True,
                           timeout=600).stderr
    assert MESSAGE in first  # an empty cache: the step compiles (the test can fail)
    fresh = tmp_path / "fresh"
    env["NUMBA_CACHE_DIR"] = str(fresh)
    subprocess.run([sys.executable, "-m", "svattn.mixers.compile_kernels"], env=env,
                   check=True, capture_output=True, timeout=600)
    after = subprocess.run(run, env=env, check=True, capture_output=True, text=True,
                           timeout=600).stderr
    assert MESSAGE not in after
