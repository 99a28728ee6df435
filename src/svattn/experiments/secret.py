"""``secret``: does a deleted secret token still leak through a probe query?

A stream of ordinary tokens carries one distinctive *secret* token (key and
value three times the spread of the others). The secret is deleted by

* exact removal from the SV memory (``SVDDMemory.remove``);
* coefficient decay of its SV weight by factors 1e-1 … 1e-6 (no re-solve);
* for the fixed-state memories, the best available subtraction: linear
  attention subtracts ``phi(k) v^T`` and ``phi(k)`` (exact, its state is a
  sum); DeltaNet erases the secret key's direction, ``S ← S (I − k̂ k̂^T)``
  (its state depends on write order, so nothing exact exists).

Each is compared with the same memory retrained on the stream without the
secret, at a probe query next to the secret key.

Detection rule
--------------
``leak = <o(q) − o_retrain(q), v_s> / ‖v_s‖²``: the fraction of the secret value
that shows in the output beyond what the retrained memory gives. The secret
*leaks* when ``leak > 0.01`` (1 % of the secret value comes through).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from svattn.exact import SVDDMemory
from svattn.experiments._common import (
    NOT_REPRODUCED,
    PARTLY,
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
from svattn.memory import DeltaNetMemory, LinearAttentionMemory
from svattn.unlearning import coefficient_decay

NAME = "secret"
TITLE = "Secret-token deletion: exact removal vs coefficient decay vs subtraction"

LEAK_THRESHOLD = 0.01
FACTORS = (1e-1, 1e-2, 1e-3, 1e-4, 1e-5, 1e-6)


def leak_score(output: np.ndarray, reference: np.ndarray, secret_value: np.ndarray) -> float:
    """``<output − reference, v_s> / ‖v_s‖²`` (the detection statistic).

    Examples
    --------
    >>> import numpy as np
    >>> leak_score(np.array([1.0, 0.0]), np.zeros(2), np.array([2.0, 0.0]))
    0.5
    """
    v = np.asarray(secret_value, dtype=np.float64)
    return float(np.dot(np.asarray(output) - np.asarray(reference), v) / np.dot(v, v))


@dataclass(frozen=True)
class SecretTrial:
    """Leak scores and output changes of every deletion method in one trial.

    Attributes
    ----------
    in_support : bool
        The secret carried SV weight before deletion (alpha > 0).
    leak : dict of str to float
        :func:`leak_score` at the probe per method (``"sv exact"``,
        ``"sv decay x<f>"``, ``"linear subtract"``, ``"deltanet erase"``).
    deviation : dict of str to float
        ``max_j |o(q) − o_retrain(q)|_j`` at the probe per method.
    """

    in_support: bool
    leak: dict[str, float]
    deviation: dict[str, float]


def secret_trial(
    keys: np.ndarray,
    values: np.ndarray,
    position: int,
    probe: np.ndarray,
    *,
    C: float,
    kernel: str = "rbf",
    factors: Sequence[float] = FACTORS,
    fixed_state: bool = True,
) -> SecretTrial:
    """Delete token ``position`` (the secret) by every method; score each at ``probe``.

    Parameters
    ----------
    keys, values : ndarray, shapes (n, d), (n, dv)
        The stream, secret included.
    position : int
        Index of the secret in the stream.
    probe : ndarray, shape (d,)
        The probe query (near the secret key).
    C : float
        Box bound of the SV memory.
    kernel : {"rbf", "exp"}
        Kernel of the SV memory (default gamma).
    factors : sequence of float
        Decay factors to try.
    fixed_state : bool
        Also run linear attention and DeltaNet.

    Returns
    -------
    SecretTrial

    Examples
    --------
    >>> import numpy as np
    >>> rng = np.random.default_rng(0)
    >>> keys, values = rng.normal(size=(60, 4)), rng.normal(size=(60, 4))
    >>> keys[7], values[7] = 3 * rng.normal(size=4), [6.0, 0, 0, 0]
    >>> t = secret_trial(keys, values, 7, keys[7], C=0.1, factors=[1e-3])
    >>> abs(t.leak["sv exact"]) < 1e-9, t.leak["sv decay x0.001"] > 0.01
    (True, True)
    """
    keys = np.asarray(keys, dtype=np.float64)
    values = np.asarray(values, dtype=np.float64)
    n, d = keys.shape
    if not 0 <= position < n:
        raise ValueError(f"position must index the stream (0..{n - 1}), got {position}")
    q = np.asarray(probe, dtype=np.float64).reshape(1, d)
    v_s = values[position]
    keep = np.delete(np.arange(n), position)
    leak: dict[str, float] = {}
    dev: dict[str, float] = {}

    def score(name: str, out: np.ndarray, ref: np.ndarray) -> None:
        leak[name] = leak_score(out[0], ref[0], v_s)
        dev[name] = float(np.max(np.abs(out[0] - ref[0])))

    memory = SVDDMemory(C, kernel)
    ids = memory.extend(keys, values)
    retrained = SVDDMemory(C, kernel)
    retrained.extend(keys[keep], values[keep])
    ref = retrained.readout(q)
    in_support = ids[position] in set(memory.support_ids())
    after = copy.deepcopy(memory)
    after.remove(ids[position])
    score("sv exact", after.readout(q), ref)
    for f in factors:
        score(f"sv decay x{f:g}", coefficient_decay(memory, ids[position], f).readout(q), ref)
    if fixed_state:
        for name, cls in (("linear subtract", LinearAttentionMemory),
                          ("deltanet erase", DeltaNetMemory)):
            full = cls(dim=d, value_dim=values.shape[1], budget=None)
            base = cls(dim=d, value_dim=values.shape[1], budget=None)
            for t in range(n):  # the per-token numpy recurrence (cheaper than chunks here)
                full.write(keys[t], values[t])
                if t != position:
                    base.write(keys[t], values[t])
            if cls is LinearAttentionMemory:
                phi = np.where(keys[position] > 0, keys[position] + 1.0,
                               np.exp(np.minimum(keys[position], 0.0)))
                full.state -= np.outer(phi, v_s)
                full.normalizer -= phi
            else:
                k = keys[position] / np.linalg.norm(keys[position])
                full.state -= np.outer(k, k @ full.state)  # S^T ← (I − k k^T) S^T
            score(name, full.read(q), base.read(q))
    return SecretTrial(bool(in_support), leak, dev)


def make_stream(rng: np.random.Generator, n: int, d: int = 8, dv: int = 8, scale: float = 3.0):
    """``n`` N(0, I) keys and values with one secret (``scale`` × spread) at a random place.

    Returns ``keys, values, position, probe`` (probe = secret key + N(0, 0.1²) noise).
    """
    keys, values = rng.normal(size=(n, d)), rng.normal(size=(n, dv))
    position = int(rng.integers(n))
    keys[position] = scale * rng.normal(size=d)
    values[position] = scale * rng.normal(size=dv)
    probe = keys[position] + 0.1 * rng.normal(size=d)
    return keys, values, position, probe


def run(ctx: Context) -> ExperimentResult:
    """Both kernels, many trials; leak rates with bootstrap intervals."""
    n, trials, C = (60, 8, 0.1) if ctx.quick else (200, 200, 0.05)
    results: dict[str, list[SecretTrial]] = {}
    for kernel in ("rbf", "exp"):
        rows = []
        for i in progress(range(trials), desc=f"secret/{kernel}"):
            rng = np.random.default_rng([ctx.seed, i])
            keys, values, pos, probe = make_stream(rng, n)
            rows.append(secret_trial(keys, values, pos, probe, C=C, kernel=kernel,
                                     fixed_state=kernel == "rbf"))
        results[kernel] = rows
    methods = ["sv exact", *[f"sv decay x{f:g}" for f in FACTORS]]
    metrics: dict = {"config": {"n": n, "trials": trials, "C": C, "d": 8, "dv": 8,
                                "secret_scale": 3.0, "probe_noise": 0.1,
                                "leak_threshold": LEAK_THRESHOLD}, "kernels": {}}
    table_rows = []
    for kernel, rows in results.items():
        per = {}
        names = methods + (["linear subtract", "deltanet erase"] if kernel == "rbf" else [])
        for m in names:
            leaks = np.array([r.leak[m] > LEAK_THRESHOLD for r in rows], dtype=float)
            devs = np.array([r.deviation[m] for r in rows])
            est, lo, hi = bootstrap_ci(leaks, seed=ctx.seed)
            per[m] = {"leak_rate": est, "leak_rate_ci95": [lo, hi],
                      "median_leak": float(np.median([r.leak[m] for r in rows])),
                      "max_output_change_vs_retrain": float(devs.max()),
                      "median_output_change_vs_retrain": float(np.median(devs))}
            table_rows.append([kernel, m, f"{est:.2f} [{lo:.2f}, {hi:.2f}]",
                               fmt_sci(per[m]["median_leak"]),
                               fmt_sci(per[m]["median_output_change_vs_retrain"]),
                               fmt_sci(per[m]["max_output_change_vs_retrain"])])
        per["secret_in_support"] = float(np.mean([r.in_support for r in rows]))
        metrics["kernels"][kernel] = per
    figure = _figure(ctx, metrics, trials)
    k = metrics["kernels"]
    extreme = f"sv decay x{FACTORS[-1]:g}"
    leak_extreme = {kern: k[kern][extreme]["leak_rate"] for kern in k}
    exact_dev = max(k[kern]["sv exact"]["max_output_change_vs_retrain"] for kern in k)
    top, low = max(leak_extreme.values()), min(leak_extreme.values())
    claims = [
        Claim(f"Coefficient decay leaks the secret even at extreme shrink (×{FACTORS[-1]:g})",
              "~80% of trials",
              ", ".join(f"{kern} kernel {leak_extreme[kern]:.0%}" for kern in k),
              REPRODUCED if low >= 0.6 else PARTLY + " (kernel-dependent)" if top >= 0.6
              else NOT_REPRODUCED),
        Claim("Exact SV deletion changes outputs vs retrain by", "< 1e-9",
              f"max {fmt_sci(exact_dev)} over {2 * trials} trials",
              REPRODUCED if exact_dev < 1e-9 else NOT_REPRODUCED),
    ]
    what = (
        f"{trials} trials per kernel. Stream: {n} tokens, keys and values ~ N(0, I_8); one "
        "secret token at a random position with key and value 3·N(0, I_8) (three times the "
        f"spread). SV memory: exact `SVDDMemory`, C = {C}, default gamma (rbf: 1/d, exp: "
        "1/sqrt(d)). Probe: the secret key plus N(0, 0.1²) noise. Reference: the same memory "
        "retrained on the stream without the secret.\n\n"
        "**Detection rule**: leak = <o(q) − o_retrain(q), v_s> / ‖v_s‖², the fraction of the "
        "secret value in the probe's output beyond what the retrained memory gives; the "
        f"secret leaks when leak > {LEAK_THRESHOLD}.\n\n"
        "Methods: exact removal (`SVDDMemory.remove`); coefficient decay α_s ← f·α_s with "
        "renormalisation and no re-solve (`svattn.unlearning.coefficient_decay`); for "
        "fixed-state memories (rbf trials only, they have no kernel) the best available "
        "subtraction: linear attention subtracts φ(k_s) v_sᵀ and φ(k_s) (exact: its state is "
        "a sum); DeltaNet erases the secret key's direction S ← S(I − k̂k̂ᵀ) (its state "
        "depends on the write order: no exact deletion exists)."
    )
    notes = []
    if low < 0.6:
        notes.append(
            f"Decay leaks in fewer trials than the paper's ~80% at ×{FACTORS[-1]:g} on at "
            "least one kernel: with the rbf kernel the secret's kernel weight at the probe "
            "is ~1 while the others' are small but not 1e-6-small, so shrinking α by 1e-6 "
            "often silences it; the exp (softmax) "
            "kernel rewards the secret's large norm and leaks more. The paper's key scale and "
            "kernel for this test are not stated; we did not tune the secret's scale.")
    notes.append(
        "Linear-attention subtraction is exact because its state is a sum; the fixed-state "
        "weakness is DeltaNet's order-dependent state (and, elsewhere, capacity).")
    return ExperimentResult(
        name=NAME, title=TITLE, what=what, claims=claims,
        verdict=(f"Exact removal leaves no trace (max output change {fmt_sci(exact_dev)}); decay "
                 f"at ×{FACTORS[-1]:g} leaks in "
                 + ", ".join(f"{leak_extreme[kern]:.0%} ({kern})" for kern in k)
                 + " of trials."),
        metrics=metrics,
        tables=[markdown_table(["kernel", "method", "leak rate [95% CI]", "median leak",
                                "median |Δo| vs retrain", "max |Δo| vs retrain"], table_rows)],
        figures=[figure], notes=notes,
    )


def _figure(ctx: Context, metrics: dict, trials: int) -> str:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 4))
    x = np.array(FACTORS)
    for kernel, color in (("rbf", "tab:red"), ("exp", "tab:purple")):
        per = metrics["kernels"][kernel]
        rates = [per[f"sv decay x{f:g}"] for f in FACTORS]
        est = np.array([r["leak_rate"] for r in rates])
        lo = np.array([r["leak_rate_ci95"][0] for r in rates])
        hi = np.array([r["leak_rate_ci95"][1] for r in rates])
        ax.plot(x, est, "o-", color=color, label=f"SV coefficient decay ({kernel})")
        ax.fill_between(x, lo, hi, color=color, alpha=0.2)
    per = metrics["kernels"]["rbf"]
    for name, color in (("linear subtract", "tab:green"), ("deltanet erase", "tab:orange")):
        est, (lo, hi) = per[name]["leak_rate"], per[name]["leak_rate_ci95"]
        ax.axhspan(lo, hi, color=color, alpha=0.15, zorder=1)
        ax.axhline(est, color=color, ls="--", lw=1, zorder=2, label=f"{name} ({est:.0%})")
    # The key result: drawn last, thick and marked, so no baseline at the same rate hides it
    # (one line when both kernels give the same rate: two would hide each other)
    exact = {k: metrics["kernels"][k]["sv exact"]["leak_rate"] for k in ("rbf", "exp")}
    lines = ([("rbf and exp", "black", "s", exact["rbf"])] if exact["rbf"] == exact["exp"] else
             [("rbf", "tab:red", "s", exact["rbf"]), ("exp", "tab:purple", "D", exact["exp"])])
    for kernels, color, marker, rate in lines:
        ax.plot(x, np.full(len(x), rate), ls="-", lw=3, color="black", marker=marker, ms=7,
                markerfacecolor=color, markeredgecolor="black", zorder=6,
                label=f"SV exact removal ({kernels}): {rate:.0%} leak")
    ax.annotate(f"SV exact removal: {max(exact.values()):.0%} of trials leak, both kernels",
                xy=(x[len(x) // 2], max(exact.values())), xytext=(0, 12),
                textcoords="offset points", ha="center", fontsize=8, fontweight="bold",
                zorder=7)
    ax.set_xscale("log")
    ax.invert_xaxis()
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("decay factor f (α_secret ← f·α_secret)")
    ax.set_ylabel(f"fraction of trials leaking (leak > {LEAK_THRESHOLD})")
    ax.set_title("Does the deleted secret still show at a probe near its key?")
    ax.legend(fontsize=7, loc="center left")
    return save_figure(fig, ctx.out, "secret_leak_rate.png",
                       f"{trials} trials per kernel (seeds [{ctx.seed}, i]); bands: 95% bootstrap "
                       "intervals over trials", quick=ctx.quick)
