"""The solver state of the exact memory: every array and scalar it keeps, in one object.

:class:`SlotState` is what the two backends (:mod:`svattn.exact.backends.reference`,
:mod:`svattn.exact.backends.compiled`) and the shared algorithm
(:mod:`svattn.exact.operations.solver`) operate on, and what a state file holds (its
schema, with the readers of older versions, is :mod:`svattn.exact.records.schema`;
``docs/design.md`` §4).

Storage is slot based. Slots ``[0, hi)`` have been used; a removed token's slot
is wiped (zeros) and pushed on ``free_slots`` for reuse; ids are never reused.
Kernel columns are cached for margin, driven and standby tokens only (the n×n Gram
matrix is never built on the hot path); error tokens keep none between operations —
their share of every g is the kept error sum ``esum`` (issue #51): ``KC[:, col]`` is the
column of slot ``slot_of_col[col]`` over every slot, stored column-major so that
column moves and margin-block products are contiguous. Margin tokens occupy
columns ``[0, nS)`` in the order of ``Qinv``'s rows ``1..nS``.

Examples
--------
>>> st = SlotState.new(C=0.5, kernel="rbf", gamma=None, tol=1e-10, standby=0)
>>> st.warmup_n, st.n, st.cap
(2, 0, 0)
"""

from __future__ import annotations

import copy
import functools
import hashlib
import math
from dataclasses import dataclass, field

import numpy as np

from svattn.exact.core.conventions import warmup_threshold
from svattn.exact.core.gram import KeptFactor, MarginGramScratch
from svattn.exact.core.kernels import check_kernel, default_gamma, get_kernel
from svattn.exact.core.kktsets import FREE

DIGEST_MOD = 1 << 256  # the token set's multiset hash is a sum modulo this

COMMIT_BYTES = 32  # a token's commitment (svattn.exact.records.certificate.commit_token)
TAG_BYTES = 32  # a tag is kept as its HMAC-SHA256 under the controller's tag key

# what an operation found, once left on the state (svattn.exact.core.outcome returns it now);
# dropped from a state pickled before that
_RESULT_FIELDS = frozenset({"kkt_after", "facts_after", "health_after", "ingest_path"})


class NeedResolve(Exception):
    """Raised inside an operation: an incremental step met a degeneracy; the solver
    re-solves the token set exactly (never escapes a public operation)."""


def _finite(x) -> bool:
    """``math.isfinite``, False (not OverflowError) for an int no float holds (a file's
    JSON may carry one)."""
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


def check_parameters(C, kernel, gamma, tol, standby) -> None:
    """Raise ``TypeError`` / ``ValueError`` naming the first invalid parameter of a memory."""
    if isinstance(C, bool) or not isinstance(C, (int, float, np.floating, np.integer)):
        raise TypeError(f"C must be a positive real number, got {type(C).__name__}")
    if not (_finite(C) and C > 0):
        raise ValueError(f"C must be a finite number > 0, got {C!r:.40}")
    warmup_threshold(float(C))  # refuses a C too small for any memory to reach its optimum
    check_kernel(kernel, compiled=True)
    if gamma is not None and not (_finite(gamma) and gamma > 0):
        raise ValueError(f"gamma must be None or a finite number > 0, got {gamma!r:.40}")
    if not (_finite(tol) and tol > 0):
        raise ValueError(f"tol must be a finite number > 0, got {tol!r:.40}")
    if isinstance(standby, bool) or not isinstance(standby, (int, np.integer)) or standby < 0:
        raise ValueError(f"standby must be an int >= 0, got {standby!r}")


def scrub(a: np.ndarray) -> None:
    """Zero a buffer that is about to be dropped, so freed memory keeps no key data."""
    if a.dtype != object:
        a.fill(0)


@functools.lru_cache(maxsize=64)
def _digest_head(C: float, kernel: str, gamma: float) -> str:
    """The parameters' part of the state digest (formatted once per parameter set)."""
    return f"svattn-svdd-v1|{C!r}|{kernel}|{gamma!r}|"


def _f64(n: int = 0, *rest: int) -> np.ndarray:
    return np.zeros((n, *rest))


@dataclass(eq=False)
class SlotState(MarginGramScratch):
    """Every array and scalar of one exact memory's solver.

    Parameters are fixed at construction (``C``, ``kernel``, ``gamma``, ``tol``,
    ``standby``, ``max_segments``, ``max_jumps``, ``compiled``); the rest is
    what the operations keep up to date. Array fields are indexed by slot
    unless their comment says otherwise.
    """

    # ---- parameters
    C: float
    kernel: str
    gamma: float | None  # None: default_gamma(kernel, dim) once dim is known
    tol: float
    standby: int  # reserve tokens nearest the boundary that keep a kernel column
    warmup_n: int
    max_segments: int = 1 << 30  # segments a removal takes before the event loop
    max_jumps: int = 2  # active-set steps a removal may try (0: the path alone)
    compiled: bool = True  # which backend the memory runs (recorded for continuation)
    # ---- dimensions (None / True until the first token)
    dim: int | None = None
    vdim: int | None = None
    value_is_key: bool = True
    # ---- slots
    cap: int = 0
    X: np.ndarray = field(default_factory=_f64)  # keys (cap, d)
    V: np.ndarray = field(default_factory=_f64)  # values (cap, dv); empty when value_is_key
    diag: np.ndarray = field(default_factory=_f64)  # K_ii
    xn2: np.ndarray = field(default_factory=_f64)  # ‖x‖²: the exp kernel's overflow bound
    slot_id: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # -1: free
    alpha: np.ndarray = field(default_factory=_f64)
    g: np.ndarray = field(default_factory=_f64)  # KKT gradient 2(K alpha)_i − K_ii + mu
    state: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))  # states.py codes
    col_of_slot: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # -1: none
    token_hash: np.ndarray = field(default_factory=lambda: np.zeros(0, object))
    # 64-bit hash of each token's key and value bytes (-0.0 as 0.0), derived and never
    # saved: live copies of a record are found by one array comparison (row_hash())
    row_hash: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    # keyed hash of each token's data-subject tag (zeros: untagged); never the tag itself
    tags: np.ndarray = field(default_factory=lambda: np.zeros((0, TAG_BYTES), np.uint8))
    # each token's commitment as made at its add (the log's add record holds the same),
    # and whether it is keyed (1: HMAC under the controller's key) or opaque (0)
    commitments: np.ndarray = field(
        default_factory=lambda: np.zeros((0, COMMIT_BYTES), np.uint8))
    commit_keyed: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))  # 2: legacy
    commit_key_id: str | None = None  # the key keyed commitments are under (its public name)
    free_slots: list[int] = field(default_factory=list)
    hi: int = 0  # slots [0, hi) have been used
    id_to_slot: dict[int, int] = field(default_factory=dict)
    next_id: int = 0
    n: int = 0
    set_hash: int = 0  # sum of token_hash over live tokens mod DIGEST_MOD (multiset hash)
    # ---- kernel cache (indexed by column unless noted)
    ccap: int = 0
    KC: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), order="F"))  # (cap, ccap)
    XC: np.ndarray = field(default_factory=_f64)  # key of each column's token (ccap, d)
    slot_of_col: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    ac: np.ndarray = field(default_factory=_f64)  # alpha per column (0 for free columns)
    chi: int = 0  # columns [0, chi) have been used
    # ---- the bordered system (docs/design.md §2)
    nS: int = 0  # margin tokens = cache columns [0, nS)
    Qinv: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    # inverses a removal wrote over the old one's memory, over the state's life (the old
    # one is then gone: a restore to a checkpoint taken before one recomputes it, and
    # leaves this count as it is, svattn.exact.operations.rollback)
    inverse_overwrites: int = 0
    mu: float = 0.0
    g_valid: bool = True  # g[:hi] is exact (recomputed from the cache)
    ops_since_exact_g: int = 0
    # an expansion of this operation bordered the inverse ill-conditioned, or the margin set
    # it began on held such a border (core.cache.ILL_SCHUR, ill_margin): its finish
    # refactorizes and judges an exact g, then clears it
    ill_border: bool = False
    # ---- error-column sum: per slot, the sum of the error tokens' kernel values
    esum: np.ndarray = field(default_factory=_f64)
    esum_member: np.ndarray = field(default_factory=lambda: np.zeros(0, np.bool_))
    esum_valid: bool = False
    esum_updates: int = 0  # columns added/subtracted since the last rebuild
    # ---- standby columns: chosen when standby_theta, the largest g among them, was taken
    standby_stale: bool = True
    standby_theta: float = math.inf
    # ---- counters (reported by the audit log and benchmarks)
    n_refactorizations: int = 0
    n_resolves: int = 0
    n_segment_fallbacks: int = 0  # removals the segment loop left to the event loop
    n_block_passes: int = 0  # passes over the margin block by removals
    n_jumps: int = 0  # removals finished by an active-set step
    n_jump_fallbacks: int = 0  # removals whose steps did not converge
    # tokens compact() dropped over the memory's life (-1: unknown, a state saved before
    # svattn recorded it); removals are then exact relative to the kept tokens only
    n_compacted: int = 0
    # ---- scratch (never saved; svattn.exact.core.gram): K_SS as the last margin solve left it,
    # valid (and kept between operations) while kss_for is the current Qinv; and the
    # uniqueness test's factor, kept while its tokens are all margin tokens
    kss: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    kss_for: np.ndarray | None = None
    kss_ext: int = 0  # rows and columns of kss that were written
    # the removal's work copy of the inverse (its qwork_n² block is Qinv while qwork_for is)
    qwork: np.ndarray = field(default_factory=lambda: np.zeros((0, 0)))
    qwork_for: np.ndarray | None = None
    qwork_n: int = 0
    pd_factor: KeptFactor | None = None
    # a replaced inverse's memory, zeroed: where the next removal writes its own
    qspare: np.ndarray = field(default_factory=lambda: np.zeros(0))

    # ------------------------------------------------------------ construction
    @classmethod
    def new(cls, *, C: float, kernel: str, gamma: float | None, tol: float, standby: int,
            compiled: bool = True) -> SlotState:
        """An empty state with these parameters (validated by the caller)."""
        return cls(C=float(C), kernel=kernel, gamma=None if gamma is None else float(gamma),
                   tol=float(tol), standby=int(standby), warmup_n=warmup_threshold(float(C)),
                   compiled=bool(compiled))

    def alloc(self, cap: int, d: int, dv: int) -> None:
        """Reset to empty arrays of ``cap`` slots, key dim ``d``, value dim ``dv``."""
        self.cap = cap
        self.X, self.V = np.zeros((cap, d)), np.zeros((cap, dv))
        self.diag, self.xn2 = np.zeros(cap), np.zeros(cap)
        self.slot_id = np.full(cap, -1, dtype=np.int64)
        self.alpha, self.g = np.zeros(cap), np.zeros(cap)
        self.state = np.zeros(cap, dtype=np.int8)
        self.col_of_slot = np.full(cap, -1, dtype=np.int64)
        self.token_hash = np.zeros(cap, dtype=object)
        self.row_hash = np.zeros(cap, dtype=np.int64)
        self.tags = np.zeros((cap, TAG_BYTES), dtype=np.uint8)
        self.commitments = np.zeros((cap, COMMIT_BYTES), dtype=np.uint8)
        self.commit_keyed = np.zeros(cap, dtype=np.int8)
        self.free_slots, self.hi, self.id_to_slot = [], 0, {}
        self.next_id = self.n = 0
        self.ccap = self.chi = 0
        self.KC = np.zeros((cap, 0), order="F")
        self.XC = np.zeros((0, d))
        self.slot_of_col = np.full(0, -1, dtype=np.int64)
        self.ac = np.zeros(0)
        self.nS, self.Qinv, self.mu = 0, np.zeros((0, 0)), 0.0
        self.g_valid, self.ops_since_exact_g = True, 0
        self.esum, self.esum_member = np.zeros(cap), np.zeros(cap, dtype=np.bool_)
        self.esum_valid, self.esum_updates = False, 0
        vars(self).update(self.empty_scratch())
        self.set_hash = 0
        self.standby_stale, self.standby_theta = True, math.inf

    def grow_slots(self, need: int) -> None:
        """Room for ``need`` slots (doubling); old buffers are scrubbed."""
        if need <= self.cap:
            return
        cap = max(need, 2 * self.cap, 16)
        extra = cap - self.cap

        def pad(a: np.ndarray, fill) -> np.ndarray:
            out = np.concatenate([a, np.full((extra,) + a.shape[1:], fill, dtype=a.dtype)])
            scrub(a)  # the old buffer goes back to the allocator holding no data
            return out

        self.X, self.V = pad(self.X, 0.0), pad(self.V, 0.0)
        self.diag, self.slot_id = pad(self.diag, 0.0), pad(self.slot_id, -1)
        self.alpha, self.g = pad(self.alpha, 0.0), pad(self.g, 0.0)
        self.state, self.col_of_slot = pad(self.state, FREE), pad(self.col_of_slot, -1)
        self.token_hash, self.xn2 = pad(self.token_hash, 0), pad(self.xn2, 0.0)
        self.row_hash = pad(self.row_hash, 0)
        self.tags = pad(self.tags, 0)
        self.commitments, self.commit_keyed = pad(self.commitments, 0), pad(self.commit_keyed, 0)
        self.esum, self.esum_member = pad(self.esum, 0.0), pad(self.esum_member, False)
        KC = np.zeros((cap, self.ccap), order="F")
        KC[: self.cap] = self.KC
        scrub(self.KC)
        self.KC, self.cap = KC, cap

    def grow_cols(self, need: int = 0) -> None:
        """Double the kernel cache's columns (at least ``need`` then); old buffers are
        scrubbed."""
        ccap = max(2 * self.ccap, 8, need)
        KC = np.zeros((self.cap, ccap), order="F")
        KC[:, : self.ccap] = self.KC
        XC = np.zeros((ccap, self.X.shape[1]))
        XC[: self.ccap] = self.XC
        soc = np.full(ccap, -1, dtype=np.int64)
        soc[: self.ccap] = self.slot_of_col
        ac = np.zeros(ccap)
        ac[: self.ccap] = self.ac
        for old in (self.KC, self.XC, self.ac):
            scrub(old)
        self.KC, self.XC, self.slot_of_col, self.ac, self.ccap = KC, XC, soc, ac, ccap

    def shrink_cols(self) -> None:
        """Give kernel-cache room back to the allocator: where the buffer (past a floor
        of 1 MB) holds more than 1.25× the columns in use with a quarter to spare (and
        room for the standby columns) — a batch solve's buffer sized for its support,
        error columns folded into the error sum, a doubling the margin set left — the
        used ``[0, chi)`` move into a buffer of that size; old buffers are scrubbed. (A
        copy of ``n·chi``: after a doubling, a quarter of the columns in use are added
        before the next, so it costs about four entries per column added.)"""
        chi = self.chi
        want = chi + chi // 4 + self.standby + 8
        if self.ccap <= want + want // 4 or 8 * self.cap * self.ccap < (1 << 20):
            return
        KC = np.zeros((self.cap, want), order="F")
        KC[:, :chi] = self.KC[:, :chi]
        XC = np.zeros((want, self.X.shape[1]))
        XC[:chi] = self.XC[:chi]
        soc = np.full(want, -1, dtype=np.int64)
        soc[:chi] = self.slot_of_col[:chi]
        ac = np.zeros(want)
        ac[:chi] = self.ac[:chi]
        # the columns past chi hold zeros (free_col, compaction): only the used ones are
        # scrubbed — a fill of the rest would touch pages a batch solve never wrote
        self.KC[:, :chi] = 0.0
        for old in (self.XC, self.ac):
            scrub(old)
        self.KC, self.XC, self.slot_of_col, self.ac, self.ccap = KC, XC, soc, ac, want

    def adopt_cols(self, KC: np.ndarray) -> None:
        """Make ``KC`` the kernel cache where it holds no column (``chi = 0``): a Fortran-
        ordered ``(cap, ccap)`` buffer whose leading columns the caller fills (the rest
        zero), taken as it is — no second cache-sized array and no copy. The column
        arrays follow its width; the old buffers are scrubbed."""
        if self.chi:
            raise RuntimeError("adopt_cols: the kernel cache holds columns (an internal error)")
        if KC.ndim != 2 or KC.shape[0] != self.cap or not KC.flags.f_contiguous:
            raise ValueError(f"adopt_cols: a Fortran-ordered ({self.cap}, ccap) buffer "
                             f"expected, got shape {KC.shape}")
        ccap = KC.shape[1]
        for old in (self.KC, self.XC, self.ac):
            scrub(old)
        self.KC, self.ccap = KC, ccap
        self.XC = np.zeros((ccap, self.X.shape[1]))
        self.slot_of_col = np.full(ccap, -1, dtype=np.int64)
        self.ac = np.zeros(ccap)

    def __getstate__(self) -> dict:
        """Pickle and deepcopy without the scratch (:mod:`svattn.exact.core.gram`: rebuilt
        on use)."""
        return {**vars(self), **self.empty_scratch()}

    def __setstate__(self, state: dict) -> None:
        """Unpickle; what the last operation found, which a state pickled before
        :mod:`svattn.exact.core.outcome` carried (:data:`_RESULT_FIELDS`), is dropped, and
        scratch a state pickled before it existed lacks starts empty (and ``ill_border``,
        a flag no operation leaves set, False; ``inverse_overwrites``, a count no
        operation's checkpoint spans a pickle with, 0)."""
        vars(self).update(self.empty_scratch(), ill_border=False, inverse_overwrites=0)
        vars(self).update({k: v for k, v in state.items() if k not in _RESULT_FIELDS})

    def copy(self) -> SlotState:
        """An independent deep copy (arrays copied, Fortran order of the cache kept),
        without the scratch (:meth:`__getstate__`)."""
        return copy.deepcopy(self)

    # ------------------------------------------------------------ read access
    @property
    def gamma_value(self) -> float:
        """The kernel bandwidth in use (needs the key dimension)."""
        assert self.dim is not None
        return self.gamma if self.gamma is not None else default_gamma(self.kernel, self.dim)

    @property
    def is_rbf(self) -> bool:
        """The backends' kernel flag, :attr:`Kernel.compiled_flag` (True for rbf)."""
        return get_kernel(self.kernel).compiled_flag

    @property
    def warm(self) -> bool:
        """True while ``n·C < 1`` (warm-up convention: uniform alpha)."""
        return self.n < self.warmup_n

    @property
    def scale(self) -> float:
        """Largest kernel diagonal of the live tokens (>= 1): the unit of g."""
        if get_kernel(self.kernel).unit_diagonal:  # k(x, x) = 1 for every key
            return 1.0
        return max(1.0, float(self.diag[: self.hi].max(initial=0.0)))

    @property
    def error_sum_rebuild_due(self) -> bool:
        """The error sum must be summed afresh: it is not that of a current solution, or
        it has taken as many column updates as it has members (at least 32), so its
        rounding stays that of a direct sum. A rebuild computes every error token's
        column (they keep none), ``O(n·|E|·d)``: after ``|E|`` updates, one column's
        work per update, what each update costs already."""
        if not self.esum_valid:
            return True
        return (self.esum_updates >= 32 and self.esum_updates
                >= int(np.count_nonzero(self.esum_member[: self.hi])))

    def bind_commit_key(self, key_id: str | None) -> None:
        """Refuse adds under another commitment key than the state's keyed commitments
        use (re-entry of an erased record would then go unseen); record the first."""
        if self.commit_key_id is not None and key_id != self.commit_key_id:
            how = ("load it with that key (tag_key= or signing_key=)" if key_id is None
                   else "it was loaded with another key")
            raise ValueError(f"this memory's commitments are under the controller's key "
                             f"{self.commit_key_id[:12]}…; {how} before adding")
        self.commit_key_id = self.commit_key_id or key_id

    def tagged_slots(self, tag_hash: bytes) -> np.ndarray:
        """Live slots whose tag is ``tag_hash`` (in id order)."""
        want = np.frombuffer(tag_hash, dtype=np.uint8)
        live = self.ordered_slots()
        return live[(self.tags[live] == want).all(axis=1)] if len(live) else live

    def copies_outside(self, slots: np.ndarray) -> dict[int, list[int]]:
        """For each of ``slots``, the ids of other live tokens, not among ``slots``, that
        hold the same key and value (-0.0 is 0.0), in id order: candidates by the row
        hash (a removal calls it: one array comparison), then their whole rows."""
        hashes = self.row_hash[: self.hi]
        out = {}
        for s in slots:
            cand = np.flatnonzero(hashes == self.row_hash[s])
            if len(cand) == 1 and cand[0] == s:  # the usual case: no other row like it
                out[int(self.slot_id[s])] = []
                continue
            cand = cand[self.state[cand] != FREE]
            cand = cand[cand != s] if len(slots) == 1 else cand[~np.isin(cand, slots)]
            same = cand[(self.X[cand] == self.X[s]).all(axis=1)
                        & (self.V[cand] == self.V[s]).all(axis=1)]
            out[int(self.slot_id[s])] = sorted(int(i) for i in self.slot_id[same])
        return out

    def live_slots(self) -> np.ndarray:
        return np.flatnonzero(self.state[: self.hi] != FREE)

    def ordered_slots(self) -> np.ndarray:
        """Live slots in id (insertion) order."""
        live = self.live_slots()
        return live[np.argsort(self.slot_id[live], kind="stable")]

    def tags_by_id(self) -> dict[str, str]:
        """Each tagged live token's subject tag (the keyed hash, hex) by its id: what a
        chain that continues this state records (never the data, never a subject in clear)."""
        return {str(int(self.slot_id[s])): self.tags[s].tobytes().hex()
                for s in self.ordered_slots() if self.tags[s].any()}

    def slots_in(self, states: set[int]) -> np.ndarray:
        return np.flatnonzero(np.isin(self.state[: self.hi], list(states)))

    def margin_slots(self) -> np.ndarray:
        return self.slot_of_col[: self.nS]

    def support_slots(self) -> np.ndarray:
        """Slots with alpha > 0 (all live slots in warm-up), by a scan of every slot."""
        if self.warm:
            return self.live_slots()
        return np.flatnonzero(self.alpha[: self.hi] > 0)

    def cached_support_slots(self) -> np.ndarray:
        """:meth:`support_slots`, the same array: the margin tokens read from the cache's
        columns, the error tokens (which keep no column) from the error sum's members
        (between operations exactly the error set), and nothing else has alpha > 0."""
        if self.warm:
            return self.live_slots()
        soc = self.slot_of_col[: self.chi]
        soc = soc[soc >= 0]
        members = np.flatnonzero(self.esum_member[: self.hi])
        both = np.union1d(soc, members) if len(members) else np.sort(soc)
        return both[self.alpha[both] > 0]

    def digest(self, ids: np.ndarray, values: np.ndarray) -> str:
        """The state digest (``docs/design.md`` §4) given the support's ids (int64) in id
        order and ``values``: their alphas, then mu. SHA-256 over the parameters, n, the
        token set's multiset hash (O(1) per add and remove), the ids and the values."""
        gamma = self.gamma_value if self.dim is not None else float("nan")
        h = hashlib.sha256(f"{_digest_head(self.C, self.kernel, gamma)}{self.n}|".encode())
        h.update(self.set_hash.to_bytes(32, "big"))
        h.update(ids.tobytes())
        h.update(values.tobytes())
        return h.hexdigest()

    def sync_ac(self) -> None:
        """Copy alpha of every cached token into the per-column array."""
        soc = self.slot_of_col[: self.chi]
        self.ac[: self.chi] = np.where(soc >= 0, self.alpha[soc], 0.0)


__all__ = ["COMMIT_BYTES", "DIGEST_MOD", "TAG_BYTES", "NeedResolve", "SlotState",
           "check_parameters", "scrub"]
