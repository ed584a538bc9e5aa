"""RotaryEmbedding with a long-context scaling kind: tables, attention factor, dynamic length."""

from __future__ import annotations

import pytest
import torch

from pecode.attention import MultiHeadAttention
from pecode.reference.rope import rope_loop
from pecode.reference.scaling import dynamic_inv_freq_loop, yarn_inv_freq_code_loop
from pecode.rope import RotaryEmbedding, apply_rope, rope_cos_sin

F64 = torch.float64


def test_no_scaling_is_unchanged():
    plain = RotaryEmbedding(16, dtype=F64)
    default = RotaryEmbedding(16, dtype=F64, scaling="default")
    positions = torch.arange(50)
    for a, b in zip(plain.cos_sin(positions), default.cos_sin(positions), strict=True):
        assert torch.equal(a, b)


def test_linear_scaling_rotates_like_divided_positions():
    rope = RotaryEmbedding(8, dtype=F64, scaling="linear", scaling_params={"factor": 4.0})
    x = torch.randn(1, 2, 12, 8, dtype=F64)
    positions = torch.arange(12)
    # the loop reference at positions m / 4 with the default frequencies
    expected = rope_loop(x, positions.to(F64) / 4, layout="half")
    assert torch.allclose(rope.rotate(x, positions), expected, atol=1e-12)


def test_yarn_tables_carry_the_attention_factor_and_logits_scale_by_its_square():
    params = {"factor": 4.0, "original_max_position_embeddings": 64}
    rope = RotaryEmbedding(32, dtype=F64, scaling="yarn", scaling_params=params)
    inv_freq = yarn_inv_freq_code_loop(32, 10000.0, 4.0, 64)
    cos, sin = rope_cos_sin(torch.arange(100), inv_freq)
    factor = 0.1 * torch.log(torch.tensor(4.0, dtype=F64)) + 1
    got_cos, got_sin = rope.cos_sin(torch.arange(100))
    assert torch.allclose(got_cos, cos * factor, atol=1e-12)
    assert torch.allclose(got_sin, sin * factor, atol=1e-12)
    q, k = torch.randn(2, 1, 1, 10, 32, dtype=F64)
    positions = torch.arange(10)
    scaled = rope.rotate(q, positions) @ rope.rotate(k, positions).transpose(-1, -2)
    unit = apply_rope(q, cos[:10], sin[:10]) @ apply_rope(k, cos[:10], sin[:10]).transpose(-1, -2)
    assert torch.allclose(scaled, unit * factor**2, atol=1e-10)


def test_dynamic_rebuilds_past_the_trained_length_and_goes_back():
    params = {"factor": 2.0, "original_max_position_embeddings": 32}
    rope = RotaryEmbedding(16, dtype=F64, scaling="dynamic", scaling_params=params)
    plain = RotaryEmbedding(16, dtype=F64)
    short = torch.arange(20)
    assert torch.equal(rope.cos_sin(short)[0], plain.cos_sin(short)[0])
    long = torch.arange(100)
    cos, _ = rope.cos_sin(long)
    expected, _ = rope_cos_sin(long, dynamic_inv_freq_loop(16, 10000.0, 2.0, 32, 100))
    assert torch.allclose(cos, expected, atol=1e-12)
    assert torch.equal(rope.cos_sin(short)[0], plain.cos_sin(short)[0])  # back to default


def test_scaled_rope_inside_attention_runs():
    rope = RotaryEmbedding(8, scaling="ntk", scaling_params={"factor": 8.0})
    layer = MultiHeadAttention(embed_dim=16, num_heads=2, position=rope)
    out = layer(torch.randn(2, 7, 16), causal=True)
    assert out.shape == (2, 7, 16)
    assert bool(torch.isfinite(out).all())


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"scaling": "bogus"}, ValueError, "accepted kinds"),
        ({"scaling": "linear"}, ValueError, "missing \\['factor'\\]"),
        ({"scaling_params": {"factor": 2.0}}, ValueError, "without a scaling kind"),
        ({"scaling": "linear", "scaling_params": {"factor": 2.0, "x": 1}}, ValueError, "accepts"),
    ],
)
def test_bad_scaling_raises(kwargs, error, message):
    with pytest.raises(error, match=message):
        RotaryEmbedding(8, **kwargs)
