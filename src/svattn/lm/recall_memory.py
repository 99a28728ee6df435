"""What a trained recall model's memories select, measured on the SVDD optimum.

The training forward of the recall grids solves each boundary's memory with the
batched solver the model carries; for the grids trained with the paper's approximate
finish (20 FISTA iterations, ``refine = 0``) its alpha can leave the box ``[0, C]`` on
trained keys, so support sizes and alpha mass read off it are the solver's, not the
memory's. Here the memory is **re-solved exactly**:

* the model runs a forward in float64 with its hybrid layers in ``mode="exact"``
  (every boundary by the certified solver; a sequence on which that path raises is
  run with the batched solver's ``"optimum"`` finish in float64 instead, which
  agrees with it to ~1e-12 in the logits, and is counted);
* each hybrid layer's input is captured, projected with the layer's ``qkv``, and
  the memory of its **last boundary** over every earlier position (the ``"full"``
  policy's memory) is solved per (sequence, head) on the float64 keys twice: by the
  certified solver (:class:`svattn.exact.SVDDMemory`, the memory an exact stream
  holds and ``forget`` certifies) and by the oracle
  (:func:`svattn.exact.oracle.solve_svdd`: Clarabel, then an exact active-set
  polish), each with its KKT residual (:func:`svattn.exact.oracle.kkt_residual`) and
  their objectives compared;
* selection is read three ways: by **count** (tokens with ``alpha > 0``), by
  **distinct keys** (exact copies of a key vector merged) and by **weight** (the
  alpha mass on each role's tokens against the role's share of the prefix).

Where trained keys repeat (a filler token's key, copied through the prefix) or their
kernel matrix is singular, the optimum is not unique: every optimum has the same
objective and the same centre, but the weight may be split among copies in many
ways. The certified solver returns a sparse optimum (a vertex); the oracle's interior
point spreads the weight over the copies. So the count by tokens is a property of the
solver there, not of the memory; the record keeps both solvers' counts, the share of
memories whose optimum is unique, and the weight by role.
"""

from __future__ import annotations

import copy

import numpy as np
import torch

from svattn.exact import SVDDMemory, kernel_matrix
from svattn.exact.oracle import kkt_residual, solve_svdd
from svattn.lm.model import CharLM
from svattn.mixers import HybridSVAttention
from svattn.nn import SolverOptions
from svattn.nn.common import resolve_gamma
from svattn.tasks import ROLES

__all__ = ["SOLVERS", "certified_variant", "hybrid_layers", "optimum_selection",
           "selection_summary"]

ROLE_NAMES = {code: name for name, code in ROLES.items()}

#: The two exact solvers each memory is re-solved by (module docstring).
SOLVERS = ("memory", "oracle")


def certified_variant(model: CharLM, mode: str = "exact") -> CharLM:
    """A float64 copy of ``model`` whose hybrid layers run ``mode``: ``"exact"`` (the
    certified solver) or ``"optimum"`` (the batched solver, ``SolverOptions()``'s
    verified-optimum finish, keeping the layer's ``max_iter``)."""
    if mode not in ("exact", "optimum"):
        raise ValueError(f"mode must be 'exact' or 'optimum', got {mode!r}")
    twin = copy.deepcopy(model).to(torch.float64).eval()
    for mod in twin.modules():
        if isinstance(mod, HybridSVAttention):
            if mode == "exact":
                mod.mode = "exact"
            else:
                mod.mode = "batched"
                mod.solver = SolverOptions(max_iter=mod.solver.max_iter)
    return twin


def hybrid_layers(model: CharLM) -> list[HybridSVAttention]:
    """The model's hybrid SV mixers, in block order."""
    return [b.mix for b in model.blocks if isinstance(b.mix, HybridSVAttention)]


@torch.no_grad()
def _layer_inputs(model: CharLM, x: torch.Tensor) -> dict[int, torch.Tensor]:
    layers = hybrid_layers(model)
    seen: dict[int, torch.Tensor] = {}
    hooks = [m.register_forward_hook(lambda mod, args, out, i=i: seen.__setitem__(i, args[0]))
             for i, m in enumerate(layers)]
    try:
        model.hidden(x)
    finally:
        for h in hooks:
            h.remove()
    return seen


def _solve_memory(X: np.ndarray, C: float, kernel: str, gamma: float) -> dict:
    """One memory over keys ``X`` (n, D), solved twice: by the certified solver
    (:class:`svattn.exact.SVDDMemory`, the memory an exact stream holds; None where it
    raises) and by the oracle (:func:`svattn.exact.oracle.solve_svdd`); their alphas,
    whether the optimum is unique (the certified solver's test) and the checks."""
    n = len(X)
    box = max(C, 1.0 / n)  # a memory over fewer than 1/C keys has its box raised (nn.masks)
    K = kernel_matrix(X, X, kernel, gamma)
    alpha, mu = solve_svdd(K, box, return_mu=True)
    out = {"box": box, "oracle": alpha, "memory": None, "unique": None, "memory_error": None,
           "kkt": {"oracle": float(kkt_residual(K, alpha, mu, box))}}
    d = np.diag(K)
    objective = {"oracle": float(alpha @ K @ alpha - d @ alpha)}
    try:
        mem = SVDDMemory(box, kernel, gamma)
        mem.extend(X)
        a = mem.alpha  # insertion order: the rows of X
        out["memory"], out["unique"] = a, bool(mem.unique_optimum())
        out["kkt"]["memory"] = float(kkt_residual(K, a, mem.mu, box))
        objective["memory"] = float(a @ K @ a - d @ a)
    except Exception as exc:  # recorded: the oracle's answer stands alone there
        out["memory_error"] = f"{type(exc).__name__}: {exc}"
    out["objective_gap"] = (abs(objective["memory"] - objective["oracle"])
                            if "memory" in objective else None)
    return out


def _measures(a: np.ndarray, X: np.ndarray, prefix: np.ndarray, box: float) -> dict:
    """Count, distinct keys, error tokens and alpha mass / support by role of one alpha."""
    sup = a > 0
    codes = np.unique(prefix)
    return {"support": int(sup.sum()), "error": int((a == box).sum()),
            "distinct": int(np.unique(X[sup], axis=0).shape[0]) if sup.any() else 0,
            "mass": {ROLE_NAMES[c]: float(a[prefix == c].sum()) for c in codes},
            "count": {ROLE_NAMES[c]: int(sup[prefix == c].sum()) for c in codes},
            "min_alpha": float(a.min()), "over_box": float((a - box).max()),
            "sum_error": float(abs(a.sum() - 1.0))}


@torch.no_grad()
def optimum_selection(model: CharLM, inputs: torch.Tensor, roles: torch.Tensor) -> dict:
    """Selection of every hybrid layer's last-boundary memory, re-solved exactly.

    Parameters
    ----------
    model : CharLM
        A trained recall model (any dtype and solver: it is copied to float64, see
        :func:`certified_variant`).
    inputs : LongTensor (N, T)
        Sequences of the model's task.
    roles : Tensor (N, T)
        The role code (:data:`svattn.tasks.ROLES`) of each position.

    Returns
    -------
    dict
        ``forward`` (sequences run by the exact path, and those run by the optimum
        finish because the exact path raised, with the first error), ``sequences``
        and ``layers``: one dict per hybrid layer (:func:`_layer_summary`): the
        memory's size (``boundary``) and ``C``; per solver of :data:`SOLVERS`
        (``by_solver``) and per head, means over sequences of ``support_per_head``
        (tokens with ``alpha > 0``), ``error_per_head`` (at the box),
        ``distinct_support_per_head`` (distinct key vectors among the support),
        ``mass_by_role`` and ``count_by_role`` (alpha mass and support tokens of each
        role); ``share_by_role`` (each role's share of the prefix); and the checks:
        the share of memories whose optimum is unique, the largest objective gap
        between the two solvers, KKT residuals, box and sum violations, and the
        memories the certified solver refused.
    """
    exact, fallback = certified_variant(model, "exact"), None
    T = inputs.shape[1]
    acc: dict[int, dict] = {}
    forward = {"exact": 0, "optimum_fallback": 0, "first_error": None}
    for s in range(len(inputs)):
        x = inputs[s : s + 1]
        try:
            seen, runner = _layer_inputs(exact, x), exact
            forward["exact"] += 1
        except Exception as exc:  # the certified solver refused this sequence: recorded
            if fallback is None:
                fallback = certified_variant(model, "optimum")
            seen, runner = _layer_inputs(fallback, x), fallback
            forward["optimum_fallback"] += 1
            if forward["first_error"] is None:
                forward["first_error"] = f"sequence {s}: {type(exc).__name__}: {exc}"
        for i, mix in enumerate(hybrid_layers(runner)):
            start = ((T - 1) // mix.chunk) * mix.chunk  # the last chunk's first position
            if start == 0:
                continue
            _, k, _ = mix.qkv_heads(seen[i].double())  # (1, H, T, Dh)
            gamma = resolve_gamma(mix.kernel, mix.gamma, k.shape[-1])
            prefix = roles[s, :start].numpy()
            rec = acc.setdefault(i, {"layer": i, "boundary": start, "C": mix.C, "rows": []})
            for h in range(mix.n_heads):
                X = k[0, h, :start].numpy()
                sol = _solve_memory(X, mix.C, mix.kernel, gamma)
                rec["rows"].append({
                    "head": h,
                    "share": {ROLE_NAMES[c]: float((prefix == c).mean())
                              for c in np.unique(prefix)},
                    "by_solver": {name: _measures(sol[name], X, prefix, sol["box"])
                                  for name in SOLVERS if sol[name] is not None},
                    "unique": sol["unique"], "objective_gap": sol["objective_gap"],
                    "kkt": sol["kkt"], "memory_error": sol["memory_error"]})
    return {"forward": forward, "sequences": len(inputs),
            "layers": [_layer_summary(acc[i]) for i in sorted(acc)]}


def _layer_summary(rec: dict) -> dict:
    rows = rec["rows"]
    heads = sorted({r["head"] for r in rows})
    roles = sorted({k for r in rows for k in r["share"]})
    by_solver = {}
    for name in SOLVERS:
        got = [r for r in rows if name in r["by_solver"]]
        if not got:
            continue

        def per_head(get, got=got, name=name) -> list[float]:
            return [float(np.mean([get(r["by_solver"][name]) for r in got if r["head"] == h]))
                    for h in heads]

        by_solver[name] = {
            "memories": len(got),
            "support_per_head": per_head(lambda m: m["support"]),
            "error_per_head": per_head(lambda m: m["error"]),
            "distinct_support_per_head": per_head(lambda m: m["distinct"]),
            "mass_by_role": {k: per_head(lambda m, k=k: m["mass"].get(k, 0.0)) for k in roles},
            "count_by_role": {k: per_head(lambda m, k=k: m["count"].get(k, 0)) for k in roles},
            "min_alpha": min(r["by_solver"][name]["min_alpha"] for r in got),
            "max_alpha_over_box": max(r["by_solver"][name]["over_box"] for r in got),
            "max_sum_error": max(r["by_solver"][name]["sum_error"] for r in got),
            "max_kkt_residual": max(r["kkt"][name] for r in got)}
    uniq = [r["unique"] for r in rows if r["unique"] is not None]
    gaps = [r["objective_gap"] for r in rows if r["objective_gap"] is not None]
    return {"layer": rec["layer"], "boundary": rec["boundary"], "C": rec["C"],
            "memories": len(rows), "by_solver": by_solver,
            "share_by_role": {k: float(np.mean([r["share"].get(k, 0.0) for r in rows]))
                              for k in roles},
            "unique_optimum_share": float(np.mean(uniq)) if uniq else None,
            "max_objective_gap": max(gaps) if gaps else None,
            "memory_refused": sum(r["memory_error"] is not None for r in rows),
            "first_memory_error": next((r["memory_error"] for r in rows
                                        if r["memory_error"] is not None), None)}


def selection_summary(layers: list[dict], solver: str = "memory", role: str = "data") -> dict:
    """One model's figures from :func:`optimum_selection`'s layers, by ``solver`` (one of
    :data:`SOLVERS`): means over layers and heads of the support by count and by
    distinct key, and ``role``'s alpha mass and share of the support against its share
    of the prefix.

    Examples
    --------
    >>> lay = {"layer": 0, "share_by_role": {"data": 0.1, "filler": 0.9}, "by_solver": {
    ...     "memory": {"support_per_head": [4.0, 6.0], "distinct_support_per_head": [2.0, 3.0],
    ...                "mass_by_role": {"data": [0.5, 0.7], "filler": [0.5, 0.3]},
    ...                "count_by_role": {"data": [2.0, 2.0], "filler": [2.0, 4.0]}}}}
    >>> s = selection_summary([lay])
    >>> s["support_per_head"], s["distinct_support_per_head"], s["data_mass"], s["data_share"]
    (5.0, 2.5, 0.6, 0.1)
    """
    got = [x["by_solver"][solver] for x in layers if solver in x["by_solver"]]
    if not got:
        raise ValueError(f"selection_summary: no layer measured by {solver!r}")

    def flat(key: str) -> list[float]:
        return [v for x in got for v in x[key]]

    zeros = [[0.0] * len(x["support_per_head"]) for x in got]
    mass = [v for x, z in zip(got, zeros, strict=True)
            for v in x["mass_by_role"].get(role, z)]
    count = [c / n if n else 0.0 for x, z in zip(got, zeros, strict=True)
             for c, n in zip(x["count_by_role"].get(role, z), x["support_per_head"], strict=True)]
    return {"support_per_head": float(np.mean(flat("support_per_head"))),
            "distinct_support_per_head": float(np.mean(flat("distinct_support_per_head"))),
            f"{role}_mass": float(np.mean(mass)),
            f"{role}_support_share": float(np.mean(count)),
            f"{role}_share": float(np.mean([x["share_by_role"].get(role, 0.0)
                                            for x in layers]))}
