"""Training of :class:`~svattn.lm.model.CharLM` on byte-level enwik8: :func:`train`.

* **Optimiser and loop** (:mod:`svattn.lm.loop`, shared with the recall runs):
  AdamW (weight decay on matrices only), linear warmup then cosine decay to
  ``min_lr`` (a :class:`torch.optim.lr_scheduler.LambdaLR`), gradient clipping by
  global norm (:meth:`TrainConfig.optim_config`); the loss is the LM loss at every
  position.
* **Config** (:mod:`svattn.lm.train_config`): a :class:`TrainConfig`, every field
  checked by name; :func:`apply_overrides` applies ``svattn train``'s
  ``--set KEY=VALUE`` to a config mapping before :meth:`TrainConfig.from_dict`.
* **Precision** (:mod:`svattn.lm.device`): bf16 autocast where the device supports it
  (``precision="auto"``: CUDA with bf16; fp32 on CPU). The SV memory always solves in
  float32 or wider. ``precision="fp64"`` trains in float64, for checks that must not
  depend on float32 rounding (the DDP test compares 2 ranks with 1 process this way).
* **Data**: training windows of ``block_size + 1`` bytes at random offsets of the
  train split. The global batch of step ``s`` is drawn from a generator seeded
  with ``(seed, s)`` and rank ``r`` of ``W`` takes rows ``r·B/W .. (r+1)·B/W``, so
  the data position is just the step: resuming, and splitting a batch over
  ranks, see exactly the same windows.
* **Checkpoints** (``out_dir/ckpt.pt``): model, optimiser, scheduler, step,
  tokens seen, RNG states (torch, CUDA, numpy, python), the config. A resumed
  run continues bit-for-bit on CPU. :mod:`svattn.lm.load` reads a trained model back.
* **Distributed**: launched by ``torchrun`` (``WORLD_SIZE > 1`` in the
  environment), :class:`~torch.nn.parallel.DistributedDataParallel` over
  ``gloo`` on CPU or ``nccl`` on GPU; each rank takes ``batch_size / world``
  rows of the global batch, rank 0 writes the log and checkpoints.
* **Bits per character** (:func:`svattn.lm.bpc.evaluate_bpc`): at the end, on every
  byte of val and test (``eval_max_bytes`` caps them); every ``eval_every`` steps, a
  quick estimate on the start of val.
* **Log**: ``out_dir/log.jsonl``, one JSON object per line (``"kind"``: ``"config"``,
  ``"train"``, ``"eval"``, ``"final"``).

Its importers also find here, defined where they belong: ``TrainConfig`` and
``apply_overrides`` (:mod:`svattn.lm.train_config`), ``evaluate_bpc``
(:mod:`svattn.lm.bpc`), ``load_checkpoint_model``, ``load_checkpoint_for_eval``,
``RECALL_CELL`` and ``RECALL_FORMAT`` (:mod:`svattn.lm.load`), ``lr_lambda``
(:mod:`svattn.lm.loop`).
"""

from __future__ import annotations

import json
import os
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import nn

from svattn.data.enwik8 import Enwik8, load_enwik8, slice_path
from svattn.lm.bpc import evaluate_bpc
from svattn.lm.checkpoint import numpy_state_from_plain, numpy_state_to_plain, read_checkpoint
from svattn.lm.device import autocast, dist_env, run_device
from svattn.lm.load import (
    RECALL_CELL,
    RECALL_FORMAT,
    load_checkpoint_for_eval,
    load_checkpoint_model,
)
from svattn.lm.loop import build_optimizer, lr_lambda, training_steps
from svattn.lm.model import CharLM
from svattn.lm.train_config import TrainConfig, apply_overrides

__all__ = [
    "TrainConfig",
    "TrainResult",
    "apply_overrides",
    "check_run",
    "train",
    "evaluate_bpc",
    "load_checkpoint_model",
    "load_checkpoint_for_eval",
    "lr_lambda",
    "batch_starts",
    "RECALL_CELL",
    "RECALL_FORMAT",
]

CKPT = "ckpt.pt"
LOG = "log.jsonl"
CONFIG = "config.json"  # the effective config (file and --set overrides) and the command


@dataclass
class TrainResult:
    """What :func:`train` returns (on every rank; metrics from rank 0's view)."""

    params: int
    tokens_seen: int
    steps: int
    train_tokens_per_s: float
    final_loss: float
    val_bpc: float | None
    test_bpc: float | None
    data: str
    checkpoint: str | None
    eval_bytes: dict[str, int] = field(default_factory=dict)  # bytes scored per split
    eval_every_byte: bool = False  # the final BPCs cover every byte of val and test

    def describe_eval(self) -> str:
        """The final BPCs for people, rounded, with what they cover.

        Examples
        --------
        >>> r = TrainResult(1, 1, 1, 1.0, 1.0, 5.2306382, 5.31, "x", None,
        ...                 eval_bytes={"val": 4096, "test": 4096})
        >>> r.describe_eval()
        'val BPC 5.231, test BPC 5.310 (first 4,096 bytes of each split; eval_max_bytes)'
        >>> TrainResult(1, 1, 1, 1.0, 1.0, None, None, "x", None).describe_eval()
        'no final evaluation (final_eval is false; svattn eval CHECKPOINT scores it)'
        """
        if self.val_bpc is None or self.test_bpc is None:
            return "no final evaluation (final_eval is false; svattn eval CHECKPOINT scores it)"
        text = f"val BPC {self.val_bpc:.3f}, test BPC {self.test_bpc:.3f}"
        if self.eval_every_byte:
            return text + " (every byte of each split)"
        sizes = sorted(set(self.eval_bytes.values()))
        span = f"{sizes[0]:,}" if len(sizes) == 1 else " / ".join(f"{b:,}" for b in sizes)
        return text + f" (first {span} bytes of each split; eval_max_bytes)"


# --------------------------------------------------------------------- pieces


def batch_starts(seed: int, step: int, batch_size: int, n: int, block: int) -> np.ndarray:
    """Offsets of the global batch of ``step``: ``batch_size`` ints in ``[0, n − block − 1]``.

    A pure function of ``(seed, step)``: the data position of a run is its step.
    """
    g = np.random.default_rng([seed, step])
    return g.integers(0, n - block - 1, size=batch_size, endpoint=True)


def get_batch(
    data: np.ndarray, starts: np.ndarray, block: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets ``[B, block]`` (int64) at ``starts`` (one small copy of the memmap)."""
    idx = starts[:, None] + np.arange(block + 1)  # (B, block + 1)
    chunk = torch.from_numpy(np.asarray(data[idx], dtype=np.int64))
    return chunk[:, :-1].to(device), chunk[:, 1:].to(device)


# ------------------------------------------------------------------ the loop


def _rng_state() -> dict:
    state = {
        "torch": torch.get_rng_state(),
        # the global state, as torch; plain data (read_checkpoint unpickles no numpy)
        "numpy": numpy_state_to_plain(np.random.get_state()),  # noqa: NPY002
        "python": random.getstate(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(numpy_state_from_plain(state["numpy"]))  # noqa: NPY002
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def check_run(cfg: TrainConfig, *, resume: bool = False) -> Path:
    """What :func:`train` checks of a run before it starts, without starting it: the
    config, the model it builds, the data file, and that ``out_dir`` holds no checkpoint
    unless ``resume``. Returns the data file's path.

    Raises
    ------
    ValueError, FileNotFoundError
        As :func:`train` does.
    """
    cfg.validate()
    cfg.check_model()
    if (Path(cfg.out_dir) / CKPT).exists() and not resume:
        raise ValueError(
            f"out_dir: {cfg.out_dir} already holds a checkpoint ({CKPT}); pass --resume "
            "(resume=True) to continue it, or choose another out_dir (--set out_dir=DIR)")
    data_path = cfg.data if cfg.data is not None else slice_path()
    if not Path(data_path).is_file():
        raise FileNotFoundError(
            f"data: enwik8 file not found: {data_path} (relative paths are read from the "
            f"current folder, {Path.cwd()}; run from the repository root, or give the file "
            "with --set data=PATH; data=null trains on the shipped 200 kB slice)")
    return Path(data_path)


def train(
    cfg: TrainConfig,
    *,
    resume: bool = False,
    stop_after: int | None = None,
    command: str | None = None,
) -> TrainResult:
    """Train (and evaluate) one run; see the module docstring.

    Everything that can be checked before training is checked before
    ``out_dir`` is created: the config, the model it builds, the device, the
    data file, and that ``out_dir`` holds no checkpoint unless ``resume``.

    Parameters
    ----------
    cfg : TrainConfig
    resume : bool
        Continue from ``cfg.out_dir/ckpt.pt`` when it exists.
    stop_after : int, optional
        Stop (with a checkpoint, without the final evaluation) once this step
        is reached, as if the run had been interrupted.
    command : str, optional
        The command line that started the run; saved with the effective config
        in ``out_dir/config.json`` and the log's ``"config"`` record.

    Returns
    -------
    TrainResult

    Raises
    ------
    ValueError
        A bad config value (named), ``device="cuda"`` without CUDA, or an
        ``out_dir`` that already holds a checkpoint while ``resume`` is False.
    FileNotFoundError
        If the data file does not exist.
    """
    data_path = check_run(cfg, resume=resume)
    mcfg = cfg.check_model()
    if cfg.mixer == "hybrid_sv" and mcfg.mixer_options["chunk"] >= mcfg.block_size:
        import warnings

        warnings.warn(
            f"hybrid: chunk ({mcfg.mixer_options['chunk']}) >= block_size ({mcfg.block_size}): "
            "every window is one chunk, so the SV memory never holds a key and the hybrid is "
            "causal softmax", stacklevel=2)
    rank, local_rank, world = dist_env()
    distributed = world > 1
    device = run_device(cfg.device, local_rank)
    ckpt_path = Path(cfg.out_dir) / CKPT
    if cfg.batch_size % world:
        raise ValueError(f"batch_size ({cfg.batch_size}) must be divisible by WORLD_SIZE ({world})")
    owns_group = False
    if distributed:
        import torch.distributed as dist

        if not dist.is_initialized():
            dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
            owns_group = True
        if device.type == "cuda":
            torch.cuda.set_device(device)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    ds: Enwik8 = load_enwik8(data_path)
    train_lo, train_hi = ds.bounds["train"]
    train_data = ds.split("train")
    T = mcfg.block_size
    if train_hi - train_lo < T + 2:
        raise ValueError(f"train split ({train_hi - train_lo} bytes) is shorter than a window")
    out = Path(cfg.out_dir)
    if rank == 0:  # only now: a config that fails above leaves no empty run folder
        out.mkdir(parents=True, exist_ok=True)
        effective = {"command": command, "config": cfg.to_dict(),
                     "model_config": mcfg.to_dict()}
        if not (resume and ckpt_path.exists()):
            (out / CONFIG).write_text(json.dumps(effective, indent=2) + "\n")

    torch.manual_seed(cfg.seed)
    model = CharLM(mcfg).to(device=device,
                            dtype=torch.float64 if cfg.precision == "fp64" else None)
    n_params = model.num_params()
    opt, sched = build_optimizer(model, cfg.optim_config())
    step, tokens_seen, elapsed = 0, 0, 0.0
    if resume and ckpt_path.exists():
        ckpt = read_checkpoint(ckpt_path, map_location=device)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        sched.load_state_dict(ckpt["scheduler"])
        step, tokens_seen, elapsed = ckpt["step"], ckpt["tokens_seen"], ckpt["train_seconds"]
        _set_rng_state(ckpt["rng"])
    ddp_model: nn.Module = model
    if distributed:
        from torch.nn.parallel import DistributedDataParallel

        ddp_model = DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )

    log = open(out / LOG, "a") if rank == 0 else None  # noqa: SIM115

    def emit(kind: str, **rec) -> None:
        if log is not None:
            log.write(json.dumps({"kind": kind, **rec}) + "\n")
            log.flush()

    def save() -> None:
        if rank != 0:
            return
        state = {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "scheduler": sched.state_dict(),
            "step": step,
            "tokens_seen": tokens_seen,
            "train_seconds": elapsed,
            "rng": _rng_state(),
            "config": cfg.to_dict(),
            "model_config": mcfg.to_dict(),
            "params": n_params,
            "data": ds.label,
        }
        tmp = out / (CKPT + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, ckpt_path)

    emit(
        "config", config=cfg.to_dict(), model_config=mcfg.to_dict(), params=n_params,
        data=ds.describe(), world=world, device=str(device), resumed_at=step, command=command,
    )  # fmt: skip
    per_rank = cfg.batch_size // world
    end = cfg.steps if stop_after is None else min(cfg.steps, stop_after)
    bar = None
    if rank == 0 and cfg.progress:
        from tqdm import tqdm

        bar = tqdm(total=cfg.steps, initial=step, desc=f"{mcfg.mixer}", file=sys.stderr)

    def batch(s: int) -> tuple[torch.Tensor, torch.Tensor]:
        starts = batch_starts(cfg.seed, s, cfg.batch_size, len(train_data), T)
        return get_batch(train_data, starts[rank * per_rank : (rank + 1) * per_rank], T, device)

    def lm_loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        with autocast(device, cfg.precision):
            _, loss = ddp_model(x, targets=y)
        return loss

    loss_val, first = float("nan"), step
    for step, loss_val, dt in training_steps(
        model, opt, sched, batch=batch, loss=lm_loss, start=first, end=end,
        grad_clip=cfg.grad_clip, sync=torch.cuda.synchronize if device.type == "cuda" else None,
    ):  # fmt: skip
        tokens_seen += cfg.batch_size * T
        elapsed += dt
        tps = tokens_seen / elapsed if elapsed > 0 else 0.0
        if bar is not None:
            bar.update(1)
            bar.set_postfix(loss=f"{loss_val:.3f}", tok_s=f"{tps:,.0f}")
        if step % cfg.log_every == 0 or step == end:
            emit(
                "train", step=step, loss=loss_val, lr=sched.get_last_lr()[0],
                tokens_seen=tokens_seen, tokens_per_s=tps, step_seconds=dt,
            )  # fmt: skip
        # the final evaluation below supersedes a periodic one at the last step
        final_next = cfg.final_eval and step >= cfg.steps
        if cfg.eval_every and step % cfg.eval_every == 0 and not final_next:
            lo, hi = ds.span("val", cfg.eval_batches * cfg.eval_batch_size * T)
            quick = evaluate_bpc(
                model, ds.data, lo, hi, context=T, batch_size=cfg.eval_batch_size,
                device=device, precision=cfg.precision, rank=rank, world=world,
            )  # fmt: skip
            emit("eval", step=step, split="val", partial=True, **quick)
        if cfg.ckpt_every and step % cfg.ckpt_every == 0:
            save()
    if bar is not None:
        bar.close()
    save()
    tps = tokens_seen / elapsed if elapsed > 0 else 0.0
    val = test = None
    eval_bytes: dict[str, int] = {}
    every_byte = False
    if cfg.final_eval and step >= cfg.steps:
        res = {}
        every_byte = True
        for split in ("val", "test"):
            lo, hi = ds.span(split, cfg.eval_max_bytes)
            res[split] = evaluate_bpc(
                model, ds.data, lo, hi, context=T, batch_size=cfg.eval_batch_size,
                device=device, precision=cfg.precision, rank=rank, world=world,
            )  # fmt: skip
            partial = hi < ds.bounds[split][1]
            every_byte = every_byte and not partial
            eval_bytes[split] = res[split]["bytes"]
            emit("eval", step=step, split=split, partial=partial, **res[split])
        val, test = res["val"]["bpc"], res["test"]["bpc"]
    emit(
        "final", step=step, params=n_params, tokens_seen=tokens_seen, train_tokens_per_s=tps,
        loss=loss_val, val_bpc=val, test_bpc=test, data=ds.label, eval_bytes=eval_bytes,
        eval_every_byte=every_byte,
    )  # fmt: skip
    if log is not None:
        log.close()
    if distributed:
        import time

        import torch.distributed as dist

        dist.barrier()
        # A Gloo worker thread drops a finished collective's tensors (a Python decref: it
        # takes the GIL) just after the collective completes, and the process group's
        # destructor joins those threads holding the GIL: freed before they are done, the
        # two deadlock (two-process runs hung there, 2 of 8 full test runs; see pytorch
        # issue 56297). A pause releases the GIL so that they finish first.
        time.sleep(0.05)
        del ddp_model  # the reducer's hold on the group, dropped while the threads are idle
        if owns_group:
            dist.destroy_process_group()
    return TrainResult(
        params=n_params, tokens_seen=tokens_seen, steps=step, train_tokens_per_s=tps,
        final_loss=loss_val, val_bpc=val, test_bpc=test, data=ds.label,
        checkpoint=str(ckpt_path), eval_bytes=eval_bytes, eval_every_byte=every_byte,
    )  # fmt: skip
