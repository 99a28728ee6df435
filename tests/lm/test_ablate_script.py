"""``scripts/ablate_hybrid_gate.py`` on a tiny trained hybrid: gates, both BPCs, --append."""

from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
from lm_helpers import tiny_config

from svattn.cli import main

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts"


@pytest.fixture
def ablate(monkeypatch):
    monkeypatch.syspath_prepend(str(SCRIPTS))  # the script imports its sibling _eval_args
    script = importlib.import_module("ablate_hybrid_gate")

    def run(*args: str) -> None:
        assert script.main([*args, "--max-bytes", "200"]) == 0

    yield run
    sys.modules.pop("ablate_hybrid_gate", None)
    sys.modules.pop("_eval_args", None)


def test_ablation_records_and_append(tmp_path, ablate):
    ckpts = []
    for seed in (1, 2):
        cfg = tiny_config(tmp_path / f"run{seed}", "hybrid_sv", steps=2, seed=seed)
        path = tmp_path / f"cfg{seed}.json"
        path.write_text(json.dumps(cfg.to_dict()))
        assert main(["train", str(path)]) == 0
        ckpts.append(str(tmp_path / f"run{seed}" / "ckpt.pt"))
    out = tmp_path / "ablation.json"
    ablate(ckpts[0], "--out", str(out))
    (first,) = json.loads(out.read_text())
    assert first["checkpoint"] == ckpts[0] and first["step"] == 2 and first["seed"] == 1
    assert first["as_trained"]["bytes"] == first["global_off"]["bytes"] == 200
    assert len(first["gates"]) == 2  # the tiny model's two hybrid layers
    # forcing the gates shut changes the model's predictions
    assert first["global_off"]["bpc"] != first["as_trained"]["bpc"]
    # --append keeps the old record; measuring a checkpoint again replaces its record
    ablate(ckpts[1], "--out", str(out), "--append")
    assert [r["checkpoint"] for r in json.loads(out.read_text())] == ckpts
    ablate(ckpts[0], "--out", str(out), "--append")
    assert [r["checkpoint"] for r in json.loads(out.read_text())] == ckpts[::-1]
    ablate(ckpts[1], "--out", str(out))  # without --append the file is rewritten
    assert [r["checkpoint"] for r in json.loads(out.read_text())] == [ckpts[1]]
