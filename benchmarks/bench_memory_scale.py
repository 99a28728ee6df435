"""Peak memory and time of a fit as the rows grow: ``SVDD.fit`` against libsvm's
``OneClassSVM.fit`` (``tol=1e-12``, ``shrinking=False``; the same ν and γ) on issue #36's
clustered rows (:func:`streams.clustered_outliers`, d = 8, ν = 0.05, γ = 0.1), each fit in
a fresh subprocess of its own so that its peak resident memory (the child's
``resource.getrusage`` maxrss) is its own.

Recorded per size and estimator: wall and CPU time of the fit, the child's peak resident
memory, and for ``SVDD`` the solver state's bytes per row (``view.state_nbytes / n``,
the numpy buffers it keeps between operations: keys, kernel columns of the margin and
standby tokens, the error sum, the bordered inverse) and the set sizes. Since issue #51
error tokens keep no kernel column, so the state is about 8·(|S| + d + small) bytes per
row, flat in n, where it was 8·(|S| + |E| + …) with |E| ≈ ν·n.

    python benchmarks/bench_memory_scale.py                    # 32k, 64k, 128k rows
    python benchmarks/bench_memory_scale.py --sizes 256000 --out results/x.json

Compile time is paid in each child by a small fit before the timed one (numba's cache
on disk makes it a load). Timings on a shared machine are labelled by ``--conditions``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from bench_records import add_conditions, write_record  # noqa: E402

CHILD = r"""
import json, resource, sys, time
sys.path.insert(0, {bench!r})
import numpy as np
from streams import clustered_outliers
which, n, nu, gamma, seed = {which!r}, {n}, {nu}, {gamma}, {seed}
X = clustered_outliers(n, 8, seed=seed)
if which == "svdd":
    from svattn import SVDD
    SVDD(nu=nu, gamma=gamma).fit(clustered_outliers(1200, 8, seed=99))  # (compile/load)
    make = lambda: SVDD(nu=nu, gamma=gamma)
else:
    from sklearn.svm import OneClassSVM
    make = lambda: OneClassSVM(nu=nu, gamma=gamma, tol=1e-12, shrinking=False)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
t0, c0 = time.perf_counter(), time.process_time()
model = make().fit(X)
wall, cpu = time.perf_counter() - t0, time.process_time() - c0
out = {{"wall_s": wall, "cpu_s": cpu,
        "peak_rss_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_before_fit_MiB": before / 1024}}
if which == "svdd":
    mem = model.memory_
    sizes = {{k: len(v) for k, v in mem.partition().items()}}
    out.update(margin=sizes["margin"], error=sizes["error"], reserve=sizes["reserve"],
               state_bytes=int(mem.view.state_nbytes),
               state_bytes_per_row=mem.view.state_nbytes / len(mem),
               kernel_cache_bytes=int(mem.view.kernel_cache_nbytes),
               fit_path=model.fit_path_)
else:
    out.update(support=int(len(model.support_)))
print("RESULT " + json.dumps(out))
"""


def run_child(which: str, n: int, nu: float, gamma: float, seed: int) -> dict:
    """One fit in a fresh interpreter; its figures (raises if the child fails)."""
    code = CHILD.format(bench=str(ROOT / "benchmarks"), which=which, n=n, nu=nu,
                        gamma=gamma, seed=seed)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("RESULT ")]
    if done.returncode or not lines:
        raise RuntimeError(f"{which} fit of {n} rows failed ({done.returncode}):\n"
                           f"{done.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[32000, 64000, 128000])
    ap.add_argument("--nu", type=float, default=0.05)
    ap.add_argument("--gamma", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-ocsvm", action="store_true",
                    help="fit SVDD only (the libsvm column is then absent)")
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench_memory_scale.json")
    add_conditions(ap)
    args = ap.parse_args(argv)
    rows = []
    for n in args.sizes:
        row: dict = {"n": n, "nu": args.nu, "gamma": args.gamma, "d": 8, "seed": args.seed}
        svdd = run_child("svdd", n, args.nu, args.gamma, args.seed)
        row.update({f"svdd_{k}": v for k, v in svdd.items()})
        if not args.skip_ocsvm:
            oc = run_child("ocsvm", n, args.nu, args.gamma, args.seed)
            row.update({f"ocsvm_{k}": v for k, v in oc.items()})
            row["fit_wall_ratio"] = svdd["wall_s"] / oc["wall_s"]
            row["peak_rss_ratio"] = svdd["peak_rss_MiB"] / oc["peak_rss_MiB"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    write_record(args.out, __file__, argv, {
        "what": "peak resident memory and time of a fit as the rows grow: SVDD.fit vs "
                "OneClassSVM.fit(tol=1e-12, shrinking=False), each in a fresh subprocess "
                "(maxrss of the child), clustered rows d = 8",
        "conditions": args.conditions, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
