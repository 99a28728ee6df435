"""``rare-recall``: which memory keeps the rare items of a skewed, redundant stream?

The stream repeats a few *common* items many times (each repeat a noisy copy
of its prototype) and shows a few *rare* items once each. Every memory reads
the stream token by token under the same budget; at the end we count the rare
items of which at least one token is still held.

The SV memory has no hard budget (its box ``C`` sets the support); it runs
first, and every other memory gets a budget equal to the SV memory's final
state size (matched state).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from svattn.experiments._common import (
    NOT_REPRODUCED,
    PARTLY,
    REPRODUCED,
    Claim,
    Context,
    ExperimentResult,
    ci_dict,
    fmt_ci,
    markdown_table,
    matched_budget_positions,
    progress,
    pyplot,
    save_figure,
)

NAME = "rare-recall"
TITLE = "Rare-item recall under skewed redundancy, matched budget"

METHODS = ("sv", "h2o", "h2o_oracle", "snapkv", "sliding", "random")


@dataclass(frozen=True)
class SkewedStream:
    """A stream of noisy copies of item prototypes.

    Attributes
    ----------
    keys : ndarray, shape (T, d)
    values : ndarray, shape (T, n_items)
        One-hot item of each token.
    item : ndarray of int, shape (T,)
        Item of each token; items ``>= n_common`` are rare.
    prototypes : ndarray, shape (n_items, d)
    n_common : int
    """

    keys: np.ndarray
    values: np.ndarray
    item: np.ndarray
    prototypes: np.ndarray
    n_common: int

    @property
    def rare_items(self) -> np.ndarray:
        """Ids of the rare items."""
        return np.arange(self.n_common, self.prototypes.shape[0])


def skewed_stream(
    rng: np.random.Generator, *, length: int = 1000, n_common: int = 8, n_rare: int = 16,
    d: int = 16, noise: float = 0.1,
) -> SkewedStream:
    """Rare items once each at random positions; the rest uniform over the common items.

    Examples
    --------
    >>> s = skewed_stream(np.random.default_rng(0), length=100)
    >>> s.keys.shape, int((s.item >= 8).sum())
    ((100, 16), 16)
    """
    if length < n_rare:
        raise ValueError(f"length ({length}) must be >= n_rare ({n_rare})")
    protos = rng.normal(size=(n_common + n_rare, d))
    item = rng.integers(0, n_common, size=length)
    item[rng.choice(length, size=n_rare, replace=False)] = n_common + np.arange(n_rare)
    keys = protos[item] + noise * rng.normal(size=(length, d))
    values = np.eye(n_common + n_rare)[item]
    return SkewedStream(keys, values, item, protos, n_common)


def rare_kept(stream: SkewedStream, positions: np.ndarray) -> float:
    """Fraction of rare items with at least one token among ``positions``.

    Examples
    --------
    >>> s = skewed_stream(np.random.default_rng(0), length=50, n_rare=2)
    >>> rare_kept(s, np.arange(50)), rare_kept(s, np.array([], dtype=int))
    (1.0, 0.0)
    """
    kept = set(stream.item[np.asarray(positions, dtype=np.int64)].tolist())
    return float(np.mean([r in kept for r in stream.rare_items]))


def rare_recall_trial(
    stream: SkewedStream, *, C: float, methods: Sequence[str] = METHODS, seed: int = 0,
) -> tuple[dict[str, float], int]:
    """Run every memory over ``stream`` at the SV memory's budget; rare fraction kept each.

    Parameters
    ----------
    stream : SkewedStream
    C : float
        Box bound of the SV memory (its final state size becomes everyone's budget).
    methods : sequence of str
        Names in :data:`svattn.memory.MEMORIES` plus ``"random"`` (a uniform
        random subset of the budget's size). ``"sv"`` always runs.
    seed : int
        For ``"random"``.

    Returns
    -------
    (dict of str to float, int)
        Rare fraction kept per method, and the matched budget.

    Examples
    --------
    >>> s = skewed_stream(np.random.default_rng(0), length=200)
    >>> kept, budget = rare_recall_trial(s, C=0.1, methods=["sv", "sliding"])
    >>> sorted(kept), budget >= 10
    (['sliding', 'sv'], True)
    """
    pos, budget = matched_budget_positions(
        stream.keys, stream.values, C, methods, seed,
        options={"h2o_oracle": {"oracle_queries": stream.prototypes}},
    )  # fmt: skip
    kept = {name: rare_kept(stream, p) for name, p in pos.items()}
    return kept, budget


def run(ctx: Context) -> ExperimentResult:
    """Many seeds; mean rare fraction kept per method with bootstrap intervals."""
    length, seeds = (300, 4) if ctx.quick else (2000, 30)
    C = 0.05
    per: dict[str, list[float]] = {m: [] for m in METHODS}
    budgets = []
    for i in progress(range(seeds), desc="rare-recall"):
        stream = skewed_stream(np.random.default_rng([ctx.seed, i]), length=length)
        kept, budget = rare_recall_trial(stream, C=C, seed=ctx.seed + i)
        budgets.append(budget)
        for m in METHODS:
            per[m].append(kept[m])
    stats = {m: ci_dict(v, seed=ctx.seed) for m, v in per.items()}
    metrics = {"config": {"length": length, "seeds": seeds, "C": C, "n_common": 8, "n_rare": 16,
                          "d": 16, "noise": 0.1},
               "budget": {"mean": float(np.mean(budgets)), "min": int(min(budgets)),
                          "max": int(max(budgets))},
               "rare_kept": stats}
    sv, h2o, h2o_o = (stats[m]["value"] for m in ("sv", "h2o", "h2o_oracle"))
    claims = [
        Claim("Rare items kept: SV certified selection", "0.86", fmt_ci(stats["sv"]),
              REPRODUCED if sv >= 0.8 else PARTLY if sv > max(h2o, h2o_o) else NOT_REPRODUCED),
        Claim("Rare items kept: H2O heavy hitters (also with oracle query access)", "0.32",
              f"{fmt_ci(stats['h2o'])}; oracle {fmt_ci(stats['h2o_oracle'])}",
              # both near the paper's 0.32 (within 0.15) and below SV; below SV alone: partly
              REPRODUCED if max(h2o, h2o_o) <= 0.47 and min(h2o, h2o_o) >= 0.17
              and max(h2o, h2o_o) < sv else PARTLY if max(h2o, h2o_o) < sv
              else NOT_REPRODUCED),
    ]
    figure = _figure(ctx, stats, seeds, metrics["budget"])
    what = (
        f"{seeds} seeds. Stream of {length} tokens in d = 16: 8 common items repeated at random "
        "(≈ (T − 16)/8 copies each) and 16 rare items shown once each at random positions; "
        "item prototypes ~ N(0, I), each token = its prototype + N(0, 0.1²) noise; values = "
        "one-hot item. Every memory reads the stream token by token (its own keys as "
        f"queries). SV: streaming `SVMemory` (exact SVDD, rbf, gamma = 1/d, C = {C}, reserve "
        "tokens dropped after every write = certified selection). Budget of every other "
        "memory = the SV memory's final state size in that seed (matched state; "
        f"{metrics['budget']['min']}–{metrics['budget']['max']} tokens). H2O: cumulative "
        "attention + recent window (half the budget); H2O oracle: scored by the future "
        "queries (one per item prototype, all 24); SnapKV: observation-window scores with "
        "pooling; sliding window; random: a uniform random subset of the budget's size. "
        "Figure of merit: fraction of rare items with at least one token held at the end."
    )
    table = markdown_table(["method", "rare items kept (mean [95% CI])"],
                           [[m, fmt_ci(stats[m])] for m in METHODS])
    notes = []
    if sv < 0.8:
        notes.append(f"SV keeps {sv:.2f} of the rare items, below the paper's 0.86.")
    if h2o_o > h2o + 0.2:
        notes.append(
            "H2O with oracle queries does much better here than the paper's 0.32: our oracle "
            "asks one query per item, so each rare item's own query concentrates its "
            "attention on that item's single token.")
    return ExperimentResult(
        name=NAME, title=TITLE, what=what, claims=claims,
        verdict=(f"SV keeps {sv:.2f} of the rare items vs H2O {h2o:.2f} (oracle {h2o_o:.2f}), "
                 f"SnapKV {stats['snapkv']['value']:.2f}, sliding "
                 f"{stats['sliding']['value']:.2f}, random {stats['random']['value']:.2f}."),
        metrics=metrics, tables=[table], figures=[figure], notes=notes,
    )


def _figure(ctx: Context, stats: dict, seeds: int, budget: dict) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    est = [stats[m]["value"] for m in METHODS]
    err = np.array([[stats[m]["value"] - stats[m]["ci95"][0] for m in METHODS],
                    [stats[m]["ci95"][1] - stats[m]["value"] for m in METHODS]])
    colors = ["tab:blue"] + ["tab:gray"] * (len(METHODS) - 1)
    ax.bar(METHODS, est, yerr=err, capsize=4, color=colors)
    ax.axhline(0.86, color="tab:blue", ls=":", label="paper: SV 0.86")
    ax.axhline(0.32, color="tab:red", ls=":", label="paper: H2O 0.32")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("rare items kept")
    ax.set_title(f"Rare-item recall at matched budget ({budget['min']}–{budget['max']} tokens)")
    ax.legend(fontsize=8)
    return save_figure(fig, ctx.out, "rare_recall.png",
                       f"{seeds} seeds; error bars: 95% bootstrap intervals over seeds",
                       quick=ctx.quick)
