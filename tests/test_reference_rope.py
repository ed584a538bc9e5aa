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


def test_attention_loop_at_position_zero_only_matches_plain_attention_for_one_token():
    # With a single token, rotation changes q·k only by a common factor: output = value path.
    from pecode.attention import MultiHeadAttention
    from pecode.reference import multi_head_attention_loop
    from pecode.reference.rope import rope_attention_loop

    torch.manual_seed(0)
    layer = MultiHeadAttention(8, 2).double()
    x = torch.randn(1, 1, 8, dtype=torch.float64)
    got = rope_attention_loop(layer, x, torch.tensor([7]))
    assert torch.allclose(got, multi_head_attention_loop(layer, x), atol=1e-12)
