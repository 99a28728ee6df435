"""``svattn demo``: a patient withdraws consent; delete their ICU stay exactly, prove it.

What it does, in order:

1. Loads hourly vital-sign vectors from the MIMIC-III demo slice shipped with
   the package (:mod:`svattn.data.icu`), z-scored with the slice's mean and
   standard deviation.
2. Streams the first ``stays`` stays, hour by hour, into an exact
   :class:`~svattn.exact.SVDDMemory`: keys are the standardised vitals, values
   the raw vitals, so a readout predicts vitals. Prints the partition
   (margin / error / reserve), the KKT residual, how many critical hours the
   support keeps, and how well the readout predicts each hour's vitals.
3. Deletes every token of one stay, one certificate per token, each checked
   against the memory right after its deletion (digest, KKT residual,
   consistency).
4. Retrains from scratch on the remaining tokens with the independent QP
   oracle and compares: partition, max |Δalpha|, decision function and
   readout on probe points. Prints a verdict.
5. With ``save_to`` (``svattn demo --out DIR``), leaves what an auditor needs in
   ``DIR``: the memory's audit log (``audit.jsonl``, every operation of the
   demo), the final state (``state.safetensors``) and every certificate
   (``certificates/NNN-token<id>.json``, in deletion order; ``last.json`` is the
   one the final state answers for), and prints the ``svattn verify-deletion``
   and ``svattn audit verify`` commands that check them.

Examples
--------
>>> import io
>>> from svattn.demo import run_demo
>>> result = run_demo(stays=2, show=0, out=io.StringIO())
>>> result.ok
True
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import numpy as np

from svattn.data.icu import IcuStays, default_slice_path, load_mimic3_vitals
from svattn.exact import DeletionCertificate, DeletionVerification, SVDDMemory, verify_deletion
from svattn.exact.records.signing import generate_key
from svattn.exact.records.signing import signing_key as load_signing_key

__all__ = ["DemoResult", "run_demo"]

_SHORT = {
    "heart_rate": "HR",
    "spo2": "SpO2",
    "resp_rate": "RR",
    "sys_bp": "SBP",
    "dia_bp": "DBP",
    "mean_bp": "MAP",
    "temp_c": "T",
}


@dataclass(frozen=True)
class DemoResult:
    """What :func:`run_demo` did and found.

    Attributes
    ----------
    n_tokens : int
        Tokens streamed into the memory.
    deleted_stay, deleted_subject : int
        The ICU stay deleted and its patient.
    certificates : list of DeletionCertificate
        One per deleted token, in deletion order.
    checks : list of DeletionVerification
        Each certificate checked right after its deletion (no retraining,
        unless ``verify_each``).
    final : DeletionVerification
        The last certificate checked against a from-scratch retrain.
    ok : bool
        Every check and the final verification passed.
    """

    n_tokens: int
    deleted_stay: int
    deleted_subject: int
    certificates: list[DeletionCertificate]
    checks: list[DeletionVerification]
    final: DeletionVerification
    ok: bool


def run_demo(
    stays: int = 6,
    C: float = 0.05,
    *,
    gamma: float | None = None,
    seed: int = 0,
    delete: int | None = None,
    data: str | Path | None = None,
    show: int = 40,
    verify_each: bool = False,
    out: TextIO | None = None,
    save_to: str | Path | None = None,
    signing_key: str | Path | None = None,
) -> DemoResult:
    """Stream ICU vitals into an exact SV memory, delete one stay, verify.

    Parameters
    ----------
    stays : int
        Stream the first ``stays`` stays of the data (in stay-id order).
    C : float
        Box bound of the memory (at least ``ceil(1/C)`` tokens carry weight).
    gamma : float, optional
        rbf bandwidth; default ``1/d``.
    seed : int
        Draws the stay to delete (when ``delete`` is None) and the probe
        points of the verification.
    delete : int, optional
        The stay to delete; default: drawn among the streamed stays that have
        at least one support token (deleting a stay with none is trivial).
    data : str or Path, optional
        A MIMIC-III demo vitals CSV(.gz); default the shipped slice.
    show : int
        Print at most this many lines of certificates (all are checked). Runs
        of reserve tokens, which leave the solution untouched, take one line.
    verify_each : bool
        Also retrain from scratch after every deletion (slower).
    out : text stream, optional
        Where to print; default ``sys.stdout``.
    save_to : str or Path, optional
        A folder (created if absent; it must not already hold demo files) for
        the audit log, the final state and the certificates (step 5 above).
    signing_key : str or Path, optional
        The controller's Ed25519 private key (``svattn keygen PREFIX`` writes
        ``PREFIX.key``): every certificate is then signed, and an auditor checks it with
        ``verify-deletion --public-key PREFIX.pub``.

    Returns
    -------
    DemoResult

    Raises
    ------
    ValueError
        If ``stays`` exceeds the stays in the data, ``delete`` is not among
        the streamed stays, ``show`` is negative, ``C`` / ``gamma`` are
        invalid for the memory, or ``save_to`` is a file or already holds
        demo files.
    FileNotFoundError
        If ``data`` does not exist.

    Examples
    --------
    >>> import io
    >>> from svattn.demo import run_demo
    >>> result = run_demo(stays=2, show=0, out=io.StringIO())
    >>> result.ok, len(result.certificates) > 0
    (True, True)
    """
    out = sys.stdout if out is None else out
    if isinstance(stays, bool) or not isinstance(stays, int) or stays < 1:
        raise ValueError(f"stays must be a positive int, got {stays!r}")
    if show < 0:
        raise ValueError(f"show must be >= 0, got {show}")
    save_dir = None if save_to is None else _check_save_dir(Path(save_to))

    def say(text: str = "") -> None:
        print(text, file=out)

    # 1. data ---------------------------------------------------------------
    path = default_slice_path() if data is None else Path(data)
    population = load_mimic3_vitals(path).standardised()
    all_stays = population.stays()
    if stays > len(all_stays):
        raise ValueError(
            f"stays: asked for {stays} stays, but '{path.name}' has only {len(all_stays)}"
        )
    stream = population.select(all_stays[:stays])
    if delete is not None and delete not in set(stream.stays().tolist()):
        raise ValueError(
            f"delete: stay {delete} is not among the {stays} streamed stays "
            f"{stream.stays().tolist()}"
        )
    say("svattn demo: a patient withdraws consent; delete their ICU stay exactly, and prove it")
    licence = " (MIMIC-III demo v1.4, ODbL)" if data is None else ""
    say(
        f"data     {path.name}{licence}: first {stays} of {len(all_stays)} stays, "
        f"{len(stream)} hourly tokens, {int(stream.critical.sum())} critical hours"
    )
    say(
        f"         keys: z-scored [{' '.join(stream.feature_names)}]; "
        "values: the raw vitals (a readout predicts vitals)"
    )

    # 2. stream into the memory ---------------------------------------------
    log_path = None if save_dir is None else save_dir / _LOG
    if log_path is not None:
        save_dir.mkdir(parents=True, exist_ok=True)
    # the controller's key signs every certificate: the auditor's public key then binds
    # every field (the state alone cannot bind a commitment or an id). Without one, a key
    # made for this run signs, and the demo checks with its public half.
    key = generate_key() if signing_key is None else load_signing_key(signing_key)
    memory = SVDDMemory(C, gamma=gamma, audit_log=log_path, signing_key=key)
    start = time.perf_counter()
    token_ids = _stream(memory, stream)
    elapsed = time.perf_counter() - start
    stay_of = dict(zip(token_ids, stream.stay_id.tolist(), strict=True))
    _report_memory(say, memory, stream, token_ids, elapsed)

    # 3. choose the patient and delete every token of the stay ---------------
    support = set(memory.support_ids())
    per_stay = {int(s): [t for t in token_ids if stay_of[t] == s] for s in stream.stays()}
    if delete is None:
        candidates = sorted(s for s, ts in per_stay.items() if support.intersection(ts))
        candidates = candidates or sorted(per_stay)
        delete = int(np.random.default_rng(seed).choice(candidates))
    doomed = per_stay[delete]
    subject = int(stream.subject_id[stream.stay_id == delete][0])
    say(
        f"delete   stay {delete} (subject {subject}): {len(doomed)} tokens, "
        f"{len(support.intersection(doomed))} of them in the support"
    )
    certificates, checks, seconds = _delete(memory, doomed, say, show, verify_each, seed,
                                            key.public_key())
    bad = [c for c in checks if not c.ok]
    say(
        f"         {len(certificates)} certificates in {seconds:.2f} s, each checked right after "
        f"its deletion (digest, KKT, consistency, signature{', retrain' if verify_each else ''}): "
        + ("all ok" if not bad else f"{len(bad)} FAILED")
    )

    # 4. verify against retraining from scratch ------------------------------
    # said before the re-solve, which takes seconds at a few thousand tokens
    say(f"verify   retraining from scratch on the {len(memory)} remaining tokens "
        "(independent QP oracle) ...")
    start = time.perf_counter()
    final = verify_deletion(memory, certificates[-1], retrain=True, seed=seed, oracle=True,
                            public_key=key.public_key())
    say(f"         {final.summary()} ({time.perf_counter() - start:.2f} s)")
    ok = final.complete and not bad
    say(_verdict(ok, delete, certificates, final))
    if save_dir is not None:
        _save(say, memory, certificates, save_dir, own_key=signing_key is not None)
    return DemoResult(
        n_tokens=len(token_ids),
        deleted_stay=delete,
        deleted_subject=subject,
        certificates=certificates,
        checks=checks,
        final=final,
        ok=ok,
    )


_LOG, _STATE, _CERTS = "audit.jsonl", "state.safetensors", "certificates"


def _check_save_dir(path: Path) -> Path:
    if path.exists() and not path.is_dir():
        raise ValueError(f"out: {path} is a file; give a folder (created if absent)")
    taken = [n for n in (_LOG, _STATE, _CERTS) if (path / n).exists()]
    if taken:
        raise ValueError(f"out: {path} already holds {taken} of an earlier demo; give a new "
                         "folder (the demo never overwrites an audit trail)")
    return path


def _save(say, memory: SVDDMemory, certificates: list[DeletionCertificate], where: Path, *,
          own_key: bool) -> None:
    """The final state, every certificate and the round-trip commands."""
    import shlex

    state = where / _STATE
    memory.save(state)
    memory.close_audit_log()
    certs = where / _CERTS
    certs.mkdir()
    for i, cert in enumerate(certificates, 1):
        (certs / f"{i:03d}-token{cert.removed_id}.json").write_text(cert.to_json() + "\n")
    (certs / "last.json").write_text(certificates[-1].to_json() + "\n")
    q = {name: shlex.quote(str(p)) for name, p in
         (("state", state), ("log", where / _LOG), ("last", certs / "last.json"))}
    say(f"saved    {where}: {_STATE} (the memory after the deletion), {_LOG} (every "
        f"operation, hash-chained), {_CERTS}/ ({len(certificates)} certificates; last.json "
        "is the one the saved state answers for)")
    key = " --public-key PREFIX.pub" if own_key else ""
    say(f"         check them:  svattn verify-deletion {q['state']} {q['last']} --log "
        f"{q['log']}{key}")
    say(f"                      svattn audit verify {q['log']} {q['state']}{key}")
    if own_key:
        say("         (PREFIX.pub: the public half of --signing-key PREFIX.key)")
    else:
        say("         (signed with a key made for this run, which no auditor holds: "
            "verify-deletion and audit verify report the signatures (the receipt's and the "
            "audit log's checkpoints) as unchecked, exit 3. svattn keygen PREFIX, then demo "
            "--signing-key PREFIX.key, "
            "signs with a key whose public half PREFIX.pub an auditor can hold)")


def _stream(memory: SVDDMemory, stream: IcuStays) -> list[int]:
    """Add the stays hour by hour (one ``extend`` per stay), with a progress bar on a tty."""
    from tqdm.auto import tqdm

    ids: list[int] = []
    with tqdm(total=len(stream), desc="streaming", unit="tok", leave=False, disable=None) as bar:
        for stay in stream.stays():
            rows = stream.stay_id == stay
            ids += memory.extend(stream.keys[rows], stream.raw[rows])
            bar.update(int(rows.sum()))
    return ids


def _report_memory(
    say, memory: SVDDMemory, stream: IcuStays, token_ids: list[int], elapsed: float
) -> None:
    part = {name: len(ids) for name, ids in memory.partition().items()}
    support = memory.support_ids()
    gamma = memory.gamma if memory.gamma is not None else 1.0 / stream.n_features
    say(
        f"memory   SVDDMemory(C={memory.C:g}, kernel={memory.kernel}, gamma={gamma:.4g}): "
        f"{len(memory)} tokens added in {elapsed:.2f} s"
    )
    say(
        f"         partition: margin {part['margin']}, error {part['error']}, reserve "
        f"{part['reserve']}; support {len(support)} (at least ceil(1/C) = "
        f"{memory.warmup_n})"
    )
    say(
        f"         KKT residual {memory.kkt_residual():.1e}, unique optimum: "
        f"{'yes' if memory.unique_optimum() else 'no'}"
    )
    critical = dict(zip(token_ids, stream.critical.tolist(), strict=True))
    kept = sum(critical[t] for t in support)
    total = int(stream.critical.sum())
    say(
        f"         support keeps {kept} of {total} critical hours "
        f"({kept / max(len(support), 1):.0%} of the support is critical, "
        f"{total / max(len(stream), 1):.0%} of all hours)"
    )
    predicted = memory.readout(stream.keys)  # (N, F) vitals
    mae = np.abs(predicted - stream.raw).mean(axis=0)
    say(
        "         readout at each hour's key, mean |error|: "
        + ", ".join(
            f"{_SHORT.get(n, n)} {e:.1f}" for n, e in zip(stream.feature_names, mae, strict=True)
        )
    )


def _delete(memory, doomed, say, show, verify_each, seed, public_key):
    certificates: list[DeletionCertificate] = []
    checks: list[DeletionVerification] = []
    if show:
        say(
            f"    {'id':>9}  {'commitment':<12}  {'margin/error/reserve':<24} "
            f"{'KKT after':>9}  {'events':>6}  unique"
        )
    start = time.perf_counter()
    lines = 0
    quiet: list[DeletionCertificate] = []  # a run of reserve tokens dropped at once

    def flush() -> None:
        nonlocal lines
        if quiet and lines < show:
            first, last = quiet[0].removed_id, quiet[-1].removed_id
            span = f"{first}" if first == last else f"{first}-{last}"
            say(
                f"    {span:>9}  {len(quiet)} reserve token{'s' if len(quiet) > 1 else ''}: "
                "dropped at once, 0 events, alpha of every other token unchanged"
            )
            lines += 1
        quiet.clear()

    for token in doomed:
        cert = memory.remove(token)
        check = verify_deletion(memory, cert, retrain=verify_each, seed=seed,
                                public_key=public_key)
        certificates.append(cert)
        checks.append(check)
        if _is_reserve_drop(cert) and check.ok:
            quiet.append(cert)
            continue
        flush()
        if lines < show:
            say("    " + _cert_line(cert) + ("" if check.ok else "  CHECK FAILED"))
        lines += 1
    flush()
    if lines > show:
        say(f"    ... {lines - show} more lines (every certificate was checked)")
    return certificates, checks, time.perf_counter() - start


def _is_reserve_drop(cert: DeletionCertificate) -> bool:
    before, after = cert.partition_before, cert.partition_after
    return (
        cert.n_events == 0
        and before["margin"] == after["margin"]
        and before["error"] == after["error"]
        and before["reserve"] == after["reserve"] + 1
    )


def _cert_line(cert: DeletionCertificate) -> str:
    def sizes(p: dict[str, int]) -> str:
        return f"{p['margin']}/{p['error']}/{p['reserve']}"

    move = f"{sizes(cert.partition_before)} -> {sizes(cert.partition_after)}"
    return (
        f"{cert.removed_id:>9}  {cert.commitment[:12]:<12}  {move:<24} "
        f"{cert.kkt_residual_after:>9.1e}  {cert.n_events:>6}  "
        f"{'yes' if cert.unique_optimum else 'NO'}"
    )


def _verdict(
    ok: bool, stay: int, certificates: list[DeletionCertificate], final: DeletionVerification
) -> str:
    n = len(certificates)
    if not ok:
        return f"verdict  FAILED: the deletion of stay {stay} could not be verified (see above)"
    if final.unique_optimum:
        return (
            f"verdict  VERIFIED: stay {stay} deleted exactly; {n}/{n} certificates valid; the "
            f"memory equals retraining without it (partition equal, max |Δalpha| "
            f"{final.max_alpha_dev:.1e}, readout dev {final.readout_dev:.1e})"
        )
    return (
        f"verdict  VERIFIED (decision function only): stay {stay} deleted; {n}/{n} certificates "
        f"valid; the optimum is not unique, so alpha is not claimed equal to a retrain "
        f"(decision dev {final.decision_dev:.1e})"
    )
