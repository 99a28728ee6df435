"""``forgetting``: exact removal of a support token versus a from-scratch retrain.

Per trial: build an exact :class:`~svattn.exact.SVDDMemory` over a key set,
remove one token drawn from the support (margin or error set), retrain from
scratch on the remaining tokens with the independent oracle
(:func:`svattn.unlearning.retrain_without`) and compare the partitions and the
decision function on probe points. The coefficient-decay baseline shrinks the
same token's coefficient and re-solves nothing.

Key sets: Gaussian, ICU (standardised hourly vitals), learned keys (layer-0
key projections of a small character model trained here), and an
ill-conditioned stream where half the tokens are near or exact copies of the
others (the optimum is then not unique: the decision function still is). And
what compaction costs: erasing a stay from a memory compacted as it streamed,
against the same stream never compacted (:mod:`svattn.experiments._compaction`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from svattn.exact import SVDDMemory
from svattn.experiments._common import (
    NOT_REPRODUCED,
    PARTLY,
    REPRODUCED,
    Claim,
    Context,
    ExperimentResult,
    bootstrap_ci,
    fmt_sci,
    markdown_table,
    progress,
    pyplot,
    quantiles,
    save_figure,
)
from svattn.unlearning import SVState, coefficient_decay, deviation_from_retrain, retrain_without

NAME = "forgetting"
TITLE = "Exact unlearning: decremental removal vs from-scratch retrain"

DECAY_FACTOR = 0.01


@dataclass(frozen=True)
class RemovalTrial:
    """One removal compared with retraining.

    Attributes
    ----------
    removed_id : int
        Token removed (its index in the key set).
    removed_set : str
        ``"margin"`` or ``"error"`` before removal.
    unique : bool
        The remaining problem has a unique optimum (``SVDDMemory.unique_optimum``).
    partition_identical : bool
        Margin/error/reserve sets after exact removal equal the retrained ones.
    exact_decision_dev : float
        ``max |f(x) − f_retrain(x)|`` over the probes, after exact removal.
    exact_alpha_dev : float
        ``max |alpha − alpha_retrain|``.
    exact_readout_dev : float
        ``max |o(q) − o_retrain(q)|`` over the probes.
    decay_decision_dev : float
        The same decision deviation for coefficient decay by ``decay_factor``.
    decay_factor : float
    """

    removed_id: int
    removed_set: str
    unique: bool
    partition_identical: bool
    exact_decision_dev: float
    exact_alpha_dev: float
    exact_readout_dev: float
    decay_decision_dev: float
    decay_factor: float


def removal_trial(
    keys: np.ndarray,
    *,
    C: float,
    token: int | None = None,
    probes: np.ndarray | None = None,
    gamma: float | None = None,
    decay_factor: float = DECAY_FACTOR,
    rng: np.random.Generator | None = None,
) -> RemovalTrial:
    """Remove one token exactly and by coefficient decay; compare both with a retrain.

    Parameters
    ----------
    keys : ndarray, shape (n, d)
        The token set (values are the keys themselves).
    C : float
        Box bound of the memory (``n · C > 1`` so that the problem stays feasible).
    token : int, optional
        Index of the token to remove; default a random support (margin or
        error) token.
    probes : ndarray, shape (m, d), optional
        Decision-function and readout probes; default the keys plus 64
        Gaussian points around them.
    gamma : float, optional
        rbf bandwidth (default ``1/d``).
    decay_factor : float
        Shrink factor of the decay baseline.
    rng : numpy Generator, optional
        Draws the token and the probes.

    Returns
    -------
    RemovalTrial

    Examples
    --------
    A stream with one far outlier: removing it exactly matches the retrain to
    rounding; shrinking its weight does not.

    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> keys = np.vstack([rng.normal(size=(40, 3)), [[8.0, 8.0, 8.0]]])
    >>> t = removal_trial(keys, C=0.1, token=40)
    >>> t.partition_identical, t.exact_decision_dev < 1e-9, t.decay_decision_dev > 1e-3
    (True, True, True)
    """
    keys = np.asarray(keys, dtype=np.float64)
    if keys.ndim != 2:
        raise ValueError(f"keys must be 2-D (n, d), got shape {keys.shape}")
    n = keys.shape[0]
    if not (n - 1) * C >= 1.0:
        raise ValueError(f"C: need (n - 1)·C >= 1 to stay feasible after removal; n={n}, C={C}")
    rng = np.random.default_rng(0) if rng is None else rng
    memory = SVDDMemory(C, gamma=gamma)
    ids = memory.extend(keys)
    part = memory.partition()
    if token is None:
        support = part["margin"] + part["error"]
        token = int(support[rng.integers(len(support))])
    elif not 0 <= token < n:
        raise ValueError(f"token must index the keys (0..{n - 1}), got {token}")
    tid = ids[token]
    removed_set = next(name for name, members in part.items() if tid in members)
    if probes is None:
        spread = keys.std(axis=0) + 1e-12
        around = keys[rng.integers(0, n, 64)] + rng.normal(size=(64, keys.shape[1])) * spread
        probes = np.concatenate([keys, around])
    reference = retrain_without(memory, tid)
    after = copy.deepcopy(memory)
    after.remove(tid)
    exact = deviation_from_retrain(SVState.from_memory(after), reference, probes)
    decayed = deviation_from_retrain(coefficient_decay(memory, tid, decay_factor), reference,
                                     probes)
    return RemovalTrial(
        removed_id=int(token), removed_set=removed_set, unique=bool(after.unique_optimum()),
        partition_identical=bool(exact.partition_identical),
        exact_decision_dev=exact.decision_max, exact_alpha_dev=exact.max_abs_alpha,
        exact_readout_dev=exact.readout_max, decay_decision_dev=decayed.decision_max,
        decay_factor=float(decay_factor),
    )


# ------------------------------------------------------------------ key sets
def gaussian_keys(rng: np.random.Generator, n: int, d: int = 8) -> np.ndarray:
    """``n`` standard normal keys in ``d`` dimensions."""
    return rng.normal(size=(n, d))


def duplicate_keys(rng: np.random.Generator, n: int, d: int = 8) -> np.ndarray:
    """Ill-conditioned stream: ``n/2`` Gaussian keys, then copies of them.

    A third of the copies are exact, a third perturbed by 1e-9, a third by
    1e-6 (relative to unit spread), shuffled into the stream.
    """
    m = n // 2
    base = rng.normal(size=(m, d))
    src = base[rng.integers(0, m, n - m)]
    eps = np.repeat([0.0, 1e-9, 1e-6], -(-(n - m) // 3))[: n - m]
    copies = src + eps[:, None] * rng.normal(size=src.shape)
    return np.concatenate([base, copies])[rng.permutation(n)]


def _icu_pool(ctx: Context) -> tuple[np.ndarray, str]:
    """Distinct standardised hourly vital vectors and their source label."""
    from svattn.experiments._data import icu_population, unique_rows

    data, label = icu_population(ctx)
    return unique_rows(data.keys), label


# ----------------------------------------------------------------- the run
def _config(ctx: Context) -> dict:
    if ctx.quick:
        return {"n": 80, "C": 0.1, "trials": 4, "n_dup": 60, "C_dup": 0.1, "lm_steps": 30,
                "lm_bytes": 200_000, "compaction": {"n": 240, "C": 0.05, "every": 60,
                                                    "stays": 6}}
    return {"n": 200, "C": 0.05, "trials": 60, "n_dup": 100, "C_dup": 0.1, "lm_steps": 1500,
            "lm_bytes": 2_000_000, "compaction": {"n": 1500, "C": 0.01, "every": 250,
                                                  "stays": 40}}


def _compaction(ctx: Context, cfg: dict) -> tuple[dict, str, str]:
    """Compact-then-erase against never-compacted on the ICU stream: metrics, table, note."""
    from svattn.experiments._compaction import build, erase_trial, stream_order
    from svattn.experiments._data import icu_population

    data, label = icu_population(ctx)
    order = stream_order(data.stay_id, data.hour)[: cfg["n"]]
    keys, stays = data.keys[order], data.stay_id[order]
    full, bounded, dropped = build(keys, cfg["C"], cfg["every"])
    chosen = np.unique(stays)[: cfg["stays"]]
    trials = [erase_trial(full, bounded, s, np.flatnonzero(stays == s))
              for s in progress(chosen, desc="forgetting/compaction")]
    differs = np.array([t.differs for t in trials], dtype=float)
    dev = [t.decision_dev for t in trials]
    m = {"description": f"the first {len(keys)} hourly vectors of {label} in arrival order "
                        f"(by hour, stays interleaved), C = {cfg['C']}, compact() every "
                        f"{cfg['every']} tokens ({dropped} dropped, {len(bounded)} kept of "
                        f"{len(full)}); one stay erased per trial from copies of both",
         "trials": len(trials), "dropped": dropped, "kept": len(bounded),
         "differs_fraction": float(differs.mean()),
         "differs_ci95": list(bootstrap_ci(differs, seed=ctx.seed)[1:]),
         "reentered_tokens": quantiles([t.reentered for t in trials]),
         "decision_dev": quantiles(dev), "alpha_dev": quantiles([t.alpha_dev for t in trials])}
    table = markdown_table(
        ["trials (stays erased)", "tokens dropped by compaction", "differs from never-compacted",
         "re-entered tokens median / worst", "decision dev median", "decision dev worst"],
        [[len(trials), f"{dropped} of {len(full)}", f"{m['differs_fraction']:.0%}",
          f"{m['reentered_tokens']['median']:g} / {m['reentered_tokens']['worst']:g}",
          fmt_sci(m["decision_dev"]["median"]), fmt_sci(m["decision_dev"]["worst"])]])
    note = (f"Compaction (bounded memory) on the ICU stream: {m['description']}. After erasing "
            f"a stay, the compacted memory differs from the never-compacted one in "
            f"{m['differs_fraction']:.0%} of trials (a dropped token would have re-entered "
            f"the support, or the decision function moved by > 1e-9); worst decision "
            f"deviation {fmt_sci(m['decision_dev']['worst'])}. Its removals are exact "
            "relative to the kept tokens, and every certificate says how many were dropped "
            "(`compacted`).")
    return m, table, note


def run(ctx: Context) -> ExperimentResult:
    """Run every key set, write the figure, return the findings."""
    from svattn.experiments._charlm import learned_keys
    from svattn.experiments._data import text_corpus

    cfg = _config(ctx)
    n, C, trials = cfg["n"], cfg["C"], cfg["trials"]
    icu_pool, icu_label = _icu_pool(ctx)
    text, text_label = text_corpus(ctx, cfg["lm_bytes"])
    lk = learned_keys(text, 4 * n, steps=cfg["lm_steps"], seed=ctx.seed)
    learned_pool = lk.keys

    def draw(pool: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return pool[rng.choice(len(pool), size=min(n, len(pool)), replace=False)]

    key_sets = {
        "gaussian": (lambda r: gaussian_keys(r, n), C,
                     f"{n} keys ~ N(0, I_8), C = {C}"),
        "icu": (lambda r: draw(icu_pool, r), C,
                f"{n} distinct standardised hourly vital vectors (7-d) drawn from {icu_label}, "
                f"C = {C}"),
        "learned": (lambda r: draw(learned_pool, r), C,
                    f"{n} distinct layer-0 keys (16-d) of a 1-layer character model trained "
                    f"{lk.steps} steps ({lk.seconds:.0f} s, train {lk.train_bpc:.2f} bits/byte) "
                    f"on {text_label}; held-out windows. Not the paper's CharLM "
                    "(no trained svattn.lm checkpoint yet)."),
        "duplicates": (lambda r: duplicate_keys(r, cfg["n_dup"]), cfg["C_dup"],
                       f"{cfg['n_dup']} keys: half Gaussian, half copies of them (exact, "
                       f"+1e-9, +1e-6 noise), C = {cfg['C_dup']}"),
    }
    results: dict[str, list[RemovalTrial]] = {}
    failures: dict[str, list[str]] = {}
    for offset, (name, (make, c_box, _)) in enumerate(key_sets.items()):
        rows, failed = [], []
        for i in progress(range(trials), desc=f"forgetting/{name}"):
            for attempt in range(2):  # the oracle's SVD fallback can fail spuriously: retry once
                rng = np.random.default_rng([ctx.seed, offset, i])
                try:
                    rows.append(removal_trial(make(rng), C=c_box, rng=rng))
                    break
                except np.linalg.LinAlgError as exc:
                    if attempt:
                        failed.append(f"trial {i}: {type(exc).__name__}: {exc}")
        if not rows:
            raise RuntimeError(f"forgetting/{name}: every trial failed: {failed}")
        results[name] = rows
        failures[name] = failed

    metrics: dict = {"config": cfg, "decay_factor": DECAY_FACTOR, "key_sets": {}}
    detail_rows = []
    for name, rows in results.items():
        ident = np.array([r.partition_identical for r in rows], dtype=float)
        unique = np.array([r.unique for r in rows], dtype=float)
        ex = np.array([r.exact_decision_dev for r in rows])
        dc = np.array([r.decay_decision_dev for r in rows])
        ident_u = ident[unique == 1]
        m = {
            "description": key_sets[name][2],
            "trials": len(rows),
            "partition_identical": float(ident.mean()),
            "partition_identical_ci95": list(bootstrap_ci(ident, seed=ctx.seed)[1:]),
            "unique_fraction": float(unique.mean()),
            "partition_identical_when_unique": float(ident_u.mean()) if len(ident_u) else None,
            "exact_decision_dev": quantiles(ex),
            "exact_decision_dev_median_ci95": list(bootstrap_ci(ex, np.median, seed=ctx.seed)[1:]),
            "exact_alpha_dev": quantiles([r.exact_alpha_dev for r in rows]),
            "exact_readout_dev": quantiles([r.exact_readout_dev for r in rows]),
            "decay_decision_dev": quantiles(dc),
            "removed_from_error_set": float(np.mean([r.removed_set == "error" for r in rows])),
            "retrain_failures": failures[name],
        }
        metrics["key_sets"][name] = m
        detail_rows.append([
            name, len(rows), f"{m['partition_identical']:.2f}", f"{m['unique_fraction']:.2f}",
            fmt_sci(m["exact_decision_dev"]["median"]), fmt_sci(m["exact_decision_dev"]["p95"]),
            fmt_sci(m["exact_decision_dev"]["worst"]), fmt_sci(m["exact_alpha_dev"]["worst"]),
            fmt_sci(m["decay_decision_dev"]["median"]), fmt_sci(m["decay_decision_dev"]["worst"]),
        ])
    metrics["learned_model"] = {"steps": lk.steps, "seconds": lk.seconds,
                                "train_bits_per_byte": lk.train_bpc, "corpus": text_label}
    metrics["compaction"], compaction_table, compaction_note = _compaction(
        ctx, cfg["compaction"])

    figure = _figure(ctx, results)
    ks = metrics["key_sets"]
    unique_sets = ["gaussian", "icu", "learned"]
    ident_min = min(ks[s]["partition_identical"] for s in unique_sets)
    med = {s: ks[s]["exact_decision_dev"]["median"] for s in ks}
    dup = ks["duplicates"]
    decay_meds = [ks[s]["decay_decision_dev"]["median"] for s in unique_sets]
    claims = [
        Claim("Exact removal: partition identical to retrain (unique optimum)",
              "98–100% of trials",
              ", ".join(f"{s} {ks[s]['partition_identical']:.0%}" for s in unique_sets),
              REPRODUCED if ident_min >= 0.98 else PARTLY if ident_min >= 0.9
              else NOT_REPRODUCED),
        Claim("Exact removal: median decision-function deviation, Gaussian / ICU",
              "~1e-9", f"{fmt_sci(med['gaussian'])} / {fmt_sci(med['icu'])}",
              REPRODUCED if max(med["gaussian"], med["icu"]) <= 1e-8 else NOT_REPRODUCED),
        Claim("Exact removal: median decision-function deviation, learned keys",
              "~1e-13",
              f"{fmt_sci(med['learned'])} (a 1-block CharLM trained here, not the 3.22M one)",
              REPRODUCED if med["learned"] <= 1e-11 else NOT_REPRODUCED),
        Claim("Duplicate (ill-conditioned) stream: worst decision deviation",
              "1.1e-2", f"{fmt_sci(dup['exact_decision_dev']['worst'])} (max |Δα| worst "
              f"{fmt_sci(dup['exact_alpha_dev']['worst'])}); optimum unique in "
              f"{dup['unique_fraction']:.0%} of trials, partition identical in "
              f"{dup['partition_identical']:.0%}",
              "differs (ours smaller)" if dup["exact_decision_dev"]["worst"] < 1e-3
              else REPRODUCED),
        Claim(f"Coefficient-decay baseline (×{DECAY_FACTOR:g}): decision deviation",
              "1e-2 to 1e-1",
              f"median {fmt_sci(min(decay_meds))} to {fmt_sci(max(decay_meds))}",
              # within a factor 2 of the paper's range counts; the right order of magnitude
              # on some key set is partial
              REPRODUCED if 5e-3 <= min(decay_meds) and max(decay_meds) <= 2e-1
              else PARTLY if max(decay_meds) >= 1e-3 else NOT_REPRODUCED),
    ]
    what = (
        f"{trials} trials per key set (fewer where the retrain failed, see notes). "
        "Per trial: build an exact `SVDDMemory` (rbf kernel, gamma = 1/d) over the key set, "
        "remove one token drawn uniformly from its support (margin ∪ error), retrain from "
        "scratch on the remaining tokens with the independent oracle (`solve_svdd`, Clarabel + "
        "exact active-set polish), and compare. *Partition identical*: margin, error and "
        "reserve sets equal (alpha compared with absolute tolerance 1e-12). *Decision "
        "deviation* of a trial: max over probes of |f(x) − f_retrain(x)|, f(x) = 2 Σ α_i "
        "k(x, x_i) − k(x, x) + μ; probes = the keys plus 64 Gaussian points around them. The "
        "table gives the median, 95th percentile and worst over trials. *Coefficient decay*: "
        f"α_c ← {DECAY_FACTOR:g}·α_c, renormalise, μ refitted, nothing re-solved "
        "(`svattn.unlearning.coefficient_decay`).\n\n"
        + "\n".join(f"* **{k}**: {v[2]}" for k, v in key_sets.items())
    )
    detail = markdown_table(
        ["key set", "trials", "partition identical", "optimum unique", "exact dev median",
         "exact dev p95", "exact dev worst", "max |Δα| worst", "decay dev median",
         "decay dev worst"], detail_rows)
    notes = []
    if dup["exact_decision_dev"]["worst"] < 1e-3:
        notes.append(
            "Duplicate stream: the paper's worst case (1.1e-2) is not seen here — the decision "
            "function, which is unique even when alpha is not, matches the retrain to "
            f"{fmt_sci(dup['exact_decision_dev']['worst'])}. Alpha itself differs from the "
            f"retrain (worst max|Δα| {fmt_sci(dup['exact_alpha_dev']['worst'])}) whenever the "
            "optimum is not unique, and the certificate says so (`unique_optimum = False`) "
            "instead of claiming exactness.")
    if min(decay_meds) < 1e-2:
        notes.append(
            "Decay deviations are smaller than the paper's 1e-2–1e-1 on some key sets: the "
            "removed support token carries only α ≤ C of the mass, so shrinking it perturbs f "
            "by O(C); the paper's memory sizes and C are not stated, so the scale differs.")
    failed = {k: v for k, v in failures.items() if v}
    if failed:
        notes.append(
            "The from-scratch retrain (the independent oracle, `svattn.exact.oracle.solve_svdd`) "
            "raised `LinAlgError: SVD did not converge` twice in a row in "
            + ", ".join(f"{len(v)} {k} trial(s)" for k, v in failed.items())
            + "; those trials are left out of the statistics (listed in metrics.json). This is "
            "an oracle robustness issue on near-duplicate keys, not a removal failure.")
    notes.append(f"Learned keys come from a 1-layer model trained for {lk.seconds:.0f} s on CPU "
                 "(see above), not the paper's CharLM; the row is a stand-in until a trained "
                 "`svattn.lm` CharLM checkpoint is available.")
    return ExperimentResult(
        name=NAME, title=TITLE, what=what, claims=claims,
        verdict=("Exact removal equals retraining (partition identical in "
                 + ("every trial" if ident_min >= 1 else f"at least {ident_min:.0%} of trials")
                 + " on Gaussian, ICU and learned keys, median "
                 "decision deviation ≤ "
                 f"{fmt_sci(max(med[s] for s in unique_sets))}); decay does not "
                 f"(median {fmt_sci(min(decay_meds))}–{fmt_sci(max(decay_meds))})."),
        metrics=metrics, tables=[detail, compaction_table], figures=[figure],
        notes=[*notes, compaction_note],
    )


def _figure(ctx: Context, results: dict[str, list[RemovalTrial]]) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 4))
    names = list(results)
    floor = 1e-17
    for i, name in enumerate(names):
        for j, (attr, color, label) in enumerate(
            [("exact_decision_dev", "tab:blue", "exact removal"),
             ("decay_decision_dev", "tab:red", f"coefficient decay ×{DECAY_FACTOR:g}")]
        ):
            vals = np.maximum([getattr(r, attr) for r in results[name]], floor)
            x = i + (j - 0.5) * 0.35
            jitter = np.random.default_rng(j).uniform(-0.06, 0.06, len(vals))
            ax.scatter(x + jitter, vals, s=8, color=color, alpha=0.5,
                       label=label if i == 0 else None)
            est, lo, hi = bootstrap_ci(np.log10(vals), np.median, seed=ctx.seed)
            ax.errorbar([x + 0.12], [10**est], yerr=[[10**est - 10**lo], [10**hi - 10**est]],
                        fmt="_", color="k", capsize=3, markersize=10)
    ax.set_yscale("log")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("max |f − f_retrain| over probes")
    ax.set_title("Removal of one support token vs retraining from scratch")
    ax.legend(loc="center right", fontsize=8)
    n = len(next(iter(results.values())))
    return save_figure(fig, ctx.out, "forgetting_deviation.png",
                       f"{n} trials per key set (seeds {ctx.seed}+); black: median with 95% "
                       f"bootstrap interval; values below {floor:g} drawn at {floor:g}",
                       quick=ctx.quick)

