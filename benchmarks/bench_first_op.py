"""The first operation in a fresh process (warm numba cache): where its time goes.

Each of ``--runs`` fresh processes times, in order: ``import numpy``; ``import numba``;
``import svattn.exact`` (the rest of our import); numba's own first-use set-up, by
calling one trivial cached kernel of ours (``compiled.reserve.sq_norm``: numba's
runtime set up, the kernel loaded without numba's registries, ``core.compiling``);
then the first operation (``extend`` of 200 keys, d = 64, C = 0.05: an empty memory's
first block of 64 rows and more takes the batch path, libsvm's warm start, which
imports scikit-learn on first use, and the exact finish, whose kernels load from the
cache); then the same operation again on a second memory (everything
loaded). Wall-clock and CPU seconds (``*_cpu_s``: this process's own, where a shared
machine's wall clock also holds other jobs' time). Medians over the runs.

Usage::

    python benchmarks/bench_first_op.py --runs 5 --json results/bench_first_op.json
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

CHILD = r"""
import json, time
clock = lambda: (time.perf_counter(), time.process_time())
t0 = clock()
import numpy as np
t1 = clock()
import numba
t2 = clock()
import svattn.exact as E
t3 = clock()
from svattn.exact.backends.compiled import reserve
reserve.sq_norm(np.zeros(1))
t4 = clock()
x = np.random.default_rng(0).normal(size=(200, 64))
first = E.SVDDMemory(0.05)
first.extend(x)
t5 = clock()
E.SVDDMemory(0.05).extend(x)
t6 = clock()
out = {}
for i, name in enumerate(("import_numpy_s", "import_numba_s", "import_svattn_exact_s",
                          "numba_first_use_s", "first_op_after_numba_s")):
    out[name] = (t1, t2, t3, t4, t5)[i][0] - (t0, t1, t2, t3, t4)[i][0]
    out[name[:-2] + "_cpu_s"] = (t1, t2, t3, t4, t5)[i][1] - (t0, t1, t2, t3, t4)[i][1]
out.update(first_op_s=t5[0] - t3[0], first_op_cpu_s=t5[1] - t3[1],
           same_op_again_s=t6[0] - t5[0], same_op_again_cpu_s=t6[1] - t5[1],
           path=first.ingest_path)
print(json.dumps(out))
"""
KEYS = ("import_numpy_s", "import_numba_s", "import_svattn_exact_s", "numba_first_use_s",
        "first_op_after_numba_s", "first_op_s", "same_op_again_s")
KEYS = tuple(k for key in KEYS for k in (key, key[:-2] + "_cpu_s"))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--json", type=Path)
    add_conditions(p)
    args = p.parse_args(argv)
    src = Path(__file__).resolve().parent.parent / "src"
    env = dict(os.environ, PYTHONPATH=str(src), OMP_NUM_THREADS="1",
               OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    runs = []
    for _ in range(args.runs + 1):  # the first run may (re)write numba's cache: dropped
        out = subprocess.run([sys.executable, "-c", CHILD], env=env, check=True,
                             capture_output=True, text=True).stdout
        runs.append(json.loads(out.strip().splitlines()[-1]))
    runs = runs[1:]
    med = {k: statistics.median(r[k] for r in runs) for k in KEYS}
    for k in KEYS:
        print(f"{k:24s} {med[k]:.3f} s")
    print("first_op_s = numba_first_use_s (numba's own set-up, on our first kernel call) "
          "+ first_op_after_numba_s (scikit-learn's import, loading our kernels from the "
          f"cache, and the work; path: {runs[-1]['path']})")
    if args.json:
        write_record(args.json, __file__, argv, {"conditions": args.conditions,
                                                 "runs": runs, "median": med})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
