"""What a forget of a language-model stream addresses, and what it hands back.

A caller reads the stream's text (:attr:`LMStream.text <svattn.lm.stream.LMStream.text>`,
the *held* text: every forgotten span already removed) and names bytes in it: a span of
held positions (:meth:`LMStream.forget`) or an exact byte string
(:meth:`LMStream.forget_text`). The stream keeps the *fed* position of every held byte
(its index among every byte ever fed), and each forget, with its
:class:`~svattn.lm.forget.ModelErasureReceipt`, removes one run of consecutive fed
positions. This module turns what the caller named into those runs
(:func:`fed_runs`, :func:`occurrences`, :func:`choose`) and holds what a forget returns
(:class:`ForgetResult`): the receipts, and the removed bytes themselves, which go to the
caller and never into a receipt or a saved folder.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from svattn.lm.forget import ModelErasureReceipt

__all__ = ["ForgetResult", "ForgottenSpan", "as_needle", "choose", "fed_runs", "occurrences",
           "span_ints", "text_sha256"]


@dataclass(frozen=True)
class ForgottenSpan:
    """One run of consecutive fed positions a forget removed.

    Attributes
    ----------
    held_span : (int, int)
        ``[a, b)`` in the held text as it stood when the forget was called (what the
        caller saw in ``stream.text``; also ``receipt.held_span``).
    fed_span : (int, int)
        The same bytes' fed positions (``receipt.fed_span``).
    removed : bytes
        The bytes removed: for the caller to check, held by no receipt and no saved file.
    receipt : ModelErasureReceipt
        The evidence of this removal (:func:`svattn.lm.forget.verify_forget`).
    """

    held_span: tuple[int, int]
    fed_span: tuple[int, int]
    removed: bytes
    receipt: ModelErasureReceipt = field(repr=False)


@dataclass(frozen=True)
class ForgetResult:
    """What one call of :meth:`LMStream.forget`, :meth:`~LMStream.forget_fed` or
    :meth:`~LMStream.forget_text` removed.

    A span the caller names is one contiguous piece of the held text, but where it
    crosses the place of an earlier forget its bytes were not fed contiguously: it is
    then removed as several runs, each with its own receipt.

    Attributes
    ----------
    spans : tuple of ForgottenSpan
        The runs removed, in text order (held positions of the text at the call).
    text_sha256 : str
        SHA-256 of the text the stream holds afterwards.
    """

    spans: tuple[ForgottenSpan, ...]
    text_sha256: str

    @property
    def removed(self) -> bytes:
        """Every removed byte, in text order."""
        return b"".join(s.removed for s in self.spans)

    @property
    def receipts(self) -> list[ModelErasureReceipt]:
        """One receipt per run, in text order."""
        return [s.receipt for s in self.spans]

    @property
    def receipt(self) -> ModelErasureReceipt:
        """The receipt, when the forget removed one run.

        Raises
        ------
        ValueError
            It removed several runs: read :attr:`receipts`.
        """
        if len(self.spans) != 1:
            raise ValueError(f"this forget removed {len(self.spans)} runs of fed positions, "
                             "each with its own receipt: read .receipts")
        return self.spans[0].receipt

    def describe(self) -> str:
        """One line per run: held and fed span and the removed bytes; then the digest."""
        lines = [f"forgot held [{s.held_span[0]}, {s.held_span[1]}) (fed [{s.fed_span[0]}, "
                 f"{s.fed_span[1]})): {s.removed!r}" for s in self.spans]
        return "\n".join(lines + [f"remaining text SHA-256: {self.text_sha256}"])


def text_sha256(text: bytes) -> str:
    """SHA-256 (hex) of a held text."""
    return hashlib.sha256(text).hexdigest()


def fed_runs(origin: list[int], a: int, b: int) -> list[tuple[tuple[int, int],
                                                             tuple[int, int]]]:
    """Held ``[a, b)`` split into runs of consecutive fed positions: ``[(held, fed), ...]``
    in text order (``origin``: the fed position of every held byte, increasing)."""
    o = np.asarray(origin[a:b], dtype=np.int64)
    cuts = [0, *(np.flatnonzero(np.diff(o) != 1) + 1).tolist(), b - a]
    return [((a + i, a + j), (int(o[i]), int(o[j - 1]) + 1))
            for i, j in zip(cuts[:-1], cuts[1:], strict=True)]


def span_ints(start, stop) -> tuple[int, int]:
    """``start`` and ``stop`` as ints; ``ValueError`` naming the one that is not."""
    for name, val in (("start", start), ("stop", stop)):
        if isinstance(val, bool) or not isinstance(val, (int, np.integer)):
            raise ValueError(f"{name} must be an int, got {val!r}")
    return int(start), int(stop)


def occurrences(text: bytes, needle: bytes) -> list[int]:
    """Offsets of ``needle`` in ``text``, left to right, not overlapping (as
    ``bytes.count`` counts them)."""
    out, i = [], text.find(needle)
    while i >= 0:
        out.append(i)
        i = text.find(needle, i + len(needle))
    return out


def as_needle(needle) -> bytes:
    """``needle`` as bytes (a ``str`` is encoded as UTF-8); ``ValueError`` if empty or
    of another type."""
    if isinstance(needle, str):
        needle = needle.encode("utf-8")
    if not isinstance(needle, (bytes, bytearray)):
        raise ValueError(f"needle must be bytes or a str (UTF-8), got {type(needle).__name__}")
    if not needle:
        raise ValueError("needle is empty: name the bytes to forget")
    return bytes(needle)


def _preview(needle: bytes) -> str:
    return repr(needle) if len(needle) <= 40 else f"{needle[:40]!r}… ({len(needle)} bytes)"


def choose(text: bytes, needle: bytes, occurrence) -> list[int]:
    """The offsets in ``text`` of the occurrences of ``needle`` to forget.

    ``occurrence``: None (there must be exactly one), ``"all"``, or an int ``n >= 0``
    (the n-th, counting from 0, as :func:`occurrences` lists them).

    Raises
    ------
    ValueError
        ``needle`` absent; several occurrences and ``occurrence`` None (ambiguous: the
        message gives the count and offsets); ``n`` out of range; a bad ``occurrence``.
    """
    if not (occurrence is None or occurrence == "all" or (
            isinstance(occurrence, (int, np.integer)) and not isinstance(occurrence, bool)
            and occurrence >= 0)):
        raise ValueError(f"occurrence must be None, 'all' or an int >= 0, got {occurrence!r}")
    found = occurrences(text, needle)
    if not found:
        raise ValueError(f"{_preview(needle)} does not occur in the stream's held text "
                         f"({len(text)} bytes): nothing forgotten")
    where = ", ".join(map(str, found[:10])) + (", …" if len(found) > 10 else "")
    if occurrence == "all":
        return found
    if occurrence is None:
        if len(found) > 1:
            raise ValueError(f"{_preview(needle)} occurs {len(found)} times in the held text "
                             f"(at offsets {where}): ambiguous, nothing forgotten; name "
                             f"one (occurrence 0..{len(found) - 1}) or all of them")
        return found
    if occurrence >= len(found):
        raise ValueError(f"occurrence {occurrence}: {_preview(needle)} occurs "
                         f"{len(found)} time{'s' if len(found) > 1 else ''} (at offsets "
                         f"{where}), counted from 0")
    return [found[int(occurrence)]]
