"""The batched solver's two finishes on a trained model's boundary problems, against the oracle.

The problems are those of ``tests/nn/data/trained_keys.*`` (the keys a trained
selective-copy hybrid's layers build their memories from, written by
``scripts/make_trained_keys_fixture.py``): every boundary problem of the ``"full"``
policy of each sequence, layer and head. Each is solved by the batched solver with the
paper's finish as the recall grid trained it (``finish="approximate"``, refine 0, no
ridge steps) and with the default ``"optimum"`` finish, and by
:func:`svattn.exact.oracle.solve_svdd`. Reported per finish: problems with some alpha
outside ``[0, C]`` by more than 1e-9, problems the diagnostics call unsettled, oracle
fallbacks, and the L1 distance to the oracle's alpha summed over clusters of copies
(``benchmarks/trained_keys.py``, which ``tests/nn/test_nn_finish.py`` uses too).

    python benchmarks/finish_trained_keys.py --json results/finish_trained_keys.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_records import add_conditions, write_record  # noqa: E402
from svattn.nn import SolverOptions  # noqa: E402
from svattn.nn.batched import solve_batched  # noqa: E402
from trained_keys import PAPER, distance_to_oracle, outside_box, prefix_problems, read_fixture  # noqa: E402

DTYPES = {"float64": torch.float64, "float32": torch.float32}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=sorted(DTYPES), nargs="+", default=["float64"])
    parser.add_argument("--json", type=Path, default=None)
    add_conditions(parser)
    args = parser.parse_args(argv)
    keys, meta = read_fixture()
    C, gamma, kernel = meta["C"], meta["gamma"], meta["kernel"]
    rows = keys.reshape(-1, *keys.shape[-2:])
    out = {}
    for name in args.dtype:
        k, valid = prefix_problems(rows, meta["chunk"], DTYPES[name])
        res = {"problems": int(k.shape[1])}
        for finish, solver in (("approximate", PAPER), ("optimum", SolverOptions())):
            alpha, _, info = solve_batched(k, C, kernel=kernel, gamma=gamma, valid=valid,
                                           solver=solver)
            dist = distance_to_oracle(k, valid, alpha, C, kernel, gamma)
            res[finish] = {"outside_box": int(outside_box(alpha, valid, C).sum()),
                           "unsettled": int(info.unsettled),
                           "fallbacks": int(info.fallbacks),
                           "l1_to_oracle_max": float(dist.max()),
                           "l1_to_oracle_mean": float(dist.mean())}
        out[name] = res
        print(name, res, flush=True)
    body = {"fixture": meta, "solvers": {"approximate": repr(PAPER),
                                         "optimum": repr(SolverOptions())},
            "conditions": args.conditions, "by_dtype": out}
    if args.json:
        write_record(args.json, __file__, argv, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
