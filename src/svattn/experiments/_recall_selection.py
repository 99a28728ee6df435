"""The ``recall`` report's box grid: selection measured on the optimum, the box chosen on
a validation split.

Grid ``selection`` (``results/recall_selection.json``: trained selective copy,
T = 128, the hybrid at C ∈ {1/4, 1/8, 1/16}, 3 seeds each, weights kept) is reported
from three records:

* its accuracies (test split, the grid's own forward) and hybrid − window margins,
  from the collected results;
* what the memories select, from ``results/selection_on_optimum.json``
  (``benchmarks/selection_on_optimum.py``): each kept model's last-boundary memories
  re-solved exactly (the certified solver and the oracle, on the float64 forward), by
  count, by distinct key and by weight. The grid's own figures are not used: they
  were read off its training solver, whose alpha leaves the box on trained keys;
* the box chosen without the test set, from ``results/box_on_validation.json``
  (``benchmarks/box_on_validation.py``): each model scored on a validation split
  drawn with another seed, the box chosen there, its test accuracy beside the box
  fixed before training and the best box on test.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from svattn.experiments._common import (
    NOT_REPRODUCED,
    NOT_RUN,
    PARTLY,
    REPRODUCED,
    Claim,
    Context,
    markdown_table,
    pyplot,
    save_figure,
)
from svattn.lm.recall_grid import mean_interval

NOT_SHOWN = "not shown"
#: The paper's support size on trained selective copy (tokens per head).
PAPER_SUPPORT = (11, 14)
#: Records this section reads, under ``results/``.
OPTIMUM_RECORD = "selection_on_optimum.json"
BOX_RECORD = "box_on_validation.json"
COMPACTION_RECORD = "selection_compaction.json"


def fmt_interval(acc: dict) -> str:
    """``mean [lo, hi] (n seeds)`` of a :func:`~svattn.lm.recall_grid.mean_interval`."""
    if acc["ci95"] is None:
        return f"{acc['mean']:.3f} (1 seed)"
    lo, hi = acc["ci95"]
    return f"{acc['mean']:.3f} [{lo:.3f}, {hi:.3f}] ({acc['n']} seeds)"


def fraction(C: float) -> str:
    """``1/n`` for a box ``C = 1/n``."""
    return f"1/{round(1 / C)}" if abs(1 / C - round(1 / C)) < 1e-9 else f"{C:g}"


def accuracy_verdict(acc: dict, qualifier: str = "") -> str:
    """Against the paper's ≈ 0.99: reproduced from 0.95, partly from 0.8, not reproduced
    where the 95 % interval lies wholly below 0.8, else not shown; ``qualifier`` is
    appended to a reproduced verdict."""
    mean, ci = acc["mean"], acc["ci95"]
    if mean >= 0.95:
        return REPRODUCED + qualifier
    if mean >= 0.8:
        return PARTLY + qualifier
    return NOT_REPRODUCED if ci and ci[1] < 0.8 else NOT_SHOWN


def _record(ctx: Context, name: str) -> dict | None:
    if ctx.quick or ctx.repo_root is None:
        return None
    path = ctx.repo_root / "results" / name
    return json.loads(path.read_text()) if path.exists() else None


def load_selection_results(ctx: Context) -> dict | None:
    """The box grid's results (``results/recall_selection.json``: grid ``selection``,
    collected by ``svattn recall collect``), if collected."""
    return _record(ctx, "recall_selection.json")


def load_compaction(ctx: Context) -> dict | None:
    """The compaction study of a kept selection cell (``results/selection_compaction.json``,
    written by ``benchmarks/selection_compaction.py``), if run."""
    return _record(ctx, COMPACTION_RECORD)


def _optimum_by_box(opt: dict) -> dict[float, dict]:
    """Per box: the exact figures (certified solver; the oracle's count beside), means
    over the kept models, and the data mass's excess over its share per seed."""
    out = {}
    for C in sorted({r["C"] for r in opt["rows"]}, reverse=True):
        rows = sorted((r for r in opt["rows"] if r["C"] == C), key=lambda r: r["seed"])
        mem = [r["summary"]["memory"] for r in rows if "memory" in r["summary"]]
        ora = [r["summary"]["oracle"] for r in rows if "oracle" in r["summary"]]
        if not mem:
            continue
        unique = [x["unique_optimum_share"] for r in rows for x in r["layers"]
                  if x["unique_optimum_share"] is not None]
        out[C] = {
            "models": len(mem), "seeds": [r["seed"] for r in rows],
            "sequences": rows[0]["sequences"],
            "support_per_head": float(np.mean([m["support_per_head"] for m in mem])),
            "distinct_support_per_head": float(np.mean(
                [m["distinct_support_per_head"] for m in mem])),
            "oracle_support_per_head": (float(np.mean([m["support_per_head"] for m in ora]))
                                        if ora else None),
            "data_mass": float(np.mean([m["data_mass"] for m in mem])),
            "data_share": float(np.mean([m["data_share"] for m in mem])),
            "mass_minus_share": mean_interval([m["data_mass"] - m["data_share"] for m in mem]),
            "mass_solvers_differ": max((abs(a["data_mass"] - b["data_mass"])
                                        for a, b in zip(mem, ora, strict=False)), default=None),
            "unique_optimum_share": float(np.mean(unique)) if unique else None,
            "fallback_sequences": sum(r["forward"]["optimum_fallback"] for r in rows),
            "layers": [(x["layer"], x["by_solver"]["memory"]["support_per_head"])
                       for r in rows for x in r["layers"] if "memory" in x["by_solver"]],
        }
    return out


def _box_claims(box: dict, recorded: dict[tuple[float, int], float]
                ) -> tuple[list[Claim], list[str]]:
    """The box chosen on validation against the fixed box and the best on test, on the
    grid's own forward; the certified forward's choice in a note. ``recorded``: the
    grid's test accuracy per (C, seed), which the record's own forward re-measures."""
    f = box["forwards"]["as_trained"]
    chosen, fixed, best = f["chosen_overall"], f["fixed"], f["best_on_test"]
    n_data = box["n_data"]
    cond = ("C = 1/n_data" if abs(chosen["C"] - 1 / n_data) < 1e-12
            else f"not C = 1/n_data = 1/{n_data}")
    seeds = sorted(f["chosen_per_seed"].items(), key=lambda kv: int(kv[0]))
    per_seed = "; ".join(f"seed {s}: C = {fraction(v['C'])}, test {v['test']:.3f}"
                         for s, v in seeds)
    claims = [Claim(
        f"… SV recall at T = 128 with the box chosen on a validation split (another seed, "
        f"not the test): C = {fraction(chosen['C'])} ({cond}, {n_data} data tokens)",
        "≈ 0.99",
        f"test {fmt_interval(chosen['test'])} (validation {chosen['validation']['mean']:.3f}); "
        f"chosen per seed: {per_seed} (mean {f['chosen_per_seed_test']['mean']:.3f}); the box "
        f"fixed before training, C = {fraction(fixed['C'])}: {fmt_interval(fixed['test'])}; "
        f"the best box on test, C = {fraction(best['C'])}: {fmt_interval(best['test'])}",
        accuracy_verdict(chosen["test"], f" (where C = {fraction(chosen['C'])} = "
                         f"1/n_data won on validation)" if cond == "C = 1/n_data" else ""))]
    claims.append(Claim(
        f"… SV recall at T = 128 with the box fixed before training (C = {fraction(fixed['C'])})",
        "≈ 0.99", fmt_interval(fixed["test"]), accuracy_verdict(fixed["test"])))
    o = box["forwards"].get("optimum")
    drift = max((abs(r["as_trained"]["test"] - recorded[r["C"], r["seed"]])
                 for r in box["rows"] if (r["C"], r["seed"]) in recorded), default=0.0)
    notes = [
        "The box without the test set (`results/box_on_validation.json`, "
        "`benchmarks/box_on_validation.py`): each kept model scored on a validation split "
        f"of its task drawn with seed + {box['validation_seed_offset']} (independent of its "
        "train and test draws; "
        f"{sum(r['validation_rows_in_train_or_test'] for r in box['rows'])} validation rows "
        "also occur in a train or test split), the box chosen there per seed and by mean over "
        "seeds (ties to the larger box: "
        f"{', '.join(str(t) for t in f['ties']) or 'none'}), the grid's own forward (the "
        "approximate finish it trained with; its test accuracies are the grid's recorded "
        f"ones to within {drift:.4f}). " + f["verdict"] + "."]
    if o is not None:
        notes.append("On the certified function (the optimum finish, float32; ~1e-4 from the "
                     "exact forward in the logits): " + o["verdict"] + ".")
    notes.append("Not yet done: " + box.get("not_done", "") + ".")
    return claims, notes


def selection_section(ctx: Context, sel: dict) -> tuple[list[Claim], str, list[str], str]:
    """The box grid: per C the accuracy, hybrid − window paired by seed, and the exact
    re-solve's support by count and by distinct key and alpha mass on the data tokens
    against their prefix share. Claims: recall with the box tuned on test, chosen on
    validation and fixed beforehand; the support size of the optimum; whether the
    memory selects by weight."""
    rows = list(sel["cells"])
    hyb = [r for r in rows if r["mixer"] == "hybrid_sv"]
    win = {r["seed"]: r["accuracy"] for r in rows if r["mixer"] == "sliding"}
    boxes = sorted({r["C"] for r in hyb}, reverse=True)
    opt = _record(ctx, OPTIMUM_RECORD)
    exact = {} if opt is None else _optimum_by_box(opt)
    table_rows, acc_by_box = [], {}
    for C in boxes:
        cells = sorted((r for r in hyb if r["C"] == C), key=lambda r: r["seed"])
        acc = acc_by_box[C] = mean_interval([r["accuracy"] for r in cells])
        diffs = [r["accuracy"] - win[r["seed"]] for r in cells if r["seed"] in win]
        margin = mean_interval(diffs) if diffs else None
        e = exact.get(C)
        table_rows.append([
            fraction(C), len(cells), fmt_interval(acc),
            "—" if margin is None else fmt_interval(margin),
            *(["not measured on the optimum"] * 4 if e is None else [
                f"{e['support_per_head']:.1f}", f"{e['distinct_support_per_head']:.1f}",
                f"{e['oracle_support_per_head']:.1f}", f"{e['data_mass']:.3f}"]),
            "—" if e is None else f"{e['data_share']:.3f}",
            f"{min(1.0, 8 * C):.3f}",
            f"{float(np.mean([r['gate_mean'] for r in cells])):.2f}"])
    if win:
        table_rows.append(["window (matched)", len(win), fmt_interval(mean_interval(
            list(win.values()))), *(["—"] * 8)])
    seqs = next(iter(exact.values()))["sequences"] if exact else 0
    table = ("Does a looser box let the memory select? (grid `selection`: selective copy, "
             "T = 128, 8 data tokens; accuracy on the test split by the grid's own forward; "
             "support and mass from exact re-solves of each kept model's last-boundary "
             f"memories over {seqs} test sequences, means over seeds, the 2 layers and "
             "2 heads)\n\n"
             + markdown_table(["C", "seeds", "accuracy (test)", "hybrid − window (paired)",
                               "support / head (certified solver, count)",
                               "distinct keys / head", "support / head (oracle, count)",
                               "alpha mass on data tokens", "data tokens' prefix share",
                               "most the box lets 8 data tokens hold (8·C)", "gate"],
                              table_rows))
    if not acc_by_box:
        return ([Claim("… SV support, by weight and by distinct key (grid selection)",
                       "11–14 tokens", "no hybrid cell collected yet", NOT_RUN)],
                table, [], "")
    tuned = max(acc_by_box, key=lambda C: acc_by_box[C]["mean"])
    claims = [Claim(
        f"… SV recall at T = 128 with the box tuned on the test set (the best of "
        f"{len(acc_by_box)} boxes by mean test accuracy: C = {fraction(tuned)})",
        "≈ 0.99", fmt_interval(acc_by_box[tuned]),
        accuracy_verdict(acc_by_box[tuned], " with a box tuned on the test set"))]
    notes = []
    box = _record(ctx, BOX_RECORD)
    if box is not None:
        box_claims, box_notes = _box_claims(
            box, {(r["C"], r["seed"]): r["accuracy"] for r in hyb})
        claims += box_claims
        notes += box_notes
    else:
        claims.append(Claim("… SV recall at T = 128 with the box chosen on a validation split",
                            "≈ 0.99", f"not run ({BOX_RECORD} absent)", NOT_RUN))
    lo, hi = PAPER_SUPPORT
    at = box["forwards"]["as_trained"]["chosen_overall"]["C"] if box is not None else tuned
    e = exact.get(at)
    comp_claims, comp_notes = _compaction(ctx)
    if e is None:
        claims.append(Claim("… SV support per head of the optimum (grid selection)",
                            f"{lo}–{hi} tokens", f"not run ({OPTIMUM_RECORD} absent)",
                            NOT_RUN))
        return claims + comp_claims, table, notes + comp_notes, ""
    by_layer = {}
    for layer, heads in e["layers"]:
        by_layer.setdefault(layer, []).extend(heads)
    layers = ", ".join(f"layer {k}: {np.mean(v):.1f}" for k, v in sorted(by_layer.items()))
    claims.append(Claim(
        f"… SV support per head of the optimum (C = {fraction(at)}, the kept models' "
        f"last-boundary memories re-solved exactly, {e['sequences']} test sequences each)",
        f"{lo}–{hi} tokens",
        f"{e['support_per_head']:.1f} by count ({layers}), "
        f"{e['distinct_support_per_head']:.1f} distinct keys (certified solver, a sparse "
        f"optimum); the optimum is unique in {e['unique_optimum_share']:.0%} of the "
        f"memories (copies of one key), and the oracle's interior-point optimum spreads "
        f"the weight over copies ({e['oracle_support_per_head']:.1f} by count)",
        REPRODUCED if lo <= e["distinct_support_per_head"] <= hi else "differs"))
    excess = e["mass_minus_share"]
    selects = excess["ci95"] is not None and excess["ci95"][0] > 0
    claims.append(Claim(
        f"… the trained memory selects: alpha mass of the optimum on the data tokens above "
        f"their prefix share (C = {fraction(at)}, 95 % interval over seeds)",
        "selection (implied)",
        f"mass {e['data_mass']:.3f} vs share {e['data_share']:.3f} "
        f"(difference {fmt_interval(excess)})",
        REPRODUCED if selects else NOT_SHOWN))
    fallback = sum(x["fallback_sequences"] for x in exact.values())
    seqs_run = sum(x["sequences"] * x["models"] for x in exact.values())
    fallback_text = (f"the exact path ran all {seqs_run} sequences" if not fallback else
                     f"where the exact path raised, on {fallback} of {seqs_run} sequences, by "
                     "the optimum finish in float64 instead")
    notes.append(
        "Selection read three ways, on the optimum (`results/selection_on_optimum.json`, "
        "`benchmarks/selection_on_optimum.py`): each kept model runs its test sequences in "
        f"float64 with its hybrid layers in exact mode ({fallback_text}), and each layer's "
        "memory of "
        "the last boundary over the whole prefix is re-solved by the certified solver "
        "(`SVDDMemory`) and by the oracle (`solve_svdd`): by **count** (tokens with alpha > "
        "0), by **distinct keys** (exact copies merged) and by **weight** (the alpha mass on "
        "the data tokens against their share of the prefix; alpha sums to 1 per head, and "
        "the box lets 8 data tokens hold at most 8·C of it). Where keys repeat or the kernel "
        "matrix is singular the optimum is not unique: the count is then the solver's (the "
        "certified solver's sparse optimum against the oracle's spread one), while the mass "
        "by role agrees between them to "
        f"{max(x['mass_solvers_differ'] or 0.0 for x in exact.values()):.1g}. The grid's "
        "own figures, read off its training solver (alpha outside the box on trained keys), "
        "are not used.")
    claims, notes = claims + comp_claims, notes + comp_notes
    return claims, table, notes, figure_selection(ctx, hyb, opt)


def _compaction(ctx: Context) -> tuple[list[Claim], list[str]]:
    """The exact stream's support and what compaction drops, from the compaction study."""
    lo, hi = PAPER_SUPPORT
    claims: list[Claim] = []
    notes: list[str] = []
    comp = load_compaction(ctx)
    if comp is not None:
        sm = comp["summary"]
        share = sm["compactable"] / sm["held"] if sm["held"] else 0.0
        cell = Path(comp["model"]).stem
        claims.append(Claim(
            f"… SV support per head of the exact memory (a kept cell, {cell}, streamed in "
            f"float64: `benchmarks/selection_compaction.py`, {len(comp['sequences'])} "
            "test sequences)", f"{lo}–{hi} tokens",
            f"{sm['support_per_memory']:.1f} tokens ({sm['distinct_support_keys_per_memory']:.1f} "
            f"distinct keys); {share:.0%} of the held tokens reserve, dropped by compact() "
            f"with the readout unchanged (largest change {sm['max_readout_change']:.1g})",
            REPRODUCED if lo <= sm["support_per_memory"] <= hi else "differs"))
        notes.append(
            "The exact stream (`CharLM.stream`, what `forget` certifies) holds each memory "
            "over every finished chunk; compaction and the cost of a forget are measured on "
            "it in `results/selection_compaction.json`, which times a forget of a selected "
            "data token against a never-selected filler: the replay of every byte after the "
            "span, which equality with a fresh stream forces, dominates both (median "
            f"{sm['forget_selected_data_token_median_s']:.3f} s and "
            f"{sm['forget_never_selected_filler_median_s']:.3f} s).")
    return claims, notes


def figure_selection(ctx: Context, cells: list[dict], opt: dict | None) -> str:
    """Alpha mass of the optimum on the data tokens and its distinct support against
    accuracy, one marker per kept hybrid model of the box grid, coloured by C."""
    if opt is None:
        return ""
    acc = {(r["C"], r["seed"]): r["accuracy"] for r in cells}
    pts = [(r["C"], r["summary"]["memory"], acc.get((r["C"], r["seed"])))
           for r in opt["rows"] if "memory" in r["summary"]]
    pts = [p for p in pts if p[2] is not None]
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(9.6, 3.8))
    boxes = sorted({p[0] for p in pts}, reverse=True)
    cmap = plt.get_cmap("viridis")
    for i, C in enumerate(boxes):
        mine = [p for p in pts if p[0] == C]
        colour = cmap(i / max(1, len(boxes) - 1))
        label = f"C = {fraction(C)}"
        axes[0].scatter([p[1]["data_mass"] for p in mine], [p[2] for p in mine],
                        color=colour, label=label, s=40, edgecolor="k", zorder=3)
        axes[1].scatter([p[1]["distinct_support_per_head"] for p in mine],
                        [p[2] for p in mine], color=colour, label=label, s=40,
                        edgecolor="k", zorder=3)
    share = float(np.mean([p[1]["data_share"] for p in pts])) if pts else 0.0
    axes[0].axvline(share, color="0.5", ls=":", lw=1)
    axes[0].text(share, 0.02, " data tokens' share\n of the prefix", fontsize=7, color="0.4")
    axes[0].set_xlabel("alpha mass of the optimum on the data tokens (mean over layers, heads)")
    axes[1].axvspan(*PAPER_SUPPORT, color="tab:orange", alpha=0.15, lw=0)
    axes[1].text(PAPER_SUPPORT[0], 0.02, " paper: 11–14", fontsize=7, color="tab:orange")
    axes[1].set_xlabel("distinct support keys per head of the optimum (certified solver)")
    for ax in axes:
        ax.set_ylabel("selective-copy accuracy (test)")
        ax.set_ylim(-0.03, 1.03)
        ax.legend(fontsize=7, loc="lower right")
    fig.suptitle("Trained selective copy, T = 128: what the SV memory selects at the optimum, "
                 "by box C", fontsize=10)
    return save_figure(fig, ctx.out, "recall_selection.png",
                       "one marker per kept hybrid model (seed); grid selection, memories "
                       "re-solved exactly", quick=ctx.quick)
