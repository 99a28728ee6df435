"""``lm`` and ``throughput``: collect the hybrid language model's results (no training here).

The hybrid LM runs (:mod:`svattn.lm`) are recorded in ``results/lm.json`` in the
repository by the tools (``svattn train --record``, ``svattn collect``,
``benchmarks/bench_lm_throughput.py``; :mod:`svattn.lm.records`). This module
reads that file, finds the runs in it (every JSON object with a ``test_bpc``,
``val_bpc`` or ``bpc`` number), sorts them into SV-hybrid and sliding-window/softmax
baselines by name, and sets the paper's figures beside them. Without the file every
row says "not yet run". Nothing is trained here.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from svattn.experiments._common import (
    NOT_REPRODUCED,
    NOT_RUN,
    PARTLY,
    REPRODUCED,
    Claim,
    Context,
    ExperimentResult,
    markdown_table,
)

NAME = "lm"
TITLE = "Hybrid SV language model on the enwik8 prefix (collected, not trained here)"
THROUGHPUT_TITLE = "Training throughput of the hybrid model vs softmax attention (collected)"

_SV = re.compile(r"(^|[^a-z])(sv|hybrid)", re.I)
_BASE = re.compile(r"sliding|window|swa|baseline|softmax", re.I)
_SLIDING = re.compile(r"sliding|window|swa", re.I)
_SOFTMAX = re.compile(r"softmax|full", re.I)


@dataclass(frozen=True)
class Run:
    """One run found in the results file."""

    path: str
    name: str
    bpc: float | None
    params: float | None
    tokens_per_s: float | None
    record: dict[str, Any]

    @property
    def is_sv(self) -> bool:
        return bool(_SV.search(self.name)) and not _BASE.search(self.name.replace("hybrid", ""))

    @property
    def size(self) -> str:
        if self.params is None:
            return "?"
        return "3M" if self.params < 6e6 else "10M"


def find_runs(obj: Any, path: str = "") -> list[Run]:
    """Every JSON object under ``obj`` with a BPC or tokens/s number, as :class:`Run`.

    Examples
    --------
    >>> runs = find_runs({"runs": [{"mixer": "hybrid_sv", "test_bpc": 2.2, "params": 3.2e6}]})
    >>> runs[0].name, runs[0].bpc, runs[0].size, runs[0].is_sv
    ('runs[0] hybrid_sv', 2.2, '3M', True)
    """
    found: list[Run] = []
    if isinstance(obj, dict):
        bpc = next((obj[k] for k in ("test_bpc", "val_bpc", "bpc")
                    if isinstance(obj.get(k), int | float)), None)
        tps = next((obj[k] for k in ("train_tokens_per_s", "tokens_per_s", "throughput")
                    if isinstance(obj.get(k), int | float)), None)
        if bpc is not None or tps is not None:
            label = " ".join(str(obj[k]) for k in ("name", "mixer", "variant", "model", "preset")
                             if isinstance(obj.get(k), str))
            params = obj.get("params") if isinstance(obj.get("params"), int | float) else None
            found.append(Run(path, f"{path} {label}".strip(), bpc, params, tps, obj))
        for k, v in obj.items():
            if isinstance(v, dict | list):
                found += find_runs(v, f"{path}.{k}" if path else str(k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            found += find_runs(v, f"{path}[{i}]")
    return found


def _load(ctx: Context) -> tuple[Path | None, Any]:
    if ctx.repo_root is None:
        return None, None
    path = ctx.repo_root / "results" / "lm.json"
    if not path.exists():
        return path, None
    return path, json.loads(path.read_text())


def _runs_table(runs: list[Run]) -> str:
    def num(r: Run, key: str, spec: str) -> str:
        v = r.record.get(key)
        return format(v, spec) if isinstance(v, int | float) else "—"

    return markdown_table(
        ["run", "positions (context, if not T = 256)", "seed", "tokens seen", "params",
         "val BPC", "test BPC", "train tokens/s"],
        [[r.name, _pos_label(_setting(r.record)), num(r, "seed", "d"), num(r, "tokens_seen", ",d"),
          "—" if r.params is None else f"{r.params / 1e6:.2f}M",
          num(r, "val_bpc", ".3f"), "—" if r.bpc is None else f"{r.bpc:.3f}",
          "—" if r.tokens_per_s is None else f"{r.tokens_per_s:,.0f}"] for r in runs])


def _not_run(name: str, title: str, claims: list[tuple[str, str]], path: Path | None,
             what: str) -> ExperimentResult:
    where = "results/lm.json"  # relative to the repository root
    return ExperimentResult(
        name=name, title=title,
        what=what + f"\n\n`{where}` does not exist yet: the hybrid LM has not been run.",
        claims=[Claim(c, p, "not yet run", NOT_RUN) for c, p in claims],
        verdict=f"not yet run ({where} absent); nothing is trained by `svattn reproduce`.",
        metrics={"results_file": where, "found": False},
    )


LM_CLAIMS = [
    ("enwik8, 3.22M parameters: hybrid SV BPC", "2.178"),
    ("… vs sliding-window Transformer with matched state", "8.6% better (p = 0.001)"),
    ("enwik8, 10M parameters", "no advantage"),
]
THROUGHPUT_CLAIMS = [
    ("Training throughput, 3.22M model", "9,125 tokens/s, 35.8× slower than softmax (Apple MPS)"),
]

_WHAT = (
    "Read from `results/lm.json` (records appended by `svattn train --record`, `svattn "
    "collect` and `benchmarks/bench_lm_throughput.py`); not trained by "
    "this command. Runs are the JSON objects with a `test_bpc` / `val_bpc` / `bpc` (or "
    "tokens/s) number; a run is SV-hybrid when its name or mixer says `sv`/`hybrid`, the "
    "BPC baseline when it says sliding/window (matched state), the throughput reference "
    "when it says softmax/full; 3M vs 10M by `params` (< 6M is 3M). "
    "Data: the enwik8 *prefix* (first 491 pages, 4.15 MB; 90/5/5 split), not full enwik8."
)


def _positions(r: dict) -> str:
    """How a run's model knew token positions: ``"rope"``, ``"learned"`` or ``"none"`` (NoPE)."""
    pos = r.get("positions")
    return pos if isinstance(pos, str) and pos else "none"


def _context_suffix(context: Any) -> str:
    """``", T = 1024"`` for a context other than the paper's T = 256; ``""`` otherwise."""
    return "" if context in (None, 256) else f", T = {int(context)}"


def _setting(r: dict) -> str:
    """What a run's BPC may be paired across: its positions (``_positions``), plus its
    context length when that is not the paper's T = 256 (``"rope, T = 1024"``)."""
    return _positions(r) + _context_suffix(r.get("eval_context"))


def _pos_label(pos: str) -> str:
    head, _, tail = pos.partition(", ")
    return ("NoPE" if head == "none" else head) + (f", {tail}" if tail else "")


def _variant(r: dict) -> str:
    """Which hybrid layer a run used: ``"paper"`` (docs/design.md §5) unless the record names
    one of our variants (e.g. ``"lookback32"``: the local path also sees 32 keys before its
    chunk)."""
    v = r.get("variant")
    return v if isinstance(v, str) and v else "paper"


def _cells_3m(data: Any, arm_of) -> list[tuple[tuple[str, int, int], dict[str, float]]]:
    """Validation BPC of 3M runs by (setting: positions and context, tokens seen, seed),
    then by arm (``arm_of(record, mixer)``; None leaves a run out), sorted by cell."""
    cells: dict[tuple[str, int, int], dict[str, float]] = {}
    for r in data if isinstance(data, list) else []:
        if not isinstance(r, dict) or r.get("val_bpc") is None or r.get("tokens_seen") is None:
            continue
        arm = arm_of(r, str(r.get("mixer", "")))
        if arm is not None and (r.get("params") or 0) < 6_000_000:
            key = (_setting(r), int(r["tokens_seen"]), int(r.get("seed", 0)))
            cells.setdefault(key, {})[arm] = float(r["val_bpc"])
    return sorted(cells.items())


def _paired_gaps(data: Any) -> dict[tuple[str, str, int], list[float]]:
    """Relative val-BPC gaps (sliding − SV) / sliding of 3M runs paired by positions,
    tokens seen and seed, per (hybrid variant, positions, token budget).

    Each variant of the hybrid is paired with the same sliding-window run: the variants
    keep the same state size, so they share the matched baseline.
    """
    def arm_of(r: dict, mixer: str) -> str | None:
        return "sv:" + _variant(r) if "sv" in mixer else "base" if "sliding" in mixer else None

    out: dict[tuple[str, str, int], list[float]] = {}
    for (pos, tokens, _seed), arms in _cells_3m(data, arm_of):
        for arm, sv in sorted(arms.items()):
            if arm.startswith("sv:") and "base" in arms:
                gap = (arms["base"] - sv) / arms["base"]
                out.setdefault((arm[3:], pos, tokens), []).append(gap)
    return out


def _softmax_headroom(data: Any) -> dict[tuple[str, int], list[float]]:
    """Relative val-BPC gaps (sliding − softmax) / sliding of 3M runs paired by
    positions, tokens seen and seed, per (positions, token budget).

    Full causal softmax reads every key of the context the hybrid's memory
    summarises, so this gap is about the most any memory of that context can add
    over the matched window at this scale (not a strict bound: the models differ).
    """
    out: dict[tuple[str, int], list[float]] = {}
    cells = _cells_3m(data, lambda r, mixer: mixer if mixer in ("softmax", "sliding") else None)
    for (pos, tokens, _seed), arms in cells:
        if len(arms) == 2:
            out.setdefault((pos, tokens), []).append(
                (arms["sliding"] - arms["softmax"]) / arms["sliding"])
    return out


def _better_or_worse(gap: float, subject: str = "SV") -> str:
    """``"SV better by 7.6%"`` / ``"SV worse by 7.6%"`` for a relative gap (sliding − SV) /
    sliding, never "better by -7.6%".

    Examples
    --------
    >>> _better_or_worse(0.076), _better_or_worse(-0.076), _better_or_worse(0.0)
    ('SV better by 7.6%', 'SV worse by 7.6%', 'SV equal')
    """
    if round(gap, 3) == 0:
        return f"{subject} equal"
    return f"{subject} {'better' if gap > 0 else 'worse'} by {abs(gap):.1%}"


def _gap_texts(paired: dict[tuple[str, int], list[float]], subject: str = "SV"
               ) -> tuple[list[str], bool, float]:
    """One text per (positions, tokens) cell, whether the largest-budget gap is significant
    at 5%, and the largest budget's mean gap (cells are ordered by token budget).

    The interval is of the gap (sliding − subject) / sliding: positive is the subject
    (SV, or softmax for the headroom) better."""
    texts, significant, mean = [], False, 0.0
    for (pos, tokens), gaps in sorted(paired.items(), key=lambda kv: kv[0][::-1]):
        where = f"{tokens:,} tokens ({_pos_label(pos)})"
        mean = float(np.mean(gaps))
        if len(gaps) >= 2:
            t_crit = {2: 12.706, 3: 4.303, 4: 3.182, 5: 2.776}.get(len(gaps), 2.0)
            half = t_crit * float(np.std(gaps, ddof=1)) / np.sqrt(len(gaps))
            texts.append(f"{_better_or_worse(mean, subject)} [95% t-interval of (sliding − "
                         f"{subject})/sliding: "
                         f"{mean - half:+.1%}, {mean + half:+.1%}] over {len(gaps)} seeds at "
                         f"{where}")
            significant = mean - half > 0 and mean >= 0.05
        else:
            texts.append(f"{_better_or_worse(mean, subject)} (1 seed, no interval) at {where}")
            significant = False
    return texts, significant, mean


_VARIANT_MET = "met by our variant (not the paper's layer)"


def _best_val_claim(claim: str, paper: str, sv: list[Run], variant: str) -> Claim | None:
    """The BPC-target row for one hybrid variant: its best validation BPC against 2.178."""
    with_val = [r for r in sv if isinstance(r.record.get("val_bpc"), int | float)]
    if not with_val:
        return None
    # the target is validation BPC below the paper's 2.178 (on the prefix's split)
    best = min(with_val, key=lambda r: r.record["val_bpc"])
    val, test = best.record["val_bpc"], best.record.get("test_bpc")
    text = f"val {val:.3f}" + (f" / test {test:.3f}" if test is not None else "")
    met = REPRODUCED if variant == "paper" else _VARIANT_MET
    return Claim(claim, paper, f"{text} (enwik8 prefix; {best.name})",
                 met if val <= 2.178 else NOT_REPRODUCED)


def _variant_claims(runs: list[Run], paired: dict[tuple[str, str, int], list[float]]
                    ) -> list[Claim]:
    """Rows for hybrid variants other than the paper's layer (3M runs only)."""
    claims = []
    variants = sorted({_variant(r.record) for r in runs if r.is_sv and r.size == "3M"}
                      - {"paper"})
    for v in variants:
        sv = [r for r in runs if r.is_sv and r.size == "3M" and _variant(r.record) == v]
        row = _best_val_claim(f"{LM_CLAIMS[0][0]} — our variant `{v}`", LM_CLAIMS[0][1], sv, v)
        if row is not None:
            claims.append(row)
        cells = {(pos, t): g for (var, pos, t), g in paired.items() if var == v}
        if cells:
            texts, significant, mean = _gap_texts(cells)
            verdict = (_VARIANT_MET if significant else
                       "better than the baseline, not significantly (our variant)" if mean > 0
                       else NOT_REPRODUCED)
            claims.append(Claim(f"{LM_CLAIMS[1][0]} — our variant `{v}`", LM_CLAIMS[1][1],
                                "; ".join(texts), verdict))
    return claims


def run(ctx: Context) -> ExperimentResult:
    """The BPC rows."""
    path, data = _load(ctx)
    if data is None:
        return _not_run(NAME, TITLE, LM_CLAIMS, path, _WHAT)
    runs = [r for r in find_runs(data) if r.bpc is not None]
    claims, metrics = [], {"results_file": "results/lm.json", "found": True,
                           "runs": [{"name": r.name, "params": r.params, "bpc": r.bpc,
                                     "tokens_per_s": r.tokens_per_s} for r in runs]}
    paired = _paired_gaps(data)
    paper_pairs = {(pos, t): g for (v, pos, t), g in paired.items() if v == "paper"}
    for size, (c_bpc, p_bpc), (c_cmp, p_cmp) in (
        ("3M", LM_CLAIMS[0], LM_CLAIMS[1]), ("10M", (None, None), LM_CLAIMS[2]),
    ):
        # the paper's claims are judged on the paper's layer; our variants get rows of their own
        sv = [r for r in runs if r.size == size and r.is_sv and _variant(r.record) == "paper"]
        base = [r for r in runs if r.size == size and not r.is_sv and _SLIDING.search(r.name)]
        if c_bpc is not None:
            row = _best_val_claim(c_bpc, p_bpc, sv, "paper")
            if row is not None:
                claims.append(row)
            elif sv:
                best_bpc = min(r.bpc for r in sv)
                claims.append(Claim(c_bpc, p_bpc, f"{best_bpc:.3f} (enwik8 prefix; no val split)",
                                    REPRODUCED if best_bpc <= 2.178 else NOT_REPRODUCED))
            else:
                claims.append(Claim(c_bpc, p_bpc, "not yet run", NOT_RUN))
        if size == "3M" and paper_pairs:
            metrics["paired_gaps_3M"] = {f"{pos}/{t}": g for (pos, t), g in paper_pairs.items()}
            texts, significant, mean = _gap_texts(paper_pairs)
            verdict = (REPRODUCED if significant else
                       PARTLY if mean > 0 else NOT_REPRODUCED)
            claims.append(Claim(c_cmp, p_cmp, "; ".join(texts), verdict))
            continue
        if sv and base:
            s, b = min(r.bpc for r in sv), min(r.bpc for r in base)
            gain = (b - s) / b
            metrics[f"gain_{size}"] = gain
            if size == "3M":
                verdict = (REPRODUCED if gain >= 0.05 else PARTLY if gain > 0
                           else NOT_REPRODUCED)
            else:
                verdict = REPRODUCED if gain <= 0.01 else "differs (ours has an advantage)"
            claims.append(Claim(c_cmp, p_cmp, f"SV {s:.3f} vs baseline {b:.3f}: "
                                f"{gain:+.1%} (single runs; no p-value)", verdict))
        else:
            claims.append(Claim(c_cmp, p_cmp, "not yet run", NOT_RUN))
    claims += _variant_claims(runs, paired)
    variant_gaps = {f"{v}/{pos}/{t}": g for (v, pos, t), g in paired.items() if v != "paper"}
    if variant_gaps:
        metrics["paired_gaps_3M_variants"] = variant_gaps
    notes = ["BPC is on the enwik8 prefix (a different, smaller test set than the paper's "
             "enwik8 test split): the numbers are not directly comparable.",
             "The paper's p = 0.001 needs several seeds per arm; the verdicts here use the "
             "best run per arm.",
             "Positions: without a positional encoding (NoPE) a sliding window sees the keys "
             "inside a full window as an unordered set, while the hybrid's chunk-local "
             "softmax still orders them by the causal mask, so NoPE comparisons favour the "
             "hybrid. Runs are paired only with runs of the same positions setting and "
             "context length (T = 256 unless a cell says otherwise); the comparison verdict "
             "follows the largest token budget (at equal budgets, the last setting listed).",
             "Variants: runs whose record names a `variant` (e.g. `lookback32`, where the "
             "local path also sees the 32 keys before its chunk, with the SV budget cut so the "
             "state still equals the W = 128 window) are not the paper's layer. The paper's "
             "two claims are judged on the paper's layer only; each variant gets rows of its "
             "own, marked as ours."]
    headroom = _softmax_headroom(data)
    if headroom:
        metrics["softmax_over_sliding_3M"] = {f"{pos}/{t}": g for (pos, t), g in headroom.items()}
        texts, _, _ = _gap_texts(headroom, subject="softmax")
        notes.append("Headroom: full causal softmax over the same context (every key the "
                     "hybrid's memory summarises) against the matched sliding window: "
                     + "; ".join(texts) + ". That is about the most any memory of this "
                     "context can add over the window at this scale (the paper's hybrid claims "
                     "8.6%).")
    spread = _logged_speed_spread(runs)
    if spread > 1.0:
        notes.append("Train tokens/s in the detail table are as each run logged them, on a "
                     f"shared 2-core machine: runs of one mixer and setting logged up to "
                     f"{spread:.1f}× apart (machine speed varied between sessions, and short "
                     "runs carry their start-up costs); compare speeds only within one "
                     "benchmark run (the throughput report).")
    tables = [_runs_table(runs)]
    ablation = _gate_ablation_table(ctx)
    if ablation is not None:
        tables.append(ablation)
        notes.append("Gate ablation (second table, from `results/lm_gate_ablation.json`, "
                     "made by `scripts/ablate_hybrid_gate.py`): each trained hybrid "
                     "evaluated as trained and with every gate forced to 0, so queries "
                     "read the local path only. The difference is what the SV memory adds "
                     "to that trained model.")
    return ExperimentResult(
        name=NAME, title=TITLE, what=_WHAT, claims=claims,
        verdict=f"collected {len(runs)} runs from results/lm.json.", metrics=metrics,
        tables=tables, notes=notes,
    )


def _logged_speed_spread(runs: list[Run]) -> float:
    """Largest max/min ratio of logged train tokens/s among runs of one mixer, variant,
    setting and batch shape (the same model trained at different times); 1.0 if none."""
    groups: dict[tuple, list[float]] = {}
    for r in runs:
        if r.tokens_per_s and r.record.get("tokens_seen") is not None:
            key = (r.record.get("mixer"), _variant(r.record), _setting(r.record), r.size)
            groups.setdefault(key, []).append(r.tokens_per_s)
    return max((max(v) / min(v) for v in groups.values()), default=1.0)


def _gate_ablation_table(ctx: Context) -> str | None:
    """The gate-ablation rows, when ``results/lm_gate_ablation.json`` exists."""
    if ctx.repo_root is None:
        return None
    path = ctx.repo_root / "results" / "lm_gate_ablation.json"
    if not path.exists():
        return None
    records = json.loads(path.read_text())
    rows = []
    for r in records:
        gates = [x for layer in r["gates"] for x in layer]
        lookback = (r.get("mixer_options") or {}).get("lookback", 0)
        rows.append([f"{r['checkpoint']} (seed {r.get('seed', '?')}, step {r['step']}"
                     f"{_context_suffix(r.get('context'))})",
                     f"lookback{lookback}" if lookback else "paper",
                     f"{sum(gates) / len(gates):.3f}", f"{r['as_trained']['bpc']:.4f}",
                     f"{r['global_off']['bpc']:.4f}", f"{r['bpc_added_by_global_off']:+.4f}"])
    return markdown_table(["checkpoint", "hybrid layer", "mean gate (SV weight)",
                           f"{records[0]['split']} BPC as trained",
                           "SV path off", "difference"], rows)


def _throughput_verdict(slowdown: float) -> str:
    # the paper's figure is a cost (35.8× slower): being less slow is a difference
    return "differs (ours is less slow; other hardware)" if slowdown < 35.8 else PARTLY


def run_throughput(ctx: Context) -> ExperimentResult:
    """The tokens/s row."""
    path, data = _load(ctx)
    if data is None:
        return _not_run("throughput", THROUGHPUT_TITLE, THROUGHPUT_CLAIMS, path, _WHAT)
    runs = [r for r in find_runs(data) if r.tokens_per_s is not None]
    # the paper's figure is judged on the paper's layer; variants get rows of their own
    sv = [r for r in runs if r.is_sv and _variant(r.record) == "paper"]
    soft = [r for r in runs if not r.is_sv and _SOFTMAX.search(r.name)]
    metrics: dict[str, Any] = {"results_file": "results/lm.json", "found": True,
                               "runs": [{"name": r.name, "tokens_per_s": r.tokens_per_s}
                                        for r in runs]}
    # compare like with like: runs grouped by how the models know positions
    groups = sorted({_positions(r.record) for r in sv} & {_positions(r.record) for r in soft})
    if groups:
        texts = []
        for pos in groups:
            s = max(r.tokens_per_s for r in sv if _positions(r.record) == pos)
            f = max(r.tokens_per_s for r in soft if _positions(r.record) == pos)
            metrics[f"slowdown_{pos}"] = f / s
            texts.append(f"{s:,.0f} tokens/s, {f / s:.2f}× slower than softmax"
                         + ("" if len(groups) == 1 else f" ({_pos_label(pos)})"))
        metrics["slowdown"] = max(metrics[f"slowdown_{pos}"] for pos in groups)
        ours = "; ".join(texts) + f" ({len(runs)} runs)"
        verdict = _throughput_verdict(metrics["slowdown"])
    elif sv:
        s = max(r.tokens_per_s for r in sv)
        ours, verdict = f"{s:,.0f} tokens/s (no softmax run to compare)", PARTLY
    else:
        ours, verdict = "not yet run", NOT_RUN
    claims = [Claim(THROUGHPUT_CLAIMS[0][0], THROUGHPUT_CLAIMS[0][1], ours, verdict)]
    for v in sorted({_variant(r.record) for r in runs if r.is_sv} - {"paper"}):
        # throughput records only: a training run's tokens/s depends on its machine load
        timed = [r for r in runs if r.is_sv and _variant(r.record) == v
                 and r.record.get("kind") == "throughput"]
        pairs = []
        for r in timed:
            ref = [f for f in soft if f.record.get("command") == r.record.get("command")]
            if ref:  # the softmax model of the same benchmark run
                pairs.append((r.tokens_per_s, ref[0].tokens_per_s / r.tokens_per_s,
                              _positions(r.record)))
        if pairs:
            tps, slow, pos = max(pairs)
            metrics[f"slowdown_{v}"] = slow
            claims.append(Claim(f"{THROUGHPUT_CLAIMS[0][0]} — our variant `{v}`",
                                THROUGHPUT_CLAIMS[0][1],
                                f"{tps:,.0f} tokens/s, {slow:.2f}× slower than softmax "
                                f"({_pos_label(pos)}, same benchmark run)",
                                _throughput_verdict(slow)))
    return ExperimentResult(
        name="throughput", title=THROUGHPUT_TITLE, what=_WHAT, claims=claims,
        verdict=f"{ours} (hardware differs from the paper's Apple MPS)", metrics=metrics,
        tables=[_runs_table(runs)] if runs else [],
        notes=["Throughput depends on the hardware (the paper: Apple MPS; here: the machine "
               "that ran svattn.lm); only the slowdown ratio is comparable."],
    )
