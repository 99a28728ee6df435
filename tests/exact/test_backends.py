"""The compiled backend against the numpy reference backend, step by step.

``SVDDMemory(..., backend="reference")`` runs the numpy reference of
every compiled step (drive, contraction, margin solve, KKT residual, health
measure). Two memories fed the same operations must take the same events and
reach the same state, to rounding. Event counts can differ where two events
tie to within rounding (e.g. alpha_c reaching 0 a few ulps before the last
margin coefficient reaches C: one loop takes one event, the other two, and the
polish lands both on the same partition), so counts are compared in bulk.
"""

from __future__ import annotations

import numpy as np
import pytest

from exact_helpers import backend_of, check_scratch_between_operations
from svattn.exact import SVDDMemory
from svattn.exact.backends import compiled, reference
from svattn.exact.core.kernels import kernel_diag, kernel_matrix
from svattn.exact.core.kktsets import ERROR
from svattn.exact.operations import solver


def _pair(C: float, kernel: str) -> tuple[SVDDMemory, SVDDMemory]:
    fast = SVDDMemory(C, kernel=kernel)
    ref = SVDDMemory(C, kernel=kernel, backend="reference")
    assert fast.backend == "compiled" and ref.backend == "reference"
    return fast, ref


def _measure(mem: SVDDMemory) -> tuple[float, float]:
    """``(cond1, inverse residual)`` of a memory's bordered inverse, by its own backend."""
    be, ss = backend_of(mem), mem.solver_state
    return be.margin_health(ss, be.margin_gram(ss))


def _assert_same(fast: SVDDMemory, ref: SVDDMemory) -> None:
    assert fast.ids == ref.ids
    assert fast.partition() == ref.partition()
    np.testing.assert_allclose(fast.alpha, ref.alpha, rtol=0, atol=1e-12)
    assert fast.mu == pytest.approx(ref.mu, abs=1e-12)
    assert fast.kkt_residual() <= 1e-10 and ref.kkt_residual() <= 1e-10
    if fast.solver_state.nS and not fast.warm:
        # Both inverses are kept by rank-one updates whose rounding grows with the
        # conditioning of Q, and the two memories took differently-rounded paths
        # (kernel exp, segments vs events): each must meet the drift bar the memory
        # enforces (its backward error, the inverse residual), and they may differ
        # by what that allows: forward error <= cond(Q) · backward error.
        cond, res_fast = _measure(fast)
        _, res_ref = _measure(ref)
        assert res_fast <= 1e-10 and res_ref <= 1e-10
        bound = cond * (res_fast + res_ref + 2 * np.finfo(np.float64).eps)
        # the margin order is a layout (an active-set step enters tokens in another
        # order than the path): compare both inverses in id order
        qf, qr = _in_id_order(fast), _in_id_order(ref)
        assert np.abs(qf - qr).max() <= bound * np.abs(qr).max()


def _in_id_order(mem: SVDDMemory) -> np.ndarray:
    """The bordered inverse with its margin rows and columns sorted by token id."""
    ids = mem.solver_state.slot_id[mem.solver_state.slot_of_col[: mem.solver_state.nS]]
    p = np.concatenate([[0], 1 + np.argsort(ids)])
    return mem.solver_state.Qinv[np.ix_(p, p)]


@pytest.mark.parametrize("kernel", ["rbf", "exp"])
@pytest.mark.parametrize("d, C", [(2, 0.02), (8, 0.05), (8, 0.3)])
def test_compiled_matches_reference_through_adds_and_removes(kernel, d, C):
    rng = np.random.default_rng(d * 100 + int(100 * C))
    X = rng.normal(size=(240, d)) * (0.5 if kernel == "exp" else 1.0)
    fast, ref = _pair(C, kernel)
    for x in X:
        fast.add(x)
        ref.add(x)
    _assert_same(fast, ref)
    live = list(fast.ids)
    order = rng.permutation(len(live))[:120]
    same_events = on_path = 0
    for k, i in enumerate(order):
        cf, cr, jumped = _remove_both(fast, ref, live[i])
        on_path += not jumped
        same_events += not jumped and cf.n_events == cr.n_events
        assert cf.partition_after == cr.partition_after
        if k % 10 == 0:
            _assert_same(fast, ref)
            x = rng.normal(size=d) * (0.5 if kernel == "exp" else 1.0)
            assert fast.add(x) == ref.add(x)
    _assert_same(fast, ref)
    assert same_events >= 0.95 * on_path


def _remove_both(fast: SVDDMemory, ref: SVDDMemory, tid: int):
    """Remove ``tid`` from both; whether the compiled removal finished by an
    active-set step. The path's event count is compared only where it followed
    the path; a step reports every set change it made plus c's exit, at least
    the net change of the partition plus one."""
    before = {t: k for k, ts in fast.partition().items() for t in ts}
    jumps = fast.solver_state.n_jumps
    cf, cr = fast.remove(tid), ref.remove(tid)
    jumped = fast.solver_state.n_jumps > jumps
    if jumped:
        after = {t: k for k, ts in fast.partition().items() for t in ts}
        moved = sum(after[t] != k for t, k in before.items() if t != tid)
        assert cf.n_events >= moved + 1
    return cf, cr, jumped


def test_compiled_matches_reference_on_clusters_with_cache_growth():
    # clustered keys with outliers: many events per removal, reserve tokens
    # entering the margin (column allocation) and the column cache growing
    # while a drive runs (the compiled loop stops and resumes)
    rng = np.random.default_rng(7)
    centers = rng.normal(size=(5, 16))
    X = centers[rng.integers(0, 5, 400)] + 0.1 * rng.normal(size=(400, 16))
    X[rng.random(400) < 0.05] *= 3.0
    fast, ref = _pair(0.004, "rbf")
    grew = False
    for x in X:
        before = fast.solver_state.ccap
        fast.add(x)
        ref.add(x)
        grew |= fast.solver_state.ccap > before
    assert grew
    _assert_same(fast, ref)
    errors = fast.partition()["error"][:20]
    margin = fast.partition()["margin"][:20]
    same_events = on_path = 0
    for t in errors + margin:
        cf, cr, jumped = _remove_both(fast, ref, t)
        on_path += not jumped
        same_events += not jumped and cf.n_events == cr.n_events
    assert same_events >= 0.9 * on_path
    _assert_same(fast, ref)


def test_compiled_kkt_and_health_equal_their_references():
    rng = np.random.default_rng(3)
    mem = SVDDMemory(0.02)
    mem.extend(rng.normal(size=(300, 6)))
    g = solver.fresh_g(mem.solver_state, backend_of(mem))
    # at the optimum both are rounding (sum(alpha) − 1: sequential vs pairwise sum)
    ss, be = mem.solver_state, backend_of(mem)
    assert be.kkt(ss, g) == pytest.approx(reference.kkt(ss, g), abs=1e-15)
    # a violated state: the residual must see it in both
    g_bad = g.copy()
    g_bad[ss.state[: ss.hi] == 1] -= 0.5  # reserve tokens (alpha = 0) need g >= 0
    assert be.kkt(ss, g_bad) == pytest.approx(reference.kkt(ss, g_bad), rel=1e-12)
    assert backend_of(mem).kkt(mem.solver_state, g_bad) > 0.1
    good = mem.solver_state.Qinv
    drifted = good.copy()
    drifted[1, 2] += 1e-6
    drifted[2, 1] += 1e-6
    for Q in (good, drifted):
        mem.solver_state.Qinv = Q
        ss = mem.solver_state
        fast = compiled.margin_health(ss, compiled.margin_gram(ss))
        slow = reference.margin_health(ss, reference.margin_gram(ss))
        assert fast[0] == pytest.approx(slow[0], rel=1e-9)  # cond1
        assert fast[1] == pytest.approx(slow[1], rel=1e-6, abs=1e-14)  # inverse residual
    assert fast[1] > 1e-7  # the drifted inverse is seen by both


def _g_reference(mem: SVDDMemory) -> np.ndarray:
    return reference.g_exact(mem.solver_state)


@pytest.mark.parametrize("kernel", ["rbf", "exp"])
def test_error_sum_g_equals_the_full_cache_g_through_every_kind_of_change(kernel, tmp_path):
    """The exact g from margin columns + error-column sum equals the sum over every
    cached column after adds, margin/error/reserve removals, batches, resets and a
    reload, however the sum got there (lazy sync, subtraction, rebuild)."""
    rng = np.random.default_rng(7)
    scale = 0.5 if kernel == "exp" else 1.0
    mem = SVDDMemory(0.03, kernel=kernel)
    mem.extend(rng.normal(size=(150, 6)) * scale)
    n_sync = n_rebuild = 0

    def check() -> None:
        nonlocal n_sync, n_rebuild
        before_valid = mem.solver_state.esum_valid
        g = backend_of(mem).g_exact(mem.solver_state)
        n_sync += before_valid
        n_rebuild += not before_valid
        # g is in units of the largest kernel diagonal (exp keys reach ~1e4)
        ss = mem.solver_state
        np.testing.assert_allclose(g, _g_reference(mem), rtol=0, atol=1e-13 * ss.scale)
        # the members are exactly the error tokens, and the sum is theirs on every
        # used row (a freed row holds the kernel of the zero key it was wiped to)
        err = np.flatnonzero(mem.solver_state.state[: mem.solver_state.hi] == ERROR)
        assert set(np.flatnonzero(ss.esum_member[: ss.hi]).tolist()) == set(err.tolist())
        # (error tokens keep no cache column: their columns recomputed from the keys)
        assert (ss.col_of_slot[err] < 0).all()
        direct = kernel_matrix(ss.X[: ss.hi], ss.X[err], ss.kernel, ss.gamma_value).sum(axis=1)
        direct[err] += ss.diag[err] - kernel_diag(ss.X[err], ss.kernel, ss.gamma_value)
        live = ss.live_slots()  # (a freed row's sum is not read: wiped to 0)
        np.testing.assert_allclose(ss.esum[live], direct[live], rtol=0,
                                   atol=1e-13 * max(1.0, float(np.abs(direct).max(initial=0))))

    check()
    for step in range(90):
        part = mem.partition()
        kind = ("error", "margin", "reserve")[step % 3]
        if part[kind]:
            mem.remove(int(rng.choice(part[kind])))
        if step % 4 == 0:
            mem.add(rng.normal(size=6) * scale * (3.0 if step % 8 == 0 else 1.0))
        if step % 9 == 0:
            mem.extend(rng.normal(size=(5, 6)) * scale)
        check()
    assert n_sync > 50 and mem.partition()["error"], (n_sync, mem.partition())
    mem.save(tmp_path / "m")
    loaded = SVDDMemory.load(tmp_path / "m")
    ss, hi = mem.solver_state, mem.solver_state.hi
    live = ss.slot_id[:hi] >= 0  # free rows of a loaded cache are zeros
    # the file carries the sum and its members bit for bit (a loaded memory continues exactly)
    assert loaded.solver_state.esum_valid == mem.solver_state.esum_valid
    assert loaded.solver_state.esum[:hi][live].tobytes() == ss.esum[:hi][live].tobytes()
    tol = 1e-13 * mem.solver_state.scale
    g_loaded = backend_of(loaded).g_exact(loaded.solver_state)
    np.testing.assert_allclose(g_loaded, _g_reference(loaded), rtol=0, atol=tol)
    np.testing.assert_allclose(g_loaded[live], backend_of(mem).g_exact(ss)[live], rtol=0, atol=tol)


def _numpy_positive_definite(K: np.ndarray, rel_shift: float) -> bool:
    Ks = 0.5 * (K + K.T)
    try:
        np.linalg.cholesky(Ks - rel_shift * float(np.trace(Ks)) * np.eye(len(K)))
    except np.linalg.LinAlgError:
        return False
    return True


def test_compiled_positive_definite_agrees_with_numpy_cholesky():
    """Gram matrices of distinct keys, of keys with copies, near-copies on either side
    of the 1e-10 threshold, indefinite matrices and a non-symmetric input."""
    from svattn.exact.core.kernels import gram_matrix

    rng = np.random.default_rng(3)
    cases = []
    for n in (1, 2, 5, 31):
        X = rng.normal(size=(n, 4))
        cases.append(gram_matrix(X, "rbf", 0.25))
        if n > 1:
            cases.append(gram_matrix(np.vstack([X, X[:1]]), "rbf", 0.25))  # a copy
            for eps in (1e-2, 1e-4, 1e-6):  # a near-copy: the smallest eigenvalue ~ eps²
                cases.append(gram_matrix(np.vstack([X, X[:1] + eps]), "rbf", 0.25))
        A = rng.normal(size=(n, n))
        cases.append(A + A.T)  # indefinite (for n > 1)
        cases.append(A @ A.T + 0.1 * np.eye(n) + 1e-3 * rng.normal(size=(n, n)))  # asymmetric
    outcomes = []
    for K in cases:
        expected = _numpy_positive_definite(K, 1e-10)
        assert compiled.positive_definite(np.ascontiguousarray(K), 1e-10) == expected
        outcomes.append(expected)
    assert any(outcomes) and not all(outcomes)
    # NaN (which finite keys never produce) is refused; numpy's factor would be NaN
    bad = gram_matrix(rng.normal(size=(4, 3)), "rbf", 0.5)
    bad[2, 2] = np.nan
    assert not compiled.positive_definite(bad, 1e-10)


def test_uniqueness_check_matches_reference_with_and_without_ties():
    """The memory's uniqueness check (compiled margin-block Cholesky) against the numpy
    path, on a plain stream (unique) and with a duplicated margin key (not unique)."""
    rng = np.random.default_rng(11)
    fast, ref = _pair(0.05, "rbf")
    X = rng.normal(size=(120, 3))
    fast.extend(X)
    ref.extend(X)
    assert fast.unique_optimum() is ref.unique_optimum() is True
    dup = fast.keys[fast.ids.index(fast.partition()["margin"][0])]
    fast.add(dup)
    ref.add(dup)
    assert fast.unique_optimum() is ref.unique_optimum() is False


@pytest.mark.parametrize("kernel", ["rbf", "exp"])
def test_certificate_facts_equal_the_public_checks_after_every_removal(kernel):
    """A certificate's sizes, residual, uniqueness and digest come from one compiled
    pass and the residual of the removal's own exact-g check; each must equal the
    public method computed afresh, through removals from every set, a duplicate
    (not unique, tied tokens), warm-up and a re-solve."""
    rng = np.random.default_rng(5)
    mem = SVDDMemory(0.04, kernel=kernel)
    X = rng.normal(size=(90, 4)) * (0.5 if kernel == "exp" else 1.0)
    mem.extend(X)
    mem.add(mem.keys[mem.ids.index(mem.partition()["margin"][0])])  # a copy: ties
    seen_unique = set()
    measured = 0
    while len(mem):
        part = mem.partition()
        pool = [p for p in ("margin", "error", "reserve") if part[p]]
        tid = int(rng.choice(part[pool[len(mem) % len(pool)]])) if pool else mem.ids[0]
        cert = mem.remove(tid)
        assert cert.partition_after == {k: len(v) for k, v in mem.partition().items()} \
            or mem.warm
        assert cert.kkt_residual_after == mem.kkt_residual()
        assert cert.unique_optimum is mem.unique_optimum()
        assert cert.state_digest == mem.state_digest()
        seen_unique.add(cert.unique_optimum)
        if mem.solver_state.nS and not mem.warm:  # the health check read the removal's own measure
            # (taken on the removal's working copy of Qinv: a residual of rounding
            # size may differ by rounding, summed in another order)
            cond, res = _measure(mem)
            assert mem.health.cond1 == pytest.approx(cond, rel=1e-12)
            assert abs(mem.health.inv_residual - res) <= 64 * np.finfo(np.float64).eps
            measured += 1
    assert seen_unique == {True, False}
    assert measured >= 20


@pytest.mark.parametrize("max_segments", [0, 1, 2])
def test_removal_by_segments_hands_over_to_the_event_loop_exactly(max_segments):
    """Removals go segment by segment (one margin-block pass each, the last giving
    the exact g) and hand over to the event loop on the cases it leaves (here
    forced after ``max_segments`` segments; 0 = the event loop alone). Every
    variant must reach the numpy reference's state, with the same events."""
    rng = np.random.default_rng(13)
    centers = rng.normal(size=(4, 12))
    X = centers[rng.integers(0, 4, 300)] + 0.12 * rng.normal(size=(300, 12))
    X[rng.random(300) < 0.05] *= 2.5
    seg, capped = SVDDMemory(0.006), SVDDMemory(0.006)
    ref = SVDDMemory(0.006, backend="reference")
    capped.solver_state.max_segments = max_segments
    # the path alone (steps: the next test)
    seg.solver_state.max_jumps = capped.solver_state.max_jumps = 0
    for m in (seg, capped, ref):
        m.extend(X)
    part = seg.partition()
    picks = part["margin"][:15] + part["error"][:15]
    multi = same = 0
    for t in picks:
        cs, cc, cr = seg.remove(t), capped.remove(t), ref.remove(t)
        assert cs.partition_after == cc.partition_after == cr.partition_after
        assert cs.kkt_residual_after <= 1e-12 and cc.kkt_residual_after <= 1e-12
        multi += cr.n_events > max(max_segments, 1)
        same += cs.n_events == cr.n_events and cc.n_events == cr.n_events
        _assert_same(seg, ref)
        _assert_same(capped, ref)
    assert multi >= 5  # the hand-over happened mid-removal, not only at the start
    assert same >= 0.9 * len(picks)
    assert seg.solver_state.n_segment_fallbacks == 0 and seg.n_resolves == ref.n_resolves == 0
    assert capped.solver_state.n_segment_fallbacks == (len(picks) if max_segments == 0 else multi)


@pytest.mark.parametrize("max_jumps", [1, 2, 4])
def test_active_set_steps_reach_the_reference_state_or_leave_it_to_the_path(max_jumps):
    """From the first segment's end point a removal may switch every violating
    token at once (up to ``max_jumps`` passes, each checked by the exact g of its
    result) and otherwise go on along the path. Either way the state must be
    the numpy reference's; some removals must take each route. (gamma 1: ~18 margin
    tokens, above the size from which steps are tried.)"""
    from svattn.exact.backends.compiled.segments import JUMP_MIN_MARGIN

    rng = np.random.default_rng(17)
    centers = rng.normal(size=(4, 12))
    X = centers[rng.integers(0, 4, 400)] + 0.12 * rng.normal(size=(400, 12))
    X[rng.random(400) < 0.05] *= 2.5
    fast, ref = SVDDMemory(0.005, gamma=1.0), SVDDMemory(0.005, gamma=1.0, backend="reference")
    fast.solver_state.max_jumps = max_jumps
    for m in (fast, ref):
        m.extend(X)
    part = fast.partition()
    assert len(part["margin"]) >= JUMP_MIN_MARGIN
    for t in part["margin"][:40] + part["error"][:40]:
        cf, cr, _ = _remove_both(fast, ref, t)
        assert cf.partition_after == cr.partition_after
        assert cf.kkt_residual_after <= 1e-12
        _assert_same(fast, ref)
    assert fast.solver_state.n_jumps >= 5
    if max_jumps == 1:
        assert fast.solver_state.n_jump_fallbacks >= 1
    assert fast.solver_state.n_segment_fallbacks == 0 and fast.n_resolves == ref.n_resolves == 0
    assert fast.solver_state.n_block_passes > 0



def test_few_margin_tokens_take_the_path_alone():
    """Below ``JUMP_MIN_MARGIN`` margin tokens no active-set step is tried (the path's
    passes are cheap there); removals still reach the reference's state."""
    from svattn.exact.backends.compiled.segments import JUMP_MIN_MARGIN

    rng = np.random.default_rng(17)
    centers = rng.normal(size=(4, 12))
    X = centers[rng.integers(0, 4, 400)] + 0.5 * rng.normal(size=(400, 12))
    X[rng.random(400) < 0.05] *= 2.5
    fast, ref = _pair(0.005, "rbf")  # the default gamma: 11-15 margin tokens
    for m in (fast, ref):
        m.extend(X)
    part = fast.partition()
    done = 0
    for t in part["margin"][:40] + part["error"][:40]:
        if fast.solver_state.nS >= JUMP_MIN_MARGIN:
            break
        cf, cr, _ = _remove_both(fast, ref, t)
        assert cf.partition_after == cr.partition_after
        done += 1
    assert done >= 10
    _assert_same(fast, ref)
    assert fast.solver_state.n_jumps == fast.solver_state.n_jump_fallbacks == 0
    assert fast.solver_state.n_block_passes > 0

def test_vectorized_column_exp_is_within_one_ulp_of_numpy():
    """Kernel columns take exp from a vectorizable Cody–Waite + Taylor loop; it must
    agree with np.exp to 1 ulp over the whole normal range (rbf arguments are
    <= 0, exp-kernel ones up to the overflow limit), give exactly 1 at 0, and
    hand arguments past the normal range (underflow, overflow, NaN) to libm."""
    from svattn.exact.backends.compiled.columns import exp_column as _exp_column

    rng = np.random.default_rng(0)
    x = np.concatenate([rng.uniform(-708, 709, 100_000), rng.uniform(-4, 1, 100_000),
                        [0.0, -1e-300, 1e-20, -0.5 * np.log(2), 0.5 * np.log(2), -708.0, 709.0]])
    KC = np.asfortranarray(np.stack([np.zeros_like(x), x], axis=1))
    _exp_column(KC, 1, len(x))
    ref = np.exp(x)
    assert np.max(np.abs(KC[:, 1] - ref) / ref) <= np.finfo(np.float64).eps
    assert KC[len(x) - 7, 1] == 1.0 and not KC[:, 0].any()  # only the named column
    edge = np.array([-800.0, -745.0, -720.0, 0.0, 710.0, np.nan])
    KE = np.asfortranarray(np.stack([edge, edge], axis=1))
    _exp_column(KE, 0, len(edge))
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(KE[:, 0], np.exp(edge))


def test_margin_gram_copy_is_the_current_block_and_holds_only_margin_tokens_between_operations():
    """Margin solves leave a copy of K_SS that the certificate's uniqueness check, the
    health check and the next removal's first segment read instead of gathering the
    cache's margin rows again: it must equal the cache's block whenever it is used, and
    between operations hold the live margin block only, or nothing (kernel values of a
    removed token never)."""
    from svattn.exact.backends.compiled import linalg

    rng = np.random.default_rng(21)
    X = rng.normal(size=(250, 6))
    mem = SVDDMemory(0.02)
    mem.extend(X)
    seen = {"copy": 0, "checks": 0, "kept": 0, "qkept": 0}
    check = mem.health.check

    def checking(qinv, measure, refactorize):
        m = mem
        ss = m.solver_state
        gathered = linalg.gather_margin_gram(ss.KC, ss.slot_of_col, ss.nS)
        np.testing.assert_array_equal(backend_of(m).margin_gram(m.solver_state), gathered)
        seen["copy"] += m.solver_state.kss_for is m.solver_state.Qinv
        seen["checks"] += 1
        return check(qinv, measure, refactorize)

    mem.health.check = checking
    for t in mem.partition()["margin"][:10] + mem.partition()["error"][:10]:
        ss = mem.solver_state  # the removed token's kernel values with the margin's
        col = ss.col_of_slot[ss.id_to_slot[t]]
        k_t = ss.KC[ss.slot_of_col[: ss.nS], col].copy()
        k_t = k_t[(k_t != 0.0) & (k_t != 1.0)]
        q_t = ss.Qinv[col + 1].copy() if col < ss.nS else np.zeros(0)  # its inverse row
        mem.remove(t)
        seen["kept"] += check_scratch_between_operations(mem.solver_state)
        seen["qkept"] += mem.solver_state.qwork_for is not None
        assert not np.isin(k_t, mem.solver_state.kss).any()  # none of them stays
        assert not np.isin(q_t[q_t != 0.0], mem.solver_state.qwork).any()
        assert not np.isin(q_t[q_t != 0.0], mem.solver_state.qspare).any()
        mem.add(rng.normal(size=6))
        check_scratch_between_operations(mem.solver_state)
    assert seen["checks"] == 40 and seen["copy"] >= 20 and seen["kept"] >= 10
    # a removal solves against the memory's inverse, held fixed, and writes the one it
    # leaves once (backends/compiled/schur.py): no work copy is kept between operations
    assert seen["qkept"] == 0
