"""The compiled (numba) backend of the exact solver: the default.

Same function names and contract as the numpy reference
(:mod:`svattn.exact.backends.reference`), each taking the
:class:`~svattn.exact.core.state.SlotState`; the loops run in the kernels of this
package (:mod:`.columns`, :mod:`.linalg`, :mod:`.checks`, :mod:`.events`,
:mod:`.segments`), compiled once and cached on disk. Floating-point results differ
from the reference only by summation order, so two events that tie to within
rounding may be taken as one or two; ``tests/exact/test_backends.py`` compares the
trajectories.

Beyond the reference, a removal goes segment by segment
(:func:`remove_by_segments`): on a fixed partition the solution path is a
straight line, so one margin solve and one pass over the margin block give a
segment's end and the exact g there; ties and an empty margin set go to the
event loop (:func:`drive`) from the state reached. The exact g reads the margin
columns plus a kept sum of the error tokens' columns (:func:`sync_error_sum`).
"""

from __future__ import annotations

import numpy as np
from scipy.linalg.lapack import dpotrf

from svattn.exact.backends import reference
from svattn.exact.backends.compiled import checks, codes, columns, events, linalg, reserve, segments
from svattn.exact.backends.compiled import tied as tied_test
from svattn.exact.core.cache import mu_move
from svattn.exact.core.gram import HOLE, KeptFactor, locate, padded_square
from svattn.exact.core.kktsets import FREE
from svattn.exact.core.outcome import CertificateFacts, HealthReading, RemovalOutcome
from svattn.exact.core.state import NeedResolve, SlotState, scrub

NAME = "compiled"


# A compiled step may divide by an exactly-zero pivot of the bordered inverse. In exact
# arithmetic a pivot Qinv[m, m] = 1 / schur is positive; it reaches 0 only when the kept
# inverse has lost all precision, as with exp-kernel diagonals spanning e^10 .. e^300 in
# one memory (numba raises ZeroDivisionError there). That is the degeneracy an
# incremental step hands to the exact batch re-solve, like a NEED_RESOLVE status, so the
# calls below turn it into NeedResolve (try/except: no cost on the hot path).


# ---------------------------------------------------------------- cache columns
def alloc_col(ss: SlotState, slot: int) -> int:
    """:func:`svattn.exact.backends.reference.alloc_col`, compiled (same column choice)."""
    if not columns.free_column_available(ss.slot_of_col, ss.state, ss.nS, ss.chi, ss.ccap):
        ss.grow_cols()
    ss.chi = int(columns.alloc_col(
        ss.KC, ss.XC, ss.ac, ss.slot_of_col, ss.col_of_slot, ss.X, ss.diag, ss.alpha,
        ss.state, slot, ss.nS, ss.chi, ss.hi, ss.gamma_value, ss.is_rbf))
    return int(ss.col_of_slot[slot])


def nearest_reserve(ss: SlotState, m: int) -> np.ndarray:
    """:func:`svattn.exact.backends.reference.nearest_reserve`, compiled."""
    out = np.empty(m, dtype=np.int64)
    return out[: checks.nearest_reserve(ss.g, ss.state, ss.hi, out)]


def refresh_standby(ss: SlotState) -> None:
    """:func:`svattn.exact.backends.reference.refresh_standby`, compiled (same hysteresis)."""
    ss.standby_stale = False
    while True:
        chi, theta, short = checks.refresh_standby(
            ss.KC, ss.XC, ss.ac, ss.slot_of_col, ss.col_of_slot, ss.X, ss.diag,
            ss.alpha, ss.g, ss.state, ss.nS, ss.chi, ss.hi, ss.gamma_value, ss.is_rbf,
            ss.standby)
        ss.chi, ss.standby_theta = int(chi), float(theta)
        if not short:
            return
        ss.grow_cols()


def wipe_slot_arrays(ss: SlotState, slot: int) -> int:
    """:func:`svattn.exact.backends.reference.wipe_slot_arrays`, compiled."""
    chi, change = checks.wipe_slot_arrays(
        ss.X, ss.V, ss.KC, ss.XC, ss.ac, ss.slot_of_col, ss.col_of_slot, ss.xn2, ss.diag,
        ss.alpha, ss.g, ss.esum, ss.esum_member, ss.state, slot, ss.chi, ss.hi, ss.esum_valid)
    ss.chi = int(chi)
    return int(change)


# ------------------------------------------------------------ bordered system
def contract(ss: SlotState, p: int) -> None:
    """:func:`svattn.exact.backends.reference.contract`, compiled."""
    try:
        nS, ss.Qinv = linalg.contract_margin(ss.Qinv, ss.KC, ss.XC, ss.ac, ss.slot_of_col,
                                             ss.col_of_slot, p, ss.nS, ss.hi)
    except ZeroDivisionError as exc:  # a lost pivot (see the note above)
        raise NeedResolve from exc
    ss.nS = int(nS)


def solve_margin(ss: SlotState) -> int | None:
    """:func:`svattn.exact.backends.reference.solve_margin`, compiled: also counts the margin
    coefficients on a bound and keeps ``K_SS`` for the checks after it."""
    if not ss.nS:
        return reference.solve_margin(ss)
    sync_error_sum(ss)
    mu, at_bound = linalg.solve_margin(
        ss.KC, ss.Qinv, ss.slot_of_col, ss.col_of_slot, ss.state, ss.diag, ss.alpha, ss.ac,
        ss.esum, ss.nS, ss.chi, ss.C, ss.gram_buffer())
    ss.kept_margin_gram(ss.nS)
    ss.mu = float(mu)
    return int(at_bound)


def ready_for_removals(ss: SlotState) -> None:
    """After a batch solve (a fit), an unpickle or a load, what the first removal would
    otherwise build and every later one keeps: ``K_SS`` gathered into the kept buffer,
    the uniqueness test's factor (:func:`margin_positive_definite`: one LAPACK
    factorization, O(|S|³)) and the spare buffer the removal's inverse is written into
    (:data:`SPARE_ROOM`). The first forget after a fit was 1.5-3.9× a
    settled one for these (#51); the fit pays them once."""
    nS = ss.nS
    if ss.warm or not nS:
        return
    m = nS + 2 + SPARE_ROOM
    if ss.qspare.size < m * m:  # the spare the first removal writes its inverse into,
        ss.qspare = np.zeros(m * m)  # faulted in here (zeroed by the fill: its pages
        ss.qspare.fill(0.0)  # are written now, not by the removal)
    if nS < FACTOR_KEPT_FROM:
        return
    kss = ss.current_margin_gram()
    if kss is None:
        kss = ss.gram_buffer()
        linalg.gather_margin_gram_into(ss.KC, ss.slot_of_col, nS, kss)
        ss.kept_margin_gram(nS)
    margin_positive_definite(ss, ss.gram_buffer())
    # and the kernels a removal calls from Python that the fit did not: a cached kernel's
    # first call in a process loads it (milliseconds: the after-operation trim and the
    # tie test made the first forget at 4,000 ICU rows 2.2-2.8× a settled one)
    f = ss.pd_factor
    if f is not None:
        linalg.chol_holes(f.L, _NO_ROWS, f.n)  # (no rows: nothing changes)
        linalg.chol_append_block(f.L, f.n, _NO_APPENDS, _NO_BLOCK, f.shift)  # (tie test)
    checks.tied_slots(ss.g, ss.state, 0, 0.0)  # (no slots: nothing read)


def margin_gram(ss: SlotState) -> np.ndarray:
    """``K_SS``: the last margin solve's copy when current, else a gather."""
    kss = ss.current_margin_gram()
    if kss is not None:
        return kss
    return linalg.gather_margin_gram(ss.KC, ss.slot_of_col, ss.nS)


def margin_health(ss: SlotState, KSS: np.ndarray) -> tuple[float, float]:
    """:func:`svattn.exact.backends.reference.margin_health`, compiled."""
    cond, res = linalg.bordered_health(ss.Qinv, KSS, ss.nS)
    return float(cond), float(res)


# ------------------------------------------------------------------- checks
def sync_error_sum(ss: SlotState) -> None:
    """Bring the error-column sum up to the current error set (one column added or
    subtracted per change, computed afresh for a token that keeps none); rebuilt from
    scratch only where it is not valid (a new solution)."""
    _error_sum_synced(ss, checks.error_sum_sync(
        ss.esum, ss.esum_member, ss.KC, ss.slot_of_col, ss.col_of_slot, ss.state, ss.X,
        ss.diag, ss.nS, ss.chi, ss.hi, ss.gamma_value if ss.dim is not None else 1.0,
        ss.is_rbf, ss.error_sum_rebuild_due))


def settle_error_columns(ss: SlotState) -> None:
    """End an operation with the state's between-operations shape: the error sum
    synced to the error set, no error token holding a cache column, and the cache's
    used columns without holes (shrunk where it is mostly empty,
    :meth:`~svattn.exact.core.state.SlotState.shrink_cols`)."""
    if ss.dim is None:
        return
    if ss.warm or ss.n == 0:
        return
    sync_error_sum(ss)
    chi = checks.fold_error_columns(ss.KC, ss.XC, ss.ac, ss.slot_of_col, ss.col_of_slot,
                                    ss.state, ss.esum_member, ss.nS, ss.chi)
    ss.chi = int(checks.compact_columns(ss.KC, ss.XC, ss.ac, ss.slot_of_col, ss.col_of_slot,
                                        ss.nS, int(chi), ss.hi))
    ss.shrink_cols()


def _error_sum_synced(ss: SlotState, n: int) -> None:
    """Count a sync's column updates (``n``; -1: rebuilt from scratch)."""
    ss.esum_valid = True
    ss.esum_updates = 0 if n < 0 else ss.esum_updates + int(n)


def g_exact(ss: SlotState) -> np.ndarray:
    """:func:`svattn.exact.backends.reference.g_exact` from the margin columns and the error sum."""
    sync_error_sum(ss)
    g = np.empty(ss.hi)
    checks.g_from_error_sum(ss.KC, ss.ac, ss.slot_of_col, ss.state, ss.esum, ss.diag, ss.mu,
                            ss.C, ss.nS, ss.chi, ss.hi, g)
    g[ss.state[: ss.hi] == FREE] = 0.0  # (a freed row is never read: both backends give 0)
    return g


def kkt(ss: SlotState, g: np.ndarray) -> float:
    """:func:`svattn.exact.backends.reference.kkt`, compiled (same definition, one pass)."""
    return float(checks.kkt_residual(g, ss.alpha, ss.state, ss.diag, ss.mu, ss.C, ss.hi))


def tied_slots(ss: SlotState, g: np.ndarray, tie: float) -> np.ndarray:
    """:func:`svattn.exact.backends.reference.tied_slots`, compiled."""
    return checks.tied_slots(g, ss.state, ss.hi, tie)


# From this many rows the general uniqueness test factors by LAPACK's blocked dpotrf
# (the reference's own factorization), below by the compiled loop (µs, no copy).
PD_LAPACK_FROM = 128


def positive_definite(K: np.ndarray, rel_shift: float) -> bool:
    """:func:`svattn.exact.backends.reference.positive_definite`, compiled: a Cholesky loop
    below :data:`PD_LAPACK_FROM` rows, LAPACK's ``dpotrf`` from there (the test of the
    margin and tied tokens a removal beside near-copies asks for: 0.2-0.7 s by the loop
    at 1,160 rows, the largest part of the first forget after a fit on the ICU vitals)."""
    n = K.shape[0]
    if n < PD_LAPACK_FROM:
        return bool(linalg.positive_definite(K, rel_shift))
    shift = rel_shift * float(np.trace(K))
    A = np.empty((n, n), order="F")  # (scrubbed: kernel values stay only in the cache)
    try:
        np.add(K, K.T, out=A)
        A *= 0.5
        A.flat[:: n + 1] -= shift
        c, info = dpotrf(A, lower=1, clean=0, overwrite_a=1)
        ok = info == 0 and bool(np.isfinite(np.diagonal(c)).all())
        if c is not A:
            c.fill(0.0)
        return ok
    finally:
        A.fill(0.0)


def tied_positive_definite(ss: SlotState, tied: np.ndarray) -> bool:
    """:func:`svattn.exact.backends.reference.tied_positive_definite`, compiled: the kept
    factor's verdict where it gives one, else the general test (:mod:`.tied`)."""
    return tied_test.tied_positive_definite(ss, tied, margin_positive_definite,
                                            positive_definite, FACTOR_KEPT_FROM)


def count_states(ss: SlotState) -> tuple[int, int, int]:
    """:func:`svattn.exact.backends.reference.count_states`, compiled."""
    nm, ne, nr = checks.count_states(ss.state, ss.hi)
    return int(nm), int(ne), int(nr)


def support_slots_by_id(ss: SlotState) -> np.ndarray:
    """:func:`svattn.exact.backends.reference.support_slots_by_id`, compiled (not among
    the kernels :func:`svattn.exact.compile_kernels.compile_all` compiles)."""
    if ss.warm:
        return reference.support_slots_by_id(ss)
    return checks.support_slots_by_id(ss.alpha, ss.slot_id, ss.hi)


def certificate_facts(ss: SlotState, g: np.ndarray, tie: float
                      ) -> tuple[int, int, int, int, np.ndarray, np.ndarray]:
    """:func:`svattn.exact.backends.reference.certificate_facts` in one compiled pass, with the
    uniqueness test on the margin block when no token is tied: from
    ``FACTOR_KEPT_FROM`` margin tokens on by the kept factor
    (:func:`margin_positive_definite`, O(|S|²) per operation), as the removal's own
    final pass does, instead of a factor of the whole block (O(|S|³): 16 ms at 764
    margin tokens, a third of a removal there)."""
    kept = ss.nS >= FACTOR_KEPT_FROM
    # told of 0 margin tokens the compiled pass skips its own test and reads no K_SS
    # (1: none tied, -1: some tied, the caller's general check)
    nm, ne, nr, unique, ids, values = checks.certificate_facts(
        g, ss.alpha, ss.state, ss.slot_id, ss.kss[:0, :0] if kept else margin_gram(ss),
        0 if kept else ss.nS, ss.hi, tie, 1e-10, ss.mu)
    if kept and unique == 1 and not factor_covers_margin(ss):
        # the kept buffer itself when current (C-ordered: the type compile_kernels compiles
        # the factor's update for; a view of its block compiled another at first use, 1.5
        # s in a removal), else a gathered copy, zeroed after (kernel values: the cache's)
        current = ss.current_margin_gram() is not None
        kss = ss.kss if current else margin_gram(ss)
        try:
            unique = int(margin_positive_definite(ss, kss))
        finally:
            if not current:
                kss.fill(0.0)
    return int(nm), int(ne), int(nr), int(unique), ids, values


def factor_covers_margin(ss: SlotState) -> bool:
    """True when the kept factor is one of exactly the margin tokens now, with a shift
    still at least the test's (``1e-10 · trace K_SS``, the trace being the margin
    tokens' diagonals): the margin Gram block is the one it factored, so the test
    passes without reading the block (a reserve token's removal leaves the margin set
    as it was; :func:`margin_positive_definite` would make no update)."""
    f = ss.pd_factor
    nS = ss.nS
    if f is None or f.size != nS or f.updates >= FACTOR_REFRESH:
        return False
    if f.shift < 1e-10 * float(ss.diag[ss.slot_of_col[:nS]].sum()):
        return False
    return f.within(ss.margin_ids())  # its n distinct tokens all margin: the same set


# -------------------------------------------------------------------- drives
def drive(ss: SlotState, c: int, direction: int, seed: np.ndarray | None = None) -> int:
    """Move alpha_c up (+1, until g_c = 0 or alpha_c = C) or down to 0 (−1) with the
    compiled event loop; ``seed`` continues a removal that :func:`remove_by_segments`
    began. Returns the events taken."""
    ss.g_valid = False
    hi = ss.hi
    k_c, sgn = np.empty(hi), np.empty(hi)  # filled by the first call
    loop = np.zeros(codes.LOOP_SLOTS, dtype=np.int64)
    loop[codes.LAST_LEFT] = loop[codes.LAST_ENTERED] = -1
    done = 0
    if seed is not None:
        done = int(seed[codes.SEG_EVENTS])
        loop[codes.LAST_LEFT] = seed[codes.SEG_LAST_LEFT]
        loop[codes.LAST_ENTERED] = seed[codes.SEG_LAST_ENTERED]
    try:
        return _drive_loop(ss, c, direction, k_c, sgn, loop, done)
    finally:  # a removed token's kernel column must not stay in freed memory
        scrub(k_c)


def _drive_loop(ss: SlotState, c: int, direction: int, k_c: np.ndarray, sgn: np.ndarray,
                loop: np.ndarray, done: int) -> int:
    """:func:`drive`'s calls into the compiled event loop, until the drive ends."""
    max_events = 20 * ss.n + 200
    scale, gamma = ss.scale, ss.gamma_value
    while True:
        try:
            status, nS, chi, mu, Qinv = events.drive_events(
                ss.KC, ss.XC, ss.ac, ss.slot_of_col, ss.col_of_slot, ss.X, ss.diag,
                ss.alpha, ss.g, ss.state, ss.Qinv, ss.nS, ss.chi, ss.hi, ss.mu, ss.C, gamma,
                ss.is_rbf, c, direction, k_c, sgn, loop, max_events, scale)
        except ZeroDivisionError as exc:  # a lost pivot (see the note above)
            raise NeedResolve from exc
        ss.nS, ss.chi, ss.mu, ss.Qinv = int(nS), int(chi), float(mu), Qinv
        ss.ill_border |= bool(loop[codes.ILL_BORDER])
        if status == codes.DONE:
            return done + int(loop[codes.EVENTS])
        if status == codes.NEED_RESOLVE:
            raise NeedResolve
        if status == codes.NEED_COLUMNS:
            ss.grow_cols()
            continue
        # EMPTY_MARGIN: only mu moves (rare; the numpy step is fine)
        with np.errstate(divide="ignore", invalid="ignore"):
            finished, who = mu_move(ss, c, direction, alloc_col)
        if finished:
            return done + int(loop[codes.EVENTS])
        sgn[who] = 0.0
        loop[codes.LAST_ENTERED] = who


def remove_by_segments(ss: SlotState, c: int, *, contract_first: bool) -> RemovalOutcome:
    """Remove driven token ``c`` segment by segment (one pass over the margin block
    each, the last one giving the exact g); with ``contract_first``, ``c`` is a margin
    token that leaves the margin set first.

    Returns a :class:`~svattn.exact.core.outcome.RemovalOutcome` with its ``status``:

    * ``"done"``: ``c``'s arrays are wiped and the KKT check passed; the outcome
      holds the events taken, the residual, the certificate's facts and the health
      of the inverse left;
    * ``"finish"``: wiped, but the residual needs the general finish (``events``);
    * ``"fallback"``: the event loop must go on from the state reached; ``seed`` is
      its seed (segments taken, the tokens that last left and entered the margin).

    Raises :class:`~svattn.exact.core.state.NeedResolve` on a degeneracy.
    """
    ss.g_valid = False
    hi = ss.hi
    g_end = np.empty(hi)
    out = np.zeros(codes.SEG_OUT, dtype=np.int64)
    out[codes.SEG_LAST_LEFT] = out[codes.SEG_LAST_ENTERED] = -1
    facts = np.zeros(3)
    sup_ids = np.empty(hi, dtype=np.int64)  # (error tokens hold no column: by slot)
    sup_values = np.empty(hi + 1)
    kss = ss.gram_buffer()
    kept = ss.current_margin_gram() is not None  # K_SS as the last operation left it
    qb, _ = ss.bordered_buffer()  # zeros: the compiled call zeroes what it used
    m = ss.nS + 2  # (room for one more margin token than now)
    if ss.nS and ss.qspare.size < m * m:  # a spare with room to grow (see SPARE_ROOM)
        ss.qspare = np.zeros((m + SPARE_ROOM) ** 2)
    # the inverse may be written over the old one (segments.remove_segments): its memory
    qflat = inverse_memory(ss.Qinv)
    # counted before the call, taken back below where the kernel did not write over it:
    # an exception it raises after the write, or an interrupt Python delivers as it
    # returns, must find the count moved (a restore then recomputes the inverse; one
    # counted in vain only costs the restore that recomputation)
    counted, before = qflat.size > 0, ss.inverse_overwrites
    ss.inverse_overwrites += counted
    # the error sum is synced first, without c: its share of the end state is 0
    try:
        status, nS, chi, mu, Qinv, where = segments.remove_segments(
            ss.KC, ss.XC, ss.ac, ss.slot_of_col, ss.col_of_slot, ss.X, ss.V, ss.xn2, ss.diag,
            ss.alpha, ss.g, ss.state, ss.slot_id, ss.Qinv, ss.esum, ss.esum_member,
            ss.error_sum_rebuild_due, ss.nS, ss.chi, hi, ss.mu, ss.C, ss.gamma_value,
            ss.is_rbf, c, int(ss.col_of_slot[c]) if contract_first else -1, ss.max_segments,
            ss.max_jumps, ss.scale, g_end, out, facts, sup_ids, sup_values, kss,
            FACTOR_KEPT_FROM, qb, kept, ss.qspare, qflat)
    except ZeroDivisionError as exc:  # a lost pivot (see the note above)
        qb.fill(0.0)  # a work copy of the inverse held c's row and column
        ss.qspare.fill(0.0)  # (the inverse may have been written into it, or over the
        qflat.fill(0.0)  # old one and past it: the re-solve makes a new one, and a
        ss.inverse_overwrites = before + 1  # restore recomputes it: counted either way)
        ss.qwork_for, ss.qwork_n = None, 0
        # K_SS may be part-updated, and past kss_ext where the kernel gathered the block
        # itself (the Gram copy not kept): zeroed whole now (kept, its block stayed
        # within kss_ext; gathered, it held the whole block, the removed token's kernel
        # values among them, which zeroing up to kss_ext after the operation left)
        kss.fill(0.0)
        ss.kss_for, ss.kss_ext = None, 0
        raise NeedResolve from exc
    ss.n_block_passes += int(out[codes.SEG_PASSES])
    jumped = int(out[codes.SEG_JUMPED])
    ss.n_jumps += jumped > 0
    ss.n_jump_fallbacks += jumped < 0
    m = int(nS) + 1
    if where == codes.WRITTEN_IN_PLACE:  # over the old inverse (counted): a view of it
        Qinv = qflat[: m * m].reshape(m, m)
    else:
        ss.inverse_overwrites -= counted  # (not written over)
    if where == codes.WRITTEN_IN_SPARE:  # into the spare's memory: a view of it
        Qinv, ss.qspare = ss.qspare[: m * m].reshape(m, m), _NO_SPARE
    ss.nS, ss.chi, ss.mu, ss.Qinv = int(nS), int(chi), float(mu), Qinv
    ss.qwork_for, ss.qwork_n = None, 0  # (the work copy is zeros again)
    ss.kss_ext = max(ss.kss_ext, int(out[codes.SEG_GRAM]))
    _error_sum_synced(ss, int(out[codes.SEG_SYNC]))
    ss.esum_updates += int(out[codes.SEG_ESUM_UPDATES])
    ss.ill_border |= bool(out[codes.SEG_ILL])
    # (g_end holds g values of live tokens; c's own entry was zeroed)
    if status == codes.NEED_RESOLVE:
        raise NeedResolve
    if status == codes.FALLBACK:
        ss.n_segment_fallbacks += 1
        return RemovalOutcome("fallback", int(out[codes.SEG_EVENTS]), seed=out)
    ss.g_valid = True  # g at the end of the last segment is the exact g
    ss.ops_since_exact_g = 0
    ss.kept_margin_gram(int(out[codes.SEG_GRAM]))  # the last segment solved the final margin set
    kkt_end = float(facts[codes.FACT_KKT])
    events_taken = int(out[codes.SEG_EVENTS])
    if kkt_end > 0.1 * ss.tol or ss.ill_border:  # (an ill border: the finish refactorizes)
        return RemovalOutcome("finish", events_taken)
    n = int(out[codes.SEG_SUPPORT])
    unique = int(out[codes.SEG_UNIQUE])
    if unique == -2:  # left to the kept factor
        unique = int(margin_positive_definite(ss, kss))
    sizes = {"margin": int(out[codes.SEG_MARGIN]), "error": int(out[codes.SEG_ERROR]),
             "reserve": int(out[codes.SEG_RESERVE])}
    return RemovalOutcome(
        "done", events_taken, kkt=kkt_end,
        facts=CertificateFacts(sizes, unique, sup_ids[:n], sup_values[: n + 1]),
        health=HealthReading(float(facts[codes.FACT_COND]), float(facts[codes.FACT_INV_RES])))


# --------------------------------------------------- the uniqueness test's factor
FACTOR_KEPT_FROM = 96  # margin sets this large keep their factor (a full test below is µs)
# Row updates after which the factor is computed whole again (O(|S|³): 180-320 ms at
# 2,468 margin tokens, where an update costs ~2 ms). Givens deletions and appended rows
# are backward stable: after 458 updates on the distinct ICU rows the kept factor
# reproduced its block to 3.3e-15 (max entry of LLᵀ − (K − shift·I)), against the
# margin of 2.5e-7 (1e-10 · trace) its doubled shift keeps
# (tests/exact/test_kept_factor.py holds 300+ updates to 1e-12).
FACTOR_REFRESH = 1024


def margin_positive_definite(ss: SlotState, kss: np.ndarray) -> bool:
    """Whether the symmetric part of ``K_SS`` (``kss[:nS, :nS]``, margin order) minus
    ``1e-10 · trace · I`` is positive definite — :func:`linalg.positive_definite`'s
    verdict — from the kept factor when it covers all but a few of the margin tokens
    (rows deleted and appended, O(|S|²) each), else from a factor computed whole and
    kept (``svattn.exact.core.gram`` says why the kept factor's larger shift makes its
    verdict sound)."""
    nS = ss.nS
    shift = 1e-10 * float(np.trace(kss[:nS, :nS]))
    ids = ss.margin_ids()
    f = ss.pd_factor
    if (f is not None and f.shift >= shift and f.updates < FACTOR_REFRESH
            and f.L.shape[1] >= nS):
        drops, fpos, news = _factor_plan(f.ids, ids)
        if len(drops) + len(news) <= max(2, nS // 32):
            if f.holes + len(drops) > MAX_HOLES or f.n + len(news) > f.L.shape[1]:
                drops, fpos, news = _close_holes(f, ids)
            # (closed, the rows deleted now still take room until the next closing: when
            # the appended rows would not fit the buffer, the factor is computed whole)
            fits = f.n + len(news) <= f.L.shape[1]
            n = int(linalg.chol_update(f.L, f.n, drops, fpos, news, kss, f.shift)) if fits else -1
            if n >= 0 and n - f.holes - len(drops) == nS:
                live = fpos[:n] >= 0
                f.ids = np.where(live, ids[np.maximum(fpos[:n], 0)], HOLE)
                f.n, f.holes = n, n - nS
                f.updates += len(drops) + len(news)
                f.seen = ids.copy()
                return True
    # the old factor's buffer, zeroed, takes the new one when it is large enough
    L = (f.L if f is not None and f.L.shape[1] >= ss.ccap
         else padded_square(ss.ccap, columns=True))
    if f is not None:  # (a failed update may have written its appended rows past n)
        ss.drop_factor(rows=min(f.L.shape[1], max(nS, f.n + max(2, nS // 32))))
    if factor_into(kss, nS, 2.0 * shift, L):
        ss.pd_factor = KeptFactor(L, nS, ids.copy(), 2.0 * shift, seen=ids.copy())
        return True
    L.fill(0.0)  # not positive definite with twice the shift: the test's own verdict
    block = np.ascontiguousarray(kss[:nS, :nS])
    try:
        return bool(linalg.positive_definite(block, 1e-10))
    finally:
        block.fill(0.0)  # kernel values stay only in the cache


def factor_into(K: np.ndarray, n: int, shift: float, L: np.ndarray) -> bool:
    """:func:`linalg.cholesky_into` by LAPACK's blocked ``dpotrf``: ``L[:n, :n]`` = the
    lower Cholesky factor of the symmetric part of ``K[:n, :n]`` minus ``shift · I`` (the
    upper triangle zero), False, ``L`` unwritten, when there is none (a pivot <= 0 or not
    a number). The same factor up to rounding (``tests/exact/test_kept_factor.py`` holds
    them to 1e-12 and the same verdicts); a whole factor is what the first removal after
    a fit computes (O(|S|³)), where LAPACK's blocks are several times the loop's speed."""
    A = np.empty((n, n), order="F")  # (scrubbed: kernel values stay only in the cache)
    try:
        np.add(K[:n, :n], K[:n, :n].T, out=A)
        A *= 0.5
        A.flat[:: n + 1] -= shift
        c, info = dpotrf(A, lower=1, clean=1, overwrite_a=1)
        ok = info == 0 and bool(np.isfinite(np.diagonal(c)).all())
        if ok:
            L[:n, :n] = c
        if c is not A:
            c.fill(0.0)
        return ok
    finally:
        A.fill(0.0)


def _factor_plan(fids: np.ndarray, ids: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """How the factor of tokens ``fids`` (by row; ``HOLE``: a hole) becomes one of the
    margin tokens ``ids``: the factor rows to make holes of (descending), each row's
    margin position (-1: a hole, old or new; then room for the appended), and the
    margin positions to append."""
    kept, where = locate(fids, ids)
    hole = fids == HOLE
    kept &= ~hole
    drops = np.flatnonzero(~kept & ~hole)[::-1].copy()
    n = len(fids)
    new = np.ones(len(ids), dtype=bool)
    new[where[kept]] = False
    news = np.flatnonzero(new)
    fpos = np.empty(n + len(news), dtype=np.int64)
    fpos[:n] = np.where(kept, where, -1)
    return drops, fpos, news


# Holes a kept factor may hold (deleted rows left in place, linalg.chol_hole) before
# they are closed all at once (linalg.chol_compact: one read and write of the factor,
# about one deletion's cost), or when the appended rows would not fit.
MAX_HOLES = 64


def trim_factor(f: KeptFactor, margin_ids: np.ndarray) -> bool:
    """After an operation, :meth:`KeptFactor.trim` (holes made by :func:`linalg.chol_holes`)
    and, past ``MAX_HOLES``, the holes closed (trims alone had left 25 holes with
    ``MAX_HOLES`` 2: ``tests/exact/test_attack_kept_factor_holes.py``)."""
    if not f.trim(margin_ids, linalg.chol_holes):
        return False
    if f.holes > MAX_HOLES:
        f.compact(linalg.chol_compact)
    return True


def _close_holes(f: KeptFactor, ids: np.ndarray
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Close the kept factor's holes (:meth:`KeptFactor.compact`) and plan its update to
    the margin tokens ``ids`` again."""
    f.compact(linalg.chol_compact)
    return _factor_plan(f.ids, ids)


_NO_SPARE = np.zeros(0)
_NO_ROWS = np.zeros(0, dtype=np.int64)
_NO_APPENDS, _NO_BLOCK = np.zeros((0, 0)), np.zeros((0, 0))


def inverse_memory(Q: np.ndarray) -> np.ndarray:
    """The whole row-major float64 buffer the inverse ``Q`` begins, flat: ``Q``'s own, or
    the one it is a view of the first floats of (a spare-made inverse, one written over
    an older one: the rest is room to grow into, zeros); an empty array where ``Q`` is
    not row-major at the start of such a buffer."""
    owner = Q.base if isinstance(Q.base, np.ndarray) else Q
    if not (Q.flags.c_contiguous and owner.flags.c_contiguous and owner.dtype == np.float64
            and owner.ctypes.data == Q.ctypes.data):
        return _NO_SPARE
    return owner.reshape(-1)


# The removal's inverse is written over the old one where it fits (segments.remove_segments),
# else into a spare buffer (``SlotState.qspare``: the
# replaced inverse's memory, kept zeroed between operations); where none is large
# enough, one with room for this many more margin tokens is made, so that the two
# buffers take turns and a fresh array (|S|² page faults: 2-4 passes over the margin
# block at 2,468 margin tokens) is rare.
SPARE_ROOM = 16


# ---------------------------------------------------------------- the streaming add
_NO_VALUE = np.zeros(0)  # the value of a memory whose values are its keys


def reserve_add(ss: SlotState, x: np.ndarray, v: np.ndarray | None, slot: int, tid: int) -> bool:
    """:func:`svattn.exact.backends.reference.reserve_add`, compiled: scoring, the decision and
    the slot's writes in one call (:mod:`.reserve`)."""
    row = np.empty((max(ss.chi, 1), 1))  # the kernel row (a column: the vectorized exp)
    status, valid = reserve.reserve_add(
        _plain(x), _NO_VALUE if v is None else _plain(v), ss.X,
        ss.V, ss.xn2, ss.diag, ss.alpha, ss.g, ss.state, ss.slot_id, ss.KC, ss.XC, ss.ac,
        ss.slot_of_col, ss.col_of_slot, ss.esum, ss.esum_member, slot, tid, ss.chi, ss.hi,
        ss.mu, ss.C, ss.gamma_value, ss.is_rbf, ss.esum_valid,
        ss.standby > 0 and ss.standby_stale,
        ss.standby_theta if ss.standby else -np.inf, row)
    row.fill(0.0)  # kernel values of the key: scrubbed like every temporary
    ss.esum_valid = bool(valid)
    return status == reserve.STORED


def _plain(a: np.ndarray) -> np.ndarray:
    """``a`` as the kernels' one array type: C-contiguous and writable (a read-only
    array, such as a caller's frozen keys, would compile another signature of each
    kernel at first use: a copy costs less)."""
    a = np.ascontiguousarray(a)
    return a if a.flags.writeable else a.copy()


def store_row(ss: SlotState, x: np.ndarray, v: np.ndarray | None, slot: int, tid: int,
              diag: float, row: np.ndarray, g: float) -> None:
    """:func:`svattn.exact.backends.reference.store_row`, compiled (:func:`.reserve.store_row`)."""
    col = _plain(row).reshape(-1, 1)
    ss.esum_valid = bool(reserve.store_row(
        _plain(x), _NO_VALUE if v is None else _plain(v), ss.X,
        ss.V, ss.xn2, ss.diag, ss.alpha, ss.g, ss.state, ss.slot_id, ss.KC, ss.slot_of_col,
        ss.col_of_slot, ss.esum, ss.esum_member, slot, tid, ss.chi, ss.hi, g, diag,
        ss.esum_valid, ss.gamma_value, ss.is_rbf, col))


_BLOCK_STATUS = {reserve.STORED: "stored", reserve.OUTSIDE: "outside",
                 reserve.OVERFLOW: "overflow"}


def reserve_block(ss: SlotState, k: np.ndarray, v: np.ndarray | None, slots: np.ndarray,
                  tids: np.ndarray) -> tuple[int, str, np.ndarray | None, float, float]:
    """:func:`svattn.exact.backends.reference.reserve_block`, compiled: the rows stored in one
    call (:func:`.reserve.reserve_block`)."""
    row = np.empty((max(ss.chi, 1), 1))
    try:
        stored, status, gx, kxx, valid = reserve.reserve_block(
            _plain(k), _empty_values(len(k)) if v is None else _plain(v), ss.X, ss.V,
            ss.xn2, ss.diag, ss.alpha, ss.g, ss.state, ss.slot_id, ss.KC, ss.XC, ss.ac,
            ss.slot_of_col, ss.col_of_slot, ss.esum, ss.esum_member, slots, tids, ss.chi,
            ss.hi, ss.mu, ss.C, ss.gamma_value, ss.is_rbf, ss.esum_valid, row)
        ss.esum_valid = bool(valid)
        name = _BLOCK_STATUS[int(status)]
        return (int(stored), name, row[: ss.chi, 0].copy() if name == "outside" else None,
                float(gx), float(kxx))
    finally:
        row.fill(0.0)  # kernel values of the keys: scrubbed like every temporary


def _empty_values(m: int) -> np.ndarray:
    """The value rows of keys whose values are the keys: (m, 0)."""
    return np.zeros((m, 0))


__all__ = ["NAME", "alloc_col", "certificate_facts", "contract", "count_states", "drive",
           "g_exact", "kkt", "margin_gram", "margin_health", "nearest_reserve",
           "positive_definite", "ready_for_removals", "refresh_standby", "remove_by_segments",
           "reserve_add", "reserve_block", "settle_error_columns", "solve_margin", "store_row",
           "support_slots_by_id", "tied_positive_definite", "tied_slots", "wipe_slot_arrays"]
