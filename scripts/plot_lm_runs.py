"""Learning curves of ``svattn train`` runs, side by side, as one PNG.

Reads each run's ``log.jsonl`` and draws the training loss in bits per byte
(a moving average over ``--smooth`` logged steps) and the validation BPC
estimates against tokens seen; full-split evaluations are filled markers,
partial ones (``eval_every`` estimates) hollow.

    python scripts/plot_lm_runs.py runs/rope3500_hybrid_sv runs/rope3500_sliding \\
        runs/long3500_hybrid_sv runs/long3500_sliding --out results/lm_curves.png

Each run is one colour and one legend entry; what the line and the marks mean is said
once. The y axis shows every point (log scale) unless ``--ylim`` cuts it, and then the
figure says how many points lie outside.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from svattn.experiments.runner import portable_path  # noqa: E402
from svattn.lm.model import positions_of  # noqa: E402


def read_log(run_dir: Path) -> tuple[str, list[dict], list[dict], dict]:
    """The run's label (mixer and positions), its training and validation records
    and its training config."""
    recs = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines() if line]
    first = next((r for r in recs if r.get("kind") == "config"), {})
    cfg, model = first.get("config", {}), first.get("model_config", {})
    pos = positions_of(model).replace("none", "NoPE")
    lookback = (model.get("mixer_options") or {}).get("lookback", 0)
    variant = f" lookback {lookback}" if lookback else ""  # the hybrid's local look-back
    train = [r for r in recs if r.get("kind") == "train"]
    val = [r for r in recs if r.get("kind") == "eval" and r.get("split") == "val"]
    seed = f", seed {cfg['seed']}" if "seed" in cfg else ""
    if cfg.get("data"):  # results carry paths relative to the repository, never a machine's
        cfg = {**cfg, "data": portable_path(Path(cfg["data"]))}
    return f"{cfg.get('mixer', run_dir.name)}{variant} ({pos}{seed})", train, val, cfg


def unique_labels(labels: list[str], runs: list[Path]) -> list[str]:
    """``labels`` with the run folder added to each label that several runs share (two
    runs of one config must not share a legend entry).

    Examples
    --------
    >>> unique_labels(["a (rope)", "a (rope)", "b"], [Path("r/x"), Path("r/y"), Path("r/z")])
    ['a (rope) [x]', 'a (rope) [y]', 'b']
    >>> unique_labels(["a", "a"], [Path("p/run"), Path("q/run")])
    ['a [p/run]', 'a [q/run]']
    """
    out = list(labels)
    for label in set(labels):
        same = [i for i, lab in enumerate(labels) if lab == label]
        if len(same) < 2:
            continue
        names = [runs[i].name for i in same]
        tags = names if len(set(names)) == len(names) else [str(runs[i]) for i in same]
        for i, tag in zip(same, tags, strict=True):
            out[i] = f"{label} [{tag}]"
    return out


def smooth(xs: list[float], k: int) -> list[float]:
    """Trailing moving average over ``k`` values."""
    out, acc = [], 0.0
    for i, x in enumerate(xs):
        acc += x
        if i >= k:
            acc -= xs[i - k]
        out.append(acc / min(i + 1, k))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("runs", type=Path, nargs="+", help="run directories (with log.jsonl)")
    p.add_argument("--out", type=Path, default=Path("results/lm_curves.png"))
    p.add_argument("--title", default="CharLM on the enwik8 prefix: learning curves",
                   help="the figure's title (say what these runs compare)")
    p.add_argument("--smooth", type=int, default=20, help="moving-average window (log records)")
    p.add_argument("--json", type=Path, help="also write every run's validation records here")
    p.add_argument("--ylim", type=float, nargs=2, metavar=("LO", "HI"),
                   help="y-axis range (the figure says so when curves leave it); default: "
                        "every point, on a log axis")
    args = p.parse_args(argv)
    table = []
    many = len(args.runs) > 4  # the legend then goes beside the plot, not over the curves
    fig, ax = plt.subplots(figsize=(11.0, 5.0) if many else (7.5, 4.5))
    logs = [read_log(run) for run in args.runs]
    labels = unique_labels([log[0] for log in logs], list(args.runs))
    ys: list[float] = []
    for i, (run, (_, train, val, cfg), mixer) in enumerate(
            zip(args.runs, logs, labels, strict=True)):
        color = f"C{i}"
        if not train:  # eval records carry steps only; tokens per step come from training
            print(f"skipped {run}: no training records in its log.jsonl")
            continue
        tokens_per_step = train[-1]["tokens_seen"] / max(train[-1]["step"], 1)
        table.append({"run": str(run), "label": mixer, "config": cfg, "val": [
            {"step": r["step"], "tokens_seen": int(r["step"] * tokens_per_step),
             "bpc": r["bpc"], "bytes": r.get("bytes"), "partial": r.get("partial", True)}
            for r in val]})
        x = [r["tokens_seen"] / 1e6 for r in train]
        y = smooth([r["loss"] / math.log(2) for r in train], args.smooth)
        ax.plot(x, y, color=color, lw=1.2, label=mixer)  # one legend entry per run
        ys += y
        for r in val:
            full = not r.get("partial", True)
            ax.plot(r["step"] * tokens_per_step / 1e6, r["bpc"], "o", color=color,
                    mfc=color if full else "none", label="_nolegend_")
            ys.append(r["bpc"])
    ax.axhline(2.178, color="grey", ls="--", lw=1, label="paper: hybrid 2.178 BPC")
    # what the marks mean, once (not once per run)
    from matplotlib.lines import Line2D

    handles, names = ax.get_legend_handles_labels()
    handles += [Line2D([], [], color="k", lw=1.2),
                Line2D([], [], color="k", marker="o", ls="", mfc="none"),
                Line2D([], [], color="k", marker="o", ls="")]
    names += ["line: training loss (smoothed)", "hollow: val BPC (estimate)",
              "filled: val BPC (full split)"]
    if many:
        ax.legend(handles, names, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    else:
        ax.legend(handles, names, fontsize=8)
    if args.ylim:
        lo, hi = args.ylim
        ax.set_ylim(lo, hi)
        outside = [v for v in ys if not lo <= v <= hi]
        if outside:  # never a silent cut
            ax.text(0.99, 0.99, f"y axis cut to [{lo:g}, {hi:g}]: {len(outside)} points "
                    f"outside (up to {max(outside):.2f})", transform=ax.transAxes,
                    ha="right", va="top", fontsize=7, color="0.3")
    elif ys:
        ax.set_yscale("log")  # from the untrained start to the end, nothing cut
        from matplotlib.ticker import LogLocator, ScalarFormatter

        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 1.5, 2, 3, 4, 6, 8)))
        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.yaxis.set_minor_locator(LogLocator(base=10, subs=()))
    ax.set_xlabel("tokens seen (millions)")
    ax.set_ylabel("bits per byte")
    ax.set_title(args.title)
    ax.grid(alpha=0.3)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")
    if args.json:
        args.json.write_text(json.dumps(table, indent=2) + "\n")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
