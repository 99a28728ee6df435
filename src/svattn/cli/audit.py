"""``svattn audit``: verify an audit log, read its entries, prove them, check consistency.

The actions (``svattn audit ACTION --help``)::

    svattn audit verify LOG [STATE] [--public-key PEM | --vkey VKEY]
    svattn audit entry LOG INDEX                 the entry's exact bytes (what is hashed)
    svattn audit prove LOG (INDEX | --receipt JSON) [-o FILE.tlog-proof]

LOG of ``entry`` and ``prove`` may also be a language-model stream's folder (``svattn
generate --save``): its forget log, whose entries record the model erasure receipts.
    svattn audit check-proof PROOF ENTRY (--public-key PEM | --vkey VKEY)
    svattn audit consistency OLD NEW --log LOG [--public-key PEM | --vkey VKEY]
                                                 [--proof-out FILE]
    svattn audit migrate LOG --signing-key KEY   sign a checkpoint of a version-1 log
         [--state STATE --new-log NEW --out NEW_STATE [--tag-key HEX_FILE]]
                                                 or go on in a new, prunable log
    svattn audit prune LOG [--tag-hash HEX]      finish the prune of forgotten subjects
    svattn audit vkey LOG --public-key PEM       the log's own verifier key (name = origin)

Exit status: 0 everything checked and held; 1 a check failed (a bad signature, an
unknown key, inclusion or consistency failed, a log that does not verify); 2 malformed
input or usage; 3 nothing failed but something could not be checked (an unsigned log,
no key given, entries after the checkpoint), named on the ``UNCHECKED`` lines.

Run by :mod:`svattn.cli` (the ``audit`` entry of its command table); imports what it
needs inside each action, so the command line starts without them; the checks of its
input that it shares with the other commands are in :mod:`svattn.cli.inputs`.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from svattn.cli.inputs import check_audit_log, check_file
from svattn.cli.verdict import exit_codes

__all__ = ["add_arguments", "run"]


def _keys(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--public-key", type=Path, metavar="PEM", default=None,
                        help="the controller's Ed25519 public key (svattn keygen's PREFIX.pub)")
    parser.add_argument("--vkey", type=Path, metavar="VKEY", default=None,
                        help="note verifier keys, one per line (svattn keygen's PREFIX.vkey, "
                             "a witness's key)")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``audit`` actions' arguments."""
    exit_codes(parser, "Without STATE the log's end cannot be checked (exit 3): only a "
               "state saved after its last records anchors the end.")
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    p = sub.add_parser("verify", help="check a log: hash chain, certificates, its checkpoint "
                       "(and the state's) against its Merkle tree and the controller's key",
                       formatter_class=argparse.RawDescriptionHelpFormatter, epilog=(
                           "exit status:\n  0  VERIFIED: chain, checkpoints, signatures and "
                           "the log's end (STATE) all checked\n  1  FAILED: a check failed "
                           "(named)\n  2  malformed input\n  3  UNCHECKED: nothing failed, "
                           "but something was not checked (named, with what would check it:"
                           "\n     --vkey / --public-key, STATE)"))
    p.add_argument("log", type=Path, metavar="LOG", help="the JSONL audit log")
    p.add_argument("state", type=Path, nargs="?", default=None, metavar="STATE",
                   help="a state saved with this log: its digest must be the log's final "
                        "digest, its checkpoint one of the log's")
    _keys(p)
    p = sub.add_parser("entry", help="write entry INDEX's exact bytes (the Merkle leaf is "
                       "SHA-256(0x00 || these bytes)) to stdout")
    p.add_argument("log", type=Path, metavar="LOG",
                   help="an audit log, or a stream folder (its forget log)")
    p.add_argument("index", type=int, metavar="INDEX", help="0-based entry (= record seq)")
    p = sub.add_parser("prove", help="write a c2sp.org/tlog-proof@v1 file: an entry's "
                       "inclusion proof to the log's signed checkpoint")
    p.add_argument("log", type=Path, metavar="LOG",
                   help="an audit log, or a stream folder (its forget log)")
    p.add_argument("index", type=int, nargs="?", default=None, metavar="INDEX")
    p.add_argument("--receipt", type=Path, default=None, metavar="JSON",
                   help="prove the entry that records this receipt (instead of INDEX): a "
                        "deletion certificate, an erasure receipt or an estimator's forget "
                        "receipt (its last removal's entry, whose chain holds the earlier "
                        "ones) in an audit log; a model erasure receipt in a stream's")
    p.add_argument("-o", "--out", type=Path, default=None, metavar="FILE",
                   help="write the proof here (a new file; default: stdout)")
    p = sub.add_parser("check-proof", help="verify a .tlog-proof against the entry's bytes "
                       "and the controller's key")
    p.add_argument("proof", type=Path, metavar="PROOF")
    p.add_argument("entry", type=Path, metavar="ENTRY",
                   help="a file holding the entry's exact bytes (svattn audit entry)")
    _keys(p)
    p = sub.add_parser("consistency", help="check that checkpoint NEW extends checkpoint OLD "
                       "(the log's history was not rewritten), with a proof made from LOG")
    p.add_argument("old", type=Path, metavar="OLD", help="a checkpoint kept earlier")
    p.add_argument("new", type=Path, metavar="NEW", help="a later checkpoint of the log")
    p.add_argument("--log", type=Path, required=True, metavar="LOG",
                   help="the log, from which the consistency proof is made")
    p.add_argument("--proof-out", type=Path, default=None, metavar="FILE",
                   help="also write the proof (base64 hashes, one per line) for another tool")
    _keys(p)
    p = sub.add_parser("migrate", help="give a log written before checkpoints (version 1) "
                       "its first checkpoint, signed with the controller's key: the "
                       "controller vouches for the log as it stands")
    p.add_argument("log", type=Path, metavar="LOG")
    p.add_argument("--signing-key", type=Path, required=True, metavar="KEY",
                   help="the controller's private key (svattn keygen's PREFIX.key)")
    p.add_argument("--state", type=Path, default=None, metavar="STATE",
                   help="with --new-log: the state saved last with LOG")
    p.add_argument("--new-log", type=Path, default=None, metavar="NEW_LOG",
                   help="start a new log (format version 3: a subject's data in salted "
                        "commitments, pruned when it is forgotten) from STATE, citing LOG's "
                        "last record, as svattn recover does; LOG's entries keep their data")
    p.add_argument("--out", type=Path, default=None, metavar="NEW_STATE",
                   help="with --new-log: where the memory, now logging to NEW_LOG, is saved")
    p.add_argument("--tag-key", type=Path, default=None, metavar="HEX_FILE",
                   help="with --new-log: the memory's tag key (hex), when it is not derived "
                        "from the signing key")
    p = sub.add_parser("prune", help="delete from LOG.openings every opening an erase "
                       "names (an erase prunes its subject itself: this finishes a prune "
                       "that a crash cut); the entries, the checkpoints and every proof stay "
                       "valid", formatter_class=argparse.RawDescriptionHelpFormatter,
                       epilog=("exit status:\n  0  pruned (or nothing left to prune)\n"
                               "  1  refused: the log does not verify, or the subject was "
                               "not forgotten\n  2  malformed input (a log before format "
                               "version 3)"))
    p.add_argument("log", type=Path, metavar="LOG")
    p.add_argument("--tag-hash", default=None, metavar="HEX",
                   help="refuse unless this subject (its tag hash, as its erasure receipt "
                        "names it) was forgotten")
    p = sub.add_parser("vkey", help="print the log's own note verifier key: the "
                       "controller's key under the log's origin as key name (svattn signs "
                       "each checkpoint under it and under the controller's name, which "
                       "keygen's PREFIX.vkey holds)")
    p.add_argument("log", type=Path, metavar="LOG",
                   help="an audit log, or a stream folder (its forget log)")
    p.add_argument("--public-key", type=Path, required=True, metavar="PEM",
                   help="the controller's Ed25519 public key (svattn keygen's PREFIX.pub)")


def run(args: argparse.Namespace) -> int:
    """Run one ``audit`` action; return the exit status."""
    return {"verify": _verify, "entry": _entry, "prove": _prove, "check-proof": _check_proof,
            "consistency": _consistency, "migrate": _migrate, "prune": _prune,
            "vkey": _vkey}[args.action](args)


# ------------------------------------------------------------------ helpers
def _log(path: Path):
    """The verified chain of an svattn audit log (usage error when not a log)."""
    from svattn.exact.records.audit import verify_chain

    check_audit_log(path)
    return verify_chain(path)


def _verifiers(args: argparse.Namespace) -> list:
    from svattn.exact.records.note import NoteVerifier
    from svattn.exact.records.signing import load_public_key
    from svattn.exact.records.tlog import controller_verifier

    keys = []
    if args.public_key is not None:
        check_file(args.public_key, "--public-key")
        keys.append(controller_verifier(load_public_key(args.public_key)))
    if args.vkey is not None:
        check_file(args.vkey, "--vkey")
        for line in args.vkey.read_text().splitlines():
            if line.strip():
                try:
                    keys.append(NoteVerifier.from_string(line.strip()))
                except ValueError as exc:
                    raise ValueError(f"--vkey: {args.vkey}: {exc}") from None
    return keys


def _refused(exc) -> int:
    """Print a refusal; 2 for malformed input, 1 for a check that failed."""
    from svattn.exact.records.note import Verdict

    if exc.verdict is Verdict.MALFORMED:
        raise ValueError(str(exc)) from None
    print(f"REFUSED ({exc.verdict.value}): {exc.reason}")
    return 1


# ------------------------------------------------------------------ actions
def _verify(args: argparse.Namespace) -> int:
    from svattn.exact.auditor.logcheck import check_authenticity, verify_log
    from svattn.exact.auditor.persist import load
    from svattn.exact.records.fileformat import StateFileError

    _log(args.log)
    keys = _verifiers(args)
    if args.state is not None:
        check_file(args.state, "STATE")
        try:
            load(args.state)
        except StateFileError as exc:
            raise ValueError(f"STATE: {exc}") from None
    report = verify_log(args.log, args.state)
    print(report.summary())
    if not report.ok:
        return 1
    auth = check_authenticity(args.log, report, keys, args.state)
    if args.state is None and not auth.failed:
        auth.unchecked.append("the log's end: records cut from the end of a log, an older "
                              "checkpoint put back, leave a shorter log that still verifies; "
                              "only a state saved after them can tell (give STATE, the "
                              "memory's last saved state)")
    for line in auth.lines():
        print(line)
    print({0: "verdict: VERIFIED (chain, checkpoints and signatures all checked)",
           1: "verdict: FAILED",
           3: "verdict: UNCHECKED (nothing failed; see the UNCHECKED lines)"}
          [auth.exit_status])
    return auth.exit_status


def _index(rep, index: int) -> int:
    if not rep.ok:
        raise ValueError(f"LOG does not verify: {rep.error}")
    if not 0 <= index < len(rep.entries):
        raise ValueError(f"INDEX: {index} is outside the log's entries 0..{len(rep.entries) - 1}")
    return index


def _entry(args: argparse.Namespace) -> int:
    if args.log.is_dir():
        return _stream_entry(args)
    rep = _log(args.log)
    sys.stdout.buffer.write(rep.entries[_index(rep, args.index)])
    sys.stdout.flush()
    return 0


def _receipt_index(rep, path: Path) -> int:
    """The entry recording the deletion certificate or erasure receipt in ``path``."""
    from dataclasses import asdict

    from svattn.exact.records.certificate import DeletionCertificate, ErasureReceipt

    check_file(path, "--receipt")
    text = path.read_text()
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise ValueError(f"--receipt: {path} is not JSON ({exc})") from None
    if isinstance(data, dict) and "refit_with" in data:  # an estimator's forget receipt
        from svattn.estimators.receipt import ForgetReceipt

        forget = ForgetReceipt.from_json(text)
        if forget.erasure is not None:  # a subject's: the core's erase record
            sha = forget.erasure.sha256()
            hits = [r["seq"] for r in rep.records if r["op"] == "erase"
                    and r["erasure"].get("receipt_sha256") == sha]
        else:  # by ids: its last removal's record (its prev chains the earlier ones)
            cert = asdict(forget.certificates[-1])
            hits = [r["seq"] for r in rep.records if r["op"] == "remove"
                    and r["certificate"] == cert]
    elif isinstance(data, dict) and "erased_ids" in data:  # an erasure receipt
        sha = ErasureReceipt.from_json(text).sha256()
        hits = [r["seq"] for r in rep.records if r["op"] == "erase"
                and r["erasure"].get("receipt_sha256") == sha]
    else:
        cert = asdict(DeletionCertificate.from_json(text))
        hits = [r["seq"] for r in rep.records if r["op"] == "remove"
                and r["certificate"] == cert]
    if not hits:
        raise ValueError(f"--receipt: the log records no entry of {path}")
    return hits[-1]


def _prove(args: argparse.Namespace) -> int:
    from svattn.exact.records.audit import checkpoint_mismatch
    from svattn.exact.records.merkle import MerkleTree
    from svattn.exact.records.note import parse_note
    from svattn.exact.records.tlog import checkpoint_path, proof_text, read_checkpoint_unverified

    if (args.index is None) == (args.receipt is None):
        raise ValueError("give INDEX or --receipt (one of them)")
    if args.log.is_dir():
        return _stream_prove(args)
    rep = _log(args.log)
    index = _index(rep, args.index) if args.receipt is None else _receipt_index(rep, args.receipt)
    cp_file = checkpoint_path(args.log)
    check_file(cp_file, "the log's checkpoint")
    note = cp_file.read_text(encoding="utf-8")
    problem = checkpoint_mismatch(note, rep)
    if problem is not None:
        print(f"REFUSED: {cp_file.name} {problem}")
        return 1
    if "\n\n" not in note:
        raise ValueError(f"{cp_file.name} is unsigned: a .tlog-proof needs a signed "
                         "checkpoint (a memory given signing_key= signs its log)")
    parse_note(note)
    size = read_checkpoint_unverified(note).size
    if index >= size:
        raise ValueError(f"entry {index} is after the checkpoint (size {size}): the writer "
                         "rewrites it on its next operation or load")
    text = proof_text(index, MerkleTree(rep.leaves[:size]).inclusion_path(index), note)
    return _write_proof(args, text, index, size)


def _write_proof(args: argparse.Namespace, text: str, index: int, size: int) -> int:
    if args.out is None:
        sys.stdout.write(text)
    else:
        if args.out.exists():
            raise ValueError(f"--out: {args.out} exists; proofs are never overwritten")
        args.out.write_text(text)
        print(f"wrote {args.out}: entry {index} in the checkpoint of size {size}")
    return 0


# ------------------------------------------------------------------ a stream's forget log
def _stream_log(folder: Path) -> tuple[list[dict], str | None]:
    """The forget log of the stream saved in ``folder`` and its checkpoint, read from
    its manifest (checksum checked; the stream itself is not loaded: no model needed)."""
    from svattn.lm.stream_folder import MANIFEST, read_manifest

    if not (folder / MANIFEST).is_file():
        raise ValueError(f"LOG: {folder} is a folder, but no saved stream (no {MANIFEST})")
    man = read_manifest(folder)
    log, cp = man.get("forget_log"), man.get("forget_checkpoint")
    if not isinstance(log, list) or not all(isinstance(e, dict) for e in log):
        raise ValueError(f"LOG: {folder}: the manifest's forget_log is not a list of records")
    if not isinstance(cp, (str, type(None))):
        raise ValueError(f"LOG: {folder}: the manifest's forget_checkpoint is not text")
    return log, cp


def _stream_index(log: list[dict], index: int) -> int:
    if not 0 <= index < len(log):
        raise ValueError(f"INDEX: {index} is outside the forget log's entries "
                         f"0..{len(log) - 1}" if log else "INDEX: the stream never forgot: "
                         "its forget log is empty")
    return index


def _stream_entry(args: argparse.Namespace) -> int:
    from svattn.lm.forget_log import entry_bytes

    log, _ = _stream_log(args.log)
    sys.stdout.buffer.write(entry_bytes(log[_stream_index(log, args.index)]))
    sys.stdout.flush()
    return 0


def _stream_prove(args: argparse.Namespace) -> int:
    from svattn.lm.forget import ModelErasureReceipt
    from svattn.lm.forget_log import check_checkpoint, proof_of, receipt_entry

    log, cp = _stream_log(args.log)
    if args.receipt is None:
        index = _stream_index(log, args.index)
    else:
        check_file(args.receipt, "--receipt")
        receipt = ModelErasureReceipt.from_json(args.receipt.read_text())
        index = receipt_entry(log, receipt)
        if index is None:
            raise ValueError(f"--receipt: the stream's forget log records no entry of "
                             f"{args.receipt}")
    _, failed, _ = check_checkpoint(log, cp)
    if failed:
        print(f"REFUSED: {failed[0]}")
        return 1
    return _write_proof(args, proof_of(log, cp, index), index, len(log))


def _check_proof(args: argparse.Namespace) -> int:
    from svattn.exact.records.note import TlogError
    from svattn.exact.records.tlog import verify_proof

    check_file(args.proof, "PROOF")
    check_file(args.entry, "ENTRY")
    keys = _verifiers(args)
    if not keys:
        raise ValueError("give the controller's --public-key or --vkey: a proof is only "
                         "as good as the key that signed its checkpoint")
    try:
        cp = verify_proof(args.proof.read_bytes(), args.entry.read_bytes(), keys)
    except TlogError as exc:
        return _refused(exc)
    print(f"VERIFIED: the entry is in log {cp.origin} (checkpoint of {cp.size} entries, "
          "signed by a key given)")
    return 0


def _consistency(args: argparse.Namespace) -> int:
    from svattn.exact.records.audit import checkpoint_mismatch
    from svattn.exact.records.merkle import MerkleTree, verify_consistency
    from svattn.exact.records.note import TlogError
    from svattn.exact.records.tlog import (
        consistency_proof_text,
        read_checkpoint_unverified,
        verify_consistency_between,
    )

    for p, what in ((args.old, "OLD"), (args.new, "NEW")):
        check_file(p, what)
    rep = _log(args.log)
    if not rep.ok:
        print(f"REFUSED: LOG does not verify: {rep.error}")
        return 1
    old, new = args.old.read_text(encoding="utf-8"), args.new.read_text(encoding="utf-8")
    cp_old, cp_new = read_checkpoint_unverified(old), read_checkpoint_unverified(new)
    problem = checkpoint_mismatch(new, rep)
    if problem is not None:
        print(f"REFUSED: NEW {problem}")
        return 1
    if cp_old.size > cp_new.size:
        print(f"REFUSED (consistency failed): OLD covers {cp_old.size} entries, NEW only "
              f"{cp_new.size}")
        return 1
    proof = MerkleTree(rep.leaves[:cp_new.size]).consistency_proof(cp_old.size)
    if args.proof_out is not None:
        args.proof_out.write_text(consistency_proof_text(proof))
    keys = _verifiers(args)
    signed = "\n\n" in old and "\n\n" in new
    if keys and signed:
        try:
            verify_consistency_between(old, new, proof, keys)
        except TlogError as exc:
            return _refused(exc)
        print(f"VERIFIED: the log at {cp_new.size} entries extends the checkpoint of "
              f"{cp_old.size} (both signed by a key given)")
        return 0
    if cp_old.origin != cp_new.origin or not verify_consistency(
            cp_old.size, cp_new.size, proof, cp_old.root, cp_new.root):
        print("REFUSED (consistency failed): OLD is not a prefix of the log NEW heads "
              "(its history was rewritten)")
        return 1
    why = ("a checkpoint is unsigned" if not signed else
           "no key given (--public-key or --vkey)")
    print(f"consistent: the log at {cp_new.size} entries extends the checkpoint of "
          f"{cp_old.size}")
    print(f"UNCHECKED: the checkpoints' signatures ({why}): anyone could have written them")
    return 3


def _migrate(args: argparse.Namespace) -> int:
    from svattn.exact.records.audit import lock_log
    from svattn.exact.records.signing import load_private_key
    from svattn.exact.records.tlog import CheckpointWriter, controller_signer

    check_file(args.signing_key, "--signing-key")
    key = load_private_key(args.signing_key)
    given = [a for a in ("state", "new_log", "out") if getattr(args, a) is not None]
    if given or args.tag_key is not None:
        if len(given) < 3:
            raise ValueError("--state, --new-log and --out go together (a new log started "
                             "from the state)")
        return _migrate_to_new_log(args, key)
    lock = lock_log(args.log) if args.log.is_file() else None  # no writer appends meanwhile
    try:
        rep = _log(args.log)
        if not rep.ok:
            print(f"REFUSED: LOG does not verify: {rep.error}")
            return 1
        writer = CheckpointWriter(args.log, controller_signer(key))
        if writer.file.exists():
            raise ValueError(f"{writer.file} exists: the log has checkpoints already")
        for entry in rep.entries:
            writer.add(entry)
        writer.write()
    finally:
        if lock is not None:
            import os

            os.close(lock)
    print(f"wrote {writer.file}: a checkpoint of the log's {len(rep.entries)} entries, signed "
          f"by {writer.signer.name}; the memory continues it (SVDDMemory.load(..., "
          "audit_log=LOG, signing_key=KEY))")
    return 0


def _prune(args: argparse.Namespace) -> int:
    from svattn.exact.records.audit import AuditLogError, prune_log

    check_audit_log(args.log)
    tag = args.tag_hash
    if tag is not None and not (len(tag) == 64 and set(tag) <= set("0123456789abcdef")):
        raise ValueError(f"--tag-hash: expected 64 lower-case hex digits, got {tag[:70]!r}")
    try:
        done = prune_log(args.log, tag)
    except AuditLogError as exc:
        if "format version" in str(exc):
            raise ValueError(str(exc)) from None
        print(f"REFUSED: {exc}")
        return 1
    if not done.pruned:
        print("nothing to prune: LOG.openings holds no opening an erase names")
    else:
        print(f"pruned {len(done.pruned)} opening(s) named by erase record(s) "
              f"{', '.join(map(str, done.erases))}; the entries and every proof are unchanged")
    return 0


def _migrate_to_new_log(args: argparse.Namespace, key) -> int:
    """``audit migrate --new-log``: the memory of STATE goes on in a new version-3 log."""
    from svattn.exact.auditor.recovery import recover
    from svattn.exact.records.audit import AuditLogError
    from svattn.exact.records.openings import openings_path

    check_audit_log(args.log)
    check_file(args.state, "--state")
    for p, what in ((args.new_log, "--new-log"), (args.out, "--out")):
        if p.exists() or what == "--new-log" and openings_path(p).exists():
            raise ValueError(f"{what}: {p} exists; migration writes new files only")
    tag_key = None
    if args.tag_key is not None:
        check_file(args.tag_key, "--tag-key")
        try:
            tag_key = bytes.fromhex(args.tag_key.read_text().strip())
        except ValueError:
            raise ValueError(f"--tag-key: {args.tag_key} does not hold a key in hex") from None
    try:
        memory, report = recover(args.state, args.log, args.new_log, signing_key=key,
                                 tag_key=tag_key)
    except AuditLogError as exc:  # a log or state that cannot go on: usage
        raise ValueError(str(exc)) from None
    memory.save(args.out)
    memory.close_audit_log()
    if report.replayed or report.lost_adds:
        print(report.summary())
    print(f"wrote {args.new_log} (log format version 3, citing {args.log.name}'s last record) "
          f"and {args.out} ({len(memory)} tokens); {args.log.name}'s entries still hold its "
          "subjects' data: keep it as the evidence of its history, or destroy it")
    return 0


def _vkey(args: argparse.Namespace) -> int:
    from svattn.exact.records.signing import load_public_key
    from svattn.exact.records.tlog import log_origin, log_verifier

    check_file(args.public_key, "--public-key")
    if args.log.is_dir():
        from svattn.lm.forget_log import origin_of

        log, _ = _stream_log(args.log)
        if not log:
            raise ValueError("LOG: the stream never forgot: its forget log has no origin yet")
        origin = origin_of(log)
    else:
        rep = _log(args.log)
        if not rep.ok or not rep.entries:
            raise ValueError(f"LOG does not verify: {rep.error}")
        origin = log_origin(rep.entries[0])
    print(log_verifier(origin, load_public_key(args.public_key)).to_string())
    return 0
