"""SolverOptions: today's defaults, one value through every layer, the keyword shorthands."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from nn_keys import random_keys

import svattn
from svattn.nn import SolverOptions, SVAttention, sv_attention, sv_attention_state
from svattn.nn.options import RIDGE_STEPS, resolve_solver


def test_defaults_and_frozen():
    opts = SolverOptions()
    assert (opts.ridge, opts.ridge_steps, opts.max_iter, opts.refine, opts.finish) == (
        1e-3, RIDGE_STEPS, 20, 10, "optimum")
    assert RIDGE_STEPS == 1
    with pytest.raises(dataclasses.FrozenInstanceError):
        opts.ridge = 0.0  # type: ignore[misc]


def test_solver_equals_keywords():
    """``solver=SolverOptions(...)`` and the keyword shorthands run the same solve."""
    k = random_keys(2, 2, 24, 4, seed=0)
    q, v = random_keys(2, 2, 5, 4, seed=1), random_keys(2, 2, 24, 3, seed=2)
    fields = dict(ridge=0.0, ridge_steps=0, max_iter=300, refine=3)
    o1, a1, p1, i1 = sv_attention_state(q, k, v, C=0.2, solver=SolverOptions(**fields))
    o2, a2, p2, i2 = sv_attention_state(q, k, v, C=0.2, **fields)
    assert torch.equal(o1, o2) and torch.equal(a1, a2) and i1 == i2
    assert all(torch.equal(s1, s2) for s1, s2 in zip(p1, p2, strict=True))
    o3 = sv_attention(q, k, v, C=0.2, solver=SolverOptions(ridge=0.0), max_iter=300,
                      ridge_steps=0, refine=3)
    assert torch.equal(o1, o3)


def test_resolve_solver():
    base = SolverOptions(ridge=1e-2)
    assert resolve_solver(base) is base
    assert resolve_solver(None) == SolverOptions()
    assert resolve_solver(base, refine=0) == SolverOptions(ridge=1e-2, refine=0)
    with pytest.raises(ValueError, match="solver must be a SolverOptions or None"):
        resolve_solver({"ridge": 0.0})  # type: ignore[arg-type]


def test_layer_carries_solver_and_checks_ridge():
    layer = SVAttention(8, 2, C=0.5, solver=SolverOptions(refine=0))
    assert layer.solver == SolverOptions(refine=0)
    assert SVAttention(8, 2, C=0.5).solver == SolverOptions()
    with pytest.raises(ValueError, match="ridge must be a number >= 0"):
        SolverOptions(ridge=-1.0)


@pytest.mark.slow  # a fresh interpreter; lint-imports checks the same layering statically
def test_nn_does_not_import_mixers():
    """The import runs one way: svattn.mixers (the hybrid) imports svattn.nn."""
    code = (
        "import sys, svattn.nn; "
        "bad = [m for m in sys.modules if m.startswith('svattn.mixers')]; "
        "assert not bad, bad"
    )
    src = str(Path(svattn.__file__).resolve().parents[1])  # this checkout's svattn
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


@pytest.mark.parametrize("fields, match", [
    (dict(ridge=0.0, finish="approximate"), r"ridge must be > 0 with finish='approximate'"),
    (dict(ridge=float("nan")), "ridge must be a number >= 0"),
    (dict(finish="exact"), "finish must be one of"),
    (dict(max_iter=0), "max_iter must be an int >= 1"),
    (dict(max_iter=2.5), "max_iter must be an int >= 1"),
    (dict(refine=-1), "refine must be an int >= 0"),
    (dict(ridge_steps=True), "ridge_steps must be an int >= 0"),
])
def test_fields_are_checked_when_built(fields, match):
    with pytest.raises(ValueError, match=match):
        SolverOptions(**fields)
    with pytest.raises(ValueError, match=match):
        resolve_solver(None, **fields)


def test_ridge_zero_is_accepted_by_the_optimum_finish():
    assert SolverOptions(ridge=0.0).ridge == 0.0
