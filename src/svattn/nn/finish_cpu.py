"""The optimum finish of the batched solver: the SVDD optimum of every problem (numba, float64).

After FISTA (a warm start only), each problem ``min aᵀKa − dᵀa`` s.t. ``Σa = 1``,
``0 <= a <= C`` is solved to its optimum here, problem by problem, in float64 on the
host (``K`` computed in float64 from the keys, :func:`svattn.nn.batched.kernel_problem`):

1. **Copies merged.** Keys equal up to the rounding of their dtype
   (``‖x_i − x_j‖ <= MERGE_EPS·eps·max ‖x‖``, :data:`MERGE_EPS`; bit-for-bit duplicates
   and keys one computation made twice) form a group of ``m`` copies; only their sum
   ``β = Σ a`` enters the objective (to that rounding), with the box
   ``0 <= β <= m·C``. The reduced problem over the distinct keys, the copies at their
   first key, is the one solved (with copies on the margin ``K_SS`` is singular to
   working precision; merged, it is not). The groups are formed by
   :func:`svattn.nn.groups_cpu.groups_windowed` (only pairs whose projections on a
   fixed direction are close are compared); :func:`copy_groups_reference` compares every
   pair and gives the same groups.
2. **Primal-dual active set** (bulk moves) from the partition of FISTA's iterate, on
   the **unridged** bordered system ``[[2 K_SS, 1], [1ᵀ, 0]] [β_S; μ] = [d_S − 2 K_SE
   c_E; 1 − Σ c_E]`` (``c = m·C``), LU with partial pivoting; a round moves margin
   tokens outside the box to a bound and bound tokens with the wrong sign of
   ``g = 2Kβ − d + μ`` to the margin.
3. If that has not settled after :data:`BULK_ROUNDS` rounds, a **primal active set**
   from FISTA's feasible iterate (the objective decreases monotonically: step to the
   face optimum or to the first bound on the way, then free the worst violator).
4. The answer is **verified** per problem: box and sum on every key, the KKT signs of
   the reduced problem (in units of the largest diagonal of the rescaled ``K``; on the
   keys themselves the copies' ``g`` differ by their first-order distance, which
   ``BatchedInfo.max_kkt_violation`` shows); a problem that fails — a face too
   ill-conditioned to factor (near-duplicate keys), or no convergence within the
   rounds — is marked, and :func:`svattn.nn.finish.finish_optimum` re-solves it with
   the exact oracle (:func:`svattn.exact.oracle.solve_svdd`).

**Copies.** A merged group's ``β`` is spread over its copies as a vertex of the
group's box: the first ``k = ⌊β/C⌋`` copies (in key order) at ``C``, the next at the
remainder, the rest at 0. All copies share one ``g``, so this is a KKT point of the
problem over all keys, with at most one copy per group on the margin: the final
partition's bordered system (the backward's) stays nonsingular. Every readout depends
on the keys only through the groups' sums, so any split gives the same output.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from svattn.nn.groups_cpu import groups_windowed, sort_direction
from svattn.nn.partition_cpu import lu_factor_small, lu_solve_small

__all__ = ["BULK_ROUNDS", "MERGE_EPS", "PRIMAL_ROUNDS", "copy_groups_reference", "finish_loop",
           "solve_reduced", "spread_groups", "verify_loop"]

# Keys this close, relative to their norm and in units of their dtype's eps
# (``‖x_i − x_j‖ <= MERGE_EPS·eps·max ‖x‖``), count as copies of one key: they differ by
# the rounding of the computation that made them, and the split of their weight is not
# determined by the data at working precision (the margin system is singular to it).
MERGE_EPS = 64.0
# Primal-dual rounds before the primal active set takes over.
BULK_ROUNDS = 16
# Primal active-set steps (each moves one token), on top of the problem's size.
PRIMAL_ROUNDS = 64


@njit(cache=True, nogil=True)
def _groups(X, valid, rel, rep, mult):  # pragma: no cover - compiled
    """``rep[i]``: the first key ``r`` with ``‖x_i − x_r‖ <= rel·max(‖x_i‖, ‖x_r‖)`` (-1:
    absent); ``mult[r]``: copies of representative ``r``. Returns the representatives."""
    n, D = X.shape
    sq = np.empty(n)
    for i in range(n):
        acc = 0.0
        for t in range(D):
            acc += X[i, t] * X[i, t]
        sq[i] = acc
    for i in range(n):
        rep[i] = -1
        mult[i] = 0
    reps = np.empty(n, dtype=np.int64)
    m = 0
    for i in range(n):
        if not valid[i] or rep[i] >= 0:
            continue
        rep[i] = i
        mult[i] = 1
        reps[m] = i
        m += 1
        for j in range(i + 1, n):
            if valid[j] and rep[j] < 0:
                dist = 0.0
                for t in range(D):
                    dist += (X[i, t] - X[j, t]) ** 2
                if dist <= rel * rel * max(sq[i], sq[j]):
                    rep[j] = i
                    mult[i] += 1
    return reps[:m]


@njit(cache=True, nogil=True)
def _face(Kr, dr, cap, st, x, direction):  # pragma: no cover - compiled
    """Optimum on the face ``st`` (0 R, 1 S, 2 E): ``x`` written (E at cap, R at 0),
    returns ``(mu, ok)``; ok False when the face has no finite optimum (then
    ``direction`` holds a null direction, nonzero on S only) or the solution is not
    finite. S empty: ``mu`` is 0, ok tells whether the face holds ``Σ = 1``."""
    m = Kr.shape[0]
    s = 0
    cE = 0.0
    for a in range(m):
        direction[a] = 0.0
        if st[a] == 1:
            s += 1
        elif st[a] == 2:
            cE += cap[a]
    for a in range(m):
        x[a] = cap[a] if st[a] == 2 else 0.0
    if s == 0:
        return 0.0, abs(1.0 - cE) <= 1e-12
    idx = np.empty(s, dtype=np.int64)
    c = 0
    for a in range(m):
        if st[a] == 1:
            idx[c] = a
            c += 1
    M = np.zeros((s + 1, s + 1))
    rhs = np.empty(s + 1)
    big = 0.0
    for a in range(s):
        ia = idx[a]
        for b in range(s):
            M[a, b] = 2.0 * Kr[ia, idx[b]]
        if M[a, a] > big:
            big = M[a, a]
        M[a, s] = 1.0
        M[s, a] = 1.0
        ke = 0.0
        for e in range(m):
            if st[e] == 2:
                ke += Kr[ia, e] * cap[e]
        rhs[a] = dr[ia] - 2.0 * ke
    rhs[s] = 1.0 - cE
    M0 = M.copy()
    piv = np.empty(s + 1, dtype=np.int64)
    lu_factor_small(M, piv)
    # a pivot below this is rounding: the face is (numerically) singular
    tiny = 1e-13 * max(big, 1.0)
    singular = False
    for a in range(s + 1):
        if abs(M[a, a]) <= tiny:
            singular = True
    if singular:
        # near copies on the margin: the minimum-norm solution, if it solves the system
        # (consistent: every solution gives the same g); else no finite face optimum
        z = np.linalg.lstsq(M0, rhs, rcond=1e-13)[0]
        res = 0.0
        scale = 1.0
        for a in range(s + 1):
            acc = 0.0
            for b in range(s + 1):
                acc += M0[a, b] * z[b]
            res = max(res, abs(acc - rhs[a]))
            scale = max(scale, abs(rhs[a]))
        if not res <= 1e-11 * scale:
            # inconsistent: the objective is linear along a null direction of the face
            # (sum 0 by the border row); written to ``direction`` for the primal steps
            vt = np.linalg.svd(M0)[2]
            for a in range(m):
                direction[a] = 0.0
            for a in range(s):
                direction[idx[a]] = vt[s, a]
            return 0.0, False
    else:
        z = rhs.copy()
        lu_solve_small(M, piv, z)
    for a in range(s + 1):
        if not np.isfinite(z[a]):
            return 0.0, False
    for a in range(s):
        x[idx[a]] = z[a]
    return z[s], True


@njit(cache=True, nogil=True)
def _gvec(Kr, dr, x, mu, g):  # pragma: no cover - compiled
    m = Kr.shape[0]
    for a in range(m):
        acc = 0.0
        for b in range(m):
            acc += Kr[a, b] * x[b]
        g[a] = 2.0 * acc - dr[a] + mu


@njit(cache=True, nogil=True)
def _empty_mu(g0, st, cap):  # pragma: no cover - compiled
    """Empty margin set: the largest mu with every ``g_E <= 0`` (the convention of
    :func:`svattn.exact.core.conventions.mu_for_empty_margin`), 0 without E."""
    mu = np.inf
    for a in range(st.shape[0]):
        if st[a] == 2 and -g0[a] < mu:
            mu = -g0[a]
    return mu if np.isfinite(mu) else 0.0


@njit(cache=True, nogil=True)
def _free_one(Kr, dr, cap, st, x, g):  # pragma: no cover - compiled
    """An empty margin set whose bound tokens miss ``Σ = 1``: free the bound token whose
    gradient at ``x`` favours it most (a reserve one if the error set holds less than 1,
    else an error one). False if there is none."""
    m = Kr.shape[0]
    _gvec(Kr, dr, x, 0.0, g)
    cE = 0.0
    for a in range(m):
        if st[a] == 2:
            cE += cap[a]
    best = -1
    for a in range(m):
        if (cE < 1.0 and st[a] == 0) or (cE >= 1.0 and st[a] == 2):
            if best < 0 or (g[a] < g[best] if cE < 1.0 else g[a] > g[best]):
                best = a
    if best < 0:
        return False
    st[best] = 1
    return True


@njit(cache=True, nogil=True)
def _bulk(Kr, dr, cap, st, x, g, tol, rounds):  # pragma: no cover - compiled
    """Primal-dual active set; returns ``(mu, settled)``."""
    m = Kr.shape[0]
    direction = np.zeros(m)
    for _ in range(rounds):
        mu, ok = _face(Kr, dr, cap, st, x, direction)
        s = 0
        for a in range(m):
            s += st[a] == 1
        if s == 0 and not ok:
            if not _free_one(Kr, dr, cap, st, x, g):
                return 0.0, False
            continue
        if not ok:
            return 0.0, False
        if s == 0:
            _gvec(Kr, dr, x, 0.0, g)
            mu = _empty_mu(g, st, cap)
            for a in range(m):
                g[a] += mu
        else:
            _gvec(Kr, dr, x, mu, g)
        moved = False
        for a in range(m):
            if st[a] == 1:
                if x[a] < 0.0:
                    st[a] = 0
                    moved = True
                elif x[a] > cap[a]:
                    st[a] = 2
                    moved = True
            elif st[a] == 2 and g[a] > tol:
                st[a] = 1
                moved = True
            elif st[a] == 0 and g[a] < -tol:
                st[a] = 1
                moved = True
        if not moved:
            return mu, True
    return 0.0, False


@njit(cache=True, nogil=True)
def _primal(Kr, dr, cap, x0, st, x, g, tol, rounds):  # pragma: no cover - compiled
    """Primal active set from the feasible ``x0``; returns ``(mu, settled)``."""
    m = Kr.shape[0]
    cur = x0.copy()
    for a in range(m):
        if cur[a] <= 0.0:
            cur[a] = 0.0
            st[a] = 0
        elif cur[a] >= cap[a]:
            cur[a] = cap[a]
            st[a] = 2
        else:
            st[a] = 1
    direction = np.zeros(m)
    for _ in range(rounds):
        mu, ok = _face(Kr, dr, cap, st, x, direction)
        s = 0
        for a in range(m):
            s += st[a] == 1
        if s == 0 and not ok:
            # the face misses Σ = 1 (cur sits on it up to rounding)
            if not _free_one(Kr, dr, cap, st, cur, g):
                return 0.0, False
            continue
        if not ok:
            # no finite face optimum: walk along the null direction, downhill, to the
            # first bound (the oracle's rule, svattn.exact.oracle._polish)
            nrm = 0.0
            slope = 0.0
            _gvec(Kr, dr, cur, 0.0, g)
            for a in range(m):
                nrm += direction[a] * direction[a]
                slope += g[a] * direction[a]
            if not nrm > 0.0:
                return 0.0, False
            sign = -1.0 if slope > 0.0 else 1.0
            t_best = np.inf
            j = -1
            for a in range(m):
                p = sign * direction[a]
                if st[a] != 1 or p == 0.0:
                    continue
                t = cur[a] / -p if p < 0.0 else (cap[a] - cur[a]) / p
                t = max(t, 0.0)
                if t < t_best:
                    t_best = t
                    j = a
            if j < 0:
                return 0.0, False
            for a in range(m):
                if st[a] == 1:
                    cur[a] = min(max(cur[a] + t_best * sign * direction[a], 0.0), cap[a])
            to_error = sign * direction[j] > 0.0
            cur[j] = cap[j] if to_error else 0.0
            st[j] = 2 if to_error else 0
            continue
        # ratio test along cur -> x: the first margin token to hit a bound
        t_best = 2.0
        j = -1
        for a in range(m):
            if st[a] != 1:
                continue
            p = x[a] - cur[a]
            if x[a] < 0.0 and p < 0.0:
                t = cur[a] / -p
            elif x[a] > cap[a] and p > 0.0:
                t = (cap[a] - cur[a]) / p
            else:
                continue
            t = max(t, 0.0)
            if t < t_best:
                t_best = t
                j = a
        if j >= 0:
            for a in range(m):
                if st[a] == 1:
                    v = cur[a] + t_best * (x[a] - cur[a])
                    cur[a] = min(max(v, 0.0), cap[a])
            to_error = x[j] > cap[j]
            cur[j] = cap[j] if to_error else 0.0
            st[j] = 2 if to_error else 0
            continue
        for a in range(m):
            cur[a] = x[a]
        if s == 0:
            _gvec(Kr, dr, cur, 0.0, g)
            mu = _empty_mu(g, st, cap)
            for a in range(m):
                g[a] += mu
        else:
            _gvec(Kr, dr, cur, mu, g)
        worst = -1
        wv = tol
        for a in range(m):
            v = g[a] if st[a] == 2 else (-g[a] if st[a] == 0 else 0.0)
            if v > wv:
                wv = v
                worst = a
        if worst < 0:
            return mu, True
        st[worst] = 1
    return 0.0, False


@njit(cache=True, nogil=True)
def _spread(beta, reps, rep, mult, C, alpha, S, E):  # pragma: no cover - compiled
    """A group's sum over its copies as a vertex of its box (module docstring)."""
    n = rep.shape[0]
    for i in range(n):
        alpha[i] = 0.0
        S[i] = False
        E[i] = False
    for a in range(reps.shape[0]):
        r = reps[a]
        b = beta[a]
        k = 0
        if b >= mult[r] * C:
            k = mult[r]
        elif b > 0.0:
            k = min(int(np.floor(b / C)), mult[r] - 1)
        rem = b - k * C if k < mult[r] else 0.0
        c = 0
        for i in range(r, n):
            if rep[i] != r:
                continue
            if c < k:
                alpha[i] = C
                E[i] = True
            elif c == k and rem > 0.0:
                if rem >= C:
                    alpha[i] = C
                    E[i] = True
                else:
                    alpha[i] = rem
                    S[i] = True
            c += 1


@njit(cache=True, nogil=True)
def _solve_reduced(Kr, dr, cap, b0, st, x, tol, bulk, primal):  # pragma: no cover - compiled
    """Steps 2 and 3 on one reduced problem: the primal-dual active set from the
    partition ``st``, then, if it has not settled, the primal one from the feasible
    ``b0``. ``x`` and ``st`` are written; returns ``(mu, settled)``."""
    m = Kr.shape[0]
    g = np.empty(m)
    mu, good = _bulk(Kr, dr, cap, st, x, g, tol, bulk)
    if not good:
        mu, good = _primal(Kr, dr, cap, b0, st, x, g, tol, primal + 2 * m)
    return mu, good


def solve_reduced(Kr, dr, cap, b0, st, tol, bulk=BULK_ROUNDS, primal=PRIMAL_ROUNDS):
    """One reduced problem (copies merged: ``cap`` = copies·C) as :func:`finish_loop`
    solves each of its own: float64 ``Kr`` (m, m), ``dr`` (m,), ``cap`` (m,), a feasible
    ``b0`` (m,) and a starting partition ``st`` (m,) int8 (0 R, 1 S, 2 E; overwritten).

    Returns ``x`` (m,), ``mu`` and whether it settled (not yet verified)."""
    x = np.empty(Kr.shape[0])
    mu, good = _solve_reduced(np.ascontiguousarray(Kr), np.ascontiguousarray(dr),
                              np.ascontiguousarray(cap), np.ascontiguousarray(b0), st, x,
                              float(tol), int(bulk), int(primal))
    return x, float(mu), bool(good)


def copy_groups_reference(X, valid, rel):
    """The copy groups of one problem's keys ``X`` (n, D) float64, ``valid`` (n,), as
    :func:`finish_loop` forms them (every pair compared): ``rep`` (n,) the first key of
    each key's group (-1: absent), ``mult`` (n,) copies per representative, and the
    representatives in key order. :func:`svattn.nn.groups_cpu.copy_groups` is the fast
    form (the same groups), which :func:`finish_loop` runs."""
    n = X.shape[0]
    rep = np.empty(n, dtype=np.int64)
    mult = np.empty(n, dtype=np.int64)
    reps = _groups(np.ascontiguousarray(X, dtype=np.float64), np.ascontiguousarray(valid),
                   float(rel), rep, mult)
    return rep, mult, reps


@njit(cache=True, nogil=True)
def _finish(K, d, X, valid, rel, u, a0, C, tol, bulk, primal, alpha, mu, S, E, ok,
            reps_out):  # pragma: no cover - compiled
    P, n = valid.shape
    mult = np.empty(n, dtype=np.int64)
    for p in range(P):
        rep = reps_out[p]
        reps = groups_windowed(X[p], valid[p], rel, u, rep, mult)  # _groups' groups, faster
        m = reps.shape[0]
        Kr = np.empty((m, m))
        dr = np.empty(m)
        cap = np.empty(m)
        b0 = np.zeros(m)
        pos = np.empty(n, dtype=np.int64)
        for a in range(m):
            pos[reps[a]] = a
            dr[a] = d[p, reps[a]]
            cap[a] = mult[reps[a]] * C
            for b in range(m):
                Kr[a, b] = K[p, reps[a], reps[b]]
        for i in range(n):
            if valid[p, i]:
                b0[pos[rep[i]]] += a0[p, i]
        st = np.empty(m, dtype=np.int8)
        for a in range(m):
            st[a] = 2 if b0[a] >= cap[a] else (1 if b0[a] > 0.0 else 0)
        x = np.empty(m)
        mu_p, good = _solve_reduced(Kr, dr, cap, b0, st, x, tol, bulk, primal)
        ok[p] = good
        mu[p] = mu_p
        _spread(x, reps, rep, mult, C, alpha[p], S[p], E[p])


def finish_loop(K, d, X, valid, rel, a0, C, tol, bulk=BULK_ROUNDS, primal=PRIMAL_ROUNDS):
    """The finish on numpy arrays: float64 ``K`` (P, n, n) and ``d`` (P, n), keys ``X``
    (P, n, D), ``valid`` (P, n) bool, FISTA's feasible iterate ``a0`` (P, n); ``rel``
    the merge's relative distance (``MERGE_EPS·eps`` of the keys' dtype).

    Returns ``alpha`` (P, n), ``mu`` (P,), the partition ``S``, ``E`` (P, n) bool, ``ok``
    (P,) bool (whether the active set settled; not yet verified: :func:`verify_loop`)
    and ``rep`` (P, n): the first key of each key's group (-1 where absent)."""
    P, n = valid.shape
    alpha = np.zeros((P, n))
    mu = np.zeros(P)
    S = np.zeros((P, n), dtype=np.bool_)
    E = np.zeros((P, n), dtype=np.bool_)
    ok = np.zeros(P, dtype=np.bool_)
    rep = np.zeros((P, n), dtype=np.int64)
    _finish(np.ascontiguousarray(K), np.ascontiguousarray(d),
            np.ascontiguousarray(X, dtype=np.float64), np.ascontiguousarray(valid),
            float(rel), sort_direction(X.shape[-1]), np.ascontiguousarray(a0), float(C), float(tol),
            int(bulk), int(primal), alpha, mu, S, E, ok, rep)
    return alpha, mu, S, E, ok, rep


def spread_groups(beta, rep, valid, C):
    """Group sums ``beta`` (n,), held at each group's first key (``rep`` from
    :func:`finish_loop`), spread over the copies as the finish spreads them:
    ``alpha`` (n,), ``S``, ``E`` (n,) bool. For the oracle's answers."""
    n = valid.shape[0]
    reps = np.flatnonzero(valid & (rep == np.arange(n)))
    mult = np.zeros(n, dtype=np.int64)
    np.add.at(mult, rep[valid], 1)
    alpha = np.zeros(n)
    S = np.zeros(n, dtype=np.bool_)
    E = np.zeros(n, dtype=np.bool_)
    _spread(np.ascontiguousarray(beta[reps]), reps.astype(np.int64),
            np.ascontiguousarray(rep), mult, float(C), alpha, S, E)
    return alpha, S, E


@njit(cache=True, nogil=True)
def _verify(K, d, valid, rep, alpha, mu, S, E, C, out):  # pragma: no cover - compiled
    """Per problem: (primal violation on the keys, dual violation of the reduced
    problem) in units of the rescaled K."""
    P, n = valid.shape
    beta = np.empty(n)
    g = np.empty(n)
    for p in range(P):
        tot = 0.0
        prim = 0.0
        for i in range(n):
            beta[i] = 0.0
        for i in range(n):
            a = alpha[p, i]
            if valid[p, i]:
                tot += a
                prim = max(prim, -a, a - C)
                beta[rep[p, i]] += a
            elif a != 0.0:
                prim = max(prim, abs(a))
        prim = max(prim, abs(tot - 1.0))
        has_s = False
        for i in range(n):
            has_s = has_s or S[p, i]
            if not valid[p, i] or rep[p, i] != i:
                continue
            acc = 0.0
            for j in range(n):
                if valid[p, j] and rep[p, j] == j:
                    acc += K[p, i, j] * beta[j]
            g[i] = 2.0 * acc - d[p, i]
        m = mu[p]
        if not has_s:
            m = np.inf
            for i in range(n):
                if E[p, i] and -g[rep[p, i]] < m:
                    m = -g[rep[p, i]]
            if not np.isfinite(m):
                m = 0.0
            mu[p] = m
        # a group's state: margin if a copy is, else error if a copy is, else reserve
        dual = 0.0
        for i in range(n):
            if not valid[p, i] or rep[p, i] != i:
                continue
            in_s = False
            in_e = False
            for j in range(n):
                if valid[p, j] and rep[p, j] == i:
                    in_s = in_s or S[p, j]
                    in_e = in_e or E[p, j]
            gi = g[i] + m
            if in_s:
                dual = max(dual, abs(gi))
            elif in_e:
                dual = max(dual, gi)
            else:
                dual = max(dual, -gi)
        out[p, 0] = prim
        out[p, 1] = dual


def verify_loop(K, d, valid, rep, alpha, mu, S, E, C):
    """Primal (box, sum, on every key) and dual (KKT signs of the reduced problem over
    the groups ``rep``) violations per problem, (P, 2); ``mu`` of problems with an empty
    margin set is set to the convention's (in place)."""
    out = np.zeros((valid.shape[0], 2))
    _verify(np.ascontiguousarray(K), np.ascontiguousarray(d), np.ascontiguousarray(valid),
            np.ascontiguousarray(rep), np.ascontiguousarray(alpha), mu,
            np.ascontiguousarray(S), np.ascontiguousarray(E), float(C), out)
    return out
