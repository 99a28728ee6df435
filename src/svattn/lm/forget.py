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
  by every memory.

The receipt never holds the forgotten bytes, their hash, or any key, value or hidden
state of the span (the certificates' commitments are the memories' own, see
docs/design.md §4.1).

:func:`verify_forget` checks a stream against a receipt by re-streaming the text it
holds from scratch in a fresh stream: same digest, logits at every position and
every memory's readout equal to ``tol``, certificates well-formed and their
commitments no longer held by the memories.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime

import numpy as np

from svattn.exact import DeletionCertificate

__all__ = ["ModelErasureReceipt", "ForgetVerification", "verify_forget"]

RECEIPT_KIND = "svattn.ModelErasureReceipt"
RECEIPT_VERSION = 1


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
        Per hybrid layer and head: ``layer``, ``head``, ``span_certificates`` (dicts of
        :class:`~svattn.exact.DeletionCertificate`, one per span token the memory
        held), ``rewound`` (other tokens removed and re-added), ``rewound_unique``
        (whether every removal claimed a unique optimum), ``released`` (tokens held
        only by the memory the stream released for an earlier snapshot, see
        ``LMStream(snapshot_every=)``) and ``span_released`` (span tokens among them: no
        certificate, that memory object is gone), ``max_kkt_residual``,
        ``rewind_s`` (seconds its removals took).
    state_digest : str
        :meth:`LMStream.digest` after the forget.
    issued_at : str
    kind, version
    """

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

    @classmethod
    def issue(cls, stream, *, fed_span, span, n_before: int, removed: list[dict],
              seconds: dict | None = None) -> ModelErasureReceipt:
        """Build the receipt from a stream after its forget (``removed``: what
        :meth:`LMStream.rewind` returned)."""
        a, b = span
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
            repair={"kept_prefix": a, "replayed": n_before - b, "rewound": rewound,
                    "released": released,
                    "seconds": dict(seconds or {})},
            memories=memories, state_digest=stream.digest(),
            issued_at=datetime.now(UTC).isoformat(timespec="seconds"),
        )

    def certificates(self) -> list[DeletionCertificate]:
        """Every span certificate, as :class:`~svattn.exact.DeletionCertificate`."""
        return [DeletionCertificate(**c) for m in self.memories for c in m["span_certificates"]]

    def to_json(self) -> str:
        """JSON (round-trips through :meth:`from_json`)."""
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> ModelErasureReceipt:
        """Parse :meth:`to_json`'s output; precise errors on anything else."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"receipt: not JSON ({exc})") from None
        if not isinstance(data, dict) or data.get("kind") != RECEIPT_KIND:
            raise ValueError(f"receipt: not a {RECEIPT_KIND} (kind = "
                             f"{data.get('kind') if isinstance(data, dict) else None!r})")
        if data.get("version") != RECEIPT_VERSION:
            raise ValueError(f"receipt: version {data.get('version')!r} is not supported "
                             f"(expected {RECEIPT_VERSION})")
        names = set(cls.__dataclass_fields__)
        missing, extra = sorted(names - set(data) - {"issued_at"}), sorted(set(data) - names)
        if missing or extra:
            raise ValueError(f"receipt: missing fields {missing}, unknown fields {extra}")
        return cls(**data)


@dataclass
class ForgetVerification:
    """Outcome of :func:`verify_forget`: ``ok`` and every check's numbers."""

    ok: bool
    reasons: list[str] = field(default_factory=list)
    digest_matches: bool = False
    max_logit_deviation: float = float("nan")
    max_readout_deviation: float = float("nan")
    n_certificates: int = 0
    n_positions: int = 0

    def summary(self) -> str:
        head = "VERIFIED" if self.ok else "NOT VERIFIED"
        lines = [f"{head}: the stream equals a fresh stream of its {self.n_positions} bytes",
                 f"  digest matches the receipt and the fresh stream: {self.digest_matches}",
                 f"  max |logit - fresh logit| over every position: {self.max_logit_deviation:.3g}",
                 f"  max |memory readout - fresh readout|: {self.max_readout_deviation:.3g}",
                 f"  span certificates checked: {self.n_certificates}"]
        return "\n".join(lines + [f"  - {r}" for r in self.reasons])


def _live_commitments(mem) -> set[str]:
    ss = mem.solver_state
    return {ss.commitments[s].tobytes().hex() for s in ss.ordered_slots()}


def verify_forget(stream, receipt: ModelErasureReceipt, *, tol: float = 1e-9
                  ) -> ForgetVerification:
    """Check ``stream`` (after a forget, or saved and loaded) against ``receipt``.

    Re-streams :attr:`stream.text` from scratch in a fresh stream of the same model
    and compares: the digest (receipt, stream, fresh stream), the logits at every
    held position and every memory's readout at its own keys (≤ ``tol``), and each
    span certificate (fields, its memory's parameters, its commitment no longer held
    unless the certificate lists live copies).
    """
    reasons = []
    if receipt.model_digest != stream.model_digest:
        reasons.append("the receipt was issued for another model (model digest differs)")
    fresh = type(stream)(stream.model, full_policy=stream.full_policy, snapshot_every=0)
    fresh.feed(stream.text)
    digest_ok = receipt.state_digest == stream.digest() == fresh.digest()
    if not digest_ok:
        reasons.append("digest: receipt, stream and fresh stream do not all agree")
    dev = 0.0
    if len(stream):
        dev = float((stream.all_logits() - fresh.all_logits()).abs().max())
        dev = max(dev, float((stream.logits() - fresh.logits()).abs().max()))
    if not dev <= tol:
        reasons.append(f"logits differ from the fresh stream's by {dev:.3g} > {tol:g}")
    rdev = 0.0
    for li, (st, fr) in enumerate(zip(stream.layers, fresh.layers, strict=True)):
        for hd, (mem, fmem) in enumerate(zip(st.mems, fr.mems, strict=True)):
            if len(mem) != len(fmem):
                reasons.append(f"layer {li} head {hd}: memory holds {len(mem)} tokens, the "
                               f"fresh one {len(fmem)}")
                continue
            if len(mem):
                probes = mem.keys
                rdev = max(rdev, float(np.abs(mem.readout(probes) - fmem.readout(probes)).max()))
    if not rdev <= tol:
        reasons.append(f"memory readouts differ from the fresh stream's by {rdev:.3g} > {tol:g}")
    mems = {(li, hd): mem for li, st in enumerate(stream.layers) for hd, mem in enumerate(st.mems)}
    n_certs = 0
    for entry in receipt.memories:
        mem = mems.get((entry["layer"], entry["head"]))
        if mem is None:
            reasons.append(f"receipt names layer {entry['layer']} head {entry['head']}, which "
                           "has no memory")
            continue
        live = _live_commitments(mem)
        for c in entry["span_certificates"]:
            n_certs += 1
            cert = DeletionCertificate(**c)
            errs = cert.field_errors() + cert.consistency_errors()
            if errs:
                reasons.append(f"layer {entry['layer']} head {entry['head']} certificate "
                               f"{cert.removed_id}: {'; '.join(errs)}")
            if cert.C != mem.C or cert.kernel != mem.kernel or cert.gamma != mem.gamma_value:
                reasons.append(f"layer {entry['layer']} head {entry['head']}: certificate "
                               f"{cert.removed_id} has other memory parameters")
            if cert.commitment in live:  # (opaque commitments are nonced: a re-added
                # copy of the same key commits differently, so this is the token itself)
                reasons.append(f"layer {entry['layer']} head {entry['head']}: the token of "
                               f"certificate {cert.removed_id} is still held")
    return ForgetVerification(ok=not reasons, reasons=reasons, digest_matches=digest_ok,
                              max_logit_deviation=dev, max_readout_deviation=rdev,
                              n_certificates=n_certs, n_positions=len(stream))
