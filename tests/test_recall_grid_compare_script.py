"""benchmarks/recall_grid_compare.py: cells matched by id, paired differences over the
common seeds only, Wilson intervals over the scored positions, cells in one grid listed."""

from __future__ import annotations

import pytest

from script_helpers import load_script
from svattn.lm.recall import RecallRun

cmp = load_script("benchmarks/recall_grid_compare.py")


def _record(seed: int, acc: float, C: float = 0.125) -> dict:
    run = RecallRun(task="selective-copy", seq_len=32, seed=seed, steps=1, batch_size=4,
                    num_train=8, num_test=10, hybrid={"chunk": 8, "C": C, "budget": 8},
                    task_options={"num_data": 4, "num_symbols": 4})
    return {"id": run.run_id, "run": run.to_dict(), "accuracy": acc, "memory": [],
            "solver": "SolverOptions(finish='optimum')"}


def test_cells_are_paired_by_id_over_the_common_seeds():
    old = {"records": [_record(0, 0.5), _record(1, 0.75), _record(2, 1.0)]}
    new = {"records": [_record(0, 0.75), _record(1, 0.75), _record(0, 0.25, C=0.25)]}
    got = cmp.compare(old, new, {}, {}, {})
    box = {b["C"]: b for b in got["boxes"]}
    eighth = box[0.125]
    assert eighth["seeds"] == [0, 1]
    assert eighth["new_minus_old_paired"]["values"] == pytest.approx([0.25, 0.0])
    assert eighth["old_same_seeds"]["mean"] == pytest.approx(0.625)
    assert eighth["old_all_seeds"]["mean"] == pytest.approx(0.75)  # seed 2 too
    row = eighth["rows"][0]
    assert row["new"]["scored"] == 40  # 10 test sequences of 4 data tokens
    lo, hi = row["new"]["wilson95"]
    assert lo < 0.75 < hi
    assert "old" not in box[0.25]["rows"][0] and box[0.25]["new_minus_old_paired"] is None
    assert got["only_new"] == [_record(0, 0, C=0.25)["id"]]
    assert got["only_old"] == [_record(2, 0)["id"]]


def test_wilson_is_refused_without_trials_and_stays_in_the_unit_interval():
    with pytest.raises(ValueError, match="n must be >= 1"):
        cmp.wilson(0, 0)
    assert cmp.wilson(0, 10)[0] == pytest.approx(0.0, abs=1e-12)
    assert cmp.wilson(10, 10)[1] == pytest.approx(1.0)


def test_cells_still_training_are_read_beside_the_old_curve(tmp_path):
    import json

    import torch

    old_rec = {**_record(0, 0.9), "loss_curve": [[200, 1.6], [400, 1.1]]}
    for name, hybrid in (("new", {}), ("control", {"finish": "approximate"})):
        cell = tmp_path / name / old_rec["id"]
        cell.mkdir(parents=True)
        torch.save({"run": {"hybrid": hybrid}}, cell / "ckpt.pt")
        (cell / "log.jsonl").write_text("".join(json.dumps(
            {"step": s, "loss": loss, "accuracy": 0.3, "train_seconds": s}) + "\n"
            for s, loss in ((200, 1.5), (400, 1.4), (400, 1.45))))  # 400 again: resumed
    got = cmp.progress({"records": [old_rec]}, tmp_path / "new", set())
    (cell,) = got
    assert cell["finish"] == "optimum" and cell["steps_done"] == 400
    assert [(r["step"], r["loss"], r["old_loss"]) for r in cell["curve"]] == [
        (200, 1.5, 1.6), (400, 1.45, 1.1)]
    assert cmp.progress({"records": [old_rec]}, tmp_path / "control", set())[0][
        "finish"] == "approximate"
    assert cmp.progress({"records": [old_rec]}, tmp_path / "new", {old_rec["id"]}) == []
