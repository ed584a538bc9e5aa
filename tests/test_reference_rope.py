"""The RoPE references against hand-worked values and each other's definitions."""

from __future__ import annotations

import math

import pytest
import torch

from pecode.reference.rope import rope_inv_freq_loop, rope_loop, rope_matrix_loop


def test_inv_freq_hand_values():
    assert rope_inv_freq_loop(4) == [1.0, 0.01]
    with pytest.raises(ValueError, match="dim"):
        rope_inv_freq_loop(5)


def test_matrix_is_orthogonal_and_block_diagonal():
    matrix = rope_matrix_loop(3.0, 6)
    assert torch.allclose(matrix @ matrix.T, torch.eye(6, dtype=torch.float64), atol=1e-15)
    assert matrix[0, 2] == 0
    assert matrix[3, 5] == 0
    assert math.isclose(float(matrix[1, 0]), math.sin(3.0))


def test_loop_equals_matrix_times_vector_interleaved():
    x = torch.randn(4, 6, dtype=torch.float64)
    positions = torch.tensor([0, 2, 5, 11])
    want = torch.stack([rope_matrix_loop(float(m), 6) @ x[t] for t, m in enumerate(positions)])
    assert torch.allclose(rope_loop(x, positions), want, atol=1e-14)


def test_loop_errors():
    with pytest.raises(ValueError, match="layout"):
        rope_loop(torch.zeros(1, 2), torch.tensor([0]), layout="x")
    with pytest.raises(ValueError, match="positions"):
        rope_loop(torch.zeros(2, 2), torch.tensor([0]))
    with pytest.raises(ValueError, match="even"):
        rope_loop(torch.zeros(1, 3), torch.tensor([0]))
    with pytest.raises(ValueError, match="inv_freq"):
        rope_loop(torch.zeros(1, 4), torch.tensor([0]), inv_freq=[1.0])


def test_loop_with_given_frequencies_turns_pair_i_by_m_times_inv_freq_i():
    # hand-worked: pair 0 by 2 * (pi/2) = pi, pair 1 by 2 * (pi/4) = pi/2 (half layout)
    x = torch.tensor([[1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    out = rope_loop(x, torch.tensor([2]), layout="half", inv_freq=[math.pi / 2, math.pi / 4])
    assert torch.allclose(out, torch.tensor([[-1.0, 0.0, 0.0, 1.0]], dtype=torch.float64))
    # and the default frequencies are base^(-2i/d)
    default = rope_loop(x, torch.tensor([3]), layout="half")
    given = rope_loop(x, torch.tensor([3]), layout="half", inv_freq=rope_inv_freq_loop(4))
    assert torch.equal(default, given)


def test_attention_loop_with_one_token_equals_plain_attention_at_any_position():
    # One key: its softmax weight is 1 whatever the rotation, so this checks only the
    # projections and the value path of rope_attention_loop, not the rotation.
    from pecode.attention import MultiHeadAttention
    from pecode.reference import multi_head_attention_loop
    from pecode.reference.rope import rope_attention_loop

    torch.manual_seed(0)
    layer = MultiHeadAttention(8, 2).double()
    x = torch.randn(1, 1, 8, dtype=torch.float64)
    got = rope_attention_loop(layer, x, torch.tensor([7]))
    assert torch.allclose(got, multi_head_attention_loop(layer, x), atol=1e-12)


def _identity_layer(width: int):
    """One head of width ``width`` whose four projections are the identity, no biases."""
    from pecode.attention import MultiHeadAttention

    layer = MultiHeadAttention(width, 1, bias=False).double()
    with torch.no_grad():
        for linear in (layer.q_proj, layer.k_proj, layer.v_proj, layer.out_proj):
            linear.weight.copy_(torch.eye(width, dtype=torch.float64))
    return layer


def test_attention_loop_two_tokens_hand_worked_weights_depend_on_the_rotation():
    # Hand-worked, d = 2 (one pair, frequency 1): tokens x0 = (1, 0) at position 0 and
    # x1 = (0, 1) at position 1, with q = k = v = x before the rotation. RoPE leaves q0 = k0
    # = (1, 0) and turns q1 = k1 by 1 radian to (-sin 1, cos 1). So q0.k1 = q1.k0 = -sin 1
    # (0 without rotation, +sin 1 with the wrong sign) and q0.k0 = q1.k1 = 1. Because
    # v0, v1 are the unit vectors, the output of query i is its row of weights (w_i0, w_i1).
    from pecode.reference.rope import rope_attention_loop

    s = math.sin(1.0)
    scale = 1 / math.sqrt(2.0)
    w00 = 1 / (1 + math.exp((-s - 1.0) * scale))  # logits (1, -sin 1) / sqrt(2)
    w10 = 1 / (1 + math.exp((1.0 + s) * scale))  # logits (-sin 1, 1) / sqrt(2)
    want = torch.tensor([[[w00, 1 - w00], [w10, 1 - w10]]], dtype=torch.float64)
    x = torch.tensor([[[1.0, 0.0], [0.0, 1.0]]], dtype=torch.float64)
    layer = _identity_layer(2)
    for layout in ("half", "interleaved"):  # one pair: the two layouts coincide
        got = rope_attention_loop(layer, x, torch.tensor([0, 1]), layout=layout)
        assert torch.allclose(got, want, atol=1e-15), layout
        # and causal: query 0 sees only itself
        causal = rope_attention_loop(layer, x, torch.tensor([0, 1]), layout=layout, causal=True)
        want_causal = torch.tensor([[[1.0, 0.0], [w10, 1 - w10]]], dtype=torch.float64)
        assert torch.allclose(causal, want_causal, atol=1e-15)
    # the rotation matters: without it the weights would be those of logits (1, 0)/sqrt(2)
    assert abs(w00 - 1 / (1 + math.exp(-scale))) > 0.1
