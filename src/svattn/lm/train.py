"""Training and evaluation of :class:`~svattn.lm.model.CharLM` on byte-level enwik8.

* **Optimiser and loop** (:mod:`svattn.lm.loop`, shared with the recall runs):
  AdamW (weight decay on matrices only), linear warmup then cosine decay to
  ``min_lr`` (a :class:`torch.optim.lr_scheduler.LambdaLR`), gradient clipping by
  global norm (:meth:`TrainConfig.optim_config`); the loss is the LM loss at every
  position.
* **Config overrides**: :func:`apply_overrides` applies ``svattn train``'s
  ``--set KEY=VALUE`` to a config mapping before :meth:`TrainConfig.from_dict`.
* **Precision**: bf16 autocast where the device supports it (``precision="auto"``:
  CUDA with bf16; fp32 on CPU). The SV memory always solves in float32 or wider.
  ``precision="fp64"`` trains in float64, for checks that must not depend on
  float32 rounding (the DDP test compares 2 ranks with 1 process this way).
* **Data**: training windows of ``block_size + 1`` bytes at random offsets of the
  train split. The global batch of step ``s`` is drawn from a generator seeded
  with ``(seed, s)`` and rank ``r`` of ``W`` takes rows ``r·B/W .. (r+1)·B/W``, so
  the data position is just the step: resuming, and splitting a batch over
  ranks, see exactly the same windows.
* **Checkpoints** (``out_dir/ckpt.pt``): model, optimiser, scheduler, step,
  tokens seen, RNG states (torch, CUDA, numpy, python), the config. A resumed
  run continues bit-for-bit on CPU.
* **Distributed**: launched by ``torchrun`` (``WORLD_SIZE > 1`` in the
  environment), :class:`~torch.nn.parallel.DistributedDataParallel` over
  ``gloo`` on CPU or ``nccl`` on GPU; each rank takes ``batch_size / world``
  rows of the global batch, rank 0 writes the log and checkpoints.
* **Bits per character** (:func:`evaluate_bpc`): mean NLL in nats over **every
  byte** of a split, divided by ln 2. The split is cut into consecutive blocks
  of ``context`` bytes; each block's inputs are the ``context`` bytes before
  its targets (the first block starts with the byte before the split), so a
  byte is predicted from the 1..context bytes preceding it in its block.
* **Log**: ``out_dir/log.jsonl``, one JSON object per line (``"kind"``: ``"config"``,
  ``"train"``, ``"eval"``, ``"final"``).
"""

from __future__ import annotations

import copy
import json
import math
import os
import random
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from svattn.data.enwik8 import Enwik8, load_enwik8, slice_path
from svattn.lm.checkpoint import (
    CheckpointError,
    UnsafeCheckpointError,
    numpy_state_from_plain,
    numpy_state_to_plain,
    read_checkpoint,
)
from svattn.lm.configs import PRESETS, mixer_config, preset
from svattn.lm.loop import OptimConfig, build_optimizer, lr_lambda, training_steps
from svattn.lm.model import CharLM, CharLMConfig

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
]

CKPT = "ckpt.pt"
RECALL_CELL = "svattn.RecallCell"  # a grid cell's safetensors model (recall.save_cell_model)
RECALL_FORMAT = "svattn.RecallCheckpoint"  # svattn.lm.recall.RECALL_CKPT (recall imports this)
LOG = "log.jsonl"
CONFIG = "config.json"  # the effective config (file and --set overrides) and the command


@dataclass
class TrainConfig:
    """One training run. Load from JSON with :meth:`from_dict`.

    ``model`` is a preset name (``paper-3m``, ``10m``, ``tiny``); ``mixer`` and
    ``hybrid`` (options of the hybrid's memory; the ``sliding`` window is matched
    to them) pick the mixer; ``model_overrides`` change preset fields.
    """

    model: str = "tiny"
    mixer: str = "softmax"
    hybrid: dict = field(default_factory=dict)  # chunk, C, budget, policy, ...
    model_overrides: dict = field(default_factory=dict)  # e.g. {"block_size": 128}
    data: str | None = None  # enwik8 file (raw or .zip); None = the shipped slice
    out_dir: str = "runs/lm"
    seed: int = 0
    steps: int = 1000
    batch_size: int = 16  # global, over all ranks
    lr: float = 2e-3
    min_lr: float = 2e-4
    warmup: int = 100
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = 1.0
    # "auto" | "bf16" | "fp32" | "fp64" (float64 weights: for exactness checks, e.g. DDP)
    precision: str = "auto"
    device: str = "auto"  # "auto" | "cpu" | "cuda"
    threads: int = 0  # torch CPU threads (0: leave torch's default)
    log_every: int = 10
    eval_every: int = 0  # quick validation estimate every N steps (0: never)
    eval_batches: int = 8  # batches of that quick estimate
    ckpt_every: int = 0  # checkpoint every N steps (0: only at the end)
    final_eval: bool = True  # BPC on every byte of val and test at the end
    eval_batch_size: int = 32
    eval_max_bytes: int | None = None  # cap per split (None: every byte)
    progress: bool = True  # tqdm bar on rank 0

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Check every field's type and range, naming the field.

        Raises
        ------
        ValueError
            ``"steps must be an int >= 1, got 'ten'"`` and the like.
        """
        for name, kind in _FIELD_KINDS.items():
            _check_field(name, getattr(self, name), kind)
        betas = self.betas
        if (not isinstance(betas, tuple | list) or len(betas) != 2
                or not all(_is_number(b) and 0 <= b < 1 for b in betas)):
            raise ValueError(f"betas must be two numbers in [0, 1), got {betas!r}")
        for name, allowed in _CHOICES.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {list(allowed)}, got "
                                 f"{getattr(self, name)!r}")
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr ({self.min_lr}) must be <= lr ({self.lr})")

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        """Build from a dict, rejecting unknown keys and ill-typed values by name.

        Examples
        --------
        >>> TrainConfig.from_dict({"steps": "ten"})
        Traceback (most recent call last):
            ...
        ValueError: steps must be an int >= 1, got 'ten'
        """
        if not isinstance(d, dict):
            raise ValueError(f"a training config is a JSON object (a mapping of keys of "
                             f"TrainConfig), got a {type(d).__name__}")
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown training config keys {unknown}; known: {sorted(known)}")
        d = dict(d)
        if isinstance(d.get("betas"), list):
            d["betas"] = tuple(d["betas"])
        return cls(**d)

    @classmethod
    def from_json(cls, path: str | os.PathLike) -> TrainConfig:
        """Read a JSON config file."""
        with open(path) as fh:
            return cls.from_dict(json.load(fh))

    def model_config(self) -> CharLMConfig:
        """The :class:`CharLMConfig` this run trains.

        Raises
        ------
        ValueError
            Naming the config key at fault (``model``, ``model_overrides``,
            ``mixer`` or ``hybrid``).
        """
        try:
            shape = preset(self.model, **self.model_overrides)
        except TypeError as exc:  # an unknown CharLMConfig field
            raise ValueError(f"model_overrides: {exc}") from None
        except ValueError as exc:
            key = "model" if self.model not in PRESETS else "model_overrides"
            raise ValueError(f"{key}: {exc}") from None
        return mixer_config(shape, self.mixer, self.hybrid)

    def check_model(self) -> CharLMConfig:
        """:meth:`model_config`, and build the model once on the meta device, so that
        bad mixer options fail here (naming ``hybrid``) before a run starts.

        Returns
        -------
        CharLMConfig
        """
        mcfg = self.model_config()
        key = "hybrid" if self.mixer == "hybrid_sv" else "model_overrides"
        try:
            with torch.device("meta"):
                CharLM(mcfg)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{key}: {exc}") from None
        return mcfg

    def optim_config(self) -> OptimConfig:
        """The run's AdamW, schedule and clipping (:mod:`svattn.lm.loop`)."""
        return OptimConfig(lr=self.lr, min_lr=self.min_lr, warmup=self.warmup, steps=self.steps,
                           weight_decay=self.weight_decay, betas=tuple(self.betas),
                           grad_clip=self.grad_clip)

    def to_dict(self) -> dict:
        """Plain-data form (JSON-serialisable)."""
        return asdict(self)


# Field kinds of TrainConfig: "int>=1" etc.; "?" admits None. Checked by validate().
_FIELD_KINDS = {
    "model": "str", "mixer": "str", "hybrid": "dict", "model_overrides": "dict",
    "data": "str?", "out_dir": "str", "seed": "int>=0", "steps": "int>=1",
    "batch_size": "int>=1", "lr": "float>0", "min_lr": "float>=0", "warmup": "int>=0",
    "weight_decay": "float>=0", "grad_clip": "float>=0", "precision": "str", "device": "str",
    "threads": "int>=0", "log_every": "int>=1", "eval_every": "int>=0",
    "eval_batches": "int>=1", "ckpt_every": "int>=0", "final_eval": "bool",
    "eval_batch_size": "int>=1", "eval_max_bytes": "int>=1?", "progress": "bool",
}
_CHOICES = {"precision": ("auto", "bf16", "fp32", "fp64"), "device": ("auto", "cpu", "cuda")}


def _is_number(x) -> bool:
    return not isinstance(x, bool) and isinstance(x, int | float) and math.isfinite(x)


def _check_field(name: str, value, kind: str) -> None:
    if kind.endswith("?"):
        if value is None:
            return
        kind = kind[:-1]
    base, _, bound = kind.partition(">")
    ok = {
        "str": lambda v: isinstance(v, str),
        "dict": lambda v: isinstance(v, dict),
        "bool": lambda v: isinstance(v, bool),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": _is_number,
    }[base](value)
    if ok and bound:  # ">=1", ">=0" or ">0"
        strict, limit = not bound.startswith("="), float(bound.lstrip("="))
        ok = value > limit if strict else value >= limit
    if not ok:
        what = {"str": "a string", "dict": "a mapping (JSON object)", "bool": "true or false",
                "int": "an int", "float": "a number"}[base]
        if bound:
            what += (" >= " if bound.startswith("=") else " > ") + bound.lstrip("=")
        what += " or null" if kind != _FIELD_KINDS[name] else ""
        raise ValueError(f"{name} must be {what}, got {value!r}")


def _merge(base: dict, extra: dict) -> dict:
    """``base`` with ``extra`` merged in key by key (mappings recursively); an empty
    mapping in ``extra`` replaces (empties) its key."""
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, dict) and v and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def apply_overrides(config: dict, items: Sequence[str]) -> dict:
    """The config with ``--set KEY=VALUE`` overrides applied, in order.

    VALUE is parsed as JSON, else taken as a string. A dotted KEY names an entry
    of a mapping (created if absent); a mapping VALUE merges into the existing
    mapping key by key; ``{}`` empties it.

    Parameters
    ----------
    config : dict
        The config file's mapping (not modified).
    items : sequence of str
        The ``KEY=VALUE`` texts.

    Returns
    -------
    dict

    Raises
    ------
    ValueError
        If an item is not ``KEY=VALUE`` or a dotted KEY runs through a value
        that is not a mapping.

    Examples
    --------
    >>> cfg = {"steps": 10, "hybrid": {"chunk": 64, "C": 0.0625, "budget": 64}}
    >>> apply_overrides(cfg, ['hybrid={"C": 0.1}', "steps=20"])
    {'steps': 20, 'hybrid': {'chunk': 64, 'C': 0.1, 'budget': 64}}
    >>> apply_overrides(cfg, ["hybrid.budget=32"])["hybrid"]
    {'chunk': 64, 'C': 0.0625, 'budget': 32}
    >>> apply_overrides(cfg, ["hybrid={}"])["hybrid"]
    {}
    """
    out = copy.deepcopy(config)
    for item in items:
        key, sep, text = item.partition("=")
        parts = key.split(".")
        if not sep or not all(parts):
            raise ValueError(f"--set expects KEY=VALUE (KEY may be dotted: hybrid.C=0.1), "
                             f"got {item!r}")
        try:
            value = json.loads(text)
        except json.JSONDecodeError:
            value = text
        node = out
        for i, part in enumerate(parts[:-1]):
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ValueError(f"--set {key}: {'.'.join(parts[:i + 1])} is {child!r}, "
                                 "not a mapping")
            node = child
        last = parts[-1]
        if isinstance(value, dict) and value and isinstance(node.get(last), dict):
            node[last] = _merge(node[last], value)
        else:
            node[last] = value
    return out


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


def _autocast(device: torch.device, precision: str):
    if precision == "auto":
        use = device.type == "cuda" and torch.cuda.is_bf16_supported()
    elif precision == "bf16":
        use = True
    elif precision in ("fp32", "fp64"):
        use = False
    else:
        raise ValueError(f"precision must be 'auto', 'bf16', 'fp32' or 'fp64', got {precision!r}")
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use)


@torch.no_grad()
def evaluate_bpc(
    model: nn.Module,
    data: np.ndarray,
    start: int,
    stop: int,
    *,
    context: int,
    batch_size: int = 32,
    device: torch.device | str = "cpu",
    precision: str = "fp32",
    rank: int = 0,
    world: int = 1,
    per_position: bool = False,
) -> dict:
    """Bits per character of ``model`` on bytes ``data[start:stop]``, every byte counted.

    ``model(idx [B, T]) -> logits [B, T, 256]`` (or a ``(logits, loss)`` tuple).
    The bytes are cut into consecutive blocks of ``context`` targets; a block's
    inputs are the ``context`` bytes just before its targets (for the first block
    that includes ``data[start − 1]``; when ``start == 0`` the first byte is
    predicted from an empty context by feeding byte 0 itself as a dummy input
    and scoring from the second position — i.e. byte 0 is then not scored).
    With ``world > 1`` rank ``r`` scores blocks ``r, r + world, ...`` and the sums
    are all-reduced.

    With ``per_position`` the result also holds ``bpc_by_position``: the BPC of
    the bytes scored at each offset ``0 .. context − 1`` of their block (how
    loss falls with the context a byte gets; for ``hybrid_sv``, where in its
    chunk), and ``bytes_by_position``.

    Returns
    -------
    dict
        ``bpc``, ``nll_nats`` (mean), ``bytes`` (scored), ``context``; with
        ``per_position`` also ``bpc_by_position`` and ``bytes_by_position`` (lists).

    Examples
    --------
    >>> import numpy as np, torch
    >>> uniform = lambda idx: torch.zeros(*idx.shape, 256)
    >>> data = np.arange(1000, dtype=np.uint8) % 251
    >>> round(evaluate_bpc(uniform, data, 100, 1000, context=64)["bpc"], 9)
    8.0
    """
    if not (0 <= start < stop <= len(data)):
        raise ValueError(f"need 0 <= start < stop <= len(data), got {start}, {stop}, {len(data)}")
    device = torch.device(device)
    was_training = getattr(model, "training", False)
    if hasattr(model, "eval"):
        model.eval()
    first = max(start, 1)  # first scored byte
    blocks = list(range(first, stop, context))
    nll = torch.zeros((), dtype=torch.float64)
    count = torch.zeros((), dtype=torch.float64)
    pos_nll = torch.zeros(context, dtype=torch.float64)
    pos_count = torch.zeros(context, dtype=torch.float64)
    mine = blocks[rank::world]
    for i in range(0, len(mine), batch_size):
        group = mine[i : i + batch_size]
        lens = [min(context, stop - b) for b in group]
        T = max(lens)
        x = np.zeros((len(group), T), dtype=np.int64)
        y = np.full((len(group), T), -1, dtype=np.int64)
        for j, (b, n) in enumerate(zip(group, lens, strict=True)):
            x[j, :n] = data[b - 1 : b - 1 + n]
            y[j, :n] = data[b : b + n]
        xt, yt = torch.from_numpy(x).to(device), torch.from_numpy(y).to(device)
        with _autocast(device, precision):
            out = model(xt)
        logits = out[0] if isinstance(out, tuple) else out  # (B, T, V)
        loss = F.cross_entropy(
            logits.double().reshape(-1, logits.shape[-1]), yt.reshape(-1),
            ignore_index=-1, reduction="none",
        ).reshape(len(group), T)  # fmt: skip
        nll += loss.sum().cpu()
        count += float(sum(lens))
        if per_position:
            pos_nll[:T] += loss.sum(0).cpu()
            pos_count[:T] += (yt >= 0).sum(0).double().cpu()
    if world > 1:
        import torch.distributed as dist

        both = torch.cat([torch.stack([nll, count]), pos_nll, pos_count]).to(device)
        dist.all_reduce(both)
        both = both.cpu()
        nll, count = both[0], both[1]
        pos_nll, pos_count = both[2 : 2 + context], both[2 + context :]
    if was_training:
        model.train()
    mean = float(nll / count)
    out = {"bpc": mean / math.log(2), "nll_nats": mean, "bytes": int(count), "context": context}
    if per_position:
        by_pos = pos_nll / pos_count.clamp(min=1) / math.log(2)
        out["bpc_by_position"] = [  # None where no byte sat at that offset
            float(b) if c else None for b, c in zip(by_pos, pos_count, strict=True)
        ]
        out["bytes_by_position"] = [int(c) for c in pos_count]
    return out


# ------------------------------------------------------------------ the loop


def _dist_env() -> tuple[int, int, int]:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0")), world


def _device(cfg: TrainConfig, local_rank: int) -> torch.device:
    if cfg.device == "auto":
        return torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    if cfg.device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device: 'cuda' asked, but this torch build has no usable CUDA "
                             f"device (torch {torch.__version__}); use 'cpu' or 'auto'")
        return torch.device(f"cuda:{local_rank}")
    if cfg.device == "cpu":
        return torch.device("cpu")
    raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {cfg.device!r}")


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


def _not_a_checkpoint(path: str | os.PathLike, why: str) -> ValueError:
    return CheckpointError(f"checkpoint: {path} is not a checkpoint of svattn train (a "
                           f"ckpt.pt) or of a recall run (ckpt.pt, model.pt): {why}")


def _is_cell_model(path: str | os.PathLike) -> bool:
    """A safetensors file whose metadata names a recall cell model."""
    with open(path, "rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            return False
        size = int.from_bytes(head, "little")
        if not 2 <= size <= 1 << 24:
            return False
        try:
            header = json.loads(fh.read(size))
        except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
            return False
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return isinstance(meta, dict) and meta.get("format") == RECALL_CELL


def read_cell_model(path: str | os.PathLike) -> tuple[CharLM, dict]:
    """Model (CPU, eval) and metadata (``format``, ``model_config``, ``run``: JSON texts)
    of a recall grid cell's safetensors model (:func:`svattn.lm.recall.save_cell_model`;
    no pickle: reading runs no code).

    Raises
    ------
    ValueError
        If the file is not such a file.
    """
    from safetensors import safe_open
    from safetensors.torch import load_model

    try:
        with safe_open(str(path), framework="pt") as fh:
            meta = fh.metadata() or {}
            shapes = [fh.get_slice(k).get_shape() for k in fh.keys()]  # noqa: SIM118
    except Exception as exc:  # safetensors raises its own error types for a foreign file
        raise ValueError(f"{path}: not a recall cell model (not a safetensors file: "
                         f"{exc})") from None
    if meta.get("format") != RECALL_CELL:
        raise ValueError(f"{path}: not a recall cell model (format {meta.get('format')!r})")
    try:
        run = json.loads(meta["run"])
        if not isinstance(run, dict) or "steps" not in run:
            raise ValueError("its run is not an object with the run's steps")
        model = _model_of(json.loads(meta["model_config"]), shapes)
        load_model(model, str(path))
    except (KeyError, TypeError, ValueError, RuntimeError, RecursionError) as exc:
        raise ValueError(f"{path}: not a recall cell model svattn can read ("
                         f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]})") from None
    model.eval()
    return model, meta


def _model_of(config, shapes: list) -> CharLM:
    """The model ``config`` (a checkpoint's ``model_config``) describes, built only
    once it is known to fit the tensors stored beside it (``shapes``): a crafted config
    naming huge sizes would otherwise allocate them before any weight is compared."""
    if not isinstance(config, dict):
        raise TypeError(f"model_config must be an object, got {type(config).__name__}")
    cfg = CharLMConfig(**config)
    if cfg.n_layer > len(shapes):  # every layer stores tensors (bounds the build below)
        raise ValueError(f"model_config names {cfg.n_layer} layers, the file stores "
                         f"{len(shapes)} tensors")
    stored = sum(math.prod(s) for s in shapes)
    with torch.device("meta"):  # sizes only: nothing allocated
        need = sum(p.numel() for p in CharLM(cfg).parameters())
    if need > stored:
        raise ValueError(f"model_config describes {need:,} parameters, the file stores "
                         f"{stored:,} numbers")
    return CharLM(cfg)


def load_checkpoint_model(path: str | os.PathLike) -> tuple[CharLM, TrainConfig | None, dict]:
    """Model (on CPU, eval mode), training config and the raw checkpoint dict.

    Reads ``svattn train``'s ``ckpt.pt`` and a recall run's ``ckpt.pt`` / ``model.pt``
    (:func:`svattn.lm.recall.train_checkpointed`; its training config is None), with
    :func:`svattn.lm.checkpoint.read_checkpoint`: no Python object in the file is
    unpickled, so a crafted file cannot run code. A recall grid cell's safetensors
    model (:func:`svattn.lm.recall.save_cell_model`) is read too (its dict is
    ``format``, ``model_config``, ``run``, ``step`` = the run's steps).

    Raises
    ------
    ValueError
        If ``path`` is not such a checkpoint (an SV memory state, a truncated file,
        another pickle); :class:`~svattn.lm.checkpoint.UnsafeCheckpointError` (a
        ValueError) when it pickles objects (an earlier svattn's checkpoint: the
        message names ``svattn convert-checkpoint``).
    """
    if _is_cell_model(path):
        model, meta = read_cell_model(path)
        run = json.loads(meta["run"])  # an object with the steps (read_cell_model checks)
        return model, None, {"format": RECALL_FORMAT, "model_config": model.cfg.to_dict(),
                             "run": run, "step": run["steps"]}
    try:
        ckpt = read_checkpoint(path)
    except UnsafeCheckpointError:
        raise
    except CheckpointError as exc:
        raise _not_a_checkpoint(path, str(exc).removeprefix(f"{path}: ")) from None
    recall = isinstance(ckpt, dict) and ckpt.get("format") == RECALL_FORMAT
    need = ("model_config", "model", "step") if recall else ("config", "model_config",
                                                             "model", "step")
    missing = [k for k in need if not isinstance(ckpt, dict) or k not in ckpt]
    if missing:
        raise _not_a_checkpoint(path, f"it lacks {missing}")
    try:
        cfg = None if recall else TrainConfig.from_dict(ckpt["config"])
        weights = ckpt["model"]
        if not (isinstance(weights, dict)
                and all(isinstance(v, torch.Tensor) for v in weights.values())):
            raise TypeError("its model is not a dict of tensors")
        model = _model_of(ckpt["model_config"], [tuple(v.shape) for v in weights.values()])
        model.load_state_dict(weights)
    except (TypeError, ValueError, KeyError, RuntimeError) as exc:
        raise _not_a_checkpoint(path, f"its model does not build ({type(exc).__name__}: "
                                f"{' '.join(str(exc).split())[:300]})") from None
    model.eval()
    return model, cfg, ckpt


def load_checkpoint_for_eval(path: str | os.PathLike, data: str | os.PathLike | None = None
                             ) -> tuple[CharLM, TrainConfig, dict, Enwik8]:
    """:func:`load_checkpoint_model` and the corpus to score it on: ``data``, else the
    one the run trained on, else the shipped slice.

    Raises
    ------
    FileNotFoundError
        If ``path`` is not a file.
    """
    if not Path(path).is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    model, cfg, ckpt = load_checkpoint_model(path)
    if cfg is None:
        raise ValueError(f"checkpoint: {path} is a recall run's model (task "
                         f"{ckpt.get('run', {}).get('task')!r}), not a language model of "
                         "enwik8: score it on its task (svattn eval does)")
    data = data if data is not None else cfg.data
    return model, cfg, ckpt, load_enwik8(data if data is not None else slice_path())


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
    rank, local_rank, world = _dist_env()
    distributed = world > 1
    device = _device(cfg, local_rank)
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
        with _autocast(device, cfg.precision):
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
