"""The language model's stream on exact memories (:class:`svattn.lm.stream.LMStream`):
``generate`` streams a prompt and samples bytes, and with ``--forget`` forgets part of it;
``forget`` forgets text from a saved stream; ``verify-forget`` checks a saved stream
against its erasure receipt by re-streaming its text from scratch.

A forget files its receipts before it commits the save they describe
(:func:`_file_receipts`); byte spans count bytes of the text, and a span that cuts a
UTF-8 character is refused.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from pathlib import Path

from svattn.cli.inputs import check_file, nonnegative_int, positive_float, positive_int
from svattn.cli.verdict import print_verdict

__all__ = ["forget_arguments", "forget_run", "generate_arguments", "generate_run",
           "verify_forget_arguments", "verify_forget_run"]


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
        return nonnegative_int(text)
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


def generate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, metavar="CHECKPOINT",
                        help="a ckpt.pt of svattn train, or a recall run's ckpt.pt / model.pt")
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", default=None, metavar="TEXT", help="the prompt (UTF-8)")
    prompt.add_argument("--prompt-file", type=Path, default=None, metavar="PATH",
                        help="read the prompt's bytes from a file")
    parser.add_argument("-n", type=nonnegative_int, default=200, metavar="N",
                        help="bytes to generate (default: 200)")
    parser.add_argument("--temperature", type=float, default=1.0, metavar="T",
                        help="sampling temperature, 0 for greedy (default: 1.0)")
    parser.add_argument("--top-k", type=positive_int, default=None, metavar="K",
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


def generate_run(args: argparse.Namespace) -> int:
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

    from svattn.lm.load import load_checkpoint_model

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


def forget_arguments(parser: argparse.ArgumentParser) -> None:
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


def forget_run(args: argparse.Namespace) -> int:
    check_file(args.checkpoint, "CHECKPOINT")
    if not (args.stream / "stream.json").is_file():
        raise FileNotFoundError(f"STREAM: no saved stream at {args.stream} (no stream.json)")
    if args.signing_key is not None:
        check_file(args.signing_key, "--signing-key")
    if args.occurrence is not None and args.text is None:
        raise ValueError("--occurrence picks among the occurrences of --text")
    _check_new_file(args.receipt, "--receipt", args.force)
    from svattn.lm.load import load_checkpoint_model
    from svattn.lm.stream import LMStream
    from svattn.lm.stream_folder import MANIFEST, read_manifest

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


def verify_forget_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("checkpoint", type=Path, metavar="CHECKPOINT",
                        help="the ckpt.pt the stream was read with")
    parser.add_argument("stream", type=Path, metavar="STREAM", help="a folder of LMStream.save")
    parser.add_argument("receipt", type=Path, metavar="RECEIPT",
                        help="the erasure receipt (JSON, ModelErasureReceipt.to_json)")
    parser.add_argument("--tol", type=positive_float, default=1e-9,
                        help="tolerance on logits and memory readouts (default: 1e-9)")
    parser.add_argument("--public-key", type=Path, metavar="KEY", default=None,
                        help="the controller's Ed25519 public key (svattn keygen): the "
                             "receipt must carry its valid signature")
    parser.epilog = _VERIFY_EXITS


def verify_forget_run(args: argparse.Namespace) -> int:
    check_file(args.checkpoint, "CHECKPOINT")  # before the imports (seconds)
    check_file(args.receipt, "RECEIPT")
    if args.public_key is not None:
        check_file(args.public_key, "--public-key")
    if not args.stream.is_dir():
        raise FileNotFoundError(f"STREAM: no such folder: {args.stream}")
    from svattn.lm.forget import ModelErasureReceipt, verify_forget
    from svattn.lm.load import load_checkpoint_model
    from svattn.lm.stream import LMStream, StreamIntegrityError

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
    print_verdict(report.verdict)
    print(report.summary())
    return report.exit_status
