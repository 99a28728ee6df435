"""Every public operation is atomic: a failure at any point leaves the memory, its
audit log and its health record exactly as before the call (svattn.exact.operations.rollback).

Faults are injected by wrapping every function of the backend (and the solver's
batch re-solve, the signer and the log's writer) so that the k-th call raises; k
runs over every call an operation makes, so each phase of each operation fails once.
"""

from __future__ import annotations

import numpy as np
import pytest

from fault_injection import Injected, assert_same, install_faults, snapshot
from svattn.exact import OperationError, SVDDMemory
from svattn.exact.operations import solver
from svattn.exact.records.audit import AuditLogError, verify_chain


@pytest.fixture
def faults(monkeypatch):
    return install_faults(monkeypatch)


def stream(kernel: str, rng) -> np.ndarray:
    d = 3
    centers = rng.normal(size=(4, d))
    x = centers[rng.integers(0, 4, 60)] + 0.3 * rng.normal(size=(60, d))
    return 0.4 * x if kernel == "exp" else x


OPS = ["add", "add_reserve", "extend", "remove", "remove_margin", "erase", "compact", "remove_many"]


def run_op(mem: SVDDMemory, op: str, rng, xs: np.ndarray):
    if op == "add":
        return mem.add(xs[0], tag="subject-new")
    if op == "add_reserve":  # the light path: a row deep inside the description
        x = mem.keys[mem.partition()["reserve"]].mean(axis=0)
        assert mem.health.checked(mem.solver_state.Qinv)
        assert solver.reserve_score(mem.solver_state, x[None, :]) is not None
        return mem.add(x, tag="subject-new")
    if op == "extend":
        return mem.extend(xs[:9], tags=["subject-new"] * 9)
    if op == "remove":
        return mem.remove(mem.ids[3])
    if op == "remove_margin":
        return mem.remove(mem.partition()["margin"][0])
    if op == "erase":
        return mem.erase("subject-1")
    if op == "compact":
        return mem.compact()
    if op == "remove_many":
        return mem.remove_many(mem.support_ids()[:3])
    raise AssertionError(op)


BACKENDS = ["compiled", "reference"]
KERNELS = ["rbf", "exp"]
# The default suite's sample (issue #37): every operation once, each (backend, kernel)
# pair twice, every fault point of each; the other 24 combinations run under -m slow.
# erase, the longest sweep (82 to 164 fault points), takes its shortest pairing.
SAMPLE = {"add": ("reference", "rbf"), "add_reserve": ("compiled", "exp"),
          "extend": ("reference", "exp"), "remove": ("compiled", "rbf"),
          "remove_margin": ("reference", "exp"), "erase": ("compiled", "rbf"),
          "compact": ("compiled", "exp"), "remove_many": ("reference", "rbf")}


def _sweep() -> list:
    return [pytest.param(backend, kernel, op, id=f"{op}-{kernel}-{backend}",
                         marks=() if SAMPLE[op] == (backend, kernel) else pytest.mark.slow)
            for op in OPS for kernel in KERNELS for backend in BACKENDS]


def test_the_default_sample_covers_every_backend_kernel_and_operation():
    assert list(SAMPLE) == OPS
    pairs = list(SAMPLE.values())
    assert {b for b, _ in pairs} == set(BACKENDS) and {k for _, k in pairs} == set(KERNELS)
    assert all(pairs.count((b, k)) == 2 for b in BACKENDS for k in KERNELS)
    slow = [p for p in _sweep() if p.marks]
    assert len(_sweep()) == 32 and len(slow) == 24


@pytest.mark.parametrize("backend, kernel, op", _sweep())
def test_every_fault_leaves_memory_and_log_unchanged(faults, tmp_path, backend, kernel, op):
    rng = np.random.default_rng(7)
    x = stream(kernel, rng)
    log = tmp_path / "audit.jsonl"

    def build(audit_log):
        m = SVDDMemory(C=0.1, kernel=kernel, backend=backend, audit_log=audit_log,
                       tag_key=b"k" * 32)
        m.extend(x[:40], tags=[f"subject-{i % 3}" for i in range(40)])
        return m

    mem, twin = build(log), build(tmp_path / "twin.jsonl")  # the same construction
    extra = x[40:]
    # how many calls the operation makes when nothing fails
    faults.fail_at = -1
    faults.calls = 0
    expected = run_op(twin, op, rng, extra)
    total = faults.calls
    assert total > 0
    for k in range(1, total + 1):
        before = snapshot(mem, log)
        faults.calls, faults.fail_at = 0, k
        with pytest.raises((OperationError, AuditLogError, Injected)) as info:
            run_op(mem, op, rng, extra)
        faults.fail_at = -1
        if info.type is OperationError:
            assert "Injected" in str(info.value) and "unchanged" in str(info.value)
        assert_same(before, snapshot(mem, log))
    # after all those failures the operation still succeeds, as on the twin
    faults.fail_at = -1
    got = run_op(mem, op, rng, extra)
    assert mem.ids == twin.ids
    np.testing.assert_allclose(mem.alpha, twin.alpha, rtol=0, atol=1e-12)
    assert mem.kkt_residual() <= mem.tol
    if op in ("add", "add_reserve", "extend", "compact"):
        assert got == expected
    assert verify_chain(log).ok
    mem.save(tmp_path / "state.safetensors")
    mem.close_audit_log()
    SVDDMemory.load(tmp_path / "state.safetensors", audit_log=log, tag_key=b"k" * 32)


def test_first_add_rolls_back_to_an_empty_memory(faults):
    mem = SVDDMemory(C=0.5)
    faults.calls, faults.fail_at = 0, 1
    with pytest.raises((OperationError, Injected)):
        mem.extend(np.eye(3))
    faults.fail_at = -1
    assert len(mem) == 0 and mem.dim is None and mem.ids == []
    assert mem.extend(np.eye(3)) == [0, 1, 2]


def test_interrupt_passes_through_after_rollback(monkeypatch):
    mem = SVDDMemory(C=0.1)
    ids = mem.extend(np.random.default_rng(0).normal(size=(50, 3)))
    before = mem.state_digest()

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(solver, "remove_slot", interrupted)
    with pytest.raises(KeyboardInterrupt):
        mem.remove(ids[0])
    assert mem.state_digest() == before and len(mem) == 50


@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_no_operation_writes_into_the_inverse_its_checkpoint_holds(monkeypatch, backend):
    """The checkpoint keeps the bordered inverse by reference, not by a copy (issue #36:
    two passes over |S|² floats per operation): sound only while every operation
    makes a new inverse instead of writing into the old one, or counts a write over
    it (``SlotState.inverse_overwrites``: the restore then recomputes it). Every
    operation of a mixed stream ends with the inverse it started from intact, bit for
    bit, or with that count moved and the new inverse in the old one's memory; the
    compiled removals do write over it (else this test could not fail that way)."""
    from svattn.exact.operations import rollback

    held = []
    real_cp, real_scrub = rollback.checkpoint, rollback._scrub_after_success
    overwrites = []

    def keep(ss, *a, **k):
        cp = real_cp(ss, *a, **k)
        held.append((cp.qinv_obj, cp.qinv_obj.copy(), ss.inverse_overwrites))
        return cp

    def check(ss, cp, **k):
        obj, was, count = held.pop()  # (innermost first: erase and remove_many nest removals)
        assert obj is cp.qinv_obj
        if ss.inverse_overwrites == count:
            assert np.array_equal(obj, was)
        else:
            overwrites.append(np.may_share_memory(obj, ss.Qinv))
        real_scrub(ss, cp, **k)

    monkeypatch.setattr(rollback, "checkpoint", keep)
    monkeypatch.setattr(rollback, "_scrub_after_success", check)
    rng = np.random.default_rng(11)
    mem = SVDDMemory(1 / 40, gamma=1.5, backend=backend)
    mem.extend(rng.normal(size=(160, 3)))
    assert mem.solver_state.nS >= 8
    for step in range(40):
        part = mem.partition()
        kind = ("margin", "error", "reserve", "margin")[step % 4]
        if part[kind]:
            mem.remove(int(rng.choice(part[kind])))
        mem.add(rng.normal(size=3) * (3.0 if step % 3 == 0 else 1.0))
    old = mem.solver_state.Qinv
    mem.remove_many(mem.partition()["margin"][:3])  # nested: the outermost scrubs it
    new = mem.solver_state.Qinv
    assert new is not old
    if np.may_share_memory(old, new):  # written over: zeros past the new inverse
        assert not old.reshape(-1)[new.size:].any()
    else:
        assert not old.any()
    mem.extend(rng.normal(size=(20, 3)))
    mem.compact()
    while len(mem) > 30:  # down through the warm-up threshold
        mem.remove(mem.ids[0])
    assert not held
    assert (backend == "compiled") == any(overwrites), overwrites


@pytest.mark.parametrize("op", ["remove_many", "erase", "add"])
def test_faults_where_the_scratch_is_kept_leave_the_memory_unchanged(faults, monkeypatch, op):
    """The sweep above runs below the kept factor's threshold (96 margin tokens); here
    the Gram copy, the spare inverse buffer and the kept factor are all
    live when the operation starts, and their own methods fail too (#36 review)."""
    from exact_helpers import check_scratch_between_operations
    from svattn.exact.backends.compiled import linalg
    from svattn.exact.core import gram

    for name in ("release_margin_gram", "bordered_buffer", "kept_bordered_copy",
                 "kept_margin_gram", "gram_buffer"):
        monkeypatch.setattr(gram.MarginGramScratch, name,
                            faults.wrap(getattr(gram.MarginGramScratch, name)))
    monkeypatch.setattr(gram.KeptFactor, "trim", faults.wrap(gram.KeptFactor.trim))
    monkeypatch.setattr(linalg, "chol_holes", faults.wrap(linalg.chol_holes))
    rng = np.random.default_rng(5)
    centers = rng.normal(size=(8, 3)) * 2
    x = centers[rng.integers(0, 8, 620)] + rng.normal(size=(620, 3)) * 0.5
    mem = SVDDMemory(1 / 18, "rbf", 1.0, tag_key=b"k" * 32)
    mem.extend(x[:600], tags=[f"s{i % 50}" for i in range(600)])
    for t in mem.partition()["margin"][:2]:
        mem.remove(t)
    ss = mem.solver_state
    assert ss.nS >= 96 and ss.pd_factor is not None
    assert ss.kss_for is ss.Qinv and ss.qspare.size  # (no work copy of the inverse is kept)

    def run():
        if op == "remove_many":
            return mem.remove_many(mem.partition()["margin"][5:8] + mem.partition()["error"][:1])
        if op == "erase":
            return mem.erase("s7")
        return mem.add(x[610] * 1.5)

    k = 0
    while True:
        k += 1
        before = snapshot(mem, None)
        faults.calls, faults.fail_at = 0, k
        try:
            run()
        except (OperationError, Injected):
            pass
        else:
            break  # k passed the operation's last call: it succeeded
        finally:
            faults.fail_at = -1
        assert_same(before, snapshot(mem, None))
        check_scratch_between_operations(ss)
    assert k > 5 and mem.kkt_residual() <= mem.tol
    check_scratch_between_operations(ss)
