"""One verification model for every receipt svattn issues.

Each receipt type (:class:`~svattn.exact.DeletionCertificate`,
:class:`~svattn.exact.records.certificate.ErasureReceipt`,
:class:`svattn.lm.forget.ModelErasureReceipt`, :class:`svattn.estimators.ForgetReceipt`)
declares, in its class attribute ``CHECKS``, every field it has and what *binds* that
field: which checks catch any edit of it to another well-formed value. The checks are

* ``state``: the state the receipt describes (a memory, a stream, a model), as it is
  right after the operation (or, with a log, any later state of it); a stream's state
  includes its hash-chained forget log, which binds its receipts at any later time;
* ``log``: the memory's hash-chained audit log (``--log``);
* ``signature``: the controller's Ed25519 signature, checked with its public key
  (``--public-key``);
* ``optimality``: the optimality proof of the remaining tokens, from their keys: the
  KKT conditions and the uniqueness test recomputed without the memory's caches
  (:mod:`svattn.exact.auditor.optimality`; a convex QP's feasible KKT point is its
  optimum);
* ``re-solve``: a from-scratch solve of the remaining tokens (the independent oracle);
* ``re-stream``: a fresh stream of the remaining text;
* ``form``: parsing (types, ranges, version): always run.

A verifier records which checks it ran; :func:`judge` turns that and its failures
into a :class:`Verdict`: every field checked and passed (``VERIFIED``, exit status 0),
a failure (``FAILED``, 1), or nothing failed but some fields were not checked by
anything that ran (``UNCHECKED``, 3: the verdict names each with what would check
it). Nothing prints a bare ``VERIFIED`` over an unchecked field. ``CLAIMS`` of a type
are what it asserts beyond its fields (that the state is the exact optimum), checked
the same way. ``docs/design.md`` ("Receipts: fields and what checks each") is
:func:`checks_table` of the four declarations; ``tests/test_receipts.py`` holds
the two equal.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

STATE, LOG, SIGNATURE, OPTIMALITY, RESOLVE, RESTREAM, FORM = (
    "state", "log", "signature", "optimality", "re-solve", "re-stream", "form")
CHECK_NAMES = (STATE, LOG, SIGNATURE, OPTIMALITY, RESOLVE, RESTREAM, FORM)
WHAT_RUNS = {  # what a caller gives for a check to run
    STATE: "the state the receipt describes",
    LOG: "the audit log (--log / log=)",
    SIGNATURE: "the controller's public key (--public-key / public_key=)",
    OPTIMALITY: "the optimality proof from the keys (retrain=True, the default)",
    RESOLVE: "a dense re-solve from scratch (oracle=True / --oracle)",
    RESTREAM: "a re-stream from scratch",
    FORM: "parsing",
}
VERIFIED, UNCHECKED, FAILED = "VERIFIED", "UNCHECKED", "FAILED"
EXIT_STATUS = {VERIFIED: 0, FAILED: 1, UNCHECKED: 3}
"""Exit status of a verifying command per verdict (2 stays a usage error)."""
AUTHENTICITY = "the log's authenticity"
"""What a failure of the log's checkpoint is charged to: no receipt field, but the
checkpoint that binds every log entry a receipt is checked against."""


@dataclass(frozen=True)
class Verdict:
    """What a verifier checked of a receipt, what failed and what it could not check.

    Attributes
    ----------
    receipt : str
        The receipt type's name.
    ran : tuple of str
        The checks that ran (:data:`CHECK_NAMES`).
    checked : tuple of str
        Fields (and claims) some check that ran binds, and that no failure names.
    failed : tuple of str
        Fields (and claims) a failure names; ``"(other)"`` for a failure that names none.
    unchecked : tuple of (str, tuple of str)
        Fields no check that ran binds, each with the checks that would.
    reasons : tuple of str
        Every failure, as the verifier worded it.
    authenticity_unchecked : tuple of str
        What of the log's authenticity (its checkpoint, the checkpoint's signature)
        could not be checked, each with what would check it: a log anyone could have
        rewritten binds nothing, so the verdict is then at best UNCHECKED.
    """

    receipt: str
    ran: tuple[str, ...]
    checked: tuple[str, ...]
    failed: tuple[str, ...]
    unchecked: tuple[tuple[str, tuple[str, ...]], ...]
    reasons: tuple[str, ...]
    authenticity_unchecked: tuple[str, ...] = ()

    @property
    def status(self) -> str:
        """``"FAILED"``, ``"UNCHECKED"`` (nothing failed, some field or the log's
        authenticity unchecked) or ``"VERIFIED"`` (every field checked and passed)."""
        if self.reasons:
            return FAILED
        return UNCHECKED if self.unchecked or self.authenticity_unchecked else VERIFIED

    @property
    def exit_status(self) -> int:
        """0 (VERIFIED), 1 (FAILED) or 3 (UNCHECKED)."""
        return EXIT_STATUS[self.status]

    def unchecked_line(self) -> str:
        """The unchecked fields grouped by what would check them (empty when none)."""
        groups: dict[tuple[str, ...], list[str]] = {}
        for name, checks in self.unchecked:
            groups.setdefault(checks, []).append(name)
        parts = [f"{', '.join(names)} (" + " or ".join(WHAT_RUNS[c] for c in checks) + ")"
                 for checks, names in groups.items()]
        return "; ".join(parts)

    def authenticity_line(self) -> str:
        """What of the log's authenticity was not checked (empty when all was)."""
        return "; ".join(self.authenticity_unchecked)

    def headline(self) -> str:
        """The verdict word, with the unchecked fields when there are any."""
        if self.status == UNCHECKED:
            parts = []
            if self.unchecked:
                parts.append(f"{len(self.unchecked)} field(s) were not checked: "
                             f"{self.unchecked_line()}")
            if self.authenticity_unchecked:
                parts.append(f"the log's authenticity is unchecked: {self.authenticity_line()}")
            return "UNCHECKED: nothing failed, but " + "; and ".join(parts)
        if self.status == FAILED:
            return f"FAILED ({', '.join(self.failed)})"
        return "VERIFIED"


class HasVerdict:
    """What a verification result (``ok``: nothing failed; ``verdict``: the
    :class:`Verdict` on the receipt's fields, or None) says as one word and one exit
    status. Mixed into each verifier's result class."""

    ok: bool
    verdict: Verdict | None

    @property
    def status(self) -> str:
        """``"VERIFIED"`` (every field checked and passed), ``"UNCHECKED"`` (nothing
        failed, a field unchecked) or ``"FAILED"``."""
        return self.verdict.status if self.verdict is not None else (
            VERIFIED if self.ok else FAILED)

    @property
    def exit_status(self) -> int:
        """0 (VERIFIED), 1 (FAILED) or 3 (UNCHECKED): a verifying command's exit status."""
        return EXIT_STATUS[self.status]

    @property
    def complete(self) -> bool:
        """Every field checked, and nothing failed."""
        return self.status == VERIFIED


def field_of(reason: str, names: Iterable[str]) -> str | None:
    """The field a failure names: ``reason`` starts with it and ``:`` or a space."""
    for name in sorted(names, key=len, reverse=True):
        if reason.startswith((f"{name}:", f"{name} ", f"{name}[")):
            return name
    return None


def judge(receipt, ran: Iterable[str], reasons: Iterable[str], *,
          blame: Mapping[str, str] | None = None,
          partial: Mapping[str, Iterable[str]] | None = None,
          authenticity_unchecked: Iterable[str] = ()) -> Verdict:
    """The :class:`Verdict` on ``receipt`` (its type's ``CHECKS`` and ``CLAIMS``) given
    the checks that ran and the failures.

    ``blame`` maps the first words of failures that do not start with a field name to
    the field or claim they concern (else :func:`field_of` decides, ``"(other)"`` when
    it cannot). ``partial`` names, per field, checks that ran but could not bind it this
    time (a log of an older format). An unsigned receipt (``signer`` and ``signature``
    both None) claims no signature: those two fields are then checked by their form.
    ``authenticity_unchecked``: what of the log's authenticity could not be checked
    (:attr:`Verdict.authenticity_unchecked`).
    """
    kind = type(receipt)
    ran = tuple(c for c in CHECK_NAMES if c in set(ran) | {FORM})
    reasons = tuple(reasons)
    decl = declaration(kind)
    failed: list[str] = []
    for r in reasons:
        name = field_of(r, decl) or (AUTHENTICITY if r.startswith(AUTHENTICITY) else None) \
            or next(
            (f for head, f in (blame or {}).items() if r.startswith(head)), "(other)")
        if name not in failed:
            failed.append(name)
    unsigned = {"signer", "signature"} <= set(decl) and getattr(receipt, "signer", 0) is None \
        and getattr(receipt, "signature", 0) is None
    checked, unchecked = [], []
    for name, checks in decl.items():
        if name in failed:
            continue
        bound = set(checks) & set(ran) - set((partial or {}).get(name, ()))
        if bound or (unsigned and name in ("signer", "signature")):
            checked.append(name)
        else:
            unchecked.append((name, checks))
    return Verdict(kind.__name__, ran, tuple(checked), tuple(failed), tuple(unchecked), reasons,
                   tuple(dict.fromkeys(authenticity_unchecked)))


def with_authenticity(verdict: Verdict, failed: Iterable[str] = (),
                      unchecked: Iterable[str] = ()) -> Verdict:
    """``verdict`` with what a check of the log's authenticity found: each failure
    (worded for people) added to the reasons, charged to :data:`AUTHENTICITY`; what it
    could not check to :attr:`Verdict.authenticity_unchecked`."""
    failed = tuple(f"{AUTHENTICITY}: {f}" for f in failed)
    names = verdict.failed + ((AUTHENTICITY,) if failed and AUTHENTICITY not in
                              verdict.failed else ())
    return dataclasses.replace(
        verdict, failed=names, reasons=verdict.reasons + failed,
        authenticity_unchecked=tuple(dict.fromkeys(verdict.authenticity_unchecked
                                                   + tuple(unchecked))))


def declaration(kind: type) -> dict[str, tuple[str, ...]]:
    """Every field of ``kind`` (``CHECKS``) and claim (``CLAIMS``) with what checks it."""
    return {**kind.CHECKS, **getattr(kind, "CLAIMS", {})}


def declaration_errors(kind: type) -> list[str]:
    """Why ``kind``'s declaration is not a contract: a dataclass field it leaves out, a
    name that is no field, a field with no check, an unknown check (empty: sound)."""
    fields = [f.name for f in dataclasses.fields(kind)]
    decl = kind.CHECKS
    errs = [f"{kind.__name__}.{f}: not declared" for f in fields if f not in decl]
    errs += [f"{kind.__name__}.{f}: declared, but no field" for f in decl if f not in fields]
    for name, checks in declaration(kind).items():
        if not checks:
            errs.append(f"{kind.__name__}.{name}: nothing checks it")
        errs += [f"{kind.__name__}.{name}: unknown check {c!r}" for c in checks
                 if c not in CHECK_NAMES]
    return errs


def edited_values(value) -> list:
    """Other values of ``value``'s kind, for a tamper harness: well-formed where that is
    easy (so only a check that binds the field can catch them), one or two per value.

    Examples
    --------
    >>> edited_values(3), edited_values("ab12"), edited_values([1, 2]), edited_values(None)[0][:4]
    ([4, 2], ['0b12'], [[2, 2], [1]], 'abab')
    """
    if isinstance(value, bool):
        return [not value]
    if isinstance(value, int):
        return [value + 1] + ([value - 1] if value > 0 else [])
    if isinstance(value, float):
        return [value * 2 + 1e-3]
    if isinstance(value, str):
        if value and all(c in "0123456789abcdef" for c in value):
            return [("0" if value[0] != "0" else "1") + value[1:]]
        return [value + "x"]
    if value is None:
        return ["ab" * 32]
    if dataclasses.is_dataclass(value):
        first = dataclasses.fields(value)[0].name
        return [dataclasses.replace(value, **{first: edited_values(getattr(value, first))[0]})]
    if isinstance(value, (list, tuple)):
        if not value:
            return [type(value)([0])]
        return [type(value)([edited_values(value[0])[0], *value[1:]]), type(value)(value[:-1])]
    if isinstance(value, dict):
        if not value:
            return [{"0": [1]}]
        k = sorted(value)[0]
        return [{**value, k: edited_values(value[k])[0]}]
    raise TypeError(f"no edits of a {type(value).__name__}")


def tamper_outcome(verdict: Verdict, name: str) -> str:
    """How a verdict met an edit of field ``name``: ``"failed"``, ``"unchecked"`` (the
    field among the unchecked), ``"VERIFIED"`` or ``"claimed checked"`` (both lies)."""
    if verdict.status == FAILED:
        return "failed"
    if verdict.status == VERIFIED:
        return "VERIFIED"
    return "unchecked" if name in dict(verdict.unchecked) else "claimed checked"


def checks_table(kinds: Iterable[type]) -> str:
    """The Markdown table of the declarations of ``kinds``: one row per field or claim,
    one column per check (``x``: it binds the field)."""
    cols = [c for c in CHECK_NAMES]
    lines = ["| receipt | field | " + " | ".join(cols) + " |",
             "|---|---|" + "|".join(":-:" for _ in cols) + "|"]
    for kind in kinds:
        for name, checks in declaration(kind).items():
            label = f"*{name}*" if name in getattr(kind, "CLAIMS", {}) else f"`{name}`"
            lines.append(f"| {kind.__name__} | {label} | "
                         + " | ".join("x" if c in checks else "" for c in cols) + " |")
    return "\n".join(lines)


__all__ = ["AUTHENTICITY", "CHECK_NAMES", "EXIT_STATUS", "FAILED", "FORM", "LOG", "RESOLVE",
           "RESTREAM", "SIGNATURE", "STATE", "UNCHECKED", "VERIFIED", "HasVerdict", "Verdict",
           "WHAT_RUNS",
           "checks_table", "declaration", "declaration_errors", "edited_values", "field_of",
           "judge", "tamper_outcome", "with_authenticity"]
