"""Attacks on the merged exact core (error sum, spare inverse buffer, copies split by
their own g): failures injected while the spare holds memory, and states the oracle
judges after removals next to near-copies and tiny n near 1/C."""

from __future__ import annotations

import numpy as np
import pytest

from exact_helpers import check_scratch_between_operations
from fault_injection import Injected, assert_same, install_faults, snapshot
from svattn.exact import OperationError, SVDDMemory
from svattn.exact.auditor.crosscheck import oracle_comparison


@pytest.fixture
def faults(monkeypatch):
    return install_faults(monkeypatch)


def _margin_memory(backend: str) -> SVDDMemory:
    rng = np.random.default_rng(5)
    mem = SVDDMemory(C=0.01, kernel="rbf", gamma=0.3, backend=backend)
    mem.extend(rng.normal(size=(400, 3)))  # a batch fit: a plain inverse, spare-able
    return mem


@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_a_failed_removal_while_the_spare_inverse_is_kept_leaves_the_state_unchanged(
        faults, backend):
    """A margin removal leaves the replaced inverse's memory as the spare; each call the
    next margin removal makes fails once: the state is as before bit for bit, the
    scratch (spare zeros, work copies) as between operations, and the removal then
    succeeds with the twin's result (to rounding)."""
    mem, twin = _margin_memory(backend), _margin_memory(backend)
    for m in (mem, twin):
        m.remove(m.partition()["margin"][0])
    if backend == "compiled":
        assert mem.solver_state.qspare.size > 0  # the spare is in use
    target = mem.partition()["margin"][1]
    faults.fail_at, faults.calls = -1, 0
    twin.remove(target)
    total = faults.calls
    assert total > 0
    for k in range(1, total + 1):
        before = snapshot(mem, None)
        faults.calls, faults.fail_at = 0, k
        with pytest.raises((OperationError, Injected)):
            mem.remove(target)
        faults.fail_at = -1
        assert_same(before, snapshot(mem, None))
        if backend == "compiled":
            check_scratch_between_operations(mem.solver_state)
    mem.remove(target)
    assert mem.ids == twin.ids
    # (the rollback drops the spare and the kept work copies: the retry takes the path
    # without them, equal to rounding)
    np.testing.assert_allclose(mem.alpha, twin.alpha, rtol=0, atol=1e-12)
    assert mem.kkt_residual() <= mem.tol


# Three keys within 2e-5 of one another (the second and third 2.8e-9 apart), under a
# kernel so wide that their entries of K are 1 to 2e-12, and a fourth key far off, at
# C = 1/2: n = 3 after its removal, just above 1/C (seed 29 of the attack's streams).
_NEAR = np.array([
    [0.04990183858478544, -0.16519111041084442, -0.16795575864588652, 0.06262893624184683],
    [0.04992039928527854, -0.1651901628539922, -0.16796938955978896, 0.06261587982547288],
    [0.04992040152334534, -0.16519016568439276, -0.16796939015046086, 0.06261587751175876],
    [-1.2626722080098831, 1.079539146589146, -0.8404778884413265, 0.20007064978275851],
])


@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_a_removal_down_to_n_just_above_one_over_c_among_near_copies_ends_at_the_oracles_optimum(
        backend):
    """The removal's drive meets the near-copy (kernel distance 3.5e-12) of a margin
    token and hands over to the Gram re-solve, whose active-set finish stopped at the
    vertex (0, C, C): every multiplier under its tol (8.8e-13 against 1e-12), yet 8.8e-13
    below the optimum's dual objective (mpmath on the exact kernel), ~4,000 times what
    rounding allows. The finish now goes on to rounding (``batch.rounding_floor``): key 0
    at C, the copies' sum C; the oracle's split (0.49997, 0.25004, 0.24999) is the same
    optimum to rounding (the copies' sum 3.2e-5 apart, allowed 1.9e-4 by
    ``group_sum_sensitivity``; objectives 2e-16 apart)."""
    mem = SVDDMemory(C=0.5, kernel="rbf", gamma=0.0025, backend=backend)
    ids = mem.extend(_NEAR)
    mem.remove(ids[3])
    assert mem.kkt_residual() <= 1e-14  # rounding, not tol (8.8e-13 before)
    assert mem.alpha[0] == 0.5
    oc = oracle_comparison(mem, probes=None, tol=1e-9, seed=0, unique=mem.unique_optimum())
    assert not oc.reasons, oc.reasons


# Twelve keys, the fifth and the last 6.7e-9 apart (their kernel entry rounds to 1, a
# copy by the kernel's test, but their rows of K differ by up to 6e-11), gamma =
# 0.0025, C = 1/3.3 (seed 291 of the attack's streams, the state a forget left; a fit
# of the same keys ends in the same state).
_TWELVE = np.array([
    [-1.2286717840582266, -0.37639184626039934], [1.6038129723913135, 0.16156787073180184],
    [-0.503324075501633, -1.011813588024564], [-0.04709567652523921, 0.04257212004202042],
    [0.06492053229756492, 1.1739979450178284], [0.3182827488087948, -0.7509600181192388],
    [-0.9206114507697798, 0.7389293750110989], [-0.27715191386052423, -0.12406926907101014],
    [-0.8856647172925276, 0.6532147232596168], [-0.5896332712981803, 0.02531300575596119],
    [1.8282991111386353, -3.3280217396611214], [0.06492053903925715, 1.1739979472867588],
])


@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_a_fit_beside_near_copies_whose_kernel_entry_rounds_to_one_passes_the_cross_check(
        backend):
    """The last add drives in the copy (kernel entry 1, rows 6e-11 apart) of the fifth
    key, which sat at C; the drive lets no copy of the driven token enter, so the fifth
    key's own g crossed 0 first and it stayed at C with a multiplier of the wrong sign
    (KKT 5.2e-12, under tol; 4.9e-12 below the optimum's dual objective). The add now
    re-splits the driven token's group by own g (``copies.split_group_of``): the last
    key at C and the fifth on the margin, as the oracle has them, to rounding."""
    mem = SVDDMemory(C=1 / 3.3, kernel="rbf", gamma=0.0025, backend=backend)
    mem.extend(_TWELVE)
    assert mem.kkt_residual() <= 1e-14  # rounding, not tol (5.2e-12 before)
    assert mem.alpha[11] == mem.C and 0.0 < mem.alpha[4] < mem.C
    oc = oracle_comparison(mem, probes=None, tol=1e-9, seed=0, unique=mem.unique_optimum())
    assert oc.decision_dev <= 1e-12 and oc.max_alpha_dev <= 1e-12
    assert not oc.reasons, oc.reasons


# Eleven keys (two exact copies, near-copies 1e-7 to 1e-6 apart), gamma = 1/600, C = 1/5
# (seed 388 of the attack's streams): the optimum is unique and holds a token at a tie,
# alpha = C and g at the margin; the memory calls it an error token, the oracle's polish
# returns alpha = C - 8e-17 (a margin token).
_ELEVEN = np.array([
    [-0.9458828578697506, 0.46235225153649795, -0.5030094057655624],
    [-0.9458828578697506, 0.46235225153649795, -0.5030094057655624],
    [-0.5016386661282591, 0.6353693786594669, -0.14832909980344866],
    [-0.945882951852244, 0.4623527139807304, -0.5030101628589015],
    [-0.9458828336123611, 0.4623522756662129, -0.5030093769931887],
    [0.5817297005875097, 0.1171407686010115, -0.40522076754957576],
    [1.378367349692071, -1.1273397169792305, -0.562859994589789],
    [1.4241933577205297, 2.2712564729611504, -0.35887242895036575],
    [0.5817293613698492, 0.1171424214907842, -0.40522661571802526],
    [0.37671621409393663, -0.8930019426425657, -0.7241105154865255],
    [-0.9221236064986403, 1.1010794654190716, -0.332450475757209],
])


@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_the_cross_check_reads_a_token_at_a_bound_to_rounding_as_the_same_partition(backend):
    """A token the oracle returns a few ulps inside its bound, where the memory holds it
    at the bound, is the same token at the same optimum: the cross-check (and so
    ``verify_deletion(oracle=True)``) does not reject the state for it."""
    mem = SVDDMemory(C=0.2, kernel="rbf", gamma=1 / 600, backend=backend)
    mem.extend(_ELEVEN)
    assert mem.unique_optimum() and mem.kkt_residual() <= mem.tol
    oc = oracle_comparison(mem, probes=None, tol=1e-9, seed=0, unique=True)
    assert oc.max_alpha_dev <= 1e-15
    assert oc.partition_equal and not oc.reasons, oc.reasons


def _rows_with_copies(seed: int, n: int, d: int) -> np.ndarray:
    """Normal rows where about 12 % repeat an earlier row and 18 % sit 1e-9..1e-4 from
    one (the attack's streams)."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=(n, d))
    out = [base[0]]
    for i in range(1, n):
        r = rng.random()
        if r < 0.12:
            out.append(out[rng.integers(len(out))].copy())
        elif r < 0.3:
            eps = 10 ** rng.uniform(-9, -4)
            out.append(out[rng.integers(len(out))] + eps * rng.normal(size=d))
        else:
            out.append(base[i])
    return np.array(out)


@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_a_fit_whose_split_copies_reach_the_margin_after_the_finish_keeps_their_columns(
        backend):
    """A fit of 158 rows with copies and near-copies (gamma = 0.01, C = 1/8): the split
    by own g put four copies on the margin whose kernel columns the finish never
    computed; their positions (-1) made the fit fail (``could not broadcast``; the path
    that writes columns instead would read the buffer's last row). The fit ends at the
    oracle's optimum with every cached column the kernel's."""
    from svattn.exact.core.kernels import kernel_matrix

    X = _rows_with_copies(5, 400, 3)[:158]
    mem = SVDDMemory(C=1 / 8, kernel="rbf", gamma=0.01, backend=backend)
    mem.extend(X)
    assert mem.kkt_residual() <= mem.tol
    oc = oracle_comparison(mem, probes=None, tol=1e-9, seed=0, unique=mem.unique_optimum())
    assert oc.decision_dev <= 1e-9
    ss = mem.solver_state
    live = ss.live_slots()
    cols = np.flatnonzero(ss.slot_of_col[: ss.chi] >= 0)
    want = kernel_matrix(ss.X[live], ss.X[ss.slot_of_col[cols]], "rbf", 0.01)
    want[np.searchsorted(live, ss.slot_of_col[cols]), np.arange(len(cols))] = 1.0
    np.testing.assert_allclose(ss.KC[np.ix_(live, cols)], want, rtol=0, atol=1e-15)
