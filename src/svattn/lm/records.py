"""Result records of finished runs, written by the tools (never by hand).

``svattn train CONFIG --record results/lm.json`` appends its run when it ends;
``svattn collect RUN_DIR ... --into results/lm.json`` appends runs that already
ended. Both build the record with :func:`run_record` from the run's own files
(``out_dir/log.jsonl``), so each record carries the exact command that trained
it and its effective config. ``svattn eval CHECKPOINT --record FILE`` appends
an ``"eval"`` record (:func:`eval_record`) of a re-scoring.

A record replaces one with the same ``id`` (re-running a run updates it).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from svattn.lm.model import positions_of

__all__ = ["run_record", "eval_record", "append_records", "read_records"]


def _read_log(run_dir: Path) -> list[dict[str, Any]]:
    log = run_dir / "log.jsonl"
    if not log.is_file():
        raise FileNotFoundError(f"RUN_DIR: {run_dir} has no log.jsonl (not an svattn train run)")
    try:
        return [json.loads(line) for line in log.read_text().splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise ValueError(f"RUN_DIR: {log} is not a JSONL training log ({exc})") from None


def run_record(run_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """The ``"bpc"`` record of a finished ``svattn train`` run, from its log.

    Parameters
    ----------
    run_dir : path-like
        The run's ``out_dir``.

    Returns
    -------
    dict
        ``id`` (``"bpc/<folder name>"``), ``kind``, ``mixer``, ``mixer_options``,
        ``positions``, ``params``, ``tokens_seen``, ``steps``, ``val_bpc``,
        ``test_bpc``, ``eval_bytes``, ``eval_every_byte``, ``eval_context``,
        ``train_tokens_per_s``, ``seed``, ``data``, ``command``, ``config``
        (and ``variant`` for our variants of the paper's layer).

    Raises
    ------
    FileNotFoundError
        If ``run_dir`` has no ``log.jsonl``.
    ValueError
        If the run has not finished (no ``"final"`` record) or its log does not
        record the command that started it (runs before svattn recorded it).
    """
    run_dir = Path(run_dir)
    recs = _read_log(run_dir)
    configs = [r for r in recs if r.get("kind") == "config"]
    finals = [r for r in recs if r.get("kind") == "final"]
    if not configs or not finals:
        raise ValueError(f"RUN_DIR: {run_dir} has not finished (no 'final' record in its log)")
    cfg, final = configs[0], finals[-1]  # the first config record holds the starting command
    if not cfg.get("command"):
        raise ValueError(f"RUN_DIR: the log of {run_dir} does not record the command that "
                         "trained it (a run made before svattn recorded it); re-run it")
    step = final["step"]
    evals = {r["split"]: r for r in recs if r.get("kind") == "eval" and r["step"] == step}
    c, mc = configs[-1]["config"], configs[-1]["model_config"]
    opts = mc["mixer_options"]
    # our variants of the paper's layer are named, so reports never pair them as the paper's
    variant = {"variant": f"lookback{opts['lookback']}"} if opts.get("lookback") else {}
    return {
        "id": f"bpc/{run_dir.resolve().name}",
        "kind": "bpc",
        "mixer": c["mixer"],
        **variant,
        "mixer_options": opts,
        "positions": positions_of(mc),
        "params": final["params"],
        "tokens_seen": final["tokens_seen"],
        "steps": step,
        "val_bpc": final["val_bpc"],
        "test_bpc": final["test_bpc"],
        "eval_bytes": {s: e["bytes"] for s, e in evals.items()},
        "eval_every_byte": bool(evals) and not any(e.get("partial") for e in evals.values()),
        "eval_context": mc["block_size"],
        "train_tokens_per_s": round(final["train_tokens_per_s"], 1),
        "seed": c["seed"],
        "data": final["data"],
        "command": " ; ".join(dict.fromkeys(r["command"] for r in configs if r.get("command"))),
        "config": c,
    }


def eval_record(checkpoint: str | os.PathLike[str], result: dict[str, Any], *,
                command: str) -> dict[str, Any]:
    """An ``"eval"`` record: one split of a checkpoint scored by ``svattn eval``.

    Its BPC is stored as ``eval_bpc`` (not ``bpc``), so reports that pair training
    runs do not count it as another run.

    Examples
    --------
    >>> scored = {"split": "val", "bpc": 2.5, "bytes": 10, "context": 256, "step": 3,
    ...           "data": "enwik8 prefix"}
    >>> rec = eval_record("runs/a/ckpt.pt", scored, command="svattn eval")
    >>> rec["id"], rec["eval_bpc"]
    ('eval/a/val/T256', 2.5)
    """
    run = Path(checkpoint).parent.name or "."
    return {
        "id": f"eval/{run}/{result['split']}/T{result['context']}",
        "kind": "eval",
        "checkpoint": str(checkpoint),
        "split": result["split"],
        "step": result["step"],
        "eval_bpc": result["bpc"],
        "bytes": result["bytes"],
        "context": result["context"],
        "data": result["data"],
        "command": command,
    }


def read_records(path: str | os.PathLike[str]) -> list[Any]:
    """The JSON list of records in ``path`` (``[]`` when it does not exist yet).

    Raises
    ------
    ValueError
        If ``path`` is a directory, not JSON, or not a JSON list.
    """
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"--record/--into: {path} is a directory; give a JSON file")
    if not path.exists():
        return []
    try:
        old = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"--record/--into: {path} is not a JSON file ({exc})") from None
    if not isinstance(old, list):
        raise ValueError(f"--record/--into: {path} holds a JSON {type(old).__name__}, "
                         "not the list of records")
    return old


def append_records(records: list[dict[str, Any]], path: str | os.PathLike[str]) -> list[str]:
    """Add records to the JSON list in ``path`` (created if absent), replacing those
    with the same ``id``; written atomically.

    Returns
    -------
    list of str
        The ids that replaced an older record.

    Raises
    ------
    ValueError
        If ``path`` exists but does not hold a JSON list.
    """
    path = Path(path)
    old = read_records(path)
    ids = {r["id"] for r in records}
    replaced = [r["id"] for r in old if isinstance(r, dict) and r.get("id") in ids]
    kept = [r for r in old if not (isinstance(r, dict) and r.get("id") in ids)]
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(kept + records, indent=2) + "\n")
    os.replace(tmp, path)
    return replaced
