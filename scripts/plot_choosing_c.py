"""What the box C does: the figure and record of docs/usage.md, "Choosing C".

Top row, from the trained selective-copy grid (``results/recall_selection.json``:
T = 128, 8 data tokens, the hybrid with C in {1/4, 1/8, 1/16}, 3 seeds, and the
matched sliding window): accuracy, and from its kept models' memories re-solved
exactly (``results/selection_on_optimum.json``, the certified solver's optimum) the α
mass on the 8 data tokens (at most ``min(1, 8·C)``: no token holds more than C) and
the support per head in distinct keys (at least ``⌈1/C⌉`` tokens carry weight; copies
of one key count once). Bottom row: ``svattn.SVDD`` on a 2-d set
(scikit-learn's bundled wine data, alcohol and malic acid, standardised; gamma 0.5)
for three values of C, its decision boundary, support vectors and outliers. Nothing
is trained or downloaded; the SVDD fits take a second.

    python scripts/plot_choosing_c.py --out results/choosing_c.png \\
        --json results/choosing_c.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from sklearn.datasets import load_wine  # noqa: E402

from svattn import SVDD  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GRID = "results/recall_selection.json"
OPTIMUM = "results/selection_on_optimum.json"
COMMAND = ("python scripts/plot_choosing_c.py --out results/choosing_c.png "
           "--json results/choosing_c.json")
SVDD_CS = (1 / 4, 1 / 40, 1 / 150)  # k = 4, 40, 150 rows of 178 can carry all the weight
GAMMA = 0.5

OUTSIDE = 1e-9  # a row is an outlier when its decision value is below -OUTSIDE


def wine_2d() -> np.ndarray:
    """Alcohol and malic acid of scikit-learn's bundled wine data (178 rows), standardised."""
    X = load_wine().data[:, [0, 1]]
    return (X - X.mean(0)) / X.std(0)


def grid_rows(root: Path = ROOT) -> dict:
    """Per C of the selective-copy grid: the seeds' accuracy, and the data mass and support
    of the optimum (certified solver); and the sliding window's accuracy."""
    grid = json.loads((root / GRID).read_text())
    exact = {(r["C"], r["seed"]): r["summary"]["memory"]
             for r in json.loads((root / OPTIMUM).read_text())["rows"]}
    by_c: dict[str, dict] = {}
    window = []
    for cell in sorted(grid["cells"], key=lambda c: (c["C"] or 0, c["seed"])):
        if cell["mixer"] == "sliding":
            window.append(cell["accuracy"])
            continue
        row = by_c.setdefault(f"{cell['C']:g}", {"C": cell["C"], "seeds": [], "accuracy": [],
                                               "data_mass": [], "support_per_head": [],
                                               "distinct_support_per_head": []})
        row["seeds"].append(cell["seed"])
        row["accuracy"].append(cell["accuracy"])
        for key in ("data_mass", "support_per_head", "distinct_support_per_head"):
            row[key].append(exact[cell["C"], cell["seed"]][key])
    num_data = grid["records"][0]["task"]["num_data"]
    for row in by_c.values():
        row["data_mass_cap"] = min(1.0, num_data * row["C"])
        row["least_support"] = math.ceil(1 / row["C"] - 1e-12)
    return {"source": GRID, "selection_source": OPTIMUM, "num_data": num_data,
            "seq_len": grid["records"][0]["task"]["seq_len"],
            "hybrid": list(by_c.values()), "sliding_accuracy": window}


def svdd_rows(X: np.ndarray) -> list[dict]:
    """``SVDD(C, gamma)`` on ``X`` for each C of :data:`SVDD_CS`: support, at the box,
    outliers among the rows."""
    rows = []
    for C in SVDD_CS:
        model = SVDD(C=C, gamma=GAMMA).fit(X)
        alpha = np.abs(model.dual_coef_[0]) * C  # α = dual_coef_ · C_
        rows.append({"C": C, "k": round(1 / C), "support": int(model.n_support_[0]),
                     "at_box": int(np.sum(alpha >= C * (1 - 1e-9))),
                     # outside beyond rounding: a margin vector's value is 0 in exact
                     # arithmetic, its predicted sign rounding's choice
                     "outlier_fraction": float(np.mean(model.decision_function(X) < -OUTSIDE)),
                     "nu_": float(model.nu_)})
    return rows


def record(root: Path = ROOT) -> dict:
    """Everything the figure shows, as the JSON record."""
    return {"command": COMMAND, "grid": grid_rows(root),
            "svdd": {"data": "sklearn.datasets.load_wine, columns alcohol and malic acid, "
                             "standardised", "n": len(wine_2d()), "gamma": GAMMA,
                     "rows": svdd_rows(wine_2d())}}


def plot(rec: dict, out: Path) -> None:
    fig, axes = plt.subplots(2, 3, figsize=(13, 8))
    hyb = rec["grid"]["hybrid"]
    Cs = [r["C"] for r in hyb]
    ticks = dict(xscale="log", xticks=Cs, xticklabels=[f"1/{round(1 / c)}" for c in Cs])
    panels = (("accuracy", "accuracy (selective copy, T = 128)"),
              ("data_mass", "α mass of the optimum on the 8 data tokens"),
              ("distinct_support_per_head", "support per head of the optimum (distinct keys)"))
    for ax, (key, title) in zip(axes[0], panels, strict=True):
        for r in hyb:
            ax.scatter([r["C"]] * len(r[key]), r[key], color="C0", s=18, alpha=0.7)
        ax.plot(Cs, [np.mean(r[key]) for r in hyb], color="C0", lw=1.5, label="hybrid (mean)")
        ax.set(title=title, xlabel="C", **ticks)
        ax.minorticks_off()
    axes[0, 0].axhline(np.mean(rec["grid"]["sliding_accuracy"]), color="C3", ls="--",
                       label="matched sliding window")
    axes[0, 1].plot(Cs, [r["data_mass_cap"] for r in hyb], color="k", ls=":",
                    label="cap min(1, 8·C)")
    axes[0, 2].plot(Cs, [r["least_support"] for r in hyb], color="k", ls=":",
                    label="at least ⌈1/C⌉ tokens")
    for ax in axes[0]:
        ax.legend(fontsize=8)
    X = wine_2d()
    xx, yy = np.meshgrid(np.linspace(-3, 3.2, 200), np.linspace(-2.2, 3.6, 200))
    grid = np.c_[xx.ravel(), yy.ravel()]
    for ax, row in zip(axes[1], rec["svdd"]["rows"], strict=True):
        model = SVDD(C=row["C"], gamma=GAMMA).fit(X)
        z = model.decision_function(grid).reshape(xx.shape)
        ax.contourf(xx, yy, z, levels=[0, z.max()], colors=["#dde8f5"])
        ax.contour(xx, yy, z, levels=[0], colors="C0")
        out_ = model.decision_function(X) < -OUTSIDE
        ax.scatter(*X[~out_].T, s=10, color="k", label="inside")
        ax.scatter(*X[out_].T, s=10, color="C3", label="outlier")
        sv = model.support_
        ax.scatter(*X[sv].T, s=40, facecolors="none", edgecolors="C1", label="support")
        ax.set(title=f"SVDD(C=1/{row['k']}): {row['support']} support, "
                     f"{row['outlier_fraction']:.0%} outliers",
               xlabel="alcohol (std.)", ylabel="malic acid (std.)")
        ax.legend(fontsize=7, loc="upper right")
    fig.suptitle("Choosing C: at most ⌊1/C⌋ tokens at the box, at least ⌈1/C⌉ with weight")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="results/choosing_c.png")
    parser.add_argument("--json", default="results/choosing_c.json")
    args = parser.parse_args(argv)
    rec = record()
    Path(args.json).write_text(json.dumps(rec, indent=1) + "\n")
    plot(rec, Path(args.out))
    print(f"wrote {args.json} and {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
