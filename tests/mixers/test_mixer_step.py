"""The incremental-inference contract: every streaming mixer's ``init_state`` / ``extend`` /
``step`` equals its own full forward, however the sequence is split.

Tolerance 1e-9 in float64 for every mixer. The softmax family's incremental form runs
the same softmax over the same keys (rounding differs only in the kernel's blocking);
the hybrid's forward runs in ``mode="exact"`` (its ``stream_settings``: float64 exact
solves of every boundary, as its state's incremental memories solve them); the recurrent
mixers' step is their token-by-token recurrence, algebraically equal to the chunked form
their forward runs (the two differ by rounding only, ~1e-16 here).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from svattn.mixers import MIXERS, SequenceMixer, SoftmaxAttention
from svattn.mixers.state import MixerState

TOL = 1e-9
HYB = {"chunk": 4, "C": 0.25, "policy": "full", "gate_init": 0.5}
CASES = {  # name: (mixer, options)
    "softmax": ("softmax", {}),
    "softmax-rope": ("softmax", {"rope": True}),
    "sliding": ("sliding", {"window": 5}),
    "sliding-rope": ("sliding", {"window": 5, "rope": True}),
    "hybrid_sv": ("hybrid_sv", HYB),
    "hybrid_sv-rope-lookback-exp": ("hybrid_sv",
                                    {**HYB, "rope": True, "lookback": 2, "kernel": "exp"}),
    "hybrid_sv-support": ("hybrid_sv", {**HYB, "policy": "support", "budget": 4}),
    "deltanet": ("deltanet", {"chunk_size": 8}),
    "linear": ("linear", {"chunk_size": 8}),
}


def build(case: str) -> SequenceMixer:
    name, opts = CASES[case]
    torch.manual_seed(0)
    mix = MIXERS[name](d_model=16, n_heads=2, **opts).double().eval()
    with torch.no_grad():
        mix.qkv.weight.mul_(5.0)  # sharper attention than at init: splits matter
    for attr, value in mix.stream_settings(full_policy=True).items():
        setattr(mix, attr, value)
    return mix


def test_every_mixer_streams():
    assert sorted(n for n, cls in MIXERS.items() if cls.can_stream()) == sorted(MIXERS)
    assert {CASES[c][0] for c in CASES} == set(MIXERS)  # every one is held below


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_a_streaming_mixer_implements_the_contract(name):
    cls = MIXERS[name]
    assert cls.can_stream()
    for method in ("init_state", "mix_extend"):
        assert getattr(cls, method) is not getattr(SequenceMixer, method), method


@pytest.mark.parametrize("case", sorted(CASES))
def test_extend_equals_the_full_forward_for_any_split(case):
    mix = build(case)
    T = 23
    x = torch.randn(T, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        ref = mix(x[None])[0]  # (T, D)
        rng = np.random.default_rng(0)
        for trial in range(3):
            state = mix.init_state()
            assert isinstance(state, MixerState) and state.n == 0
            if trial == 0:  # one position at a time, through step
                out = torch.stack([mix.step(state, x[t]) for t in range(T)])
            else:
                cuts = [0, *sorted(set(rng.integers(1, T, 4).tolist())), T]
                out = torch.cat([mix.extend(state, x[a:b]) for a, b in zip(cuts, cuts[1:],
                                                                           strict=False)])
            assert state.n == T
            assert out.shape == ref.shape and out.dtype == torch.float64
            assert (out - ref).abs().max() <= TOL
    assert ref.abs().max() > 0.05  # not a trivially small output


@pytest.mark.parametrize("case", ["softmax-rope", "hybrid_sv", "deltanet", "linear"])
def test_rewind_to_a_rewind_point_equals_a_fresh_state(case):
    mix = build(case)
    x = torch.randn(19, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        state = mix.init_state()
        mix.extend(state, x)
        a = state.rewind_point(11)
        assert a in (0, 11)  # a KV cache or memory keeps every position; a recurrent state none
        state.rewind(a)
        assert state.n == a
        fresh = mix.init_state()
        if a:
            mix.extend(fresh, x[:a])
        y = torch.randn(5, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
        assert (mix.extend(state, y) - mix.extend(fresh, y)).abs().max() <= TOL


@pytest.mark.parametrize("bad, words", [
    (torch.zeros(3, 15, dtype=torch.float64), "[m, D] with D = 16"),
    (torch.zeros(1, 3, 16, dtype=torch.float64), "[m, D]"),
    ("x", "[m, D]"),
])
def test_extend_refuses_bad_input_and_keeps_the_state(bad, words):
    mix = build("hybrid_sv")
    state = mix.init_state()
    mix.extend(state, torch.randn(6, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match=words.replace("[", r"\[").replace("]", r"\]")):
        mix.extend(state, bad)
    assert state.n == 6 and state.absorbed == 4


def test_step_refuses_anything_but_one_position():
    mix = build("softmax")
    state = mix.init_state()
    for bad in (torch.zeros(15, dtype=torch.float64), torch.zeros(1, 16, dtype=torch.float64)):
        with pytest.raises(ValueError, match=r"layout \[D\] with D = 16"):
            mix.step(state, bad)
    assert state.n == 0


class _Reversed(SoftmaxAttention):
    """A subclass that changes ``mix`` without declaring an incremental form."""

    def mix(self, x):
        return super().mix(x.flip(1)).flip(1)


def test_a_mixer_that_changes_mix_does_not_inherit_the_incremental_form():
    mix = _Reversed(16, 2)
    assert SoftmaxAttention.can_stream() and not _Reversed.can_stream()
    for call in (mix.init_state, mix.stream_settings):
        with pytest.raises(ValueError, match="_Reversed is not streamed"):
            call()


def test_the_support_policy_streams_only_under_its_full_settings():
    name, opts = CASES["hybrid_sv-support"]
    mix = MIXERS[name](d_model=16, n_heads=2, **opts)
    with pytest.raises(ValueError, match="full_policy=True"):
        mix.stream_settings()
    with pytest.raises(ValueError, match="policy='full' only"):
        mix.init_state()
    assert mix.stream_settings(full_policy=True) == {"mode": "exact", "policy": "full"}


class _FailingReads:
    """A ``reads`` hook (the stream's way in) whose memory readout fails: an extend
    interrupted after the state took the positions in (as a KeyboardInterrupt would)."""

    def key_log_weights(self, n):
        return None

    def memory_readout(self, layer, head, queries):
        raise RuntimeError("interrupted")


def test_an_extend_that_fails_midway_leaves_a_state_that_refuses_work():
    """The cache took the positions and a memory may have absorbed a chunk before the
    failure: the state is not the one before, so it refuses every later extend and
    rewind (as LMStream does) instead of going on with positions whose outputs were
    never returned."""
    mix = build("hybrid_sv")
    x = torch.randn(12, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    state = mix.init_state()
    mix.extend(state, x[:4])
    with pytest.raises(RuntimeError, match="interrupted"):
        mix.extend(state, x[4:8], reads=_FailingReads())
    for again in (lambda: mix.extend(state, x[4:8]), lambda: mix.step(state, x[4]),
                  lambda: state.rewind(0)):
        with pytest.raises(RuntimeError, match="state is unusable: an extend failed midway "
                                               r"\(RuntimeError: interrupted\)"):
            again()


@pytest.mark.parametrize("case", ["softmax", "hybrid_sv", "deltanet"])
def test_extend_refuses_rows_of_another_dtype_and_keeps_the_state(case):
    mix = build(case)  # float64
    state = mix.init_state()
    mix.extend(state, torch.randn(5, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match="x must have dtype torch.float64.*got torch.float32"):
        mix.extend(state, torch.randn(3, 16))
    assert state.n == 5
    assert mix.extend(state, torch.randn(3, 16, dtype=torch.float64)).shape == (3, 16)


@pytest.mark.parametrize("case", ["deltanet", "linear"])
def test_a_recurrent_state_is_updated_in_place_so_no_earlier_state_is_left_behind(case):
    """The recurrent state after a span holds that span's contribution: each extend
    writes the new state into the same tensors (a rewind zeroes them), so no earlier
    state is left in a tensor the state let go of."""
    mix = build(case)
    state = mix.init_state()
    held = [t.data_ptr() for t in state.arrays().values()]
    torch.manual_seed(1)
    for m in (3, 5, 1):
        mix.extend(state, torch.randn(m, 16, dtype=torch.float64))
        assert [t.data_ptr() for t in state.arrays().values()] == held
    assert all(t.abs().sum() > 0 for t in state.arrays().values())
    state.rewind(0)
    assert [t.data_ptr() for t in state.arrays().values()] == held
    assert all(t.abs().sum() == 0 for t in state.arrays().values())
