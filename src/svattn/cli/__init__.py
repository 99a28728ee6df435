"""The ``svattn`` command line: one subcommand per task, listed in :data:`COMMANDS`;
:func:`main` runs one (``python -m svattn.cli`` and the ``svattn`` script call it).

Adding a subcommand is one entry: write ``add_arguments(parser)`` (cheap, no
heavy imports) and ``run(args) -> int`` (import what it needs inside), then
append ``Command(name, help, add_arguments, run)`` to :data:`COMMANDS`.

The commands live by family, one module each:

* :mod:`svattn.cli.experiments`: ``demo``, ``reproduce``;
* :mod:`svattn.cli.audit`: ``audit`` (an audit log: verify, read, prove, migrate, prune);
* :mod:`svattn.cli.trust`: ``verify-deletion``, ``verify-erasure``,
  ``verify-forget-receipt``, ``recover``, ``keygen``;
* :mod:`svattn.cli.stream`: the language model's stream, ``generate``, ``forget``,
  ``verify-forget``;
* :mod:`svattn.cli.training`: ``train``, ``eval``, ``convert-checkpoint``, ``collect``;
* :mod:`svattn.cli.recall`: ``recall`` (the trained recall grids);

over what they share: :mod:`svattn.cli.verdict` (how a verifier reports) and
:mod:`svattn.cli.inputs` (argparse types, files that must exist).

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
from svattn.cli import audit, experiments, recall, stream, training, trust
from svattn.cli.recall import RECALL_GRIDS

__all__ = ["COMMANDS", "RECALL_GRIDS", "Command", "build_parser", "main"]


def __getattr__(name: str):
    # svattn.cli.apply_overrides, from where it lives (svattn.lm.train_config, beside
    # the TrainConfig it edits), imported on use: the command line starts without torch
    if name == "apply_overrides":
        from svattn.lm.train_config import apply_overrides

        return apply_overrides
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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


# ------------------------------------------------------------------- registry

# Commands that run the exact core, whose numba kernels compile on their first call.
_EXACT_COMMANDS = frozenset({"demo", "audit", "verify-deletion", "verify-erasure", "recover",
                             "reproduce", "generate", "forget", "verify-forget",
                             "verify-forget-receipt"})
_COMPILED = Path(svattn.__file__).parent / "exact" / "backends" / "compiled"


def _numba_cache_is_cold(package: Path | None = None) -> bool:
    """True when no cached compilation of the exact core's kernels is found for this
    Python (numba writes ``__pycache__/*.pyXY.nbi`` beside the sources, or under
    ``NUMBA_CACHE_DIR``): the first call will then compile them."""
    import os

    if os.environ.get("NUMBA_DISABLE_JIT") == "1":
        return False
    package = _COMPILED if package is None else package
    tag = f"py{sys.version_info.major}{sys.version_info.minor}.nbi"
    where = [package / "__pycache__"]
    if os.environ.get("NUMBA_CACHE_DIR"):
        where.append(Path(os.environ["NUMBA_CACHE_DIR"]))
    return not any(next(d.rglob(f"*{tag}"), None) for d in where if d.is_dir())


COMMANDS: list[Command] = [
    Command(
        "demo",
        "stream ICU vital signs into an exact SV memory, delete one patient, verify",
        experiments.demo_arguments,
        experiments.demo_run,
    ),
    Command(
        "audit",
        "an audit log: verify it (chain, certificates, signed checkpoints, a saved state), "
        "read an entry, prove one (.tlog-proof), check a proof or a consistency proof",
        audit.add_arguments,
        audit.run,
    ),
    Command(
        "verify-deletion",
        "re-solve a saved state from scratch and check a deletion certificate against it",
        trust.verify_deletion_arguments,
        trust.verify_deletion_run,
    ),
    Command(
        "verify-erasure",
        "check a data subject's erasure receipt against a saved state (every certificate; "
        "with --log, against the log's erase record)",
        trust.verify_erasure_arguments,
        trust.verify_erasure_run,
    ),
    Command(
        "recover",
        "after a crash: the last saved state with every later logged removal replayed, "
        "on a new audit log",
        trust.recover_arguments,
        trust.recover_run,
    ),
    Command(
        "keygen",
        "write an Ed25519 key pair that signs deletion receipts and the audit log's "
        "checkpoints (PREFIX.key, PREFIX.pub, PREFIX.vkey)",
        trust.keygen_arguments,
        trust.keygen_run,
    ),
    Command(
        "reproduce",
        "run the paper's experiments and write reports beside the paper's figures",
        experiments.reproduce_arguments,
        experiments.reproduce_run,
    ),
    Command(
        "train",
        "train a byte-level language model (CharLM) on enwik8; torchrun for several processes",
        training.train_arguments,
        training.train_run,
    ),
    Command(
        "eval",
        "bits per character of a trained checkpoint on enwik8 splits (a recall run's "
        "model: query accuracy on its task)",
        training.eval_arguments,
        training.eval_run,
    ),
    Command(
        "generate",
        "stream a prompt through a trained CharLM on exact memories and sample bytes; "
        "--forget shows the effect of forgetting part of the prompt",
        stream.generate_arguments,
        stream.generate_run,
    ),
    Command(
        "forget",
        "forget text (or a span of the held text) from a saved LMStream folder: saves it "
        "back, files a receipt, echoes the removed bytes",
        stream.forget_arguments,
        stream.forget_run,
    ),
    Command(
        "verify-forget",
        "check a saved LMStream against its erasure receipt by re-streaming its text "
        "from scratch",
        stream.verify_forget_arguments,
        stream.verify_forget_run,
    ),
    Command(
        "verify-forget-receipt",
        "check an svattn.SVDD forget receipt against the model saved after it (every "
        "removal through the exact core's verifiers; with --log and --public-key, every "
        "field)",
        trust.verify_forget_receipt_arguments,
        trust.verify_forget_receipt_run,
    ),
    Command(
        "convert-checkpoint",
        "convert a checkpoint of an earlier svattn (it unpickles OLD: trusted files only) "
        "into one that reads without unpickling",
        training.convert_arguments,
        training.convert_run,
    ),
    Command(
        "collect",
        "append finished svattn train runs (BPC, command, config, from their logs) to a "
        "results file",
        training.collect_arguments,
        training.collect_run,
    ),
    Command(
        "recall",
        "trained recall grids (MQAR, selective copy): run cells in resumable pieces, "
        "collect results/recall.json, time the mixers",
        recall.recall_arguments,
        recall.recall_run,
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
        usage errors (bad arguments, missing files, malformed receipts), 3 when a
        verifying command found nothing wrong but could not check every field of a
        receipt (it names them, and what would check them: ``--log``, ``--public-key``).

    Examples
    --------
    >>> from svattn.cli import main
    >>> main(["demo", "--stays", "2", "--show", "0"])  # doctest: +SKIP
    0
    """
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    args._argv = argv  # the exact command, for the records a command writes
    if args.command in _EXACT_COMMANDS and _numba_cache_is_cold():
        # otherwise the first run sits silent while numba compiles
        print("svattn: compiling the exact core's numba kernels (the first run after an "
              "install or upgrade: a minute or two; cached on disk afterwards) ...",
              file=sys.stderr, flush=True)
    try:
        return int(args._run(args))
    except (ValueError, FileNotFoundError, IsADirectoryError, NotADirectoryError,
            FileExistsError, PermissionError) as exc:
        message = " ".join(str(exc).split())  # one line, whatever the message holds
        print(f"svattn {args.command}: error: {message}", file=sys.stderr)
        return 2

