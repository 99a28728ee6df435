"""svattn.lm.loop: the one optimiser set-up and training loop of svattn train and recall."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch
from torch import nn

from svattn.lm.loop import OptimConfig, build_optimizer, lr_lambda, optimizer_step, training_steps
from svattn.lm.recall import RecallRun
from svattn.lm.train import TrainConfig

OC = OptimConfig(lr=0.01, min_lr=0.001, warmup=2, steps=6, weight_decay=0.1, betas=(0.8, 0.95),
                 grad_clip=0.5)


def _model(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 3))


def _batches(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 + step)
    return torch.randn(5, 4, generator=g), torch.randint(0, 3, (5,), generator=g)


def test_build_optimizer_decays_matrices_only_with_the_configs_betas():
    model = _model()
    opt, sched = build_optimizer(model, OC)
    decay, rest = opt.param_groups
    assert [p.dim() for p in decay["params"]] == [2, 2]
    assert [p.dim() for p in rest["params"]] == [1, 1, 1, 1]
    assert (decay["weight_decay"], rest["weight_decay"]) == (0.1, 0.0)
    assert decay["betas"] == rest["betas"] == (0.8, 0.95)
    # the schedule starts at warmup step 0 and keeps no callable in its state (checkpoints
    # stay plain data)
    assert sched.get_last_lr() == [0.01 * lr_lambda(0, warmup=2, total=6, lr=0.01,
                                                    min_lr=0.001)] * 2
    assert sched.state_dict()["lr_lambdas"] == [None, None]


def test_the_loop_equals_a_hand_written_loop():
    """The reference: the step written out (zero, backward, clip, AdamW, schedule)."""
    model, ref = _model(), _model()
    opt, sched = build_optimizer(model, OC)
    decay = [p for p in ref.parameters() if p.dim() >= 2]
    rest = [p for p in ref.parameters() if p.dim() < 2]
    ropt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                              {"params": rest, "weight_decay": 0.0}], lr=0.01, betas=(0.8, 0.95))
    rsched = torch.optim.lr_scheduler.LambdaLR(
        ropt, lambda s: lr_lambda(s, warmup=2, total=6, lr=0.01, min_lr=0.001))
    ce = nn.functional.cross_entropy
    seen = list(training_steps(model, opt, sched, batch=_batches,
                               loss=lambda x, y: ce(model(x), y), start=0, end=6,
                               grad_clip=OC.grad_clip))
    ref_losses = []
    for step in range(6):
        x, y = _batches(step)
        loss = ce(ref(x), y)
        ropt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        ropt.step()
        rsched.step()
        ref_losses.append(float(loss.detach()))
    assert [s for s, _, _ in seen] == [1, 2, 3, 4, 5, 6]
    assert [v for _, v, _ in seen] == ref_losses
    assert all(t >= 0 for _, _, t in seen)
    for a, b in zip(model.parameters(), ref.parameters(), strict=True):
        assert torch.equal(a, b)
    assert sched.get_last_lr() == rsched.get_last_lr()


def test_a_resumed_loop_starts_at_its_step_and_puts_the_model_in_training_mode():
    model = _model().eval()
    opt, sched = build_optimizer(model, OC)
    asked = []

    def batch(step):
        asked.append(step)
        return _batches(step)

    out = list(training_steps(model, opt, sched, batch=batch,
                              loss=lambda x, y: nn.functional.cross_entropy(model(x), y),
                              start=4, end=6, grad_clip=0.0))
    assert asked == [4, 5] and [s for s, _, _ in out] == [5, 6] and model.training
    assert list(training_steps(model, opt, sched, batch=batch, loss=None, start=6, end=6,
                               grad_clip=0.0)) == []


@pytest.mark.parametrize("clip", [0.0, 1e-3])
def test_optimizer_step_clips_the_global_norm_only_when_asked(clip):
    lin = nn.Linear(3, 1, bias=False)
    nn.init.zeros_(lin.weight)
    opt = torch.optim.SGD(lin.parameters(), lr=1.0)
    loss = (lin(torch.full((1, 3), 10.0)) - 1.0).abs().sum()  # gradient (-10, -10, -10)
    optimizer_step(lin, opt, None, loss, grad_clip=clip)
    norm = float(lin.weight.detach().norm())
    assert norm == pytest.approx(clip if clip else 10 * math.sqrt(3), rel=1e-6)


def test_a_non_finite_loss_stops_the_loop_naming_the_run_and_the_step():
    model = _model()
    opt, sched = build_optimizer(model, OC)
    ce = nn.functional.cross_entropy
    steps: list[int] = []

    def batch(step):
        steps.append(step)
        return _batches(step)

    def loss(x, y):  # not finite at the third step
        return ce(model(x), y) * (math.nan if len(steps) == 3 else 1.0)

    with pytest.raises(FloatingPointError, match=r"run-x: loss is nan at step 3"):
        list(training_steps(model, opt, sched, batch=batch, loss=loss, start=0, end=6,
                            grad_clip=1.0, finite="run-x"))
    assert steps == [0, 1, 2]
    # without the check (svattn train) the loop goes on
    model = _model()
    opt, sched = build_optimizer(model, OC)
    nan = list(training_steps(model, opt, sched, batch=_batches,
                              loss=lambda x, y: ce(model(x), y) * math.nan, start=0, end=2,
                              grad_clip=1.0))
    assert len(nan) == 2 and all(math.isnan(v) for _, v, _ in nan)


def test_each_caller_says_its_optimiser_in_one_place():
    cfg = TrainConfig(lr=3e-3, min_lr=3e-4, warmup=5, steps=50, weight_decay=0.05,
                      betas=(0.8, 0.9), grad_clip=0.0)
    assert cfg.optim_config() == OptimConfig(lr=3e-3, min_lr=3e-4, warmup=5, steps=50,
                                             weight_decay=0.05, betas=(0.8, 0.9), grad_clip=0.0)
    # betas from a JSON list
    assert TrainConfig.from_dict({"betas": [0.8, 0.9]}).optim_config().betas == (0.8, 0.9)
    run = RecallRun(lr=2e-3, steps=45, warmup_frac=0.1, weight_decay=0.2)
    assert run.optim_config() == OptimConfig(lr=2e-3, min_lr=2e-4, warmup=4, steps=45,
                                             weight_decay=0.2, betas=(0.9, 0.99), grad_clip=1.0)
    assert RecallRun(steps=5, warmup_frac=0.1).optim_config().warmup == 1  # at least one


def test_set_overrides_live_beside_the_config_and_the_cli_still_starts_without_torch():
    import svattn.cli as cli
    from svattn.lm import train

    assert cli.apply_overrides is train.apply_overrides
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        _ = cli.nothing_here
    code = "import sys, svattn.cli; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "False"
