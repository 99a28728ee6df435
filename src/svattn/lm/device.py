"""Where a run computes, and in what precision: its rank among ``torchrun``'s
processes, the device that its ``device`` setting names, and the bf16 autocast that its
``precision`` turns on. :func:`svattn.lm.train.train` and
:func:`svattn.lm.bpc.evaluate_bpc` share them.
"""

from __future__ import annotations

import os

import torch

__all__ = ["autocast", "dist_env", "run_device"]


def dist_env() -> tuple[int, int, int]:
    """``(rank, local_rank, world)`` from torchrun's environment (``RANK``,
    ``LOCAL_RANK``, ``WORLD_SIZE``); ``(0, 0, 1)`` in a single process."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    return int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0")), world


def run_device(device: str, local_rank: int) -> torch.device:
    """The torch device that a run's ``device`` setting (``"auto"``, ``"cpu"``,
    ``"cuda"``) names for the process of local rank ``local_rank``.

    Raises
    ------
    ValueError
        For ``"cuda"`` without a usable CUDA device, or another setting.
    """
    if device == "auto":
        return torch.device(f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device: 'cuda' asked, but this torch build has no usable CUDA "
                             f"device (torch {torch.__version__}); use 'cpu' or 'auto'")
        return torch.device(f"cuda:{local_rank}")
    if device == "cpu":
        return torch.device("cpu")
    raise ValueError(f"device must be 'auto', 'cpu' or 'cuda', got {device!r}")


def autocast(device: torch.device, precision: str):
    """The autocast context of a run's ``precision`` on ``device``: bf16 for ``"bf16"``,
    and for ``"auto"`` on a CUDA device that supports it; off for ``"fp32"`` and
    ``"fp64"``."""
    if precision == "auto":
        use = device.type == "cuda" and torch.cuda.is_bf16_supported()
    elif precision == "bf16":
        use = True
    elif precision in ("fp32", "fp64"):
        use = False
    else:
        raise ValueError(f"precision must be 'auto', 'bf16', 'fp32' or 'fp64', got {precision!r}")
    return torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=use)
