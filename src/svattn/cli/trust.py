"""The exact memory's trust tools: check a receipt against a saved state, recover after
a crash, make the controller's keys.

``verify-deletion`` and ``verify-erasure`` re-solve a saved :class:`SVDDMemory` state and
check a deletion certificate or an erasure receipt against it; ``verify-forget-receipt``
does the same for an :class:`svattn.SVDD` forget receipt and the model saved after it;
with ``--log``, each also checks the audit log's checkpoints (:mod:`svattn.cli.verdict`).
``recover`` replays the logged removals after the last save; ``keygen`` writes the
Ed25519 key pair that signs receipts and checkpoints. The ``audit`` command, which reads
the log itself, is :mod:`svattn.cli.audit`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from svattn.cli.inputs import check_audit_log, check_file, positive_float
from svattn.cli.verdict import exit_codes, report_with_log

__all__ = ["keygen_arguments", "keygen_run", "recover_arguments", "recover_run",
           "verify_deletion_arguments", "verify_deletion_run", "verify_erasure_arguments",
           "verify_erasure_run", "verify_forget_receipt_arguments",
           "verify_forget_receipt_run"]


def _state_receipt_arguments(parser: argparse.ArgumentParser, receipt: str, what: str,
                             log: str, signed: str) -> None:
    """The arguments verify-deletion and verify-erasure share: STATE, the receipt, --tol,
    --seed, --log and --public-key (``log``, ``signed``: what each then requires)."""
    parser.add_argument("state", type=Path, metavar="STATE", help="the saved memory state")
    parser.add_argument(receipt.lower(), type=Path, metavar=receipt, help=what)
    parser.add_argument("--tol", type=positive_float, default=1e-8,
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
    exit_codes(parser, "The default check proves the state is the optimum of the "
                "remaining tokens from their keys (the KKT conditions and the uniqueness "
                "test, recomputed without the memory's caches: O(n·|S|·d) time, bounded "
                "memory); see docs/trust.md for its cost.")


def verify_deletion_arguments(parser: argparse.ArgumentParser) -> None:
    _state_receipt_arguments(
        parser, "CERTIFICATE", "a deletion certificate (JSON, DeletionCertificate.to_json)",
        "it must verify and record exactly this certificate and the add of its token "
        "(catches an edited commitment)", "certificate must carry its valid signature")
    parser.add_argument("--commit-key", type=Path, metavar="FILE", default=None,
                        help="the commitment key (hex), or the controller's private key: "
                             "every live token is re-committed to find copies of the "
                             "erased record")


def verify_deletion_run(args: argparse.Namespace) -> int:
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
    return report_with_log(v, args)


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


def verify_erasure_arguments(parser: argparse.ArgumentParser) -> None:
    _state_receipt_arguments(
        parser, "RECEIPT", "an erasure receipt (JSON, ErasureReceipt.to_json)",
        "the receipt must be its erase record, and every certificate its removal records",
        "receipt and its certificates must carry its valid signatures")


def verify_erasure_run(args: argparse.Namespace) -> int:
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
    return report_with_log(v, args)


def verify_forget_receipt_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", type=Path, metavar="MODEL",
                        help="the model folder SVDD.save wrote right after the forget, or "
                             "with --log any later save (it holds the remaining rows: "
                             "personal data)")
    parser.add_argument("receipt", type=Path, metavar="RECEIPT",
                        help="the forget receipt (JSON, ForgetReceipt.to_json)")
    parser.add_argument("--tol", type=positive_float, default=1e-8,
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


def verify_forget_receipt_run(args: argparse.Namespace) -> int:
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
    return report_with_log(v, args)


def recover_arguments(parser: argparse.ArgumentParser) -> None:
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


def recover_run(args: argparse.Namespace) -> int:
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


def keygen_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prefix", type=Path, metavar="PREFIX",
                        help="writes PREFIX.key (private, mode 0600), PREFIX.pub and "
                             "PREFIX.vkey")


def keygen_run(args: argparse.Namespace) -> int:
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
