"""The first operation in a fresh process (warm numba cache): where its time goes.

Each of ``--runs`` fresh processes times, in order: ``import numpy``; ``import numba``;
``import svattn.exact`` (the rest of our import); numba's own first-use set-up, by
calling one trivial cached kernel of ours (``compiled.reserve.sq_norm``: numba
builds its target context and lowering registries, and its BLAS check imports
``scipy.linalg``); then the first operation (``extend`` of 200 keys, d = 64,
C = 0.05: the warm-up threshold solve and the first drives load our kernels from
the cache); then the same operation again on a second memory (everything loaded).
Medians over the runs; a figure measured on a shared machine is an upper bound.

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
from bench_records import write_record  # noqa: E402

CHILD = r"""
import json, time
t0 = time.perf_counter()
import numpy as np
t1 = time.perf_counter()
import numba
t2 = time.perf_counter()
import svattn.exact as E
t3 = time.perf_counter()
from svattn.exact.backends.compiled import reserve
reserve.sq_norm(np.zeros(1))
t4 = time.perf_counter()
x = np.random.default_rng(0).normal(size=(200, 64))
E.SVDDMemory(0.05).extend(x)
t5 = time.perf_counter()
E.SVDDMemory(0.05).extend(x)
t6 = time.perf_counter()
print(json.dumps({"import_numpy_s": t1 - t0, "import_numba_s": t2 - t1,
                  "import_svattn_exact_s": t3 - t2, "numba_first_use_s": t4 - t3,
                  "first_op_after_numba_s": t5 - t4, "first_op_s": t5 - t3,
                  "same_op_again_s": t6 - t5}))
"""
KEYS = ("import_numpy_s", "import_numba_s", "import_svattn_exact_s", "numba_first_use_s",
        "first_op_after_numba_s", "first_op_s", "same_op_again_s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--json", type=Path)
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
          "+ first_op_after_numba_s (loading our kernels from the cache, and the work)")
    if args.json:
        write_record(args.json, __file__, argv, {"runs": runs, "median": med})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
