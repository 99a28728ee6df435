"""The SVDD presses in kvpress's contract, on a small random Llama built here (no download).

Needs the ``press`` extra (kvpress, transformers); skipped without it, so ``make test``
needs no extra dependency.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip(
    "transformers", reason="the press extra is not installed (pip install -e '.[press]')")
kvpress = pytest.importorskip(
    "kvpress", reason="the press extra is not installed (pip install -e '.[press]')")

from svattn.press import SVDDPress, SVDDThresholdPress, rank_head  # noqa: E402

T = 48  # context tokens


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=97, hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4,
                                   num_key_value_heads=2, max_position_embeddings=256)
    cfg._attn_implementation = "sdpa"
    return transformers.LlamaForCausalLM(cfg).eval()


@pytest.fixture(scope="module")
def ids():
    return torch.randint(0, 97, (1, T), generator=torch.Generator().manual_seed(1))


def _prefill(model, ids, press=None):
    cache = transformers.DynamicCache()
    with torch.no_grad():
        if press is None:
            model.model(input_ids=ids, past_key_values=cache)
        else:
            with press(model):
                model.model(input_ids=ids, past_key_values=cache)
    return cache


def test_svdd_press_is_a_kvpress_scorer_press():
    assert isinstance(SVDDPress(compression_ratio=0.5), kvpress.ScorerPress)


def test_score_has_the_contract_shape_and_ranks_every_key(model, ids):
    full = _prefill(model, ids)
    keys = full.layers[0].keys  # (1, 2, T, 16)
    scores = SVDDPress(compression_ratio=0.5).score(None, None, keys, None, None, {})
    assert scores.shape == (1, 2, T)
    for h in range(2):
        np.testing.assert_array_equal(np.sort(scores[0, h].numpy()), np.arange(T))


@pytest.mark.parametrize("ratio", [0.25, 0.5, 0.875])
def test_prefill_keeps_each_heads_top_svdd_keys(model, ids, ratio):
    full = _prefill(model, ids)
    kept = _prefill(model, ids, SVDDPress(compression_ratio=ratio))
    n_kept = T - int(T * ratio)
    for layer in range(2):
        k_full, k_kept = full.layers[layer].keys, kept.layers[layer].keys
        assert k_kept.shape == (1, 2, n_kept, 16)
        for h in range(2):
            r = rank_head(k_full[0, h].double().numpy(), nu=1 - ratio)
            want = set(np.argsort(-r.score)[:n_kept].tolist())
            got = {int(np.flatnonzero((k_full[0, h] == row).all(-1))[0]) for row in k_kept[0, h]}
            assert got == want


def test_hooks_are_removed_on_leaving_the_context(model, ids):
    press = SVDDPress(compression_ratio=0.5)
    with press(model):
        pass
    assert _prefill(model, ids).layers[0].keys.shape[2] == T


def test_ratio_outside_zero_one_is_refused():
    with pytest.raises(ValueError, match="compression_ratio"):
        SVDDPress(compression_ratio=1.0)
    with pytest.raises(ValueError, match="nu must be"):
        SVDDPress(compression_ratio=0.5, nu=0.0)


def test_threshold_press_masks_exactly_the_reserve(model, ids):
    press = SVDDThresholdPress(nu=0.5)
    cache = _prefill(model, ids, press)
    for layer in model.model.layers:
        attn = layer.self_attn
        keys = cache.layers[attn.layer_idx].keys
        b, h, t = attn.masked_key_indices
        for head in range(2):
            r = rank_head(keys[0, head].double().numpy(), nu=0.5)
            masked = set(t[h == head].tolist())
            assert masked == set(np.flatnonzero(~r.support).tolist())
            assert r.support.sum() >= T * 0.5
    assert 0.0 < press.compression_ratio <= 0.5
    # decoding reads the mask (kvpress's patched attention puts zero-weight fake keys at
    # the masked positions): the next token's logits differ from the full cache's
    nxt, pos = torch.tensor([[5]]), torch.tensor([[T]])
    with torch.no_grad():
        masked_logits = model(input_ids=nxt, past_key_values=cache, position_ids=pos).logits
        full_logits = model(input_ids=nxt, past_key_values=_prefill(model, ids),
                            position_ids=pos).logits
    assert torch.isfinite(masked_logits).all()
    assert not torch.allclose(masked_logits, full_logits, atol=1e-4)
