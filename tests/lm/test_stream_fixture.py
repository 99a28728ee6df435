"""Stream folders saved by an earlier svattn load, verify and continue as that code did.

``tests/lm/data/stream_v2/`` was written by svattn before the stream ran the model's own
step (issue #38; ``scripts/make_stream_fixture.py``, command and commit in
``stream_v2.json``): per model its weights, a saved stream folder (format version 2,
after feeds and two forgets by exact removals) and the last forget's receipt, with the
digests and logits of a fixed continuation run by that code.

Digests are discrete (text, positions, what the memories hold, the forget log) and must
be equal. Logits are compared within 1e-12: that code and today's computed them bit for
bit alike when the fixture was made, and the margin admits a future change of rounding
(as ``tests/exact/test_state_fixture.py`` had to) and nothing a change of behaviour
would move (logits here are O(1); a wrong position or key moves them by ~1e-2).
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from svattn.lm import CharLM, CharLMConfig
from svattn.lm.forget import ModelErasureReceipt, verify_forget
from svattn.lm.stream import LMStream

DATA = Path(__file__).parent / "data"
RECORD = json.loads((DATA / "stream_v2.json").read_text())
sys.path.insert(0, str(Path(__file__).parents[2] / "scripts"))
from make_stream_fixture import continue_stream  # noqa: E402

TOL = 1e-12


def load_model(name: str) -> CharLM:
    model = CharLM(CharLMConfig(**RECORD["models"][name]["config"]))
    model.load_state_dict(load_file(DATA / "stream_v2" / name / "model.safetensors"))
    return model


@pytest.fixture(params=sorted(RECORD["models"]))
def saved(request, tmp_path):
    name = request.param
    folder = tmp_path / "stream"
    shutil.copytree(DATA / "stream_v2" / name / "stream", folder)  # load takes the lock
    return name, folder, load_model(name)


def test_an_old_stream_folder_loads_verifies_and_continues(saved):
    name, folder, model = saved
    rec = RECORD["models"][name]
    s = LMStream.load(folder, model)
    assert s.digest() == rec["saved_digest"] and s.content_digest() == rec["saved_content"]
    assert len(s) == rec["n_held"]
    receipt = ModelErasureReceipt.from_json(
        (DATA / "stream_v2" / name / "receipt.json").read_text())
    check = verify_forget(s, receipt)
    assert check.ok, check.reasons
    got = continue_stream(s)
    want = rec["continuation"]
    for key in ("after_feed", "after_forget_content", "after_forget_state", "n_held"):
        assert got[key] == want[key], key
    for key in ("feed_logits", "last_logits"):
        dev = (torch.tensor(got[key]) - torch.tensor(want[key])).abs().max()
        assert dev <= TOL, (key, float(dev))
    assert torch.tensor(want["feed_logits"]).abs().max() > 0.1


def test_the_fixture_holds_memories_with_removals_and_a_receipt_with_certificates():
    hybrid = json.loads((DATA / "stream_v2" / "hybrid" / "receipt.json").read_text())
    assert sum(len(m["span_certificates"]) for m in hybrid["memories"]) > 0
    man = json.loads((DATA / "stream_v2" / "hybrid" / "stream" / "stream.json").read_text())
    assert man["version"] == 2 and len(man["forget_log"]) == 2
    arrays = load_file(DATA / "stream_v2" / "hybrid" / "stream" / man["arrays"]["file"])
    assert {"k.0", "v.0", "kr.0", "k.1", "v.1", "kr.1"} <= set(arrays)  # rope: rotated too
    sliding = json.loads((DATA / "stream_v2" / "sliding" / "stream" / "stream.json")
                         .read_text())
    assert sliding["model_config"]["pos_emb"] and not sliding["model_config"]["rope"]
