"""Hypothesis: random add/remove sequences keep the memory exact."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from exact_helpers import partition_ids, retrain
from svattn.exact import SVDDMemory

DIM = 3


class MemoryMachine(RuleBasedStateMachine):
    """Adds keys drawn from a few clusters, outliers and exact duplicates; removes any id."""

    @rule(C=st.sampled_from([0.04, 0.1, 0.25, 1 / 3, 1.0]), kernel=st.sampled_from(["rbf", "exp"]))
    @precondition(lambda self: not hasattr(self, "mem"))
    def start(self, C, kernel):
        self.mem = SVDDMemory(C, kernel)
        self.keys: dict[int, np.ndarray] = {}

    @rule(
        center=st.integers(0, 3),
        offset=st.lists(st.floats(-1.5, 1.5), min_size=DIM, max_size=DIM),
        scale=st.sampled_from([0.05, 0.5, 2.0]),
    )
    @precondition(lambda self: hasattr(self, "mem"))
    def add(self, center, offset, scale):
        x = np.eye(DIM)[center % DIM] * (center - 1.5) + scale * np.asarray(offset)
        if self.mem.kernel == "exp":
            # exp(gamma |x|^2) spans 1e0..1e6 on the raw keys: a diagonal range where
            # the oracle's polish (and any fp64 solver) cannot resolve the partition
            # of the small tokens; attention keys are normalised in practice
            x = 0.5 * x
        self.keys[self.mem.add(x)] = x

    @rule(data=st.data())
    @precondition(lambda self: hasattr(self, "mem") and len(self.mem) > 0)
    def add_duplicate(self, data):
        tid = data.draw(st.sampled_from(sorted(self.keys)))
        x = self.keys[tid].copy()
        self.keys[self.mem.add(x)] = x

    @rule(data=st.data())
    @precondition(lambda self: hasattr(self, "mem") and len(self.mem) > 0)
    def remove(self, data):
        tid = data.draw(st.sampled_from(sorted(self.keys)))
        cert = self.mem.remove(tid)
        del self.keys[tid]
        assert cert.removed_id == tid
        assert cert.kkt_residual_after <= 1e-10

    @invariant()
    def kkt_holds(self):
        if hasattr(self, "mem"):
            assert self.mem.kkt_residual() <= 1e-10
            assert sorted(self.keys) == self.mem.ids

    @invariant()
    def matches_from_scratch_solve(self):
        mem = getattr(self, "mem", None)
        if mem is None or len(mem) == 0 or mem.warm:
            return
        alpha_r, mu_r = retrain(mem)
        if mem.unique_optimum():
            assert np.max(np.abs(mem.alpha - alpha_r)) <= 1e-9
            assert mem.partition() == partition_ids(mem, alpha_r)
        # the decision function is unique even when alpha is not
        q = np.linspace(-2, 2, 5)[:, None] * np.ones(DIM)
        from svattn.exact.core.kernels import kernel_diag, kernel_matrix

        K = kernel_matrix(q, mem.keys, mem.kernel, mem.gamma_value)
        ref = 2 * K @ alpha_r - kernel_diag(q, mem.kernel, mem.gamma_value) + mu_r
        scale = max(1.0, float(kernel_diag(mem.keys, mem.kernel, mem.gamma_value).max()))
        assert np.max(np.abs(mem.decision_function(q) - ref)) <= 1e-8 * scale


def _settings(max_examples: int) -> settings:
    # derandomized so CI is reproducible; no shrinking (minutes on this machine) —
    # a failure prints its whole step list, which replays as it stands
    return settings(
        max_examples=max_examples, stateful_step_count=50, deadline=None, derandomize=True,
        phases=[Phase.explicit, Phase.reuse, Phase.generate],
        suppress_health_check=[HealthCheck.too_slow],
    )


class TestMemoryMachine(MemoryMachine.TestCase):
    """The default suite's sample (issue #37): 50 sequences of up to 50 steps; on this
    seed they reach every C and both kernels and make 430 removals (7 of the full run's
    19 CPU-seconds). The full 150 sequences run under -m slow."""

    settings = _settings(max_examples=50)


@pytest.mark.slow
class TestMemoryMachineFull(MemoryMachine.TestCase):
    settings = _settings(max_examples=150)
