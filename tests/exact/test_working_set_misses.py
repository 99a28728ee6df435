"""A support forget takes at most three passes over the margin block, also beside
copies and near-copies: the claim of :mod:`svattn.exact.backends.compiled.working_set`
where its prediction misses.

200 rows in d = 4 (100 keys and a near-copy of each 1e-6 away), C = 1/60, gamma = 1,
about 70 margin tokens. The tenth of a seeded series of support forgets (error token
64) took 6 passes: removing it moves its weight to its near-copy 164 on the margin, a
near-null move for every other g, so the first segment predicted no token at all; 164
reached C, the path bent, and each check found one more near-copy pair across its
boundary (46/146, then 7/107) until ``max_jumps = 2`` handed the removal back to the
path (4 more passes). A miss now re-predicts from the checked end's g (the start-to-end
line, which saw the bend: ``working_set.predict_again``), and the removal takes 3.

Exact copies and near-copies the copy test merges (1e-7, 1e-8 apart) missed in two more
ways, up to 8 and 15 passes: a copy of a margin token whose g sat 3e-12 across zero
(its sibling's g and the near-copy's offset, within tol) counted as a miss at every
check, where the path never lets it cross; and when a margin token left for a bound,
its copy in the other bound — the group's next member, entering at share 0 — was a
zero-length event the round gave up on.
"""

from __future__ import annotations

import numpy as np
import pytest

from svattn.exact import SVDDMemory
from svattn.exact.auditor.crosscheck import oracle_comparison


def test_a_support_forget_beside_near_copies_takes_at_most_three_passes():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(200, 4))
    rng.normal(size=(100, 4))
    keys = np.concatenate([X[:100], X[:100] + 1e-6 * rng.normal(size=(100, 4))])
    mem = SVDDMemory(1 / 60, "rbf", 1.0)
    mem.extend(keys)
    order = np.random.default_rng(0)
    passes = []
    for k in range(12):
        part = mem.partition()
        pool = part["margin"] if k % 2 == 0 else part["margin"] + part["error"]
        before = mem.view.counters()["n_block_passes"]
        mem.remove(int(pool[order.integers(len(pool))]))
        passes.append(mem.view.counters()["n_block_passes"] - before)
        assert mem.kkt_residual() <= mem.tol
    assert mem.solver_state.nS >= 16  # the working set's regime throughout
    assert max(passes) <= 3, passes


# (spacing, seed): 0.0 is exact copies; 1e-7 and 1e-8 pass the copy test. Each took 5 to
# 15 passes on one of its forgets before (the seeds where it did); (1e-8, 4) took 7 where
# a removal left a copy split out of order under tol (KKT 3.4e-13; its next forget
# then missed); (1e-7, 1) and (1e-8, 1) took 9 on their 18th forget, where removing
# error token 20 first hands its weight to its copy on the margin, which reaches C (a
# near-null first segment that predicts no token; the two checks missed 5 reserve
# tokens, then 2 more). Such a removal now predicts the working set from the second
# segment, solved in the capacitance system beside the memory's fixed inverse (the
# copy's row dropped; ``segments.handover_line``) at one more pass: the first segment's,
# the second's and the check, 3. Near-copies of margin tokens whose g sits ~1e-9 from 0
# are in the working set whichever way their g moves (``working_set.WS_NEAR``). (1e-5, 1),
# near-copies the copy test keeps apart, had the same handover on its 18th forget (9
# passes) and no other forget above 3.
CASES = [(0.0, 1), (0.0, 2), (1e-8, 0), (1e-7, 0), (1e-8, 4), (1e-8, 1), (1e-7, 1),
         (1e-5, 1)]

@pytest.mark.parametrize(("spacing", "seed"), CASES)
def test_support_forgets_beside_copies_take_at_most_three_passes(spacing, seed):
    """100 keys and a copy (or a near-copy ``spacing`` away) of each, 30 forgets of
    margin and support tokens in turn: each takes three passes or fewer, and the
    memory ends at the oracle's optimum."""
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(100, 4))
    keys = np.concatenate([X, X + spacing * rng.normal(size=X.shape)])
    mem = SVDDMemory(1 / 60, "rbf", 1.0)
    mem.extend(keys)
    order = np.random.default_rng(seed)
    passes = []
    for k in range(30):
        if mem.solver_state.nS < 16:  # (below it the path alone removes)
            break
        part = mem.partition()
        pool = part["margin"] if k % 2 == 0 else part["margin"] + part["error"]
        before = mem.view.counters()["n_block_passes"]
        mem.remove(int(pool[order.integers(len(pool))]))
        passes.append(mem.view.counters()["n_block_passes"] - before)
        assert mem.kkt_residual() <= mem.tol
    assert len(passes) >= 20
    assert max(passes) <= 3, passes


# Not fixed: near-copies the copy test does not merge (1e-6, 1e-5 apart: kernel distance
# ~1e-11 to 1e-9, above its 1e-13·(K_ii + K_jj)) can make the expansion's Schur
# complement fall below its singularity bound 1e-10·scale when one joins the margin
# beside its partner (the complement is the distance to the span of the whole margin
# set, not to the partner alone). On the path such a join is now a flat exchange with the
# margin combination (docs/design.md §3, near-copies between the copy test and the
# singularity bound): at 1e-6 none of the 30 forgets re-solves from scratch (8 did), and
# each state agrees with the oracle. The working set's round still gives up on them and
# the path takes one pass per event: forgets 4, 5, 8, 23, 24 at 1e-6 take 5-7 passes
# (a re-solve from scratch ended them after 1-5). Forget 17 (error token 20, its
# near-copy 120 on the margin) took 9 at 1e-6 and 1e-5: the handover above, now 3; seed 1
# at 1e-5 takes 3 or fewer and is among the passing cases.
REMAINING = [(1e-6, 1)]


@pytest.mark.xfail(strict=True, reason="a near-copy the copy test keeps apart whose "
                   "join beside its partner the working set's round gives up on (Schur "
                   "complement <= 1e-10·scale): the path's flat exchanges take one pass per "
                   "event, 5-7 passes (reported, not fixed)")
@pytest.mark.parametrize(("spacing", "seed"), REMAINING)
def test_support_forgets_beside_near_copies_the_copy_test_keeps_apart(spacing, seed):
    test_support_forgets_beside_copies_take_at_most_three_passes(spacing, seed)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["compiled", "reference"])
def test_support_forgets_beside_near_copies_the_copy_test_keeps_apart_never_resolve(backend):
    """The stream of ``REMAINING[0]`` (near-copies 1e-6 apart, seed 1): 8 of its 30
    forgets met a join refused as singular on the path and re-solved from scratch. A
    flat exchange with the margin combination takes each such join now: no forget
    re-solves, and the memory ends at the oracle's optimum."""
    rng = np.random.default_rng(1)
    X = rng.normal(size=(100, 4))
    keys = np.concatenate([X, X + 1e-6 * rng.normal(size=X.shape)])
    mem = SVDDMemory(1 / 60, "rbf", 1.0, backend=backend)
    mem.extend(keys)
    order = np.random.default_rng(1)
    before = mem.view.counters()["n_resolves"]
    for k in range(30):
        part = mem.partition()
        pool = part["margin"] if k % 2 == 0 else part["margin"] + part["error"]
        mem.remove(int(pool[order.integers(len(pool))]))
        assert mem.kkt_residual() <= mem.tol
    assert mem.view.counters()["n_resolves"] == before
    oc = oracle_comparison(mem, probes=None, tol=1e-9, seed=0, unique=mem.unique_optimum())
    assert not oc.reasons, oc.reasons
