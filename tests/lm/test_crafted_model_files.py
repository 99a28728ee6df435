"""A crafted model file is refused before a model is built from it: a recall cell model
(safetensors) whose metadata is malformed or names sizes other than its tensors', a
training checkpoint whose config names huge sizes or whose weights are not tensors;
``svattn generate`` and ``verify-forget`` on one exit 2 with one line. An honest cell
model still reads, weight for weight.
"""

from __future__ import annotations

import json

import pytest
import torch

from stream_helpers import cell_model
from svattn.cli import main
from svattn.lm import CharLM
from svattn.lm.train import load_checkpoint_model

# a recall cell model (safetensors) with crafted metadata: a model_config that
# is a list or names an unknown field, no run, a run without steps, a config whose
# sizes are not the stored tensors'. Each raised TypeError/KeyError/RuntimeError (a
# traceback from svattn generate / verify-forget / eval)
CELL_EDITS = {
    "config a list": {"model_config": "[1, 2]"},
    "config unknown field": {"model_config": "UNKNOWN"},
    "no run": {"run": None},
    "run a list": {"run": "[]"},
    "run without steps": {"run": "{}"},
    "config of other sizes": {"model_config": "WIDER"},
}


def _crafted(model: CharLM, edit: dict) -> dict:
    cfg = model.cfg.to_dict()
    out = dict(edit)
    if out.get("model_config") == "UNKNOWN":
        out["model_config"] = json.dumps({**cfg, "evil": 1})
    if out.get("model_config") == "WIDER":
        out["model_config"] = json.dumps({**cfg, "n_embd": 32})
    return out


@pytest.mark.parametrize("case", sorted(CELL_EDITS))
def test_a_crafted_cell_model_is_refused(forgot, tmp_path, case):
    path = cell_model(tmp_path / "cell.safetensors", forgot[0], **_crafted(forgot[0],
                                                                      CELL_EDITS[case]))
    with pytest.raises(ValueError, match="cell model"):
        load_checkpoint_model(path)


@pytest.mark.parametrize("command", ["generate", "verify-forget"])
def test_cli_on_a_crafted_cell_model_exits_2(forgot, tmp_path, capsys, command):
    model, folder, receipt = forgot
    path = cell_model(tmp_path / "cell.safetensors", model, run="{}")
    (tmp_path / "r.json").write_text(receipt.to_json())
    argv = (["generate", str(path), "--prompt", "ab", "-n", "2"] if command == "generate"
            else ["verify-forget", str(path), str(folder), str(tmp_path / "r.json")])
    assert main(argv) == 2
    assert "cell model" in capsys.readouterr().err


# a model_config naming huge sizes (n_embd 2**18: ~1.6e12 parameters) beside
# small tensors: the model was built (terabytes asked of the allocator) before any
# weight was compared. Now its size is counted on the meta device and refused.
def test_a_cell_model_config_naming_huge_sizes_is_refused_before_building(forgot, tmp_path):
    cfg = {**forgot[0].cfg.to_dict(), "n_embd": 1 << 18}
    path = cell_model(tmp_path / "cell.safetensors", forgot[0], model_config=json.dumps(cfg))
    with pytest.raises(ValueError, match="parameters"):
        load_checkpoint_model(path)


def test_a_checkpoint_config_naming_huge_sizes_is_refused_before_building(forgot, tmp_path):
    model = forgot[0]
    path = tmp_path / "ckpt.pt"
    torch.save({"format": "svattn.RecallCheckpoint", "step": 1, "model": model.state_dict(),
                "model_config": {**model.cfg.to_dict(), "n_embd": 1 << 18}}, path)
    with pytest.raises(ValueError, match="parameters"):
        load_checkpoint_model(path)


def test_a_checkpoint_whose_model_is_not_tensors_is_refused(forgot, tmp_path):
    model = forgot[0]
    path = tmp_path / "ckpt.pt"
    torch.save({"format": "svattn.RecallCheckpoint", "step": 1, "model": [1, 2],
                "model_config": model.cfg.to_dict()}, path)
    with pytest.raises(ValueError, match="model"):  # refused from the start
        load_checkpoint_model(path)


def test_an_honest_cell_model_still_reads(forgot, tmp_path):
    model = forgot[0]
    path = cell_model(tmp_path / "cell.safetensors", model)
    got, cfg, ck = load_checkpoint_model(path)
    assert cfg is None and ck["step"] == 1
    for (n, p), (m, q) in zip(got.state_dict().items(), model.state_dict().items(),
                              strict=True):
        assert n == m and torch.equal(p, q)
