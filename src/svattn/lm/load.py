"""A trained model read back from its file: ``svattn train``'s ``ckpt.pt``, a recall
run's ``ckpt.pt`` / ``model.pt``, a recall grid cell's safetensors model.

:func:`load_checkpoint_model` returns the model (CPU, eval mode), its training config
and the checkpoint's dict; :func:`load_checkpoint_for_eval` adds the corpus to score it
on. Nothing in a file is unpickled (:func:`svattn.lm.checkpoint.read_checkpoint`), and
a model is built only once its config is known to fit the tensors stored beside it, so
a crafted file can neither run code nor allocate what it names.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import torch

from svattn.data.enwik8 import Enwik8, load_enwik8, slice_path
from svattn.lm.checkpoint import CheckpointError, UnsafeCheckpointError, read_checkpoint
from svattn.lm.model import CharLM, CharLMConfig
from svattn.lm.train_config import TrainConfig

__all__ = ["RECALL_CELL", "RECALL_FORMAT", "load_checkpoint_for_eval", "load_checkpoint_model",
           "read_cell_model"]

RECALL_CELL = "svattn.RecallCell"  # a grid cell's safetensors model (recall.save_cell_model)
RECALL_FORMAT = "svattn.RecallCheckpoint"  # svattn.lm.recall.RECALL_CKPT (recall imports this)


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
