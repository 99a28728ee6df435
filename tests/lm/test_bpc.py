"""Bits per character: known distributions, every byte counted, sharding."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from torch import nn

from svattn.lm.train import evaluate_bpc


class Uniform(nn.Module):
    def forward(self, idx):
        return torch.zeros(*idx.shape, 256)


class NextIsPlusOneOrTwo(nn.Module):
    """p(next = b + 1) = p(next = b + 2) = 1/2 given current byte b."""

    def forward(self, idx):
        logits = torch.full((*idx.shape, 256), -1e9)
        logits.scatter_(-1, ((idx + 1) % 256).unsqueeze(-1), 0.0)
        logits.scatter_(-1, ((idx + 2) % 256).unsqueeze(-1), 0.0)
        return logits


@pytest.mark.parametrize("context", [1, 7, 64, 1000])
def test_uniform_is_8_bits(context):
    data = np.random.default_rng(0).integers(0, 256, 3001).astype(np.uint8)
    res = evaluate_bpc(Uniform(), data, 1000, 3001, context=context, batch_size=5)
    assert res["bpc"] == pytest.approx(8.0, abs=1e-12)
    assert res["bytes"] == 2001 and res["context"] == context  # every byte of the split
    assert res["nll_nats"] == pytest.approx(math.log(256))


def test_known_conditional_is_1_bit():
    steps = np.random.default_rng(1).integers(1, 3, 999)  # +1 or +2, fair coin
    data = (np.concatenate([[0], np.cumsum(steps)]) % 256).astype(np.uint8)
    res = evaluate_bpc(NextIsPlusOneOrTwo(), data, 100, 1000, context=16)
    assert res["bpc"] == pytest.approx(1.0, abs=1e-9)
    # The first scored byte uses the byte before the split as its context:
    # one step earlier the model would score data[100] with a wrong context.


def test_first_byte_of_corpus_is_not_scored():
    data = np.zeros(50, dtype=np.uint8)
    assert evaluate_bpc(Uniform(), data, 0, 50, context=8)["bytes"] == 49


def test_bad_range():
    with pytest.raises(ValueError, match="need 0 <= start < stop <= len"):
        evaluate_bpc(Uniform(), np.zeros(10, dtype=np.uint8), 5, 20, context=4)


class LearnsFromPosition(nn.Module):
    """Uniform at block offset 0, certain of ``next = b + 1`` from offset 1 on."""

    def forward(self, idx):
        logits = torch.full((*idx.shape, 256), -1e9)
        logits.scatter_(-1, ((idx + 1) % 256).unsqueeze(-1), 0.0)
        logits[:, 0] = 0.0
        return logits


def test_per_position_bpc():
    data = (np.arange(1001) % 256).astype(np.uint8)  # next = b + 1 always
    res = evaluate_bpc(LearnsFromPosition(), data, 1, 1001, context=8, per_position=True,
                       batch_size=7)
    assert res["bytes_by_position"] == [125] * 8  # 1000 bytes, 125 blocks of 8
    by_pos = res["bpc_by_position"]
    assert by_pos[0] == pytest.approx(8.0, abs=1e-12)
    assert max(by_pos[1:]) == pytest.approx(0.0, abs=1e-9)
    # the overall figure is the byte-weighted mean of the per-position ones
    assert res["bpc"] == pytest.approx(8.0 / 8, abs=1e-12)
    # a short last block scores fewer bytes at the later offsets
    res = evaluate_bpc(Uniform(), data, 1, 1000, context=8, per_position=True)
    assert res["bytes_by_position"] == [125] * 7 + [124]
    assert res["bpc_by_position"] == pytest.approx([8.0] * 8, abs=1e-12)
