"""The model's own step (``CharLM.init_state`` / ``extend`` / ``step``), and streams of the
recurrent mixers (``deltanet``, ``linear``), which stream through it like the others.

References are independent of the stream: ``exact_copy(model)(x)`` (the batched forward;
for the recurrent mixers their chunked form) and a fresh stream of the remaining text.
Tolerance 1e-9 in float64 (the recurrent step and the chunked forward differ by rounding).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from svattn.lm import CharLM, CharLMConfig
from svattn.lm.forget import verify_forget
from svattn.lm.stream import LMStream, exact_copy

TOL = 1e-9
MIXERS = {
    "softmax": {}, "sliding": {"window": 6},
    "hybrid_sv": {"chunk": 8, "C": 0.25, "policy": "full"},
    "deltanet": {"chunk_size": 16}, "linear": {"chunk_size": 16},
}
RECURRENT = ["deltanet", "linear"]


def make(mixer: str) -> CharLM:
    torch.manual_seed(0)
    model = CharLM(CharLMConfig(n_layer=2, n_embd=16, n_head=2, block_size=96, mixer=mixer,
                                mixer_options=MIXERS[mixer]))
    with torch.no_grad():
        for block in model.blocks:
            block.mix.qkv.weight.mul_(10.0)
    return model


def text_of(n: int, seed: int = 1) -> bytes:
    return bytes(np.random.default_rng(seed).integers(97, 110, n).tolist())


def reference(model: CharLM, text: bytes) -> torch.Tensor:
    return exact_copy(model)(torch.tensor(list(text))[None])[0][0]  # (T, V)


@pytest.mark.parametrize("mixer", sorted(MIXERS))
def test_the_models_step_equals_its_forward(mixer):
    model = make(mixer)
    text = text_of(30)
    ref = reference(model, text)
    ex = exact_copy(model)
    states = ex.init_state()
    out = torch.stack([ex.step(states, t) for t in text])
    assert (out - ref).abs().max() <= TOL
    states = ex.init_state()  # and in blocks: extend gives the final hidden states
    h = torch.cat([ex.extend(states, torch.tensor(list(text[a:b])))
                   for a, b in ((0, 7), (7, 8), (8, 30))])
    assert (ex.lm_head(h) - ref).abs().max() <= TOL
    assert ref.abs().max() > 0.1


def test_extend_refuses_states_of_another_model_or_position():
    model = exact_copy(make("softmax"))
    with pytest.raises(ValueError, match="states holds 1 layers, the model has 2"):
        model.extend(model.init_state()[:1], torch.tensor([1, 2]))
    states = model.init_state()
    model.blocks[0].mix.extend(states[0], torch.zeros(3, 16, dtype=torch.float64))
    with pytest.raises(ValueError, match=r"hold \[3, 0\] positions"):
        model.extend(states, torch.tensor([1]))
    with pytest.raises(ValueError, match=r"1-D tensor of token ids"):
        model.extend(model.init_state(), torch.tensor([[1]]))


@pytest.mark.parametrize("mixer", RECURRENT)
def test_a_recurrent_stream_equals_the_forward_for_any_split(mixer):
    model = make(mixer)
    text = text_of(45)
    ref = reference(model, text)
    rng = np.random.default_rng(0)
    for trial in range(2):
        s = model.stream()
        cuts = [0, *sorted(set(rng.integers(1, 45, 4).tolist())), 45] if trial else \
            list(range(46))
        out = torch.cat([s.feed(text[a:b]) for a, b in zip(cuts, cuts[1:], strict=False)])
        assert (out - ref).abs().max() <= TOL
    assert ref.abs().max() > 0.1


@pytest.mark.parametrize("span", [(0, 5), (10, 20), (40, 45), (0, 45)])
@pytest.mark.parametrize("mixer", RECURRENT)
def test_a_recurrent_forget_equals_a_fresh_stream(mixer, span):
    model = make(mixer)
    text = text_of(45)
    s = model.stream()
    s.feed(text)
    a, b = span
    receipt = s.forget(a, b).receipt
    f = model.stream()
    f.feed(text[:a] + text[b:])
    assert s.text == f.text and s.content_digest() == f.content_digest()
    if len(f):
        assert (s.all_logits() - f.all_logits()).abs().max() <= TOL
        assert (s.all_logits() - reference(model, f.text)).abs().max() <= TOL
    # the recurrent state holds no position apart: the stream replays from 0
    assert receipt.repair["kept_prefix"] == 0
    assert receipt.repair["replayed"] == 45 - (b - a)
    assert receipt.memories == [] and verify_forget(s, receipt).ok
    more = text_of(9, seed=4)
    assert (s.feed(more) - f.feed(more)).abs().max() <= TOL


@pytest.mark.parametrize("mixer", RECURRENT)
def test_a_recurrent_stream_saves_and_loads(mixer, tmp_path):
    model = make(mixer)
    s = model.stream()
    s.feed(text_of(30))
    s.forget(4, 9)
    s.save(tmp_path / "st")
    t = LMStream.load(tmp_path / "st", model)
    assert t.digest() == s.digest()
    more = text_of(7, seed=3)
    assert torch.equal(t.feed(more), s.feed(more))
    assert torch.equal(t.layers[1].S, s.layers[1].S)


@pytest.mark.parametrize("bad, words", [
    (torch.tensor([1, 256]), r"idx: token 256 at offset 1 is outside .* vocabulary of 256"),
    (torch.tensor([-1]), r"idx: token -1 at offset 0 is outside"),
    (torch.tensor([1.0, 2.0]), r"idx must be a 1-D tensor of token ids .*integer"),
])
def test_extend_refuses_tokens_outside_the_vocabulary_and_keeps_the_states(bad, words):
    model = exact_copy(make("softmax"))
    states = model.init_state()
    model.extend(states, torch.tensor([1, 2]))
    with pytest.raises(ValueError, match=words):
        model.extend(states, bad)
    with pytest.raises(ValueError, match="token 300"):
        model.step(states, 300)
    with pytest.raises(ValueError, match="token must be an int, got 1.0"):
        model.step(states, 1.0)
    assert [st.n for st in states] == [2, 2]
    assert model.step(states, np.int64(3)).shape == (256,)  # a numpy integer is an int
    states = model.init_state()
    model.extend(states, torch.tensor([1, 2]))
    assert [st.n for st in states] == [2, 2]


def test_a_model_extend_that_fails_midway_leaves_every_layer_refusing_work():
    """Layer 0 read the positions, layer 1 failed: no layer goes on alone."""
    model = exact_copy(make("hybrid_sv"))
    states = model.init_state()

    class Failing:
        def key_log_weights(self, n):
            return None

        def memory_readout(self, layer, head, queries):
            if layer is states[1]:
                raise RuntimeError("interrupted")
            return layer.mems[head].readout(queries)

    with pytest.raises(RuntimeError, match="interrupted"):
        model.extend(states, torch.tensor(list(text_of(40))), reads=Failing())
    for st in states:
        with pytest.raises(RuntimeError, match="state is unusable"):
            st.check_usable()
    with pytest.raises(RuntimeError, match="state is unusable"):
        model.extend(states, torch.tensor([1]))
