"""The exact solver's algorithm on a :class:`~svattn.exact.core.state.SlotState`, for either
backend.

Adds (:mod:`svattn.exact.operations.ingest` hands rows in) store every row that lands inside the
description as a reserve token; a row outside is driven in by the backend's event
loop (:func:`add_one`). Removals drive the token's coefficient to 0 (segment by
segment where the backend can). Each operation ends exactly (:func:`finish_op`):
polish on the partition, check the KKT residual, refactorize, and as the last
resort re-solve the token set in batch (:func:`resolve`). ``docs/design.md`` §1-3
has the math; ``be`` is :mod:`svattn.exact.backends.compiled` or
:mod:`svattn.exact.backends.reference`.
"""

from __future__ import annotations

import numpy as np

from svattn.exact.backends.protocol import Backend  # compiled or reference, held to it by a test
from svattn.exact.core.cache import (
    adopt_rows,
    free_col,
    ill_margin,
    outside_description,
    refactorize,
    take_rows,
    write_columns,
)
from svattn.exact.core.hashes import block_hashes
from svattn.exact.core.kernels import (
    WIDE_DIAGONAL,
    copy_groups,
    diagonal_log_span,
    get_kernel,
    gram_matrix,
    has_equal_rows,
    kernel_diag,
    wide_diagonal_advice,
)
from svattn.exact.core.kktsets import DRIVEN, ERROR, FREE, MARGIN, RESERVE
from svattn.exact.core.outcome import RemovalOutcome
from svattn.exact.core.state import DIGEST_MOD, NeedResolve, SlotState, scrub
from svattn.exact.operations.batch import BatchSolution, KernelColumns, batch_solve, libsvm_solve
from svattn.exact.operations.copies import (
    give_to_copies,
    near_span_violators,
    resplit_violating,
    split_by_own_g,
    spread,
)
from svattn.exact.operations.scoring import canonical_mu, esum_rows, score_rows


def forget_slot(ss: SlotState, slot: int) -> None:
    """The bookkeeping half of a wipe (the arrays are wiped already): the token
    leaves the id map, the set hash and the count; its slot becomes free."""
    ss.set_hash = (ss.set_hash - int(ss.token_hash[slot])) % DIGEST_MOD
    ss.token_hash[slot] = 0
    ss.row_hash[slot] = 0
    ss.tags[slot] = 0  # the token's data subject goes with it
    ss.commitments[slot], ss.commit_keyed[slot] = 0, 0
    del ss.id_to_slot[int(ss.slot_id[slot])]
    ss.slot_id[slot] = -1
    ss.free_slots.append(slot)
    ss.n -= 1


def wipe_slot(ss: SlotState, be: Backend, slot: int) -> None:
    """Forget a token: overwrite every array entry derived from it (its column
    leaves the error sum while it exists), then its bookkeeping."""
    change = be.wipe_slot_arrays(ss, slot)
    if change > 0:
        ss.esum_updates += 1
    elif change < 0:
        ss.esum_valid = False
    forget_slot(ss, slot)


def standby_upkeep(ss: SlotState, be: Backend, ids: list[int]) -> None:
    """After an add: refresh the standby columns when the solution moved or a new
    token lies nearer the boundary than the farthest standby token."""
    if not ss.standby or ss.warm or ss.n == 0:
        return
    if not ss.standby_stale:
        slots = np.fromiter((ss.id_to_slot[t] for t in ids), np.int64, len(ids))
        new = slots[ss.state[slots] == RESERVE]
        if not len(new) or ss.g[new].min() >= ss.standby_theta:
            return
    be.refresh_standby(ss)


def next_slots(ss: SlotState, count: int) -> np.ndarray:
    """The slots the next ``count`` stored rows take, in order (free slots last freed
    first, then fresh ones, the slot table grown to hold them); taken only by
    :func:`record_rows`."""
    free = ss.free_slots
    reuse = np.array(free[len(free) - min(count, len(free)):][::-1], dtype=np.int64)
    ss.grow_slots(ss.hi + count - len(reuse))
    return np.concatenate([reuse, np.arange(ss.hi, ss.hi + count - len(reuse),
                                            dtype=np.int64)])


def general_row(ss: SlotState, be: Backend, x: np.ndarray, v: np.ndarray | None,
                 diag: np.ndarray) -> list[int]:
    """Add one row (1, d) by the numpy scoring: stored if inside, else driven in."""
    rows, g = score_rows(ss, x, diag)
    try:
        if outside_description(ss, diag, g)[0]:
            return [add_one(ss, be, x[0], None if v is None else v[0], float(diag[0]),
                            row=rows[0], g_c=float(g[0]))]
        return store(ss, x, v, diag, rows, g)
    finally:
        scrub(rows)  # kernel values of the key: only the cache keeps them


def reserve_score(ss: SlotState, k: np.ndarray) -> tuple | None:
    """The score of one validated row (1, d) when adding it changes nothing but its own
    slot — it lands inside the description, in the reserve set, and no standby column
    needs refreshing — else None. Reads the state only. The general path's statement of
    the decision that :func:`svattn.exact.fastpath.store_reserve` takes in one backend
    call (``tests/exact/test_fastpath.py`` holds them equal); storing the row with
    :func:`store` is then the same add."""
    if ss.dim is None or ss.n + 1 <= ss.warmup_n:
        return None
    diag = kernel_diag(k, ss.kernel, ss.gamma_value)
    rows, g = score_rows(ss, k, diag)
    if outside_description(ss, diag, g)[0]:
        return None
    if ss.standby and (ss.standby_stale or float(g[0]) < ss.standby_theta):
        return None  # standby_upkeep would refresh the cached columns
    return diag, rows, g


def store(ss: SlotState, xs, vs, diag, rows, g) -> list[int]:
    """Store new tokens as reserve tokens with their kernel rows and g."""
    slots = next_slots(ss, len(xs))
    ss.X[slots] = xs
    ss.xn2[slots] = np.einsum("ij,ij->i", xs, xs)
    if vs is not None:
        ss.V[slots] = vs
    ss.diag[slots] = diag
    ss.alpha[slots] = 0.0
    ss.state[slots] = RESERVE
    chi = rows.shape[1]
    if chi:
        ss.KC[slots, :chi] = rows
    ss.g[slots] = g
    esum_rows(ss, slots, rows)
    tids = record_rows(ss, xs, vs, slots)
    ss.slot_id[slots] = tids
    return tids


def record_rows(ss: SlotState, xs, vs, slots: np.ndarray) -> list[int]:
    """The bookkeeping of rows just written into ``slots`` (from :func:`next_slots`):
    the slots are taken, the rows get the next ids, the id map, their token and row
    hashes, the set hash and the count. Returns the ids."""
    count = len(slots)
    free = ss.free_slots
    reuse = min(count, len(free))
    # the slots must be the ones next_slots hands out (two tokens in one slot else):
    # the free list's tail, reversed, then a range from hi (its ends checked)
    fresh = count - reuse
    if (free[len(free) - reuse:][::-1] != slots[:reuse].tolist()
            or fresh and (slots[reuse] != ss.hi or slots[-1] != ss.hi + fresh - 1)):
        raise RuntimeError("record_rows: slots other than next_slots' (an internal error)")
    del free[len(free) - reuse:]
    ss.hi += fresh
    tids = list(range(ss.next_id, ss.next_id + count))
    ss.next_id += count
    ths, rhs = block_hashes(tids, xs, vs)
    # one pass per array, not per token: the same writes, and the set-hash summands
    # added at once (a sum of residues mod 2^256 is the residue of their sum)
    ss.id_to_slot.update(zip(tids, slots.tolist(), strict=True))
    ss.token_hash[slots] = np.array(ths, dtype=object)
    ss.row_hash[slots] = rhs
    ss.set_hash = (ss.set_hash + sum(ths)) % DIGEST_MOD
    ss.n += count
    return tids


def add_one(ss: SlotState, be: Backend, x: np.ndarray, v: np.ndarray | None, diag: float, *,
             row: np.ndarray | None = None, g_c: float | None = None) -> int:
    """Add a token in warm-up (no ``row``), or one that :func:`add_rows` scored
    outside the description (``row``, ``g_c`` < 0): the solver drives it in."""
    ss.standby_stale = True  # the solution moves
    if row is not None:
        slots = next_slots(ss, 1)
        slot = int(slots[0])
        be.store_row(ss, x, v, slot, ss.next_id, diag, row, g_c)
        tid = record_rows(ss, x[None, :], None if v is None else v[None, :], slots)[0]
        ss.state[slot] = DRIVEN
        be.alloc_col(ss, slot)
        ss.ill_border = ill_margin(ss)  # (its downdates drift: judged on an exact g)
        try:
            be.drive(ss, slot, +1)
            finish_op(ss, be)
        except NeedResolve:
            resolve(ss, be)
        return tid
    tid = store(ss, x[None, :], None if v is None else v[None, :], np.array([diag]),
                      np.zeros((1, 0)), np.zeros(1))[0]
    if ss.n < ss.warmup_n:
        set_uniform(ss)
    else:
        resolve(ss, be, fallback=False)
    return tid


def remove_slot(ss: SlotState, be: Backend, slot: int) -> RemovalOutcome:
    """Remove the token in ``slot`` exactly; return what the removal found: the events
    taken (-1: re-solved), and the residual, certificate facts and health its own
    final pass found when it could (:class:`~svattn.exact.core.outcome.RemovalOutcome`)."""
    ss.standby_stale = True  # g moves: the nearest reserve tokens may change
    st = int(ss.state[slot])
    if ss.n - 1 < ss.warmup_n:
        drop_solution(ss)  # (first: a margin token's column goes with the margin set)
        wipe_slot(ss, be, slot)
        set_uniform(ss)
        return RemovalOutcome("warm-up")
    if st == RESERVE:
        wipe_slot(ss, be, slot)
        if not ss.nS:
            canonical_mu(ss, be)
        return RemovalOutcome("reserve")
    ss.ill_border = ill_margin(ss)
    try:
        if ss.col_of_slot[slot] < 0:  # an error token keeps no column: the drive needs it
            be.alloc_col(ss, slot)
        changed = give_to_copies(ss, be, slot)
        if changed is not None:  # its copies took its weight: nothing else moved
            wipe_slot(ss, be, slot)
            return RemovalOutcome("copies", changed, kkt=finish_op(ss, be, exact_g=True))
        ss.state[slot] = DRIVEN
        out = be.remove_by_segments(ss, slot, contract_first=st == MARGIN)
        if out.status == "fallback":  # the event loop takes it from here (or from the start)
            events = be.drive(ss, slot, -1, seed=out.seed)
            wipe_slot(ss, be, slot)
            return RemovalOutcome("fallback", events, kkt=finish_op(ss, be, exact_g=True))
        # c's arrays are wiped (it left the error sum first: g stays exact)
        forget_slot(ss, slot)
        if out.status == "finish" or ill_margin(ss) or (  # the general finish: polish,
                out.kkt is not None and resplit_violating(ss, be, out.kkt, ROUNDING_KKT)):
            # refactorize, re-solve (an ill border the path's own tests missed: refactorized)
            return RemovalOutcome("finish", out.events, kkt=finish_op(ss, be, exact_g=True))
        return out
    except NeedResolve:
        if ss.state[slot] != FREE:
            wipe_slot(ss, be, slot)
        resolve(ss, be)
        return RemovalOutcome("resolved", -1)


def unique_optimum(ss: SlotState, be: Backend) -> bool:
    """True when the optimum is unique: K is positive definite on the margin set together
    with every token tied at ``g = 0`` (duplicates break this)."""
    if ss.n == 0 or ss.warm:
        return True
    g = fresh_g(ss, be)
    tied = be.tied_slots(ss, g, 1e-9 * ss.scale)
    nS = ss.nS
    if len(tied) + nS <= 1:
        return True
    T = np.concatenate([ss.margin_slots(), tied])
    if len(tied):
        keys = ss.X[T]  # (a copy of live tokens' keys: zeroed, as they may be removed later)
        try:
            if has_equal_rows(keys):
                # K_T has two equal rows, so it is singular: the Cholesky test below would
                # say the same after O(|T|²·d) work (byte-level keys hold many copies)
                return False
        finally:
            scrub(keys)
        # (the backend's: the compiled one appends them to its kept factor)
        return be.tied_positive_definite(ss, tied)
    # the margin block of the cache is K_SS already; positive definite with smallest
    # eigenvalue above 1e-10 · the largest (<= trace): K_T − 1e-10·trace·I has a factor
    return be.positive_definite(ss.KC[T, :nS], 1e-10)


def fresh_g(ss: SlotState, be: Backend) -> np.ndarray:
    """g over used slots, recomputed from the cached columns unless the
    last operation already did so (each operation ends with an exact g)."""
    if not ss.g_valid:
        ss.g[: ss.hi] = be.g_exact(ss)
        ss.g_valid = True
    return ss.g[: ss.hi]


def set_sizes(ss: SlotState, be: Backend) -> dict[str, int]:
    """Sizes of the margin, error and reserve sets (warm-up: all in margin)."""
    if ss.warm:
        return {"margin": ss.n, "error": 0, "reserve": 0}
    nm, ne, nr = be.count_states(ss)
    return {"margin": nm, "error": ne, "reserve": nr}


def state_digest(ss: SlotState, be: Backend) -> str:
    """The state's digest (:meth:`SlotState.digest` over the support in id order)."""
    slots = be.support_slots_by_id(ss)
    return ss.digest(ss.slot_id[slots], np.append(ss.alpha[slots], ss.mu))


def certificate_facts(ss: SlotState, be: Backend, outcome: RemovalOutcome
                      ) -> tuple[dict[str, int], float, bool, str]:
    """Set sizes, KKT residual, uniqueness and digest after the removal that returned
    ``outcome``.

    Equal to :func:`set_sizes`, the KKT residual on a fresh g, :func:`unique_optimum`
    and :func:`state_digest`: the removal's own final pass found them when it could
    (``outcome.facts``), else one backend pass over the slots, and the residual the
    removal's own exact-g check already computed (``outcome.kkt``).
    """
    kkt, pre = outcome.kkt, outcome.facts
    if pre is not None:  # the removal's own final pass found them
        unique = pre.unique
        return (pre.sizes, float(kkt), unique_optimum(ss, be) if unique < 0 else bool(unique),
                ss.digest(pre.ids, pre.values))
    if ss.n == 0 or ss.warm:
        return set_sizes(ss, be), 0.0, unique_optimum(ss, be), state_digest(ss, be)
    g = fresh_g(ss, be)
    nm, ne, nr, unique, ids, values = be.certificate_facts(ss, g, 1e-9 * ss.scale)
    if kkt is None:
        kkt = be.kkt(ss, g)
    return ({"margin": nm, "error": ne, "reserve": nr}, float(kkt),
            unique_optimum(ss, be) if unique < 0 else bool(unique), ss.digest(ids, values))


def polish(ss: SlotState, be: Backend, *, refresh_g: bool = True) -> None:
    """Re-solve alpha_S and mu on the current partition with the kept inverse.

    A margin coefficient that lands on a bound (within 1e-13·C: a tie of the
    two conditions) is moved to that bound's set, so the partition is the
    one read off alpha, and the system re-solved.
    """
    if solve_margin(ss, be, refresh_g) == 0:
        return
    for _ in range(ss.nS):
        S = ss.slot_of_col[: ss.nS]
        aS = ss.alpha[S]
        at_bound = np.flatnonzero(np.minimum(np.abs(aS - ss.C), np.abs(aS)) <= 1e-13 * ss.C)
        if len(at_bound) == 0:
            break
        for p in at_bound[::-1]:  # descending: contracting p only moves the last column
            slot = int(S[p])
            up = ss.alpha[slot] > 0.5 * ss.C
            be.contract(ss, int(p))
            ss.state[slot] = ERROR if up else RESERVE
            ss.alpha[slot] = ss.C if up else 0.0
            if not up:
                free_col(ss, slot)
        solve_margin(ss, be, refresh_g)


def polish_split(ss: SlotState, be: Backend) -> None:
    """:func:`polish`, with each group of copies split by its members' own g first
    (:func:`~svattn.exact.operations.copies.split_by_own_g`: near-copies' g differ).
    Where a split (or the re-split before it) bordered the inverse ill-conditioned
    (``ss.ill_border``, set after :func:`finish_op` took the operation's flag) the
    inverse is refactorized before the polish solves with it: at gamma 1e-8 on keys
    1e4 from the origin the drifted inverse left the margin g 1.7e-11 and the dual
    objective 8.5e-12 above the optimum, and a near-copy stream an inverse 5e-9 off."""
    for _ in range(3):
        moved = split_by_own_g(ss, be)
        if ss.ill_border:
            refactorize(ss)
            ss.ill_border = False
        polish(ss, be)
        if not moved:
            return


def solve_margin(ss: SlotState, be: Backend, refresh_g: bool = True) -> int | None:
    """Solve alpha_S, mu on the partition; return how many margin coefficients
    sit on a bound (None when not counted: the caller checks)."""
    at_bound = be.solve_margin(ss)
    after_margin_solve(ss, be, refresh_g)
    return at_bound


def after_margin_solve(ss: SlotState, be: Backend, refresh_g: bool) -> None:
    """After a margin solve: mu for an empty margin, or g refreshed (or marked stale)."""
    if not ss.nS:
        canonical_mu(ss, be)
    elif refresh_g:
        ss.g[: ss.hi] = be.g_exact(ss)
        ss.g_valid = True
    else:  # g keeps the drive's linear updates; the polish moved alpha by ~1e-16
        ss.g_valid = False


def finish_op(ss: SlotState, be: Backend, *, exact_g: bool = False) -> float | None:
    """End an incremental step exactly: polish, check, refactorize, re-solve. Return
    the KKT residual of the first check when it passed on an exact g (a removal's
    certificate reports it), else None. An operation that bordered the inverse
    ill-conditioned (``ss.ill_border``) refactorizes first and is judged on an exact g;
    the flag is cleared (it never outlives the operation)."""
    try:
        return _finish(ss, be, exact_g)
    finally:
        ss.ill_border = False


def _finish(ss: SlotState, be: Backend, exact_g: bool) -> float | None:
    """:func:`finish_op`'s steps."""
    # g is recomputed from the cached columns every 32 operations, on
    # ``exact_g`` (a removal: its certificate reports the residual of the exact
    # g) and before any decision below; in between the drive's own linear
    # updates are accurate to rounding, which the KKT check on them would expose.
    ss.ops_since_exact_g += 1
    # (the margin it ends on too: a joining token's own complement can be well above
    # ILL_SCHUR while its partner's against the grown set is not; seed 47 of
    # attack_ill_border_ahead.py left an unflagged inverse 5.1e-9 off, Q⁻¹Q − I)
    ill, ss.ill_border = ss.ill_border or ill_margin(ss), False
    if ill:  # a border beside a near-copy (core.cache.ILL_SCHUR): its downdates drift
        refactorize(ss)
    refresh = (ill or exact_g or ss.ops_since_exact_g >= 32
               or diagonal_span(ss) > WIDE_DIAGONAL)
    polish(ss, be, refresh_g=refresh)
    if refresh:
        ss.ops_since_exact_g = 0
    kkt = be.kkt(ss, ss.g[: ss.hi])
    if kkt <= 0.1 * ss.tol:
        if not resplit_violating(ss, be, kkt, ROUNDING_KKT):
            if kkt > ROUNDING_KKT and ss.g_valid and near_span_violators(ss, ROUNDING_KKT):
                # a bound token on the wrong side nearly in the span of the margin keys
                # that no flat exchange moves (its g meets 0 first: the optimum has it
                # and its partner both free, which the expansion refuses): re-solve
                resolve(ss, be)
                return None
            return kkt if ss.g_valid else None
        polish_split(ss, be)  # a split out of order under tol: polished on an exact g
        ss.ops_since_exact_g = 0
        kkt = be.kkt(ss, ss.g[: ss.hi])
        if kkt <= 0.1 * ss.tol:
            return kkt
    fresh_g(ss, be)
    ss.ops_since_exact_g = 0
    if be.kkt(ss, ss.g[: ss.hi]) <= 0.1 * ss.tol:
        return None
    refactorize(ss)
    polish_split(ss, be)
    if be.kkt(ss, ss.g[: ss.hi]) <= 0.1 * ss.tol:
        return None
    resolve(ss, be)  # (no residual returned: the certificate computes it)


def diagonal_span(ss: SlotState) -> float:
    """The live tokens' :func:`~svattn.exact.core.kernels.diagonal_log_span` (0 for a
    unit diagonal); beyond :data:`~svattn.exact.core.kernels.WIDE_DIAGONAL` every
    operation ends on a fresh g (:func:`finish_op`)."""
    if get_kernel(ss.kernel).unit_diagonal or ss.n < 2:
        return 0.0
    return diagonal_log_span(ss.diag[ss.live_slots()])


def drop_solution(ss: SlotState) -> None:
    """Forget the solution: no margin set, no inverse, no cached columns."""
    ss.esum_valid = ss.ill_border = False
    ss.nS = 0
    ss.Qinv = np.zeros((0, 0))
    for s in ss.slot_of_col[: ss.chi].tolist():  # standby columns too
        if s >= 0:
            free_col(ss, s)


def set_uniform(ss: SlotState) -> None:
    """The warm-up convention: alpha = 1/n on every live token, mu = 0."""
    ss.esum_valid = False
    live = ss.live_slots()
    ss.alpha[: ss.hi] = 0.0
    if len(live):
        ss.alpha[live] = 1.0 / len(live)
        ss.state[live] = RESERVE
    ss.mu = 0.0
    ss.g[: ss.hi] = 0.0
    ss.g_valid = True


# The re-solve is every operation's last resort, so its residual is what the tokens
# allow: rounding (~1e-16), or near-copies of keys, whose nearly singular margin system
# leaves up to 1.9e-8 (benchmarks/resolve_residuals.py: 401 of 717 re-solves above a tol
# of 1e-10; such states are kept, and their certificates do not claim exactness). A
# residual above both tol and this bound is a wrong optimum (a box of C = 1e13 before it
# was clamped to 1 gave 1.0): the operation raises and is undone.
WRONG_OPTIMUM = 1e-6


class WrongOptimum(ArithmeticError):
    """A re-solve ended far from the optimum (see ``WRONG_OPTIMUM``); raised inside an
    operation, whose rollback restores the state and reports it as ``OperationError``."""


# From this many live tokens a re-solve of rbf keys goes the batch path of a large block
# (libsvm, then the exact finish on the support's kernel columns): O(n·|S ∪ E|) memory,
# where the Gram solve holds n² (128 MB and 0.3-0.7 s at n = 4,000; 8 GB at 32,000).
RESOLVE_BY_COLUMNS_FROM = 512
ROUNDING_KKT = 1e-13  # a KKT residual above it is not rounding (copies.resplit_violating)


def resolve(ss: SlotState, be: Backend, *, fallback: bool = True,
            polish_after: bool = True, check: bool = True) -> None:
    """Exact batch solve of the live set; rebuild caches and the inverse.

    With the rbf kernel and at least :data:`RESOLVE_BY_COLUMNS_FROM` live tokens, the
    batch path of a large block first (:func:`resolve_by_columns`); the Gram solve
    (:func:`resolve_by_gram`) where that cannot certify its optimum (a cycle, a polish
    that fails) and for every other memory. Both merge copies into one budget.

    ``check``: the KKT residual is recomputed from the cached columns, and above
    ``max(tol, WRONG_OPTIMUM)`` :class:`WrongOptimum` is raised (inside an operation,
    :func:`svattn.exact.operations.rollback.atomic` then restores the state).
    """
    ss.n_resolves += int(fallback)
    if not (ss.is_rbf and not ss.warm and ss.n >= RESOLVE_BY_COLUMNS_FROM
            and resolve_by_columns(ss, be)):
        resolve_by_gram(ss, be, polish_after=polish_after)
    if check and ss.n and not ss.warm:
        kkt = float(be.kkt(ss, be.g_exact(ss)))
        if not kkt <= max(ss.tol, WRONG_OPTIMUM):
            raise WrongOptimum(
                f"the batch re-solve of {ss.n} tokens ends with KKT residual {kkt:.2e}, "
                f"above tol ({ss.tol:.0e}) and above what rounding or near-copies of keys "
                f"leave ({WRONG_OPTIMUM:.0e}): no exact state to return"
                f"{wide_diagonal_advice(diagonal_span(ss))}")


def resolve_by_columns(ss: SlotState, be: Backend) -> bool:
    """Re-solve the live rbf tokens by libsvm's warm start and the exact finish on the
    support's kernel columns (:func:`svattn.exact.operations.batch.libsvm_solve`, as a
    large block is added; copies merged, :mod:`svattn.exact.operations.copies`),
    installed with the inverse the finish built. False where the finish cannot certify
    its optimum (a cycle) or the install's polish fails: the caller then solves by the
    Gram matrix (which starts from scratch)."""
    live = ss.ordered_slots()
    sol, cols = solve_by_columns(ss, live)
    try:
        if sol is None:
            return False
        install_solution(ss, be, live, sol, cols)
        return True
    except NeedResolve:  # (the install's polish)
        return False
    finally:
        cols.scrub()


def solve_by_columns(ss: SlotState, live: np.ndarray, rows: np.ndarray | None = None
                     ) -> tuple[BatchSolution | None, KernelColumns]:
    """:func:`svattn.exact.operations.batch.libsvm_solve` of the keys of ``live`` (then
    ``rows``, keys not stored yet), through one copy of them that is scrubbed after;
    the caller scrubs the columns it gets back."""
    m = len(live) + (0 if rows is None else len(rows))
    X = np.empty((m, ss.X.shape[1]))  # scrubbed below
    take_rows(ss.X[: ss.hi], live, X[: len(live)])  # (no buffered copy: cache.take_rows)
    if rows is not None:
        X[len(live):] = rows
    try:
        return libsvm_solve(X, ss.C, ss.gamma_value, tol=0.01 * ss.tol)
    finally:
        scrub(X)


def resolve_by_gram(ss: SlotState, be: Backend, *, polish_after: bool = True) -> None:
    """The re-solve by the Gram matrix of the live set.

    Keys that the kernel cannot tell apart (``k(x,x) + k(y,y) − 2k(x,y)``
    below 1e-13 of ``k(x,x) + k(y,y)``) are solved as one token with bound ``m·C``
    and the weight is spread back in id order: the first members at C, one remainder,
    the rest 0; then in the order of the members' own g where near-copies' g differ
    (:func:`polish_split`). The margin set stays free of copies (Q invertible).
    """
    drop_solution(ss)
    live = ss.ordered_slots()
    for s in live:
        free_col(ss, int(s))
    # Peak memory: the Gram matrix K (8·n² bytes) and, with merged copies, its block of
    # representatives; every other temporary is a row, or the solve's margin system
    # (batch.py: O(n·|S|) + O(|S|²)); K is freed before the cache columns of the
    # support are filled (8·n·|S ∪ E| bytes, the state itself). The copy test goes one
    # row at a time: its n×n distance and comparison matrices had the peak at ~32·n².
    # The keys' copy and K: scrubbed (a token in them may be removed later)
    keys, K = ss.X[live], None
    try:
        K = gram_matrix(keys, ss.kernel, ss.gamma_value)
        diag = ss.diag[live]
        group, reps = copy_groups(K)
        reps_a = np.asarray(reps)
        sizes = np.bincount(group, minlength=len(reps))
        if len(reps) < len(live):
            full, K = K, K[np.ix_(reps_a, reps_a)]
            scrub(full)  # (the full matrix is freed)
        sol = batch_solve(K, diag[reps_a], ss.C * sizes, tol=0.01 * ss.tol)
    finally:
        scrub(keys)
        if K is not None:
            scrub(K)
    del K  # freed before the support's cache columns are allocated
    alpha = np.zeros(len(live))
    for gi, w in enumerate(sol.alpha):  # each group's weight over its members in id order
        members = np.flatnonzero(group == gi)
        alpha[members] = spread(float(w), len(members), ss.C)
    ss.alpha[: ss.hi] = 0.0
    ss.alpha[live] = alpha
    ss.state[live] = RESERVE
    margin = (alpha > 0) & (alpha < ss.C)
    for s in live[margin]:  # margin first: they fill columns [0, nS)
        ss.state[s] = MARGIN
        be.alloc_col(ss, int(s))
        ss.nS += 1
    for s in live[alpha >= ss.C]:
        ss.state[s] = ERROR
        be.alloc_col(ss, int(s))
    settle_solution(ss, be, sol.mu)
    # above rounding (mu fits a group's representative); not where it worsens one under tol
    if polish_after and ss.nS and (kkt := be.kkt(ss, ss.g[: ss.hi])) > ROUNDING_KKT:
        try:
            polish_split(ss, be)
        except NeedResolve:  # the polish met a degeneracy: the batch solution, unpolished
            kkt = -1.0
        if kkt <= 0.1 * ss.tol and not be.kkt(ss, ss.g[: ss.hi]) <= kkt:
            resolve_by_gram(ss, be, polish_after=False)


def settle_solution(ss: SlotState, be: Backend, mu: float,
                    Qinv: np.ndarray | None = None) -> None:
    """After a whole solution's partition and cache columns are placed (a re-solve, a
    batch install): its ``mu``, the bordered inverse (``Qinv`` when given, one on this
    margin set; else refactorized), the cached alphas, the canonical ``mu`` of an empty
    margin set, and an exact ``g``."""
    ss.mu = mu
    if Qinv is not None:
        ss.Qinv = Qinv
    else:
        refactorize(ss, count=False)
    ss.sync_ac()
    if not ss.nS:
        canonical_mu(ss, be)
    ss.g[: ss.hi] = be.g_exact(ss)
    ss.g_valid = True


def install_solution(ss: SlotState, be: Backend, live: np.ndarray, sol: BatchSolution,
                     cols: KernelColumns | None = None) -> None:
    """Make ``sol`` (alpha over ``live``, in that order) the memory's solution: columns
    for the margin tokens first (in ``sol.margin``'s order, the rows of ``sol.Qinv``)
    and the error tokens — copied from ``cols`` (the finish's kernel columns over
    ``live``) when given, else computed —, mu, the bordered inverse (``sol.Qinv`` when
    it is the one on this margin set, else refactorized), an exact g, and a polish
    when its KKT residual is above ``0.1·tol``. A group of copies in the support holds
    one free member at most (:func:`svattn.exact.operations.batch.spread_copies`)."""
    drop_solution(ss)
    alpha = sol.alpha
    ss.alpha[: ss.hi] = 0.0
    ss.alpha[live] = alpha
    ss.state[live] = RESERVE
    margin = np.flatnonzero((alpha > 0) & (alpha < ss.C))
    same = sol.Qinv is not None and np.array_equal(np.sort(sol.margin), margin)
    if same:  # the inverse is on this margin set: its columns in the order of its rows
        margin = np.asarray(sol.margin)
    error = np.flatnonzero(alpha >= ss.C)
    ss.state[live[margin]] = MARGIN
    ss.state[live[error]] = ERROR
    # margin first: they fill columns [0, nS); the error tokens' share is the finish's
    # error sum where it has one (no error column is written: issue #51), else columns
    # that the operation's end folds into a sum
    order = margin if sol.esum is not None else np.concatenate([margin, error])
    if sol.esum is not None:
        ss.esum[: ss.hi] = 0.0
        ss.esum[live] = sol.esum
        ss.esum_member[: ss.hi] = False
        ss.esum_member[live[error]] = True
        ss.esum_valid, ss.esum_updates = True, 0
    # (a copy that a split after the finish put on the margin may have no column there:
    # computed now, where a position of -1 read the buffer's last row)
    pos = cols.ensure(order) if cols is not None and ss.chi == 0 else None
    if pos is not None and adopt_rows(ss, live, live[order], cols.rows, pos, cols.m):
        cols.release()  # the finish's buffer is the cache now, its columns in place
    else:
        need = len(order) + ss.standby
        if ss.ccap < need:  # one allocation, not a doubling per column
            ss.grow_cols(need + need // 4)
        if pos is not None:
            write_columns(ss, live, live[order], cols.rows, pos)
        else:
            for s in live[order]:
                be.alloc_col(ss, int(s))
    ss.nS = len(margin)
    settle_solution(ss, be, sol.mu, sol.Qinv if same else None)
    ss.ops_since_exact_g = 0
    if ss.nS and be.kkt(ss, ss.g[: ss.hi]) > 0.1 * ss.tol:
        polish_split(ss, be)
        if be.kkt(ss, ss.g[: ss.hi]) > 0.1 * ss.tol:
            raise NeedResolve


__all__ = ["WRONG_OPTIMUM", "Backend", "WrongOptimum", "add_one", "certificate_facts",
           "fresh_g", "install_solution", "next_slots", "record_rows",
           "remove_slot", "reserve_score", "resolve", "resolve_by_columns", "resolve_by_gram",
           "set_sizes", "settle_solution", "solve_by_columns", "standby_upkeep",
           "state_digest", "store", "wipe_slot"]
