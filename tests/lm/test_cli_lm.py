"""``svattn train`` and ``svattn eval`` end to end on the shipped slice."""

from __future__ import annotations

import json

from lm_helpers import tiny_config

from svattn.cli import main


def test_train_then_eval(tmp_path, capsys):
    cfg = tiny_config(tmp_path / "run", "hybrid_sv", steps=3, final_eval=True, eval_max_bytes=200)
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg.to_dict()))
    assert main(["train", str(path), "--set", "steps=4", "--set", "seed=3"]) == 0
    out = capsys.readouterr().out
    assert "hybrid_sv:" in out and "on enwik8 prefix" in out
    ckpt = tmp_path / "run" / "ckpt.pt"
    assert main(["eval", str(ckpt), "--split", "val", "--max-bytes", "100"]) == 0
    rec = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rec["split"] == "val" and rec["bytes"] == 100 and rec["step"] == 4
    assert rec["data"] == "enwik8 prefix" and 4.0 < rec["bpc"] < 9.0


def test_usage_errors(tmp_path, capsys):
    assert main(["train", str(tmp_path / "missing.json")]) == 2
    assert "CONFIG: no such file" in capsys.readouterr().err
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps({"model": "tiny", "stepz": 3}))
    assert main(["train", str(path)]) == 2
    assert "unknown training config keys ['stepz']" in capsys.readouterr().err
    assert main(["eval", str(tmp_path / "nope.pt")]) == 2
