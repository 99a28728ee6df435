"""What trustworthy deletion costs: erase a data subject, sign, verify, and stay atomic.

On the ICU vitals (``../shared/data/icu/mimic3_demo_vitals.csv.gz``, else the slice
shipped with svattn), streamed hour by hour with each row tagged by its stay:

* ``erase(stay)`` (one receipt) against removing the same tokens one by one with
  ``remove`` on an identical twin (which of the two runs first alternates by stay);
* signing a receipt and checking its signature (Ed25519), and ``verify_erasure``
  without the retrain;
* what atomicity costs each operation: one checkpoint (``rollback.checkpoint``),
  beside the median ``add`` and ``remove`` of the same memory at n = 4,000, d = 64.

Usage::

    python benchmarks/bench_erase.py --json results/trust/erase_cost.json
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from svattn.data.icu import default_slice_path, load_mimic3_vitals
from svattn.exact import SVDDMemory
from svattn.exact.auditor.verify import verify_erasure
from svattn.exact.operations.rollback import checkpoint
from svattn.exact.records.signing import generate_key, sign, signature_errors
from svattn.exact.view import instrument

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_records import write_record  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
FULL = REPO.parent / "shared" / "data" / "icu" / "mimic3_demo_vitals.csv.gz"


def ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1e3


def erase_costs(stays: int, C: float) -> dict:
    path = FULL if FULL.exists() else default_slice_path()
    data = load_mimic3_vitals(path).standardised()
    order = np.lexsort((data.stay_id, data.hour))
    keys, stay = data.keys[order], data.stay_id[order]
    key, tag_key = generate_key(), b"bench-erase-tag-key-0123456789ab"
    tags = [f"stay-{s}" for s in stay]
    mem = SVDDMemory(C=C, tag_key=tag_key, signing_key=key)  # its certificates signed
    mem.extend(keys, tags=tags)
    chosen = [s for s in np.unique(stay) if (stay == s).sum() >= 10][:stays]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "m.safetensors"
        mem.save(state)
        for s in chosen:
            ids = [int(i) for i in np.flatnonzero(stay == s)]
            a = SVDDMemory.load(state, tag_key=tag_key, signing_key=key)
            b = SVDDMemory.load(state, tag_key=tag_key, signing_key=key)
            def by_one(a=a, ids=ids) -> float:
                t0 = time.perf_counter()
                for t in ids:
                    a.remove(t)
                return ms(t0)

            def by_tag(b=b, s=s) -> tuple[float, object]:
                t0 = time.perf_counter()
                receipt = b.erase(f"stay-{s}")
                return ms(t0), receipt

            if len(rows) % 2:  # alternate which runs first (warm caches favour the second)
                erase, receipt = by_tag()
                one_by_one = by_one()
            else:
                one_by_one = by_one()
                erase, receipt = by_tag()
            t0 = time.perf_counter()
            signed = sign(receipt, key)
            sign_ms = ms(t0)
            t0 = time.perf_counter()
            bad = signature_errors(signed, key.public_key())
            check_ms = ms(t0)
            t0 = time.perf_counter()
            ok = verify_erasure(b, signed, retrain=False, public_key=key.public_key()).ok
            verify_ms = ms(t0)
            assert not bad and ok and a.state_digest() == b.state_digest()
            rows.append({"stay": int(s), "tokens": len(ids), "erase_ms": erase,
                         "one_by_one_ms": one_by_one, "sign_ms": sign_ms,
                         "check_signature_ms": check_ms, "verify_erasure_ms": verify_ms})
    med = {k: statistics.median(r[k] for r in rows) for k in rows[0] if k.endswith("ms")}
    return {"data": str(path.relative_to(REPO.parent) if path == FULL else path.name),
            "n": len(keys), "C": C, "stays": len(rows),
            "tokens_per_stay_median": statistics.median(r["tokens"] for r in rows),
            "median_ms": med, "erase_over_one_by_one": med["erase_ms"] / med["one_by_one_ms"],
            "rows": rows}


def atomic_costs(n: int, d: int, repeats: int) -> dict:
    rng = np.random.default_rng(0)
    centers = rng.normal(size=(20, d))
    x = centers[rng.integers(0, 20, n + repeats)] + 0.3 * rng.normal(size=(n + repeats, d))
    mem = SVDDMemory(C=0.01, gamma=1 / (10 * d))
    ids = mem.extend(x[:n])
    ss = instrument(mem)
    t_cp = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        checkpoint(ss, [5])
        t_cp.append(ms(t0))
    t_rm, t_add = [], []
    for i in range(repeats):
        t0 = time.perf_counter()
        mem.remove(ids[i])
        t_rm.append(ms(t0))
        t0 = time.perf_counter()
        mem.add(x[n + i])
        t_add.append(ms(t0))
    cp, rm, add = (statistics.median(t) for t in (t_cp, t_rm, t_add))
    return {"n": n, "d": d, "repeats": repeats, "checkpoint_ms": cp, "remove_ms": rm,
            "add_ms": add, "checkpoint_over_remove": cp / rm, "checkpoint_over_add": cp / add}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--stays", type=int, default=20)
    p.add_argument("--C", type=float, default=0.01)
    p.add_argument("--repeats", type=int, default=300)
    p.add_argument("--json", type=Path, help="also write the results (and this command) here")
    args = p.parse_args(argv)
    SVDDMemory(C=0.5).extend(np.eye(3))  # compile outside the figures
    report = {"erase": erase_costs(args.stays, args.C),
              "atomic": atomic_costs(4000, 64, args.repeats)}
    e, a = report["erase"], report["atomic"]
    print(f"erase of one stay ({e['tokens_per_stay_median']:.0f} tokens, n = {e['n']}): "
          f"{e['median_ms']['erase_ms']:.1f} ms vs {e['median_ms']['one_by_one_ms']:.1f} ms "
          f"one by one ({e['erase_over_one_by_one']:.2f}×); sign "
          f"{e['median_ms']['sign_ms']:.3f} ms, check {e['median_ms']['check_signature_ms']:.3f}"
          f" ms, verify_erasure {e['median_ms']['verify_erasure_ms']:.1f} ms")
    print(f"atomic checkpoint {a['checkpoint_ms']:.3f} ms per operation: "
          f"{a['checkpoint_over_remove']:.2f}× a removal ({a['remove_ms']:.3f} ms), "
          f"{a['checkpoint_over_add']:.2f}× an add ({a['add_ms']:.3f} ms)")
    if args.json:
        write_record(args.json, __file__, argv, report)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
