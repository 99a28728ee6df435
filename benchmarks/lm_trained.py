"""The 3.22M CharLM pair of the step benchmarks, freshly initialised or trained.

``ab_lm_step.py`` and ``profile_lm_step.py`` time the ``paper-3m`` preset with the softmax
mixer and with the hybrid. At initialisation every key of the hybrid's boundary
memories is a margin vector (the margin systems' worst case); with ``trained`` both
models are first trained ``train_steps`` steps on the enwik8 prefix (``../shared/data``,
else the shipped slice; AdamW at 1e-3, clipping at 1, the same batches for both) and
timed on its text. The weights are cached in the ``trained`` folder on first use, so
every later run (and both trees of an A/B) times the same weights: train them once
while the machine is busy, time on an idle one.
"""

from __future__ import annotations

import sys
from pathlib import Path

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "enwik8" / \
    "enwik8_prefix.bin"
BLOCK = 256


def text():
    """The enwik8 prefix as a uint8 array (the shipped slice where ../shared is absent)."""
    import numpy as np

    from svattn.data.enwik8 import slice_path

    return np.fromfile(SHARED if SHARED.exists() else slice_path(), dtype=np.uint8)


def text_batch(data, seed: int, step: int, batch: int):
    """``batch`` windows of ``BLOCK + 1`` bytes of ``data`` (int64), as training draws
    step ``step``'s batch."""
    import torch

    from svattn.lm.train import batch_starts

    starts = batch_starts(seed, step, batch, len(data), BLOCK)
    return torch.from_numpy(data[starts[:, None] + range(BLOCK + 1)].astype("int64"))


def train_step(model, opt, x):
    """One training step on ``x`` (B, BLOCK + 1): forward, backward, clipping at 1, AdamW;
    the loss (the step the benchmarks time)."""
    import torch

    _, loss = model(x[:, :-1], targets=x[:, 1:])
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return loss


def train_or_load(model, opt, mixer: str, folder: Path, train_steps: int, batch: int,
                  seed: int, data) -> None:
    """Load ``mixer``'s trained weights from ``folder``, or train and save them there."""
    import torch

    path = folder / f"{mixer}-steps{train_steps}-batch{batch}-seed{seed}.pt"
    if path.exists():
        model.load_state_dict(torch.load(path, weights_only=True))
        return
    for i in range(train_steps):
        loss = train_step(model, opt, text_batch(data, seed, i, batch))
        if (i + 1) % max(1, train_steps // 10) == 0:
            print(f"{mixer}: step {i + 1}/{train_steps} loss {loss.item():.3f}",
                  file=sys.stderr, flush=True)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(model.state_dict(), tmp)
    tmp.replace(path)  # a killed run leaves no half-written weights


def model_pair(hybrid_options: dict, *, seed: int, batch: int, trained: Path | None = None,
               train_steps: int = 200, mixers: tuple[str, ...] = ("softmax", "hybrid_sv")
               ) -> tuple[dict, object]:
    """``{mixer: (model, AdamW)}`` for ``mixers`` (softmax and the hybrid), and the batch
    to time (random bytes, or with ``trained`` a text batch the training did not draw)."""
    import torch

    from svattn.lm import CharLM, mixer_config, preset

    data = text() if trained else None
    models = {}
    for mixer in mixers:
        torch.manual_seed(seed)
        cfg = mixer_config(preset("paper-3m"), mixer,
                           hybrid_options if mixer == "hybrid_sv" else None)
        model = CharLM(cfg)
        models[mixer] = (model, torch.optim.AdamW(model.parameters(), lr=1e-3))
        if trained:
            train_or_load(*models[mixer], mixer, trained, train_steps, batch, seed, data)
    if trained:
        return models, text_batch(data, seed, train_steps + 1000, batch)
    g = torch.Generator().manual_seed(seed)
    return models, torch.randint(0, 256, (batch, BLOCK + 1), generator=g)


def describe(trained: Path | None, train_steps: int, batch: int) -> str:
    """The models' state, for the records."""
    if trained:
        return (f"trained {train_steps} steps of {batch} x {BLOCK} bytes on the enwik8 "
                "prefix, timed on its text")
    return "freshly initialised, timed on random bytes"
