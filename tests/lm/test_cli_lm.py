"""``svattn train`` and ``svattn eval`` end to end on the shipped slice."""

from __future__ import annotations

import json
import re

import pytest
from lm_helpers import tiny_config

from svattn.cli import main
from svattn.experiments.runner import THREAD_VARS


@pytest.fixture(autouse=True)
def _no_thread_variables(monkeypatch):
    """The recorded command starts with the thread variables that are set (so a rerun
    gets the same threads); the expected strings below are written without them."""
    for name in THREAD_VARS:
        monkeypatch.delenv(name, raising=False)


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


def _tiny_file(tmp_path, **kw):
    cfg = tiny_config(tmp_path / "run", "hybrid_sv", steps=2, **kw)
    path = tmp_path / "cfg.json"
    path.write_text(json.dumps(cfg.to_dict()))
    return path


def test_overrides_merge_and_the_effective_config_is_printed_and_saved(tmp_path, capsys):
    path = _tiny_file(tmp_path)
    argv = ["train", str(path), "--set", 'hybrid={"C": 0.125}', "--set", "hybrid.budget=8"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    saved = json.loads((tmp_path / "run" / "config.json").read_text())
    # chunk is kept from the file (it used to fall back to the default 64 = block size)
    assert saved["config"]["hybrid"] == {"chunk": 16, "C": 0.125, "budget": 8}
    assert saved["model_config"]["mixer_options"]["chunk"] == 16
    assert saved["command"] == "svattn " + " ".join(
        ["train", str(path), "--set", "'hybrid={\"C\": 0.125}'", "--set", "hybrid.budget=8"])
    printed = json.loads(out.splitlines()[0].split(": ", 1)[1])
    assert printed == saved["config"]
    assert "no final evaluation (final_eval is false" in out and "val BPC None" not in out
    # the same out_dir again, without --resume, is refused and ckpt.pt is untouched
    before = (tmp_path / "run" / "ckpt.pt").stat().st_mtime_ns
    assert main(argv) == 2
    assert "already holds a checkpoint" in capsys.readouterr().err
    assert (tmp_path / "run" / "ckpt.pt").stat().st_mtime_ns == before


def test_final_bpc_is_rounded_and_says_what_it_covers(tmp_path, capsys):
    path = _tiny_file(tmp_path, final_eval=True, eval_max_bytes=256)
    assert main(["train", str(path)]) == 0
    line = capsys.readouterr().out.splitlines()[-1]
    assert re.search(r"val BPC \d\.\d{3}, test BPC \d\.\d{3} \(first 256 bytes of each split",
                     line), line


def test_train_record_collect_and_eval_record(tmp_path, capsys):
    path = _tiny_file(tmp_path, final_eval=True, eval_max_bytes=128)
    results = tmp_path / "lm.json"
    assert main(["train", str(path), "--record", str(results)]) == 0
    (rec,) = json.loads(results.read_text())
    assert rec["id"] == "bpc/run" and rec["kind"] == "bpc"
    assert rec["command"] == f"svattn train {path} --record {results}"
    assert rec["config"]["hybrid"]["chunk"] == 16 and rec["eval_bytes"] == {"val": 128, "test": 128}
    assert rec["eval_every_byte"] is False and isinstance(rec["val_bpc"], float)
    # collect re-derives the same record from the run's log, and replaces it by id
    assert main(["collect", str(tmp_path / "run"), "--into", str(results)]) == 0
    assert json.loads(results.read_text()) == [rec]
    ckpt = tmp_path / "run" / "ckpt.pt"
    assert main(["eval", str(ckpt), "--split", "val", "--max-bytes", "64",
                 "--record", str(results)]) == 0
    records = json.loads(results.read_text())
    assert [r["id"] for r in records] == ["bpc/run", "eval/run/val/T32"]
    assert records[1]["eval_bpc"] > 0 and "bpc" not in records[1]  # reports do not count it
    assert records[1]["command"].startswith(f"svattn eval {ckpt} --split val")
    capsys.readouterr()
    results.write_text("{}")
    assert main(["collect", str(tmp_path / "run"), "--into", str(results)]) == 2
    assert "not the list of records" in capsys.readouterr().err


def test_collect_refuses_a_run_without_its_command(tmp_path, capsys):
    from svattn.lm.train import train

    train(tiny_config(tmp_path / "run", steps=1))  # the library call records no command
    assert main(["collect", str(tmp_path / "run"), "--into", str(tmp_path / "lm.json")]) == 2
    assert "does not record the command" in capsys.readouterr().err
    assert not (tmp_path / "lm.json").exists()


def test_a_hybrid_whose_chunk_is_the_window_warns(tmp_path):
    import pytest

    from svattn.lm.train import train

    cfg = tiny_config(tmp_path / "run", "hybrid_sv", steps=1,
                      hybrid={"chunk": 32, "C": 1 / 16, "budget": 16})  # block_size 32
    with pytest.warns(UserWarning, match=r"chunk \(32\) >= block_size \(32\).*causal softmax"):
        train(cfg)


def test_train_refuses_bad_input_before_printing_its_config(tmp_path, capsys):
    path = _tiny_file(tmp_path)
    for extra, words in [(["--set", f"data={json.dumps(str(tmp_path / 'nope'))}"],
                          "enwik8 file not found"),
                         (["--set", 'model_overrides={"n_head": 5}'], "n_head")]:
        assert main(["train", str(path), *extra]) == 2
        out, err = capsys.readouterr()
        assert words in err and "config (" not in out, (out, err)
    assert main(["train", str(path)]) == 0
    capsys.readouterr()
    assert main(["train", str(path)]) == 2  # out_dir holds a checkpoint, no --resume
    out, err = capsys.readouterr()
    assert "already holds a checkpoint" in err and "config (" not in out
