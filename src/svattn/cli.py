"""The ``svattn`` command line: one subcommand per task, listed in :data:`COMMANDS`.

Adding a subcommand is one entry: write ``add_arguments(parser)`` (cheap, no
heavy imports) and ``run(args) -> int`` (import what it needs inside), then
append ``Command(name, help, add_arguments, run)`` to :data:`COMMANDS`.

Examples
--------
>>> from svattn.cli import main
>>> main(["--version"])  # doctest: +SKIP
svattn 0.1.0
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import svattn

__all__ = ["COMMANDS", "Command", "build_parser", "main"]


@dataclass(frozen=True)
class Command:
    """A subcommand: its name, one-line help, argument set-up and runner.

    ``run`` returns the process exit code (0 for success). Errors a user can
    fix (bad paths, bad values) should be raised as ``ValueError`` or
    ``FileNotFoundError``: :func:`main` prints them as one line and exits 2.
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]


# ----------------------------------------------------------------------- demo


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be a number > 0, got {text}")
    return value


def _demo_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--stays", type=_positive_int, default=6, metavar="N",
        help="stream the first N ICU stays of the data (default: 6)",
    )
    parser.add_argument(
        "--C", dest="C", type=_positive_float, default=0.05,
        help="box bound of the SVDD memory; at least ceil(1/C) tokens carry weight "
        "(default: 0.05)",
    )
    parser.add_argument(
        "--gamma", type=_positive_float, default=None,
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


def _demo_run(args: argparse.Namespace) -> int:
    from svattn.demo import run_demo

    result = run_demo(
        stays=args.stays, C=args.C, gamma=args.gamma, seed=args.seed, delete=args.delete,
        data=args.data, show=args.show, verify_each=args.verify_each,
    )
    return 0 if result.ok else 1


# ---------------------------------------------------------------- audit verify


def _audit_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("action", choices=["verify"], help="verify: check a log (and a state)")
    parser.add_argument("log", type=Path, metavar="LOG", help="the JSONL audit log")
    parser.add_argument(
        "state", type=Path, nargs="?", default=None, metavar="STATE",
        help="a state saved with this log: its digest must be the log's final digest",
    )


def _audit_run(args: argparse.Namespace) -> int:
    from svattn.exact.verify import verify_log

    if not args.log.exists():
        raise FileNotFoundError(f"no audit log at {args.log}")
    if args.state is not None and not args.state.exists():
        raise FileNotFoundError(f"no state file at {args.state}")
    report = verify_log(args.log, args.state)
    print(report.summary())
    return 0 if report.ok else 1


# ------------------------------------------------------------- verify-deletion


def _verify_deletion_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("state", type=Path, metavar="STATE", help="the saved memory state")
    parser.add_argument("certificate", type=Path, metavar="CERTIFICATE",
                        help="a deletion certificate (JSON, DeletionCertificate.to_json)")
    parser.add_argument("--tol", type=_positive_float, default=1e-8,
                        help="tolerance on alpha, decision function and readout (default: 1e-8)")
    parser.add_argument("--seed", type=int, default=0, help="draws the probe points (default: 0)")
    parser.add_argument("--log", type=Path, metavar="LOG", default=None,
                        help="the memory's audit log: it must verify and record exactly this "
                             "certificate and the add of its token (catches an edited commitment)")
    parser.add_argument("--public-key", type=Path, metavar="KEY", default=None,
                        help="the controller's Ed25519 public key (svattn keygen): the "
                             "certificate must carry its valid signature")


def _verify_deletion_run(args: argparse.Namespace) -> int:
    from svattn.exact.certificate import DeletionCertificate
    from svattn.exact.persist import load
    from svattn.exact.verify import verify_deletion

    extra = tuple(p for p in (args.log, args.public_key) if p is not None)
    for p in (args.state, args.certificate) + extra:
        if not p.exists():
            raise FileNotFoundError(f"no such file: {p}")
        if p.is_dir():
            raise ValueError(f"{p} is a directory, not a file")
    memory = load(args.state)
    try:
        text = args.certificate.read_text()
    except UnicodeDecodeError:
        raise ValueError(f"certificate {args.certificate} is not a text (JSON) file") from None
    cert = DeletionCertificate.from_json(text)
    v = verify_deletion(memory, cert, retrain=True, tol=args.tol, seed=args.seed, log=args.log,
                        public_key=args.public_key)
    print(f"state: {args.state} ({len(memory)} tokens, C={memory.C}, kernel={memory.kernel})")
    print(f"certificate: removal of token {cert.removed_id}, issued {cert.issued_at}")
    print(f"digest matches:      {v.digest_matches}")
    print(f"token absent:        {v.removed_absent}")
    print(f"parameters match:    {v.parameters_match}")
    print(f"KKT residual:        {v.kkt_residual:.3e}")
    print(f"unique optimum:      {v.unique_optimum}")
    print(f"live copies:         {list(v.copies) if v.copies else 'none'}")
    if v.logged is not None:
        print(f"in the audit log:    {v.logged}")
    if v.signed is not None:
        print(f"signature valid:     {v.signed}")
    if v.retrained:
        print(f"partition equal:     {v.partition_equal}")
        print(f"max |alpha - retrain|: {v.max_alpha_dev:.3e}")
        print(f"decision deviation:  {v.decision_dev:.3e}")
        print(f"readout deviation:   {v.readout_dev:.3e} ({v.n_probes} probes)")
    print(f"tolerance:           {v.tolerance:.1e}")
    print(v.summary())
    return 0 if v.ok else 1


def _recover_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("state", type=Path, metavar="STATE", help="the last state saved")
    parser.add_argument("log", type=Path, metavar="LOG", help="its audit log")
    parser.add_argument("--new-log", type=Path, required=True, metavar="NEW_LOG",
                        help="the new chain (a new file), citing STATE and LOG")
    parser.add_argument("--out", type=Path, required=True, metavar="NEW_STATE",
                        help="where the recovered memory is saved")
    parser.add_argument("--signing-key", type=Path, default=None, metavar="KEY",
                        help="sign the replayed removals' certificates")


def _recover_run(args: argparse.Namespace) -> int:
    from svattn.exact.audit import AuditLogError
    from svattn.exact.recovery import recover

    for p in (args.state, args.log):
        if not p.exists():
            raise FileNotFoundError(f"no such file: {p}")
    for p in (args.new_log, args.out):
        if p.exists():
            raise ValueError(f"{p} exists; recovery writes new files only")
    try:
        memory, report = recover(args.state, args.log, args.new_log,
                                 signing_key=args.signing_key)
    except AuditLogError as exc:  # a log or state that cannot be recovered from: usage
        raise ValueError(str(exc)) from None
    memory.save(args.out)
    print(report.summary())
    print(f"recovered state: {args.out} ({len(memory)} tokens); new audit log: {args.new_log}")
    if report.lost_adds:
        print(f"lost (added after the save, never in a file): ids {list(report.lost_adds)}")
    return 0


def _keygen_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prefix", type=Path, metavar="PREFIX",
                        help="writes PREFIX.key (private, mode 0600) and PREFIX.pub")


def _keygen_run(args: argparse.Namespace) -> int:
    from svattn.exact.signing import fingerprint, load_public_key, write_keypair

    if args.prefix.is_dir():
        raise ValueError(f"{args.prefix} is a directory; give a file prefix such as "
                         f"{args.prefix / 'controller'}")
    try:
        key_path, pub_path = write_keypair(args.prefix)
    except FileExistsError as exc:
        raise ValueError(str(exc)) from None
    print(f"private key: {key_path} (keep it secret: SVDDMemory(..., signing_key=...))")
    print(f"public key:  {pub_path} (give it to auditors: verify-deletion --public-key)")
    print(f"fingerprint: {fingerprint(load_public_key(pub_path))}")
    return 0


# ------------------------------------------------------------------ reproduce


def _reproduce_arguments(parser: argparse.ArgumentParser) -> None:
    from svattn.experiments.runner import EXPERIMENTS  # a dict of names: cheap

    parser.add_argument(
        "names", nargs="*", metavar="NAME",
        help=f"experiments to run (default: all): {', '.join(EXPERIMENTS)}",
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


def _reproduce_run(args: argparse.Namespace) -> int:
    from svattn.experiments.runner import command_line, reproduce

    argv = [*args.names] + (["--quick"] if args.quick else []) + [
        "--seed", str(args.seed), "--out", str(args.out)]
    if args.data_dir is not None:
        argv += ["--data-dir", str(args.data_dir)]
    results = reproduce(
        args.names, quick=args.quick, out=args.out, seed=args.seed, data_dir=args.data_dir,
        command=command_line(["reproduce", *argv]),
    )
    print(f"wrote {args.out / 'README.md'} ({len(results)} experiments)")
    return 1 if any(r.verdict.startswith("FAILED") for r in results) else 0


# ------------------------------------------------------------------ train/eval


def _train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config", type=Path, metavar="CONFIG",
        help="training config (JSON; keys of svattn.lm.train.TrainConfig, e.g. configs/*.json)",
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a config key (VALUE parsed as JSON, else taken as a string); repeatable",
    )
    parser.add_argument(
        "--resume", action="store_true",
        help="continue from OUT_DIR/ckpt.pt when it exists",
    )
    parser.add_argument(
        "--stop-after", type=_positive_int, default=None, metavar="STEP",
        help="checkpoint and stop at this step (as if interrupted; resume later)",
    )


def _parse_overrides(items: list[str]) -> dict:
    import json

    out = {}
    for item in items:
        key, sep, text = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            out[key] = json.loads(text)
        except json.JSONDecodeError:
            out[key] = text
    return out


def _train_run(args: argparse.Namespace) -> int:
    import json

    from svattn.lm.train import TrainConfig, train

    if not args.config.is_file():
        raise FileNotFoundError(f"config not found: {args.config}")
    with open(args.config) as fh:
        raw = json.load(fh)
    cfg = TrainConfig.from_dict({**raw, **_parse_overrides(args.overrides)})
    res = train(cfg, resume=args.resume, stop_after=args.stop_after)
    import os

    if int(os.environ.get("RANK", "0")) == 0:
        print(
            f"{cfg.mixer}: {res.params:,} params, {res.tokens_seen:,} tokens "
            f"({res.train_tokens_per_s:,.0f} tokens/s), final loss {res.final_loss:.4f}, "
            f"val BPC {res.val_bpc}, test BPC {res.test_bpc} on {res.data}; "
            f"checkpoint {res.checkpoint}"
        )
    return 0


def _eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, metavar="CHECKPOINT", help="a ckpt.pt of train")
    parser.add_argument(
        "--data", type=Path, default=None, metavar="PATH",
        help="enwik8 file (raw or .zip; default: the run's data)",
    )
    parser.add_argument(
        "--split", nargs="+", default=["val", "test"], choices=["train", "val", "test"],
    )
    parser.add_argument(
        "--context", type=_positive_int, default=None,
        help="context length (default: the model's block_size)",
    )
    parser.add_argument("--batch-size", type=_positive_int, default=32)
    parser.add_argument(
        "--max-bytes", type=_positive_int, default=None,
        help="score only the first N bytes of each split (default: every byte)",
    )


def _eval_run(args: argparse.Namespace) -> int:
    import json

    from svattn.lm.train import evaluate_bpc, load_checkpoint_for_eval

    model, _, ckpt, ds = load_checkpoint_for_eval(args.checkpoint, args.data)
    context = args.context or model.cfg.block_size
    for split in args.split:
        lo, hi = ds.span(split, args.max_bytes)
        res = evaluate_bpc(model, ds.data, lo, hi, context=context, batch_size=args.batch_size)
        rec = {"split": split, "data": ds.label, "step": ckpt["step"], **res}
        print(json.dumps(rec))
    return 0


# ------------------------------------------------------------------- registry

COMMANDS: list[Command] = [
    Command(
        "demo",
        "stream ICU vital signs into an exact SV memory, delete one patient, verify",
        _demo_arguments,
        _demo_run,
    ),
    Command(
        "audit",
        "verify an audit log: hash chain, certificates, final digest against a saved state",
        _audit_arguments,
        _audit_run,
    ),
    Command(
        "verify-deletion",
        "re-solve a saved state from scratch and check a deletion certificate against it",
        _verify_deletion_arguments,
        _verify_deletion_run,
    ),
    Command(
        "recover",
        "after a crash: the last saved state with every later logged removal replayed, "
        "on a new audit log",
        _recover_arguments,
        _recover_run,
    ),
    Command(
        "keygen",
        "write an Ed25519 key pair that signs deletion receipts (PREFIX.key, PREFIX.pub)",
        _keygen_arguments,
        _keygen_run,
    ),
    Command(
        "reproduce",
        "run the paper's experiments and write reports beside the paper's figures",
        _reproduce_arguments,
        _reproduce_run,
    ),
    Command(
        "train",
        "train a byte-level language model (CharLM) on enwik8; torchrun for several processes",
        _train_arguments,
        _train_run,
    ),
    Command(
        "eval",
        "bits per character of a trained checkpoint on enwik8 splits",
        _eval_arguments,
        _eval_run,
    ),
]
"""Every subcommand, in the order ``svattn --help`` lists them."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with one subparser per entry of :data:`COMMANDS`.

    Returns
    -------
    argparse.ArgumentParser

    Examples
    --------
    >>> from svattn.cli import build_parser
    >>> build_parser().parse_args(["demo", "--stays", "3"]).stays
    3
    """
    parser = argparse.ArgumentParser(
        prog="svattn",
        description="Support-Vector Attention: certified selection and exact unlearning.",
    )
    parser.add_argument("--version", action="version", version=f"svattn {svattn.__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    names = [c.name for c in COMMANDS]
    if len(set(names)) != len(names):
        raise RuntimeError(f"svattn.cli.COMMANDS has duplicate names: {names}")
    for command in COMMANDS:
        p = sub.add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(p)
        p.set_defaults(_run=command.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``svattn`` command line.

    Parameters
    ----------
    argv : sequence of str, optional
        Arguments without the program name; default ``sys.argv[1:]``.

    Returns
    -------
    int
        The exit code: 0 on success, 1 when a command's check failed, 2 on
        usage errors (bad arguments, missing files).

    Examples
    --------
    >>> from svattn.cli import main
    >>> main(["demo", "--stays", "2", "--show", "0"])  # doctest: +SKIP
    0
    """
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    try:
        return int(args._run(args))
    except (ValueError, FileNotFoundError) as exc:
        print(f"svattn {args.command}: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
