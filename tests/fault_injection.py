"""Fault injection for atomicity tests (test_atomic.py, test_attack_merged.py): the k-th
call of any backend function, the solver's re-solve, the signer or the audit log's writer
raises, and a snapshot of everything an operation may change, compared after it failed."""

from __future__ import annotations

import types

import numpy as np

from svattn.exact import SVDDMemory
from svattn.exact import memory as memory_module
from svattn.exact.backends import compiled, reference
from svattn.exact.operations import solver
from svattn.exact.records import schema
from svattn.exact.records.audit import AuditLog


class Injected(RuntimeError):
    pass


class Faults:
    """Counts calls of the wrapped functions; the ``fail_at``-th call raises."""

    def __init__(self) -> None:
        self.calls = 0
        self.fail_at = -1

    def wrap(self, fn):
        def wrapped(*args, **kwargs):
            self.calls += 1
            if self.calls == self.fail_at:
                raise Injected(f"fault at call {self.calls} ({fn.__name__})")
            return fn(*args, **kwargs)
        return wrapped


def install_faults(monkeypatch) -> Faults:
    """Wrap every backend function, the solver's re-solve and upkeep, the signer and the
    audit log's writer so that the ``fail_at``-th call raises :class:`Injected`."""
    f = Faults()
    for module in (compiled, reference):
        for name in module.__all__:
            obj = getattr(module, name)
            if isinstance(obj, types.FunctionType):
                monkeypatch.setattr(module, name, f.wrap(obj))
    for name in ("resolve", "standby_upkeep", "finish_op"):
        if hasattr(solver, name):
            monkeypatch.setattr(solver, name, f.wrap(getattr(solver, name)))
    monkeypatch.setattr(memory_module, "sign", f.wrap(memory_module.sign))
    monkeypatch.setattr(AuditLog, "_write", f.wrap(AuditLog._write))
    return f


def snapshot(mem: SVDDMemory, log) -> tuple:
    ss = mem.solver_state
    t, fields = schema.to_tensors(ss)
    for name in schema.RECIPE_TENSORS:  # (the cache's recipe: the cache itself compared)
        del t[name]
    cache = ss.KC[np.ix_(ss.ordered_slots(), np.arange(ss.chi))].copy()
    qinv = t.pop("qinv")  # (compared on its own: a restore may recompute it)
    return (mem.state_digest(), mem.ids, {k: v.tobytes() for k, v in t.items()},
            {k: v for k, v in fields.items()}, cache, mem.health.to_dict(mem.solver_state.Qinv),
            None if log is None else log.read_bytes(), qinv, ss.inverse_overwrites)


def assert_same(before: tuple, after: tuple) -> None:
    assert after[0] == before[0], "digest changed"
    assert after[1] == before[1], "ids changed"
    assert after[2].keys() == before[2].keys()
    for k in before[2]:
        assert after[2][k] == before[2][k], f"tensor {k} changed"
    assert after[3] == before[3], "solver fields changed"
    # the cache is recomputed from the keys: equal to rounding (module docs)
    assert after[4].shape == before[4].shape
    np.testing.assert_allclose(after[4], before[4], rtol=0, atol=1e-13)
    assert after[5] == before[5], "health record changed"
    assert after[6] == before[6], "audit log changed"
    # the bordered inverse: bit for bit, or recomputed from the restored margin block
    # where the operation had written its own over it (rollback's module docs: a restore
    # leaves the write count as it found it): the same matrix to rounding
    assert after[7].shape == before[7].shape
    if after[8] == before[8]:
        np.testing.assert_array_equal(after[7], before[7])
    else:
        scale = np.abs(before[7]).max()
        np.testing.assert_allclose(after[7], before[7], rtol=0, atol=1e-9 * scale)
