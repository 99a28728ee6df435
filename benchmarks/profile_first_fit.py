"""The first ``SVDD.fit`` of a fresh process (numba's cache warm): its time, where it goes,
and what ``n_jobs`` costs a cross-validation.

Each of ``--runs`` fresh processes loads scikit-learn's wine (178 rows, standardized),
times ``from svattn import SVDD`` (the import), then the first ``SVDD(nu=0.1).fit`` and a
second one: wall-clock and CPU seconds (on a machine shared with other jobs the wall
clock also holds their time; the CPU time is this process's own). One more fresh
process runs the first fit under ``cProfile`` and sums the time of: numba's dispatch of
our kernels (``_compile_for_args``: loading them from the cache), of which numba's
registries' first use (``BaseContext.refresh``: the typing and lowering registries and
the imports they pull in; svattn's kernels load without it, ``core.compiling``),
numba's runtime (``rtsys.initialize``) and unserialising the cached kernels
(``codegen.unserialize_library``); the imports made during the fit; libsvm's warm
start (``batch._one_class_dual``). Medians over the runs; profiled times carry the profiler's
overhead, so the parts are quoted as shares of the profiled fit.

With ``--cv``, fresh processes time ``cross_validate(SVDD(nu=0.1), X, cv=5)`` with
``n_jobs`` 1 and 2, twice each in one process: the first call holds the workers' start
(each imports scikit-learn, svattn and numba, and loads the kernels on its first fit),
the second reuses them; the folds' own fit times are recorded beside, and the CPU
seconds of the process and of its ended workers (``RUSAGE_CHILDREN``).

Usage::

    python benchmarks/profile_first_fit.py --runs 5 --cv --json results/profile_first_fit.json
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
w0, c0 = time.perf_counter(), time.process_time()
from svattn import SVDD
import_s, import_cpu_s = time.perf_counter() - w0, time.process_time() - c0
"""
TIMED = SETUP + r"""
def timed(f):
    w, c = time.perf_counter(), time.process_time()
    f()
    return time.perf_counter() - w, time.process_time() - c
first = timed(lambda: SVDD(nu=0.1).fit(X))
second = timed(lambda: SVDD(nu=0.1).fit(X))
print(json.dumps({"import_s": import_s, "import_cpu_s": import_cpu_s,
                  "first_fit_s": first[0], "first_fit_cpu_s": first[1],
                  "second_fit_s": second[0], "second_fit_cpu_s": second[1]}))
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
    "profiled_fit_s": cum("svattn/estimators/svdd.py", "fit"),
    "numba_dispatch_s": cum("numba/core/dispatcher.py", "_compile_for_args"),
    "numba_registries_s": max(cum("numba/core/base.py", "refresh"), 0.0),
    "numba_runtime_s": cum("numba/core/runtime/nrt.py", "initialize"),
    "numba_unserialize_s": cum("numba/core/codegen.py", "unserialize_library"),
    "imports_s": cum("<frozen importlib._bootstrap>", "_find_and_load"),
    "libsvm_fit_s": cum("svattn/exact/operations/batch.py", "_one_class_dual"),
}))
"""
CV = r"""
import json, resource, sys, time
from joblib.externals.loky import get_reusable_executor
from sklearn.datasets import load_wine
from sklearn.model_selection import cross_validate
from sklearn.preprocessing import StandardScaler
X = StandardScaler().fit_transform(load_wine().data)
from svattn import SVDD
def mean_score(est, X, y=None):
    return float(est.score_samples(X).mean())
n_jobs = int(sys.argv[1])
out = {"n_jobs": n_jobs}
for call in ("first_call", "second_call"):
    t = time.perf_counter()
    r = cross_validate(SVDD(nu=0.1), X, cv=5, n_jobs=n_jobs, scoring=mean_score)
    out[call + "_s"] = time.perf_counter() - t
    out[call + "_fold_fit_s"] = [float(v) for v in r["fit_time"]]
get_reusable_executor().shutdown(wait=True)  # the workers end: their CPU time is counted
out["process_cpu_s"] = time.process_time()
out["workers_cpu_s"] = (lambda r: r.ru_utime + r.ru_stime)(
    resource.getrusage(resource.RUSAGE_CHILDREN))
print(json.dumps(out))
"""


def _child(code: str, env: dict, *args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--cv", action="store_true", help="also time cross_validate with n_jobs 1, 2")
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
    body = {"conditions": args.conditions, "runs": runs, "median": med, "profile": prof,
            "shares": shares}
    if args.cv:
        body["cross_validate"] = [_child(CV, env, str(n)) for n in (1, 2)]
        for r in body["cross_validate"]:
            print(f"cross_validate n_jobs={r['n_jobs']}: first call {r['first_call_s']:.2f} s, "
                  f"second {r['second_call_s']:.2f} s; CPU: process {r['process_cpu_s']:.2f} s, "
                  f"workers {r['workers_cpu_s']:.2f} s; fold fits (first call) "
                  + " ".join(f"{v:.3f}" for v in r["first_call_fold_fit_s"]))
    if args.json:
        write_record(args.json, __file__, argv, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
