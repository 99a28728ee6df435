"""The SVDD order of one head's keys: the fast path against the oracle, and its contract."""

from __future__ import annotations

import numpy as np
import pytest

from svattn.press import rank_head, rank_head_reference, svdd_box


def _keys(n=80, d=8, seed=0):
    rng = np.random.default_rng(seed)
    return rng.normal(size=(n, d)) @ rng.normal(size=(d, d)) * 0.5 + rng.normal(size=d)


@pytest.mark.parametrize("nu", [0.125, 0.5, 0.75])
def test_fast_order_matches_the_oracle(nu):
    X = _keys()
    fast, ref = rank_head(X, nu=nu), rank_head_reference(X, nu=nu)
    assert fast.C == ref.C and fast.gamma == ref.gamma
    np.testing.assert_array_equal(fast.support, ref.support)
    np.testing.assert_allclose(fast.alpha, ref.alpha, atol=1e-9)
    # the support's order (by alpha, then Kα) is the same; so is the reserve's top
    np.testing.assert_array_equal(np.argsort(-fast.score)[: fast.support.sum()],
                                  np.argsort(-ref.score)[: ref.support.sum()])


def test_scores_rank_every_key_once_with_the_support_on_top():
    X = _keys(n=60)
    r = rank_head(X, nu=0.25)
    np.testing.assert_array_equal(np.sort(r.score), np.arange(60.0))
    assert r.support.sum() >= np.ceil(0.25 * 60)
    assert r.score[r.support].min() > r.score[~r.support].max()
    assert np.all(r.alpha[~r.support] == 0.0)
    np.testing.assert_allclose(r.alpha.sum(), 1.0, atol=1e-12)


def test_rare_keys_far_from_a_repeated_cluster_are_kept_first():
    rng = np.random.default_rng(1)
    common = rng.normal(size=(4, 16))
    X = common[rng.integers(4, size=120)] + 0.05 * rng.normal(size=(120, 16))
    rare_at = [7, 50, 99]
    X[rare_at] = 3.0 * rng.normal(size=(3, 16))
    r = rank_head(X, nu=0.1)
    top = set(np.argsort(-r.score)[:3].tolist())
    assert top == set(rare_at)


def test_equal_keys_get_distinct_ranks():
    X = np.repeat(_keys(n=10), 3, axis=0)  # every key three times
    r = rank_head(X, nu=0.5)
    assert len(np.unique(r.score)) == len(X)


@pytest.mark.parametrize("nu", [0.0, 1.5, -0.1, float("nan"), "0.5"])
def test_nu_outside_its_range_is_refused(nu):
    with pytest.raises(ValueError, match="nu must be"):
        rank_head(_keys(), nu=nu)


def test_keys_of_the_wrong_shape_are_refused():
    with pytest.raises(ValueError, match="keys must have shape"):
        rank_head(np.zeros(5), nu=0.5)
    with pytest.raises(ValueError, match="finite"):
        rank_head(np.full((4, 2), np.nan), nu=0.5)


def test_box_is_one_over_nu_n():
    assert svdd_box(200, 0.5) == pytest.approx(0.01)
    with pytest.raises(ValueError, match="at least one key"):
        svdd_box(0, 0.5)


def test_asking_for_a_press_without_kvpress_says_what_to_install():
    pytest.importorskip("numpy")
    try:
        import kvpress  # noqa: F401
    except ImportError:
        import svattn.press

        with pytest.raises(ImportError, match=r"\.\[press\]"):
            svattn.press.SVDDPress  # noqa: B018
    else:
        pytest.skip("kvpress is installed here: the message is for environments without it")
