"""The loop reference itself, against numbers worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from pecode.attention import MultiHeadAttention
from pecode.reference import multi_head_attention_loop


def identity_layer(dim: int, heads: int) -> MultiHeadAttention:
    layer = MultiHeadAttention(dim, heads, bias=False).double()
    with torch.no_grad():
        for projection in (layer.q_proj, layer.k_proj, layer.v_proj, layer.out_proj):
            projection.weight.copy_(torch.eye(dim))
    return layer


def test_two_tokens_by_hand():
    # one head, width 1: x = (1, 2); logits q_i k_j / 1 = x_i x_j
    layer = identity_layer(1, 1)
    x = torch.tensor([[[1.0], [2.0]]], dtype=torch.float64)
    out = multi_head_attention_loop(layer, x)
    # token 0: logits (1, 2); token 1: logits (2, 4)
    w0 = math.exp(2) / (math.exp(1) + math.exp(2))
    w1 = math.exp(4) / (math.exp(2) + math.exp(4))
    expected = torch.tensor([[[1 + w0], [1 + w1]]], dtype=torch.float64)
    assert torch.allclose(out, expected, atol=1e-15)
    causal = multi_head_attention_loop(layer, x, causal=True)
    assert causal[0, 0, 0].item() == 1.0  # the first token sees only itself
    assert causal[0, 1, 0].item() == pytest.approx(1 + w1, abs=1e-15)


def test_bias_shifts_weights_by_exp_bias():
    # zero queries make every logit 0; a bias b = ln 3 on key 1 then gives key 1 the
    # weight 3 / (1 + 3). Values are the inputs (0, 1), so the output is that weight.
    layer = identity_layer(1, 1)
    with torch.no_grad():
        layer.q_proj.weight.zero_()
    x = torch.tensor([[[0.0], [1.0]]], dtype=torch.float64)
    bias = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]], dtype=torch.float64)
    out = multi_head_attention_loop(layer, x, bias=bias)
    assert out[0, 0, 0].item() == pytest.approx(0.75, abs=1e-15)
    assert out[0, 1, 0].item() == pytest.approx(0.5, abs=1e-15)


def test_reference_rejects_bad_shapes():
    layer = identity_layer(2, 1)
    with pytest.raises(ValueError, match="x must have shape"):
        multi_head_attention_loop(layer, torch.zeros(1, 3, 3))
    with pytest.raises(ValueError, match="bias must have shape"):
        multi_head_attention_loop(layer, torch.zeros(1, 3, 2), bias=torch.zeros(3, 3))


def test_value_bias_by_hand():
    # zero queries: uniform weights 1/2 over two keys; the output adds the mean of r_ij
    layer = identity_layer(1, 1)
    with torch.no_grad():
        layer.q_proj.weight.zero_()
    x = torch.tensor([[[0.0], [1.0]]], dtype=torch.float64)
    value_bias = torch.tensor([[[2.0], [4.0]], [[0.0], [-2.0]]], dtype=torch.float64)
    out = multi_head_attention_loop(layer, x, value_bias=value_bias)
    assert out[0, 0, 0].item() == pytest.approx(0.5 + 3.0, abs=1e-15)
    assert out[0, 1, 0].item() == pytest.approx(0.5 - 1.0, abs=1e-15)
    with pytest.raises(ValueError, match="value_bias must have shape"):
        multi_head_attention_loop(layer, x, value_bias=torch.zeros(2, 2, 2))
