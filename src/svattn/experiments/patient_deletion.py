"""``patient-deletion``: the right to be forgotten, for one patient of an ICU memory.

An exact SV memory holds the hourly vital-sign tokens of many ICU stays. One
patient withdraws: every token of every stay of theirs is removed, one
deletion certificate per token, each checked right after its removal. Then the
memory is verified against a from-scratch retrain on the remaining tokens:
probes at the other patients' hours must read out the same as the retrained
memory, and probes at the deleted patient's hours must read out what a memory
that never saw them reads out.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass

import numpy as np

from svattn.exact import DeletionCertificate, SVDDMemory, verify_deletion
from svattn.experiments._common import (
    NOT_REPRODUCED,
    REPRODUCED,
    Claim,
    Context,
    ExperimentResult,
    bootstrap_ci,
    fmt_sci,
    markdown_table,
    progress,
    pyplot,
    save_figure,
)
from svattn.unlearning import retrain_state

NAME = "patient-deletion"
TITLE = "Right to be forgotten: delete one patient from an ICU memory, certify, verify"


@dataclass(frozen=True)
class PatientDeletion:
    """What deleting one patient did.

    Attributes
    ----------
    tokens_deleted, support_deleted : int
        Tokens of the patient, and how many of them carried weight.
    certificates : list of str
        The deletion certificates as JSON, in deletion order.
    certificates_ok : bool
        Every certificate checked right after its removal (digest, KKT, consistency).
    verified : bool
        The final certificate verified against a from-scratch retrain.
    partition_equal : bool
    alpha_dev, decision_dev : float
        Against the retrain (from :func:`svattn.exact.verify_deletion`).
    others_readout_dev : float
        ``max |o(q) − o_retrain(q)|`` at the other patients' hours.
    deleted_readout_dev : float
        The same at the deleted patient's hours.
    own_before, own_after, own_retrain : float
        Fraction of the deleted patient's hours whose readout is nearest (among
        every stored value before deletion) to one of the patient's own values:
        before deletion, after, and in the retrained memory.
    """

    tokens_deleted: int
    support_deleted: int
    certificates: list[str]
    certificates_ok: bool
    verified: bool
    partition_equal: bool
    alpha_dev: float
    decision_dev: float
    others_readout_dev: float
    deleted_readout_dev: float
    own_before: float
    own_after: float
    own_retrain: float


def delete_patient(memory: SVDDMemory, owner: dict[int, int], patient: int,
                   *, seed: int = 0) -> PatientDeletion:
    """Delete every token of ``patient`` from a copy of ``memory``; certify and verify.

    Parameters
    ----------
    memory : SVDDMemory
        The memory (left unchanged); it must store values.
    owner : dict of int to int
        Token id -> patient id, for every token of the memory.
    patient : int
        The patient to delete (must own at least one token).
    seed : int
        Seed of the verification probes.

    Returns
    -------
    PatientDeletion

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> mem = SVDDMemory(C=0.1)
    >>> ids = mem.extend(rng.normal(size=(60, 3)), rng.normal(size=(60, 2)))
    >>> owner = {i: i % 3 for i in ids}
    >>> out = delete_patient(mem, owner, 1)
    >>> out.tokens_deleted, out.verified, out.others_readout_dev < 1e-9
    (20, True, True)
    """
    doomed = [t for t in memory.ids if owner[t] == patient]
    if not doomed:
        raise ValueError(f"patient {patient} owns no token of the memory")
    keys_all, values_all = memory.keys, memory.values
    index = {t: i for i, t in enumerate(memory.ids)}
    mine = np.array([index[t] for t in doomed])
    others = np.setdiff1d(np.arange(len(index)), mine)
    support = set(memory.support_ids())

    def own_fraction(out: np.ndarray) -> float:
        d2 = ((out[:, None, :] - values_all[None, :, :]) ** 2).sum(axis=2)  # (m, n)
        nearest = d2.argmin(axis=1)
        return float(np.isin(nearest, mine).mean())

    q_mine, q_others = keys_all[mine], keys_all[others]
    own_before = own_fraction(memory.readout(q_mine))
    mem = copy.deepcopy(memory)
    certificates, ok = [], True
    for tid in doomed:
        cert = mem.remove(tid)
        ok &= verify_deletion(mem, cert, retrain=False).ok
        certificates.append(cert.to_json())
    final = verify_deletion(mem, DeletionCertificate.from_json(certificates[-1]), retrain=True,
                            seed=seed, oracle=True)
    gamma = float(json.loads(certificates[-1])["gamma"])
    ref = retrain_state(mem.keys, mem.values, mem.ids, mem.C, mem.kernel, gamma)
    return PatientDeletion(
        tokens_deleted=len(doomed), support_deleted=len(support.intersection(doomed)),
        certificates=certificates, certificates_ok=bool(ok), verified=bool(final.ok),
        partition_equal=bool(final.partition_equal), alpha_dev=float(final.max_alpha_dev),
        decision_dev=float(final.decision_dev),
        others_readout_dev=float(np.abs(mem.readout(q_others) - ref.readout(q_others)).max()),
        deleted_readout_dev=float(np.abs(mem.readout(q_mine) - ref.readout(q_mine)).max()),
        own_before=own_before, own_after=own_fraction(mem.readout(q_mine)),
        own_retrain=own_fraction(ref.readout(q_mine)),
    )


def run(ctx: Context) -> ExperimentResult:
    """Memory over many stays; delete several patients in turn (each from the full memory)."""
    from svattn.experiments._data import icu_population

    n_stays, trials, C = (6, 2, 0.02) if ctx.quick else (20, 10, 0.02)
    data, label = icu_population(ctx)
    stream = data.select(data.stays()[:n_stays])
    memory = SVDDMemory(C)
    ids = memory.extend(stream.keys, stream.raw)
    owner = dict(zip(ids, stream.subject_id.tolist(), strict=True))
    subjects = np.unique(stream.subject_id)
    support = set(memory.support_ids())
    with_support = [int(s) for s in subjects
                    if any(owner[t] == s and t in support for t in ids)]
    rng = ctx.rng()
    chosen = rng.choice(with_support, size=min(trials, len(with_support)), replace=False)
    results = []
    for i, subject in enumerate(progress(chosen, desc="patient-deletion")):
        results.append((int(subject), delete_patient(memory, owner, int(subject),
                                                     seed=ctx.seed + i)))
    (ctx.out / "certificates.jsonl").write_text("\n".join(results[0][1].certificates) + "\n")
    rows = [[s, r.tokens_deleted, r.support_deleted, "yes" if r.certificates_ok else "NO",
             "yes" if r.verified else "NO", "yes" if r.partition_equal else "no",
             fmt_sci(r.alpha_dev), fmt_sci(r.others_readout_dev), fmt_sci(r.deleted_readout_dev),
             f"{r.own_before:.2f} → {r.own_after:.2f} (retrain {r.own_retrain:.2f})"]
            for s, r in results]
    worst_others = max(r.others_readout_dev for _, r in results)
    worst_deleted = max(r.deleted_readout_dev for _, r in results)
    all_ok = all(r.verified and r.certificates_ok for _, r in results)
    n_certs = sum(r.tokens_deleted for _, r in results)
    before = [r.own_before for _, r in results]
    after = [r.own_after for _, r in results]
    metrics = {
        "config": {"stays": n_stays, "tokens": len(ids), "C": C, "source": label,
                   "patients_deleted": len(results)},
        "patients": [{"subject": s, **{k: v for k, v in r.__dict__.items()
                                        if k != "certificates"}} for s, r in results],
        "all_verified": all_ok, "certificates_issued": n_certs,
        "worst_other_patients_readout_dev": worst_others,
        "worst_deleted_patient_readout_dev": worst_deleted,
        "own_value_retrieval_before": list(bootstrap_ci(before, seed=ctx.seed)),
        "own_value_retrieval_after": list(bootstrap_ci(after, seed=ctx.seed)),
    }
    claims = [
        Claim("Right-to-be-forgotten deletion of one patient's records from an ICU stream",
              "demonstrated (application)",
              f"{len(results)} patients deleted, {n_certs} certificates, all verified against "
              f"retraining: {'yes' if all_ok else 'NO'}; other patients' readout vs retrain "
              f"≤ {fmt_sci(worst_others)}",
              REPRODUCED if all_ok and worst_others < 1e-8 else NOT_REPRODUCED),
    ]
    figure = _figure(ctx, results)
    what = (
        f"Data: {label}; the first {n_stays} stays ({len(ids)} hourly tokens; keys z-scored "
        "vitals, values raw vitals) in one exact `SVDDMemory` (rbf, gamma = 1/7, C = "
        f"{C}). {len(results)} patients, drawn among those with at least one support token, "
        "are each deleted from the full memory in turn: every token of all their stays is "
        "removed with `SVDDMemory.remove`, and each certificate is checked right after its "
        "removal (`verify_deletion(..., retrain=False)`: state digest, KKT residual, "
        "consistency). The last certificate is then verified against a from-scratch retrain "
        "with the independent oracle (`verify_deletion(..., retrain=True)`). Probes: the other "
        "patients' hours (their readout must equal the retrained memory's) and the deleted "
        "patient's hours (their readout must equal that of a memory that never saw them). "
        "*Own-value retrieval*: fraction of the deleted patient's hours whose readout is "
        "nearest, among all stored values before deletion, to one of the patient's own "
        "values. The first patient's certificates are in `certificates.jsonl` (opaque "
        "commitments only: no vitals)."
    )
    return ExperimentResult(
        name=NAME, title=TITLE, what=what, claims=claims,
        verdict=(f"{len(results)} patients deleted exactly ({n_certs} certificates, "
                 f"{'all verified' if all_ok else 'NOT all verified'}); other patients' and "
                 f"deleted patient's readouts equal the retrain to {fmt_sci(worst_others)} / "
                 f"{fmt_sci(worst_deleted)}; own-value retrieval {np.mean(before):.2f} → "
                 f"{np.mean(after):.2f}."),
        metrics=metrics,
        tables=[markdown_table(["subject", "tokens", "of them support", "certificates ok",
                                "verified vs retrain", "partition equal", "max |Δα|",
                                "others' readout dev", "deleted's readout dev",
                                "own-value retrieval before → after"], rows)],
        figures=[figure],
        notes=["The application has no number in the paper to compare with; the figure of "
               "merit is that every deletion verifies against retraining."],
    )


def _figure(ctx: Context, results: list[tuple[int, PatientDeletion]]) -> str:
    plt = pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
    floor = 1e-17
    for j, attr in enumerate(["others_readout_dev", "deleted_readout_dev", "decision_dev"]):
        vals = np.maximum([getattr(r, attr) for _, r in results], floor)
        ax.scatter(np.full(len(vals), j), vals, s=14)
    ax.set_xticks(range(3), ["others' readout", "deleted's readout", "decision fn"])
    ax.set_yscale("log")
    ax.set_ylabel("max deviation from retrain")
    ax.set_title("Deleted memory vs retrained memory")
    for j, attr in enumerate(["own_before", "own_after", "own_retrain"]):
        vals = [getattr(r, attr) for _, r in results]
        est, lo, hi = bootstrap_ci(vals, seed=ctx.seed)
        ax2.bar(j, est, yerr=[[est - lo], [hi - est]], capsize=4, color="tab:blue")
    ax2.set_xticks(range(3), ["before", "after", "retrain"])
    ax2.set_ylim(0, 1.05)
    ax2.set_ylabel("readout nearest to own record")
    ax2.set_title("Deleted patient's hours retrieve their own vitals")
    return save_figure(fig, ctx.out, "patient_deletion.png",
                       f"{len(results)} patients (seed {ctx.seed}); bars: mean with 95% "
                       f"bootstrap interval over patients; values below {floor:g} at {floor:g}",
                       quick=ctx.quick)
