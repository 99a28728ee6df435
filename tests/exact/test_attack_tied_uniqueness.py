"""Attacks on the uniqueness test with tokens tied at ``g = 0``
(``solver.unique_optimum`` → ``Backend.tied_positive_definite``; the compiled backend's
kept-factor append, ``backends/compiled/tied.py``): what it leaves in freed memory, the
Gram buffer it reads, and the kernel signatures its callers reach.
"""

from __future__ import annotations

import gc
import sys

import numpy as np
import pytest

from heap_helpers import copies_in_process_memory, needs_proc_mem
from svattn.exact import SVDDMemory
from svattn.exact.backends import compiled, reference
from svattn.exact.core.kktsets import ERROR, RESERVE
from tied_helpers import add_tied_near_copy, distinct_icu_rows


def _tied_beside(backend: str, seed: int) -> tuple[SVDDMemory, np.ndarray, int, int]:
    """A memory with a near-copy (1e-9) of a margin token added, the row it was added
    from, its id, and another margin token to forget (the near-copy then sits tied)."""
    rng = np.random.default_rng(seed)
    mem = SVDDMemory(0.05, backend=backend)
    mem.extend(rng.normal(size=(200, 3)))
    row, tw, victim = add_tied_near_copy(mem)
    return mem, row, tw, victim


@needs_proc_mem
@pytest.mark.parametrize("kept_from", [4, 10**6], ids=["kept-factor", "general"])
def test_a_tied_tokens_key_leaves_no_copy_in_freed_memory(monkeypatch, kept_from):
    # the test gathered the keys of the margin set and the tied tokens (ss.X[T]) for the
    # copy test (has_equal_rows: its sort's copy too) and the general test, and the tied
    # tokens' keys again for the kept factor's append (ss.X[tied]), each freed unzeroed:
    # after the tied token's own removal its key was still in freed memory (3 or 4
    # copies), against "nothing erased survives"
    monkeypatch.setattr(compiled, "FACTOR_KEPT_FROM", kept_from)
    # (a key of its own per case, and none another test here draws: the other case's
    # needle, a bytes object freed unzeroed when it ended, would be counted here when
    # both run in one process; the interrupt test below keeps seed 5's near-copy alive)
    mem, row, tw, victim = _tied_beside("compiled", 8 if kept_from == 4 else 9)
    ss = mem.solver_state
    needle = row.tobytes()
    calls = []
    test = compiled.tied_positive_definite

    def spy(ss_, tied):
        calls.append(len(tied))
        return test(ss_, tied)

    monkeypatch.setattr(compiled, "tied_positive_definite", spy)
    cert = mem.remove(victim)
    assert calls and cert.unique_optimum is False  # the tied path ran (a near-copy: singular)
    assert ss.state[ss.id_to_slot[tw]] in (ERROR, RESERVE)
    mem.remove(tw)
    gc.collect()
    row.fill(0)
    assert copies_in_process_memory(needle) == 0


@needs_proc_mem
@pytest.mark.parametrize("call", ["reference", "compiled", "compiled general",
                                  "has_equal_rows"])
def test_the_tied_tests_copy_no_key_into_freed_memory(monkeypatch, call):
    # each test alone between two reads of the heap (the reference backend's removal
    # leaves a copy of its own elsewhere: not this test's)
    from svattn.exact.core.kernels import has_equal_rows

    monkeypatch.setattr(compiled, "FACTOR_KEPT_FROM", 4)
    mem, row, tw, victim = _tied_beside("compiled", 6)
    ss = mem.solver_state
    twin = ss.id_to_slot[tw]
    tied = np.array([twin])
    # (a strided view of a copy of the keys, made before the first read: the contiguous
    # copy has_equal_rows makes of it is zeroed too)
    strided = ss.X[np.concatenate([ss.margin_slots(), tied])][::-1]
    runs = {
        "reference": lambda: reference.tied_positive_definite(ss, tied),
        "compiled": lambda: compiled.tied_positive_definite(ss, tied),
        "compiled general": lambda: reference.tied_block_test(
            ss, tied, compiled.positive_definite),
        "has_equal_rows": lambda: has_equal_rows(strided),
    }
    needle = row.tobytes()
    row.fill(0)
    gc.collect()
    before = copies_in_process_memory(needle)
    assert before >= 1  # the stored key: the scan is not vacuous
    runs[call]()
    gc.collect()
    assert copies_in_process_memory(needle) == before
    strided.base.fill(0)


@pytest.fixture(scope="module")
def icu_rows() -> np.ndarray:
    return distinct_icu_rows(700)


def _outside(ss) -> np.ndarray:
    st = ss.state[: ss.hi]
    return np.flatnonzero((st == RESERVE) | (st == ERROR))


def test_a_gram_buffer_too_small_for_the_cache_is_not_read_as_zeros(icu_rows, whole_tests,
                                                                    monkeypatch):
    # the kept factor's test read K_SS (current_margin_gram) and only then asked for the
    # Gram buffer (gram_buffer), which replaces one smaller than the cache's columns by
    # zeros: the margin test then ran on zeros and the shift guard read K_SS's trace as 0,
    # so the factor "told" for more tied tokens than its shift covers. Simulated by a
    # cache grown while the inverse (and so the copy of K_SS) stays current.
    monkeypatch.setattr(compiled, "FACTOR_KEPT_FROM", 4)
    mem = SVDDMemory(1.0 / (0.05 * 600), gamma=0.1)
    mem.extend(icu_rows[:600])
    ss = mem.solver_state
    f = ss.pd_factor
    covered = int(round(f.shift / 1e-10 - np.trace(ss.current_margin_gram())))
    tied = _outside(ss)[: covered + 1]  # one more than the factor's shift covers
    ss.grow_cols()
    assert ss.current_margin_gram() is not None and ss.kss.shape[0] < ss.ccap
    got = compiled.tied_positive_definite(ss, tied)
    assert len(whole_tests) == 1  # the factor could not tell: the general test decided
    assert got == reference.tied_positive_definite(ss, tied)


def test_the_certificates_margin_test_reads_the_kept_buffer_not_a_view(icu_rows, monkeypatch):
    # a forget whose removal finds no facts of its own (a reserve token's) after an add
    # that changed the margin set: the certificate's pass brought the kept factor to the
    # margin set from a view of the kept K_SS (margin_gram: kss[:nS, :nS], layout "A"),
    # a signature of linalg.chol_update that compile_kernels never compiles: 1.5 s of
    # compiling, "svattn: compiling numba kernels ..." printed, inside the first such
    # forget of a process on a fresh machine. The other callers pass the buffer itself.
    mem = SVDDMemory(1.0 / (0.05 * 600), gamma=1.0)
    mem.extend(icu_rows[:600])
    assert mem.solver_state.nS >= compiled.FACTOR_KEPT_FROM
    seen: list[bool] = []
    test = compiled.margin_positive_definite

    def spy(ss, kss):
        seen.append(kss.flags.c_contiguous)
        return test(ss, kss)

    monkeypatch.setattr(compiled, "margin_positive_definite", spy)
    margin = set(mem.partition()["margin"])
    for row in icu_rows[600:]:
        mem.add(row)
        if set(mem.partition()["margin"]) != margin:
            break
    else:
        pytest.fail("no add changed the margin set")
    cert = mem.remove(mem.partition()["reserve"][0])
    assert seen and all(seen), seen
    assert cert.unique_optimum


def _fitted_kept(seed: int = 5) -> tuple[SVDDMemory, np.ndarray]:
    """A memory whose kept factor covers its margin set, and tokens outside it that the
    factor can tell for (taken as tied: the test's contract holds for any)."""
    mem = SVDDMemory(0.05)
    mem.extend(np.random.default_rng(seed).normal(size=(200, 3)))
    ss = mem.solver_state
    compiled.margin_positive_definite(ss, ss.gram_buffer())
    tied = _outside(ss)[:2]
    if ss.nS >= compiled.FACTOR_KEPT_FROM:
        assert compiled.tied_test.on_kept_factor(  # (the append succeeds: it tells)
            ss, tied, compiled.margin_positive_definite, compiled.FACTOR_KEPT_FROM)
    return mem, tied


@pytest.mark.parametrize("where", ["append", "gram"])
@pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
def test_an_exception_mid_test_leaves_the_factor_bit_for_bit_and_zeroes_the_rows(
        monkeypatch, where, exc):
    monkeypatch.setattr(compiled, "FACTOR_KEPT_FROM", 4)
    mem, tied = _fitted_kept()
    ss = mem.solver_state
    f = ss.pd_factor
    L, n, ids, shift = f.L.copy(), f.n, f.ids.copy(), f.shift
    held: dict[str, np.ndarray] = {}
    append = compiled.linalg.chol_append_block

    def append_then_raise(L_, n_, B, D, s):  # (the rows written, then the interrupt)
        held["B"], held["D"] = B, D
        assert append(L_, n_, B, D, s)
        assert L_[n_:n_ + len(B)].any()
        raise exc

    def gram_raises(x, kernel, gamma):
        held["B"] = sys._getframe(1).f_locals["B"]  # (the rows read before the block)
        assert held["B"].any()
        raise exc

    if where == "append":
        monkeypatch.setattr(compiled.linalg, "chol_append_block", append_then_raise)
    else:
        monkeypatch.setattr(compiled.tied_test, "gram_matrix", gram_raises)
    with pytest.raises(exc):
        compiled.tied_positive_definite(ss, tied)
    assert ss.pd_factor is f and f.n == n and f.shift == shift and np.array_equal(f.ids, ids)
    assert np.array_equal(f.L, L) and not f.L[n:].any()
    assert held and not any(a.any() for a in held.values())  # kernel values zeroed


def test_an_interrupt_in_a_forgets_tie_test_rolls_back_and_the_next_forget_certifies(
        monkeypatch):
    monkeypatch.setattr(compiled, "FACTOR_KEPT_FROM", 4)
    mem, row, tw, victim = _tied_beside("compiled", 5)
    ss = mem.solver_state
    digest, sizes = mem.state_digest(), {k: len(v) for k, v in mem.partition().items()}
    append = compiled.linalg.chol_append_block
    calls = []

    def append_then_interrupt(L_, n_, B, D, s):
        calls.append(1)
        append(L_, n_, B, D, s)
        raise KeyboardInterrupt

    monkeypatch.setattr(compiled.linalg, "chol_append_block", append_then_interrupt)
    with pytest.raises(KeyboardInterrupt):
        mem.remove(victim)
    assert calls  # (the interrupt came from the tie test's append)
    assert mem.state_digest() == digest
    assert {k: len(v) for k, v in mem.partition().items()} == sizes
    f = ss.pd_factor
    assert f is None or not f.L[f.n:].any()
    monkeypatch.setattr(compiled.linalg, "chol_append_block", append)
    cert = mem.remove(victim)
    assert cert.unique_optimum is False  # the near-copy tied: singular, as before
    twin = SVDDMemory(0.05)
    rng = np.random.default_rng(5)
    twin.extend(rng.normal(size=(200, 3)))
    twin.add(row)
    assert twin.remove(victim).unique_optimum is False


@pytest.mark.parametrize("seed", range(6))
def test_has_equal_rows_gives_np_uniques_verdict(seed):
    # the copy test before the backend's (solver.unique_optimum) now sorts its own copy
    # to zero it: the same verdict as the np.unique count it replaced, bitwise (-0.0 is
    # not 0.0; a near-copy is not a copy)
    from svattn.exact.core.kernels import has_equal_rows

    rng = np.random.default_rng(seed)
    x = rng.normal(size=(40, 3)).round(1 if seed % 2 else 6)
    cases = [x, x[:1], x[:0], np.vstack([x, x[7]]), np.vstack([x, x[7] + 1e-15]),
             np.array([[0.0, 1.0], [-0.0, 1.0]]), np.array([[0.0, 1.0], [0.0, 1.0]]),
             np.vstack([x, x[3]])[:, ::-1], np.vstack([x, x[3]])[::2]]
    for rows in cases:
        c = np.ascontiguousarray(rows)
        void = c.view(np.dtype((np.void, c.dtype.itemsize * max(c.shape[1], 1)))).ravel()
        assert has_equal_rows(rows) == (len(np.unique(void)) < len(void))


@pytest.mark.parametrize("kept_from", [4, 10**6], ids=["kept-factor", "general"])
def test_duplicated_or_unsorted_tied_slots_get_the_references_verdict(monkeypatch, kept_from):
    monkeypatch.setattr(compiled, "FACTOR_KEPT_FROM", kept_from)
    mem, _ = _fitted_kept()
    ss = mem.solver_state
    out = _outside(ss)
    for tied in (out[[5, 2, 9]], out[[5, 5]], out[[3, 1, 3, 2]], out[::-1][:6]):
        assert compiled.tied_positive_definite(ss, tied) == reference.tied_positive_definite(
            ss, tied)
    assert not compiled.tied_positive_definite(ss, out[[5, 5]])  # (a repeated row: singular)
