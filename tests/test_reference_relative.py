"""The relative-encoding loop references themselves, against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from pecode.reference.relative import (
    deberta_scores_loop,
    shaw_attention_loop,
    t5_bucket_loop,
    transformer_xl_scores_loop,
)


def test_shaw_loop_two_tokens_by_hand():
    # one head, width 1, q = 1 for both tokens, k = 0, v = (0, 1), k_max = 1.
    # key table w^K = (-1, 0, ln 3) for offsets (-1, 0, +1); value table w^V = (10, 20, 30).
    q = torch.ones(1, 1, 2, 1)
    k = torch.zeros(1, 1, 2, 1)
    v = torch.tensor([0.0, 1.0]).view(1, 1, 2, 1)
    key_table = torch.tensor([[-1.0], [0.0], [math.log(3.0)]], dtype=torch.float64)
    value_table = torch.tensor([[10.0], [20.0], [30.0]])
    out = shaw_attention_loop(q, k, v, key_table, value_table, 1)
    # token 0: logits (0, ln 3) -> weights (1/4, 3/4); values (0 + 20, 1 + 30)
    assert out[0, 0, 0, 0].item() == pytest.approx(0.25 * 20 + 0.75 * 31, abs=1e-12)
    # token 1: logits (-1, 0) -> weights (1/(1+e), e/(1+e)); values (0 + 10, 1 + 20)
    w = 1 / (1 + math.e)
    assert out[0, 0, 1, 0].item() == pytest.approx(w * 10 + (1 - w) * 21, abs=1e-12)
    causal = shaw_attention_loop(q, k, v, key_table, value_table, 1, causal=True)
    assert causal[0, 0, 0, 0].item() == pytest.approx(20.0, abs=1e-12)


def test_shaw_loop_clips_far_offsets():
    # with k_max = 0 every pair uses the single row, so the key term is the same constant
    q = torch.ones(1, 1, 5, 1)
    k = torch.zeros(1, 1, 5, 1)
    v = torch.arange(5.0).view(1, 1, 5, 1)
    out = shaw_attention_loop(q, k, v, torch.tensor([[7.0]]), torch.tensor([[1.0]]), 0)
    assert torch.allclose(out, torch.full((1, 1, 5, 1), 3.0, dtype=torch.float64))


def test_transformer_xl_loop_by_hand():
    # zero position projection: only (a) q.k and (c) u.k remain
    q = torch.tensor([[[[1.0, 2.0]]]])
    k = torch.tensor([[[[3.0, -1.0]]]])
    u = torch.tensor([[0.5, 0.5]])
    v = torch.tensor([[9.0, 9.0]])
    out = transformer_xl_scores_loop(q, k, torch.zeros(2, 4), u, v, 4)
    assert out.item() == pytest.approx(1.0 + 1.0, abs=1e-12)
    # distance 0: R_0 = (0, 0, 1, 1); W picks R's third entry into both features
    weight = torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0, 0.0, 1.0, 0.0]])
    out = transformer_xl_scores_loop(q, k, weight, u, v, 4)
    # r = (1, 1): (b) = 3, (d) = 18
    assert out.item() == pytest.approx(2.0 + 3.0 + 18.0, abs=1e-12)


@pytest.mark.parametrize(
    ("offset", "bidirectional", "bucket"),
    [(0, True, 0), (3, True, 19), (-3, True, 3), (-16, True, 10), (200, True, 31),
     (4, False, 0), (-16, False, 16), (-20, False, 17), (-128, False, 31)],
)  # fmt: skip
def test_t5_loop_by_hand(offset, bidirectional, bucket):
    assert t5_bucket_loop(offset, bidirectional) == bucket


def test_deberta_loop_by_hand():
    # k = 1: two rows, δ(i, j) = 0 if i - j <= -1 else 1. Two tokens, width 1.
    q = torch.tensor([1.0, 2.0]).view(1, 1, 2, 1)
    k = torch.tensor([3.0, 5.0]).view(1, 1, 2, 1)
    q_rel = torch.tensor([[[10.0], [100.0]]])
    k_rel = torch.tensor([[[1.0], [-1.0]]])
    out = deberta_scores_loop(q, k, q_rel, k_rel, 1)
    # (i, j) = (0, 1): c2c 5, c2p q_0 k_rel[δ(0,1)=0] = 1, p2c k_1 q_rel[δ(1,0)=1] = 500
    assert out[0, 0, 0, 1].item() == pytest.approx(5 + 1 + 500, abs=1e-12)
    # (1, 0): c2c 6, c2p q_1 k_rel[1] = -2, p2c k_0 q_rel[0] = 30
    assert out[0, 0, 1, 0].item() == pytest.approx(6 - 2 + 30, abs=1e-12)
