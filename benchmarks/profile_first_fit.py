"""The first ``SVDD.fit`` of a fresh process (numba's cache warm): its time and where
it goes.

Each of ``--runs`` fresh processes loads scikit-learn's wine (178 rows, standardized)
and imports ``svattn.SVDD`` before any timing, then times the first ``SVDD(nu=0.1).fit``
and a second one. One more fresh process runs the first fit under ``cProfile`` and
sums the time of: numba's dispatch of our kernels (``_compile_for_args``: loading them
from the cache, and numba's own first use inside it), of which numba's registries'
first use (``BaseContext.refresh``: typing and lowering registries, the imports they
pull in) and unserialising the cached kernels (``codegen.unserialize_library``); the
imports made during the fit; libsvm's warm start (``OneClassSVM.fit``). Medians over
the runs; profiled times carry the profiler's overhead, so the parts are quoted as
shares of the profiled fit.

Usage::

    python benchmarks/profile_first_fit.py --runs 5 --json results/profile_first_fit.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_records import add_conditions, write_record  # noqa: E402

SETUP = r"""
import json, time
from sklearn.datasets import load_wine
from sklearn.preprocessing import StandardScaler
X = StandardScaler().fit_transform(load_wine().data)
from svattn import SVDD
"""
TIMED = SETUP + r"""
t0 = time.perf_counter()
SVDD(nu=0.1).fit(X)
t1 = time.perf_counter()
SVDD(nu=0.1).fit(X)
t2 = time.perf_counter()
print(json.dumps({"first_fit_s": t1 - t0, "second_fit_s": t2 - t1}))
"""
PROFILED = SETUP + r"""
import cProfile, pstats
prof = cProfile.Profile()
prof.enable()
SVDD(nu=0.1).fit(X)
prof.disable()
stats = pstats.Stats(prof).stats
def cum(file_part, name):
    return sum(ct for (f, _, n), (_, _, _, ct, _) in stats.items()
               if n == name and file_part in f)
print(json.dumps({
    "profiled_fit_s": cum("svattn/estimators.py", "fit"),
    "numba_dispatch_s": cum("numba/core/dispatcher.py", "_compile_for_args"),
    "numba_registries_s": max(cum("numba/core/base.py", "refresh"), 0.0),
    "numba_unserialize_s": cum("numba/core/codegen.py", "unserialize_library"),
    "imports_s": cum("<frozen importlib._bootstrap>", "_find_and_load"),
    "libsvm_fit_s": cum("sklearn/svm/_classes.py", "fit"),
}))
"""


def _child(code: str, env: dict) -> dict:
    out = subprocess.run([sys.executable, "-c", code], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--json", type=Path)
    add_conditions(p)
    args = p.parse_args(argv)
    src = Path(__file__).resolve().parent.parent / "src"
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    _child(TIMED, env)  # (a run that may (re)write numba's cache: dropped)
    runs = [_child(TIMED, env) for _ in range(args.runs)]
    med = {k: statistics.median(r[k] for r in runs) for k in runs[0]}
    prof = _child(PROFILED, env)
    shares = {k.replace("_s", "_share"): v / prof["profiled_fit_s"]
              for k, v in prof.items() if k != "profiled_fit_s"}
    for k, v in med.items():
        print(f"{k:22s} {v:.3f} s")
    for k, v in shares.items():
        print(f"{k:22s} {v:.0%} of the profiled first fit ({prof['profiled_fit_s']:.3f} s)")
    if args.json:
        write_record(args.json, __file__, argv, {"conditions": args.conditions, "runs": runs,
                                                 "median": med, "profile": prof,
                                                 "shares": shares})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
