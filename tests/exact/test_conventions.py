"""The warm-up convention (``svattn.exact.core.conventions``): the threshold ``n·C >= 1``
found in a few steps for every legitimate C, and a C so small that no memory could ever
reach its optimum refused — quickly, with the reason — by every entry point."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from svattn.cli import main
from svattn.exact import SVDDMemory
from svattn.exact.auditor.persist import load, save
from svattn.exact.core.conventions import is_feasible, warmup_threshold

TINY = [1e-300, 5e-324, 1e-17]  # 1/C beyond any memory (5e-324: 1/C overflows)


@pytest.mark.parametrize("C", [1.0, 0.5, 1 / 3, 0.2, 1 / 7, 1 / 49, 1e-3, 1 / 12345,
                               1e-9, 3e-16, 2.0])
def test_warmup_threshold_is_the_first_feasible_count(C):
    n = warmup_threshold(C)
    assert is_feasible(n, C)
    assert n == 1 or not is_feasible(n - 1, C)


@pytest.mark.timeout(10)
@pytest.mark.parametrize("C", TINY)
def test_a_box_below_any_memory_is_refused_with_the_least_legal_c(C):
    with pytest.raises(ValueError, match=r"too small.*C must be >= 1\.12e-16"):
        warmup_threshold(C)
    least = 1.12e-16  # what the message names is itself accepted
    assert warmup_threshold(least) <= 2**53


@pytest.mark.timeout(120)
@pytest.mark.parametrize("C", TINY)
def test_every_entry_point_refuses_a_box_too_small_for_any_memory(C):
    from svattn import SVDD
    from svattn.nn import SVAttention, sv_attention

    with pytest.raises(ValueError, match="too small"):
        SVDDMemory(C)
    with pytest.raises(ValueError, match="too small"):
        SVDD(C=C).fit(np.random.default_rng(0).normal(size=(5, 2)))
    q = torch.randn(1, 1, 4, 2, dtype=torch.float64)
    with pytest.raises(ValueError, match="too small"):
        sv_attention(q, q, q, C=C)
    with pytest.raises(ValueError, match="too small"):
        SVAttention(4, 1, C=C)


@pytest.mark.timeout(120)
def test_a_state_file_with_a_box_too_small_for_any_memory_is_refused(tmp_path):
    """A crafted state (metadata checksum recomputed; it is unkeyed) with C = 1e-300:
    load and verify-deletion refuse it as malformed instead of hanging."""
    from safetensors.numpy import safe_open

    from svattn.exact.records.fileformat import serialize

    mem = SVDDMemory(C=0.2)
    ids = mem.extend(np.random.default_rng(1).normal(size=(20, 3)))
    cert = mem.remove(ids[3])
    save(mem, tmp_path / "m.svdd")
    with safe_open(str(tmp_path / "m.svdd"), "numpy") as fh:
        meta = json.loads(fh.metadata()["svattn"])
        tensors = {k: fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118
    meta["C"] = 1e-300
    (tmp_path / "x.svdd").write_bytes(serialize(tensors, meta))
    with pytest.raises(ValueError, match="too small"):
        load(tmp_path / "x.svdd")
    (tmp_path / "cert.json").write_text(cert.to_json())
    assert main(["verify-deletion", str(tmp_path / "x.svdd"), str(tmp_path / "cert.json")]) == 2
    d = json.loads(cert.to_json())
    d["C"] = 1e-300
    (tmp_path / "tiny.json").write_text(json.dumps(d))
    assert main(["verify-deletion", str(tmp_path / "m.svdd"), str(tmp_path / "tiny.json")]) != 0
    assert math.isfinite(mem.C)
