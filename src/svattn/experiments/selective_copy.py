"""``selective-copy``: recall of a few data tokens as the filler around them grows.

Memory-level version (no training): a sequence of length ``L`` holds 16 data
tokens (symbols from a vocabulary of 16) at random positions, and filler
everywhere else, as in the selective-copying task. Keys are token embeddings
plus a per-position perturbation (every token, data or filler, gets
``N(0, 0.3²)`` noise, standing in for positional information), values are the
one-hot symbol (16 data symbols + filler). After the whole sequence, each
data token is addressed by its key; it is *recalled* when the memory's output
decodes (argmax over the 17 symbols) to its symbol.

Memories: the SV memory (streaming, reserve tokens dropped), DeltaNet and
linear attention with their fixed state, a sliding window holding as many
tokens as the SV memory does, and (as a reference, unmatched state) full
softmax attention over every token.
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
    progress,
    pyplot,
    save_figure,
)
from svattn.memory import MEMORIES

NAME = "selective-copy"
TITLE = "Selective copying with growing filler: recall and support size"

N_DATA = 16
VOCAB = 16
METHODS = ("sv", "deltanet", "linear", "sliding", "full")
# Metrics key of each memory's tokens_kept(): the committed
# results/reproduce/selective-copy/metrics.json names it "state_size", kept so
# that reruns write the same file.
KEPT_KEY = "state_size"


@dataclass(frozen=True)
class CopySequence:
    """One selective-copy sequence.

    Attributes
    ----------
    keys : ndarray, shape (L, d)
    values : ndarray, shape (L, VOCAB + 1)
        One-hot symbol; index ``VOCAB`` is the filler.
    data_positions : ndarray of int, shape (N_DATA,)
    symbols : ndarray of int, shape (N_DATA,)
    """

    keys: np.ndarray
    values: np.ndarray
    data_positions: np.ndarray
    symbols: np.ndarray


def copy_sequence(
    rng: np.random.Generator, length: int, *, d: int = 32, noise: float = 0.3,
    embeddings: np.ndarray | None = None,
) -> CopySequence:
    """Draw a sequence: ``N_DATA`` data tokens at random sorted positions, filler elsewhere.

    ``embeddings`` (``(VOCAB + 1, d)``, last row the filler) defaults to N(0, I) rows.

    Examples
    --------
    >>> s = copy_sequence(np.random.default_rng(0), 64)
    >>> s.keys.shape, len(s.data_positions)
    ((64, 32), 16)
    """
    if length < N_DATA:
        raise ValueError(f"length must be >= {N_DATA}, got {length}")
    emb = rng.normal(size=(VOCAB + 1, d)) if embeddings is None else embeddings
    symbols = rng.integers(0, VOCAB, size=N_DATA)
    positions = np.sort(rng.choice(length, size=N_DATA, replace=False))
    token = np.full(length, VOCAB)
    token[positions] = symbols
    keys = emb[token] + noise * rng.normal(size=(length, d))
    values = np.eye(VOCAB + 1)[token]
    return CopySequence(keys, values, positions, symbols)


def copy_recall(
    seq: CopySequence, name: str, *, C: float = 1.0 / N_DATA, budget: int | None = None,
) -> tuple[float, int]:
    """Stream ``seq`` into memory ``name``; fraction of data tokens recalled, and state size.

    Parameters
    ----------
    seq : CopySequence
    name : str
        A name of :data:`svattn.memory.MEMORIES`.
    C : float
        Box bound when ``name == "sv"``.
    budget : int, optional
        For memories with a hard budget.

    Returns
    -------
    (float, int)
        Recall and ``tokens_kept()`` at the end.

    Examples
    --------
    >>> s = copy_sequence(np.random.default_rng(0), 128)
    >>> recall, size = copy_recall(s, "full")
    >>> recall
    1.0
    """
    d, dv = seq.keys.shape[1], seq.values.shape[1]
    opts = {"C": C} if name == "sv" else {}
    mem = MEMORIES[name](dim=d, value_dim=dv, budget=budget, **opts)
    for t in range(len(seq.keys)):
        mem.write(seq.keys[t], seq.values[t])
    out = mem.read(seq.keys[seq.data_positions])  # (N_DATA, VOCAB + 1)
    recall = float(np.mean(out.argmax(axis=1) == seq.symbols))
    return recall, mem.tokens_kept()


def run(ctx: Context) -> ExperimentResult:
    """All lengths, several seeds each; recall and support size with bootstrap intervals."""
    lengths: Sequence[int] = (256, 1024) if ctx.quick else (256, 512, 1024, 2048, 4096, 8192)
    seeds = 3 if ctx.quick else 8
    C = 1.0 / N_DATA
    recall = {m: {L: [] for L in lengths} for m in METHODS}
    size = {m: {L: [] for L in lengths} for m in METHODS}
    jobs = [(L, i) for L in lengths for i in range(seeds)]
    for L, i in progress(jobs, desc="selective-copy"):
        seq = copy_sequence(np.random.default_rng([ctx.seed, L, i]), L)
        r, s = copy_recall(seq, "sv", C=C)
        recall["sv"][L].append(r)
        size["sv"][L].append(s)
        for m in METHODS[1:]:
            r, s2 = copy_recall(seq, m, budget=s)
            recall[m][L].append(r)
            size[m][L].append(s2)
    stats = {m: {str(L): {"recall": ci_dict(recall[m][L], seed=ctx.seed),
                          KEPT_KEY: ci_dict(size[m][L], seed=ctx.seed)}
                 for L in lengths} for m in METHODS}
    metrics = {"config": {"lengths": list(lengths), "seeds": seeds, "C": C, "n_data": N_DATA,
                          "vocab": VOCAB, "d": 32, "noise": 0.3, "chance": 1 / (VOCAB + 1)},
               "methods": stats}
    longest = str(lengths[-1])
    sv_min = min(stats["sv"][str(L)]["recall"]["value"] for L in lengths)
    sv_sizes = [v for L in lengths for v in size["sv"][L]]
    fixed_long = {m: stats[m][longest]["recall"]["value"] for m in ("deltanet", "linear")}
    chance = 1 / (VOCAB + 1)
    claims = [
        Claim("Selective copy, filler growing: SV recall (memory level)", "~0.99",
              f"min over L = {lengths[0]}…{lengths[-1]}: {sv_min:.2f}",
              REPRODUCED if sv_min >= 0.95 else PARTLY if sv_min >= 0.8 else NOT_REPRODUCED),
        Claim("… with SV support of", "11–14 tokens",
              f"{min(sv_sizes)}–{max(sv_sizes)} tokens (C = 1/{N_DATA})",
              "differs (C sets it; see report)"),
        Claim(f"… DeltaNet / linear attention fall to chance at L = {longest}", "chance",
              f"{fixed_long['deltanet']:.2f} / {fixed_long['linear']:.2f} (chance "
              f"{chance:.2f})",
              REPRODUCED if max(fixed_long.values()) <= 3 * chance else PARTLY
              if min(fixed_long.values()) <= 3 * chance else NOT_REPRODUCED),
    ]
    rows = []
    for L in lengths:
        rows.append([L] + [fmt_ci(stats[m][str(L)]["recall"]) for m in METHODS]
                    + [f"{stats['sv'][str(L)][KEPT_KEY]['value']:.1f}",
                       f"{stats['deltanet'][str(L)][KEPT_KEY]['value']:.0f}"])
    table = markdown_table(["L"] + [f"recall {m}" for m in METHODS]
                           + ["SV support", "DeltaNet/linear state (pairs)"], rows)
    figure = _figure(ctx, stats, lengths, seeds)
    what = (
        f"{seeds} seeds per length L ∈ {list(lengths)}. Each sequence: {N_DATA} data tokens "
        f"(symbols uniform over {VOCAB}) at random positions, filler elsewhere. Keys: embedding "
        "(N(0, I_32) per symbol, one for the filler) + N(0, 0.3²) noise per token (standing "
        "in for positional information, so no two keys coincide); values: one-hot symbol "
        f"({VOCAB + 1} classes). Memories read the sequence token by token; afterwards each "
        "data token is addressed with its own key and counts as recalled when the output's "
        f"argmax is its symbol. SV: streaming `SVMemory`, rbf, gamma = 1/d, C = 1/{N_DATA} (at "
        f"least {N_DATA} support tokens: room for the data). DeltaNet (β = 1) and linear "
        "attention (elu+1) keep their fixed d×dv state (≈ 12 key/value pairs' worth); the "
        "sliding window holds as many tokens as the SV memory at the end; full softmax "
        "attention (scale 1/sqrt(d)) keeps every token (a reference with unmatched state). "
        "Chance = 1/17."
    )
    notes = [
        "Memory-level version only (keys = noisy token embeddings, no training); the trained "
        "small-model version of the task was not run (CPU time).",
        "Full softmax attention (every token kept, scale 1/sqrt(d)) also loses the data "
        "tokens as filler grows: each data token's own logit is a fixed margin above the "
        "filler's, so thousands of filler tokens outweigh it. The SV memory's weights α "
        "(filler gets little or none) are what keep the readout on the data.",
        f"The SV support is {min(sv_sizes)}–{max(sv_sizes)} tokens, not 11–14: C = 1/{N_DATA} "
        f"forces at least {N_DATA}; the paper's C for this task is not stated and we did not "
        "tune it.",
    ]
    return ExperimentResult(
        name=NAME, title=TITLE, what=what, claims=claims,
        verdict=(("SV recall 1.00 (every token recalled)" if sv_min >= 1 else
                  f"SV recall at least {sv_min:.2f}") + f" at every length up to {longest} with "
                 f"{min(sv_sizes)}–{max(sv_sizes)} support tokens; at L = {longest} DeltaNet "
                 f"{fixed_long['deltanet']:.2f}, linear {fixed_long['linear']:.2f}."),
        metrics=metrics, tables=[table], figures=[figure], notes=notes,
    )


def _figure(ctx: Context, stats: dict, lengths: Sequence[int], seeds: int) -> str:
    plt = pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(9, 3.8))
    colors = {"sv": "tab:blue", "deltanet": "tab:orange", "linear": "tab:green",
              "sliding": "tab:gray", "full": "tab:purple"}
    # Matched baselines share a state size with SV (sliding) or each other (deltanet,
    # linear): distinct markers and dashes, SV drawn last and thickest, so none hides.
    styles = {"sv": dict(marker="o", ls="-", lw=2.5, ms=7, zorder=5),
              "sliding": dict(marker="s", ls="--", lw=1.5, ms=9, mfc="none", zorder=4),
              "deltanet": dict(marker="^", ls="-", lw=1.5, ms=7, zorder=3),
              "linear": dict(marker="v", ls="--", lw=1.5, ms=9, mfc="none", zorder=3),
              "full": dict(marker="D", ls="-", lw=1.5, ms=5, zorder=3)}
    for m in METHODS:
        est = np.array([stats[m][str(L)]["recall"]["value"] for L in lengths])
        lo = np.array([stats[m][str(L)]["recall"]["ci95"][0] for L in lengths])
        hi = np.array([stats[m][str(L)]["recall"]["ci95"][1] for L in lengths])
        ax.plot(lengths, est, color=colors[m], label=m, **styles[m])
        ax.fill_between(lengths, lo, hi, color=colors[m], alpha=0.2)
        s = np.array([stats[m][str(L)][KEPT_KEY]["value"] for L in lengths])
        ax2.plot(lengths, s, color=colors[m], label=m, **styles[m])
    ax.axhline(1 / (VOCAB + 1), color="k", ls=":", lw=1, label="chance")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("sequence length L (16 data tokens)")
    ax.set_ylabel("data tokens recalled")
    ax.set_ylim(-0.03, 1.03)
    ax.legend(fontsize=7)
    ax.set_title("Recall")
    ax2.set_xscale("log", base=2)
    ax2.set_yscale("log")
    ax2.set_xlabel("sequence length L")
    ax2.set_ylabel("state (key/value pairs)")
    ax2.set_title("State size")
    ax2.legend(fontsize=7, title="sliding: window = SV's support", title_fontsize=7)
    return save_figure(fig, ctx.out, "selective_copy.png",
                       f"{seeds} seeds per length; bands: 95% bootstrap intervals over seeds",
                       quick=ctx.quick)
