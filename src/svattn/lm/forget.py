"""Model-level erasure: the receipt of :meth:`LMStream.forget` and its verification.

:meth:`svattn.lm.stream.LMStream.forget` deletes a span of what a stream read. Its
:class:`ModelErasureReceipt` bundles

* per hybrid layer and head, the :class:`~svattn.exact.DeletionCertificate` of every
  span token the memory the stream continues with held (each an exact decremental
  removal), a summary of the other removals the rewind made (tokens of the chunk grid
  from the span's chunk on, re-added by the replay), and how many tokens (span tokens
  among them) only the memory released for an earlier snapshot held;
* the repair record: the prefix kept untouched, the positions each memory rewound,
  the bytes replayed;
* :meth:`LMStream.digest` afterwards: the model, the text held, the positions held
  by every memory, the fed positions, the spans forgotten and the stream's
  hash-chained forget log, whose entry for this forget holds the SHA-256 of the
  receipt's body (every field but ``state_digest`` and ``signature``);
* with ``LMStream(signing_key=...)``, the controller's Ed25519 signature over every
  other field (:mod:`svattn.exact.records.signing`).

The receipt never holds the forgotten bytes, their hash, or any key, value or hidden
state of the span (the certificates' commitments are the memories' own, see
docs/design.md §4.1).

:func:`verify_forget` checks a stream against a receipt: the receipt's body is an
entry of the stream's forget log (which binds every field; a stream that never forgot
has no such entry), its spans and counts agree with the stream's forgotten list, every
memory's certificates are there and match their memory, its digest is the stream's
(or, after more feeds and forgets, the digest the log recorded for it: *checked
later*), and re-streaming the text from scratch gives the same content digest,
logits and readouts. Every field's check is declared in ``ModelErasureReceipt.CHECKS``
(:mod:`svattn.exact.records.receipts`).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass, field, fields
from datetime import UTC, datetime
from typing import ClassVar

import numpy as np

from svattn.exact import DeletionCertificate
from svattn.exact.records.certificate import (
    certificate_dict_errors,
    finite_number,
    no_duplicate_keys,
    signer_errors,
)
from svattn.exact.records.receipts import (
    FORM,
    RESTREAM,
    SIGNATURE,
    STATE,
    HasVerdict,
    Verdict,
    judge,
    with_authenticity,
)
from svattn.exact.records.signing import load_public_key, signature_errors
from svattn.lm.forget_log import canonical_json, check_checkpoint

__all__ = ["ModelErasureReceipt", "ForgetVerification", "verify_forget", "forget_entry_hash"]

RECEIPT_KIND = "svattn.ModelErasureReceipt"
RECEIPT_VERSION = 2  # 2: signer and signature; bound by the stream's forget log
_HEX = frozenset("0123456789abcdef")
_MEMORY_KEYS = {"layer", "head", "span_certificates", "rewound", "rewound_unique", "released",
                "span_released", "max_kkt_residual", "rewind_s"}
_REPAIR_KEYS = {"kept_prefix", "replayed", "rewound", "released", "seconds"}


def forget_entry_hash(entry: dict) -> str:
    """SHA-256 (hex) of one entry of a stream's forget log (its canonical JSON)."""
    return hashlib.sha256(canonical_json(entry)).hexdigest()


def chained_digest(state: str, head: str | None) -> str:
    """A stream's digest: its state part (``LMStream.state_part``) and the hash of the
    last entry of its forget log (None: it never forgot)."""
    return hashlib.sha256(canonical_json({"format": "svattn.LMStream.digest-v2",
                                          "state": state, "forget_log": head})).hexdigest()


#: The claim only the state right after the forget checks: checked later, the log does
#: not attest what was fed since, so a stream fed the span again is not caught.
REFED = "nothing fed since the forget holds the forgotten span"


@dataclass(frozen=True)
class ModelErasureReceipt:
    """What :meth:`LMStream.forget` did, and the state it left.

    Attributes
    ----------
    model_digest : str
        :func:`svattn.lm.stream.model_digest` of the model the stream runs.
    fed_span : [start, stop]
        The fed positions forgotten.
    held_span : [a, b]
        The same span in the text the stream held before (earlier forgets removed).
    n_forgotten, n_before, n_after : int
        Bytes forgotten; bytes held before and after.
    repair : dict
        ``kept_prefix`` (held positions untouched), ``replayed`` (bytes fed again),
        ``rewound`` (per layer: ``[first, end)`` positions its memories removed),
        ``released`` (per layer: ``[end, old end)`` positions held only by the memories
        released for a snapshot),
        ``seconds`` (wall time of the rewind and of the replay).
    memories : list of dict
        Per hybrid layer and head (every one of them): ``layer``, ``head``,
        ``span_certificates`` (dicts of :class:`~svattn.exact.DeletionCertificate`, one
        per span token the memory held), ``rewound`` (other tokens removed and
        re-added), ``rewound_unique`` (whether every removal claimed a unique optimum),
        ``released`` (tokens held only by the memory the stream released for an earlier
        snapshot, see ``LMStream(snapshot_every=)``) and ``span_released`` (span tokens
        among them: no certificate, that memory object is gone), ``max_kkt_residual``,
        ``rewind_s`` (seconds its removals took).
    state_digest : str
        :meth:`LMStream.digest` after the forget (it covers the stream's forget log,
        whose last entry holds :meth:`body_sha256` of this receipt).
    issued_at : str
    kind, version
    signer, signature : str or None
        With a signing stream: the SHA-256 of the controller's Ed25519 public key and
        the signature over every other field (:meth:`signed_bytes`).
    """

    # What binds each field (svattn.exact.records.receipts). "state": the stream's forget log
    # holds the SHA-256 of every field but state_digest and signature, and the stream's
    # digest covers the log; state_digest is the stream's digest (or, checked later, the
    # one its log entry fixes).
    CHECKS: ClassVar[dict[str, tuple[str, ...]]] = {
        "model_digest": (STATE, SIGNATURE),
        "fed_span": (STATE, SIGNATURE),
        "held_span": (STATE, SIGNATURE),
        "n_forgotten": (STATE, SIGNATURE),
        "n_before": (STATE, SIGNATURE),
        "n_after": (STATE, SIGNATURE),
        "repair": (STATE, SIGNATURE),
        "memories": (STATE, SIGNATURE),
        "state_digest": (STATE, SIGNATURE),
        "issued_at": (STATE, SIGNATURE),
        "kind": (FORM,),
        "version": (FORM,),
        "signer": (STATE, SIGNATURE),
        "signature": (SIGNATURE,),
    }
    CLAIMS: ClassVar[dict[str, tuple[str, ...]]] = {
        "the stream equals a fresh stream of its text": (RESTREAM,),
        # checked later (the stream moved on) the forget log attests the forgets, not the
        # feeds since: bytes fed again after the forget are not caught, so then unchecked
        REFED: (STATE,)}

    model_digest: str
    fed_span: list[int]
    held_span: list[int]
    n_forgotten: int
    n_before: int
    n_after: int
    repair: dict
    memories: list[dict]
    state_digest: str
    issued_at: str = ""
    kind: str = RECEIPT_KIND
    version: int = RECEIPT_VERSION
    signer: str | None = None
    signature: str | None = None

    @classmethod
    def issue(cls, stream, *, fed_span, span, n_before: int, removed: list[dict],
              seconds: dict | None = None, signer: str | None = None,
              kept: int | None = None) -> ModelErasureReceipt:
        """Build the receipt's body from a stream after its forget (``removed``: what
        :meth:`LMStream.rewind` returned; ``kept``: the held positions it kept, the
        span's start unless a recurrent layer rewound further); ``state_digest`` is left
        empty for the stream to fill in once its forget log holds the body
        (:meth:`LMStream.forget`)."""
        a, b = span
        kept = a if kept is None else kept
        memories, rewound, released = [], {}, {}
        for r in removed:
            first, end = r["positions"]
            rewound[str(r["layer"])] = [first, end]
            released[str(r["layer"])] = list(r["released"])
            lo, hi = r["released"]
            span_certs, other = [], []
            for p, cert in zip(range(first, end), r["certificates"], strict=True):
                (span_certs if a <= p < b else other).append(cert)
            every = span_certs + other
            memories.append({
                "layer": r["layer"], "head": r["head"],
                "span_certificates": [asdict(c) for c in span_certs],
                "rewound": len(other),
                "released": hi - lo,
                "span_released": max(0, min(b, hi) - max(a, lo)),
                "rewound_unique": all(c.unique_optimum for c in other),
                "max_kkt_residual": max((c.kkt_residual_after for c in every), default=0.0),
                "rewind_s": r["seconds"],
            })
        return cls(
            model_digest=stream.model_digest, fed_span=list(fed_span), held_span=[a, b],
            n_forgotten=b - a, n_before=n_before, n_after=len(stream),
            repair={"kept_prefix": kept, "replayed": n_before - b + a - kept,
                    "rewound": rewound,
                    "released": released,
                    "seconds": dict(seconds or {})},
            memories=memories, state_digest="",
            issued_at=datetime.now(UTC).isoformat(timespec="seconds"), signer=signer,
        )

    def body_sha256(self) -> str:
        """SHA-256 (hex) of every field but ``state_digest`` and ``signature``: what the
        stream's forget log keeps of this receipt."""
        body = {k: v for k, v in asdict(self).items() if k not in ("state_digest", "signature")}
        return hashlib.sha256(b"svattn-model-erasure-body-v2|" + canonical_json(body)).hexdigest()

    def signed_bytes(self) -> bytes:
        """What a signature covers: the canonical JSON of every field but ``signature``."""
        body = {k: v for k, v in asdict(self).items() if k != "signature"}
        return b"svattn-model-erasure-receipt-v2|" + canonical_json(body)

    def certificates(self) -> list[DeletionCertificate]:
        """Every span certificate, as :class:`~svattn.exact.DeletionCertificate`."""
        return [DeletionCertificate(**c) for m in self.memories for c in m["span_certificates"]]

    def to_json(self) -> str:
        """JSON (round-trips through :meth:`from_json`)."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelErasureReceipt:
        """Parse :meth:`to_json`'s output; precise errors (``ValueError``) on anything
        else, nested fields included."""
        try:
            data = json.loads(text, object_pairs_hook=no_duplicate_keys)
        except json.JSONDecodeError as exc:
            raise ValueError(f"receipt: not JSON ({exc})") from None
        except ValueError as exc:
            raise ValueError(f"receipt: {exc}") from None
        except RecursionError:
            raise ValueError("receipt: JSON nested too deeply") from None
        if not isinstance(data, dict) or data.get("kind") != RECEIPT_KIND:
            raise ValueError(f"receipt: not a {RECEIPT_KIND} (kind = "
                             f"{data.get('kind') if isinstance(data, dict) else None!r})")
        if data.get("version") != RECEIPT_VERSION:
            raise ValueError(f"receipt: version {data.get('version')!r} is not supported "
                             f"(expected {RECEIPT_VERSION})")
        names = {f.name for f in fields(cls)}
        missing = sorted(names - set(data) - {"issued_at", "signer", "signature"})
        extra = sorted(set(data) - names)
        if missing or extra:
            raise ValueError(f"receipt: missing fields {missing}, unknown fields {extra}")
        receipt = cls(**data)
        errs = receipt.field_errors()
        if errs:
            raise ValueError("receipt: " + "; ".join(errs))
        return receipt

    def field_errors(self) -> list[str]:
        """Fields of the wrong type or form, nested ones included, each named (empty
        list when well-formed)."""
        errs = []

        def integer(v, lo: int = 0) -> bool:
            return isinstance(v, int) and not isinstance(v, bool) and v >= lo

        def span(v) -> bool:
            return (isinstance(v, list) and len(v) == 2 and all(integer(x) for x in v)
                    and v[0] < v[1])

        def hex64(v) -> bool:
            return isinstance(v, str) and len(v) == 64 and all(c in _HEX for c in v)

        def number(v) -> bool:
            return isinstance(v, (int, float)) and not isinstance(v, bool) and finite_number(v)

        if not hex64(self.model_digest):
            errs.append("model_digest must be 64 lowercase hex digits")
        for name in ("fed_span", "held_span"):
            if not span(getattr(self, name)):
                errs.append(f"{name} must be [start, stop], ints with 0 <= start < stop, got "
                            f"{getattr(self, name)!r}")
        for name, lo in (("n_forgotten", 1), ("n_before", 1), ("n_after", 0)):
            if not integer(getattr(self, name), lo):
                errs.append(f"{name} must be an int >= {lo}, got {getattr(self, name)!r}")
        rep = self.repair
        if not (isinstance(rep, dict) and set(rep) == _REPAIR_KEYS
                and integer(rep["kept_prefix"]) and integer(rep["replayed"])
                and all(isinstance(d, dict) and all(
                    isinstance(k, str) and isinstance(v, list) and len(v) == 2
                    and all(integer(x) for x in v) for k, v in d.items())
                    for d in (rep["rewound"], rep["released"]))
                and isinstance(rep["seconds"], dict)
                and all(isinstance(k, str) and number(v) for k, v in rep["seconds"].items())):
            errs.append(f"repair must hold exactly {sorted(_REPAIR_KEYS)}: two counts, "
                        "per-layer [first, end) lists and wall times")
        if not isinstance(self.memories, list):
            errs.append(f"memories must be a list of per-memory records, got "
                        f"{type(self.memories).__name__}")
        else:
            for k, m in enumerate(self.memories):
                if not isinstance(m, dict) or set(m) != _MEMORY_KEYS:
                    errs.append(f"memories[{k}] must be an object with exactly the fields "
                                f"{sorted(_MEMORY_KEYS)}")
                    continue
                if not all(integer(m[f]) for f in ("layer", "head", "rewound", "released",
                                                   "span_released")):
                    errs.append(f"memories[{k}]: layer, head, rewound, released and "
                                "span_released must be ints >= 0")
                if not (isinstance(m["rewound_unique"], bool) and number(m["max_kkt_residual"])
                        and number(m["rewind_s"])):
                    errs.append(f"memories[{k}]: rewound_unique must be a bool, "
                                "max_kkt_residual and rewind_s numbers")
                certs = m["span_certificates"]
                if not isinstance(certs, list):
                    errs.append(f"memories[{k}]: span_certificates must be a list")
                    continue
                for j, c in enumerate(certs):
                    errs += [f"memories[{k}]: span_certificates[{j}]: {e}"
                             for e in certificate_dict_errors(c)]
        if not hex64(self.state_digest):
            errs.append("state_digest must be 64 lowercase hex digits")
        if not isinstance(self.issued_at, str):
            errs.append(f"issued_at must be a string, got {self.issued_at!r}")
        if self.kind != RECEIPT_KIND:
            errs.append(f"kind must be {RECEIPT_KIND!r}")
        if self.version != RECEIPT_VERSION:
            errs.append(f"version must be {RECEIPT_VERSION}, got {self.version!r}")
        errs += signer_errors(self.signer, self.signature)
        return errs


@dataclass
class ForgetVerification(HasVerdict):
    """Outcome of :func:`verify_forget`: ``ok`` (nothing failed), every check's numbers
    and the :class:`~svattn.exact.records.receipts.Verdict` on the receipt's fields (``status``
    is VERIFIED only when every field was checked and passed)."""

    ok: bool
    reasons: list[str] = field(default_factory=list)
    digest_matches: bool = False
    max_logit_deviation: float = float("nan")
    max_readout_deviation: float = float("nan")
    n_certificates: int = 0
    n_positions: int = 0
    logged_at: int | None = None
    later: bool = False
    signed: bool | None = None
    verdict: Verdict | None = None

    def summary(self) -> str:
        where = ("" if self.logged_at is None else
                 f"  the receipt is entry {self.logged_at} of the stream's forget log"
                 + (" (checked later: the stream moved on since)" if self.later else ""))
        same = f"the stream equals a fresh stream of its {self.n_positions} bytes"
        head = {"VERIFIED": f"VERIFIED: {same}",  # the equality is checked whenever ok
                "UNCHECKED": f"UNCHECKED: nothing failed and {same} (checked), but fields "
                             "below were not checked"}.get(self.status, f"{self.status}: "
                                                                         "see below")
        lines = [head,
                 f"  digest matches the receipt and the fresh stream: {self.digest_matches}",
                 f"  max |logit - fresh logit| over every position: {self.max_logit_deviation:.3g}",
                 f"  max |memory readout - fresh readout|: {self.max_readout_deviation:.3g}",
                 f"  span certificates checked: {self.n_certificates}"]
        if where:
            lines.append(where)
        if self.signed is not None:
            lines.append(f"  signature: {'ok' if self.signed else 'INVALID'}")
        if self.verdict is not None and self.verdict.unchecked:
            lines.append(f"  UNCHECKED (nothing checked them): {self.verdict.unchecked_line()}")
        if self.verdict is not None and self.verdict.authenticity_unchecked:
            lines.append(f"  UNCHECKED: the forget log's authenticity: "
                         f"{self.verdict.authenticity_line()}")
        return "\n".join(lines + [f"  - {r}" for r in self.reasons])


def verify_forget(stream, receipt: ModelErasureReceipt, *, tol: float = 1e-9,
                  public_key=None) -> ForgetVerification:
    """Check ``stream`` (after a forget, saved and loaded, or later: more feeds and
    forgets since) against ``receipt``.

    * **The stream's forget log** must hold the receipt's body (:meth:`~ModelErasureReceipt.
      body_sha256`) at an entry of its hash chain: this binds every field but the digest
      and the signature, and a stream that never made this forget has no such entry.
      ``fed_span`` must be among the spans the stream forgot, ``n_forgotten`` its length,
      ``held_span`` as long; every hybrid memory of the stream must have its record,
      with one certificate per span token its rewind removed.
    * **The digest**: the stream's, right after the forget; later, the digest the log
      entry fixes (the state part it recorded, chained with the entry).
    * **Each certificate** against its memory: well-formed and consistent, the memory's
      parameters, its commitment no longer held.
    * **The re-stream**: :attr:`stream.text` fed from scratch to a fresh stream of the same
      model gives the same content digest, logits at every held position and every
      memory's readout at its own keys (≤ ``tol``).
    * With ``public_key`` (an ``Ed25519PublicKey`` or a PEM path), the signature.
    * **The forget log's checkpoint** (:mod:`svattn.lm.forget_log`): the root of the
      log's entries, and with ``public_key`` signed by it. A stream that holds no key
      writes it unsigned: its authenticity is then named unchecked
      (``verdict.authenticity_unchecked``), as it is without ``public_key``: such a
      verdict is at best UNCHECKED, since whoever holds the folder could rewrite it.
    """
    errs = receipt.field_errors()
    if errs:
        return ForgetVerification(ok=False, reasons=errs, n_positions=len(stream),
                                  verdict=judge(receipt, (), errs))
    reasons: list[str] = []
    ran = {STATE, RESTREAM}
    signed = None
    if public_key is not None:
        ran.add(SIGNATURE)
        if isinstance(public_key, str) or hasattr(public_key, "__fspath__"):
            public_key = load_public_key(public_key)
        bad = signature_errors(receipt, public_key)
        signed = not bad
        reasons += bad
    if receipt.model_digest != stream.model_digest:
        reasons.append("model_digest: the receipt was issued for another model")
    at, later = _logged_at(stream, receipt, reasons)
    _spans_agree(stream, receipt, reasons)
    fresh = type(stream)(stream.model, full_policy=stream.full_policy, snapshot_every=0)
    fresh.feed(stream.text)
    content_ok = stream.content_digest() == fresh.content_digest()
    if not content_ok:
        reasons.append("the stream's content digest differs from a fresh stream's of its text")
    dev = 0.0
    if len(stream):
        dev = float((stream.all_logits() - fresh.all_logits()).abs().max())
        dev = _worst(dev, float((stream.logits() - fresh.logits()).abs().max()))
    if not dev <= tol:
        reasons.append(f"logits differ from the fresh stream's by {dev:.3g} > {tol:g}")
    rdev = kdev = 0.0
    for li, (st, fr) in enumerate(zip(stream.layers, fresh.layers, strict=True)):
        farrays = fr.arrays()
        for name, rows in st.arrays().items():  # the caches: rows of positions out of
            # every window (absorbed) do not move a logit, and could hold a forgotten key
            frows = farrays[name]
            if rows.shape == frows.shape and rows.numel():
                kdev = _worst(kdev, float((rows - frows).abs().max()))
            elif rows.shape != frows.shape:
                kdev = math.inf
        for hd, (mem, fmem) in enumerate(zip(st.mems, fr.mems, strict=True)):
            if len(mem) != len(fmem):
                reasons.append(f"layer {li} head {hd}: memory holds {len(mem)} tokens, the "
                               f"fresh one {len(fmem)}")
                continue
            if len(mem):
                probes = mem.keys
                rdev = _worst(rdev, float(np.abs(mem.readout(probes)
                                                 - fmem.readout(probes)).max()))
                # every token's data, not only the readout: a reserve token (alpha 0)
                # holding a forgotten key and value leaves every readout unchanged
                kdev = _worst(kdev, float(np.abs(probes - fmem.keys).max()),
                              float(np.abs(mem.values - fmem.values).max()))
    if not rdev <= tol:
        reasons.append(f"memory readouts differ from the fresh stream's by {rdev:.3g} > {tol:g}")
    if not kdev <= tol:
        reasons.append(f"memory or cached keys or values differ from the fresh stream's by "
                       f"{kdev:.3g} > {tol:g}")
    n_certs = _check_certificates(stream, receipt, reasons)
    # the forget log's checkpoint: its root, and with the key its signature
    _, cp_failed, cp_unchecked = check_checkpoint(
        stream.forget_log, getattr(stream, "forget_checkpoint", None), public_key)
    verdict = with_authenticity(judge(receipt, ran, reasons, blame=_CLAIMED,
                                      partial={REFED: (STATE,)} if later else None,
                                      authenticity_unchecked=cp_unchecked), cp_failed)
    reasons = list(verdict.reasons)
    return ForgetVerification(
        ok=not reasons, reasons=reasons,
        digest_matches=content_ok and (later or receipt.state_digest == stream.digest()),
        max_logit_deviation=dev, max_readout_deviation=rdev, n_certificates=n_certs,
        n_positions=len(stream), logged_at=at, later=later, signed=signed, verdict=verdict)


def _worst(*devs: float) -> float:
    """The largest deviation, NaN if any is NaN (``max`` drops a NaN that is not first:
    a NaN planted in a row would pass every ``<= tol``)."""
    return math.nan if any(d != d for d in devs) else max(devs)


_CLAIM = "the stream equals a fresh stream of its text"
_CLAIMED = {"the stream's content digest": _CLAIM, "logits differ": _CLAIM,
            "memory readouts differ": _CLAIM, "memory or cached keys or values differ": _CLAIM,
            "layer ": _CLAIM}


def _logged_at(stream, receipt: ModelErasureReceipt, reasons: list[str]
               ) -> tuple[int | None, bool]:
    """The index of the receipt's entry in the stream's forget log (None: absent) and
    whether the stream moved on since; checks the chain and the digest either way."""
    log = stream.forget_log
    prev = None
    for k, entry in enumerate(log):
        if entry.get("prev") != prev:
            reasons.append(f"the stream's forget log is broken at entry {k} (its prev is not "
                           "the hash of the entry before)")
            return None, False
        prev = forget_entry_hash(entry)
    body = receipt.body_sha256()
    found = [k for k, e in enumerate(log) if e.get("receipt") == body]
    if not found:
        spans = [e.get("fed_span") for e in log]
        which = ("fed_span: the stream never forgot it" if receipt.fed_span not in spans
                 else "the stream's forget log holds another receipt for this span (a field "
                      "of the receipt was edited)")
        reasons.append(f"{which} (the stream's forget log has {len(log)} entries)")
        return None, False
    k = found[-1]
    entry = log[k]
    if entry.get("fed_span") != receipt.fed_span:
        reasons.append(f"fed_span: the stream's forget log entry {k} records another span")
    now = stream.digest()
    if receipt.state_digest == now and k == len(log) - 1:
        if entry.get("state") != stream.state_part():
            reasons.append(f"state_digest: the stream's forget log entry {k} records another "
                           "state than the stream's")
        return k, False
    if chained_digest(entry.get("state"), forget_entry_hash(entry)) != receipt.state_digest:
        reasons.append("state_digest differs from the stream's, and from the digest its "
                       f"forget log fixed for this forget (entry {k})")
    return k, True


def _spans_agree(stream, receipt: ModelErasureReceipt, reasons: list[str]) -> None:
    start, stop = receipt.fed_span
    if (start, stop) not in {tuple(x) for x in stream.forgotten}:
        reasons.append(f"fed_span: the stream's forgotten list holds no span [{start}, {stop})")
    if stop > stream.n_fed:
        reasons.append(f"fed_span: the stream was fed {stream.n_fed} bytes in all")
    if receipt.n_forgotten != stop - start:
        reasons.append(f"n_forgotten: the receipt says {receipt.n_forgotten}, its span holds "
                       f"{stop - start}")
    a, b = receipt.held_span
    if b - a != stop - start or a > start:
        reasons.append(f"held_span: [{a}, {b}) is not the fed span [{start}, {stop}) in the "
                       "text held before")
    if receipt.n_after != receipt.n_before - receipt.n_forgotten:
        reasons.append(f"n_after: {receipt.n_after} is not n_before - n_forgotten")


def _check_certificates(stream, receipt: ModelErasureReceipt, reasons: list[str]) -> int:
    """Every hybrid memory has its record; each record's certificates are one per span
    token its rewind removed, well-formed, of its memory's parameters, and no longer
    held. Returns how many certificates were checked."""
    mems = {(li, hd): mem for li, st in enumerate(stream.layers) for hd, mem in enumerate(st.mems)}
    listed = [(m["layer"], m["head"]) for m in receipt.memories]
    if sorted(listed) != sorted(mems):
        reasons.append(f"memories: the receipt lists {len(listed)} memories "
                       f"({sorted(set(listed) - set(mems))[:3]} unknown), the stream has "
                       f"{len(mems)} ({sorted(set(mems) - set(listed))[:3]} missing)")
    a, b = receipt.held_span
    n_certs = 0
    for entry in receipt.memories:
        where = f"memories: layer {entry['layer']} head {entry['head']}"
        mem = mems.get((entry["layer"], entry["head"]))
        if mem is None:
            continue
        first, end = receipt.repair["rewound"].get(str(entry["layer"]), (0, 0))
        lo, hi = receipt.repair["released"].get(str(entry["layer"]), (end, end))
        removed_span = max(0, min(b, end) - max(a, first))
        certs = entry["span_certificates"]
        if len(certs) != removed_span or entry["span_released"] != max(0, min(b, hi) -
                                                                        max(a, lo)):
            reasons.append(f"{where}: {len(certs)} span certificates and "
                           f"{entry['span_released']} released span tokens, but its rewind "
                           f"[{first}, {end}) removed {removed_span} span tokens")
        live = mem.view.live_commitments()
        for c in certs:
            n_certs += 1
            cert = DeletionCertificate(**c)
            errs = cert.consistency_errors()
            if errs:
                reasons.append(f"{where}: certificate {cert.removed_id}: {'; '.join(errs)}")
            if cert.C != mem.C or cert.kernel != mem.kernel or cert.gamma != mem.gamma_value:
                reasons.append(f"{where}: certificate {cert.removed_id} has other memory "
                               "parameters")
            if cert.commitment in live:  # (opaque commitments are nonced: a re-added
                # copy of the same key commits differently, so this is the token itself)
                reasons.append(f"{where}: the token of certificate {cert.removed_id} is "
                               "still held")
    return n_certs
