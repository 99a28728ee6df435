"""The streaming add (svattn.exact.fastpath) against the general add path.

A token that lands in the reserve set is stored by one backend call
(``reserve_add``: compiled, or the numpy reference). Fed the same stream, a memory
whose fast path is switched off (every add through ``ingest.add_rows``) must reach
the same state: the same ids, partition and digest-relevant solution, and the same
stored arrays to rounding; the fast path must take exactly the adds that
``solver.reserve_score`` calls reserve adds; and the two backends' ``reserve_add``
must write the same slot.
"""

from __future__ import annotations

import numpy as np
import pytest

from svattn.exact import SVDDMemory, fastpath
from svattn.exact.backends import compiled, reference
from svattn.exact.core import hashes
from svattn.exact.core.kernels import LOG_MAX
from svattn.exact.operations import ingest, solver
from svattn.exact.operations.validation import check_rows, plain_row


def _stream(kernel: str, n: int, seed: int = 3, d: int = 8) -> np.ndarray:
    rng = np.random.default_rng(seed)
    centers = rng.normal(size=(5, d))
    x = centers[rng.integers(0, 5, n)] + 0.2 * rng.normal(size=(n, d))
    out = rng.random(n) < 0.05
    x[out] = 2.0 * rng.normal(size=(int(out.sum()), d))
    return 0.3 * x if kernel == "exp" else x


_ARRAYS = ("X", "diag", "xn2", "alpha", "g", "state", "slot_id", "esum", "col_of_slot")


def _assert_same_state(a: SVDDMemory, b: SVDDMemory) -> None:
    sa, sb = a.solver_state, b.solver_state
    assert a.ids == b.ids and a.partition() == b.partition()
    assert (sa.hi, sa.n, sa.next_id, sa.set_hash, sa.free_slots) == (
        sb.hi, sb.n, sb.next_id, sb.set_hash, sb.free_slots)
    np.testing.assert_allclose(a.alpha, b.alpha, rtol=0, atol=1e-12)
    assert a.mu == pytest.approx(b.mu, abs=1e-12)
    for name in _ARRAYS:
        np.testing.assert_allclose(getattr(sa, name)[: sa.hi], getattr(sb, name)[: sb.hi],
                                   rtol=0, atol=1e-12, err_msg=name)
    assert (sa.token_hash[: sa.hi] == sb.token_hash[: sb.hi]).all()
    assert (sa.row_hash[: sa.hi] == sb.row_hash[: sb.hi]).all()
    assert (sa.tags[: sa.hi] == sb.tags[: sb.hi]).all()
    assert (sa.commit_keyed[: sa.hi] == sb.commit_keyed[: sb.hi]).all()
    live = sa.live_slots()
    cols = sa.col_of_slot[live]
    np.testing.assert_allclose(sa.KC[np.ix_(live, cols[cols >= 0])],
                               sb.KC[np.ix_(live, cols[cols >= 0])], rtol=0, atol=1e-12)
    assert a.kkt_residual() <= 1e-10 and b.kkt_residual() <= 1e-10


@pytest.mark.parametrize("backend", ["compiled", "reference"])
@pytest.mark.parametrize("kernel", ["rbf", "exp"])
def test_fast_adds_equal_the_general_path(monkeypatch, backend, kernel):
    x = _stream(kernel, 400)
    key = b"fastpath-test-tag-key-0123456789"
    fast = SVDDMemory(0.05, kernel=kernel, backend=backend, tag_key=key)
    slow = SVDDMemory(0.05, kernel=kernel, backend=backend, tag_key=key)
    taken = 0
    real = fastpath.store_reserve
    for i, row in enumerate(x):
        tag = "subject" if i % 7 == 0 else None
        expected = (slow.solver_state.dim is not None
                    and solver.reserve_score(slow.solver_state, row[None, :]) is not None)
        monkeypatch.setattr(fastpath, "store_reserve", lambda *a: None)
        slow.add(row, tag=tag)
        monkeypatch.setattr(fastpath, "store_reserve", real)
        fs = fast.solver_state
        before = fs.n_block_passes, fs.chi
        room = bool(fs.free_slots) or fs.hi < fs.cap  # else the table grows: general path
        stored = []
        monkeypatch.setattr(fastpath, "store_reserve",
                            lambda *a, out=stored: out.append(real(*a)) or out[-1])
        fast.add(row, tag=tag)
        monkeypatch.setattr(fastpath, "store_reserve", real)
        took = bool(stored) and stored[0] is not None
        # the general path's decision (reserve_score) is the fast path's decision,
        # wherever the fast path is asked (health checked, or an empty margin set)
        if stored:
            assert took == (expected and room), i
        taken += took
        if took:
            assert (fast.solver_state.n_block_passes, fast.solver_state.chi) == before
        if i % 25 == 0 or i == len(x) - 1:
            _assert_same_state(fast, slow)
        if i in (150, 300):  # removals free slots the fast path then reuses
            for mem in (fast, slow):
                mem.remove(mem.partition()["reserve"][3])
                mem.remove(mem.partition()["margin"][0])
    assert taken > 200  # most adds of the stream are reserve adds
    assert fast.state_digest() == slow.state_digest() or np.allclose(fast.alpha, slow.alpha)


@pytest.mark.parametrize("kernel", ["rbf", "exp"])
def test_compiled_reserve_add_equals_the_reference(kernel):
    x = _stream(kernel, 400, seed=5)
    mem = SVDDMemory(0.05, kernel=kernel, standby=0)  # no standby: every inside row stores
    mem.extend(x[:200])
    ss = mem.solver_state
    decided = 0
    for row in x[200:]:
        a, b = ss.copy(), ss.copy()
        slot = b.free_slots[-1] if b.free_slots else b.hi
        if slot >= b.cap:  # (the general path grows the table)
            mem.add(row)
            continue
        ok_c = compiled.reserve_add(a, row, None, slot, 10**6)
        ok_r = reference.reserve_add(b, row, None, slot, 10**6)
        assert ok_c == ok_r == (solver.reserve_score(ss, row[None, :]) is not None)
        if ok_c:
            decided += 1
            for name in _ARRAYS + ("V",):
                np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=0,
                                           atol=1e-13, err_msg=name)
            np.testing.assert_allclose(a.KC, b.KC, rtol=0, atol=1e-13)
            assert a.esum_valid == b.esum_valid
        else:  # nothing written
            for name in _ARRAYS:
                assert (getattr(a, name) == getattr(ss, name)).all(), name
        mem.add(row)
    assert decided > 10


def test_reserve_add_with_values_and_an_empty_margin_set(monkeypatch):
    rng = np.random.default_rng(11)
    # two far clusters of copies: the margin set is often empty (C·n large)
    x = np.concatenate([rng.normal(size=(3, 4)) * 0.01 + 5, rng.normal(size=(3, 4)) * 0.01])
    fast, slow = SVDDMemory(0.5), SVDDMemory(0.5)
    vals = rng.normal(size=(60, 2))
    keys = x[rng.integers(0, 6, 60)] + 1e-3 * rng.normal(size=(60, 4))
    empty = 0
    real = fastpath.store_reserve
    for k, v in zip(keys, vals, strict=True):
        empty += fast.solver_state.nS == 0 and not fast.warm and fast.solver_state.dim is not None
        fast.add(k, v)
        monkeypatch.setattr(fastpath, "store_reserve", lambda *a: None)
        slow.add(k, v)  # the general path
        monkeypatch.setattr(fastpath, "store_reserve", real)
    assert empty > 0
    _assert_same_state(fast, slow)
    np.testing.assert_array_equal(fast.values, slow.values)


def test_plain_row_agrees_with_check_rows():
    mem = SVDDMemory(0.2)
    mem.add(np.zeros(3))
    ss = mem.solver_state
    x = np.array([1.0, 2.0, 3.0])
    k, v = plain_row(ss, x, None)
    k2, v2 = check_rows(ss, x, None, batch=False)
    assert k.shape == k2.shape == (1, 3) and (k == k2).all() and v is v2 is None
    for bad in (np.array([np.nan, 0, 0]), np.array([np.inf, 0, 0]), np.array([1e200, 0, 0]),
                np.array([1, 2, 3]), np.zeros(4), np.zeros((1, 3)), np.zeros(6)[::2],
                [1.0, 2.0, 3.0]):
        assert plain_row(ss, bad, None) is None  # check_rows decides (and names the error)
    assert plain_row(ss, x, np.zeros(3)) is None  # values are the keys here
    with pytest.raises(ValueError, match="too large"):
        mem.add(np.array([1e200, 0, 0]))
    assert plain_row(SVDDMemory(0.2, kernel="exp"), x, None) is None


def test_reserve_kernel_uses_the_kernels_overflow_bound():
    from svattn.exact.backends.compiled import reserve

    assert reserve.LOG_MAX == LOG_MAX


def test_block_hashes_and_commitments_equal_the_per_token_functions():
    from svattn.exact.core.hashes import row_hash, token_hash
    from svattn.exact.records.certificate import commit_token, commit_tokens

    rng = np.random.default_rng(2)
    xs = rng.normal(size=(5, 3))
    xs[1, 0] = -0.0  # written as 0.0 by the row hash and the commitment
    vs = rng.normal(size=(5, 2))
    tids = [7, 8, 9, 10, 2**40]
    for v in (None, vs):
        ths, rhs = hashes.block_hashes(tids, xs, v)
        for r, t in enumerate(tids):
            assert ths[r] == token_hash(t, xs[r], None if v is None else v[r])
            assert rhs[r] == row_hash(xs[r], np.zeros(0) if v is None else v[r])
        key = b"c" * 32
        assert commit_tokens(xs, v, key) == [
            commit_token(xs[r], None if v is None else v[r], key)[0] for r in range(5)]
        opaque = commit_tokens(xs, v, None)
        assert len(set(opaque)) == 5 and all(len(c) == 64 for c in opaque)


def test_token_digests_equal_the_per_token_functions():
    """The streaming add's three hashes from bytes converted once: the same values as
    the token hash, row hash and commitment computed each on its own (a -0.0 entry
    changes the token hash, which reads the bytes as stored, but neither the row
    hash nor the commitment)."""
    from svattn.exact.core.hashes import row_hash, token_hash
    from svattn.exact.records.certificate import commit_token

    rng = np.random.default_rng(4)
    x = rng.normal(size=6)
    z = x.copy()
    z[2] = -0.0
    zp = z + 0.0
    v = rng.normal(size=3)
    v[0] = -0.0
    key = b"d" * 32
    for tid in (0, 5, 2**40):
        for xx in (x, z, zp):
            for vv in (None, v):
                th, rh, c = fastpath.token_digests(tid, xx, vv, key)
                assert th == token_hash(tid, xx, vv)
                assert rh == row_hash(xx, np.zeros(0) if vv is None else vv)
                assert c.hex() == commit_token(xx, vv, key)[0]
    # the -0.0 entry: another set-hash summand, the same record otherwise
    a, b = fastpath.token_digests(1, z, None, key), fastpath.token_digests(1, zp, None, key)
    assert a[0] != b[0] and a[1:] == b[1:]
    # without a key: opaque, a fresh nonce each time
    c1, c2 = (fastpath.token_digests(1, x, None, None)[2] for _ in range(2))
    assert len(c1) == 32 and c1 != c2


def test_fast_adds_store_the_commitments_the_general_path_would(monkeypatch):
    """Keyed commitments (deterministic) and tags: a fast add stores what the general
    path stores, and the audit-facing commitment it returns is the stored one."""
    key = b"fastpath-commit-key-0123456789ab"
    x = _stream("rbf", 200, seed=9)
    fast = SVDDMemory(0.05, tag_key=key)
    slow = SVDDMemory(0.05, tag_key=key)
    real = fastpath.store_reserve
    returned = []
    for i, row in enumerate(x):
        tag = "subject" if i % 3 == 0 else None
        monkeypatch.setattr(fastpath, "store_reserve", lambda *a: None)
        slow.add(row, tag=tag)
        monkeypatch.setattr(fastpath, "store_reserve",
                            lambda *a, out=returned: out.append(real(*a)) or out[-1])
        fast.add(row, tag=tag)
        monkeypatch.setattr(fastpath, "store_reserve", real)
    fs, ss = fast.solver_state, slow.solver_state
    took = [r for r in returned if r is not None]
    assert len(took) > 50  # most of a 200-token stream after warm-up
    assert (fs.commitments[: fs.hi] == ss.commitments[: ss.hi]).all()
    assert (fs.commit_keyed[: fs.hi] == ss.commit_keyed[: ss.hi]).all()
    assert fs.commit_keyed[: fs.hi].all()
    for tid, hexc in took:
        assert bytes(fs.commitments[fs.id_to_slot[tid]]).hex() == hexc
    _assert_same_state(fast, slow)


@pytest.mark.parametrize("kernel", ["rbf", "exp"])
@pytest.mark.parametrize("with_values", [False, True])
def test_compiled_reserve_block_equals_the_reference(kernel, with_values):
    """An extend's block store (``reserve_block``): the compiled call and the numpy
    reference store the same rows, stop at the same row with the same status, and
    hand over the same kernel row and g of a row outside; each stored row is what
    ``reserve_add`` (standby test aside) writes for it."""
    x = _stream(kernel, 500, seed=7)
    vals = np.random.default_rng(8).normal(size=(500, 3)) if with_values else None
    mem = SVDDMemory(0.05, kernel=kernel, standby=0)
    mem.extend(x[:200], None if vals is None else vals[:200])
    ss = mem.solver_state
    stops, r = 0, 200
    while r < 500:
        a, b, single = ss.copy(), ss.copy(), ss.copy()
        count = min(500 - r, len(b.free_slots) + b.cap - b.hi)
        if count == 0:
            mem.add(x[r], None if vals is None else vals[r])
            r += 1
            continue
        slots = solver.next_slots(b, count)
        tids = np.arange(b.next_id, b.next_id + count)
        v = None if vals is None else vals[r:r + count]
        got_c = compiled.reserve_block(a, x[r:r + count], v, slots, tids)
        got_r = reference.reserve_block(b, x[r:r + count], v, slots, tids)
        assert got_c[:2] == got_r[:2]
        stored, status = got_c[:2]
        for i in range(stored):  # repeated reserve_add, row by row
            assert compiled.reserve_add(single, x[r + i], None if v is None else v[i],
                                        int(slots[i]), int(tids[i]))
        for name in _ARRAYS + ("V",):
            np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=0,
                                       atol=1e-13, err_msg=name)
            np.testing.assert_array_equal(getattr(a, name), getattr(single, name), name)
        np.testing.assert_allclose(a.KC, b.KC, rtol=0, atol=1e-13)
        np.testing.assert_array_equal(a.KC, single.KC)
        assert a.esum_valid == b.esum_valid == single.esum_valid
        if status == "outside":
            stops += 1
            np.testing.assert_allclose(got_c[2], got_r[2], rtol=0, atol=1e-13)
            assert got_c[3] == pytest.approx(got_r[3], abs=1e-13)
            assert got_c[3] < 0  # outside: the drive's starting g
            # the driven add stores it with that row and g: both backends alike
            slot, tid = int(slots[stored]), int(tids[stored])
            vi = None if v is None else v[stored]
            kxx = float(np.exp(mem.gamma_value * x[r + stored] @ x[r + stored])
                        ) if kernel == "exp" else 1.0
            compiled.store_row(a, x[r + stored], vi, slot, tid, kxx, got_c[2], got_c[3])
            reference.store_row(b, x[r + stored], vi, slot, tid, kxx, got_r[2], got_r[3])
            for name in _ARRAYS + ("V",):
                np.testing.assert_allclose(getattr(a, name), getattr(b, name), rtol=0,
                                           atol=1e-13, err_msg=name)
            np.testing.assert_allclose(a.KC, b.KC, rtol=0, atol=1e-13)
            assert a.slot_id[slot] == tid and a.g[slot] == got_c[3]
        else:
            assert status == "stored" and stored == count and got_c[2] is None
        step = stored + (status != "stored")  # the memory itself goes on as an extend
        mem.extend(x[r:r + step], None if vals is None else vals[r:r + step])
        r += step
    assert stops > 5


@pytest.mark.parametrize("backend", ["compiled", "reference"])
@pytest.mark.parametrize("kernel", ["rbf", "exp"])
@pytest.mark.parametrize("standby", [0, 16])
def test_extend_equals_repeated_adds(backend, kernel, standby):
    """``extend`` is repeated ``add``: without standby columns (whose refreshes a
    per-token add pays after each drive, an extend once at its end) the two reach the
    same state bit for bit, digest included; with them, the same state to rounding.
    Both memories first lose tokens (free slots to reuse, last freed first), and the
    rows, with values and tags, outgrow the slot table."""
    x = _stream(kernel, 700, seed=9)
    vals = np.random.default_rng(10).normal(size=(700, 3))
    tags = [f"s{i % 4}" if i % 3 else None for i in range(700)]
    key = b"fastpath-test-tag-key-0123456789"
    one, many = (SVDDMemory(0.02, kernel=kernel, standby=standby, backend=backend,
                            tag_key=key) for _ in range(2))
    for mem in (one, many):
        mem.extend(x[:200], vals[:200], tags=tags[:200])
        part = mem.partition()
        for tid in part["reserve"][5:40:3] + part["error"][:2] + part["margin"][:1]:
            mem.remove(tid)
    cap = one.solver_state.cap
    one.extend(x[200:], vals[200:], tags=tags[200:])
    for i in range(200, 700):
        many.add(x[i], vals[i], tag=tags[i])
    assert one.solver_state.cap > cap and not one.solver_state.free_slots
    if standby:  # the standby columns sit in other cache columns: the solution to rounding
        assert one.ids == many.ids and one.partition() == many.partition()
        np.testing.assert_allclose(one.alpha, many.alpha, rtol=0, atol=1e-12)
        assert one.mu == pytest.approx(many.mu, abs=1e-12)
        sa, sb = one.solver_state, many.solver_state
        np.testing.assert_allclose(sa.g[: sa.hi], sb.g[: sb.hi], rtol=0, atol=1e-12)
        assert sa.set_hash == sb.set_hash and (sa.slot_id == sb.slot_id).all()
        assert (sa.tags == sb.tags).all() and (sa.commit_keyed == sb.commit_keyed).all()
        return
    _assert_same_state(one, many)
    assert one.state_digest() == many.state_digest()
    np.testing.assert_array_equal(one.alpha, many.alpha)
    np.testing.assert_array_equal(one.values, many.values)
    sa, sb = one.solver_state, many.solver_state
    for name in _ARRAYS + ("V", "KC"):
        np.testing.assert_array_equal(getattr(sa, name)[: sa.hi],
                                      getattr(sb, name)[: sb.hi], name)


def test_a_row_the_compiled_run_cannot_score_takes_the_numpy_path(monkeypatch):
    """The general path behind ``reserve_block``'s "overflow": the row is scored in
    numpy (which raises the exp kernel's error, or stores or drives the row); the
    memory then equals one that took every row the usual way."""
    x = _stream("rbf", 400, seed=12)
    monkeypatch.setattr(ingest, "FIRST_BATCH_MIN_ROWS", 1 << 60)  # the rows one by one
    plain, detour = SVDDMemory(0.05), SVDDMemory(0.05)
    plain.extend(x)
    real = compiled.reserve_block
    calls = []

    def refuse_every_third(ss, k, v, slots, tids):
        calls.append(len(slots))
        if len(calls) % 3 == 0:
            return 0, "overflow", None, 0.0, 0.0
        return real(ss, k, v, slots, tids)

    monkeypatch.setattr(compiled, "reserve_block", refuse_every_third)
    detour.extend(x)
    assert len(calls) > 9
    assert plain.ids == detour.ids and plain.partition() == detour.partition()
    np.testing.assert_allclose(plain.alpha, detour.alpha, rtol=0, atol=1e-12)
    assert plain.solver_state.set_hash == detour.solver_state.set_hash
    assert detour.kkt_residual() <= 1e-10
