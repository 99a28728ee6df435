"""Write saved stream folders and the numbers of their continuation (a test fixture).

Run it with the svattn whose stream folders the fixture should freeze:

    PYTHONPATH=<that checkout>/src python scripts/make_stream_fixture.py tests/lm/data/stream_v2

For each model of :data:`MODELS` it writes ``<prefix>/<name>/``: ``model.safetensors``
(the weights; the config is in the record), ``stream/`` (an :class:`LMStream` folder
saved after feeds and two forgets, with memory snapshots) and ``receipt.json`` (the
last forget's receipt), and ``<prefix>.json``: the command, and per model the saved
digest, then of a fixed continuation (:func:`continue_stream`: feed, forget) the
digests, the logits of the fed bytes in full (JSON floats round-trip exactly), the
SHA-256 of every held position's logits and the last position's logits in full.
``tests/lm/test_stream_fixture.py`` loads the folders with today's code: old stream
folders load, their receipts verify, and they continue as the code that wrote them.

Only public API is used, so the script runs against any svattn that saves streams.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file

from svattn.lm import CharLM, CharLMConfig

HYB = {"chunk": 8, "C": 0.25, "policy": "full"}
MODELS = {
    "hybrid": dict(mixer="hybrid_sv", mixer_options={**HYB, "lookback": 3}, rope=True),
    "sliding": dict(mixer="sliding", mixer_options={"window": 6}, pos_emb=True),
}


def config(name: str) -> dict:
    return CharLMConfig(n_layer=2, n_embd=16, n_head=2, block_size=128,
                        **MODELS[name]).to_dict()


def build_model(name: str) -> CharLM:
    """The fixture's model: seeded init, larger gates and projections (layers that matter)."""
    torch.manual_seed(0)
    model = CharLM(CharLMConfig(**config(name)))
    with torch.no_grad():
        for block in model.blocks:
            if hasattr(block.mix, "gate"):
                block.mix.gate.fill_(0.5)
            block.mix.qkv.weight.mul_(10.0)
    return model


def text_of(n: int, seed: int) -> bytes:
    return bytes(np.random.default_rng(seed).integers(97, 110, n).tolist())


def build_stream(model: CharLM):
    """70 bytes fed in pieces, two forgets (by exact removals: no snapshots), 12 more bytes."""
    s = model.stream(snapshot_every=0)
    text = text_of(70, 1)
    for a, b in ((0, 9), (9, 40), (40, 70)):
        s.feed(text[a:b])
    s.forget_fed(20, 33)
    s.feed(text_of(12, 2))
    receipt = s.forget_fed(50, 53).receipt
    return s, receipt


def sha(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().to(torch.float64).contiguous().numpy().tobytes()
                          ).hexdigest()


def continue_stream(s) -> dict:
    """A fixed continuation: feed 10 bytes, forget a span that the feed follows."""
    fed = s.feed(text_of(10, 3))
    out = {"feed_logits": fed.tolist(), "after_feed": s.digest()}
    s.forget_fed(5, 9)
    out.update(after_forget_content=s.content_digest(), after_forget_state=s.state_part(),
               all_logits_sha256=sha(s.all_logits()), last_logits=s.logits().tolist(),
               n_held=len(s))
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("prefix")
    ap.add_argument("--note", default="")
    args = ap.parse_args(argv)
    root = Path(args.prefix)
    record = {"command": " ".join(["python", "scripts/make_stream_fixture.py", *sys.argv[1:]]),
              "note": args.note, "models": {}}
    for name in MODELS:
        model = build_model(name)
        where = root / name
        if where.exists():
            shutil.rmtree(where)
        where.mkdir(parents=True)
        save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()},
                  where / "model.safetensors")
        s, receipt = build_stream(model)
        s.save(where / "stream")
        (where / "receipt.json").write_text(receipt.to_json())
        record["models"][name] = {"config": config(name), "saved_digest": s.digest(),
                                  "saved_content": s.content_digest(), "n_held": len(s),
                                  "continuation": continue_stream(s)}
    Path(f"{root}.json").write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
