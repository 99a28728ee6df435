"""Trained recall: a small token model on a :mod:`svattn.tasks` task, scored at its queries.

One run (:class:`RecallRun`) trains a :class:`~svattn.lm.model.CharLM` (token
embedding → ``n_layer`` pre-norm blocks with the chosen mixer → tied head;
the same model as the language model, with the task's vocabulary) on one
task at one sequence length, and reports the accuracy at the scored
positions of the test split (the queries of MQAR, the output slots of
selective copy), as zoology does.

* **Loss**: cross-entropy at the scored positions only; the head is applied
  to those hidden states only (:meth:`CharLM.hidden`), so a large vocabulary
  costs little.
* **Optimiser and loop**: ``svattn train``'s (:mod:`svattn.lm.loop`): AdamW
  (weight decay on matrices only), linear warmup (``warmup_frac`` of the steps)
  then cosine decay to ``lr / 10``, gradient clipping at norm 1
  (:meth:`RecallRun.optim_config`). Batches are drawn from the training split in
  an order seeded with the run's seed, reshuffled each epoch.
* **Mixers and matched state**: ``hybrid_sv`` takes ``hybrid`` (defaults
  :data:`RECALL_HYBRID`); ``sliding`` gets the window :func:`matched_window`
  whose ``state_floats`` equal the hybrid's (``budget + L`` tokens for the
  ``"support"`` policy); ``deltanet`` and ``linear`` their fixed state;
  ``softmax`` keeps every token (the unmatched reference). Every run records
  ``state_floats`` per layer with the one definition of
  :mod:`svattn.mixers.base`.
* **Inspection** (``hybrid_sv``): for a few test sequences, which positions
  each layer's SV memory keeps (``alpha > 0``) at its last boundary, by role
  (key, value, query, filler, data, marker), with the memory re-solved exactly
  (:mod:`svattn.lm.recall_memory`), and the gate of every head (:func:`inspect_memory`).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field, fields

import numpy as np
import torch
import torch.nn.functional as F

from svattn.lm.checkpoint import read_checkpoint
from svattn.lm.load import RECALL_CELL, RECALL_FORMAT, read_cell_model
from svattn.lm.loop import OptimConfig, build_optimizer, optimizer_step, training_steps
from svattn.lm.model import CharLM, CharLMConfig
from svattn.lm.recall_memory import hybrid_layers, optimum_selection
from svattn.mixers import MIXERS
from svattn.tasks import IGNORE, TASKS, MQARConfig, RecallData, SelectiveCopyConfig

__all__ = [
    "RECALL_HYBRID",
    "ROPE_MIXERS",
    "RecallRun",
    "build_task",
    "distinct_kept",
    "inspect_memory",
    "evaluate_recall",
    "load_cell_model",
    "load_recall_model",
    "matched_window",
    "model_config",
    "query_accuracy",
    "save_cell_model",
    "kv_pairs_for",
    "step_seconds",
    "train_checkpointed",
    "train_recall",
    "train_recall_resumable",
]

#: The hybrid's memory in the recall runs: chunks of 32, C = 1/16 (>= 16 tokens carry
#: weight), at most 32 support tokens carried, the training solver of docs/design.md §5.
RECALL_HYBRID: dict = {
    "chunk": 32,
    "C": 1.0 / 16,
    "budget": 32,
    "policy": "support",
    "max_iter": 20,
    "refine": 0,
    "ridge_steps": 0,
}

#: Mixers that take rotary positions (``rope=True`` is passed to these only).
ROPE_MIXERS = ("softmax", "sliding", "hybrid_sv")

#: Vocabulary of the MQAR runs unless ``task_options`` sets one (zoology: 8192; smaller
#: here so that CPU runs learn within a few hundred steps).
MQAR_VOCAB = 512


def kv_pairs_for(seq_len: int) -> int:
    """MQAR key-value pairs at a length: ``max(4, T / 16)`` (4 at 64 … 64 at 1024).

    Examples
    --------
    >>> [kv_pairs_for(t) for t in (64, 128, 256, 512, 1024)]
    [4, 8, 16, 32, 64]
    """
    return max(4, seq_len // 16)


@dataclass(frozen=True)
class RecallRun:
    """One cell of a recall grid: task, length, mixer, width, learning rate, seed.

    ``task_options`` are fields of the task's config (e.g. ``num_kv_pairs``;
    defaults: :func:`kv_pairs_for` pairs and a vocabulary of 512 for MQAR);
    ``hybrid`` overrides :data:`RECALL_HYBRID`.
    """

    task: str = "mqar"
    seq_len: int = 64
    mixer: str = "hybrid_sv"
    d_model: int = 64
    lr: float = 1e-3
    seed: int = 0
    n_layer: int = 2
    n_head: int = 2
    steps: int = 400
    batch_size: int = 32
    num_train: int = 8000
    num_test: int = 500
    task_options: dict = field(default_factory=dict)
    hybrid: dict = field(default_factory=dict)
    rope: bool = False  # rotary positions in the mixers of ROPE_MIXERS
    weight_decay: float = 0.1
    warmup_frac: float = 0.1
    inspect_sequences: int = 16  # test sequences the memory inspection reads

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"RecallRun.task must be one of {sorted(TASKS)}, got {self.task!r}")
        if self.mixer not in MIXERS:
            raise ValueError(f"RecallRun.mixer must be one of {sorted(MIXERS)}, got "
                             f"{self.mixer!r}")
        for name in ("seq_len", "d_model", "n_layer", "n_head", "steps", "batch_size",
                     "num_train", "num_test"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"RecallRun.{name} must be an int >= 1, got {val!r}")
        if not (isinstance(self.lr, int | float) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"RecallRun.lr must be a finite number > 0, got {self.lr!r}")
        unknown = set(self.hybrid) - set(RECALL_HYBRID) - {"lookback", "gate_init", "kernel",
                                                           "gamma", "finish"}
        if unknown:
            raise ValueError(f"RecallRun.hybrid has unknown keys {sorted(unknown)}")

    @property
    def run_id(self) -> str:
        """A file-name-safe id, unique within a grid.

        Examples
        --------
        >>> RecallRun(seq_len=256, mixer="sliding", lr=3e-3, seed=2).run_id
        'mqar-T256-sliding-d64-lr0.003-s2'

        A hybrid whose box differs from :data:`RECALL_HYBRID`'s ``C`` says so:

        >>> RecallRun(hybrid={"C": 0.25}).run_id
        'mqar-T64-hybrid_sv-C0.25-d64-lr0.001-s0'
        """
        C = self.hybrid.get("C", RECALL_HYBRID["C"])
        box = f"-C{C:g}" if self.mixer == "hybrid_sv" and C != RECALL_HYBRID["C"] else ""
        return (f"{self.task}-T{self.seq_len}-{self.mixer}{box}-d{self.d_model}"
                f"-lr{self.lr:g}-s{self.seed}")

    def to_dict(self) -> dict:
        """Plain-data form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> RecallRun:
        """Inverse of :meth:`to_dict`; unknown keys are refused by name."""
        unknown = set(d) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"RecallRun: unknown fields {sorted(unknown)}")
        return cls(**d)

    def hybrid_options(self) -> dict:
        """:data:`RECALL_HYBRID` with this run's overrides."""
        return {**RECALL_HYBRID, **self.hybrid}

    def optim_config(self) -> OptimConfig:
        """The run's AdamW and schedule (:mod:`svattn.lm.loop`): warmup over
        ``warmup_frac`` of the steps (at least 1), cosine to ``lr / 10``, betas
        ``(0.9, 0.99)``, clipping at 1."""
        return OptimConfig(lr=self.lr, min_lr=self.lr / 10,
                           warmup=max(1, int(self.warmup_frac * self.steps)), steps=self.steps,
                           weight_decay=self.weight_decay, betas=(0.9, 0.99), grad_clip=1.0)


def build_task(run: RecallRun) -> MQARConfig | SelectiveCopyConfig:
    """The task config of a run (its length, split sizes and ``task_options``)."""
    opts = dict(run.task_options)
    if run.task == "mqar":
        opts.setdefault("num_kv_pairs", kv_pairs_for(run.seq_len))
        opts.setdefault("vocab_size", MQAR_VOCAB)
    return TASKS[run.task](seq_len=run.seq_len, num_train=run.num_train,
                           num_test=run.num_test, **opts)


def matched_window(hybrid_options: dict, d_model: int, n_heads: int, seq_len: int) -> int:
    """The sliding window whose ``state_floats(seq_len)`` equals the hybrid's.

    Both count keys and values, ``2·(tokens)·D`` floats per layer
    (:mod:`svattn.mixers.base`), so the window is the hybrid's state in tokens:
    ``budget + lookback + L`` for the ``"support"`` policy (at most ``T``).

    Examples
    --------
    >>> matched_window({"chunk": 32, "C": 1 / 16, "budget": 32}, 64, 2, 1024)
    64
    >>> matched_window({"chunk": 32, "C": 1 / 16, "budget": 32}, 64, 2, 48)
    48
    """
    hyb = MIXERS["hybrid_sv"](d_model, n_heads, **hybrid_options)
    floats = hyb.state_floats(seq_len)
    window, rest = divmod(floats, 2 * d_model)
    if rest:  # pragma: no cover - the definitions changed
        raise ValueError(f"hybrid state of {floats} floats is not a whole number of tokens")
    if MIXERS["sliding"](d_model, n_heads, window=window).state_floats(seq_len) != floats:
        raise ValueError("matched_window: the sliding window's state_floats differs")
    return window


def model_config(run: RecallRun, vocab_size: int) -> CharLMConfig:
    """The :class:`CharLMConfig` of a run: its mixer with matched options."""
    hyb = run.hybrid_options()
    hyb["chunk"] = min(hyb["chunk"], run.seq_len)
    if run.mixer == "hybrid_sv":
        options = hyb
    elif run.mixer == "sliding":  # only the matched baseline needs the hybrid's state
        options = {"window": matched_window(hyb, run.d_model, run.n_head, run.seq_len)}
    elif run.mixer in ("deltanet", "linear"):
        options = {"chunk_size": 64}
    else:
        options = {}
    return CharLMConfig(
        vocab_size=vocab_size, block_size=run.seq_len, n_layer=run.n_layer, n_embd=run.d_model,
        n_head=run.n_head, bias=False, rope=run.rope and run.mixer in ROPE_MIXERS,
        mixer=run.mixer, mixer_options=options,
    )  # fmt: skip


def _scored(model: CharLM, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits at the scored positions ``[n, V]`` and their targets ``[n]``."""
    h = model.hidden(x)  # (B, T, D)
    mask = y != IGNORE
    return model.lm_head(h[mask]), y[mask]


@torch.no_grad()
def query_accuracy(model: CharLM, inputs: torch.Tensor, targets: torch.Tensor,
                   batch_size: int = 64) -> float:
    """Fraction of scored positions (targets not :data:`IGNORE`) whose argmax is the target.

    Examples
    --------
    >>> import torch
    >>> from svattn.lm.model import CharLMConfig
    >>> m = CharLM(CharLMConfig(vocab_size=8, block_size=4, n_layer=1, n_embd=8, n_head=1))
    >>> y = torch.full((2, 4), IGNORE); y[:, -1] = 3
    >>> 0.0 <= query_accuracy(m, torch.zeros(2, 4, dtype=torch.long), y) <= 1.0
    True
    """
    was = model.training
    model.eval()
    correct = total = 0
    for i in range(0, len(inputs), batch_size):
        logits, tgt = _scored(model, inputs[i : i + batch_size], targets[i : i + batch_size])
        correct += int((logits.argmax(-1) == tgt).sum())
        total += int(tgt.numel())
    model.train(was)
    if total == 0:
        raise ValueError("query_accuracy: no scored position (every target is IGNORE)")
    return correct / total


@torch.no_grad()
def inspect_memory(model: CharLM, inputs: torch.Tensor, roles: torch.Tensor) -> list[dict]:
    """What each hybrid layer's SV memory keeps at the optimum, by role of the kept positions.

    The memory of each layer's **last boundary** over every earlier position (the
    ``"full"`` policy's memory) is re-solved exactly by
    :func:`svattn.lm.recall_memory.optimum_selection` (a float64 forward with the hybrid
    layers in exact mode, then the certified solver on the float64 keys; the oracle's
    answer where the certified solver refuses a memory), never read off the model's own
    training solver. The training forward itself is run once for what its
    ``"support"`` policy kept and cut (``kept_max``, ``truncated``).

    Returns
    -------
    list of dict, one per hybrid layer with a boundary
        ``support_per_head`` (mean tokens with ``alpha > 0`` per head over the
        sequences), ``distinct_support_per_head`` (the same with exact copies merged),
        ``kept_by_role`` (mean kept tokens of each role, summed over heads, per
        sequence), ``share_by_role`` (fraction of kept tokens of each role),
        ``prefix_by_role`` (tokens of each role in the prefix), ``alpha_by_role``
        (alpha mass of each role, per head), ``gate`` (``sigmoid(w_h)`` per head),
        ``kept_max`` and ``truncated`` (from the training forward), ``solver``
        (which exact solver the figures are from) and ``exact_forward`` (sequences the
        exact path ran, and those it refused).
    """
    layers = hybrid_layers(model)
    if not layers:
        return []
    was = model.training
    model.eval()
    try:
        model.hidden(inputs)
    finally:
        model.train(was)
    seen = [{"layer": i, "gate": torch.sigmoid(m.gate).tolist(), "kept_max": m.kept_,
             "truncated": m.truncated_} for i, m in enumerate(layers)]
    got = optimum_selection(model, inputs, roles)
    by_layer = {x["layer"]: x for x in got["layers"]}
    out = []
    for rec in seen:
        x = by_layer.get(rec["layer"])
        if x is None:  # no boundary before the last chunk: nothing is kept
            out.append({**rec, "boundary": 0, "support_per_head": [0.0] * len(rec["gate"])})
            continue
        name = "memory" if "memory" in x["by_solver"] else "oracle"
        m = x["by_solver"][name]
        kept = {r: float(sum(v)) for r, v in m["count_by_role"].items()}
        total = sum(kept.values())
        out.append({**rec, "boundary": x["boundary"], "solver": name,
                    "exact_forward": {k: got["forward"][k] for k in ("exact",
                                                                      "optimum_fallback")},
                    "support_per_head": m["support_per_head"],
                    "distinct_support_per_head": m["distinct_support_per_head"],
                    "kept_by_role": kept,
                    "share_by_role": {r: v / total if total else 0.0 for r, v in kept.items()},
                    "prefix_by_role": {r: v * x["boundary"]
                                       for r, v in x["share_by_role"].items()},
                    "alpha_by_role": m["mass_by_role"]})
    return out


def distinct_kept(keys: torch.Tensor, kept: torch.Tensor) -> torch.Tensor:
    """Distinct key vectors among the kept tokens: support with exact copies merged.

    A memory whose prefix repeats one token (a filler) holds exact copies of its key;
    each copy carries weight, so counting tokens counts the copies. Copies are merged
    by exact equality of the key vectors the memory was solved on.

    Parameters
    ----------
    keys : Tensor (B, H, T, D)
    kept : bool Tensor (B, H, T)

    Returns
    -------
    Tensor (B, H) long

    Examples
    --------
    >>> k = torch.tensor([[[[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [2.0, 2.0]]]])
    >>> distinct_kept(k, torch.tensor([[[True, True, True, False]]])).tolist()
    [[2]]
    """
    if keys.shape[:3] != kept.shape:
        raise ValueError(f"distinct_kept: keys {tuple(keys.shape)} and kept "
                         f"{tuple(kept.shape)} disagree on (B, H, T)")
    B, H = kept.shape[:2]
    out = torch.zeros(B, H, dtype=torch.long)
    for b in range(B):
        for h in range(H):
            rows = keys[b, h][kept[b, h]]
            out[b, h] = 0 if rows.shape[0] == 0 else torch.unique(rows, dim=0).shape[0]
    return out


def _state_floats(model: CharLM, seq_len: int) -> int:
    return int(model.blocks[0].mix.state_floats(seq_len))


def _recall_loss(model: CharLM):
    """The loss of a recall batch: cross-entropy at the scored positions only."""
    def loss(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        logits, tgt = _scored(model, x, y)
        return F.cross_entropy(logits.float(), tgt)
    return loss


class _EpochBatches:
    """Batches of a run's training rows: a seeded random order, reshuffled when the
    next batch would run past its end (the rows left over are skipped that epoch).

    ``order`` and ``pos`` (and the generator's state) are what a checkpoint keeps.
    """

    def __init__(self, data: RecallData, batch_size: int, generator: torch.Generator):
        self.data, self.batch_size, self.gen = data, batch_size, generator
        self.n = len(data.train_inputs)
        self.order, self.pos = torch.randperm(self.n, generator=generator), 0

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        if self.pos + self.batch_size > self.n:  # a new epoch
            self.order, self.pos = torch.randperm(self.n, generator=self.gen), 0
        idx = self.order[self.pos : self.pos + self.batch_size]
        self.pos += self.batch_size
        return self.data.train_inputs[idx], self.data.train_targets[idx]


def _training_setup(run: RecallRun, mcfg: CharLMConfig, data: RecallData):
    """The seeded model, its AdamW and schedule (:meth:`RecallRun.optim_config`) and
    the batches: the same for a run trained at once or in checkpointed pieces."""
    torch.manual_seed(run.seed)
    model = CharLM(mcfg)
    opt, sched = build_optimizer(model, run.optim_config())
    return model, opt, sched, _EpochBatches(data, run.batch_size,
                                            torch.Generator().manual_seed(run.seed))


def train_recall(run: RecallRun, *, data: RecallData | None = None, log=None,
                 model_path=None) -> dict:
    """Train one run and evaluate it; the record a grid cell writes.

    Parameters
    ----------
    run : RecallRun
    data : RecallData, optional
        The task's splits (default ``build_task(run).build(run.seed)``).
    log : callable, optional
        ``log(str)`` for progress lines.
    model_path : path, optional
        Where to write the trained weights (:func:`save_cell_model`; read back by
        :func:`load_cell_model`).

    Returns
    -------
    dict
        ``id``, ``run`` (the config), ``task`` (the task config), ``model`` (the
        model config), ``params``, ``state_floats`` (per layer), ``window``
        (sliding only), ``accuracy`` (test), ``train_accuracy`` (on as many
        training sequences), ``final_loss``, ``loss_curve`` (``[step, loss]``
        pairs), ``step_seconds`` (median), ``train_seconds``, ``memory``
        (:func:`inspect_memory`; empty unless ``hybrid_sv``), ``torch`` (version).
    """
    task = build_task(run)
    data = task.build(run.seed) if data is None else data
    mcfg = model_config(run, data.vocab_size)
    model, opt, sched, batches = _training_setup(run, mcfg, data)
    curve, times = [], []
    every = max(1, run.steps // 20)
    loss_val = float("nan")
    for step, loss_val, seconds in training_steps(
        model, opt, sched, batch=batches, loss=_recall_loss(model), start=0, end=run.steps,
        grad_clip=run.optim_config().grad_clip, finite=run.run_id,
    ):  # fmt: skip
        times.append(seconds)
        if step % every == 0 or step == run.steps:
            curve.append([step, loss_val])
            if log is not None:
                log(f"{run.run_id}: step {step}/{run.steps} loss {loss_val:.3f}")
    return _cell_record(run, task, data, mcfg, model, loss_val=loss_val, curve=curve,
                        step_seconds=float(np.median(times)), train_seconds=float(np.sum(times)),
                        model_path=model_path)


def _cell_record(run: RecallRun, task, data: RecallData, mcfg: CharLMConfig, model: CharLM, *,
                 loss_val: float, curve: list, step_seconds: float, train_seconds: float,
                 model_path=None) -> dict:
    """The record of a trained cell (:func:`train_recall`'s return value): test and
    train accuracy, the memory inspection, the weights written to ``model_path``."""
    acc = query_accuracy(model, data.test_inputs, data.test_targets)
    m = min(len(data.train_inputs), len(data.test_inputs))
    train_acc = query_accuracy(model, data.train_inputs[:m], data.train_targets[:m])
    k = min(run.inspect_sequences, len(data.test_inputs))
    memory = inspect_memory(model, data.test_inputs[:k], data.test_roles[:k])
    if model_path is not None:
        save_cell_model(model, run, model_path)
    layers = hybrid_layers(model)
    return {
        "id": run.run_id,
        "run": run.to_dict(),
        "task": task.to_dict(),
        "model": mcfg.to_dict(),
        "params": model.num_params(),
        "state_floats": _state_floats(model, run.seq_len),
        "window": mcfg.mixer_options.get("window"),
        "solver": repr(layers[0].solver) if layers else None,
        "accuracy": acc,
        "train_accuracy": train_acc,
        "final_loss": loss_val,
        "loss_curve": curve,
        "step_seconds": step_seconds,
        "train_seconds": train_seconds,
        "memory": memory,
        "torch": torch.__version__,
    }


def train_recall_resumable(run: RecallRun, folder, *, ckpt_every: int = 200, log=None,
                           model_path=None) -> dict:
    """:func:`train_recall` through :func:`train_checkpointed` in ``folder``: the same
    batches and steps, resumable from ``folder/ckpt.pt`` when interrupted.

    Returns :func:`train_recall`'s record, with two differences: ``loss_curve`` holds
    the losses of the checkpoint steps (every ``ckpt_every``: the same steps as
    :func:`train_recall`'s when ``ckpt_every = steps / 20``), and ``step_seconds`` is
    the mean (``train_seconds / steps``), not the median; ``resumed_from_step`` says
    where this call started.
    """
    import json
    from pathlib import Path

    folder = Path(folder)
    ckpt = folder / CKPT_NAME
    start = int(read_checkpoint(ckpt)["step"]) if ckpt.exists() else 0
    train_checkpointed(run, folder, ckpt_every=ckpt_every, log=log)
    model, _, ck = load_recall_model(folder / MODEL_NAME)
    steps = {}
    for line in (folder / LOG_NAME).read_text().splitlines():
        row = json.loads(line)
        steps[row["step"]] = row["loss"]  # a step logged twice (a resumed piece): the last
    curve = [[s, steps[s]] for s in sorted(steps)]
    task = build_task(run)
    data = task.build(run.seed)
    rec = _cell_record(run, task, data, model.cfg, model, loss_val=curve[-1][1], curve=curve,
                       step_seconds=float(ck["train_seconds"]) / run.steps,
                       train_seconds=float(ck["train_seconds"]), model_path=model_path)
    rec.update(step_seconds_kind="mean", resumed_from_step=start,
               checkpoints=str(folder))
    return rec


def step_seconds(run: RecallRun, *, steps: int = 3, warm: int = 1) -> float:
    """Median seconds of one training step of ``run``'s model (forward, backward, AdamW).

    Times ``steps`` steps after ``warm`` untimed ones on one batch of the task.
    """
    task = build_task(run)
    rows = max(run.batch_size, 1)
    data = TASKS[run.task](**{**task.to_dict(), "num_train": rows, "num_test": 1}).build(0)
    torch.manual_seed(run.seed)
    model = CharLM(model_config(run, data.vocab_size))
    opt, _ = build_optimizer(model, run.optim_config())
    x, y = data.train_inputs[: run.batch_size], data.train_targets[: run.batch_size]
    loss = _recall_loss(model)
    times = []
    for i in range(warm + steps):  # the step alone: no schedule step, no clipping
        t0 = time.perf_counter()
        optimizer_step(model, opt, None, loss(x, y), grad_clip=0.0)
        if i >= warm:
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


# ---------------------------------------------------------------------------- checkpoints
RECALL_CKPT = RECALL_FORMAT
CKPT_NAME, MODEL_NAME, LOG_NAME = "ckpt.pt", "model.pt", "log.jsonl"


def train_checkpointed(run: RecallRun, out, *, ckpt_every: int = 250,
                       stop_after: int | None = None, command: str | None = None,
                       log=None) -> dict:
    """:func:`train_recall`'s loop, resumable: ``OUT/ckpt.pt`` every ``ckpt_every`` steps.

    A checkpoint holds the model, optimiser, scheduler, the batch order and position,
    the run and the task (a ``torch.save`` dict like ``svattn train``'s ``ckpt.pt``:
    ``model``, ``model_config``, ``step``, plus ``run``). Calling again with the same
    ``run`` and ``out`` continues from it, drawing the same batches an uninterrupted
    run draws. Each checkpoint also appends ``{"step", "loss", "accuracy"}`` (test
    accuracy) to ``OUT/log.jsonl``. At the last step ``OUT/model.pt`` is written: the
    model only (:func:`load_recall_model` reads it, as it reads ``ckpt.pt``), with the
    run, the task, ``command``, the test accuracy and the training seconds.

    ``stop_after`` stops (with a checkpoint) once that step is reached. Returns the
    final record (``step``, ``accuracy``, ``train_seconds``, ``path``).
    """
    import json
    import os
    from pathlib import Path

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    task = build_task(run)
    data = task.build(run.seed)
    mcfg = model_config(run, data.vocab_size)
    model, opt, sched, batches = _training_setup(run, mcfg, data)
    step, seconds = 0, 0.0
    ckpt_path = out / CKPT_NAME
    if ckpt_path.exists():
        ck = read_checkpoint(ckpt_path)
        if ck.get("run") != run.to_dict():
            raise ValueError(f"{ckpt_path} holds another run ({ck.get('run')}); use another "
                             "out folder")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        sched.load_state_dict(ck["scheduler"])
        batches.gen.set_state(ck["rng"]["generator"])
        torch.set_rng_state(ck["rng"]["torch"])
        batches.order, batches.pos = ck["rng"]["order"], ck["rng"]["pos"]
        step, seconds = ck["step"], ck["train_seconds"]
    base = {"format": RECALL_CKPT, "model_config": mcfg.to_dict(), "run": run.to_dict(),
            "task": task.to_dict(), "command": command}

    def save(path, extra: dict) -> None:
        tmp = path.with_suffix(".tmp")
        torch.save({**base, "model": model.state_dict(), "step": step,
                    "train_seconds": seconds, **extra}, tmp)
        os.replace(tmp, path)

    def checkpoint(loss: float) -> float:
        acc = query_accuracy(model, data.test_inputs, data.test_targets)
        save(ckpt_path, {"optimizer": opt.state_dict(), "scheduler": sched.state_dict(),
                         "rng": {"generator": batches.gen.get_state(),
                                 "torch": torch.get_rng_state(), "order": batches.order,
                                 "pos": batches.pos}})
        with open(out / LOG_NAME, "a") as fh:
            fh.write(json.dumps({"step": step, "loss": loss, "accuracy": acc,
                                 "train_seconds": seconds}) + "\n")
        if log is not None:
            log(f"{run.run_id}: step {step}/{run.steps} loss {loss:.3f} test acc {acc:.3f} "
                f"({seconds:.0f} s)")
        return acc

    end = run.steps if stop_after is None else min(run.steps, stop_after)
    loss_val, acc, first = float("nan"), float("nan"), step
    for step, loss_val, dt in training_steps(
        model, opt, sched, batch=batches, loss=_recall_loss(model), start=first, end=end,
        grad_clip=run.optim_config().grad_clip, finite=run.run_id,
    ):  # fmt: skip
        seconds += dt
        if step % ckpt_every == 0 or step == end:
            acc = checkpoint(loss_val)
    if step == run.steps:
        if not math.isfinite(acc):
            acc = query_accuracy(model, data.test_inputs, data.test_targets)
        save(out / MODEL_NAME, {"accuracy": acc, "num_test": len(data.test_inputs)})
    return {"step": step, "accuracy": acc, "train_seconds": seconds,
            "path": str(out / (MODEL_NAME if step == run.steps else CKPT_NAME))}


def load_recall_model(path) -> tuple[CharLM, RecallRun, dict]:
    """Model (CPU, eval), run and raw dict of a :func:`train_checkpointed` file.

    Raises
    ------
    ValueError
        Not such a file (e.g. an ``svattn train`` checkpoint, which has no ``run``).
    """
    ck = read_checkpoint(path)
    if not isinstance(ck, dict) or ck.get("format") != RECALL_CKPT:
        raise ValueError(f"{path}: not a recall checkpoint of train_checkpointed "
                         f"(format {ck.get('format') if isinstance(ck, dict) else None!r})")
    model = CharLM(CharLMConfig(**ck["model_config"]))
    model.load_state_dict(ck["model"])
    model.eval()
    return model, RecallRun.from_dict(ck["run"]), ck


def save_cell_model(model: CharLM, run: RecallRun, path) -> None:
    """A grid cell's trained weights: safetensors, with the model config and the run as
    JSON metadata (no pickle: loading runs no code). Written atomically."""
    import json
    import os
    from pathlib import Path

    from safetensors.torch import save_model

    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    meta = {"format": RECALL_CELL, "model_config": json.dumps(model.cfg.to_dict()),
            "run": json.dumps(run.to_dict())}
    save_model(model, str(tmp), metadata=meta)  # tied weights stored once
    os.replace(tmp, path)


def load_cell_model(path) -> tuple[CharLM, RecallRun]:
    """Model (CPU, eval) and run of a :func:`save_cell_model` file.

    Raises
    ------
    ValueError
        If the file is not such a file.
    """
    import json

    model, meta = read_cell_model(path)
    return model, RecallRun.from_dict(json.loads(meta["run"]))


def evaluate_recall(model: CharLM, ck: dict, *, split: str = "test",
                    max_contexts: int | None = None) -> dict:
    """Query accuracy of a recall checkpoint's model on its own task (``svattn eval``).

    The task is rebuilt from the checkpoint's run (the same seed: the same contexts
    it was trained and tested on); ``max_contexts`` scores only the first ones.

    Raises
    ------
    ValueError
        ``split`` other than ``"train"`` / ``"test"``, or ``max_contexts`` < 1.
    """
    if split not in ("train", "test"):
        raise ValueError(f"--split: a recall task has the splits train and test, not {split!r}")
    if max_contexts is not None and max_contexts < 1:
        raise ValueError(f"max_contexts must be >= 1, got {max_contexts}")
    run = RecallRun.from_dict(ck["run"])
    data = build_task(run).build(run.seed)
    x, y = (data.test_inputs, data.test_targets) if split == "test" else \
        (data.train_inputs, data.train_targets)
    if max_contexts is not None:
        x, y = x[:max_contexts], y[:max_contexts]
    return {"split": split, "task": run.task, "run": run.run_id, "step": ck["step"],
            "accuracy": query_accuracy(model, x, y), "contexts": len(x),
            "context": int(x.shape[1])}
