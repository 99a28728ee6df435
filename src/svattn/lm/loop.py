"""The one optimiser set-up and training loop of ``svattn train`` and the recall runs.

:func:`svattn.lm.train.train` (the enwik8 language model) and
:func:`svattn.lm.recall.train_recall` / :func:`~svattn.lm.recall.train_checkpointed`
(the token models of the recall tasks) train the same way; what differs is
passed in:

* **Optimiser** (:func:`build_optimizer`, from an :class:`OptimConfig`): AdamW
  with weight decay on matrices only (parameters of two or more dimensions),
  linear warmup then cosine decay to ``min_lr`` (:func:`lr_lambda` in a
  :class:`torch.optim.lr_scheduler.LambdaLR`), gradient clipping by global norm.
  ``TrainConfig.optim_config()`` and ``RecallRun.optim_config()`` say each
  caller's values (the recall runs: betas ``(0.9, 0.99)``, ``min_lr = lr / 10``,
  warmup ``warmup_frac`` of the steps, clipping at 1).
* **Step** (:func:`optimizer_step`): zero the gradients, backward, clip, AdamW
  step, schedule step.
* **Loop** (:func:`training_steps`): for each step, the caller's ``batch(step)``
  and ``loss(x, y)`` (the LM loss over every position; the recall loss at the
  scored positions only), then :func:`optimizer_step`; it yields ``(step,
  loss, seconds)`` after each, so the caller logs, evaluates and checkpoints
  between steps as it needs.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["OptimConfig", "build_optimizer", "lr_lambda", "optimizer_step", "training_steps"]


def lr_lambda(step: int, *, warmup: int, total: int, lr: float, min_lr: float) -> float:
    """Multiplier of ``lr`` at ``step``: linear warmup, then cosine to ``min_lr``.

    Examples
    --------
    >>> lam = [lr_lambda(s, warmup=10, total=110, lr=1.0, min_lr=0.1) for s in (0, 9, 10, 60, 110)]
    >>> [round(x, 3) for x in lam]
    [0.1, 1.0, 1.0, 0.55, 0.1]
    """
    if step < warmup:
        return (step + 1) / warmup
    frac = min(1.0, (step - warmup) / max(1, total - warmup))
    return (min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * frac))) / lr


@dataclass(frozen=True)
class OptimConfig:
    """AdamW, its warmup + cosine schedule and the clipping of one run.

    Parameters
    ----------
    lr : float
        Peak learning rate (reached at the end of the warmup).
    min_lr : float
        Learning rate at ``steps`` and after.
    warmup : int
        Steps of linear warmup (step ``s < warmup`` runs at ``lr · (s + 1) / warmup``).
    steps : int
        The run's length: the cosine reaches ``min_lr`` there.
    weight_decay : float
        AdamW's decay of the matrices (parameters of two or more dimensions);
        vectors (biases, norms, gates) are not decayed.
    betas : tuple of float
    grad_clip : float
        Clip the gradients' global norm to this; 0 does not clip.
    """

    lr: float
    min_lr: float
    warmup: int
    steps: int
    weight_decay: float
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = 1.0


def build_optimizer(model: nn.Module, oc: OptimConfig
                    ) -> tuple[torch.optim.AdamW, torch.optim.lr_scheduler.LambdaLR]:
    """AdamW over ``model``'s parameters (decay on the matrices only) and its schedule.

    The two parameter groups are the matrices (``weight_decay``) and the rest (0), each
    in ``model.parameters()`` order. The schedule's multiplier is a plain function, so
    its ``state_dict`` holds no callable (checkpoints stay plain data).

    Examples
    --------
    >>> m = nn.Linear(3, 2)
    >>> opt, sched = build_optimizer(m, OptimConfig(lr=1.0, min_lr=0.1, warmup=2, steps=10,
    ...                                             weight_decay=0.1))
    >>> [g["weight_decay"] for g in opt.param_groups], sched.get_last_lr()
    ([0.1, 0.0], [0.5, 0.5])
    """
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": oc.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    opt = torch.optim.AdamW(groups, lr=oc.lr, betas=tuple(oc.betas))
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: lr_lambda(s, warmup=oc.warmup, total=oc.steps, lr=oc.lr, min_lr=oc.min_lr),
    )
    return opt, sched


def optimizer_step(model: nn.Module, opt: torch.optim.Optimizer, sched, loss: torch.Tensor,
                   *, grad_clip: float) -> None:
    """One step on ``loss``: zero the gradients, backward, clip ``model``'s gradients to
    global norm ``grad_clip`` (0: no clipping), ``opt.step()``, then ``sched.step()``
    (``sched`` may be None)."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    if grad_clip > 0:
        torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    opt.step()
    if sched is not None:
        sched.step()


def training_steps(
    model: nn.Module,
    opt: torch.optim.Optimizer,
    sched,
    *,
    batch: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
    loss: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
    start: int,
    end: int,
    grad_clip: float,
    sync: Callable[[], None] | None = None,
    finite: str | None = None,
) -> Iterator[tuple[int, float, float]]:
    """The training loop: steps ``start`` .. ``end − 1``, yielding after each.

    Puts ``model`` in training mode, then for each step ``s``: ``x, y = batch(s)``,
    ``loss(x, y)`` (a scalar tensor), :func:`optimizer_step`. The caller may
    evaluate, log or checkpoint between steps (an evaluation that leaves the model
    in eval mode must restore training mode).

    Parameters
    ----------
    model : nn.Module
        The module whose gradients are clipped (the unwrapped model under DDP).
    opt, sched
        From :func:`build_optimizer` (``sched`` may be None: no schedule).
    batch : callable
        ``batch(step) -> (inputs, targets)``.
    loss : callable
        ``loss(inputs, targets) -> scalar tensor``.
    start, end : int
        Steps already done, and the step to stop at.
    grad_clip : float
        As :class:`OptimConfig` (0: no clipping).
    sync : callable, optional
        Called after each step before its time is taken (``torch.cuda.synchronize``).
    finite : str, optional
        Raise :class:`FloatingPointError` (this label, the loss, the step) when the
        loss is not finite; None does not check.

    Yields
    ------
    (step, loss, seconds)
        Steps done so far (``start + 1`` first), the step's loss as a float, and the
        seconds the step took (batch, forward, backward, optimiser).
    """
    model.train()
    step = start
    while step < end:
        t0 = time.perf_counter()
        x, y = batch(step)
        value = loss(x, y)
        optimizer_step(model, opt, sched, value, grad_clip=grad_clip)
        step += 1
        loss_val = float(value.detach())
        if sync is not None:
            sync()
        seconds = time.perf_counter() - t0
        if finite is not None and not math.isfinite(loss_val):
            raise FloatingPointError(f"{finite}: loss is {loss_val} at step {step}")
        yield step, loss_val, seconds
