"""``model-forgetting``: the quick mode end to end, the decay baseline, receipts, resume."""

from __future__ import annotations

import json

import pytest
import torch

from svattn.experiments import model_forgetting as mf
from svattn.experiments._common import NOT_RUN, REPRODUCED, Context
from svattn.experiments.runner import write_report
from svattn.lm import CharLM, CharLMConfig
from svattn.lm.forget import verify_forget
from svattn.lm.recall import RecallRun, load_recall_model, train_checkpointed

CFG = CharLMConfig(vocab_size=32, block_size=64, n_layer=2, n_embd=16, n_head=2,
                   mixer="hybrid_sv", mixer_options={"chunk": 8, "C": 0.125, "policy": "full"})


@pytest.fixture(scope="module")
def model() -> CharLM:
    torch.manual_seed(0)
    return CharLM(CFG).eval()


@pytest.fixture(scope="module")
def tokens() -> list[int]:
    return torch.randint(1, 32, (30,), generator=torch.Generator().manual_seed(1)).tolist()


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("mf")
    ctx = Context(out=out, quick=True, seed=0, data_dir=None, command="test", repo_root=None)
    res = mf.run(ctx)
    write_report(res, ctx, 0.0)
    return res, out


def test_quick_end_to_end(quick) -> None:
    res, out = quick
    m = json.loads((out / "metrics.json").read_text())
    n = res.metrics["contexts"]
    assert n == mf.N_QUICK and m["verdict"].startswith("machinery check")
    summ = res.metrics["summary"]
    # the equality is computed (a number, at every context), and holds
    devs = [c["exact"]["dev_others"] for c in res.metrics["contexts_detail"]]
    assert len(devs) == n and all(0.0 <= d <= mf.TOL for d in devs)
    assert res.metrics["exact_dev_all_max"] <= mf.TOL
    assert res.metrics["verified"] == n
    assert summ["exact"]["held_max"] == {"bytes": 0, "cache_rows": 0, "memory_tokens": 0}
    # the baselines keep the pair's tokens and move the other queries
    for name in ("decay_0", "decay_0.1", "ascent"):
        assert summ[name]["held_max"]["bytes"] == 2
        assert summ[name]["held_max"]["cache_rows"] == 2 * CFG.n_layer
    assert summ["decay_0"]["dev_others_max"] > 1e-6
    assert [c.verdict for c in res.claims[:3]] == [REPRODUCED] * 3
    assert (out / "model_forgetting.png").read_bytes()[:4] == b"\x89PNG"


def test_not_run_names_the_training_command(tmp_path) -> None:
    ctx = Context(out=tmp_path, quick=False, seed=0, data_dir=None, command="t",
                  repo_root=tmp_path)
    res = mf.run(ctx)
    assert res.verdict.startswith("not yet run")
    assert "scripts/train_forgetting_model.py" in res.verdict
    assert all(c.verdict == NOT_RUN for c in res.claims)


def test_decayed_stream_without_decay_equals_the_stream(model, tokens) -> None:
    s = model.stream()
    s.feed(tokens)
    d = mf.DecayedStream(model)
    d.feed(tokens[:12])
    d.decay(2, 4, 1.0)  # factor 1: weights unchanged
    d.feed(tokens[12:])
    assert float((d.all_logits() - s.all_logits()).abs().max()) <= 1e-12


def test_decay_changes_later_reads_only(model, tokens) -> None:
    s = model.stream()
    s.feed(tokens)
    d = mf.DecayedStream(model)
    d.feed(tokens[:12])
    d.decay(2, 4, 0.0)
    d.feed(tokens[12:])
    diff = (d.all_logits() - s.all_logits()).abs().amax(-1)
    assert float(diff[:12].max()) == 0.0  # read before the decay: kept
    assert float(diff[12:].max()) > 1e-6  # read after: the two tokens masked
    assert mf.span_held(d, 2, 4) == {"bytes": 2, "cache_rows": 4,
                                      "memory_tokens": 2 * 2 * 2}  # 2 layers x 2 heads
    with pytest.raises(ValueError, match="factor"):
        d.decay(5, 6, 1.5)


def test_receipt_verifies_and_a_tampered_one_does_not(model, tokens) -> None:
    s = model.stream()
    s.feed(tokens[:20])
    receipt = s.forget(2, 4).receipt
    assert verify_forget(s, receipt).ok
    assert mf.span_held(s, 2, 4) == {"bytes": 0, "cache_rows": 0, "memory_tokens": 0}
    bad = verify_forget(s, mf.tampered(receipt))
    assert not bad.ok and any("digest" in r for r in bad.reasons)
    s.feed(tokens[20:])  # the stream moved on: checked later, through its forget log
    later = verify_forget(s, receipt)
    assert later.ok and later.later
    assert not verify_forget(s, mf.tampered(receipt)).ok


def test_train_checkpointed_resumes_to_the_same_model(tmp_path) -> None:
    run = RecallRun.from_dict({**mf.QUICK_RUN.to_dict(), "steps": 4, "num_train": 64})
    straight = train_checkpointed(run, tmp_path / "a", ckpt_every=2)
    train_checkpointed(run, tmp_path / "b", ckpt_every=2, stop_after=2)
    assert not (tmp_path / "b" / "model.pt").exists()
    resumed = train_checkpointed(run, tmp_path / "b", ckpt_every=2)
    a, run_a, _ = load_recall_model(straight["path"])
    b, _, ck = load_recall_model(resumed["path"])
    assert run_a == run and ck["step"] == 4
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values(), strict=True):
        assert torch.equal(va, vb), k
    other = RecallRun.from_dict({**run.to_dict(), "seed": 1})
    with pytest.raises(ValueError, match="another run"):
        train_checkpointed(other, tmp_path / "b")


@pytest.mark.parametrize("factor", [0.5, 0.01, 0.0], ids=lambda f: f"x{f:g}")
def test_decayed_readout_is_coefficient_decays(factor) -> None:
    import numpy as np

    from svattn.exact import SVDDMemory
    from svattn.unlearning import coefficient_decay

    rng = np.random.default_rng(0)
    mem = SVDDMemory(C=0.1)
    mem.extend(rng.normal(size=(40, 3)), rng.normal(size=(40, 2)))
    tid = mem.support_ids()[0]
    q = rng.normal(size=(7, 3))
    ref = coefficient_decay(mem, tid, factor).readout(q)
    assert np.abs(mf.decayed_readout(mem, {tid: factor}, q) - ref).max() <= 1e-12
    assert np.abs(mf.decayed_readout(mem, {}, q) - mem.readout(q)).max() == 0.0
