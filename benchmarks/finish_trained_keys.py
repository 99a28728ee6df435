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

With ``--models``, the same for each model's own boundary problems instead (its keys on
``--sequences`` test sequences, taken by ``scripts/make_trained_keys_fixture.py`` into a
temporary folder), one row a model:

    python benchmarks/finish_trained_keys.py --models results/*_models/*hybrid_sv*.safetensors \
        --dtype float64 float32 --json results/finish_trained_models.json
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
from bench_records import add_conditions, write_record  # noqa: E402
from svattn.nn import SolverOptions  # noqa: E402
from svattn.nn.batched import solve_batched  # noqa: E402
from trained_keys import PAPER, distance_to_oracle, outside_box, prefix_problems, read_fixture  # noqa: E402

DTYPES = {"float64": torch.float64, "float32": torch.float32}


def finishes_on(keys, meta: dict, dtypes: list[str]) -> dict:
    """Both finishes on every boundary problem of a fixture's keys, per dtype."""
    C, gamma, kernel = meta["C"], meta["gamma"], meta["kernel"]
    rows = keys.reshape(-1, *keys.shape[-2:])
    out = {}
    for name in dtypes:
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
                           "l1_to_oracle_mean": float(dist.mean()),
                           "l1_over_1e-6": int((dist > 1e-6).sum()),
                           "l1_over_1e-4": int((dist > 1e-4).sum())}
        out[name] = res
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtype", choices=sorted(DTYPES), nargs="+", default=["float64"])
    parser.add_argument("--models", type=Path, nargs="+", default=None,
                        help="trained models (.safetensors): their own boundary problems "
                             "instead of the committed fixture's")
    parser.add_argument("--sequences", type=int, default=8,
                        help="test sequences per model with --models (default 8)")
    parser.add_argument("--json", type=Path, default=None)
    add_conditions(parser)
    args = parser.parse_args(argv)
    solvers = {"approximate": repr(PAPER), "optimum": repr(SolverOptions())}
    if args.models:
        import make_trained_keys_fixture  # scripts/: a trained model's keys, as the fixture
        rows = []
        with tempfile.TemporaryDirectory() as tmp:
            for i, model in enumerate(args.models):
                prefix = Path(tmp) / f"m{i}"
                if make_trained_keys_fixture.main([str(model), str(prefix),
                                                   "--sequences", str(args.sequences)]):
                    parser.error(f"--models: {model} gave no boundary problems (its "
                                 "message above): name hybrid models only")
                keys, meta = read_fixture(prefix)
                row = {"model": str(model), "C": meta["C"], "chunk": meta["chunk"],
                       "sequences": args.sequences, **finishes_on(keys, meta, args.dtype)}
                rows.append(row)
                print(row, flush=True)
        body = {"solvers": solvers, "conditions": args.conditions, "rows": rows}
    else:
        keys, meta = read_fixture()
        out = finishes_on(keys, meta, args.dtype)
        for name, res in out.items():
            print(name, res, flush=True)
        body = {"fixture": meta, "solvers": solvers, "conditions": args.conditions,
                "by_dtype": out}
    if args.json:
        write_record(args.json, __file__, argv, body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
