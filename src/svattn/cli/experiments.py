"""The commands that show and reproduce the method: ``demo`` streams ICU vital signs
into an exact SV memory, deletes one patient and verifies the deletion
(:mod:`svattn.demo`); ``reproduce`` runs the paper's experiments and writes their reports
(:mod:`svattn.experiments`).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from svattn.cli.inputs import check_file, positive_float, positive_int

__all__ = ["demo_arguments", "demo_run", "reproduce_arguments", "reproduce_run"]


def demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--stays", type=positive_int, default=6, metavar="N",
        help="stream the first N ICU stays of the data (default: 6)",
    )
    parser.add_argument(
        "--C", dest="C", type=positive_float, default=0.05,
        help="box bound of the SVDD memory; at least ceil(1/C) tokens carry weight "
        "(default: 0.05)",
    )
    parser.add_argument(
        "--gamma", type=positive_float, default=None,
        help="rbf bandwidth (default: 1/d for d = 7 vitals)",
    )
    parser.add_argument(
        "--seed", type=int, default=0,
        help="draws the withdrawing patient and the verification probes (default: 0)",
    )
    parser.add_argument(
        "--delete", type=int, default=None, metavar="STAY_ID",
        help="the ICU stay to delete (default: drawn among streamed stays with support tokens)",
    )
    parser.add_argument(
        "--data", type=Path, default=None, metavar="PATH",
        help="a MIMIC-III demo vitals CSV(.gz) (default: the slice shipped with svattn)",
    )
    parser.add_argument(
        "--show", type=int, default=40, metavar="K",
        help="print at most K lines of certificates (all are checked; default: 40)",
    )
    parser.add_argument(
        "--verify-each", action="store_true",
        help="retrain from scratch after every single deletion (slower)",
    )
    parser.add_argument(
        "--out", type=Path, default=None, metavar="DIR",
        help="save the audit log, the final state and every certificate in DIR, for "
        "svattn verify-deletion and svattn audit verify (a new folder)",
    )
    parser.add_argument(
        "--signing-key", type=Path, default=None, metavar="KEY",
        help="sign every certificate with this Ed25519 private key (svattn keygen PREFIX "
        "writes PREFIX.key and PREFIX.pub); auditors check with verify-deletion "
        "--public-key PREFIX.pub",
    )


def demo_run(args: argparse.Namespace) -> int:
    from svattn.demo import run_demo

    if args.signing_key is not None:
        check_file(args.signing_key, "--signing-key")
    result = run_demo(
        stays=args.stays, C=args.C, gamma=args.gamma, seed=args.seed, delete=args.delete,
        data=args.data, show=args.show, verify_each=args.verify_each, save_to=args.out,
        signing_key=args.signing_key,
    )
    return 0 if result.ok else 1


def reproduce_arguments(parser: argparse.ArgumentParser) -> None:
    from svattn.experiments.catalog import EXPERIMENTS, SHARED_DATA  # names only: cheap

    needs = "; ".join(f"{k} ({v})" for k, v in SHARED_DATA.items())
    parser.add_argument(
        "names", nargs="*", metavar="NAME",
        help=f"experiments to run (default: all): {', '.join(EXPERIMENTS)}. Full mode reads "
        f"--data-dir for: {needs}; the others, and every experiment with --quick, need no "
        "data beyond the package",
    )
    parser.add_argument(
        "--quick", action="store_true",
        help="shipped slices and synthetic data only, well under a minute in all",
    )
    parser.add_argument(
        "--out", type=Path, default=Path("reproduce-out"), metavar="DIR",
        help="output folder: README.md plus one folder per experiment (default: reproduce-out)",
    )
    parser.add_argument("--seed", type=int, default=0, help="base seed (default: 0)")
    parser.add_argument(
        "--data-dir", type=Path, default=None, metavar="PATH",
        help="folder with icu/ and enwik8/ for full mode (default: ../shared/data next to "
        "the repository, if present)",
    )


def reproduce_run(args: argparse.Namespace) -> int:
    from svattn.experiments.runner import command_line, reproduce

    if args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out: {args.out} is a file; give a folder (it is created if absent)")

    argv = [*args.names] + (["--quick"] if args.quick else []) + [
        "--seed", str(args.seed), "--out", str(args.out)]
    if args.data_dir is not None:
        argv += ["--data-dir", str(args.data_dir)]
    results = reproduce(
        args.names, quick=args.quick, out=args.out, seed=args.seed, data_dir=args.data_dir,
        command=command_line(["reproduce", *argv]),
    )
    n = len(results)
    print(f"wrote {args.out / 'README.md'} ({n} experiment{'s' * (n != 1)})")
    return 1 if any(r.verdict.startswith("FAILED") for r in results) else 0
