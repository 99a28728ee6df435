"""The box C of a trained recall grid chosen on a validation split, not the test.

:func:`validation_split` draws a split of a run's task from a seed other than the
run's (so from streams the test split was not drawn from), and :func:`choose_box`
picks the box ``C`` on it, per seed and over seeds
(``benchmarks/box_on_validation.py``). What the memories select is measured on the
optimum by :mod:`svattn.lm.recall_memory`.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from svattn.lm.recall import RecallRun, build_task

__all__ = ["VALIDATION_SEED_OFFSET", "validation_split", "choose_box"]

#: A validation split of run seed ``s`` is drawn with seed ``s + VALIDATION_SEED_OFFSET``
#: (the test split with ``s``): independent streams of the task's generator.
VALIDATION_SEED_OFFSET = 1000


def validation_split(run: RecallRun, rows: int | None = None
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(inputs, targets, roles)`` of a validation split of ``run``'s task: the task
    drawn with seed ``run.seed + VALIDATION_SEED_OFFSET`` (its test part), as many rows
    as the run's test split unless ``rows`` is given. The run's own splits come from
    seed ``run.seed``: the validation rows are independent draws of the same task."""
    data = build_task(run).build(run.seed + VALIDATION_SEED_OFFSET)
    n = len(data.test_inputs) if rows is None else rows
    if n < 1 or n > len(data.test_inputs):
        raise ValueError(f"rows must be in [1, {len(data.test_inputs)}], got {rows!r}")
    return data.test_inputs[:n], data.test_targets[:n], data.test_roles[:n]


def choose_box(scores: dict[float, dict[int, float]]) -> dict:
    """The box with the best validation accuracy, per seed and over seeds.

    Parameters
    ----------
    scores : dict
        ``{C: {seed: validation accuracy}}``; every box must have the same seeds.

    Returns
    -------
    dict
        ``per_seed`` (``{seed: C}``, the best box of that seed's models), ``overall``
        (the box of the best mean over seeds) and ``ties`` (seeds, or ``"overall"``,
        where another box scored the same; the larger box is then taken, the one
        that constrains the memory least).

    Examples
    --------
    >>> choose_box({0.25: {0: 0.8, 1: 0.9}, 0.125: {0: 0.95, 1: 0.85}})
    {'per_seed': {0: 0.125, 1: 0.25}, 'overall': 0.125, 'ties': []}
    """
    if not scores:
        raise ValueError("choose_box: no box scored")
    seeds = {C: sorted(s) for C, s in scores.items()}
    first = next(iter(seeds.values()))
    if any(s != first for s in seeds.values()):
        raise ValueError(f"choose_box: the boxes were scored on different seeds: {seeds}")
    boxes = sorted(scores, reverse=True)  # larger box first: taken on a tie
    ties: list = []

    def best(value) -> tuple[float, bool]:
        top = max(value(C) for C in boxes)
        winners = [C for C in boxes if math.isclose(value(C), top, rel_tol=0, abs_tol=1e-12)]
        return winners[0], len(winners) > 1

    per_seed = {}
    for s in first:
        per_seed[s], tied = best(lambda C, s=s: scores[C][s])
        if tied:
            ties.append(s)
    overall, tied = best(lambda C: float(np.mean([scores[C][s] for s in first])))
    if tied:
        ties.append("overall")
    return {"per_seed": per_seed, "overall": overall, "ties": ties}
