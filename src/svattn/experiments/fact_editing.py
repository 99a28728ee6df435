"""``fact-editing``: surgical fact forgetting and exact knowledge edits in a fact memory.

A fact is a key (the embedding of a subject–relation pair) and a value (the
embedding of its object, from a codebook). The memory is an exact
:class:`~svattn.exact.SVDDMemory`; a fact is *retrieved* when the readout at
its key is nearest (in the codebook) to its object.

* **Edit**: remove the old fact (certificate), add the corrected one (same
  key, new object). After a series of edits the memory must equal a memory
  built from scratch on the corrected facts.
* **Forget**: remove a fact. The memory must equal one built without it, and
  the fact must no longer be retrieved; coefficient decay is the baseline.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import numpy as np

from svattn.exact import SVDDMemory
from svattn.experiments._common import (
    NOT_REPRODUCED,
    REPRODUCED,
    Claim,
    Context,
    ExperimentResult,
    ci_dict,
    fmt_ci,
    fmt_sci,
    markdown_table,
    progress,
    pyplot,
    save_figure,
)
from svattn.unlearning import SVState, coefficient_decay, retrain_state

NAME = "fact-editing"
TITLE = "Surgical fact forgetting and exact knowledge edits"

DECAY_FACTOR = 0.01
# rbf bandwidth 4/d: two unrelated facts (distance² ≈ 2d) have kernel e^-8, so a fact
# memory can tell them apart; the library default 1/d (e^-2) blurs neighbouring facts
GAMMA_SCALE = 4.0


def _decode(out: np.ndarray, codebook: np.ndarray) -> np.ndarray:
    """Nearest codebook row of each output row."""
    return ((out[:, None, :] - codebook[None]) ** 2).sum(axis=2).argmin(axis=1)


def _by_key(keys: np.ndarray) -> dict[bytes, int]:
    return {k.tobytes(): i for i, k in enumerate(keys)}


@dataclass(frozen=True)
class EditTrial:
    """Outcome of a series of edits and one deletion on a fact memory.

    Attributes
    ----------
    edits : int
    alpha_dev : float
        ``max |alpha − alpha_scratch|`` after the edits (facts matched by key).
    readout_dev : float
        ``max |o(k) − o_scratch(k)|`` over every fact key after the edits.
    partition_equal : bool
    retrieved_before, retrieved_after, retrieved_scratch : float
        Fraction of facts retrieved: originally, after the edits, in the
        scratch-built memory of the corrected facts.
    edited_retrieved_new : float
        Fraction of edited facts whose readout gives the new object.
    forget_readout_dev : float
        After deleting one fact: ``max |o − o_retrain|`` over the fact keys.
    forgotten_still_retrieved_exact, forgotten_still_retrieved_decay : bool
        Whether the deleted fact's key still retrieves its object after exact
        removal / after coefficient decay.
    forgotten_was_retrieved : bool
        Whether it was retrieved before deletion.
    forget_readout_dev_decay : float
        ``max |o − o_retrain|`` over the fact keys after coefficient decay instead.
    forgotten_still_retrieved_retrain : bool
        Whether the deleted fact's key retrieves its object in the memory retrained
        without the fact (a chance match among the codebook's objects: what exact
        removal must equal, and does).
    """

    edits: int
    alpha_dev: float
    readout_dev: float
    partition_equal: bool
    retrieved_before: float
    retrieved_after: float
    retrieved_scratch: float
    edited_retrieved_new: float
    forget_readout_dev: float
    forgotten_still_retrieved_exact: bool
    forgotten_still_retrieved_decay: bool
    forgotten_was_retrieved: bool
    forget_readout_dev_decay: float = float("nan")
    forgotten_still_retrieved_retrain: bool = False


def edit_trial(
    keys: np.ndarray,
    objects: np.ndarray,
    codebook: np.ndarray,
    *,
    n_edits: int,
    C: float,
    rng: np.random.Generator,
    gamma: float | None = None,
) -> EditTrial:
    """Edit ``n_edits`` random facts, compare with a scratch build; then forget one fact.

    Parameters
    ----------
    keys : ndarray, shape (N, d)
        Fact keys (distinct).
    objects : ndarray of int, shape (N,)
        Object of each fact (rows of ``codebook``).
    codebook : ndarray, shape (M, dv)
        Object embeddings (the values).
    n_edits : int
        Facts to correct (drawn without replacement).
    C : float
        Box bound of the memory.
    rng : numpy Generator
    gamma : float, optional
        rbf bandwidth (default ``1/d``).

    Returns
    -------
    EditTrial

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> keys, book = rng.normal(size=(30, 8)), rng.normal(size=(10, 8))
    >>> t = edit_trial(keys, rng.integers(0, 10, 30), book, n_edits=3, C=0.1, rng=rng)
    >>> t.partition_equal, t.alpha_dev < 1e-9, t.readout_dev < 1e-9
    (True, True, True)
    """
    keys = np.asarray(keys, dtype=np.float64)
    objects = np.asarray(objects).copy()
    n = keys.shape[0]
    if not 0 < n_edits <= n:
        raise ValueError(f"n_edits must lie in 1..{n}, got {n_edits}")
    gamma = 1.0 / keys.shape[1] if gamma is None else float(gamma)
    memory = SVDDMemory(C, gamma=gamma)
    ids = memory.extend(keys, codebook[objects])
    retrieved_before = float(np.mean(_decode(memory.readout(keys), codebook) == objects))
    fact_id = dict(enumerate(ids))  # fact index -> current token id
    edited = rng.choice(n, size=n_edits, replace=False)
    for f in edited:
        new = (objects[f] + 1 + rng.integers(codebook.shape[0] - 1)) % codebook.shape[0]
        memory.remove(fact_id[f])
        fact_id[f] = memory.add(keys[f], codebook[new])
        objects[f] = new
    scratch = retrain_state(keys, codebook[objects], list(range(n)), C, "rbf", gamma)
    order = _by_key(memory.keys)
    perm = np.array([order[k.tobytes()] for k in keys])  # memory row of each fact
    alpha_dev = float(np.abs(memory.alpha[perm] - scratch.alpha).max())
    out = memory.readout(keys)
    readout_dev = float(np.abs(out - scratch.readout(keys)).max())
    part_m = memory.partition()
    token_fact = {t: f for f, t in fact_id.items()}
    part_s = scratch.partition()
    partition_equal = all(sorted(token_fact[t] for t in part_m[s]) == sorted(part_s[s])
                          for s in ("margin", "error", "reserve"))
    decoded = _decode(out, codebook)
    # forget one retrievable fact if there is one
    hits = np.flatnonzero(decoded == objects)
    victim = int(rng.choice(hits)) if len(hits) else int(rng.integers(n))
    before = copy.deepcopy(memory)
    memory.remove(fact_id[victim])
    keep = np.delete(np.arange(n), victim)
    ref = retrain_state(keys[keep], codebook[objects[keep]], list(keep), C, "rbf", gamma)
    forget_dev = float(np.abs(memory.readout(keys) - ref.readout(keys)).max())
    decayed: SVState = coefficient_decay(before, fact_id[victim], DECAY_FACTOR)
    probe = keys[victim : victim + 1]
    return EditTrial(
        edits=int(n_edits), alpha_dev=alpha_dev, readout_dev=readout_dev,
        partition_equal=bool(partition_equal), retrieved_before=retrieved_before,
        retrieved_after=float(np.mean(decoded == objects)),
        retrieved_scratch=float(np.mean(_decode(scratch.readout(keys), codebook) == objects)),
        edited_retrieved_new=float(np.mean(decoded[edited] == objects[edited])),
        forget_readout_dev=forget_dev,
        forgotten_still_retrieved_exact=bool(
            _decode(memory.readout(probe), codebook)[0] == objects[victim]),
        forgotten_still_retrieved_decay=bool(
            _decode(decayed.readout(probe), codebook)[0] == objects[victim]),
        forgotten_was_retrieved=bool(decoded[victim] == objects[victim]),
        forget_readout_dev_decay=float(np.abs(decayed.readout(keys) - ref.readout(keys)).max()),
        forgotten_still_retrieved_retrain=bool(
            _decode(ref.readout(probe), codebook)[0] == objects[victim]),
    )


def run(ctx: Context) -> ExperimentResult:
    """Many trials of random fact sets; exactness and retrieval figures with intervals."""
    n_facts, n_edits, trials = (48, 5, 3) if ctx.quick else (200, 20, 20)
    d, m = 16, 32
    C = 2.0 / n_facts
    gamma = GAMMA_SCALE / d
    rows: list[EditTrial] = []
    for i in progress(range(trials), desc="fact-editing"):
        rng = np.random.default_rng([ctx.seed, i])
        keys, book = rng.normal(size=(n_facts, d)), rng.normal(size=(m, d))
        rows.append(edit_trial(keys, rng.integers(0, m, n_facts), book, n_edits=n_edits, C=C,
                               rng=rng, gamma=gamma))
    worst_alpha = max(r.alpha_dev for r in rows)
    worst_read = max(r.readout_dev for r in rows)
    worst_forget = max(r.forget_readout_dev for r in rows)
    part_eq = float(np.mean([r.partition_equal for r in rows]))
    was = [r for r in rows if r.forgotten_was_retrieved]
    still_exact = float(np.mean([r.forgotten_still_retrieved_exact for r in was])) if was else None
    still_decay = float(np.mean([r.forgotten_still_retrieved_decay for r in was])) if was else None
    still_retrain = (float(np.mean([r.forgotten_still_retrieved_retrain for r in was]))
                     if was else None)
    stat = {k: ci_dict([getattr(r, k) for r in rows], seed=ctx.seed)
            for k in ("retrieved_before", "retrieved_after", "retrieved_scratch",
                      "edited_retrieved_new")}
    metrics = {"config": {"facts": n_facts, "edits": n_edits, "trials": trials, "d": d,
                          "gamma": gamma,
                          "objects": m, "C": C, "decay_factor": DECAY_FACTOR},
               "worst_alpha_dev_vs_scratch": worst_alpha,
               "worst_readout_dev_vs_scratch": worst_read,
               "partition_equal": part_eq, "worst_forget_readout_dev": worst_forget,
               "forgotten_still_retrieved_exact": still_exact,
               "forgotten_still_retrieved_decay": still_decay,
               "forgotten_still_retrieved_retrain": still_retrain,
               "trials_where_victim_was_retrieved": len(was), **stat}
    exact = part_eq == 1.0 and worst_alpha < 1e-9 and worst_read < 1e-9
    claims = [
        Claim("Exact knowledge edits: delete + insert equals a scratch build of the corrected "
              "facts", "exact (application)",
              f"{trials} trials × {n_edits} edits: partition equal {part_eq:.0%}, max |Δα| "
              f"{fmt_sci(worst_alpha)}, readout dev {fmt_sci(worst_read)}",
              REPRODUCED if exact else NOT_REPRODUCED),
        Claim("Surgical fact forgetting", "exact (application)",
              f"readout vs retrain ≤ {fmt_sci(worst_forget)}; deleted fact still retrieved: "
              f"exact {still_exact if still_exact is None else f'{still_exact:.0%}'}, decay "
              f"×{DECAY_FACTOR:g} {still_decay if still_decay is None else f'{still_decay:.0%}'}"
              f", retrained without it "
              f"{still_retrain if still_retrain is None else f'{still_retrain:.0%}'} (chance "
              "matches)",
              REPRODUCED if worst_forget < 1e-9 else NOT_REPRODUCED),
    ]
    table = markdown_table(
        ["figure", "value [95% CI over trials]"],
        [["facts retrieved, original memory", fmt_ci(stat["retrieved_before"])],
         ["facts retrieved after edits (corrected objects)", fmt_ci(stat["retrieved_after"])],
         ["facts retrieved, scratch build of corrected facts", fmt_ci(stat["retrieved_scratch"])],
         ["edited facts retrieving the new object", fmt_ci(stat["edited_retrieved_new"])],
         ["max |Δα| vs scratch (worst trial)", fmt_sci(worst_alpha)],
         ["max readout dev vs scratch (worst trial)", fmt_sci(worst_read)],
         ["after forgetting: readout dev vs retrain (worst)", fmt_sci(worst_forget)]])
    figure = _figure(ctx, rows, stat, m)
    what = (
        f"{trials} trials. Each: {n_facts} facts with keys ~ N(0, I_{d}) and objects drawn "
        f"from a codebook of {m} N(0, I_{d}) embeddings (the values); one exact `SVDDMemory` "
        f"(rbf, gamma = {GAMMA_SCALE:g}/{d}, so two unrelated facts have kernel e^-8; C = 2/N = "
        f"{C:.3g}). A fact is retrieved when the readout at its "
        "key is nearest to its object in the codebook. Edits: "
        f"{n_edits} random facts get a new (different) object by `remove` (certificate) + "
        "`add` (same key, new value). Then the memory is compared with a memory built from "
        "scratch on the corrected facts by the independent oracle (facts matched by key). "
        "Forget: one retrieved fact is removed; compared with a retrain without it; the "
        f"baseline shrinks its coefficient by {DECAY_FACTOR:g} (`coefficient_decay`)."
    )
    notes = [
        "The coefficients depend on the keys only, so an edit that keeps the key (a new "
        "object for the same subject–relation) leaves alpha unchanged: the exactness shown "
        "here is that remove + add returns the solver to the scratch optimum, and the values "
        "follow.",
        "Only support facts (alpha > 0) can be retrieved: C = 2/N guarantees that at least "
        "half the facts carry weight; at this bandwidth the fact keys are nearly orthogonal "
        "in feature space and almost all do. Reserve facts are certified not to influence any "
        "readout.",
        "A deleted fact can still be 'retrieved' by chance: its key's readout, made of "
        "the other facts' objects, can land nearest its own object among the codebook's. "
        "The memory retrained without the fact shows how often that happens; exact removal "
        "equals it, so such a match is not a trace of the deleted fact.",
        "Decay does not leave the forgotten fact retrievable here either: at this bandwidth "
        "the other facts' kernel weights at its key are ~e^-8, comparable to a 1e-2 shrink. "
        "The secret experiment shows where decay fails.",
    ]
    return ExperimentResult(
        name=NAME, title=TITLE, what=what, claims=claims,
        verdict=(f"Edits are exact (max |Δα| {fmt_sci(worst_alpha)}, readout dev "
                 f"{fmt_sci(worst_read)} vs scratch); forgetting matches retraining to "
                 f"{fmt_sci(worst_forget)}."),
        metrics=metrics, tables=[table], figures=[figure], notes=notes,
    )


def _figure(ctx: Context, rows: list[EditTrial], stat: dict, objects: int) -> str:
    plt = pyplot()
    fig, (ax, ax2) = plt.subplots(1, 2, figsize=(9, 3.6))
    names = ["retrieved_before", "retrieved_after", "retrieved_scratch", "edited_retrieved_new"]
    labels = ["original", "after edits", "scratch", "edited → new"]
    est = [stat[k]["value"] for k in names]
    err = [[stat[k]["value"] - stat[k]["ci95"][0] for k in names],
           [stat[k]["ci95"][1] - stat[k]["value"] for k in names]]
    ax.bar(labels, est, yerr=err, capsize=4, color="tab:blue")
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("fraction of facts retrieved")
    ax.set_title("Retrieval")
    # Whether the deleted fact is still retrieved does not separate the two here (both
    # rarely are: see the notes); how far each memory is from retraining does, by orders
    # of magnitude. Each trial is a point; the retrieval counts go in the tick labels,
    # beside the retrained memory's: a deleted fact's key can still read out nearest its
    # object by chance, and the memory retrained without the fact shows how often.
    was = [r for r in rows if r.forgotten_was_retrieved]
    n_retrain = sum(r.forgotten_still_retrieved_retrain for r in was)
    ticks = []
    for j, (dev, still, color, name) in enumerate([
            ("forget_readout_dev", "forgotten_still_retrieved_exact", "tab:blue",
             "exact removal"),
            ("forget_readout_dev_decay", "forgotten_still_retrieved_decay", "tab:red",
             f"decay ×{DECAY_FACTOR:g}")]):
        devs = np.maximum([getattr(r, dev) for r in rows], 1e-18)  # 0 on a log axis
        jitter = np.random.default_rng(j).uniform(-0.12, 0.12, len(devs))
        ax2.scatter(j + jitter, devs, s=18, color=color, alpha=0.7, zorder=3)
        ax2.hlines(np.median(devs), j - 0.25, j + 0.25, color="black", lw=2, zorder=4)
        n_still = sum(getattr(r, still) for r in was)
        ticks.append(f"{name}\nstill retrieved: {n_still} of {len(was)}"
                     + (f"\n(retrained without it: {n_retrain})" if j == 0 else ""))
    ax2.set_xticks([0, 1], ticks)
    ax2.set_xlim(-0.6, 1.6)
    ax2.set_yscale("log")
    ax2.set_ylabel("max |readout − retrain| over fact keys")
    ax2.set_title("Forgetting one fact: distance from retraining")
    return save_figure(fig, ctx.out, "fact_editing.png",
                       f"{len(rows)} trials (seeds [{ctx.seed}, i]); error bars: 95% bootstrap "
                       "intervals over trials. Still retrieved: the deleted fact's key still "
                       f"reads out nearest its object, a chance match among {objects} objects; "
                       "in brackets, the memory retrained without the fact",
                       quick=ctx.quick)
