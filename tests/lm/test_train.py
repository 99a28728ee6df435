"""Training: loss falls for every mixer, resume is exact, config errors are precise."""

from __future__ import annotations

import pytest
import torch
from lm_helpers import read_log, tiny_config

from svattn.lm.train import TrainConfig, lr_lambda, train

MIXERS = ["softmax", "sliding", "hybrid_sv", "deltanet", "linear"]


@pytest.mark.parametrize("mixer", MIXERS)
def test_loss_falls_over_50_steps(tmp_path, mixer):
    res = train(tiny_config(tmp_path, mixer))
    losses = [r["loss"] for r in read_log(tmp_path, "train")]
    assert len(losses) == 50 and res.tokens_seen == 50 * 8 * 32
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert first > 5.0  # about ln 256 at init
    assert last < first - 1.0, (first, last)


def _params(path):
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


@pytest.mark.parametrize("mixer", ["softmax", "hybrid_sv"])
def test_resume_equals_unbroken_run(tmp_path, mixer):
    kw = dict(steps=12, warmup=3, ckpt_every=0)
    train(tiny_config(tmp_path / "a", mixer, **kw))
    train(tiny_config(tmp_path / "b", mixer, **kw), stop_after=5)
    assert torch.load(tmp_path / "b" / "ckpt.pt", weights_only=False)["step"] == 5
    res = train(tiny_config(tmp_path / "b", mixer, **kw), resume=True)
    assert res.steps == 12 and res.tokens_seen == 12 * 8 * 32
    a, b = _params(tmp_path / "a" / "ckpt.pt"), _params(tmp_path / "b" / "ckpt.pt")
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)
    ca = torch.load(tmp_path / "a" / "ckpt.pt", weights_only=False)
    cb = torch.load(tmp_path / "b" / "ckpt.pt", weights_only=False)
    assert ca["scheduler"] == cb["scheduler"]
    for sa, sb in zip(
        ca["optimizer"]["state"].values(), cb["optimizer"]["state"].values(), strict=True
    ):
        torch.testing.assert_close(sa["exp_avg_sq"], sb["exp_avg_sq"], rtol=0, atol=0)


def test_final_eval_reports_bpc(tmp_path):
    # eval_every = 3 would also fire at the last step: the final evaluation replaces it
    res = train(tiny_config(tmp_path, steps=3, final_eval=True, eval_max_bytes=300,
                            eval_every=3, eval_batches=1, eval_batch_size=2))
    evals = read_log(tmp_path, "eval")
    assert [e["split"] for e in evals] == ["val", "test"]
    assert all(e["bytes"] == 300 and e["context"] == 32 and e["partial"] for e in evals)
    assert res.val_bpc == pytest.approx(evals[0]["bpc"]) and 5.0 < res.val_bpc < 9.0
    final = read_log(tmp_path, "final")[-1]
    assert final["data"] == "enwik8 prefix" and final["params"] == res.params


def test_lr_schedule():
    lam = [lr_lambda(s, warmup=4, total=20, lr=1.0, min_lr=0.1) for s in range(25)]
    assert lam[:4] == [0.25, 0.5, 0.75, 1.0]
    assert all(a >= b for a, b in zip(lam[4:], lam[5:], strict=False))
    assert lam[20] == pytest.approx(0.1) and lam[24] == pytest.approx(0.1)


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        (dict(lerning_rate=1.0), r"unknown training config keys \['lerning_rate'\]"),
        (dict(mixer="mamba"), r"mixer must be one of"),
        (dict(model="huge"), r"unknown model preset 'huge'"),
        (dict(precision="fp8", steps=1),
         r"precision must be one of \['auto', 'bf16', 'fp32', 'fp64'\]"),
    ],
)
def test_config_errors(tmp_path, kw, match):
    with pytest.raises(ValueError, match=match):
        train(tiny_config(tmp_path, **kw))


def test_config_round_trip():
    cfg = TrainConfig(mixer="sliding", steps=7, betas=(0.8, 0.9))
    assert TrainConfig.from_dict(cfg.to_dict()) == cfg
    assert cfg.model_config().mixer_options == {"window": 64 + 64}  # matched: budget + L


def test_resume_with_dropout_equals_unbroken_run(tmp_path):
    # dropout draws from the RNG, which the checkpoint restores
    kw = dict(steps=8, warmup=2, ckpt_every=0,
              model_overrides={"block_size": 32, "dropout": 0.2})  # fmt: skip
    train(tiny_config(tmp_path / "a", **kw))
    train(tiny_config(tmp_path / "b", **kw), stop_after=3)
    train(tiny_config(tmp_path / "b", **kw), resume=True)
    a, b = _params(tmp_path / "a" / "ckpt.pt"), _params(tmp_path / "b" / "ckpt.pt")
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=k)


def test_dropout_only_in_training():
    from svattn.lm import CharLM
    from svattn.lm.model import CharLMConfig

    torch.manual_seed(0)
    model = CharLM(CharLMConfig(n_layer=2, n_embd=32, n_head=2, block_size=16, dropout=0.3))
    idx = torch.randint(0, 256, (2, 16))
    model.train()
    assert not torch.equal(model(idx)[0], model(idx)[0])
    model.eval()
    torch.testing.assert_close(model(idx)[0], model(idx)[0], rtol=0, atol=0)
    for bad in (-0.1, 1.0, True, "0.1"):
        with pytest.raises(ValueError, match="dropout"):
            CharLMConfig(dropout=bad)


def test_committed_configs_carry_paths_relative_to_the_repository():
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for path in sorted((root / "configs").glob("*.json")):
        cfg = json.loads(path.read_text())
        for key in ("data", "out_dir"):
            value = cfg.get(key)
            assert value is None or not Path(value).is_absolute(), (path.name, key, value)
        if cfg.get("data") and (root.parent / "shared").is_dir():
            assert (root / cfg["data"]).exists(), (path.name, cfg["data"])


def test_committed_results_carry_no_machine_paths():
    """Results record data and run paths relative to the repository (a command that
    wrote a scratch file, ``--into /tmp/...``, is quoted as it ran: not a data path)."""
    import json
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]

    def walk(node, where):
        if isinstance(node, dict):
            for k, v in node.items():
                if k in ("data", "data_dir", "out_dir", "run") and isinstance(v, str):
                    assert not Path(v).is_absolute(), (where, k, v)
                walk(v, where)
        elif isinstance(node, list):
            for v in node:
                walk(v, where)

    for path in sorted((root / "results").rglob("*.json")):
        walk(json.loads(path.read_text()), str(path.relative_to(root)))
