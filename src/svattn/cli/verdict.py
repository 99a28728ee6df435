"""How a verifying command reports: the exit statuses its ``--help`` lists, the fields
it checked, failed or could not check, and the audit log's authenticity beside them.

Exit status, for every verifier: 0 everything checked and held; 1 a check failed; 2
malformed input; 3 nothing failed but something could not be checked (named, with what
would check it). :func:`worst_status` combines several.
"""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["EXIT_CODES", "exit_codes", "log_authenticity", "print_verdict", "report_with_log",
           "worst_status"]


EXIT_CODES = """exit status:
  0  VERIFIED: every field and claim was checked, and nothing failed
  1  FAILED: a check failed (the output names it)
  2  malformed input: a missing or unreadable file, a malformed receipt or state
     (one line on stderr)
  3  UNCHECKED: nothing failed, but something could not be checked (the output names
     it, and what would check it: --log, --public-key, STATE)"""


def exit_codes(parser: argparse.ArgumentParser, note: str = "") -> None:
    """List a verifying command's exit statuses in its ``--help``."""
    parser.epilog = EXIT_CODES + (f"\n\n{note}" if note else "")
    parser.formatter_class = argparse.RawDescriptionHelpFormatter


def worst_status(*statuses: int) -> int:
    """The exit status of several checks together: 1 if one failed, else 3 if one could
    not check everything, else 0."""
    return 1 if 1 in statuses else 3 if 3 in statuses else 0


def log_authenticity(log: Path, state: Path | None, public_key: Path | None):
    """The audit log's checkpoints (and the state's) against the log's Merkle tree and the
    controller's key: :func:`svattn.exact.auditor.logcheck.check_authenticity`."""
    from svattn.exact.auditor.logcheck import check_authenticity
    from svattn.exact.records.audit import verify_chain
    from svattn.exact.records.signing import load_public_key
    from svattn.exact.records.tlog import controller_verifier

    keys = [] if public_key is None else [controller_verifier(load_public_key(public_key))]
    return check_authenticity(log, verify_chain(log), keys, state)


def print_verdict(verdict, auth=None) -> None:
    """The fields a verifier checked, the ones that failed and the ones nothing that ran
    checks, each with what would (exit status: 0 all checked, 3 some unchecked, 1 failed);
    with ``auth`` (the audit log's checkpoints, :func:`log_authenticity`), its lines, and
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


def report_with_log(v, args: argparse.Namespace) -> int:
    """Print a receipt's verdict with the audit log's checkpoints (``--log``, against
    ``args.state`` and the controller's ``--public-key``) beside it and return the worse
    of the two exit statuses: never a bare VERIFIED over a log whose authenticity failed
    or went unchecked."""
    auth = (None if args.log is None
            else log_authenticity(args.log, args.state, args.public_key))
    print_verdict(v.verdict, auth)
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
