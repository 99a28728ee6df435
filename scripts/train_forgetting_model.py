"""Train the model of ``svattn reproduce model-forgetting`` (resumable; run again to continue).

MQAR, T = 64, 4 pairs, vocabulary 128; a 2-block d = 64 ``hybrid_sv`` model under
the ``"full"`` policy (the policy ``LMStream`` streams), chunks of 16, C = 1/16;
4,000 steps of 64 sequences at lr 1e-3 (the ``long-64`` recall grid's schedule).
Checkpoints ``runs/model_forgetting/ckpt.pt`` every 250 steps; the last step writes
``runs/model_forgetting/model.pt`` (the model only, with this command recorded),
which the experiment reads. ``--copy-to results/model_forgetting`` also copies that
file there when it is under 1 MB.

    PYTHONPATH=src OMP_NUM_THREADS=1 nice -n 5 python scripts/train_forgetting_model.py
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
from pathlib import Path

import torch

from svattn.lm.recall import MODEL_NAME, RecallRun, train_checkpointed

#: The run (model-forgetting's MODEL_RUN has the same fields).
RUN = RecallRun(
    task="mqar", seq_len=64, mixer="hybrid_sv", d_model=64, lr=1e-3, seed=0, n_layer=2,
    n_head=2, steps=4000, batch_size=64, num_train=64000, num_test=500,
    task_options={"vocab_size": 128, "num_kv_pairs": 4},
    hybrid={"chunk": 16, "C": 1.0 / 16, "budget": 16, "policy": "full"},
    inspect_sequences=1,
)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/model_forgetting"))
    p.add_argument("--steps", type=int, default=RUN.steps)
    p.add_argument("--ckpt-every", type=int, default=250)
    p.add_argument("--stop-after", type=int, default=None)
    p.add_argument("--copy-to", type=Path, default=None)
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    run = RecallRun.from_dict({**RUN.to_dict(), "steps": args.steps})
    command = shlex.join(["python", "scripts/train_forgetting_model.py",
                          *(sys.argv[1:] if argv is None else argv)])
    rec = train_checkpointed(run, args.out, ckpt_every=args.ckpt_every,
                             stop_after=args.stop_after, command=command,
                             log=lambda s: print(s, flush=True))
    print(rec, flush=True)
    final = args.out / MODEL_NAME
    if args.copy_to is not None and final.exists():
        if final.stat().st_size >= 1 << 20:
            print(f"{final} is {final.stat().st_size} bytes (>= 1 MB): not copied")
        else:
            args.copy_to.mkdir(parents=True, exist_ok=True)
            shutil.copy2(final, args.copy_to / MODEL_NAME)
            print(f"copied {final} to {args.copy_to / MODEL_NAME}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
