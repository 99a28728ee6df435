"""Fingerprint of fixed seeded streams: digests, logits and memories, for A/B runs of code.

For each streamable model it feeds a seeded text in seeded pieces, forgets two spans
(one mid-text, one at the end), with memory snapshots every 2 chunks and none
(so the rewinds remove tokens, or restore copies), rewinds and replays (a forget of a span already
replayed over), generates a few bytes, and records at every stage the stream's
content digest, state part, the SHA-256 of its logits' float64 bytes, the memories'
ids and the SHA-256 of their alphas, keys and values, and each receipt's structural
fields (what is not a timing, a timestamp or a nonced commitment).

Run it under two checkouts and compare the JSON (issue 38: the stream's step moved
into the mixers, nothing else may change)::

    PYTHONPATH=/work/main/src python benchmarks/stream_fingerprint.py --out a.json
    PYTHONPATH=src python benchmarks/stream_fingerprint.py --out b.json
    python benchmarks/stream_fingerprint.py --compare a.json b.json

``--models`` picks a subset (default: the models both checkouts stream).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys

import numpy as np
import torch

from svattn.lm import CharLM, CharLMConfig

HYB = {"chunk": 8, "C": 0.25, "policy": "full"}
MODELS = {
    "softmax": dict(mixer="softmax"),
    "softmax-rope": dict(mixer="softmax", rope=True),
    "sliding": dict(mixer="sliding", mixer_options={"window": 6}),
    "sliding-posemb": dict(mixer="sliding", mixer_options={"window": 6}, pos_emb=True),
    "hybrid": dict(mixer="hybrid_sv", mixer_options=HYB),
    "hybrid-rope-lookback": dict(mixer="hybrid_sv", mixer_options={**HYB, "lookback": 3},
                                 rope=True),
    "hybrid-exp": dict(mixer="hybrid_sv", mixer_options={**HYB, "kernel": "exp"}),
    "hybrid-support": dict(mixer="hybrid_sv",
                           mixer_options={**HYB, "policy": "support", "budget": 8}),
}


def sha(t) -> str:
    a = t.detach().numpy() if isinstance(t, torch.Tensor) else np.asarray(t)
    return hashlib.sha256(np.ascontiguousarray(a, dtype=np.float64).tobytes()).hexdigest()


def make(name: str) -> CharLM:
    torch.manual_seed(0)
    model = CharLM(CharLMConfig(n_layer=2, n_embd=16, n_head=2, block_size=160,
                                **MODELS[name]))
    with torch.no_grad():  # larger gates and projections than at init
        for block in model.blocks:
            if hasattr(block.mix, "gate"):
                block.mix.gate.fill_(0.5)
            block.mix.qkv.weight.mul_(10.0)
    return model


def snapshot(s) -> dict:
    out = {"content": s.content_digest(), "state_part": s.state_part(), "n": len(s),
           "text": hashlib.sha256(s.text).hexdigest(),
           "logits": sha(s.all_logits()) if len(s) else None, "memories": []}
    for st in s.layers:
        for mem in st.mems:
            out["memories"].append({"ids": list(mem.ids), "alpha": sha(mem.alpha),
                                    "keys": sha(mem.keys) if len(mem) else None,
                                    "values": sha(mem.values) if len(mem) else None})
    return out


def receipt_shape(r) -> dict:
    rep = {k: v for k, v in r.repair.items() if k != "seconds"}
    mems = [{k: v for k, v in m.items() if k not in ("rewind_s", "span_certificates")}
            | {"n_span_certificates": len(m["span_certificates"]),
               "span_removed_ids": [c["removed_id"] for c in m["span_certificates"]]}
            for m in r.memories]
    return {"fed_span": r.fed_span, "held_span": r.held_span, "n_forgotten": r.n_forgotten,
            "n_before": r.n_before, "n_after": r.n_after, "repair": rep, "memories": mems}


def run(name: str, snapshot_every: int) -> dict:
    model = make(name)
    rng = np.random.default_rng(1)
    text = bytes(rng.integers(97, 110, 120).tolist())
    s = model.stream(full_policy=True, snapshot_every=snapshot_every)
    stages, logits = {}, []
    cuts = [0, *sorted(set(rng.integers(1, len(text), 6).tolist())), len(text)]
    for a, b in zip(cuts, cuts[1:], strict=False):
        logits.append(s.feed(text[a:b]))
    stages["fed"] = snapshot(s) | {"feed_logits": sha(torch.cat(logits)),
                                   "digest": s.digest()}
    receipts = [receipt_shape(s.forget_fed(37, 52).receipt)]
    stages["forget_mid"] = snapshot(s)
    receipts.append(receipt_shape(s.forget_fed(110, 120).receipt))
    stages["forget_end"] = snapshot(s)
    s.feed(text[:20])
    receipts.append(receipt_shape(s.forget_fed(3, 9).receipt))  # rewinds over a replayed stretch
    stages["forget_early"] = snapshot(s)
    gen = s.generate(5, temperature=0.7, seed=3)
    stages["generated"] = snapshot(s) | {"bytes": gen.hex()}
    return {"stages": stages, "receipts": receipts}


def compare(a: dict, b: dict) -> int:
    bad = 0
    for name in sorted(set(a) & set(b)):
        same = a[name] == b[name]
        bad += not same
        print(f"{name:40s} {'identical' if same else 'DIFFERS'}")
    for name in sorted(set(a) ^ set(b)):
        print(f"{name:40s} only in {'the first' if name in a else 'the second'}")
    return 1 if bad else 0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--models", nargs="*", default=sorted(MODELS))
    ap.add_argument("--compare", nargs=2, metavar="JSON")
    args = ap.parse_args(argv)
    if args.compare:
        a, b = (json.loads(open(p).read()) for p in args.compare)
        return compare(a, b)
    res = {f"{name} snapshot_every={k}": run(name, k) for name in args.models for k in (0, 2)}
    body = json.dumps(res, sort_keys=True, indent=1)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(body)
    else:
        print(body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
