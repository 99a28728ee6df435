"""A/B of the exact core: ``bench_exact.py`` on two source trees, alternating, one run each.

Runs ``benchmarks/bench_exact.py --sizes N --oracle-max-n 1000`` with ``PYTHONPATH`` set
to each tree's ``src`` in turn (A, B, A, B, ...), each run in its own process (warm
numba cache, one BLAS thread), and writes every run's rows plus the per-pair ratios
B/A of the medians: on a shared machine only ratios within a pair mean anything.

Usage (the tree before a change checked out with ``git worktree add ../base REV``)::

    python benchmarks/ab_exact.py --a ../base --b . --pairs 4 --json results/ab.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab_trees import tree_env  # noqa: E402
from bench_records import portable_path, write_record  # noqa: E402

KEYS = ("remove_margin_median_ms", "remove_error_median_ms", "add_back_median_ms",
        "ingest_tok_s", "sklearn_retrain_ms", "speedup_margin", "speedup_error")


def run(tree: Path, n: int, out: Path) -> list[dict]:
    subprocess.run([sys.executable, str(tree / "benchmarks" / "bench_exact.py"), "--sizes",
                    str(n), "--oracle-max-n", "1000", "--json", str(out)], cwd=tree,
                   env=tree_env(tree), check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--a", type=Path, required=True, help="the tree before (the baseline)")
    p.add_argument("--b", type=Path, required=True, help="the tree after")
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--n", type=int, default=4000)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    runs: dict[str, list] = {"a": [], "b": []}
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.pairs):
            for side, tree in (("a", args.a), ("b", args.b)):
                runs[side].append(run(tree.resolve(), args.n, Path(tmp) / f"{side}{i}.json"))
                print(f"pair {i + 1}/{args.pairs}: {side} done", flush=True)
    ratios: dict = {}
    for stream in ("redundant", "gaussian"):
        rows = {s: [[r for r in rs if r["stream"] == stream][0] for rs in runs[s]] for s in runs}
        ratios[stream] = {}
        for k in KEYS:
            per_pair = [b[k] / a[k] for a, b in zip(rows["a"], rows["b"], strict=True)]
            ratios[stream][k] = {"a_median": statistics.median(r[k] for r in rows["a"]),
                                 "b_median": statistics.median(r[k] for r in rows["b"]),
                                 "b_over_a_per_pair": per_pair,
                                 "b_over_a_median": statistics.median(per_pair)}
            print(f"{stream:9s} {k:24s} A {ratios[stream][k]['a_median']:10.3f}  "
                  f"B {ratios[stream][k]['b_median']:10.3f}  B/A {statistics.median(per_pair):.2f}")
    if args.json:
        write_record(args.json, __file__, argv,
                     {"a": portable_path(args.a), "b": portable_path(args.b),
                      "ratios": ratios, "runs": runs})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
