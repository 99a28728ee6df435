"""The uniqueness test's kept factor (svattn.exact.core.gram.KeptFactor): its row updates
against numpy's Cholesky, and its verdicts against the test computed whole."""

from __future__ import annotations

import numpy as np
import pytest

import svattn.exact.backends.compiled as backend
from kept_factor_helpers import MarginStub as _Margin
from kept_factor_helpers import assert_holes_are_unit
from kept_factor_helpers import numpy_factor as _numpy_factor
from kept_factor_helpers import padded_block as _block
from kept_factor_helpers import rbf_gram as _gram
from svattn.exact import SVDDMemory
from svattn.exact.backends.compiled import linalg
from svattn.exact.core.gram import padded_square


def _check_kept(f, ss, atol: float) -> None:
    """The kept factor ``f`` of memory state ``ss``: its live rows and columns are numpy's
    factor of their tokens' block, each hole a row and column of the unit matrix, and
    nothing past its rows."""
    n, live = f.n, f.live()
    assert len(f.ids) == n and f.size == int(live.sum()) and f.holes == n - f.size
    slots = np.array([ss.id_to_slot[int(t)] for t in f.ids[live]])
    block = ss.KC[slots][:, ss.col_of_slot[slots]]
    np.testing.assert_allclose(f.L[np.ix_(live, live)], _numpy_factor(block, f.shift),
                               atol=atol)
    holes = np.flatnonzero(~live)
    for p in holes:
        unit = np.zeros(n)
        unit[p] = 1.0
        np.testing.assert_array_equal(f.L[p, :n], unit)
        np.testing.assert_array_equal(f.L[:n, p], unit)
    assert not f.L[n:].any() and not f.L[:, n:].any()


def test_delete_and_append_give_the_factor_of_the_changed_matrix():
    rng = np.random.default_rng(0)
    K = _gram(rng, 40)
    K[3, 7] += 1e-15  # a slightly asymmetric cache block: the symmetric part is factored
    shift = 1e-6
    L = np.zeros((40, 40))
    assert linalg.cholesky_into(K, 30, shift, L)
    np.testing.assert_allclose(L[:30, :30], _numpy_factor(K[:30, :30], shift), atol=1e-12)
    members = list(range(30))
    for _ in range(25):  # delete a random row, append a new one, as removals do
        p = int(rng.integers(len(members)))
        n = linalg.chol_delete(L, p, len(members))
        del members[p]
        assert n == len(members)
        outside = [j for j in range(40) if j not in members]
        j = int(rng.choice(outside))
        b = 0.5 * (K[members, j] + K[j, members])
        assert linalg.chol_append(L, n, b, K[j, j], shift)
        members.append(j)
        n += 1
        block = K[np.ix_(members, members)]
        np.testing.assert_allclose(L[:n, :n], _numpy_factor(block, shift), atol=1e-11)
        assert not np.triu(L, 1).any() and not L[n:].any() and not L[:, n:].any()


@pytest.mark.parametrize("order", ["F", "C"], ids=["column-major", "row-major"])
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 8, 9, 16, 17, 26])
def test_a_deletion_at_every_position_gives_numpys_factor(n, order):
    """Column-major is the kept factor's order (``padded_square(columns=True)``); a
    row-major factor gives the same result."""
    rng = np.random.default_rng(n)
    K = _gram(rng, n) + 1e-3 * np.eye(n)
    for p in range(n):
        L = np.zeros((n + 9, n + 1), order=order)  # (padded, as the kept buffer)
        L[:n, :n] = _numpy_factor(K, 0.0)
        assert linalg.chol_delete(L, p, n) == n - 1
        keep = [i for i in range(n) if i != p]
        if keep:
            np.testing.assert_allclose(L[: n - 1, : n - 1],
                                       _numpy_factor(K[np.ix_(keep, keep)], 0.0), atol=1e-12)
        assert not np.triu(L, 1).any() and not L[n - 1:].any() and not L[:, n - 1:].any()


def test_an_append_that_loses_definiteness_is_refused_and_changes_nothing():
    rng = np.random.default_rng(1)
    K = _gram(rng, 12)
    K[11] = K[3]  # a copy of token 3: the grown matrix is singular
    K[:, 11] = K[:, 3]
    L = np.zeros((12, 12))
    assert linalg.cholesky_into(K, 11, 1e-10, L)
    before = L.copy()
    assert not linalg.chol_append(L, 11, 0.5 * (K[:11, 11] + K[11, :11]), K[11, 11], 1e-10)
    np.testing.assert_array_equal(L, before)


def test_update_plan_and_update_follow_the_margin_order():
    rng = np.random.default_rng(2)
    K = _gram(rng, 30)  # token t's row and column are t
    fids = np.array([10, 11, 12, 13, 14, 15])  # the factor's tokens, in its order
    ids = np.array([15, 12, 20, 10, 13, 14, 21])  # the margin's: 11 left, 20 and 21 came
    drops, fpos, news = backend._factor_plan(fids, ids)
    assert drops.tolist() == [1]  # token 11, factor row 1: a hole
    assert fpos[:6].tolist() == [3, -1, 1, 4, 5, 0] and news.tolist() == [2, 6]
    L = padded_square(8, columns=True)  # the kept factor's buffer and order
    L[:6, :6] = _numpy_factor(K[np.ix_(fids, fids)], 1e-9)
    KM = K[np.ix_(ids, ids)].copy()  # the Gram block in margin order
    n = linalg.chol_update(L, 6, drops, fpos, news, KM, 1e-9)
    assert n == 8  # six rows (one a hole) and two appended
    live = fpos[:n] >= 0
    order = ids[fpos[:n][live]]  # the factor's tokens in its order: kept, then 20 and 21
    assert order.tolist() == [10, 12, 13, 14, 15, 20, 21]
    np.testing.assert_allclose(L[np.ix_(live, live)],
                               _numpy_factor(K[np.ix_(order, order)], 1e-9), atol=1e-12)
    unit = np.eye(n)[1]
    np.testing.assert_array_equal(L[1, :n], unit)  # the hole: a row and column of I
    np.testing.assert_array_equal(L[:n, 1], unit)
    assert linalg.chol_compact(L, n, live) == 7  # closed: the factor of the seven
    np.testing.assert_allclose(L[:7, :7], _numpy_factor(K[np.ix_(order, order)], 1e-9),
                               atol=1e-12)
    assert not L[7:].any() and not L[:, 7:].any()


@pytest.mark.parametrize(("seed", "max_holes"), [
    (0, 64), (2, 1), pytest.param(1, 64, marks=pytest.mark.slow)])
def test_removal_certificates_say_what_the_whole_test_says(monkeypatch, seed, max_holes):
    """With the factor kept from 4 margin tokens on, every removal's uniqueness claim
    equals the claim of a twin that computes the test whole (the factor's use is then
    forced on small sets, where the test suite can afford many removals); the twins'
    states agree bit for bit (the test changes no coefficient). ``max_holes`` 1: the
    factor's holes closed at almost every update."""
    monkeypatch.setattr(backend, "MAX_HOLES", max_holes)
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(300, 3))
    kept, whole = (SVDDMemory(1 / 60, gamma=2.0) for _ in range(2))
    for m in (kept, whole):
        m.extend(X)
    assert kept.solver_state.nS >= 8
    updated = 0
    for _ in range(80):
        ss = kept.solver_state
        tid = int(ss.slot_id[ss.slot_of_col[rng.integers(ss.nS)]])
        monkeypatch.setattr(backend, "FACTOR_KEPT_FROM", 4)
        before = None if ss.pd_factor is None else ss.pd_factor.updates
        a = kept.remove(tid)
        after = kept.solver_state.pd_factor
        updated += before is not None and after is not None and after.updates > before
        monkeypatch.setattr(backend, "FACTOR_KEPT_FROM", 1 << 30)
        b = whole.remove(tid)
        assert a.unique_optimum == b.unique_optimum
        assert a.state_digest == b.state_digest
        f = kept.solver_state.pd_factor
        if f is not None:  # the kept factor is the factor of the margin's block now
            ss = kept.solver_state
            _check_kept(f, ss, 1e-10)
            assert set(f.ids[f.live()].tolist()) == set(ss.margin_ids().tolist())
        x = rng.normal(size=3)
        kept.add(x)
        whole.add(x)
    assert updated >= 10  # the row updates did run (not only whole factorizations)


def test_the_factor_never_holds_a_token_outside_the_margin_set(monkeypatch):
    monkeypatch.setattr(backend, "FACTOR_KEPT_FROM", 4)
    rng = np.random.default_rng(3)
    mem = SVDDMemory(1 / 60, gamma=2.0)
    mem.extend(rng.normal(size=(300, 3)))
    seen = 0
    for step in range(60):
        ss = mem.solver_state
        part = mem.partition()
        kind = ("margin", "error", "reserve")[step % 3]
        if part[kind]:
            mem.remove(int(rng.choice(part[kind])))
        mem.add(rng.normal(size=3) * (3.0 if step % 5 == 0 else 1.0))
        f = mem.solver_state.pd_factor
        if f is not None:
            seen += 1
            assert set(f.ids[f.live()].tolist()) <= set(ss.margin_ids().tolist())
            assert not f.L[f.n:].any() and not f.L[:, f.n:].any()
    mem.compact()
    f = mem.solver_state.pd_factor
    assert f is None or set(f.ids[f.live()].tolist()) <= set(
        mem.solver_state.margin_ids().tolist())
    assert seen >= 10


def test_within_is_set_inclusion_whatever_the_order():
    from svattn.exact.core.gram import KeptFactor

    f = KeptFactor(np.zeros((3, 3)), 3, np.array([7, 3, 9]), 1e-9)
    assert f.within(np.array([9, 1, 3, 7]))
    assert f.within(np.array([9, 1, 3, 7]))  # (the margin it last saw)
    assert f.within(np.array([3, 7, 9]))
    assert not f.within(np.array([3, 7, 8]))
    assert not f.within(np.array([3, 7]))
    assert not f.within(np.zeros(0, dtype=np.int64))
    assert not f.within(np.array([10, 11, 12, 13]))


def test_a_kept_factor_says_not_positive_definite_when_a_copy_joins():
    # token 12 is token 3 again (to 1e-13): with it the block is singular; the kept
    # factor's append fails, and the verdict is the whole test's: False
    rng = np.random.default_rng(4)
    K = _gram(rng, 13)
    K[12], K[:, 12] = K[3] * (1 - 1e-13), K[:, 3] * (1 - 1e-13)
    K[12, 12] = 1.0
    first = _Margin(list(range(10)))
    assert backend.margin_positive_definite(first, _block(K, first.ids))
    f = first.pd_factor
    assert f is not None and f.size == 10
    grown = _Margin(list(range(10)) + [12], factor=f)
    kss = _block(K, grown.ids)
    assert not linalg.positive_definite(np.ascontiguousarray(kss[:11, :11]), 1e-10)
    assert not backend.margin_positive_definite(grown, kss)
    assert grown.pd_factor is None and not f.L.any()  # dropped, scrubbed


def test_a_kept_factor_is_not_used_once_its_shift_is_too_small(monkeypatch):
    # an exp-kernel block's trace can grow past twice the factor's: the factor's
    # verdict then says nothing about the test's larger shift, so it is recomputed
    rng = np.random.default_rng(5)
    K = _gram(rng, 12)
    first = _Margin(list(range(10)))
    assert backend.margin_positive_definite(first, _block(K, first.ids))
    f = first.pd_factor
    grown = _Margin(list(range(10)), factor=f)
    calls = []
    monkeypatch.setattr(linalg, "chol_update", lambda *a: calls.append(a) or -1)
    assert backend.margin_positive_definite(grown, 3.0 * _block(K, grown.ids))
    assert not calls and grown.pd_factor is not f
    assert grown.pd_factor.shift == pytest.approx(2e-10 * 30.0)


def test_a_reserve_removal_certifies_uniqueness_from_the_kept_factor(monkeypatch):
    """With the kept factor of exactly the margin tokens, the certificate's uniqueness
    test reads no margin Gram block (it was gathered, and factored whole at O(|S|³),
    after every removal that left the segment loop); its verdict is the reference's."""
    rng = np.random.default_rng(5)
    X = rng.normal(size=(700, 3))
    mem = SVDDMemory(1 / 35, "rbf", 3.0)  # ~100+ margin tokens, all but ~35 reserve
    mem.extend(X)
    ss = mem.solver_state
    assert ss.nS >= backend.FACTOR_KEPT_FROM
    ref = mem.copy(backend="reference")
    support = set(mem.support_ids())
    reserve = [t for t in mem.ids if t not in support]
    first = mem.remove(reserve[0])  # computes the factor (or keeps the one it has)
    assert first.unique_optimum == ref.remove(reserve[0]).unique_optimum
    assert ss.pd_factor is not None and ss.pd_factor.size == ss.nS
    assert backend.factor_covers_margin(ss)

    def no_gather(*args, **kwargs):
        raise AssertionError("the margin Gram block was gathered")

    monkeypatch.setattr(backend, "margin_gram", no_gather)
    for t in reserve[1:4]:
        cert = mem.remove(t)
        assert cert.unique_optimum == ref.remove(t).unique_optimum
        assert cert.unique_optimum
    monkeypatch.undo()
    # a factor of other tokens (or none) does not cover the margin: the full test runs
    f = ss.pd_factor
    f.ids = f.ids.copy()
    f.ids[0] = -5
    f.seen = None
    assert not backend.factor_covers_margin(ss)
    ss.drop_factor()
    assert not backend.factor_covers_margin(ss)
    cert = mem.remove(reserve[4])
    assert cert.unique_optimum == ref.remove(reserve[4]).unique_optimum


def test_a_token_leaving_the_margin_set_on_an_add_is_deleted_from_the_factor(monkeypatch):
    """An add whose drive moves margin tokens out of the margin set deletes their rows
    from the kept factor (O(|S|²) each) instead of dropping it, which cost the next
    removal a whole factorization (issue #36: 16-37 ms at 781 margin tokens): the
    factor then holds margin tokens only and is the Cholesky factor of their block."""
    from svattn.exact.core.gram import KeptFactor

    monkeypatch.setattr(backend, "FACTOR_KEPT_FROM", 4)
    trims = []
    real = KeptFactor.trim

    def spy(self, margin, delete_row):
        ok = real(self, margin, delete_row)
        trims.append(ok)
        return ok

    monkeypatch.setattr(KeptFactor, "trim", spy)
    rng = np.random.default_rng(4)
    mem = SVDDMemory(1 / 60, gamma=2.0)
    mem.extend(rng.normal(size=(300, 3)))
    for step in range(80):
        part = mem.partition()
        mem.remove(int(rng.choice(part["margin"] if step % 2 else part["reserve"])))
        mem.add(rng.normal(size=3) * (2.5 if step % 3 == 0 else 1.0))
        ss = mem.solver_state
        f = ss.pd_factor
        if f is None:
            continue
        assert set(f.ids[f.live()].tolist()) <= set(ss.margin_ids().tolist())
        _check_kept(f, ss, 1e-10)
    assert sum(trims) >= 5  # rows were deleted on adds, not only whole factors dropped


def test_hundreds_of_updates_keep_the_factor_of_the_current_block():
    """The kept factor (column-major, padded) after 400 rounds of row deletions (holes)
    and appends by :func:`linalg.chol_update`, its holes closed by
    :func:`linalg.chol_compact` whenever more than 16 (1,200 updates, never computed
    whole on the way), is still numpy's factor of the block it covers, to 1e-12: the
    updates' rounding does not accumulate towards the doubled shift's margin
    (1e-10 · trace), which is why a whole factorization is due only every
    ``backend.FACTOR_REFRESH`` updates."""
    rng = np.random.default_rng(7)
    N, shift = 260, 1e-9
    K = _gram(rng, N, d=6) + 1e-3 * np.eye(N)
    L = padded_square(N, columns=True)
    rows = list(range(120))  # the factor's token by row; -1: a hole
    L[:120, :120] = _numpy_factor(K[np.ix_(rows, rows)], shift)
    updates = closed = 0
    for _ in range(400):
        live_rows = [r for r, t in enumerate(rows) if t >= 0]
        if len(rows) - len(live_rows) > 16:
            live = np.array([t >= 0 for t in rows])
            assert linalg.chol_compact(L, len(rows), live) == len(live_rows)
            rows = [t for t in rows if t >= 0]
            closed += 1
            live_rows = list(range(len(rows)))
        ndrop, nnew = int(rng.integers(1, 3)), int(rng.integers(1, 3))
        drops = np.sort(rng.choice(live_rows, ndrop, replace=False))[::-1].astype(np.int64)
        for p in drops:
            rows[p] = -1
        kept = [t for t in rows if t >= 0]
        new = rng.choice([t for t in range(N) if t not in rows], nnew, replace=False)
        order = kept + new.tolist()  # the margin order: the kept tokens, then the new
        where = {t: i for i, t in enumerate(order)}
        fpos = np.array([where.get(t, -1) for t in rows] + [0] * nnew, dtype=np.int64)
        news = np.arange(len(kept), len(order), dtype=np.int64)
        KM = K[np.ix_(order, order)].copy()
        n = linalg.chol_update(L, len(rows), drops, fpos, news, KM, shift)
        assert n == len(rows) + nnew
        rows += new.tolist()
        updates += ndrop + nnew
    live = np.array([t >= 0 for t in rows])
    tokens = [t for t in rows if t >= 0]
    n = len(rows)
    assert updates >= 1000 and closed >= 10
    np.testing.assert_allclose(L[np.ix_(live, live)], _numpy_factor(K[np.ix_(tokens, tokens)],
                                                                    shift), rtol=0, atol=1e-12)
    assert not np.triu(L[:n, :n], 1).any() and not L[n:].any() and not L[:, n:].any()


def test_the_whole_factor_by_lapack_equals_the_compiled_loop():
    """A whole factor (the first removal after a fit, a refresh) comes from LAPACK
    (``backend.factor_into``); the compiled loop (``linalg.cholesky_into``) is its slow
    reference: the same factor up to rounding, the same verdicts, the same zeros."""
    rng = np.random.default_rng(4)
    K = _gram(rng, 60)
    K[5, 9] += 1e-15  # the symmetric part is factored
    for n, shift in ((60, 1e-6), (37, 1e-9), (1, 0.0)):
        fast, slow = np.zeros((64, 64)), np.zeros((64, 64))
        assert backend.factor_into(K, n, shift, fast)
        assert linalg.cholesky_into(K, n, shift, slow)
        np.testing.assert_allclose(fast, slow, rtol=0, atol=1e-12)
        assert not np.triu(fast, 1).any() and not fast[n:].any() and not fast[:, n:].any()
    singular = K.copy()
    singular[7] = singular[3]  # a copy of token 3: not positive definite with the shift
    singular[:, 7] = singular[:, 3]
    for shift in (1e-10, 1e-6):
        out = np.zeros((64, 64))
        assert not backend.factor_into(singular, 20, shift, out)
        assert not linalg.cholesky_into(singular, 20, shift, np.zeros((64, 64)))
        assert not out.any()  # nothing written
    broken = K.copy()
    broken[2, 2] = np.nan
    assert not backend.factor_into(broken, 10, 1e-9, np.zeros((64, 64)))
    assert not linalg.cholesky_into(broken, 10, 1e-9, np.zeros((64, 64)))


@pytest.mark.parametrize("seed, n, drops, before", [
    (0, 40, [39, 12, 11, 0], []),  # adjacent rows (copies leave together), first, last
    (1, 60, [50, 31, 7], [44, 20]),  # beside holes already made
    (2, 33, [5, 3], [4]),  # a hole between the two
    (3, 25, [17], []),  # one row: the single-row routine's result
])
def test_rows_deleted_at_once_equal_the_rows_deleted_one_at_a_time(seed, n, drops, before):
    """``chol_holes`` (one sweep of rotations for every deleted row) against
    ``chol_hole`` a row at a time in descending order (the reference it replaces) and
    against numpy's factor of the rows kept: the same factor to rounding, each hole a
    row and column of the unit matrix, nothing written past the factor."""
    rng = np.random.default_rng(seed)
    K = _gram(rng, n) + 1e-3 * np.eye(n)
    shift = 1e-9
    L = padded_square(n + 4, columns=True)
    L[:n, :n] = _numpy_factor(K, shift)
    for p in before:
        linalg.chol_hole(L, p, n)
    one_by_one = L.copy(order="F")
    for p in sorted(drops, reverse=True):
        assert linalg.chol_hole(one_by_one, p, n) == n
    assert linalg.chol_holes(L, np.array(drops, dtype=np.int64), n) == n
    np.testing.assert_allclose(L, one_by_one, rtol=0, atol=1e-12)
    live = np.ones(n, dtype=bool)
    live[list(drops) + list(before)] = False
    np.testing.assert_allclose(L[np.ix_(live, live)], _numpy_factor(K[np.ix_(live, live)], shift),
                               atol=1e-12)
    assert_holes_are_unit(L, n, live)
