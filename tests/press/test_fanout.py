"""One prefill serving many presses (``FanOutPress``) equals each press run alone.

For every press the evaluation (benchmarks/press_ruler.py) uses, at each of its ratios,
on a small random Llama built here: the fan-out keeps bit for bit the cache that
``with press(model):`` leaves, and greedy decoding from the fan-out's batched caches
emits the tokens that decoding from the press's own cache emits.

Needs the ``press`` extra (kvpress, transformers); skipped without it.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip(
    "transformers", reason="the press extra is not installed (pip install -e '.[press]')")
kvpress = pytest.importorskip(
    "kvpress", reason="the press extra is not installed (pip install -e '.[press]')")

from svattn.press import SVDDPress  # noqa: E402
from svattn.press.fanout import FanOutPress, rows_cache  # noqa: E402

T = 112  # context tokens (SnapKV's default window is 64 of them)
RATIOS = (0.25, 0.5, 0.75, 0.875)
SEED = 7  # torch's global generator before each prefill (the leverage press draws on it)
STEPS = 6  # greedy tokens decoded after the question


def evaluated(ratio: float = 0.0) -> dict:
    """The presses of the evaluation, as benchmarks/press_ruler.py builds them."""
    return {"svdd": SVDDPress(compression_ratio=ratio, nu=0.5),
            "snapkv": kvpress.SnapKVPress(compression_ratio=ratio),
            "tova": kvpress.TOVAPress(compression_ratio=ratio),
            "h2o_observed": kvpress.ObservedAttentionPress(compression_ratio=ratio),
            "knorm": kvpress.KnormPress(compression_ratio=ratio),
            "leverage": kvpress.LeverageScorePress(compression_ratio=ratio),
            "random": kvpress.RandomPress(compression_ratio=ratio, seed=0)}


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    # head_dim 64 (SmolLM2's), above the leverage press's sketch of 48: its draws matter
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=256, intermediate_size=256,
                                   num_hidden_layers=3, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=256)
    cfg._attn_implementation = "eager"  # the attentions H2O and TOVA read
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def ids():
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, 97, (1, T), generator=g), torch.randint(0, 97, (1, 4), generator=g)


@torch.no_grad()
def greedy(model, cache, question, n_context: int, steps: int = STEPS) -> torch.Tensor:
    """Greedy tokens after ``question`` from a (batched) cache of an ``n_context`` prefill."""
    rows = cache.layers[0].keys.shape[0]
    nxt, pos, out = question.expand(rows, -1), n_context, []
    for _ in range(steps):
        positions = torch.arange(pos, pos + nxt.shape[1]).expand(rows, -1)
        logits = model(input_ids=nxt, past_key_values=cache, position_ids=positions).logits
        nxt = logits[:, -1:].argmax(-1)
        pos += positions.shape[1]
        out.append(nxt)
    return torch.cat(out, dim=1)


@pytest.fixture(scope="module")
def fanned(model, ids):
    ctx, _ = ids
    fan = FanOutPress(evaluated(), RATIOS)
    full = transformers.DynamicCache()
    torch.manual_seed(SEED)
    with torch.no_grad(), fan(model):
        model.model(input_ids=ctx, past_key_values=full)
    return fan, full


@pytest.mark.parametrize("name", list(evaluated()))
def test_fanout_keeps_the_cache_and_greedy_tokens_of_each_press_run_alone(model, ids, fanned,
                                                                          name):
    ctx, question = ids
    fan, _ = fanned
    for ratio in RATIOS:
        alone = transformers.DynamicCache()
        torch.manual_seed(SEED)
        with torch.no_grad(), evaluated(ratio)[name](model):
            model.model(input_ids=ctx, past_key_values=alone)
        kept = fan.kept[(name, ratio)]
        assert len(kept) == len(alone) == 3
        for layer in range(3):
            assert alone.layers[layer].keys.shape[2] == T - int(T * ratio)
            assert torch.equal(kept[layer][0], alone.layers[layer].keys), (ratio, layer)
            assert torch.equal(kept[layer][1], alone.layers[layer].values), (ratio, layer)
        # the evaluation decodes every press of one ratio as one batch
        names = list(evaluated())
        batched = greedy(model, rows_cache([fan.kept[(m, ratio)] for m in names]), question, T)
        assert torch.equal(batched[names.index(name)], greedy(model, alone, question, T)[0])


def test_fanout_leaves_the_models_cache_full(fanned, model, ids):
    _, full = fanned
    alone = transformers.DynamicCache()
    with torch.no_grad():
        model.model(input_ids=ids[0], past_key_values=alone)
    for layer in range(3):
        assert torch.equal(full.layers[layer].keys, alone.layers[layer].keys)
    assert set(fanned[0].seconds) == set(evaluated())


def test_fanout_gives_each_press_the_global_generator_it_would_see_alone(model, ids, fanned):
    """Without the per-press generator state, a second leverage press in the same fan-out
    would draw the sketches after the first one's and keep other keys."""
    fan = FanOutPress({"a": kvpress.LeverageScorePress(), "b": kvpress.LeverageScorePress()},
                      (0.5,))
    torch.manual_seed(SEED)
    with torch.no_grad(), fan(model):
        model.model(input_ids=ids[0], past_key_values=transformers.DynamicCache())
    for layer in range(3):
        assert torch.equal(fan.kept[("a", 0.5)][layer][0], fan.kept[("b", 0.5)][layer][0])
        assert torch.equal(fan.kept[("a", 0.5)][layer][0],
                           fanned[0].kept[("leverage", 0.5)][layer][0])


def test_a_press_whose_score_follows_the_ratio_is_refused():
    with pytest.raises(ValueError, match="nu=None"):
        FanOutPress({"svdd": SVDDPress(compression_ratio=0.5)}, (0.5,))
    with pytest.raises(ValueError, match="ScorerPress"):
        FanOutPress({"x": object()}, (0.5,))
    with pytest.raises(ValueError, match="ratios"):
        FanOutPress({"k": kvpress.KnormPress()}, (1.0,))


def test_rows_of_different_lengths_are_refused():
    a = {0: (torch.zeros(1, 2, 5, 4), torch.zeros(1, 2, 5, 4))}
    b = {0: (torch.zeros(1, 2, 4, 4), torch.zeros(1, 2, 4, 4))}
    with pytest.raises(ValueError, match=r"per_row\[1\] layer 0"):
        rows_cache([a, b])
