"""What certified selection buys a trained model: compaction and forgetting in a stream.

A trained recall model (a cell of ``svattn recall run --grid selection``, its weights
kept as ``<id>.safetensors``) is streamed exactly (``CharLM.stream(full_policy=True)``:
every hybrid head keeps an incremental ``SVDDMemory`` of every finished chunk) over test
sequences of its task. For each sequence, after the last byte:

* per memory: tokens held, reserve tokens (alpha = 0: ``compact()`` drops them and
  the readout is unchanged for every query), distinct keys, and the roles (data,
  filler, marker) of the reserve and the support tokens;
* what compaction saves: tokens (and float64 bytes of keys + values) before and after
  ``compact()`` on a copy of each memory, with the readout of the last chunk's queries
  compared before and after (it must not move);
* what a forget costs: on two fresh streams of the same sequence, ``forget`` of one
  data token (selected: support in some memory) and of one filler token that is reserve
  in every memory (never selected), at nearby positions, timed with the rewind and
  replay parts the receipt records.

Equality with the fresh stream forces the replay of every byte after the span whatever
the span's weights: the local path and the next layer's keys read it. So a never-selected
span saves only what the memories' removals cost, which the record shows beside the
replay.

Run (from the repository root; writes the record with its command)::

    python benchmarks/selection_compaction.py --model runs/recall-selection/<id>.safetensors \
        --sequences 16 --json results/selection_compaction.json
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_records import add_conditions, portable_path, write_record  # noqa: E402
from svattn.lm.recall import build_task, load_cell_model  # noqa: E402
from svattn.tasks import ROLES  # noqa: E402

ROLE_NAMES = {v: k for k, v in ROLES.items()}


def _memories(stream):
    """``(layer, head, memory, ids)`` of every hybrid head's memory; ``ids[p]`` is the
    token id of held position ``p``."""
    for li, st in enumerate(stream.layers):
        for hd, mem in enumerate(st.mems):
            yield li, hd, mem, st.ids[hd]


def _distinct(keys: np.ndarray) -> int:
    return 0 if len(keys) == 0 else int(np.unique(keys, axis=0).shape[0])


def measure_sequence(model, seq: list[int], roles: list[int]) -> dict:
    """Compaction and the two forgets on one test sequence."""
    stream = model.stream(full_policy=True)
    stream.feed(bytes(seq))
    mems, selected = [], set()
    for li, hd, mem, ids in _memories(stream):
        pos_of = {tid: p for p, tid in enumerate(ids)}
        part = mem.partition()
        reserve = part["reserve"]
        support = part["margin"] + part["error"]
        selected.update(pos_of[t] for t in support)
        by_role = {"reserve": {}, "support": {}}
        for name, toks in (("reserve", reserve), ("support", support)):
            for t in toks:
                r = ROLE_NAMES.get(roles[pos_of[t]], "?")
                by_role[name][r] = by_role[name].get(r, 0) + 1
        keys = mem.keys  # (n, D), aligned with mem.ids (a copy: read once)
        row_of = {t: i for i, t in enumerate(mem.ids)}
        twin = mem.copy()
        q = keys[: min(8, len(mem))]  # probe queries: held keys
        before = twin.readout(q)
        dropped = twin.compact()
        after = twin.readout(q)
        width = keys.shape[1] + mem.values.shape[1]
        mems.append({"layer": li, "head": hd, "held": len(mem), "reserve": len(reserve),
                     "margin": len(part["margin"]), "error": len(part["error"]),
                     "distinct_keys": _distinct(keys),
                     "distinct_support_keys": _distinct(keys[[row_of[t] for t in support]]),
                     "roles": by_role, "compacted": len(dropped),
                     "bytes_before": 8 * width * len(mem), "bytes_after": 8 * width * len(twin),
                     "readout_change": float(np.max(np.abs(after - before))) if len(q) else 0.0})
    # the forgets: one data token that some memory selected, one filler none selected
    held = min(st.absorbed for st in stream.layers if st.mems)
    data = [p for p in range(held) if ROLE_NAMES.get(roles[p]) == "data" and p in selected]
    never = [p for p in range(held) if ROLE_NAMES.get(roles[p]) == "filler"
             and p not in selected]
    forgets = {}
    if data and never:
        p_data = data[0]
        p_never = min(never, key=lambda p: abs(p - p_data))
        for name, p in (("selected_data_token", p_data), ("never_selected_filler", p_never)):
            s = model.stream(full_policy=True)
            s.feed(bytes(seq))
            t0 = time.perf_counter()
            receipt = s.forget(p, p + 1).receipt
            total = time.perf_counter() - t0
            forgets[name] = {"position": p, "seconds": total,
                             "parts": receipt.repair.get("seconds", {}),
                             "bytes_replayed": len(seq) - p - 1}
    return {"memories": mems, "forgets": forgets, "length": len(seq)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", type=Path, required=True,
                        help="a cell's weights (<id>.safetensors of a grid with save_models)")
    parser.add_argument("--sequences", type=int, default=16,
                        help="test sequences streamed (default 16)")
    parser.add_argument("--json", type=Path, default=None, help="write the record here")
    add_conditions(parser)
    args = parser.parse_args(argv)
    if args.sequences < 1:
        parser.error("--sequences must be >= 1")
    torch.set_num_threads(1)
    model, run = load_cell_model(args.model)
    data = build_task(run).build(run.seed)
    rows = []
    for i in range(min(args.sequences, len(data.test_inputs))):
        rows.append(measure_sequence(model, data.test_inputs[i].tolist(),
                                     data.test_roles[i].tolist()))
        print(f"sequence {i + 1}: {sum(m['compacted'] for m in rows[-1]['memories'])} "
              f"tokens compactable of {sum(m['held'] for m in rows[-1]['memories'])}",
              flush=True)
    mems = [m for r in rows for m in r["memories"]]
    summary = {
        "held": int(sum(m["held"] for m in mems)),
        "compactable": int(sum(m["compacted"] for m in mems)),
        "bytes_before": int(sum(m["bytes_before"] for m in mems)),
        "bytes_after": int(sum(m["bytes_after"] for m in mems)),
        "max_readout_change": float(max(m["readout_change"] for m in mems)),
        "distinct_support_keys_per_memory": float(np.mean(
            [m["distinct_support_keys"] for m in mems])),
        "support_per_memory": float(np.mean([m["margin"] + m["error"] for m in mems])),
    }
    for name in ("selected_data_token", "never_selected_filler"):
        secs = [r["forgets"][name]["seconds"] for r in rows if name in r["forgets"]]
        summary[f"forget_{name}_median_s"] = float(np.median(secs)) if secs else None
    print({k: v for k, v in summary.items()})
    if args.json is not None:
        write_record(args.json, __file__, argv, {
            "model": portable_path(args.model), "run": run.to_dict(),
            "conditions": args.conditions, "summary": summary, "sequences": rows})
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
