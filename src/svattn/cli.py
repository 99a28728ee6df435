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
from svattn.audit_cli import check_audit_log, check_file, worst_status

__all__ = ["COMMANDS", "Command", "build_parser", "main"]


def __getattr__(name: str):
    # svattn.cli.apply_overrides, from where it lives (svattn.lm.train, beside the
    # TrainConfig it edits), imported on use: the command line starts without torch
    if name == "apply_overrides":
        from svattn.lm.train import apply_overrides

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
    if value == float("inf"):  # --tol inf would compare no float
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
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


def _demo_run(args: argparse.Namespace) -> int:
    from svattn.demo import run_demo

    if args.signing_key is not None:
        check_file(args.signing_key, "--signing-key")
    result = run_demo(
        stays=args.stays, C=args.C, gamma=args.gamma, seed=args.seed, delete=args.delete,
        data=args.data, show=args.show, verify_each=args.verify_each, save_to=args.out,
        signing_key=args.signing_key,
    )
    return 0 if result.ok else 1


# ---------------------------------------------------------------- audit verify


_EXIT_CODES = """exit status:
  0  VERIFIED: every field and claim was checked, and nothing failed
  1  FAILED: a check failed (the output names it)
  2  malformed input: a missing or unreadable file, a malformed receipt or state
     (one line on stderr)
  3  UNCHECKED: nothing failed, but something could not be checked (the output names
     it, and what would check it: --log, --public-key, STATE)"""


def _exit_codes(parser: argparse.ArgumentParser, note: str = "") -> None:
    """List a verifying command's exit statuses in its ``--help``."""
    parser.epilog = _EXIT_CODES + (f"\n\n{note}" if note else "")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


def _audit_arguments(parser: argparse.ArgumentParser) -> None:
    _exit_codes(parser, "Without STATE the log's end cannot be checked (exit 3): only a "
                "state saved after its last records anchors the end.")
    from svattn.audit_cli import add_arguments  # the audit actions: svattn/audit_cli.py

    add_arguments(parser)


def _audit_run(args: argparse.Namespace) -> int:
    from svattn.audit_cli import run

    return run(args)


# ------------------------------------------------------------- verify-deletion


def _state_receipt_arguments(parser: argparse.ArgumentParser, receipt: str, what: str,
                             log: str, signed: str) -> None:
    """The arguments verify-deletion and verify-erasure share: STATE, the receipt, --tol,
    --seed, --log and --public-key (``log``, ``signed``: what each then requires)."""
    parser.add_argument("state", type=Path, metavar="STATE", help="the saved memory state")
    parser.add_argument(receipt.lower(), type=Path, metavar=receipt, help=what)
    parser.add_argument("--tol", type=_positive_float, default=1e-8,
                        help="tolerance on alpha, decision function and readout (default: 1e-8)")
    parser.add_argument("--seed", type=int, default=0, help="draws the probe points (default: 0)")
    parser.add_argument("--log", type=Path, metavar="LOG", default=None,
                        help=f"the memory's audit log: {log}")
    parser.add_argument("--public-key", type=Path, metavar="KEY", default=None,
                        help="the controller's Ed25519 public key (svattn keygen): the "
                             f"{signed}")
    parser.add_argument("--oracle", action="store_true",
                        help="also re-solve the remaining tokens with the dense independent "
                             "QP oracle and compare (a cross-check: it holds the n×n "
                             "problem, ~100·n² bytes; refused above "
                             "5,000 tokens without --oracle-force)")
    parser.add_argument("--oracle-force", action="store_true",
                        help="run --oracle above 5,000 tokens anyway")
    _exit_codes(parser, "The default check proves the state is the optimum of the "
                "remaining tokens from their keys (the KKT conditions and the uniqueness "
                "test, recomputed without the memory's caches: O(n·|S|·d) time, bounded "
                "memory); see docs/trust.md for its cost.")


def _verify_deletion_arguments(parser: argparse.ArgumentParser) -> None:
    _state_receipt_arguments(
        parser, "CERTIFICATE", "a deletion certificate (JSON, DeletionCertificate.to_json)",
        "it must verify and record exactly this certificate and the add of its token "
        "(catches an edited commitment)", "certificate must carry its valid signature")
    parser.add_argument("--commit-key", type=Path, metavar="FILE", default=None,
                        help="the commitment key (hex), or the controller's private key: "
                             "every live token is re-committed to find copies of the "
                             "erased record")


def _verify_deletion_run(args: argparse.Namespace) -> int:
    from svattn.exact.auditor.persist import load
    from svattn.exact.auditor.progress import StderrProgress
    from svattn.exact.auditor.verify import verify_deletion
    from svattn.exact.records.certificate import DeletionCertificate
    from svattn.exact.records.signing import read_commit_key

    for p, what in ((args.state, "STATE"), (args.certificate, "CERTIFICATE"),
                    (args.log, "--log"), (args.public_key, "--public-key"),
                    (args.commit_key, "--commit-key")):
        if p is not None:
            check_file(p, what)
    if args.log is not None:
        check_audit_log(args.log)
    _check_state_parameters(args.state)
    memory = load(args.state)
    try:
        text = args.certificate.read_text()
    except UnicodeDecodeError:
        raise ValueError(f"certificate {args.certificate} is not a text (JSON) file") from None
    cert = DeletionCertificate.from_json(text)
    commit_key = None if args.commit_key is None else read_commit_key(args.commit_key)
    v = verify_deletion(memory, cert, retrain=True, tol=args.tol, seed=args.seed, log=args.log,
                        public_key=args.public_key, commit_key=commit_key, oracle=args.oracle,
                        oracle_force=args.oracle_force, progress=StderrProgress())
    print(f"state: {args.state} ({len(memory)} tokens, C={memory.C}, kernel={memory.kernel})")
    print(f"certificate: removal of token {cert.removed_id}, issued {cert.issued_at}")
    print(f"digest matches:      {v.digest_matches}")
    print(f"token absent:        {v.removed_absent}")
    print(f"parameters match:    {v.parameters_match}")
    print(f"KKT residual:        {v.kkt_residual:.3e}"
          + (" (recomputed from the keys)" if v.optimality is not None else ""))
    print(f"unique optimum:      {v.unique_optimum}")
    if v.optimality is not None:
        print(f"optimality:          {'proven' if v.optimality.ok else 'NOT proven'}: "
              f"{v.optimality.summary()}")
    print(f"live copies:         {list(v.copies) if v.copies else 'none'}")
    if v.logged is not None:
        print(f"in the audit log:    {v.logged}")
    if v.issued_at_record is not None:
        print(f"checked later:       issued at audit record {v.issued_at_record}; the state "
              "is the log's end")
    if v.signed is not None:
        print(f"signature valid:     {v.signed}")
    if v.retrained:
        print(f"partition equal:     {v.partition_equal}")
        print(f"max |alpha - retrain|: {v.max_alpha_dev:.3e}")
        print(f"decision deviation:  {v.decision_dev:.3e}")
        print(f"readout deviation:   {v.readout_dev:.3e} ({v.n_probes} probes)")
    print(f"tolerance:           {v.tolerance:.1e}")
    return _report_with_log(v, args)


def _report_with_log(v, args: argparse.Namespace) -> int:
    """Print a receipt's verdict with the audit log's checkpoints (``--log``) beside it and
    return the worse of the two exit statuses: never a bare VERIFIED over a log whose
    authenticity failed or went unchecked."""
    auth = _log_authenticity(args)
    _print_verdict(v.verdict, auth)
    status = v.exit_status if auth is None else worst_status(v.exit_status, auth.exit_status)
    fields = v  # the receipt's fields alone: the audit log's lines say what of it held
    if auth is not None and v.verdict is not None and v.verdict.authenticity_unchecked:
        import dataclasses

        fields = dataclasses.replace(v, verdict=dataclasses.replace(
            v.verdict, authenticity_unchecked=()))
    summary = fields.summary()
    if status != fields.exit_status and summary.startswith("VERIFIED"):
        summary = ("FAILED" if status == 1 else "UNCHECKED") + " (the audit log's " \
            "authenticity); the receipt" + summary[len("VERIFIED"):]
    print(summary)
    return status


def _check_state_parameters(path: Path) -> None:
    """A usage error when the state file names a C no memory holds, read from its
    metadata before loading (a crafted C = 1e-300 would otherwise stall the load); any
    other defect of the file is left to the load, which names it. A large file's load
    (it re-checks everything) is announced on stderr."""
    import json
    import struct

    from svattn.exact.auditor.optimality import parameter_errors
    from svattn.exact.records.fileformat import StateFileError, read_metadata

    with open(path, "rb") as fh:
        head = fh.read(8)
        size = len(head) == 8 and struct.unpack("<Q", head)[0]
        blob = fh.read(size) if 0 < size <= 1 << 26 else b""
    try:
        meta = read_metadata(json.loads(blob), str(path))
    except (StateFileError, ValueError, TypeError, AttributeError, RecursionError):
        return  # the load names what is wrong with it
    bad = parameter_errors(meta.get("C"), 0, True)  # the range; n·C is checked once loaded
    if bad:
        raise ValueError(f"STATE: malformed state {path}: {bad[0]}")
    mb = path.stat().st_size / 2**20
    if mb >= 64:
        print(f"loading {path} ({mb:,.0f} MiB: every part re-checked, its kernel cache "
              "against the keys) ...", file=sys.stderr, flush=True)


def _print_verdict(verdict, auth=None) -> None:
    """The fields a verifier checked, the ones that failed and the ones nothing that ran
    checks, each with what would (exit status: 0 all checked, 3 some unchecked, 1 failed);
    with ``auth`` (the audit log's checkpoints, :func:`_log_authenticity`), its lines, and
    a verdict no better than theirs."""
    if auth is not None and verdict.authenticity_unchecked:  # the auth lines say it all
        import dataclasses

        verdict = dataclasses.replace(verdict, authenticity_unchecked=())
    print(f"fields checked:      {len(verdict.checked)} ({', '.join(verdict.checked)})")
    if verdict.failed:
        print(f"fields FAILED:       {', '.join(verdict.failed)}")
    if verdict.unchecked:
        print(f"fields UNCHECKED:    {verdict.unchecked_line()}")
    for line in () if auth is None else auth.lines():
        print(f"audit log {line}")
    headline = verdict.headline()
    if auth is not None and worst_status(verdict.exit_status, auth.exit_status) != \
            verdict.exit_status:
        word = "FAILED" if auth.exit_status == 1 else "UNCHECKED"
        headline = (f"{word}: the audit log's authenticity (see the 'audit log' lines); the "
                    + ("receipt's fields all checked and held" if verdict.exit_status == 0
                       else f"receipt's fields: {headline}"))
    print(f"verdict:             {headline}")


def _log_authenticity(args: argparse.Namespace):
    """With ``--log``: the log's checkpoints and the state's against the log and the
    controller's ``--public-key`` (:func:`svattn.exact.auditor.logcheck.check_authenticity`)."""
    if args.log is None:
        return None
    from svattn.audit_cli import log_authenticity

    return log_authenticity(args.log, args.state, args.public_key)


# -------------------------------------------------------------- verify-erasure


def _verify_erasure_arguments(parser: argparse.ArgumentParser) -> None:
    _state_receipt_arguments(
        parser, "RECEIPT", "an erasure receipt (JSON, ErasureReceipt.to_json)",
        "the receipt must be its erase record, and every certificate its removal records",
        "receipt and its certificates must carry its valid signatures")


def _verify_erasure_run(args: argparse.Namespace) -> int:
    from svattn.exact.auditor.persist import load
    from svattn.exact.auditor.progress import StderrProgress
    from svattn.exact.auditor.verify import verify_erasure
    from svattn.exact.records.certificate import ErasureReceipt

    for p, what in ((args.state, "STATE"), (args.receipt, "RECEIPT"), (args.log, "--log"),
                    (args.public_key, "--public-key")):
        if p is not None:
            check_file(p, what)
    if args.log is not None:
        check_audit_log(args.log)
    _check_state_parameters(args.state)
    memory = load(args.state)
    try:
        text = args.receipt.read_text()
    except UnicodeDecodeError:
        raise ValueError(f"RECEIPT: {args.receipt} is not a text (JSON) file") from None
    receipt = ErasureReceipt.from_json(text)
    v = verify_erasure(memory, receipt, retrain=True, tol=args.tol, seed=args.seed,
                       log=args.log, public_key=args.public_key, oracle=args.oracle,
                       oracle_force=args.oracle_force, progress=StderrProgress())
    print(f"state: {args.state} ({len(memory)} tokens, C={memory.C}, kernel={memory.kernel})")
    print(f"receipt: erasure of {len(receipt.erased_ids)} tokens of subject "
          f"{receipt.tag_hash[:16]}…, issued {receipt.issued_at}")
    proof = None if v.last_removal is None else v.last_removal.optimality
    if proof is not None:
        print(f"optimality: {'proven' if proof.ok else 'NOT proven'}: {proof.summary()}")
    return _report_with_log(v, args)


def _recover_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("state", type=Path, metavar="STATE", help="the last state saved")
    parser.add_argument("log", type=Path, metavar="LOG", help="its audit log")
    parser.add_argument("--new-log", type=Path, required=True, metavar="NEW_LOG",
                        help="the new chain (a new file), citing STATE and LOG")
    parser.add_argument("--out", type=Path, required=True, metavar="NEW_STATE",
                        help="where the recovered memory is saved")
    parser.add_argument("--signing-key", type=Path, default=None, metavar="KEY",
                        help="sign the replayed removals' certificates")
    parser.add_argument("--remove-old-state", action="store_true",
                        help="once NEW_STATE is saved, overwrite STATE with zeros and delete "
                             "it (it still holds the tokens whose removals were replayed)")


def _recover_run(args: argparse.Namespace) -> int:
    from svattn.exact.auditor.recovery import recover
    from svattn.exact.records.audit import AuditLogError

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
    removed = args.remove_old_state and _remove_old_state(args.state)
    print(report.summary(old_state_removed=removed))
    print(f"recovered state: {args.out} ({len(memory)} tokens); new audit log: {args.new_log}")
    if report.lost_adds:
        print(f"lost (added after the save, never in a file): ids {list(report.lost_adds)}")
    return 0


def _remove_old_state(state: Path) -> bool:
    """Overwrite ``state`` with zeros and delete it (a hard link or a symlink is only
    unlinked here: the bytes stay under the other name, which is said)."""
    from svattn.exact.records.fileformat import remove_file

    if remove_file(state):
        return True
    print(f"{state} was a link (hard or symbolic): only that name was deleted, the bytes "
          "stay under the other; delete that too")
    return False


def _keygen_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prefix", type=Path, metavar="PREFIX",
                        help="writes PREFIX.key (private, mode 0600), PREFIX.pub and "
                             "PREFIX.vkey")


def _keygen_run(args: argparse.Namespace) -> int:
    from svattn.exact.records.signing import fingerprint, load_public_key, write_keypair

    if args.prefix.is_dir():
        raise ValueError(f"{args.prefix} is a directory; give a file prefix such as "
                         f"{args.prefix / 'controller'}")
    try:
        key_path, pub_path = write_keypair(args.prefix)
    except FileExistsError as exc:
        raise ValueError(str(exc)) from None
    print(f"private key: {key_path} (keep it secret: SVDDMemory(..., signing_key=...))")
    print(f"public key:  {pub_path} (give it to auditors: verify-deletion --public-key)")
    print(f"verifier key: {args.prefix}.vkey (the audit log's checkpoints: svattn audit "
          "verify --vkey, Go's golang.org/x/mod/sumdb/note)")
    print(f"fingerprint: {fingerprint(load_public_key(pub_path))}")
    return 0


# ------------------------------------------------------------------ reproduce


def _reproduce_arguments(parser: argparse.ArgumentParser) -> None:
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


def _reproduce_run(args: argparse.Namespace) -> int:
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


# ------------------------------------------------------- generate / forget / verify-forget


def _nonnegative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0, got {text}")
    return value


def _span(text: str) -> tuple[int, int]:
    try:
        start, stop = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be START:STOP (two integers), got {text!r}"
                                         ) from None
    if not 0 <= start < stop:
        raise argparse.ArgumentTypeError(f"must satisfy 0 <= START < STOP, got {text!r}")
    return start, stop


def _occurrence(text: str) -> int | str:
    if text == "all":
        return text
    try:
        return _nonnegative_int(text)
    except (ValueError, argparse.ArgumentTypeError):
        raise argparse.ArgumentTypeError(f"must be 'all' or an integer >= 0 (0: the first), "
                                         f"got {text!r}") from None


def _as_bytes(text: str) -> bytes:
    """A command-line string as the bytes it was typed as (UTF-8; undecodable bytes of
    the argument kept as they were)."""
    import os

    return os.fsencode(text)


def _shown(data: bytes) -> str:
    return repr(data.decode("utf-8", "backslashreplace"))


def _cuts_a_character(text: bytes, spans: list[tuple[int, int]]) -> str | None:
    """Where a span given in bytes splits a UTF-8 character of ``text`` (valid UTF-8),
    described; None when none does (or the text is not UTF-8)."""
    try:
        text.decode("utf-8")
    except UnicodeDecodeError:
        return None
    for start, stop in spans:
        for pos in (start, stop):
            if 0 < pos < len(text) and text[pos] & 0xC0 == 0x80:
                return (f"{start}:{stop} cuts the UTF-8 character at byte {pos} (positions "
                        "count bytes, and a non-ASCII letter takes two or more)")
    return None


def _receipt_paths(out: Path, k: int) -> list[Path]:
    """Where ``k`` receipts go: ``out`` itself for one, else ``out``'s name numbered
    (``r.json`` → ``r.1.json``, ``r.2.json``, ...)."""
    if k == 1:
        return [out]
    return [out.with_name(f"{out.stem}.{i}{out.suffix}") for i in range(1, k + 1)]


def _check_new_file(path: Path, what: str, force: bool) -> None:
    """A usage error unless ``path`` can be written as a new file (or ``force``)."""
    if path.is_dir():
        raise IsADirectoryError(f"{what}: {path} is a directory, not a file")
    if not path.parent.is_dir():
        raise FileNotFoundError(f"{what}: no such folder: {path.parent}")
    if path.exists() and not force:
        raise FileExistsError(f"{what}: {path} exists: a receipt is evidence and is never "
                              "replaced untold (--force replaces it)")


def _check_new_stream(path: Path, force: bool) -> None:
    if (path / "stream.json").exists() and not force:
        raise FileExistsError(f"--save: {path} holds a saved stream; it would be replaced "
                              "(--force replaces it)")


def _file_receipts(receipts, out: Path, force: bool, commit: Callable[[], None]) -> list[Path]:
    """Write ``receipts`` (each durable, under a temporary name beside its path), run
    ``commit`` (the save of the state they describe), then give each its name: a receipt
    is never filed for a state that was not saved, and ``commit`` never runs unless every
    receipt is on disk. Refuses (nothing written, nothing committed) to replace a file
    unless ``force``."""
    import os
    import tempfile

    paths = _receipt_paths(out, len(receipts))
    for p in paths:
        _check_new_file(p, "--receipt", force)
    temps: list[str] = []
    try:
        for receipt, p in zip(receipts, paths, strict=True):
            fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.", suffix=".tmp")
            temps.append(tmp)
            with os.fdopen(fd, "wb") as fh:
                fh.write((receipt.to_json() + "\n").encode())
                fh.flush()
                os.fsync(fh.fileno())
        commit()
        for tmp, p in zip(temps, paths, strict=True):
            os.replace(tmp, p)
    finally:
        for tmp in temps:
            if os.path.lexists(tmp):
                os.unlink(tmp)
    return paths


def _print_forgotten(result, paths: list[Path], digest: str) -> None:
    """Echo what a forget removed (held and fed spans, the bytes), where each receipt
    went, the remaining text's SHA-256 and the stream's digest."""
    for part, path in zip(result.spans, paths, strict=True):
        (a, b), (c, d) = part.held_span, part.fed_span
        signed = "signed" if part.receipt.signer else "unsigned"
        print(f"forgot held bytes [{a}, {b}) (fed [{c}, {d})): {_shown(part.removed)}; "
              f"receipt {path} ({signed})")
    print(f"remaining text SHA-256: {result.text_sha256}; stream digest {digest}")


def _generate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, metavar="CHECKPOINT",
                        help="a ckpt.pt of svattn train, or a recall run's ckpt.pt / model.pt")
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", default=None, metavar="TEXT", help="the prompt (UTF-8)")
    prompt.add_argument("--prompt-file", type=Path, default=None, metavar="PATH",
                        help="read the prompt's bytes from a file")
    parser.add_argument("-n", type=_nonnegative_int, default=200, metavar="N",
                        help="bytes to generate (default: 200)")
    parser.add_argument("--temperature", type=float, default=1.0, metavar="T",
                        help="sampling temperature, 0 for greedy (default: 1.0)")
    parser.add_argument("--top-k", type=_positive_int, default=None, metavar="K",
                        help="sample among the K most likely bytes")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default: 0)")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--forget", type=_span, default=None, metavar="START:STOP",
                       help="then forget prompt bytes [START, STOP) (byte offsets: a "
                            "non-ASCII letter takes two or more) and generate again with "
                            "the same seed, to show the effect")
    which.add_argument("--forget-text", default=None, metavar="TEXT",
                       help="the same for the exact text TEXT (UTF-8) found in the prompt")
    parser.add_argument("--occurrence", type=_occurrence, default=None, metavar="N|all",
                        help="with --forget-text found several times: the N-th (from 0) "
                             "or all (default: it must occur once)")
    parser.add_argument("--full-policy", action="store_true",
                        help="stream a policy='support' hybrid under policy='full' (same "
                             "weights; LMStream needs it)")
    parser.add_argument("--receipt", type=Path, default=None, metavar="PATH",
                        help="with --forget: write the erasure receipt (JSON) here (several "
                             "receipts: PATH's name numbered)")
    parser.add_argument("--save", type=Path, default=None, metavar="DIR",
                        help="with --forget: save the stream right after the forget (for "
                             "svattn verify-forget)")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing receipt file and saved stream (refused "
                             "without it)")
    parser.add_argument("--signing-key", type=Path, default=None, metavar="KEY",
                        help="the controller's Ed25519 private key (svattn keygen): the "
                             "erasure receipt is signed with it (verify-forget --public-key)")


def _generate_run(args: argparse.Namespace) -> int:
    check_file(args.checkpoint, "CHECKPOINT")
    if args.prompt_file is not None:
        check_file(args.prompt_file, "--prompt-file")
        prompt = args.prompt_file.read_bytes()
    else:
        prompt = _as_bytes(args.prompt)
    if not prompt:
        raise ValueError("the prompt is empty: generation needs at least one byte")
    if not (args.temperature >= 0 and args.temperature != float("inf")):
        raise ValueError(f"--temperature must be a finite number >= 0, got {args.temperature}")
    forgets = args.forget is not None or args.forget_text is not None
    if args.forget is not None:
        if args.forget[1] > len(prompt):
            raise ValueError(f"--forget {args.forget[0]}:{args.forget[1]} reaches past the "
                             f"prompt's {len(prompt)} bytes")
        cut = _cuts_a_character(prompt, [args.forget])
        if cut is not None:
            raise ValueError(f"--forget {cut}: name the text with --forget-text")
    if args.occurrence is not None and args.forget_text is None:
        raise ValueError("--occurrence picks among the occurrences of --forget-text")
    if not forgets and (args.receipt is not None or args.save is not None):
        raise ValueError("--receipt and --save record a forget: give --forget START:STOP or "
                         "--forget-text TEXT")
    if forgets and args.receipt is not None:
        _check_new_file(args.receipt, "--receipt", args.force)
    if forgets and args.save is not None:
        _check_new_stream(args.save, args.force)
    if args.signing_key is not None:
        check_file(args.signing_key, "--signing-key")
    import copy

    from svattn.lm.train import load_checkpoint_model

    model, _, _ = load_checkpoint_model(args.checkpoint)
    try:
        stream = model.stream(full_policy=args.full_policy, signing_key=args.signing_key)
    except ValueError as exc:
        raise ValueError(f"{exc} (on the command line: --full-policy)") from None

    def progress(done: int, total: int) -> None:
        if total > 1024 and (done % 1024 == 0 or done == total):
            print(f"svattn generate: read {done}/{total} prompt bytes", file=sys.stderr,
                  flush=True)

    try:  # a byte outside the vocabulary is refused before the stream changes
        stream.feed(prompt, progress=progress)
    except ValueError as exc:
        flag = "--prompt-file" if args.prompt_file is not None else "--prompt"
        raise ValueError(f"{flag}: {str(exc).removeprefix('tokens: ')}") from None
    sample = {"temperature": args.temperature, "top_k": args.top_k, "seed": args.seed}
    if not forgets:
        out = stream.generate(args.n, **sample)
        sys.stdout.write(out.decode("utf-8", "backslashreplace") + "\n")
        return 0
    # the sample before the forget comes from a copy: the stream that forgets holds the
    # prompt only, so it forgets nothing but what was asked
    out = copy.deepcopy(stream).generate(args.n, **sample)
    print(f"before forgetting: {out.decode('utf-8', 'backslashreplace')}")
    if args.forget is not None:
        result = stream.forget(*args.forget)
    else:
        try:
            result = stream.forget_text(_as_bytes(args.forget_text), occurrence=args.occurrence)
        except ValueError as exc:
            raise ValueError(f"--forget-text: {exc}") from None

    def commit() -> None:
        if args.save is not None:
            stream.save(args.save)

    if args.receipt is not None:
        paths = _file_receipts(result.receipts, args.receipt, args.force, commit)
    else:
        commit()
        paths = [Path("(not written: --receipt)")] * len(result.spans)
    _print_forgotten(result, paths, stream.digest())
    again = stream.generate(args.n, **sample)
    spans = ", ".join(f"[{a}, {b})" for a, b in (s.held_span for s in result.spans))
    print(f"after forgetting {spans}: {again.decode('utf-8', 'backslashreplace')}")
    for receipt in result.receipts:
        n_certs = sum(len(m["span_certificates"]) for m in receipt.memories)
        print(f"receipt: {receipt.n_forgotten} bytes forgotten, {n_certs} memory certificates, "
              f"{receipt.repair['replayed']} bytes replayed, state digest "
              f"{receipt.state_digest[:16]}…")
    return 0


_VERIFY_EXITS = """exit status: 0 every field of the receipt checked and verified, and the
stream's forget-log checkpoint signed by --public-key; 3 nothing failed but some field or
the forget log's authenticity could not be checked (named, with what would check it: an
unsigned stream's always, a signed one's without --public-key); 1 a check
failed (the stream differs from a fresh stream, a receipt field or signature does not
hold, or the saved stream's files were edited: a checksum or digest differs); 2 malformed
input (a missing file, a receipt that is not one, a folder that is no saved stream, the
wrong checkpoint)."""


def _forget_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, metavar="CHECKPOINT",
                        help="the ckpt.pt the stream was read with")
    parser.add_argument("stream", type=Path, metavar="STREAM",
                        help="a folder of LMStream.save (svattn generate --save): saved back "
                             "after the forget")
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--text", default=None, metavar="TEXT",
                      help="forget this exact text (UTF-8) found in the stream's held text")
    what.add_argument("--span", type=_span, default=None, metavar="A:B",
                      help="forget bytes [A, B) of the held text (byte offsets in the text "
                           "the stream holds now, every earlier forget removed)")
    parser.add_argument("--occurrence", type=_occurrence, default=None, metavar="N|all",
                        help="with --text found several times: the N-th (from 0) or all "
                             "(default: it must occur once; several are refused as ambiguous)")
    parser.add_argument("--receipt", type=Path, required=True, metavar="OUT",
                        help="write the erasure receipt (JSON) here (several runs of fed "
                             "bytes: OUT's name numbered, OUT.1, OUT.2, ...)")
    parser.add_argument("--force", action="store_true",
                        help="replace an existing receipt file (refused without it)")
    parser.add_argument("--signing-key", type=Path, default=None, metavar="KEY",
                        help="the controller's Ed25519 private key: required when the "
                             "stream signs its receipts (it was saved with one)")
    parser.epilog = ("Echoes the removed bytes and the remaining text's SHA-256. Check with "
                     "svattn verify-forget CHECKPOINT STREAM OUT. Exit status: 0 forgotten, "
                     "saved and filed; 2 bad input (nothing changed).")


def _forget_run(args: argparse.Namespace) -> int:
    check_file(args.checkpoint, "CHECKPOINT")
    if not (args.stream / "stream.json").is_file():
        raise FileNotFoundError(f"STREAM: no saved stream at {args.stream} (no stream.json)")
    if args.signing_key is not None:
        check_file(args.signing_key, "--signing-key")
    if args.occurrence is not None and args.text is None:
        raise ValueError("--occurrence picks among the occurrences of --text")
    _check_new_file(args.receipt, "--receipt", args.force)
    from svattn.lm.stream import LMStream
    from svattn.lm.stream_folder import MANIFEST, read_manifest
    from svattn.lm.train import load_checkpoint_model

    signer = read_manifest(args.stream).get("signer")
    if signer is not None and args.signing_key is None:
        raise ValueError(f"STREAM: this stream signs its receipts (key {signer[:16]}…): give "
                         "its --signing-key")
    if signer is None and args.signing_key is not None:
        raise ValueError("--signing-key: this stream was saved without a signing key; its "
                         "receipts are unsigned (leave --signing-key out)")
    model, _, _ = load_checkpoint_model(args.checkpoint)
    stream = LMStream.load(args.stream, model, signing_key=args.signing_key)
    loaded = (args.stream / MANIFEST).read_bytes()
    if args.span is not None:
        if args.span[1] > len(stream):
            raise ValueError(f"--span {args.span[0]}:{args.span[1]} reaches past the "
                             f"{len(stream)} bytes the stream holds")
        cut = _cuts_a_character(stream.text, [args.span])
        if cut is not None:
            raise ValueError(f"--span {cut}: name the text with --text")
        result = stream.forget(*args.span)
    else:
        try:
            result = stream.forget_text(_as_bytes(args.text), occurrence=args.occurrence)
        except ValueError as exc:
            raise ValueError(f"--text: {exc}") from None

    def commit() -> None:
        if (args.stream / MANIFEST).read_bytes() != loaded:  # one writer at a time
            raise ValueError(f"STREAM: {args.stream} was saved by another process while "
                             "this one forgot: nothing saved; run the forget again")
        stream.save(args.stream)

    paths = _file_receipts(result.receipts, args.receipt, args.force, commit)
    _print_forgotten(result, paths, stream.digest())
    print(f"saved: {args.stream}; check with svattn verify-forget {args.checkpoint} "
          f"{args.stream} {paths[0] if len(paths) == 1 else '<each receipt>'}")
    return 0


def _verify_forget_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, metavar="CHECKPOINT",
                        help="the ckpt.pt the stream was read with")
    parser.add_argument("stream", type=Path, metavar="STREAM", help="a folder of LMStream.save")
    parser.add_argument("receipt", type=Path, metavar="RECEIPT",
                        help="the erasure receipt (JSON, ModelErasureReceipt.to_json)")
    parser.add_argument("--tol", type=_positive_float, default=1e-9,
                        help="tolerance on logits and memory readouts (default: 1e-9)")
    parser.add_argument("--public-key", type=Path, metavar="KEY", default=None,
                        help="the controller's Ed25519 public key (svattn keygen): the "
                             "receipt must carry its valid signature")
    parser.epilog = _VERIFY_EXITS


def _verify_forget_run(args: argparse.Namespace) -> int:
    check_file(args.checkpoint, "CHECKPOINT")  # before the imports (seconds)
    check_file(args.receipt, "RECEIPT")
    if args.public_key is not None:
        check_file(args.public_key, "--public-key")
    if not args.stream.is_dir():
        raise FileNotFoundError(f"STREAM: no such folder: {args.stream}")
    from svattn.lm.forget import ModelErasureReceipt, verify_forget
    from svattn.lm.stream import LMStream, StreamIntegrityError
    from svattn.lm.train import load_checkpoint_model

    try:
        receipt = ModelErasureReceipt.from_json(args.receipt.read_text())
    except UnicodeDecodeError:
        raise ValueError(f"RECEIPT: {args.receipt} is not a text file") from None
    model, _, _ = load_checkpoint_model(args.checkpoint)
    try:
        stream = LMStream.load(args.stream, model)
    except StreamIntegrityError as exc:  # edited or corrupted: a failed check, not bad input
        print(f"the saved stream: {exc}")
        print("verdict:             FAILED (the saved stream's files do not hold together: "
              "edited or corrupted; nothing of the receipt could be checked against it)")
        return 1
    report = verify_forget(stream, receipt, tol=args.tol, public_key=args.public_key)
    _print_verdict(report.verdict)
    print(report.summary())
    return report.exit_status


# ------------------------------------------------------- verify-forget-receipt


def _verify_forget_receipt_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, metavar="MODEL",
                        help="the model folder SVDD.save wrote right after the forget, or "
                             "with --log any later save (it holds the remaining rows: "
                             "personal data)")
    parser.add_argument("receipt", type=Path, metavar="RECEIPT",
                        help="the forget receipt (JSON, ForgetReceipt.to_json)")
    parser.add_argument("--tol", type=_positive_float, default=1e-8,
                        help="tolerance of the re-solve comparison (default: 1e-8)")
    parser.add_argument("--log", type=Path, metavar="LOG", default=None,
                        help="the model's audit log (SVDD(audit_log=...)): it must record "
                             "every removal (or the subject's erasure) the receipt carries; "
                             "its checkpoint and the saved state's are checked against it "
                             "(signed: with --public-key)")
    parser.add_argument("--public-key", type=Path, metavar="KEY", default=None,
                        help="the controller's Ed25519 public key (svattn keygen): the "
                             "receipt and every record in it must carry its valid signature")
    parser.epilog = ("exit status: 0 every field checked and passed; 3 nothing failed but "
                     "some field could not be checked (each named, with what would check "
                     "it); 1 a check failed; 2 malformed input")


def _verify_forget_receipt_run(args: argparse.Namespace) -> int:
    from svattn.estimators import ForgetReceipt, verify_forget_receipt
    from svattn.estimators.svdd import SVDD

    check_file(args.receipt, "RECEIPT")
    for p, what in ((args.log, "--log"), (args.public_key, "--public-key")):
        if p is not None:
            check_file(p, what)
    if args.log is not None:
        check_audit_log(args.log)
    if not args.model.is_dir():
        raise FileNotFoundError(f"MODEL: no such model folder: {args.model}")
    try:
        receipt = ForgetReceipt.from_json(args.receipt.read_text())
    except UnicodeDecodeError:
        raise ValueError(f"RECEIPT: {args.receipt} is not a text (JSON) file") from None
    try:
        model = SVDD.load(args.model)
    except (ValueError, FileNotFoundError) as exc:
        raise ValueError(f"MODEL: {exc}") from None
    print(f"verifying: proving the state of the {model.n_samples_} rows of {args.model} "
          "optimal from their keys ...", file=sys.stderr, flush=True)
    v = verify_forget_receipt(model, receipt, tol=args.tol, log=args.log,
                              public_key=args.public_key)
    who = f" of subject {receipt.subject!r}" if receipt.subject is not None else ""
    print(f"model: {args.model} ({model.n_samples_} rows, refit with C={model.C_!r}, "
          f"gamma={model.gamma_!r})")
    print(f"receipt: forget of {len(receipt.ids)} rows{who}, issued {receipt.issued_at}")
    from svattn.estimators.saved import STATE_FILE

    args.state = args.model / STATE_FILE  # its checkpoint, beside the log's
    return _report_with_log(v, args)


# ------------------------------------------------------------------ train/eval


def _train_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "config", type=Path, metavar="CONFIG",
        help="training config (JSON; keys of svattn.lm.train.TrainConfig, e.g. configs/*.json)",
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
        help="override a config key (VALUE parsed as JSON, else taken as a string); "
        "repeatable. A dotted KEY sets one entry of a mapping (--set hybrid.C=0.1); a "
        "mapping VALUE merges into the config's mapping key by key (--set "
        "'hybrid={\"C\":0.1}' keeps chunk and budget); {} empties it",
    )
    parser.add_argument(
        "--data", default=None, metavar="PATH",
        help="the enwik8 file (raw or .zip) to train on; same as --set data=PATH",
    )
    parser.add_argument(
        "--resume", action="store_true",
        help="continue from OUT_DIR/ckpt.pt when it exists (without it, an OUT_DIR that "
        "holds a checkpoint is refused)",
    )
    parser.add_argument(
        "--stop-after", type=_positive_int, default=None, metavar="STEP",
        help="checkpoint and stop at this step (as if interrupted; resume later)",
    )
    parser.add_argument(
        "--record", type=Path, default=None, metavar="FILE",
        help="when the run ends, append its record (BPC, the exact command, the effective "
        "config) to this JSON list, e.g. results/lm.json",
    )


def _read_config(path: Path) -> dict:
    import json

    check_file(path, "CONFIG")
    try:
        raw = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"CONFIG: {path} is not valid JSON ({exc})") from None
    if not isinstance(raw, dict):
        raise ValueError(f"CONFIG: {path} holds a JSON {type(raw).__name__}; a training "
                         "config is a JSON object of TrainConfig keys")
    return raw


def _train_run(args: argparse.Namespace) -> int:
    import json
    import os

    from svattn.experiments.runner import command_line
    from svattn.lm.records import append_records, read_records, run_record
    from svattn.lm.train import TrainConfig, apply_overrides, check_run, train

    if args.record is not None:
        read_records(args.record)  # a bad results file fails now, not after training
    raw = _read_config(args.config)
    items = list(args.overrides) + ([f"data={json.dumps(args.data)}"] if args.data else [])
    cfg = TrainConfig.from_dict(apply_overrides(raw, items))
    check_run(cfg, resume=args.resume)  # bad input refused before the config is printed
    command = command_line(args._argv)
    rank0 = int(os.environ.get("RANK", "0")) == 0
    if rank0:
        print(f"config ({args.config} with {len(items)} override{'s' if len(items) != 1 else ''}"
              f"): {json.dumps(cfg.to_dict())}", flush=True)
    res = train(cfg, resume=args.resume, stop_after=args.stop_after,
                command=command)
    if rank0:
        print(
            f"{cfg.mixer}: {res.params:,} params, {res.tokens_seen:,} tokens "
            f"({res.train_tokens_per_s:,.0f} tokens/s) on {res.data}, final loss "
            f"{res.final_loss:.4f}; {res.describe_eval()}; checkpoint {res.checkpoint}; "
            f"effective config {Path(cfg.out_dir) / 'config.json'}"
        )
        if args.record is not None and res.steps < cfg.steps:
            print(f"not recorded in {args.record}: stopped at step {res.steps} of {cfg.steps} "
                  "(--resume finishes it; --record then records it)")
        elif args.record is not None:
            rec = run_record(cfg.out_dir)
            replaced = append_records([rec], args.record)
            print(f"{'replaced' if replaced else 'appended'} record {rec['id']} in {args.record}")
    return 0


def _eval_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, metavar="CHECKPOINT",
                        help="a ckpt.pt of svattn train (BPC on enwik8), or a recall run's "
                             "ckpt.pt / model.pt (query accuracy on its own task)")
    parser.add_argument(
        "--data", type=Path, default=None, metavar="PATH",
        help="enwik8 file (raw or .zip; default: the run's data)",
    )
    parser.add_argument(
        "--split", nargs="+", default=None, choices=["train", "val", "test"],
        help="the splits to score (default: val test; a recall run's model: test)",
    )
    parser.add_argument(
        "--context", type=_positive_int, default=None,
        help="context length (default: the model's block_size)",
    )
    parser.add_argument("--batch-size", type=_positive_int, default=32,
                        help="sequences per evaluation batch (default 32)")
    parser.add_argument(
        "--max-bytes", type=_positive_int, default=None,
        help="score only the first N bytes of each split (default: every byte; a recall "
        "run's model: its first N // context contexts, at least one)",
    )
    parser.add_argument(
        "--record", type=Path, default=None, metavar="FILE",
        help="append one 'eval' record per split (BPC, the exact command) to this JSON list, "
        "e.g. results/lm.json",
    )


def _eval_run(args: argparse.Namespace) -> int:
    import json

    from svattn.experiments.runner import command_line
    from svattn.lm.records import append_records, eval_record
    from svattn.lm.train import evaluate_bpc, load_checkpoint_for_eval, load_checkpoint_model

    check_file(args.checkpoint, "CHECKPOINT")
    if args.data is not None:
        check_file(args.data, "--data")
    model, cfg, ckpt = load_checkpoint_model(args.checkpoint)
    if cfg is None:  # a recall run's model: its own task
        return _eval_recall(args, model, ckpt)
    model, _, ckpt, ds = load_checkpoint_for_eval(args.checkpoint, args.data)
    context = args.context or model.cfg.block_size
    records = []
    for split in args.split or ["val", "test"]:
        lo, hi = ds.span(split, args.max_bytes)
        res = evaluate_bpc(model, ds.data, lo, hi, context=context, batch_size=args.batch_size)
        rec = {"split": split, "data": ds.label, "step": ckpt["step"], **res}
        print(json.dumps(rec))
        records.append(eval_record(args.checkpoint, rec, command=command_line(args._argv)))
    if args.record is not None:
        replaced = append_records(records, args.record)
        print(f"wrote {len(records)} eval record{'s' if len(records) != 1 else ''} to "
              f"{args.record}{f' (replacing {replaced})' if replaced else ''}")
    return 0


def _eval_recall(args: argparse.Namespace, model, ckpt: dict) -> int:
    """``svattn eval`` of a recall run's model: query accuracy on its own task."""
    import json

    from svattn.lm.recall import evaluate_recall

    for given, flag in ((args.data, "--data"), (args.context, "--context"),
                        (args.record, "--record")):
        if given is not None:
            raise ValueError(f"{flag}: {args.checkpoint} is a recall run's model, scored on "
                             f"its own task ({ckpt['run'].get('task')}); {flag} applies to "
                             "enwik8 checkpoints of svattn train (recall results are "
                             "collected by svattn recall collect)")
    seq = int(ckpt["model_config"]["block_size"])
    limit = None if args.max_bytes is None else max(1, args.max_bytes // seq)
    for split in args.split or ["test"]:
        print(json.dumps(evaluate_recall(model, ckpt, split=split, max_contexts=limit)))
    return 0


def _convert_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("old", type=Path, metavar="OLD",
                        help="a checkpoint of an earlier svattn (UNPICKLED: only one you trust)")
    parser.add_argument("new", type=Path, metavar="NEW",
                        help="where to write the converted checkpoint (must not exist)")


def _convert_run(args: argparse.Namespace) -> int:
    from svattn.lm.checkpoint import convert_checkpoint

    convert_checkpoint(args.old, args.new, warn=lambda message: print(
        f"svattn convert-checkpoint: warning: {message}", file=sys.stderr, flush=True))
    print(f"wrote {args.new}: it reads without unpickling objects (svattn generate, "
          "verify-forget, eval, train --resume)")
    return 0


def _collect_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", type=Path, nargs="+", metavar="RUN_DIR",
                        help="out_dir of finished svattn train runs")
    parser.add_argument("--into", type=Path, required=True, metavar="FILE",
                        help="the JSON list of records to append to, e.g. results/lm.json")


def _collect_run(args: argparse.Namespace) -> int:
    from svattn.lm.records import append_records, run_record

    for run in args.runs:
        if not run.is_dir():
            raise FileNotFoundError(f"RUN_DIR: no such folder: {run}")
    records = [run_record(run) for run in args.runs]  # all checked before any is written
    replaced = set(append_records(records, args.into))
    for rec in records:
        print(f"{'replaced' if rec['id'] in replaced else 'appended'} {rec['id']} "
              f"(command: {rec['command']})")
    print(f"wrote {args.into}")
    return 0


# --------------------------------------------------------------------- recall


#: The names of svattn.lm.recall_grid.GRIDS, here so that --help imports no torch
#: (tests/lm/test_recall.py holds the two equal).
RECALL_GRIDS = ("quick", "slice", "slice-128", "slice-128-lr3e-3", "slice-copy", "long-64",
                "long-64-full", "long-128", "long-copy", "selection", "selection-approximate",
                "full")
RECALL_RESULTS = "results/recall.json"


def _recall_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="recall_command", metavar="ACTION", required=True)
    run = sub.add_parser("run", help="train a grid's unfinished cells (one JSON per cell)")
    run.add_argument("--grid", default="slice", metavar="GRID",
                     help=f"a grid of svattn.lm.recall_grid.GRIDS: {', '.join(RECALL_GRIDS)} "
                     "(default slice)")
    run.add_argument("--out", type=Path, default=Path("runs/recall"), metavar="DIR",
                     help="folder of the cell files (default runs/recall)")
    run.add_argument("--only", default=None, metavar="FIELD=V[|V..],...",
                     help="cells whose fields match, e.g. task=mqar,seq_len=64|128 (C: the "
                     "hybrid's box)")
    run.add_argument("--limit", type=_positive_int, default=None, metavar="N",
                     help="train at most N cells now (a resumable piece)")
    run.add_argument("--threads", type=_positive_int, default=1,
                     help="torch CPU threads (default 1)")
    run.add_argument("--ckpt-every", type=_positive_int, default=None, metavar="N",
                     help="train each cell resumably: a checkpoint in DIR/<cell id>/ every N "
                     "steps, from which an interrupted cell continues on the next call")
    col = sub.add_parser("collect", help="write the results file from the finished cells")
    col.add_argument("--runs", type=Path, nargs="+", default=[Path("runs/recall")],
                     metavar="DIR", help="one or more folders of finished cells (default: "
                     "runs/recall)")
    col.add_argument("--into", type=Path, default=None, metavar="FILE",
                     help=f"the results file to write (default {RECALL_RESULTS}, which is "
                     "a tracked record: replaced only when --into names it or with --force)")
    col.add_argument("--models-into", type=Path, default=None, metavar="DIR",
                     help="also copy the cells' kept weights (grids that keep them, e.g. "
                     "selection) into DIR")
    col.add_argument("--force", action="store_true",
                     help=f"replace {RECALL_RESULTS} when --into is not given")
    res = sub.add_parser("restore", help="write a results file's cells back into a runs "
                         "folder, so that run skips them (a grid resumed from its record)")
    res.add_argument("--from", dest="source", type=Path, required=True, metavar="FILE",
                     help="a results file written by collect")
    res.add_argument("--out", type=Path, required=True, metavar="DIR",
                     help="the runs folder that run --out DIR will resume")
    tim = sub.add_parser("time", help="seconds per training step of each mixer at a grid's sizes")
    tim.add_argument("--grid", default="full", metavar="GRID",
                     help="the grid whose cells are timed (default full)")
    tim.add_argument("--only", default=None, metavar="FIELD=V[|V..],...",
                     help="time only cells whose fields match, e.g. mixer=sliding")
    tim.add_argument("--steps", type=_positive_int, default=3,
                     help="timed training steps per cell, after one warm step (default 3)")
    tim.add_argument("--threads", type=_positive_int, default=1,
                     help="torch CPU threads (default 1)")
    tim.add_argument("--into", type=Path, default=None, metavar="FILE",
                     help="also write the timings as JSON")


def _recall_run(args: argparse.Namespace) -> int:
    import json

    import torch

    from svattn.experiments.runner import command_line
    from svattn.lm.recall import step_seconds
    from svattn.lm.recall_grid import (
        GRIDS,
        collect,
        estimate_hours,
        parse_only,
        run_grid,
        select,
    )

    command = command_line(args._argv)
    if args.recall_command == "restore":
        from svattn.lm.recall_grid import restore

        if not args.source.is_file():
            raise FileNotFoundError(f"--from: no such file: {args.source}")
        written = restore(args.source, args.out)
        print(f"restored {len(written)} cells into {args.out}")
        return 0
    if args.recall_command == "collect":
        into = args.into
        if into is None:
            into = Path(RECALL_RESULTS)
            if into.exists() and not args.force:
                raise FileExistsError(f"{into} exists and is a tracked record: give --into "
                                      "FILE to write another file, or --force to replace it")
        res = collect(args.runs, into, command=command, models_into=args.models_into)
        print(f"collected {len(res['records'])} cells from "
              f"{', '.join(map(str, args.runs))}; wrote {into}")
        return 0
    if args.grid not in GRIDS:
        raise ValueError(f"--grid must be one of {sorted(GRIDS)}, got {args.grid!r}")
    torch.set_num_threads(args.threads)
    grid, only = GRIDS[args.grid], parse_only(args.only)
    if args.recall_command == "run":
        written = run_grid(grid, args.out, only=only, limit=args.limit, command=command,
                           log=lambda line: print(line, flush=True),
                           ckpt_every=args.ckpt_every)
        print(f"{len(written)} cells written to {args.out}")
        return 0
    seen, rows = set(), []
    for run in select(grid.runs(), only):  # one timing per (task, length, width, mixer)
        key = (run.task, run.seq_len, run.d_model, run.mixer)
        if key in seen:
            continue
        seen.add(key)
        sec = step_seconds(run, steps=args.steps)
        rows.append({"task": run.task, "seq_len": run.seq_len, "d_model": run.d_model,
                     "mixer": run.mixer, "batch_size": run.batch_size, "step_seconds": sec})
        print(f"{run.task:15s} T={run.seq_len:5d} d={run.d_model:4d} {run.mixer:10s} "
              f"{sec:8.3f} s/step", flush=True)
    est = estimate_hours(grid, rows)
    print(f"grid {args.grid}: about {est['total']:.1f} h on one core at these step times "
          f"({est['missing']} cells without a timing)")
    if args.into is not None:
        args.into.parent.mkdir(parents=True, exist_ok=True)
        args.into.write_text(json.dumps({"command": command, "grid": args.grid,
                                         "threads": args.threads, "timings": rows,
                                         "estimate_hours": est}, indent=1) + "\n")
    return 0


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
        _demo_arguments,
        _demo_run,
    ),
    Command(
        "audit",
        "an audit log: verify it (chain, certificates, signed checkpoints, a saved state), "
        "read an entry, prove one (.tlog-proof), check a proof or a consistency proof",
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
        "verify-erasure",
        "check a data subject's erasure receipt against a saved state (every certificate; "
        "with --log, against the log's erase record)",
        _verify_erasure_arguments,
        _verify_erasure_run,
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
        "write an Ed25519 key pair that signs deletion receipts and the audit log's "
        "checkpoints (PREFIX.key, PREFIX.pub, PREFIX.vkey)",
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
        "bits per character of a trained checkpoint on enwik8 splits (a recall run's "
        "model: query accuracy on its task)",
        _eval_arguments,
        _eval_run,
    ),
    Command(
        "generate",
        "stream a prompt through a trained CharLM on exact memories and sample bytes; "
        "--forget shows the effect of forgetting part of the prompt",
        _generate_arguments,
        _generate_run,
    ),
    Command(
        "forget",
        "forget text (or a span of the held text) from a saved LMStream folder: saves it "
        "back, files a receipt, echoes the removed bytes",
        _forget_arguments,
        _forget_run,
    ),
    Command(
        "verify-forget",
        "check a saved LMStream against its erasure receipt by re-streaming its text "
        "from scratch",
        _verify_forget_arguments,
        _verify_forget_run,
    ),
    Command(
        "verify-forget-receipt",
        "check an svattn.SVDD forget receipt against the model saved after it (every "
        "removal through the exact core's verifiers; with --log and --public-key, every "
        "field)",
        _verify_forget_receipt_arguments,
        _verify_forget_receipt_run,
    ),
    Command(
        "convert-checkpoint",
        "convert a checkpoint of an earlier svattn (it unpickles OLD: trusted files only) "
        "into one that reads without unpickling",
        _convert_arguments,
        _convert_run,
    ),
    Command(
        "collect",
        "append finished svattn train runs (BPC, command, config, from their logs) to a "
        "results file",
        _collect_arguments,
        _collect_run,
    ),
    Command(
        "recall",
        "trained recall grids (MQAR, selective copy): run cells in resumable pieces, "
        "collect results/recall.json, time the mixers",
        _recall_arguments,
        _recall_run,
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


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
