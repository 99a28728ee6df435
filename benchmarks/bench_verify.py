"""What checking a forget costs: the default verification of an erasure, at scale.

One ICU patient is forgotten (``SVDDMemory.erase`` of their subject tag: one exact
removal per row, one receipt) from the full MIMIC-III demo vitals
(``../shared/data/icu/mimic3_demo_vitals.csv.gz``: ~13.5k hourly rows, z-scored), and
the receipt is checked the way an auditor does: ``svattn verify-erasure STATE RECEIPT
--log LOG --public-key KEY`` in a fresh process (its wall time and peak resident memory,
the state's load included; started from a small process, see ``STARTER``), and
``verify_erasure`` in this process (its time and the peak of what it allocates, by
``tracemalloc``). Where the command's time goes (``cli_parts``): a fresh process's
imports of what it runs, and ``SVDDMemory.load`` of the state in this process (its time,
the peak it allocates, the kernel cache it rebuilds). The check is the optimality proof from
the keys (``svattn.exact.auditor.optimality``), not the dense oracle. ``--case
synthetic`` does the same on ``--n`` rows of a Gaussian mixture. ``--case oracle``
compares, on ``--n`` synthetic rows, one removal's default check with the dense oracle
cross-check (``verify_deletion(..., oracle=True)``): time and ``tracemalloc`` peak of each.

The memory follows ``svattn.SVDD``'s defaults: ``C = 1/(nu·n)`` with ``nu = 0.5`` (half
the rows carry weight), rbf, ``gamma = "scale"`` (``1/(d·var)``) or a number.

Usage (single-threaded BLAS, as recorded)::

    OMP_NUM_THREADS=1 python benchmarks/bench_verify.py --case mimic --gamma scale \\
        --json results/verify_cost/mimic_scale.json
    OMP_NUM_THREADS=1 python benchmarks/bench_verify.py --case mimic --gamma 1 \\
        --json results/verify_cost/mimic_gamma1.json
    OMP_NUM_THREADS=1 python benchmarks/bench_verify.py --case synthetic --n 128000 \\
        --C 0.002 --json results/verify_cost/synthetic_128k.json
    OMP_NUM_THREADS=1 python benchmarks/bench_verify.py --case oracle --n 4000 --C 0.01 \\
        --json results/verify_cost/oracle_4k.json
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np

from svattn.data.icu import load_mimic3_vitals
from svattn.exact import SVDDMemory
from svattn.exact.auditor.verify import verify_deletion, verify_erasure
from svattn.exact.records.signing import write_keypair

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_records import add_conditions, write_record  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
# The auditor's command is started by this small process, which writes the command's
# wall time and peak resident memory (ru_maxrss, KiB) to argv[1]: a child's ru_maxrss
# counts the resident memory of the process it was forked from (Linux keeps the larger
# across exec), so started from this benchmark, which holds the memory, it would count
# the benchmark's own.
STARTER = ("import resource, subprocess, sys, time; t0 = time.perf_counter(); "
           "r = subprocess.run(sys.argv[2:]).returncode; s = time.perf_counter() - t0; "
           "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss; "
           "open(sys.argv[1], 'w').write(f'{s} {rss}'); sys.exit(r)")
# what ``svattn verify-erasure`` imports before it loads the state
IMPORTS = ("import svattn.cli, svattn.exact.auditor.persist, svattn.exact.auditor.verify, "
           "svattn.exact.records.certificate")
FULL = REPO.parent / "shared" / "data" / "icu" / "mimic3_demo_vitals.csv.gz"


def mimic_rows() -> tuple[np.ndarray, list[str], str]:
    """The full file's hourly rows, z-scored; each tagged by its patient (subject)."""
    if not FULL.exists():
        raise SystemExit(f"the full MIMIC-III demo vitals are not at {FULL}")
    data = load_mimic3_vitals(FULL).standardised()
    tags = [f"subject-{s}" for s in data.subject_id]
    return np.ascontiguousarray(data.keys, dtype=np.float64), tags, str(FULL.name)


def synthetic_rows(n: int, d: int, seed: int) -> tuple[np.ndarray, list[str], str]:
    """``n`` rows of an 8-centre Gaussian mixture; tags: 64-row "subjects"."""
    rng = np.random.default_rng(seed)
    centres = 3.0 * rng.normal(size=(8, d))
    x = centres[rng.integers(0, 8, n)] + rng.normal(size=(n, d))
    return x, [f"subject-{i // 64}" for i in range(n)], f"gaussian mixture n={n} d={d}"


def _traced(fn) -> tuple[object, float, float]:
    """``fn()``, its wall time and the peak of what it allocated (tracemalloc)."""
    tracemalloc.start()
    t0 = time.perf_counter()
    out = fn()
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return out, seconds, peak


def oracle_against_default(args: argparse.Namespace) -> dict:
    """One removal from ``--n`` synthetic rows: the default check and the oracle's."""
    keys, _, source = synthetic_rows(args.n, args.d, args.seed)
    C = args.C if args.C is not None else 1.0 / (0.5 * args.n)
    gamma = 1.0 / (args.d * float(keys.var())) if args.gamma == "scale" else float(args.gamma)
    mem = SVDDMemory(C=C, gamma=gamma)
    ids = mem.extend(keys)
    cert = mem.remove(mem.partition()["margin"][0] if mem.partition()["margin"] else ids[0])
    # the process's peak RSS (KiB) before and after each: the oracle's solver (Clarabel,
    # Rust) allocates outside tracemalloc's view
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    default = verify_deletion(mem, cert)
    d_s = time.perf_counter() - t0
    rss1 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    t0 = time.perf_counter()
    oracle = verify_deletion(mem, cert, oracle=True)
    o_s = time.perf_counter() - t0
    rss2 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    d_peak = _traced(lambda: verify_deletion(mem, cert))[2]  # (tracemalloc slows it down)
    return {
        "data": source, "n_rows": len(mem), "C": C, "gamma": gamma,
        "support": len(mem.support_ids()),
        "default": {"status": default.status, "seconds": round(d_s, 3),
                    "tracemalloc_peak_MiB": round(d_peak / 2**20, 1),
                    "peak_rss_growth_MiB": round((rss1 - rss0) / 1024, 1),
                    "proof": default.optimality.summary()},
        "oracle": {"status": oracle.status, "seconds": round(o_s, 2),
                   "peak_rss_growth_MiB": round((rss2 - rss1) / 1024, 1),
                   "max_alpha_dev": oracle.max_alpha_dev,
                   "decision_dev": oracle.decision_dev},
        "machine": {"cores": os.cpu_count(), "OMP_NUM_THREADS":
                    os.environ.get("OMP_NUM_THREADS"), "conditions": args.conditions},
    }


def run(args: argparse.Namespace) -> dict:
    if args.case == "oracle":
        return oracle_against_default(args)
    if args.case == "mimic":
        keys, tags, source = mimic_rows()
    else:
        keys, tags, source = synthetic_rows(args.n, args.d, args.seed)
    n, d = keys.shape
    C = args.C if args.C is not None else 1.0 / (0.5 * n)
    gamma = 1.0 / (d * float(keys.var())) if args.gamma == "scale" else float(args.gamma)
    with tempfile.TemporaryDirectory() as scratch:
        tmp = Path(scratch) if args.keep is None else args.keep
        tmp.mkdir(parents=True, exist_ok=True)
        key_path, pub_path = write_keypair(tmp / "controller")
        log, state, receipt_path = tmp / "audit.jsonl", tmp / "m.safetensors", tmp / "r.json"
        t0 = time.perf_counter()
        mem = SVDDMemory(C=C, gamma=gamma, audit_log=log, signing_key=key_path)
        mem.extend(keys, tags=tags)
        fit_s = time.perf_counter() - t0
        sizes = {k: len(v) for k, v in mem.partition().items()}
        # a subject of median size or above with a row that carries weight (a support
        # row: its removal moves the optimum)
        subjects, inverse, counts = np.unique(tags, return_inverse=True, return_counts=True)
        weighted = np.zeros(len(subjects), dtype=bool)
        weighted[inverse[np.asarray(mem.support_ids())]] = True  # ids are row positions
        order = np.argsort(counts, kind="stable")
        upper = [i for i in order[len(order) // 2:] if weighted[i]]
        pick = subjects[upper[0] if upper else order[len(order) // 2]]
        t0 = time.perf_counter()
        receipt = mem.erase(str(pick))
        erase_s = time.perf_counter() - t0
        mem.save(state)
        receipt_path.write_text(receipt.to_json())
        # the auditor's command, in a fresh process: wall time and peak RSS
        cmd = [sys.executable, "-m", "svattn.cli", "verify-erasure", str(state),
               str(receipt_path), "--log", str(log), "--public-key", str(pub_path)]
        measured = tmp / "cli_cost.txt"
        proc = subprocess.run([sys.executable, "-c", STARTER, str(measured), *cmd],
                              capture_output=True, text=True, env={**os.environ})
        cli_s, cli_rss = (float(v) for v in measured.read_text().split())
        # where the command's time goes: a fresh process's imports of what it runs, and
        # the state's load (here, its modules and compiled kernels already loaded)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-c", IMPORTS], check=True, env={**os.environ})
        imports_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        loaded = SVDDMemory.load(state)
        load_s = time.perf_counter() - t0
        cache_bytes = loaded.view.kernel_cache_nbytes
        del loaded
        _, _, load_peak = _traced(lambda: SVDDMemory.load(state))
        # in process: the verification alone, timed; then again under tracemalloc (which
        # slows Python code down) for the peak of what it allocates
        t0 = time.perf_counter()
        v = verify_erasure(mem, receipt, log=log, public_key=pub_path)
        verify_s = time.perf_counter() - t0
        _, _, peak = _traced(lambda: verify_erasure(mem, receipt, log=log,
                                                    public_key=pub_path))
    proof = v.last_removal.optimality if v.last_removal is not None else None
    return {
        "data": source, "n_rows": n, "d": d, "C": C, "nu": None if args.C else 0.5,
        "gamma": gamma, "gamma_arg": args.gamma, "fit_seconds": round(fit_s, 2),
        "partition_before_erase": sizes, "subject": str(pick),
        "rows_forgotten": len(receipt.erased_ids), "erase_seconds": round(erase_s, 3),
        "n_after": len(mem), "support_after": len(mem.support_ids()),
        "cli": {"exit_status": proc.returncode, "seconds": round(cli_s, 2),
                # ru_maxrss of the command's process: KiB on Linux
                "peak_rss_MiB": round(cli_rss / 1024, 1),
                "verdict_line": proc.stdout.strip().splitlines()[-1][:400] if proc.stdout
                else proc.stderr.strip()[-400:]},
        "cli_parts": {"imports_seconds": round(imports_s, 2),
                      "load_seconds": round(load_s, 2),
                      "load_tracemalloc_peak_MiB": round(load_peak / 2**20, 1),
                      "kernel_cache_MiB": round(cache_bytes / 2**20, 1)},
        "in_process": {"status": v.status, "seconds": round(verify_s, 3),
                       "tracemalloc_peak_MiB": round(peak / 2**20, 1),
                       "proof": None if proof is None else proof.summary(),
                       "kkt_residual": None if proof is None else proof.kkt_residual,
                       "unique": None if proof is None else proof.unique,
                       "proof_seconds": None if proof is None else round(proof.seconds, 3)},
        "bars": {"seconds": 10.0, "peak_GB": 1.5},
        "machine": {"cpu": platform.processor() or platform.machine(),
                    "cores": os.cpu_count(), "OMP_NUM_THREADS":
                    os.environ.get("OMP_NUM_THREADS"), "conditions": args.conditions},
    }


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--case", choices=["mimic", "synthetic", "oracle"], default="mimic")
    p.add_argument("--gamma", default="scale", help='"scale" (1/(d·var)) or a number')
    p.add_argument("--C", type=float, default=None, help="default: 1/(0.5·n)")
    p.add_argument("--n", type=int, default=128_000, help="synthetic rows")
    p.add_argument("--d", type=int, default=8, help="synthetic dimension")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--keep", type=Path, default=None,
                   help="keep the state, receipt, log and keys in this folder")
    add_conditions(p)
    args = p.parse_args(argv)
    body = run(args)
    print(body)
    if args.json is not None:
        write_record(args.json, __file__, argv, body)


if __name__ == "__main__":
    main()
