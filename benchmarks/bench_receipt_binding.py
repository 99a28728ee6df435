"""What binding a model erasure receipt costs: ``LMStream.forget`` and ``verify_forget``.

The stream of ``benchmarks/bench_forget.py`` (paper-3m hybrid_sv, randomly initialised,
seed 0, ``policy="full"``, snapshot_every 4) reads the first ``--tokens`` bytes of
enwik8; a copy of it forgets ``--span`` bytes in the middle (timed), and
``verify_forget`` checks the receipt (timed: its re-stream from scratch dominates).
Run once on the tree before issue #35's binding and once after, with the same
arguments; the ratio is the binding's cost. With ``--sign`` (after #35 only) the
stream signs its receipts with a fresh Ed25519 key and the verifier checks the
signature.

Usage::

    python benchmarks/bench_receipt_binding.py --tokens 4096 --repeats 3 --json OUT.json
"""

from __future__ import annotations

import argparse
import copy
import inspect
import statistics
import sys
import time
from pathlib import Path

import torch

from svattn.data.enwik8 import slice_path
from svattn.lm.forget import verify_forget

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_forget import SHARED, build_model  # noqa: E402
from bench_records import write_record  # noqa: E402


def binding_parts(stream, receipt, public) -> dict[str, float]:
    """Milliseconds (median of 20) of what #35 adds to a forget and to its verification
    besides the re-stream: the receipt body's hash, the stream's state part and digest
    (computed about twice each per forget and per verification), the receipt's field
    checks and, when signed, the signature's check."""
    from svattn.exact.records.signing import signature_errors

    def ms(fn) -> float:
        out = []
        for _ in range(20):
            t = time.perf_counter()
            fn()
            out.append(1e3 * (time.perf_counter() - t))
        return statistics.median(out)

    parts = {"body_sha256": ms(receipt.body_sha256), "state_part": ms(stream.state_part),
             "digest": ms(stream.digest), "field_errors": ms(receipt.field_errors)}
    if public is not None:
        parts["signature_check"] = ms(lambda: signature_errors(receipt, public))
    return parts


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--span", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--sign", action="store_true", help="sign receipts (Ed25519) and check")
    ap.add_argument("--json", type=Path, default=None)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    model, note = build_model(None, 0)
    text = (SHARED if SHARED.exists() else slice_path()).read_bytes()[: args.tokens]
    kwargs, public = {}, None
    if args.sign:
        if "signing_key" not in inspect.signature(model.stream).parameters:
            raise SystemExit("--sign: this tree's CharLM.stream takes no signing_key")
        from svattn.exact.records.signing import generate_key

        key = generate_key()
        kwargs, public = {"signing_key": key}, key.public_key()
    base = model.stream(snapshot_every=4, **kwargs)
    t0 = time.perf_counter()
    base.feed(text)
    print(f"fed {len(text)} bytes in {time.perf_counter() - t0:.1f} s", flush=True)
    start = (len(text) - args.span) // 2
    forget_s, verify_s = [], []
    for _ in range(args.repeats):
        s = copy.deepcopy(base)
        t0 = time.perf_counter()
        receipt = s.forget(start, start + args.span).receipt
        forget_s.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        vkw = {} if public is None else {"public_key": public}
        rep = verify_forget(s, receipt, **vkw)
        verify_s.append(time.perf_counter() - t0)
        assert rep.ok, rep.summary()
        print(f"forget {forget_s[-1]:.3f} s, verify_forget {verify_s[-1]:.3f} s", flush=True)
    parts = binding_parts(s, receipt, public) if hasattr(s, "state_part") else None
    if parts:
        print("binding parts (ms, median of 20): " + ", ".join(
            f"{k} {v:.3f}" for k, v in parts.items()), flush=True)
    body = {"model": note, "tokens": len(text), "span": [start, start + args.span],
            "signed": args.sign, "forget_s": forget_s, "verify_forget_s": verify_s,
            "binding_parts_ms": parts,
            "forget_median_s": statistics.median(forget_s),
            "verify_forget_median_s": statistics.median(verify_s), "threads": 1}
    print(f"median: forget {body['forget_median_s']:.3f} s, verify_forget "
          f"{body['verify_forget_median_s']:.3f} s")
    if args.json is not None:
        write_record(args.json, __file__, argv, body)
    return body


if __name__ == "__main__":
    main()
