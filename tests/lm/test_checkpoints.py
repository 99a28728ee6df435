"""Checkpoints that cannot run code (issue #35, defect 15) and every shipped checkpoint
working with generate, verify-forget and eval (issue #37, item 3).

Every command that reads a checkpoint reads it with ``torch.load(weights_only=True)``
(:func:`svattn.lm.checkpoint.read_checkpoint`); an earlier svattn's checkpoint (numpy's
random state pickled) is refused with the conversion command, which is the one place
that unpickles.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from lm_helpers import tiny_config

from svattn.cli import main
from svattn.lm import CharLM, CharLMConfig
from svattn.lm.checkpoint import UnsafeCheckpointError, read_checkpoint
from svattn.lm.train import TrainConfig, load_checkpoint_model, train

ROOT = Path(__file__).resolve().parents[2]


def shipped() -> list[Path]:
    """Every checkpoint the repository ships under results/ (tracked by git)."""
    out = subprocess.run(["git", "ls-files", "results"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout.split()
    return [ROOT / p for p in out if p.endswith((".pt", ".ckpt", ".pth"))]


class Payload:
    """Unpickling this runs ``touch MARKER`` (a stand-in for any shell command)."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def small_model(vocab: int = 256) -> CharLM:
    torch.manual_seed(0)
    return CharLM(CharLMConfig(vocab_size=vocab, n_layer=1, n_embd=16, n_head=2,
                               block_size=64, mixer="hybrid_sv",
                               mixer_options={"chunk": 8, "C": 0.25, "policy": "full"}))


def old_style(path: Path, model: CharLM, **extra) -> None:
    """A checkpoint as svattn train wrote it before: numpy's random state pickled."""
    torch.save({"config": TrainConfig().to_dict(), "model_config": model.cfg.to_dict(),
                "model": model.state_dict(), "step": 3,
                "rng": {"torch": torch.get_rng_state(),
                        "numpy": np.random.get_state()},  # noqa: NPY002
                **extra}, path)


def commands(ckpt: Path, tmp_path: Path) -> list[list[str]]:
    """generate, verify-forget (with a real stream and receipt) and eval of ``ckpt``."""
    model = small_model()
    safe = tmp_path / "safe.pt"
    torch.save({"config": TrainConfig().to_dict(), "model_config": model.cfg.to_dict(),
                "model": model.state_dict(), "step": 0}, safe)
    assert main(["generate", str(safe), "--prompt", "abcd", "-n", "1", "--forget", "1:2",
                 "--save", str(tmp_path / "st"), "--receipt", str(tmp_path / "r.json")]) == 0
    return [["generate", str(ckpt), "--prompt", "ab", "-n", "1"],
            ["verify-forget", str(ckpt), str(tmp_path / "st"), str(tmp_path / "r.json")],
            ["eval", str(ckpt), "--max-bytes", "64"]]


def test_a_crafted_checkpoint_is_refused_and_runs_nothing(tmp_path, capsys):
    marker = tmp_path / "ran"
    ckpt = tmp_path / "ckpt.pt"
    model = small_model()
    torch.save({"config": TrainConfig().to_dict(), "model_config": model.cfg.to_dict(),
                "model": model.state_dict(), "step": 0, "evil": Payload(marker)}, ckpt)
    cmds = commands(ckpt, tmp_path)
    capsys.readouterr()
    for argv in cmds:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert "svattn convert-checkpoint" in err and "Traceback" not in err, err
        assert len(err.strip().splitlines()) == 1, err
        assert not marker.exists(), argv
    with pytest.raises(UnsafeCheckpointError, match="posix.system"):
        load_checkpoint_model(ckpt)
    assert not marker.exists()


def test_an_earlier_checkpoint_is_refused_then_converted(tmp_path, capsys):
    model = small_model()
    old, new = tmp_path / "old.pt", tmp_path / "new.pt"
    old_style(old, model)
    assert main(["generate", str(old), "--prompt", "ab", "-n", "2", "--seed", "1"]) == 2
    assert f"svattn convert-checkpoint {old} NEW" in capsys.readouterr().err
    assert main(["convert-checkpoint", str(old), str(new)]) == 0
    out = capsys.readouterr()
    assert "warning: unpickling" in out.err and f"wrote {new}" in out.out
    ck = torch.load(new, weights_only=True)  # plain data now
    assert isinstance(ck["rng"]["numpy"], dict) and ck["step"] == 3
    got, _, _ = load_checkpoint_model(new)
    assert all(torch.equal(a, b) for a, b in zip(got.state_dict().values(),
                                                 model.state_dict().values(), strict=True))
    s = model.stream()
    s.feed(b"ab")
    assert main(["generate", str(new), "--prompt", "ab", "-n", "2", "--seed", "1"]) == 0
    assert capsys.readouterr().out.rstrip("\n") == s.generate(2, seed=1).decode(
        "utf-8", "backslashreplace")
    assert main(["convert-checkpoint", str(old), str(new)]) == 2  # never overwrites
    assert "exists" in capsys.readouterr().err


def test_a_training_checkpoint_reads_without_unpickling(tmp_path):
    """(Resume reads it the same way: tests/lm/test_train.py's resume tests.)"""
    cfg = tiny_config(tmp_path / "run", steps=2, ckpt_every=1)
    train(cfg, stop_after=1)
    ck = torch.load(tmp_path / "run" / "ckpt.pt", weights_only=True)
    assert ck["step"] == 1 and isinstance(ck["rng"]["numpy"], dict)


def test_a_byte_outside_the_vocabulary_exits_2_on_one_line(tmp_path, capsys):
    """Defect 12 on the command line: `svattn generate --prompt "é"` on a 128-byte model."""
    ckpt = tmp_path / "ckpt.pt"
    model = small_model(vocab=128)
    torch.save({"config": TrainConfig().to_dict(), "model_config": model.cfg.to_dict(),
                "model": model.state_dict(), "step": 0}, ckpt)
    assert main(["generate", str(ckpt), "--prompt", "é", "-n", "2"]) == 2
    err = capsys.readouterr().err
    assert "--prompt: byte 195 (0xc3) at offset 0 is outside this model's vocabulary of 128" \
        in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("ckpt", shipped(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_checkpoint_generates_forgets_verifies_and_evaluates(ckpt, tmp_path,
                                                                          capsys):
    """Issue #37 item 3: results/model_forgetting/model.pt (an MQAR model, 128 tokens)."""
    prompt = "k3v9a1b7c2" * 4  # 40 bytes: the memories (chunk 16) hold two chunks
    argv = ["generate", str(ckpt), "--prompt", prompt, "-n", "2", "--seed", "0",
            "--forget", "1:3", "--save", str(tmp_path / "st"),
            "--receipt", str(tmp_path / "r.json")]
    assert main(argv) == 0, capsys.readouterr().err
    assert "after forgetting [1, 3)" in capsys.readouterr().out
    receipt = json.loads((tmp_path / "r.json").read_text())
    assert sum(len(m["span_certificates"]) for m in receipt["memories"]) > 0
    # 3: every field checked, nothing failed; the unsigned stream's forget log: its
    # authenticity unchecked
    assert main(["verify-forget", str(ckpt), str(tmp_path / "st"),
                 str(tmp_path / "r.json")]) == 3
    out = capsys.readouterr().out
    assert "nothing failed" in out and "FAILED" not in out
    assert main(["eval", str(ckpt), "--max-bytes", "64"]) == 0
    out = capsys.readouterr().out
    assert '"accuracy"' in out or '"bpc"' in out, out
    if read_checkpoint(ckpt)["model_config"]["vocab_size"] < 256:
        assert main(["generate", str(ckpt), "--prompt", "é", "-n", "1"]) == 2
        assert "vocabulary" in capsys.readouterr().err


def test_the_repository_ships_a_checkpoint():
    assert shipped(), "the shipped-checkpoint test above would test nothing"


@pytest.mark.parametrize("argv, words", [
    (["convert-checkpoint", "{tmp}/none.pt", "{tmp}/new.pt"], ["OLD: no such file"]),
    (["convert-checkpoint", "{tmp}/text.pt", "{tmp}/new.pt"], ["OLD", "not a torch.save"]),
    (["eval", "{shipped}", "--data", "{tmp}/text.pt"], ["--data", "recall run's model"]),
    (["eval", "{shipped}", "--split", "val"], ["--split", "train and test"]),
    (["generate", "{tmp}/text.pt", "--prompt", "a"], ["not a checkpoint",
                                                      "not a torch.save archive"]),
])
def test_checkpoint_usage_errors_exit_2_on_one_line(tmp_path, capsys, argv, words):
    (tmp_path / "text.pt").write_text("not a checkpoint\n")
    argv = [a.replace("{tmp}", str(tmp_path)).replace("{shipped}", str(shipped()[0]))
            for a in argv]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err


def test_a_recall_cell_model_generates_forgets_verifies_and_evaluates(tmp_path, capsys):
    """The grid cells' safetensors models (svattn.lm.recall.save_cell_model) too."""
    from svattn.lm.recall import RecallRun, model_config, save_cell_model

    run = RecallRun(seq_len=32, d_model=16, steps=3, batch_size=4, num_train=16, num_test=8,
                    hybrid={"chunk": 8, "C": 0.25, "budget": 8, "policy": "full"},
                    task_options={"vocab_size": 32}, inspect_sequences=1)
    torch.manual_seed(0)
    model = CharLM(model_config(run, 32))
    cell = tmp_path / "cell.safetensors"
    save_cell_model(model, run, cell)
    prompt = bytes(range(1, 21)).decode()
    assert main(["generate", str(cell), "--prompt", prompt, "-n", "2", "--forget", "2:5",
                 "--save", str(tmp_path / "st"), "--receipt", str(tmp_path / "r.json")]) == 0
    assert main(["verify-forget", str(cell), str(tmp_path / "st"),
                 str(tmp_path / "r.json")]) == 3  # unsigned: authenticity unchecked
    assert "nothing failed" in capsys.readouterr().out
    assert main(["eval", str(cell)]) == 0
    rec = json.loads(capsys.readouterr().out)
    assert rec["contexts"] == 8 and rec["step"] == 3 and 0 <= rec["accuracy"] <= 1

