"""Timing training steps side by side: interleaved rounds and aten-call counts
(``bench_train_step.py``, ``ab_lm_step.py``)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def interleaved_medians(steps: dict[str, Callable[[], None]], rounds: int, per_round: int
                        ) -> tuple[dict[str, float], dict[str, float]]:
    """Median seconds per step of each of ``steps``, the models taking turns round by
    round (load from other processes hits them alike): wall clock, and this process's
    CPU time (less disturbed by time slicing on a shared machine)."""
    wall: dict[str, list[float]] = {m: [] for m in steps}
    cpu: dict[str, list[float]] = {m: [] for m in steps}
    for _ in range(rounds):
        for m, step in steps.items():
            t0, c0 = time.perf_counter(), time.process_time()
            for _ in range(per_round):
                step()
            wall[m].append((time.perf_counter() - t0) / per_round)
            cpu[m].append((time.process_time() - c0) / per_round)
    return ({m: statistics.median(v) for m, v in wall.items()},
            {m: statistics.median(v) for m, v in cpu.items()})


def aten_calls(step: Callable[[], None]) -> tuple[int, int]:
    """aten ops of one call of ``step``: (launched, all events).

    *Launched*: aten events whose parent is not an aten op (what Python and autograd
    call); *all*: every aten event, the ops those call inside included.
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    aten = [e for e in prof.events() if e.name.startswith("aten::")]
    top = [e for e in aten if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::")]
    return len(top), len(aten)
