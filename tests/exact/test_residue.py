"""No residue: a removed token's key and value leave no bytes behind."""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest

from heap_helpers import copies_in_process_memory, needs_proc_mem
from svattn.exact import SVDDMemory
from svattn.exact.core.hashes import token_hash
from svattn.exact.memory import BACKENDS
from svattn.exact.operations import ingest, solver


def _needles(x: np.ndarray) -> list[bytes]:
    """The whole vector and each nonzero coordinate as float64 bytes."""
    x = np.ascontiguousarray(x, dtype=np.float64)
    return [x.tobytes()] + [np.float64(v).tobytes() for v in x if v != 0.0]


def _memory_bytes(mem: SVDDMemory) -> list[tuple[str, bytes]]:
    out = []
    # every array of the solver state (the memory object holds none of its own)
    assert not any(isinstance(v, np.ndarray) for v in vars(mem).values())
    for name, val in vars(mem.solver_state).items():
        if isinstance(val, np.ndarray) and val.dtype != object:
            out.append((name, np.ascontiguousarray(val).tobytes()))
    if mem.solver_state.pd_factor is not None:  # the kept uniqueness factor's buffer
        out.append(("pd_factor", mem.solver_state.pd_factor.L.tobytes()))
    return out


def _scan(blobs, removed) -> list[str]:
    hits = []
    for what, blob in blobs:
        for tid, vecs in removed.items():
            for vec in vecs:
                for needle in _needles(vec):
                    if needle in blob:
                        hits.append(f"{what} holds bytes of removed token {tid}")
    return hits


def _spy_on_scrub(monkeypatch, module) -> list[np.ndarray]:
    """Copies of what ``module.scrub`` zeroes from now on (each checked zeroed)."""
    scrubbed: list[np.ndarray] = []
    real = module.scrub

    def spy(a):
        scrubbed.append(a.copy())
        real(a)
        assert not a.any()

    monkeypatch.setattr(module, "scrub", spy)
    return scrubbed


@pytest.mark.parametrize(("values", "batch"), [(False, False), (True, False), (False, True)])
def test_removed_tokens_leave_no_bytes(tmp_path, monkeypatch, values, batch):
    rng = np.random.default_rng(3)
    n, d = 240, 5
    X = rng.normal(size=(n, d)) * rng.uniform(0.5, 2.0, size=(n, 1))
    V = rng.normal(size=(n, 4)) if values else None
    log = tmp_path / "audit.jsonl"
    mem = SVDDMemory(0.02, audit_log=log)
    if not batch:  # the 200 rows one by one (a first block of 64 rows and more is batched)
        monkeypatch.setattr(ingest, "FIRST_BATCH_MIN_ROWS", 1 << 60)
    ids = mem.extend(X[:200], None if V is None else V[:200])
    assert mem.ingest_path == ("libsvm+exact" if batch else "incremental")
    part = mem.partition()
    # one of each kind: margin, error, reserve, plus a batch of random ones
    victims = [part["margin"][0], part["margin"][-1], part["reserve"][0]]
    if part["error"]:
        victims.append(part["error"][0])
    victims += [int(t) for t in rng.choice(ids, 30, replace=False) if t not in victims]
    removed = {}
    for t in victims:
        slot = mem.solver_state.id_to_slot[t]
        removed[t] = [X[t]] + ([V[t]] if values else [])
        th = mem.solver_state.token_hash[slot]
        mem.remove(t)
        # the slot is wiped everywhere
        ss = mem.solver_state
        assert ss.state[slot] == 0 and not ss.X[slot].any() and not ss.V[slot].any()
        assert not mem.solver_state.KC[slot].any() and mem.solver_state.col_of_slot[slot] == -1
        assert ss.token_hash[slot] == 0 and th not in set(ss.token_hash.tolist())
        assert t not in mem.solver_state.id_to_slot
    mem.compact()
    for r in range(200, n):  # reuse freed slots
        mem.add(X[r], None if V is None else V[r])
    path = tmp_path / "m.safetensors"
    mem.save(path)
    blobs = _memory_bytes(mem) + [("saved file", path.read_bytes()), ("audit log",
                                                                         log.read_bytes())]
    assert not _scan(blobs, removed)
    # the unsalted per-token hashes of removed tokens are gone too
    live_hashes = set(mem.solver_state.token_hash.tolist())
    for t, vecs in removed.items():
        h = token_hash(t, vecs[0], vecs[1] if values else None)
        assert h not in live_hashes
    # sanity: the scan does find live tokens' bytes (it is not vacuous)
    live = mem.ids[0]
    assert _scan([("saved file", path.read_bytes())], {live: [X[live]]})
    # and the log never holds any token's data, live or removed
    assert not _scan([("audit log", log.read_bytes())], {live: [X[live]]})


def test_removal_in_warm_up_leaves_no_bytes(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.normal(size=(6, 3))
    mem = SVDDMemory(0.05)  # warm-up until 20 tokens
    mem.extend(X)
    mem.remove(2)
    path = tmp_path / "m.safetensors"
    mem.save(path)
    blobs = _memory_bytes(mem) + [("saved file", path.read_bytes())]
    assert not _scan(blobs, {2: [X[2]]})


@pytest.mark.parametrize("compiled", [True, False])
def test_the_event_loop_scrubs_its_copy_of_the_removed_tokens_column(monkeypatch, compiled):
    # the event loop keeps the driven token's kernel column in a temporary; on a
    # removal it is the deleted token's data, so it is zeroed before it is freed
    rng = np.random.default_rng(2)
    mem = SVDDMemory(0.03, backend="compiled" if compiled else "reference")
    backend_module = BACKENDS[mem.backend]
    # the compiled removal hands the whole drive to the event loop
    mem.solver_state.max_segments = 0
    mem.extend(rng.normal(size=(120, 4)))
    tid = mem.partition()["error"][0]
    ss = mem.solver_state
    slot = ss.id_to_slot[tid]
    # an error token keeps no column (issue #51): the removal computes it as alloc_col does
    assert ss.col_of_slot[slot] < 0
    if compiled:
        from svattn.exact.backends.compiled.columns import kernel_column

        col = np.zeros((ss.hi, 1))
        kernel_column(col, ss.X, ss.diag, slot, 0, ss.hi, ss.gamma_value, ss.is_rbf)
        column = col[:, 0].copy()
    else:
        column = np.zeros(ss.hi)
        backend_module.kernel_column_into(ss, slot, column)
    scrubbed = _spy_on_scrub(monkeypatch, backend_module)
    cert = mem.remove(tid)
    assert cert.n_events >= 1
    assert any(np.array_equal(a, column) for a in scrubbed), "the column copy was not zeroed"


@pytest.mark.parametrize("backend", ["compiled", "reference"])
@pytest.mark.parametrize("which", ["margin", "error"])
def test_a_successful_removal_drops_its_checkpoint_scrubbed(monkeypatch, which, backend):
    # the checkpoint copies every per-slot vector and holds the bordered inverse; after
    # the removal succeeds those copies are garbage holding the removed token's g, alpha
    # and error sum (functions of its key), and the old inverse holds its row
    from svattn.exact.operations import rollback

    rng = np.random.default_rng(4)
    mem = SVDDMemory(0.03, backend=backend)
    mem.extend(rng.normal(size=(150, 4)))
    ss = mem.solver_state
    tid = mem.partition()[which][0]
    slot = ss.id_to_slot[tid]
    # what the copies hold (the reference backend keeps no error sum)
    assert ss.alpha[slot] != 0 and (backend == "reference" or ss.esum[slot] != 0)
    old_qinv = ss.Qinv
    assert old_qinv.any()
    seen = []
    real = rollback.checkpoint

    def keep(*a, **k):
        cp = real(*a, **k)
        seen.append(cp)
        return cp

    monkeypatch.setattr(rollback, "checkpoint", keep)
    mem.remove(tid)
    (cp,) = seen
    for name, arr in cp.vectors.items():
        assert not arr[slot], f"the checkpoint's {name} still holds the removed token's entry"
    assert cp.qinv_obj is old_qinv  # held by reference (no copy): scrubbed below
    assert ss.Qinv is not old_qinv  # the replaced inverse: zeroed, or written over
    if np.shares_memory(ss.Qinv, old_qinv):  # (in place: every float of it rewritten,
        assert ss.inverse_overwrites == 1  # zeros past the new inverse)
        assert not old_qinv.reshape(-1)[ss.Qinv.size:].any()
    else:
        assert not old_qinv.any()


def test_the_reference_contraction_scrubs_its_permuted_copy_of_the_inverse(monkeypatch):
    # contracting a margin token that is not last permutes the bordered inverse into a
    # copy (the removed token's row and column moved last), then downdates it: the
    # copy and the outer-product temporary hold that row and are freed zeroed
    from svattn.exact.backends import reference

    rng = np.random.default_rng(6)
    mem = SVDDMemory(0.03, backend="reference")
    mem.extend(rng.normal(size=(150, 4)))
    ss = mem.solver_state
    assert ss.nS >= 3
    tid = int(ss.slot_id[ss.slot_of_col[0]])  # margin position 0: not the last
    row = ss.Qinv[1].copy()  # its row of the inverse (position 0 is row 1: mu first)
    scrubbed = _spy_on_scrub(monkeypatch, reference)
    mem.remove(tid)
    held = [a for a in scrubbed if a.ndim == 2 and a.shape == (len(row), len(row))]
    assert any(np.isin(row[row != 0], a).all() for a in held), "the permuted copy survived"


def test_a_failed_first_operation_scrubs_every_array_it_allocated(monkeypatch):
    # the state was empty before: the restore drops all it allocated (keys, cache,
    # inverse, per-slot values, the Gram copy), every array zeroed first

    rng = np.random.default_rng(7)
    mem = SVDDMemory(0.02)
    seen = []

    def fail(ss, be, ids):
        seen.extend(v for v in vars(ss).values()
                    if isinstance(v, np.ndarray) and v.dtype != object and v.size)
        raise RuntimeError("injected")

    monkeypatch.setattr(solver, "standby_upkeep", fail)
    with pytest.raises(Exception, match="injected"):
        mem.extend(rng.normal(size=(200, 5)))
    assert len(mem) == 0 and len(seen) >= 10
    assert not [a.shape for a in seen if a.any()]


def test_a_pickled_memory_leaves_its_kept_factor_behind(monkeypatch):
    import pickle

    import svattn.exact.backends.compiled as backend

    monkeypatch.setattr(backend, "FACTOR_KEPT_FROM", 4)
    rng = np.random.default_rng(8)
    mem = SVDDMemory(1 / 60, gamma=2.0)
    mem.extend(rng.normal(size=(300, 3)))
    ss = mem.solver_state
    mem.remove(int(ss.slot_id[ss.slot_of_col[0]]))
    f = mem.solver_state.pd_factor
    assert f is not None
    live = np.flatnonzero(f.live())
    blob = pickle.dumps(mem)
    assert f.L[live[-1], : live[-1] + 1].tobytes() not in blob  # (a factor row: not carried)
    twin = pickle.loads(blob)
    rebuilt = twin.solver_state.pd_factor  # (built on unpickling, as a fit builds it)
    assert rebuilt is not f and rebuilt.updates == 0 and rebuilt.holes == 0
    assert mem.solver_state.pd_factor is f
    assert twin.state_digest() == mem.state_digest()


@pytest.mark.parametrize("then", ["save", "load"])
def test_a_killed_saves_temporary_file_is_removed_by_the_next_save_or_load(tmp_path, then):
    # a save killed after writing its temporary file leaves it beside the state; it
    # holds the state of then, with tokens that may be erased since
    rng = np.random.default_rng(5)
    X = rng.normal(size=(60, 3))
    mem = SVDDMemory(0.1)
    mem.extend(X)
    path = tmp_path / "m.safetensors"
    mem.save(path)
    leftover = tmp_path / ".m.safetensors.k1ll3d_x.tmp"
    leftover.write_bytes(path.read_bytes())  # what the killed save had written
    unrelated = [tmp_path / ".m.safetensors.notes.tmp",
                 tmp_path / ".other.safetensors.k1ll3d_x.tmp"]
    for u in unrelated:
        u.write_bytes(b"keep me")
    mem.remove(7)
    if then == "save":
        mem.save(path)
    else:
        SVDDMemory.load(path)
    assert not leftover.exists()
    assert all(u.read_bytes() == b"keep me" for u in unrelated)  # only this state's leftovers
    blobs = [(p.name, p.read_bytes()) for p in tmp_path.iterdir() if p.is_file()]
    if then == "save":
        assert not _scan(blobs, {7: [X[7]]})  # no byte of the erased token under the directory


def test_a_temporary_file_a_live_save_is_writing_is_left_alone(tmp_path):
    """A save holds an flock on the state's directory from before its temporary file
    exists until after the rename: a load beside it (another process) must not delete
    that file, or the live save's rename would fail."""
    import fcntl

    mem = SVDDMemory(0.1)
    mem.extend(np.random.default_rng(6).normal(size=(30, 3)))
    path = tmp_path / "m.safetensors"
    mem.save(path)
    live = tmp_path / ".m.safetensors.l1vesave.tmp"
    live.write_bytes(b"half written")
    fd = os.open(tmp_path, os.O_RDONLY)
    fcntl.flock(fd, fcntl.LOCK_EX)  # as write_atomic holds it
    try:
        SVDDMemory.load(path)
        assert live.read_bytes() == b"half written"
    finally:
        os.close(fd)
    SVDDMemory.load(path)  # the lock is gone: now it is a leftover
    assert not live.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors"]  # no lock file


@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_a_removed_tokens_kernel_row_is_zeroed_past_the_columns_in_use(backend):
    # a row is scored against every column below chi, holes included (k(x, 0) there:
    # a function of the key's norm); when chi later shrinks below such a hole, the
    # removal's wipe must still zero it (found by the #36 review's residue scan:
    # the compiled wipe zeroed columns below chi only)
    from svattn.exact.core.kktsets import FREE

    rng = np.random.default_rng(1)
    centers = rng.normal(size=(6, 4)) * 3
    X = centers[rng.integers(0, 6, 700)] + rng.normal(size=(700, 4)) * 0.5
    mem = SVDDMemory(1 / 35, "rbf", 0.3, backend=backend)
    mem.extend(X[:500])
    ss = mem.solver_state
    j = 500
    for step in range(16):
        part = mem.partition()
        m = part["margin"]
        t = int(m[step % len(m)]) if step % 3 != 2 else int(rng.choice(mem.ids))
        mem.remove_many([t] + [x for x in m[:3] if x != t])
        free = np.flatnonzero(ss.state[: ss.hi] == FREE)
        unowned = np.flatnonzero(ss.slot_of_col < 0)  # (an owned column is a live key's)
        assert not ss.KC[np.ix_(free, unowned)].any(), f"a removed token's row survives ({step})"
        mem.add(X[j])
        j += 1
        if step % 7 == 0:
            mem.extend(X[j : j + 3])
            j += 3
        if step % 11 == 5:
            mem.compact()
        # no hole below chi between operations (since issue #51 each operation ends
        # with its columns compacted), so no later row is scored against one
        assert not (ss.slot_of_col[: ss.chi] < 0).any()


@needs_proc_mem
@pytest.mark.parametrize("values", [False, True], ids=["keys", "keys+values"])
@pytest.mark.parametrize("hashing", ["commit_tokens", "block_hashes", "token_digests",
                                     "commit_token", "token_hash", "row_hash"])
def test_hashing_new_rows_leaves_no_copy_of_them_in_freed_memory(hashing, values):
    # an extend's commitments (commit_tokens) and hashes converted the rows to float64
    # copies and bytes objects freed unzeroed: after the token's removal its row was
    # still in the process's freed memory (1 to 5 copies after extend then remove).
    # Each function runs alone between two reads of the heap, so nothing else can
    # have left or overwritten a copy.
    from svattn.exact import fastpath
    from svattn.exact.core import hashes
    from svattn.exact.records import certificate

    rng = np.random.default_rng([len(hashing), int(values)])
    X = rng.normal(size=(6, 4))
    V = rng.normal(size=(6, 3)) if values else None
    needle = X[3].tobytes()
    key = b"k" * 32
    calls = {
        "commit_tokens": lambda: certificate.commit_tokens(X, V, key),
        "block_hashes": lambda: hashes.block_hashes(list(range(6)), X, V),
        "token_digests": lambda: fastpath.token_digests(3, X[3], None if V is None else V[3],
                                                        key),
        "commit_token": lambda: certificate.commit_token(X[3], None if V is None else V[3],
                                                         None),
        "token_hash": lambda: hashes.token_hash(3, X[3].tolist(), None),
        "row_hash": lambda: hashes.row_hash(X[3], X[3] if V is None else V[3]),
    }
    before = copies_in_process_memory(needle)
    assert before >= 1  # X itself: the scan is not vacuous
    calls[hashing]()
    gc.collect()
    assert copies_in_process_memory(needle) == before


@needs_proc_mem
@pytest.mark.parametrize("rows", [1, 5, 20])
@pytest.mark.parametrize("how", ["remove", "remove with values", "erase"])
def test_an_extended_then_removed_row_leaves_no_copy_in_freed_memory(rows, how):
    # an extend's commitments and hashes converted the rows to float64 copies and bytes
    # objects that were freed unzeroed: after the removal the row's bytes were still in
    # the process's freed memory (1 to 5 copies), against "nothing erased survives"

    rng = np.random.default_rng([rows, len(how)])  # a fresh row for every case
    values = how == "remove with values"
    mem = SVDDMemory(0.1, tag_key=b"k" * 32 if how == "erase" else None)
    mem.extend(rng.normal(size=(50, 4)), rng.normal(size=(50, 3)) if values else None)
    X = rng.normal(size=(rows, 4))
    V = rng.normal(size=(rows, 3)) if values else None
    j = min(3, rows - 1)
    row = X[j].copy()
    needle = row.tobytes()
    ids = mem.extend(X, V, tags=[f"s{i}" for i in range(rows)] if how == "erase" else None)
    X.fill(0)  # the caller's own copy goes
    del X
    assert copies_in_process_memory(needle) >= 2  # the stored key and `row`: not vacuous
    if how == "erase":
        mem.erase(f"s{j}")
    else:
        mem.remove(ids[j])
    gc.collect()
    row.fill(0)
    assert copies_in_process_memory(needle) == 0


@needs_proc_mem
def test_a_removed_error_token_leaves_no_copy_of_its_key_in_freed_memory():
    # an error token keeps no column: its removal computes one afresh (and the error sum
    # loses it), each temporary holding its key's data zeroed before it is freed
    rng = np.random.default_rng(21)
    mem = SVDDMemory(0.05)
    mem.extend(rng.normal(size=(80, 4)))
    X = rng.normal(size=(6, 4))
    X[3] = 4.0 + rng.normal(size=4)  # far outside: an error token
    row = X[3].copy()
    needle = row.tobytes()
    ids = mem.extend(X)
    X.fill(0)
    del X
    tid = ids[3]
    assert tid in mem.partition()["error"]
    assert mem.solver_state.col_of_slot[mem.solver_state.id_to_slot[tid]] < 0
    assert copies_in_process_memory(needle) >= 2  # the stored key and `row`
    mem.remove(tid)
    gc.collect()
    row.fill(0)
    assert copies_in_process_memory(needle) == 0
