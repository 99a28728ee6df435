"""Files of the previous format load, and a loaded memory continues bit-identically.

``tests/exact/data/v2.safetensors`` was written by the last svattn that wrote
format 2 (``scripts/make_state_fixture.py``, command and commit in ``v2.json``),
together with the digests of a fixed continuation run by that code.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

import pytest

from svattn.exact import SVDDMemory
from svattn.exact.state import SCHEMA_VERSION

DATA = Path(__file__).parent / "data"
sys.path.insert(0, str(Path(__file__).parents[2] / "scripts"))
from make_state_fixture import build_memory, continue_memory  # noqa: E402


@pytest.fixture
def v2(tmp_path):
    record = json.loads((DATA / "v2.json").read_text())
    assert record["format_version"] == 2
    path = tmp_path / "v2.safetensors"
    shutil.copyfile(DATA / "v2.safetensors", path)
    return path, record


@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_a_format_2_file_loads_and_continues_as_the_code_that_wrote_it(v2, backend):
    path, record = v2
    mem = SVDDMemory.load(path)
    assert mem.state_digest() == record["saved_digest"]
    if backend == "reference":  # the same state on the numpy backend: equal to rounding
        mem = mem.copy(backend="reference")
        steps = continue_memory(mem)
        assert len(steps) == len(record["continuation"]) and mem.kkt_residual() <= 1e-10
        return
    assert continue_memory(mem) == record["continuation"]


def test_todays_code_builds_the_fixture_bit_identically(v2, tmp_path):
    _, record = v2
    mem = build_memory()
    assert mem.state_digest() == record["saved_digest"]
    assert continue_memory(mem) == record["continuation"]


def test_a_loaded_v2_memory_saves_as_the_current_format_and_round_trips(v2, tmp_path):
    path, record = v2
    mem = SVDDMemory.load(path)
    again = tmp_path / "v3.safetensors"
    mem.save(again)
    meta = json.loads(json.loads(again.read_bytes()[8 : 8 + int.from_bytes(
        again.read_bytes()[:8], "little")])["__metadata__"]["svattn"])
    assert meta["format_version"] == SCHEMA_VERSION and "scalars" not in meta and "solver" in meta
    back = SVDDMemory.load(again)
    assert back.state_digest() == mem.state_digest()
    assert continue_memory(back) == record["continuation"]
    assert hashlib.sha256(back.alpha.tobytes()).hexdigest() == \
        record["continuation"][-1]["alpha_sha256"]


def test_a_format_2_file_with_a_per_operation_residual_loads(v2, tmp_path):
    """Format 2 saved every scalar attribute, so a file written right after an add that
    drove a token carried the removal-only ``_kkt_after`` (a float), which that code
    itself then refused to load ("mistyped solver attribute"). It is not state: ignored."""
    from safetensors.numpy import load as st_load

    from svattn.exact.fileformat import serialize

    path, record = v2
    data = path.read_bytes()
    hlen = int.from_bytes(data[:8], "little")
    meta = json.loads(json.loads(data[8 : 8 + hlen])["__metadata__"]["svattn"])
    meta["scalars"]["_kkt_after"] = 3.5e-17
    forged = tmp_path / "v2_kkt_after.safetensors"
    forged.write_bytes(serialize(st_load(data), meta))
    mem = SVDDMemory.load(forged)
    assert mem.state_digest() == record["saved_digest"]
    assert continue_memory(mem) == record["continuation"]
    meta["scalars"]["_no_such_attribute"] = 1  # anything else unknown is still refused
    forged.write_bytes(serialize(st_load(data), meta))
    with pytest.raises(ValueError, match="unknown or mistyped solver attribute"):
        SVDDMemory.load(forged)


def test_a_format_2_memory_does_not_know_its_compaction_history(v2):
    path, _ = v2
    mem = SVDDMemory.load(path)
    assert mem.solver_state.n_compacted == -1
    cert = mem.remove(mem.partition()["margin"][0])
    assert cert.compacted == -1  # unknown: the certificate does not claim "never compacted"
