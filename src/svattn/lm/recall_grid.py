"""Recall grids in resumable pieces, and the collector of their runs.

A grid (:class:`RecallGrid`) is the product task × length × mixer × width ×
learning rate × seed of :class:`~svattn.lm.recall.RecallRun` cells over a
shared base. :func:`run_grid` trains the cells one by one and writes one JSON
per finished cell, ``OUT/<run id>.json`` (atomically: a cell interrupted
midway leaves nothing, and is trained again next time); cells whose file
exists are skipped, so a grid runs in as many pieces as the budget allows
(``--only``, ``--limit``). :func:`collect` reads whatever cells exist and
writes one results file (``results/recall.json``): every record, the command
and the grid, and per (task, length, mixer, width) the learning rate with the
best mean test accuracy over seeds (zoology's sweep) with a 95 % t-interval
over seeds.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import platform
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
from scipy import stats

from svattn.lm.recall import (
    MODEL_NAME,
    RECALL_HYBRID,
    RecallRun,
    load_recall_model,
    save_cell_model,
    train_recall,
    train_recall_resumable,
)

__all__ = ["GRIDS", "RecallGrid", "cell_measures", "collect", "estimate_hours", "mean_interval",
           "parse_only", "restore", "run_grid", "select", "summarize"]

MIXER_ORDER = ("hybrid_sv", "sliding", "deltanet", "linear", "softmax")


@dataclass(frozen=True)
class RecallGrid:
    """A product of recall cells over a shared base.

    Attributes
    ----------
    name : str
    tasks, lengths, mixers, d_models, lrs, seeds : tuple
        The axes.
    base : dict
        Other :class:`RecallRun` fields, shared by every cell (steps, batch, data sizes,
        hybrid options, ...).
    per_task : dict
        Overrides of ``base`` per task (e.g. ``{"selective-copy": {"rope": True}}``).
    note : str
        What the grid is for.
    Cs : tuple of float
        Boxes of the hybrid, an axis of the ``hybrid_sv`` cells only (empty: the base's).
    save_models : bool
        Keep each cell's trained weights beside its record (``OUT/<id>.safetensors``).
    """

    name: str
    tasks: tuple[str, ...] = ("mqar",)
    lengths: tuple[int, ...] = (64,)
    mixers: tuple[str, ...] = MIXER_ORDER
    d_models: tuple[int, ...] = (64,)
    lrs: tuple[float, ...] = (1e-3,)
    seeds: tuple[int, ...] = (0,)
    base: dict = field(default_factory=dict)
    per_task: dict = field(default_factory=dict)
    note: str = ""
    Cs: tuple[float, ...] = ()
    save_models: bool = False

    def runs(self) -> list[RecallRun]:
        """Every cell, in axis order (task, length, width, mixer, C, lr, seed).

        ``Cs`` (when given) is an axis of the hybrid only: each ``hybrid_sv`` cell once
        per box ``C`` (its id says the box, :attr:`RecallRun.run_id`), every other mixer
        once, since no other state depends on ``C`` (the matched window counts the
        hybrid's tokens, not its box).

        Examples
        --------
        >>> g = RecallGrid("t", lengths=(64, 128), mixers=("sliding",), seeds=(0, 1))
        >>> [r.run_id for r in g.runs()][:2]
        ['mqar-T64-sliding-d64-lr0.001-s0', 'mqar-T64-sliding-d64-lr0.001-s1']
        >>> len(g.runs())
        4
        """
        out = []
        for task, T, d, mixer in itertools.product(self.tasks, self.lengths, self.d_models,
                                                   self.mixers):
            base = {**self.base, **self.per_task.get(task, {})}
            boxes = self.Cs if self.Cs and mixer == "hybrid_sv" else (None,)
            for C, lr, seed in itertools.product(boxes, self.lrs, self.seeds):
                cell = dict(base)
                if C is not None:
                    cell["hybrid"] = {**cell.get("hybrid", {}), "C": C}
                out.append(RecallRun(task=task, seq_len=T, mixer=mixer, d_model=d, lr=lr,
                                     seed=seed, **cell))
        return out

    def to_dict(self) -> dict:
        """Plain-data form (recorded in the results file)."""
        return asdict(self)


# The hybrid of the small grids: chunks of 16, C = 1/16, 16 carried support tokens, so
# the matched window (32 tokens) is shorter than every sequence of the grid.
SMALL_HYBRID = {"chunk": 16, "C": 1.0 / 16, "budget": 16}
# the measured slices' training settings (CPU, 2 shared cores)
SLICE_BASE = dict(steps=500, batch_size=32, num_train=16000, num_test=500,
                  hybrid=SMALL_HYBRID, task_options={"vocab_size": 128})
# the longer grids: 8x the slice's sequences (4,000 steps of 64)
LONG_BASE = dict(SLICE_BASE, steps=4000, batch_size=64, num_train=64000)
_SC = {"selective-copy": {"rope": True, "task_options": {"num_data": 8, "num_symbols": 8}}}

#: The named grids. ``quick``: the test suite's end-to-end run (seconds). ``slice``:
#: the first measured piece (MQAR, T = 64, d = 64); ``slice-128``: MQAR at T = 128, one
#: learning rate; ``slice-copy``: selective copy (T = 64, 128). ``full``: the issue's grid.
GRIDS: dict[str, RecallGrid] = {
    "quick": RecallGrid(
        "quick", tasks=("mqar", "selective-copy"), lengths=(32,), lrs=(3e-3,), seeds=(0, 1),
        base=dict(steps=6, batch_size=8, num_train=64, num_test=16, inspect_sequences=4,
                  hybrid={"chunk": 8, "C": 1.0 / 8, "budget": 8},
                  task_options={"vocab_size": 64}),
        per_task={"selective-copy": {"rope": True, "task_options": {"num_data": 4,
                                                                    "num_symbols": 4}}},
        note="end-to-end check of the machinery; the models do not learn in 6 steps"),
    "slice": RecallGrid(
        "slice", tasks=("mqar",), lengths=(64,), lrs=(1e-3, 3e-3), seeds=(0, 1, 2),
        base=SLICE_BASE,
        note="first measured piece (CPU, 2 shared cores): MQAR T = 64 (4 pairs), d = 64, "
             "vocabulary 128, 500 steps; far from converged"),
    "slice-128": RecallGrid(
        "slice-128", tasks=("mqar",), lengths=(128,), lrs=(1e-3,), seeds=(0, 1, 2),
        base=SLICE_BASE,
        note="MQAR T = 128 (8 pairs) at one learning rate for every mixer (the slice's "
             "lower one); far from converged"),
    "slice-128-lr3e-3": RecallGrid(
        "slice-128-lr3e-3", tasks=("mqar",), lengths=(128,), lrs=(3e-3,), seeds=(0, 1, 2),
        base=SLICE_BASE,
        note="slice-128's second learning rate (the collector picks the better per mixer)"),
    "slice-copy": RecallGrid(
        "slice-copy", tasks=("selective-copy",), lengths=(64, 128), lrs=(3e-3,),
        seeds=(0, 1, 2),
        base=dict(steps=400, batch_size=32, num_train=12800, num_test=500,
                  hybrid=SMALL_HYBRID),
        per_task=_SC,
        note="first trained selective-copy piece: 8 data tokens of 8 symbols, rotary "
             "positions, one learning rate; far from converged"),
    "long-64": RecallGrid(
        "long-64", tasks=("mqar",), lengths=(64,), mixers=("hybrid_sv", "sliding", "softmax"),
        lrs=(1e-3, 3e-3, 1e-2), seeds=(0, 1, 2),
        base=LONG_BASE,
        note="MQAR T = 64 trained 8x the slice's sequences (4,000 steps of 64): the slice's "
             "softmax reached 0.22, a 4,000-step probe 0.67; three of zoology's four "
             "learning rates for every mixer (the slice's better one first, then upward, "
             "the way the first results pointed); its own runs folder and results file, "
             "since its cell ids repeat the slice's"),
    "long-64-full": RecallGrid(
        "long-64-full", tasks=("mqar",), lengths=(64,), mixers=("hybrid_sv",),
        lrs=(3e-3,), seeds=(0, 1, 2),
        base=dict(LONG_BASE, hybrid={**SMALL_HYBRID, "policy": "full"}),
        note="diagnosis of long-64, not a competitor: the same hybrid with the 'full' "
             "policy (each boundary's memory over every earlier token, nothing cut to "
             "the budget; its state is not matched to the window), at the learning rate "
             "long-64's support-policy hybrid did best with; its own runs folder and "
             "results file (its cell ids repeat long-64's)"),
    "long-64-approximate": RecallGrid(
        "long-64-approximate", tasks=("mqar",), lengths=(64,), mixers=("hybrid_sv",),
        lrs=(3e-3,), seeds=(0, 1, 2),
        base=dict(LONG_BASE, hybrid={**SMALL_HYBRID, "finish": "approximate"}),
        note="control of long-64's hybrid retrained with the optimum finish: the same "
             "cells (lr 3e-3) with the paper's approximate finish on the current code "
             "(long-64's models trained with it on an earlier version); its own runs "
             "folder and results file (its cell ids repeat long-64's)"),
    "long-128": RecallGrid(
        "long-128", tasks=("mqar",), lengths=(128,), mixers=("hybrid_sv", "sliding", "softmax"),
        lrs=(1e-3, 3e-3), seeds=(0, 1, 2),
        base=LONG_BASE,
        note="MQAR T = 128 (8 pairs) trained as long-64 (4,000 steps of 64), two of "
             "long-64's learning rates (the best of each mixer there: 3e-3 for the "
             "hybrid, 1e-3 for the window and softmax; each mixer's other one run only "
             "as time allows, the collector reports the cells that exist); its own runs "
             "folder and results file"),
    "long-copy": RecallGrid(
        "long-copy", tasks=("selective-copy",), lengths=(64, 128), lrs=(3e-3,),
        seeds=(0, 1, 2),
        base=LONG_BASE,
        per_task=_SC,
        note="selective copy (8 data tokens of 8 symbols, rotary positions) trained as "
             "long-64 (4,000 steps of 64, 20x slice-copy's sequences), every mixer at "
             "slice-copy's one learning rate (no sweep: the same for all); its own runs "
             "folder, results file with the other longer grids"),
    "selection": RecallGrid(
        "selection", tasks=("selective-copy",), lengths=(128,), mixers=("hybrid_sv", "sliding"),
        lrs=(3e-3,), seeds=(0, 1, 2), Cs=(1.0 / 4, 1.0 / 8, 1.0 / 16),
        base=LONG_BASE, per_task=_SC, save_models=True,
        note="does a looser box let the trained memory select? long-copy's T = 128 cell "
             "(8 data tokens of 8 symbols, rotary positions, 4,000 steps of 64, lr 3e-3) "
             "with the hybrid's C in {1/4, 1/8, 1/16} (C forces at least 1/C tokens to "
             "carry weight), and the matched window once (its state counts tokens, not the "
             "box); each cell's weights kept for the compaction study"),
    "selection-approximate": RecallGrid(
        "selection-approximate", tasks=("selective-copy",), lengths=(128,),
        mixers=("hybrid_sv",), lrs=(3e-3,), seeds=(0, 1, 2), Cs=(1.0 / 4, 1.0 / 8, 1.0 / 16),
        base=dict(LONG_BASE, hybrid={**SMALL_HYBRID, "finish": "approximate"}), per_task=_SC,
        save_models=True,
        note="control of the selection grid retrained with the optimum finish: its hybrid "
             "cells with the paper's approximate finish on the current code (the selection "
             "grid's models trained with it on an earlier version); its own runs folder"),
    "full": RecallGrid(
        "full", tasks=("mqar", "selective-copy"), lengths=(64, 128, 256, 512, 1024),
        d_models=(64, 128), lrs=(3e-4, 1e-3, 3e-3, 1e-2), seeds=(0, 1, 2),
        base=dict(steps=2000, batch_size=32, num_train=64000, num_test=1000,
                  hybrid=SMALL_HYBRID),
        per_task={"mqar": {"task_options": {"vocab_size": 256}}, **_SC},
        note="the issue's grid: zoology's 4 learning rates, 3 seeds"),
}


def parse_only(text: str | None) -> dict[str, set[str]]:
    """``"task=mqar,seq_len=64|128"`` → ``{"task": {"mqar"}, "seq_len": {"64", "128"}}``.

    Examples
    --------
    >>> {k: sorted(v) for k, v in parse_only("mixer=sliding|softmax,seed=0").items()}
    {'mixer': ['sliding', 'softmax'], 'seed': ['0']}
    """
    if not text:
        return {}
    out: dict[str, set[str]] = {}
    known = set(RecallRun.__dataclass_fields__) | {"C"}  # C: the hybrid's box
    for part in text.split(","):
        if "=" not in part:
            raise ValueError(f"--only: expected FIELD=VALUE[|VALUE...], got {part!r}")
        key, vals = part.split("=", 1)
        if key not in known:
            raise ValueError(f"--only: {key!r} is not a RecallRun field ({sorted(known)})")
        out[key] = set(vals.split("|"))
    return out


def select(runs: Iterable[RecallRun], only: dict[str, set[str]] | None) -> list[RecallRun]:
    """The runs whose fields match ``only`` (:func:`parse_only`; floats as ``%g``).

    Examples
    --------
    >>> g = GRIDS["slice"]
    >>> len(select(g.runs(), parse_only("mixer=sliding,lr=0.003")))
    3
    >>> [r.run_id for r in select(GRIDS["selection"].runs(), parse_only("C=0.125,seed=1"))]
    ['selective-copy-T128-hybrid_sv-C0.125-d64-lr0.003-s1']
    """
    def ok(run: RecallRun) -> bool:
        d = {**run.to_dict(), "C": float(run.hybrid_options()["C"])}
        return all((f"{d[k]:g}" if isinstance(d[k], float) else str(d[k])) in v
                   for k, v in (only or {}).items())

    return [r for r in runs if ok(r)]


def run_grid(
    grid: RecallGrid,
    out: str | os.PathLike,
    *,
    only: dict[str, set[str]] | None = None,
    limit: int | None = None,
    command: str | None = None,
    log: Callable[[str], None] | None = None,
    ckpt_every: int | None = None,
) -> list[Path]:
    """Train the grid's unfinished cells; one ``OUT/<id>.json`` per finished cell.

    Parameters
    ----------
    grid : RecallGrid
    out : path
        Folder of the cell files (created).
    only : dict, optional
        Keep cells whose fields match (:func:`parse_only`).
    limit : int, optional
        Train at most this many cells in this call (a piece of the grid).
    command : str, optional
        Recorded in each cell file.
    log : callable, optional
        Progress lines.
    ckpt_every : int, optional
        Train each cell resumably (:func:`~svattn.lm.recall.train_recall_resumable`):
        a checkpoint in ``OUT/<id>/`` every ``ckpt_every`` steps, from which an
        interrupted cell continues on the next call (the same batches and steps).

    Returns
    -------
    list of Path
        The files written by this call (finished cells skipped).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    todo = select(grid.runs(), only)
    written: list[Path] = []
    for run in todo:
        if limit is not None and len(written) >= limit:
            break
        path = out / f"{run.run_id}.json"
        if path.exists():
            continue
        if log is not None:
            log(f"[recall] {run.run_id} ...")
        start = time.perf_counter()
        weights = out / f"{run.run_id}.safetensors" if grid.save_models else None
        if ckpt_every is None:  # progress every 5 % of steps
            rec = train_recall(run, log=log, model_path=weights)
        else:
            rec = train_recall_resumable(run, out / run.run_id, ckpt_every=ckpt_every,
                                         log=log, model_path=weights)
        rec.update(grid=grid.name, command=command, wall_seconds=time.perf_counter() - start,
                   machine=platform.machine(), threads=_threads())
        if weights is not None:
            rec["model_file"] = weights.name
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(rec, indent=1, allow_nan=False) + "\n")
        os.replace(tmp, path)  # a cell is finished only once its file is complete
        written.append(path)
        if log is not None:
            log(f"[recall] {run.run_id}: accuracy {rec['accuracy']:.3f} "
                f"({rec['wall_seconds']:.0f} s)")
    return written


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def mean_interval(values: Sequence[float], level: float = 0.95) -> dict:
    """Mean and t-interval over seeds: ``{"mean", "ci95": [lo, hi] or None, "n", "values"}``.

    Examples
    --------
    >>> d = mean_interval([0.5, 0.7, 0.6])
    >>> round(d["mean"], 3), [round(x, 3) for x in d["ci95"]]
    (0.6, [0.352, 0.848])
    >>> mean_interval([0.4])["ci95"] is None
    True
    """
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("mean_interval: no values")
    mean = float(x.mean())
    if x.size < 2:
        return {"mean": mean, "ci95": None, "n": 1, "values": x.tolist()}
    half = float(stats.t.ppf(0.5 + level / 2, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return {"mean": mean, "ci95": [mean - half, mean + half], "n": int(x.size),
            "values": x.tolist()}


def summarize(records: Iterable[dict]) -> dict:
    """Per cell (task, length, width, mixer): the best learning rate and its seeds.

    Returns
    -------
    dict
        ``cells``: list of ``{task, seq_len, d_model, mixer, best_lr, accuracy
        (mean_interval over seeds at best_lr), by_lr ({lr: mean accuracy}),
        state_floats, window, support_per_head (hybrid: mean over seeds and
        layers of the full-prefix memory's kept tokens per head), kept_max (hybrid:
        the most tokens a boundary memory of the support policy held, mean over
        seeds and layers), seeds}``;
        ``margins``: per (task, length, width) with both, hybrid − sliding at
        each one's best learning rate, paired by seed (mean_interval of the
        differences).
    """
    groups: dict[tuple, list[dict]] = {}
    for rec in records:
        r = rec["run"]
        groups.setdefault((r["task"], r["seq_len"], r["d_model"], r["mixer"], _box(r)),
                          []).append(rec)
    cells = []
    for (task, T, d, mixer, C), recs in sorted(groups.items(), key=lambda kv: (
            kv[0][0], kv[0][1], kv[0][2], _mixer_rank(kv[0][3]), -(kv[0][4] or 0.0))):
        by_lr: dict[float, list[dict]] = {}
        for rec in recs:
            by_lr.setdefault(rec["run"]["lr"], []).append(rec)
        means = {lr: float(np.mean([x["accuracy"] for x in rs])) for lr, rs in by_lr.items()}
        best = max(sorted(means), key=lambda lr: means[lr])
        chosen = sorted(by_lr[best], key=lambda x: x["run"]["seed"])
        support = [np.mean(layer["support_per_head"]) for x in chosen for layer in x["memory"]
                   if "support_per_head" in layer]
        kept = [layer["kept_max"] for x in chosen for layer in x["memory"]]
        measured = [cell_measures(x) for x in chosen]
        cells.append({
            "task": task, "seq_len": T, "d_model": d, "mixer": mixer, "C": C, "best_lr": best,
            "accuracy": mean_interval([x["accuracy"] for x in chosen]),
            "by_lr": {f"{lr:g}": m for lr, m in sorted(means.items())},
            "state_floats": chosen[0]["state_floats"], "window": chosen[0]["window"],
            "support_per_head": float(np.mean(support)) if support else None,
            "kept_max": float(np.mean(kept)) if kept else None,
            **{name: _mean_of(measured, name) for name in (
                "distinct_support_per_head", "data_mass", "data_share", "gate_mean")},
            "seeds": [x["run"]["seed"] for x in chosen],
            "step_seconds": float(np.median([x["step_seconds"] for x in chosen])),
        })
    margins = []
    index = {(c["task"], c["seq_len"], c["d_model"], c["mixer"], c["C"]): c for c in cells}
    for (task, T, d, mixer, C), c in index.items():
        other = index.get((task, T, d, "sliding", None))
        if mixer != "hybrid_sv" or other is None:
            continue
        a = dict(zip(c["seeds"], c["accuracy"]["values"], strict=True))
        b = dict(zip(other["seeds"], other["accuracy"]["values"], strict=True))
        common = sorted(set(a) & set(b))
        if common:
            margins.append({"task": task, "seq_len": T, "d_model": d, "C": C, "seeds": common,
                            "hybrid_minus_sliding": mean_interval([a[s] - b[s] for s in common])})
    return {"cells": cells, "margins": margins}


def _box(run: dict) -> float | None:
    """The hybrid's box ``C`` of a run's dict (None for other mixers)."""
    if run["mixer"] != "hybrid_sv":
        return None
    return float(run.get("hybrid", {}).get("C", RECALL_HYBRID["C"]))


def _mean_of(rows: list[dict], name: str) -> float | None:
    vals = [r[name] for r in rows if r.get(name) is not None]
    return float(np.mean(vals)) if vals else None


def cell_measures(rec: dict) -> dict:
    """What one cell's memory selects, measured by count, by distinct key and by weight.

    From the record's memory inspection (:func:`svattn.lm.recall.inspect_memory`), means
    over layers and heads (and per layer in ``layers``):

    * ``support_per_head``: tokens with ``alpha > 0``; exact copies each count.
    * ``distinct_support_per_head``: distinct key vectors among them (copies merged;
      None in records made before the measure existed).
    * ``mass_by_role``: the alpha mass on each role's tokens (alpha sums to 1 per head)
      against ``share_by_role``, that role's share of the memory's prefix; ``data_mass``
      and ``data_share`` are the data tokens' (selective copy).
    * ``gate_mean``: ``sigmoid(w_h)``, the weight each head gives its memory.

    Every other field of the row (``id``, ``mixer``, ``C``, ``seed``, ``accuracy``,
    ``command``) is copied from the record; a cell without a hybrid memory gets None
    measures.

    Examples
    --------
    >>> layer = {"layer": 0, "gate": [0.5, 0.7], "boundary": 10,
    ...          "support_per_head": [4.0, 6.0], "distinct_support_per_head": [2.0, 3.0],
    ...          "alpha_by_role": {"data": [0.4, 0.6], "filler": [0.6, 0.4]},
    ...          "prefix_by_role": {"data": 1.0, "filler": 9.0}}
    >>> rec = {"id": "x", "accuracy": 0.9, "command": None, "memory": [layer],
    ...        "run": {"mixer": "hybrid_sv", "seed": 0, "hybrid": {"C": 0.25}}}
    >>> row = cell_measures(rec)
    >>> row["C"], row["data_mass"], row["data_share"], row["distinct_support_per_head"]
    (0.25, 0.5, 0.1, 2.5)
    """
    run = rec["run"]
    row = {"id": rec["id"], "mixer": run["mixer"], "C": _box(run), "seed": run["seed"],
           "accuracy": rec["accuracy"], "command": rec.get("command")}
    layers = []
    for m in rec.get("memory", []):
        if "alpha_by_role" not in m:
            continue
        start = float(m["boundary"])
        layers.append({
            "layer": m["layer"],
            "support_per_head": float(np.mean(m["support_per_head"])),
            "distinct_support_per_head": (float(np.mean(m["distinct_support_per_head"]))
                                          if "distinct_support_per_head" in m else None),
            "mass_by_role": {k: float(np.mean(v)) for k, v in m["alpha_by_role"].items()},
            "share_by_role": {k: float(v) / start for k, v in m["prefix_by_role"].items()},
            "gate_mean": float(np.mean(m["gate"])),
        })
    row["layers"] = layers
    row["support_per_head"] = _mean_of(layers, "support_per_head")
    row["distinct_support_per_head"] = _mean_of(layers, "distinct_support_per_head")
    roles = sorted({k for x in layers for k in x["mass_by_role"]})
    row["mass_by_role"] = {k: float(np.mean([x["mass_by_role"].get(k, 0.0) for x in layers]))
                           for k in roles} if layers else {}
    row["share_by_role"] = {k: float(np.mean([x["share_by_role"].get(k, 0.0)
                                              for x in layers])) for k in roles} if layers else {}
    row["data_mass"] = row["mass_by_role"].get("data")
    row["data_share"] = row["share_by_role"].get("data")
    row["gate_mean"] = _mean_of(layers, "gate_mean")
    return row


def _mixer_rank(mixer: str) -> int:
    return MIXER_ORDER.index(mixer) if mixer in MIXER_ORDER else len(MIXER_ORDER)


def collect(runs: str | os.PathLike | Sequence[str | os.PathLike],
            into: str | os.PathLike | None = None, *, command: str | None = None,
            models_into: str | os.PathLike | None = None) -> dict:
    """Read every finished cell under ``runs`` (one folder, or several) and (with
    ``into``) write the results file.

    Returns
    -------
    dict
        ``{"command", "collected_from" (the folders, comma-separated), "grids" (the grid
        configs met), "records" (sorted by id, loss curves kept), "summary"
        (:func:`summarize`), "train_seconds" (total of the cells' wall time)}``.

    ``models_into`` (a folder): copy each cell's kept weights (``model_file``, grids
    with ``save_models``) there, beside the results file; a resumable cell of a grid
    without them has its last step's weights (``<id>/model.pt``) written there as a
    cell model, and its record names it.

    Raises
    ------
    FileNotFoundError
        If a folder of ``runs`` does not exist, or a cell's weights are gone.
    ValueError
        If they hold no finished cell, or two folders hold a cell of the same id
        (grids whose ids repeat — a slice and its longer-trained twin — are collected
        into files of their own).
    """
    folders = [Path(runs)] if isinstance(runs, (str, os.PathLike)) else [Path(r) for r in runs]
    if not folders:
        raise ValueError("runs: give at least one folder")
    for folder in folders:
        if not folder.is_dir():
            raise FileNotFoundError(f"runs: no such folder: {folder}")
    records, where = [], {}
    for folder in folders:
        for p in sorted(folder.glob("*.json")):
            rec = json.loads(p.read_text())
            if rec["id"] in where:
                raise ValueError(f"runs: cell {rec['id']} is in both {where[rec['id']]} and "
                                 f"{folder}: collect grids whose ids repeat separately")
            where[rec["id"]] = folder
            records.append(rec)
    if not records:
        raise ValueError("runs: " + ", ".join(map(str, folders))
                         + " holds no finished cell (<run id>.json)")
    records.sort(key=lambda r: r["id"])
    names = sorted({r.get("grid") for r in records if r.get("grid")})
    result = {
        "command": command,
        "collected_from": ", ".join(map(str, folders)),
        "grids": {n: GRIDS[n].to_dict() for n in names if n in GRIDS},
        "cells_per_grid": {n: sum(r.get("grid") == n for r in records) for n in names},
        "cells_in_grid": {n: len(GRIDS[n].runs()) for n in names if n in GRIDS},
        "train_seconds": float(sum(r.get("wall_seconds", 0.0) for r in records)),
        "summary": summarize(records),
        "cells": [cell_measures(r) for r in records],
        "records": records,
    }
    if models_into is not None:  # the cells' kept weights beside the results file
        import shutil

        dest = Path(models_into)
        dest.mkdir(parents=True, exist_ok=True)
        for rec in records:
            if rec.get("model_file"):
                src = where[rec["id"]] / rec["model_file"]
                if not src.exists():
                    raise FileNotFoundError(f"runs: {rec['id']} names {src}, which is gone")
                shutil.copyfile(src, dest / rec["model_file"])
            elif (where[rec["id"]] / rec["id"] / MODEL_NAME).exists():
                # a resumable cell of a grid without save_models: its final weights
                # (the run folder's model.pt), kept as the cell model a kept grid writes
                rec["model_file"] = _keep_final_weights(where[rec["id"]] / rec["id"], rec,
                                                        dest)
        result["models_in"] = str(dest)
    if into is not None:
        into = Path(into)
        into.parent.mkdir(parents=True, exist_ok=True)
        tmp = into.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=1, allow_nan=False) + "\n")
        os.replace(tmp, into)
    return result


def _keep_final_weights(folder: Path, rec: dict, dest: Path) -> str:
    """Write a resumable cell's last-step weights (``folder/model.pt``) into ``dest`` as
    a cell model (:func:`svattn.lm.recall.save_cell_model`); returns its file name.

    Raises
    ------
    ValueError
        If the weights are not the finished run's (their step is not the run's steps).
    """
    model, _, ck = load_recall_model(folder / MODEL_NAME)
    run = RecallRun.from_dict(rec["run"])
    if ck["step"] != run.steps:
        raise ValueError(f"runs: {folder / MODEL_NAME} holds step {ck['step']}, "
                         f"not the run's last ({run.steps})")
    name = f"{rec['id']}.safetensors"
    save_cell_model(model, run, dest / name)
    return name


def restore(results: str | os.PathLike, out: str | os.PathLike) -> list[Path]:
    """Write a collected results file's cells back as ``OUT/<id>.json`` (and their kept
    weights, from the folder ``collect(models_into=...)`` recorded), so that
    :func:`run_grid` into ``OUT`` skips them: a grid goes on across machines and
    sessions from its committed results. Cells already in ``OUT`` are left as they are.

    Returns
    -------
    list of Path
        The cell files written.
    """
    import shutil

    res = json.loads(Path(results).read_text())
    if not isinstance(res, dict) or not isinstance(res.get("records"), list):
        raise ValueError(f"{results}: not a collected recall results file (no records)")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    models = Path(res["models_in"]) if res.get("models_in") else None
    written = []
    for rec in res["records"]:
        path = out / f"{rec['id']}.json"
        if path.exists():
            continue
        if rec.get("model_file"):
            src = None if models is None else models / rec["model_file"]
            if src is None or not src.exists():
                raise FileNotFoundError(f"{results}: cell {rec['id']}'s weights "
                                        f"{rec['model_file']} are not in {models}")
            shutil.copyfile(src, out / rec["model_file"])
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(rec, indent=1, allow_nan=False) + "\n")
        os.replace(tmp, path)
        written.append(path)
    return written


def with_base(grid: RecallGrid, **base) -> RecallGrid:
    """``grid`` with fields of its base replaced (e.g. fewer steps for a timing run)."""
    return replace(grid, base={**grid.base, **base})


def estimate_hours(grid: RecallGrid, timings: Iterable[dict]) -> dict:
    """Training hours of ``grid`` on one core from measured ``step_seconds``.

    ``timings`` are rows ``{task, seq_len, d_model, mixer, step_seconds}`` (``svattn
    recall time``); a cell without a timing of its task falls back to the same
    (length, width, mixer) of another task (the step cost hardly depends on the task).

    Returns
    -------
    dict
        ``total`` hours, ``by_mixer`` and ``by_length`` hours, ``missing`` cells.

    Examples
    --------
    >>> g = RecallGrid("t", lengths=(64,), mixers=("sliding",), seeds=(0, 1),
    ...                base={"steps": 1800})
    >>> estimate_hours(g, [{"task": "mqar", "seq_len": 64, "d_model": 64,
    ...                     "mixer": "sliding", "step_seconds": 1.0}])["total"]
    1.0
    """
    exact, loose = {}, {}
    for t in timings:
        exact[(t["task"], t["seq_len"], t["d_model"], t["mixer"])] = t["step_seconds"]
        loose[(t["seq_len"], t["d_model"], t["mixer"])] = t["step_seconds"]
    total, missing = 0.0, 0
    by_mixer: dict[str, float] = {}
    by_length: dict[str, float] = {}
    for run in grid.runs():
        sec = exact.get((run.task, run.seq_len, run.d_model, run.mixer),
                        loose.get((run.seq_len, run.d_model, run.mixer)))
        if sec is None:
            missing += 1
            continue
        h = sec * run.steps / 3600
        total += h
        by_mixer[run.mixer] = by_mixer.get(run.mixer, 0.0) + h
        by_length[str(run.seq_len)] = by_length.get(str(run.seq_len), 0.0) + h
    return {"total": total, "by_mixer": by_mixer, "by_length": by_length, "missing": missing}
