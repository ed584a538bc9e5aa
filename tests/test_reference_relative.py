"""The relative-encoding loop references themselves, against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from pecode.reference.relative import (
    deberta_log_bucket_loop,
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
    # one query after two keys: it sits at position 1, so key 0 is at distance 1 and key 1
    # at distance 0; r_d = (cos d, cos d): (b) + (d) = 21 cos d
    keys = torch.tensor([[3.0, -1.0], [0.0, 0.0]]).view(1, 1, 2, 2)
    out = transformer_xl_scores_loop(q, keys, weight, u, v, 4)
    assert out.shape == (1, 1, 1, 2)
    assert out[0, 0, 0, 0].item() == pytest.approx(2.0 + 21 * math.cos(1.0), abs=1e-12)
    assert out[0, 0, 0, 1].item() == pytest.approx(21.0, abs=1e-12)


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
    paper = deberta_scores_loop(q, k, q_rel, k_rel, 1, p2c_index="paper")
    # (i, j) = (0, 1): c2c 5, c2p q_0 k_rel[δ(0,1)=0] = 1, p2c k_1 q_rel[δ(1,0)=1] = 500
    assert paper[0, 0, 0, 1].item() == pytest.approx(5 + 1 + 500, abs=1e-12)
    # (1, 0): c2c 6, c2p q_1 k_rel[1] = -2, p2c k_0 q_rel[δ(0,1)=0] = 30
    assert paper[0, 0, 1, 0].item() == pytest.approx(6 - 2 + 30, abs=1e-12)
    released = deberta_scores_loop(q, k, q_rel, k_rel, 1)  # p2c reads δ(i, j) like c2p
    # (0, 1): p2c k_1 q_rel[δ(0,1)=0] = 50; (1, 0): p2c k_0 q_rel[δ(1,0)=1] = 300
    assert released[0, 0, 0, 1].item() == pytest.approx(5 + 1 + 50, abs=1e-12)
    assert released[0, 0, 1, 0].item() == pytest.approx(6 - 2 + 300, abs=1e-12)
    with pytest.raises(ValueError, match="p2c_index"):
        deberta_scores_loop(q, k, q_rel, k_rel, 1, p2c_index="code")


# position_buckets 8 (m = 4), max_distance 32: exact up to 4, then
# 4 + ceil(3 ln(n / 4) / ln(31 / 4)): 5..7 -> 5, 8..15 -> 6, 16..31 -> 7, 32 -> 8,
# 1000 -> 4 + ceil(3 ln 250 / ln 7.75) = 4 + ceil(8.09) = 13
LOG_BUCKETS = {
    0: 0, 1: 1, 4: 4, -4: -4, 5: 5, 7: 5, 8: 6, 15: 6, 16: 7, 31: 7, 32: 8,
    -5: -5, -16: -7, -31: -7, -32: -8, 1000: 13, -1000: -13,
}  # fmt: skip


@pytest.mark.parametrize(("offset", "bucket"), list(LOG_BUCKETS.items()))
def test_deberta_log_bucket_loop_by_hand(offset, bucket):
    assert deberta_log_bucket_loop(offset, 8, 32) == bucket


def test_deberta_loop_with_buckets_by_hand():
    # b = 8, max_distance 32; one head of width 1, q = 1, k = 0: only c2p is left, and it
    # reads row clamp(bucket(i - j) + 8, 0, 15) of k_rel, which holds the row number
    length = 40
    q = torch.ones(1, 1, length, 1)
    k = torch.zeros(1, 1, length, 1)
    rows = torch.arange(16.0).view(1, 16, 1)
    out = deberta_scores_loop(q, k, torch.zeros(1, 16, 1), rows, 32, position_buckets=8)
    for offset, bucket in LOG_BUCKETS.items():
        if abs(offset) < length and offset >= 0:
            assert out[0, 0, offset, 0].item() == min(max(bucket + 8, 0), 15)
        elif abs(offset) < length:
            assert out[0, 0, 0, -offset].item() == min(max(bucket + 8, 0), 15)
