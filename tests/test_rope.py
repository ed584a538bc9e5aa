"""pecode.rope against the float64 loop references, plus its properties and its errors."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pecode.attention import MultiHeadAttention, forward_in_chunks
from pecode.bench import peak_tensor_memory
from pecode.reference.rope import (
    rope_attention_loop,
    rope_inv_freq_loop,
    rope_loop,
    rope_matrix_loop,
)
from pecode.rope import (
    RotaryEmbedding,
    apply_partial_rope,
    apply_rope,
    apply_rope_complex,
    apply_rope_matrix,
    apply_rope_rotate_half,
    convert_qk_weight_layout,
    layout_permutation,
    rope_cos_sin,
    rope_inv_freq,
    rope_rotation_matrix,
    rotate_half,
)

LAYOUTS = ["half", "interleaved"]


def rotate(x, positions, layout, base=10000.0):
    inv_freq = rope_inv_freq(x.shape[-1], base, dtype=torch.float64)
    cos, sin = rope_cos_sin(positions, inv_freq)
    return apply_rope(x, cos, sin, layout=layout)


# --- rope_inv_freq ---------------------------------------------------------------------


@pytest.mark.parametrize(("dim", "base"), [(2, 10000.0), (8, 10000.0), (64, 500000.0)])
def test_inv_freq_matches_paper_formula(dim, base):
    got = rope_inv_freq(dim, base)
    assert got.dtype == torch.float32
    assert got.shape == (dim // 2,)
    want = torch.tensor(rope_inv_freq_loop(dim, base), dtype=torch.float64)
    assert torch.allclose(got.double(), want, rtol=1e-7, atol=0)
    assert torch.allclose(rope_inv_freq(dim, base, dtype=torch.float64), want, rtol=1e-15)


def test_inv_freq_first_is_one_and_decreasing():
    inv = rope_inv_freq(16)
    assert inv[0] == 1.0
    assert bool((inv[1:] < inv[:-1]).all())


@pytest.mark.parametrize("dim", [0, -2, 3, 7])
def test_inv_freq_rejects_odd_or_nonpositive_dim(dim):
    with pytest.raises(ValueError, match="dim"):
        rope_inv_freq(dim)


def test_inv_freq_rejects_bad_types_and_base():
    with pytest.raises(TypeError, match="dim"):
        rope_inv_freq(8.0)
    with pytest.raises(TypeError, match="dim"):
        rope_inv_freq(True)
    with pytest.raises(ValueError, match="base"):
        rope_inv_freq(8, base=1.0)
    with pytest.raises(TypeError, match="dtype"):
        rope_inv_freq(8, dtype=torch.bfloat16)


# --- rope_cos_sin ----------------------------------------------------------------------


def test_cos_sin_shapes_and_values():
    inv = rope_inv_freq(8)
    positions = torch.tensor([[0, 3, 7], [2, 2, 9]])
    cos, sin = rope_cos_sin(positions, inv)
    assert cos.shape == sin.shape == (2, 3, 4)
    thetas = rope_inv_freq_loop(8)
    for b in range(2):
        for t in range(3):
            for i, theta in enumerate(thetas):
                angle = int(positions[b, t]) * theta
                assert math.isclose(float(cos[b, t, i]), math.cos(angle), abs_tol=1e-5)
                assert math.isclose(float(sin[b, t, i]), math.sin(angle), abs_tol=1e-5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.int64, torch.int32])
def test_cos_sin_tables_are_float32_whatever_the_positions_dtype(dtype):
    positions = torch.arange(5).to(dtype)
    cos, sin = rope_cos_sin(positions, rope_inv_freq(4))
    assert cos.dtype == sin.dtype == torch.float32


def test_cos_sin_low_precision_inv_freq_is_widened():
    cos, _ = rope_cos_sin(torch.arange(3), rope_inv_freq(4).to(torch.bfloat16))
    assert cos.dtype == torch.float32
    cos64, _ = rope_cos_sin(torch.arange(3), rope_inv_freq(4, dtype=torch.float64))
    assert cos64.dtype == torch.float64


def test_cos_sin_compute_dtype_override_really_loses_precision():
    # The override exists to reproduce low-precision tables; check it is honoured.
    positions = torch.tensor([1001, 1003])  # bf16 spacing near 1000 is 4
    inv = rope_inv_freq(4, dtype=torch.float64)
    cos_bf16, _ = rope_cos_sin(positions, inv, compute_dtype=torch.bfloat16)
    cos_64, _ = rope_cos_sin(positions, inv)
    assert cos_bf16.dtype == torch.bfloat16
    assert float((cos_bf16.double() - cos_64).abs().max()) > 0.5


def test_cos_sin_errors():
    inv = rope_inv_freq(4)
    with pytest.raises(TypeError, match="inv_freq"):
        rope_cos_sin(torch.arange(3), torch.arange(2))
    with pytest.raises(ValueError, match="inv_freq"):
        rope_cos_sin(torch.arange(3), inv[None])
    with pytest.raises(ValueError, match="positions"):
        rope_cos_sin(torch.tensor(3), inv)
    with pytest.raises(TypeError, match="positions"):
        rope_cos_sin(torch.ones(3, dtype=torch.bool), inv)
    with pytest.raises(TypeError, match=r"positions must be a torch\.Tensor, got list"):
        rope_cos_sin([0, 1], inv)
    with pytest.raises(TypeError, match=r"inv_freq must be a torch\.Tensor, got list"):
        rope_cos_sin(torch.arange(3), [1.0, 0.1])
    with pytest.raises(TypeError, match="compute_dtype"):
        rope_cos_sin(torch.arange(3), inv, compute_dtype=torch.int32)


# --- apply_rope ------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dim", [2, 6, 16])
def test_apply_rope_matches_loop_reference(layout, dim):
    x = torch.randn(2, 3, 5, dim, dtype=torch.float64)
    positions = torch.tensor([0, 1, 4, 17, 1000])
    got = rotate(x, positions, layout)
    assert torch.allclose(got, rope_loop(x, positions, layout=layout), atol=1e-12)


def test_apply_rope_pair_formula_on_one_pair():
    # (a, b) -> (a cos mθ - b sin mθ, a sin mθ + b cos mθ) with θ_0 = 1, m = 2
    x = torch.tensor([[[3.0, 4.0]]], dtype=torch.float64)
    got = rotate(x, torch.tensor([2]), "half")[0, 0]
    c, s = math.cos(2.0), math.sin(2.0)
    assert math.isclose(float(got[0]), 3 * c - 4 * s, abs_tol=1e-15)
    assert math.isclose(float(got[1]), 3 * s + 4 * c, abs_tol=1e-15)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_apply_rope_batched_positions(layout):
    # [B, L] positions (left padding, offsets): each row rotates by its own positions.
    x = torch.randn(2, 4, 8, dtype=torch.float64)
    positions = torch.tensor([[0, 0, 1, 2], [5, 6, 7, 8]])
    cos, sin = rope_cos_sin(positions, rope_inv_freq(8, dtype=torch.float64))
    got = apply_rope(x, cos, sin, layout)
    for b in range(2):
        assert torch.allclose(got[b], rope_loop(x[b], positions[b], layout=layout), atol=1e-12)


@settings(max_examples=30, deadline=None)
@given(
    m=st.integers(-5000, 5000),
    n=st.integers(-5000, 5000),
    shift=st.integers(-5000, 5000),
    layout=st.sampled_from(LAYOUTS),
    seed=st.integers(0, 2**16),
)
def test_scores_depend_only_on_relative_position(m, n, shift, layout, seed):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 1, 16, dtype=torch.float64, generator=g)
    score = (rotate(q, torch.tensor([m]), layout) * rotate(k, torch.tensor([n]), layout)).sum()
    shifted = (
        rotate(q, torch.tensor([m + shift]), layout) * rotate(k, torch.tensor([n + shift]), layout)
    ).sum()
    assert math.isclose(float(score), float(shifted), rel_tol=1e-9, abs_tol=1e-9)


@settings(max_examples=30, deadline=None)
@given(m=st.integers(-(10**6), 10**6), layout=st.sampled_from(LAYOUTS), seed=st.integers(0, 999))
def test_rotation_preserves_norm(m, layout, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 1, 10, dtype=torch.float64, generator=g)
    y = rotate(x, torch.tensor([m]), layout)
    assert torch.allclose(y.norm(dim=-1), x.norm(dim=-1), rtol=1e-12)


def test_position_zero_is_identity():
    x = torch.randn(4, 1, 12)
    for layout in LAYOUTS:
        assert torch.equal(rotate(x.double(), torch.tensor([0]), layout), x.double())


def test_layouts_differ_by_a_fixed_permutation():
    dim = 8
    perm = torch.tensor([0, 4, 1, 5, 2, 6, 3, 7])  # interleaved slot 2i <- half slot i
    x = torch.randn(5, dim, dtype=torch.float64)
    positions = torch.arange(5) * 7
    half = rotate(x, positions, "half")
    inter = rotate(x[:, perm], positions, "interleaved")
    assert torch.allclose(inter, half[:, perm], atol=1e-13)
    assert not torch.allclose(rotate(x, positions, "interleaved"), half, atol=1e-3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_apply_rope_keeps_input_dtype_and_computes_wide(dtype):
    x = torch.randn(1, 6, 8).to(dtype)
    positions = torch.arange(6) * 100
    cos, sin = rope_cos_sin(positions, rope_inv_freq(8))
    out = apply_rope(x, cos, sin)
    assert out.dtype == dtype
    want = rope_loop(x.double(), positions, layout="half")
    # one rounding of the result to `dtype`, plus float32 table error
    tol = {torch.bfloat16: 2e-2, torch.float16: 3e-3, torch.float32: 1e-4}[dtype]
    assert float((out.double() - want).abs().max()) < tol * float(want.abs().max())


def test_apply_rope_errors():
    cos, sin = rope_cos_sin(torch.arange(3), rope_inv_freq(4))
    x = torch.randn(3, 4)
    with pytest.raises(ValueError, match="even"):
        apply_rope(torch.randn(3, 5), cos, sin)
    with pytest.raises(ValueError, match="layout"):
        apply_rope(x, cos, sin, layout="neox")
    with pytest.raises(ValueError, match="cos/sin"):
        apply_rope(torch.randn(3, 6), cos, sin)  # table for dim 4, x of dim 6
    with pytest.raises(ValueError, match="cos/sin"):
        apply_rope(torch.randn(4, 4), cos, sin)  # 3 positions, 4 tokens
    with pytest.raises(ValueError, match="same shape"):
        apply_rope(x, cos, sin[:2])
    with pytest.raises(ValueError, match="broadcast"):
        apply_rope(torch.randn(2, 3, 4), cos.expand(3, 3, 2), sin.expand(3, 3, 2))
    with pytest.raises(TypeError, match="x"):
        apply_rope(torch.ones(3, 4, dtype=torch.int64), cos, sin)
    with pytest.raises(TypeError, match="cos"):
        apply_rope(x, cos.long(), sin)
    with pytest.raises(ValueError, match="x"):
        apply_rope(torch.randn(4), cos, sin)


@pytest.mark.parametrize(("batch", "heads"), [(4, 4), (2, 3)], ids=["B == H", "B != H"])
def test_batched_tables_need_a_head_axis(batch, heads):
    # rope_cos_sin(positions [B, L]) gives [B, L, dim/2]; against x [B, H, L, dim] its B
    # lines up with H. With B == H the old code rotated head h of every row by row h's
    # positions, silently; it must be refused, and cos[:, None] does the right thing.
    x = torch.randn(batch, heads, 5, 8, dtype=torch.float64)
    positions = torch.randint(0, 1000, (batch, 5))
    inv = rope_inv_freq(8, dtype=torch.float64)
    cos, sin = rope_cos_sin(positions, inv)
    with pytest.raises(ValueError, match=r"add the head axis \(cos\[:, None\]"):
        apply_rope(x, cos, sin)
    with pytest.raises(ValueError, match="head axis"):
        apply_partial_rope(x, cos[..., :2], sin[..., :2])
    full = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    with pytest.raises(ValueError, match=r"cos_full\[:, None\]"):
        apply_rope_rotate_half(x, *full)
    with pytest.raises(ValueError, match=r"positions\[:, None\]"):
        apply_rope_complex(x, positions, inv, layout="half")
    want = torch.stack([rope_loop(x[b], positions[b], layout="half") for b in range(batch)])
    assert torch.allclose(apply_rope(x, cos[:, None], sin[:, None]), want, atol=1e-12)
    assert torch.allclose(apply_rope_rotate_half(x, full[0][:, None], full[1][:, None]), want)
    got = apply_rope_complex(x, positions[:, None], inv, layout="half")
    assert torch.allclose(got, want, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_apply_rope_on_an_empty_batch_in_half_precision(dtype, layout):
    # float32 tables rotate a 16-bit x in float32: the kernels' path, which divided by the
    # batch size (ZeroDivisionError) for an empty batch
    cos, sin = rope_cos_sin(torch.arange(3), rope_inv_freq(8))
    x = torch.empty(0, 2, 3, 8, dtype=dtype)
    out = apply_rope(x, cos, sin, layout)
    assert out.shape == x.shape
    assert out.dtype == dtype
    assert apply_rope(x, cos, sin, layout, out=torch.empty_like(x)).shape == x.shape


# --- the other forms of the same map -------------------------------------------------


# --- the other forms of the same map -------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_matrix_and_complex_forms_match_loop(layout):
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    positions = torch.tensor([0, 1, 2, 50, 51, 4000])
    inv = rope_inv_freq(8, dtype=torch.float64)
    want = rope_loop(x, positions, layout=layout)
    assert torch.allclose(apply_rope_matrix(x, positions, inv, layout), want, atol=1e-12)
    assert torch.allclose(apply_rope_complex(x, positions, inv, layout), want, atol=1e-12)


def test_interleaved_matrix_is_the_papers_matrix():
    inv = rope_inv_freq(6, dtype=torch.float64)
    got = rope_rotation_matrix(torch.tensor([5]), inv)[0]
    assert torch.allclose(got, rope_matrix_loop(5.0, 6), atol=1e-14)


def test_half_matrix_is_a_permuted_interleaved_matrix():
    inv = rope_inv_freq(8, dtype=torch.float64)
    perm = layout_permutation(8)
    half = rope_rotation_matrix(torch.tensor([3]), inv, "half")[0]
    inter = rope_rotation_matrix(torch.tensor([3]), inv, "interleaved")[0]
    assert torch.equal(half[perm][:, perm], inter)


def test_rotate_half_form_needs_concatenated_tables():
    x = torch.randn(4, 8, dtype=torch.float64)
    positions = torch.arange(4) * 5
    cos, sin = rope_cos_sin(positions, rope_inv_freq(8, dtype=torch.float64))
    want = rope_loop(x, positions, layout="half")
    right = apply_rope_rotate_half(x, torch.cat((cos, cos), -1), torch.cat((sin, sin), -1))
    assert torch.allclose(right, want, atol=1e-12)
    wrong = apply_rope_rotate_half(x, cos.repeat_interleave(2, -1), sin.repeat_interleave(2, -1))
    assert not torch.allclose(wrong, want, atol=1e-3)
    assert torch.equal(rotate_half(rotate_half(x)), -x)
    with pytest.raises(ValueError, match="cos_full"):
        apply_rope_rotate_half(x, cos, sin)
    with pytest.raises(ValueError, match="even"):
        rotate_half(torch.zeros(3))


def test_layout_permutation_values_and_errors():
    assert layout_permutation(6).tolist() == [0, 3, 1, 4, 2, 5]
    with pytest.raises(ValueError, match="dim"):
        layout_permutation(5)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_partial_rope_rotates_only_leading_features(layout):
    x = torch.randn(3, 10, dtype=torch.float64)
    positions = torch.tensor([1, 20, 300])
    cos, sin = rope_cos_sin(positions, rope_inv_freq(4, dtype=torch.float64))
    out = apply_partial_rope(x, cos, sin, layout)
    assert torch.equal(out[:, 4:], x[:, 4:])
    assert torch.allclose(out[:, :4], rope_loop(x[:, :4], positions, layout=layout), atol=1e-12)
    with pytest.raises(ValueError, match="features"):
        apply_partial_rope(x[:, :2], cos, sin)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_partial_rope_at_full_width_allocates_only_its_output(layout):
    # rotary_dim == dim has no pass-through features, so nothing is concatenated: the
    # peak is that of apply_rope (above the small-input size: its output and the small
    # tables), and the values are the float64 loop's.
    x = torch.randn(1, 4, 320, 32)
    positions = torch.arange(320)
    cos, sin = (t.float() for t in rope_cos_sin(positions, rope_inv_freq(32, dtype=torch.float64)))
    out = apply_partial_rope(x, cos, sin, layout)
    reference = rope_loop(x.double(), positions, layout=layout)
    assert torch.allclose(out.double(), reference, atol=1e-5)
    with torch.no_grad():
        partial = peak_tensor_memory(lambda: apply_partial_rope(x, cos, sin, layout))
        full = peak_tensor_memory(lambda: apply_rope(x, cos, sin, layout))
    assert partial == full
    assert partial < 2 * x.nbytes


def test_convert_weights_between_layouts_keeps_scores():
    torch.manual_seed(1)
    heads, head_dim, width = 2, 8, 5
    w_q, w_k = torch.randn(2, heads * head_dim, width, dtype=torch.float64)
    x = torch.randn(6, width, dtype=torch.float64)
    positions = torch.arange(6) * 3

    def scores(wq, wk, layout):
        q = (x @ wq.T).reshape(6, heads, head_dim).transpose(0, 1)
        k = (x @ wk.T).reshape(6, heads, head_dim).transpose(0, 1)
        q = rope_loop(q, positions, layout=layout)
        k = rope_loop(k, positions, layout=layout)
        return q @ k.transpose(-1, -2)

    meta = scores(w_q, w_k, "interleaved")
    hf_q = convert_qk_weight_layout(w_q, heads, "interleaved", "half")
    hf_k = convert_qk_weight_layout(w_k, heads, "interleaved", "half")
    assert torch.allclose(scores(hf_q, hf_k, "half"), meta, atol=1e-10)
    assert not torch.allclose(scores(w_q, w_k, "half"), meta, atol=1e-3)
    back = convert_qk_weight_layout(hf_q, heads, "half", "interleaved")
    assert torch.equal(back, w_q)
    with pytest.raises(ValueError, match="num_heads"):
        convert_qk_weight_layout(w_q, 3, "half", "interleaved")
    with pytest.raises(ValueError, match="head_dim"):
        convert_qk_weight_layout(torch.zeros(6, 2), 2, "half", "interleaved")


# --- RotaryEmbedding and attention ------------------------------------------------------


def test_rotary_embedding_grows_its_cache_on_demand():
    rotary = RotaryEmbedding(8, initial_positions=4)
    assert rotary.cached_positions == 4
    cos, _ = rotary.cos_sin(torch.tensor([0, 9]))
    assert rotary.cached_positions >= 10
    want, _ = rope_cos_sin(torch.tensor([0, 9]), rope_inv_freq(8, dtype=torch.float64))
    assert torch.equal(cos, want.float())  # float64 angles, rounded once
    assert rotary.cos_cached.dtype == torch.float32


def test_rotary_embedding_tables_survive_a_cast_to_bfloat16():
    layer = make_rope_layer(dtype=torch.float32).to(torch.bfloat16)
    rotary = layer.position
    cos, _ = rotary.cos_sin(torch.tensor([1001, 3001]))
    assert cos.dtype == torch.float32
    want, _ = rope_cos_sin(torch.tensor([1001, 3001]), rope_inv_freq(6, dtype=torch.float64))
    assert float((cos.double() - want).abs().max()) < 1e-7
    x = torch.randn(1, 5, 12).to(torch.bfloat16)
    with torch.no_grad():
        assert layer(x, positions=torch.arange(5) + 3000).dtype == torch.bfloat16


def test_rotary_embedding_errors():
    with pytest.raises(ValueError, match="head_dim"):
        RotaryEmbedding(7)
    with pytest.raises(ValueError, match="rotary_dim"):
        RotaryEmbedding(8, rotary_dim=10)
    with pytest.raises(ValueError, match="layout"):
        RotaryEmbedding(8, layout="gptj")
    with pytest.raises(TypeError, match="dtype"):
        RotaryEmbedding(8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="base"):
        RotaryEmbedding(8, base=0.5)
    rotary = RotaryEmbedding(8)
    with pytest.raises(ValueError, match="non-negative"):
        rotary.cos_sin(torch.tensor([-1]))
    with pytest.raises(TypeError, match="integer"):
        rotary.cos_sin(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="head_dim"):
        rotary.rotate(torch.zeros(1, 1, 2, 6), torch.arange(2))


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"initial_positions": -5}, ValueError, "initial_positions must be non-negative"),
        ({"initial_positions": 10.5}, TypeError, "initial_positions must be an int"),
        ({"initial_positions": True}, TypeError, "initial_positions must be an int"),
        ({"base": float("inf")}, ValueError, "base must be finite"),
        ({"base": float("nan")}, ValueError, "base must be finite"),
        ({"base": "10000"}, TypeError, "base must be a real number"),
        ({"scaling": 2}, TypeError, "scaling must be a str"),
        ({"scaling": "linear", "scaling_params": [("factor", 2.0)]}, TypeError, "scaling_params"),
    ],
)
def test_rotary_embedding_refuses_bad_arguments(kwargs, error, message):
    with pytest.raises(error, match=message):
        RotaryEmbedding(8, **kwargs)


def test_rotary_embedding_names_the_users_arguments():
    rotary = RotaryEmbedding(8)
    x = torch.zeros(2, 1, 3, 8)
    with pytest.raises(TypeError, match=r"positions must be a torch\.Tensor, got list"):
        rotary.cos_sin([0, 1, 2])
    with pytest.raises(TypeError, match=r"positions must be a torch\.Tensor, got list"):
        rotary.rotate(x, [0, 1, 2])
    # the wrong number of positions: the old message spoke of cos/sin tables
    with pytest.raises(ValueError, match=r"^positions must have shape \[3\] or \[2, 3\]"):
        rotary.rotate(x, torch.arange(4))
    with pytest.raises(ValueError, match=r"^positions must have shape \[3\] or \[2, 3\]"):
        rotary.rotate(x, torch.zeros(3, 3, dtype=torch.long))  # another batch size
    with pytest.raises(ValueError, match=r"^positions must have shape"):
        rotary.rotate(x[0], torch.zeros(2, 3, dtype=torch.long))  # [B, L] for a 3-D x
    # inside attention the per-head tensors are q and k, not the user's x
    q, k, positions = torch.zeros(1, 2, 3, 6), torch.zeros(1, 2, 3, 8), torch.arange(3)
    with pytest.raises(ValueError, match=r"^q of shape \(1, 2, 3, 6\) does not end in head_dim=8"):
        rotary.transform_qk(q, k, positions, positions)
    with pytest.raises(ValueError, match=r"^k_positions must have shape \[3\]"):
        rotary.transform_qk(k, k, positions, torch.arange(4))


def make_rope_layer(layout="half", rotary_dim=None, seed=0, dtype=torch.float64):
    torch.manual_seed(seed)
    scheme = RotaryEmbedding(6, layout=layout, rotary_dim=rotary_dim, dtype=dtype)
    return MultiHeadAttention(12, 2, position=scheme).to(dtype)


@pytest.mark.parametrize(("layout", "rotary_dim"), [("half", None), ("interleaved", 4)])
@pytest.mark.parametrize("causal", [False, True])
def test_rope_attention_matches_loop_reference(layout, rotary_dim, causal):
    layer = make_rope_layer(layout, rotary_dim)
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    positions = torch.tensor([3, 4, 5, 6, 7])
    with torch.no_grad():
        got = layer(x, positions=positions, causal=causal)
    want = rope_attention_loop(
        layer, x, positions, layout=layout, rotary_dim=rotary_dim, causal=causal
    )
    assert torch.allclose(got, want, atol=1e-12)


def test_rope_attention_is_shift_invariant_and_values_unrotated():
    layer = make_rope_layer()
    x = torch.randn(1, 5, 12, dtype=torch.float64)
    with torch.no_grad():
        base = layer(x)
        shifted = layer(x, positions=torch.arange(5) + 1000)
    assert torch.allclose(base, shifted, atol=1e-10)
    # one token attends only to itself: the output is the value path, unrotated
    one = x[:, :1]
    with torch.no_grad():
        plain = MultiHeadAttention(12, 2).double()
        plain.load_state_dict(layer.state_dict())
        assert torch.allclose(layer(one, positions=torch.tensor([77])), plain(one), atol=1e-12)


@pytest.mark.parametrize("chunks", [[1] * 7, [4, 1, 2]])
def test_rope_kv_cache_equals_full_pass_float64(chunks):
    layer = make_rope_layer("interleaved")
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    with torch.no_grad():
        full = layer(x, causal=True)
        stepwise, _ = forward_in_chunks(layer, x, chunks)
    assert torch.allclose(stepwise, full, atol=1e-10, rtol=0)


def test_rope_kv_cache_equals_full_pass_float32():
    layer = make_rope_layer(dtype=torch.float32)
    x = torch.randn(2, 64, 12)
    with torch.no_grad():
        full = layer(x, causal=True)
        stepwise, _ = forward_in_chunks(layer, x, [1] * 64)
    # float32 rounding in different summation orders; outputs are O(1)
    assert float((stepwise - full).abs().max()) < 1e-5


def test_rope_left_padding_with_per_row_positions():
    # Row 0 is left-padded by two tokens; positions start at 0 on its first real token.
    layer = make_rope_layer()
    real = torch.randn(1, 4, 12, dtype=torch.float64)
    padded = torch.cat((torch.randn(1, 2, 12, dtype=torch.float64), real), dim=1)
    other = torch.randn(1, 6, 12, dtype=torch.float64)
    x = torch.cat((padded, other))
    positions = torch.tensor([[0, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]])
    keep = torch.tensor([[False, False, True, True, True, True], [True] * 6])
    mask = keep[:, None, None, :]
    with torch.no_grad():
        out = layer(x, positions=positions, attn_mask=mask, causal=True)
        alone = layer(real, causal=True)
        second = layer(other, causal=True)
    assert torch.allclose(out[0, 2:], alone[0], atol=1e-10)
    assert torch.allclose(out[1], second[0], atol=1e-10)


# --- apply_rope with and without gradients (each path: tests/test_rope_kernels.py) -----


def _grad_path(x, cos, sin, layout):
    """apply_rope through its differentiable path (x requires grad)."""
    with torch.enable_grad():
        return apply_rope(x.detach().clone().requires_grad_(), cos, sin, layout).detach()


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("table_batch", [(), (1,), (2, 1)], ids=["[L,h]", "[1,L,h]", "[B,1,L,h]"])
def test_fast_and_grad_paths_match_the_loop_reference(layout, table_batch):
    x = torch.randn(2, 3, 7, 12, dtype=torch.float64)
    positions = torch.arange(7) * 13 + 2
    cos, sin = rope_cos_sin(positions, rope_inv_freq(12, dtype=torch.float64))
    cos, sin = cos.expand(*table_batch, 7, 6), sin.expand(*table_batch, 7, 6)
    want = rope_loop(x, positions, layout=layout)
    with torch.no_grad():
        fast = apply_rope(x, cos, sin, layout)
    assert torch.allclose(fast, want, atol=1e-12)
    assert torch.allclose(_grad_path(x, cos, sin, layout), want, atol=1e-12)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fast_path_on_views_with_odd_strides_and_offsets(layout):
    # [B, L, H, D] -> [B, H, L, D] (the usual split-heads view) and a view that starts at
    # an odd element, which cannot be read as complex pairs without a copy
    base = torch.randn(2, 9, 3, 11, dtype=torch.float64)
    views = [
        base[..., :10].transpose(1, 2),
        base.flatten()[1 : 1 + 2 * 9 * 3 * 10].view(2, 3, 9, 10),
    ]
    positions = torch.arange(9)
    cos, sin = rope_cos_sin(positions, rope_inv_freq(10, dtype=torch.float64))
    for x in views:
        want = rope_loop(x.contiguous(), positions, layout=layout)
        assert torch.allclose(apply_rope(x, cos, sin, layout), want, atol=1e-12)


def test_fast_path_broadcasts_x_against_larger_tables():
    # one x for two batches of positions: the result takes the broadcast shape
    x = torch.randn(5, 8, dtype=torch.float64)
    positions = torch.tensor([[0, 1, 2, 3, 4], [9, 8, 7, 6, 5]])
    cos, sin = rope_cos_sin(positions, rope_inv_freq(8, dtype=torch.float64))
    for layout in LAYOUTS:
        got = apply_rope(x, cos, sin, layout)
        assert got.shape == (2, 5, 8)
        for b in range(2):
            assert torch.allclose(got[b], rope_loop(x, positions[b], layout=layout), atol=1e-12)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fast_path_float32_equals_grad_path_within_1e_6(layout):
    x = torch.randn(2, 4, 64, 32)
    cos, sin = rope_cos_sin(torch.arange(64) * 31, rope_inv_freq(32))
    fast = apply_rope(x, cos, sin, layout)
    assert float((fast - _grad_path(x, cos, sin, layout)).abs().max()) <= 1e-6


@pytest.mark.parametrize("layout", LAYOUTS)
def test_low_precision_tables_keep_the_reference_arithmetic(layout):
    # bf16 tables (the failure chapter 9 reproduces) make bf16 the working dtype; the
    # fast path is for float32/float64 only, so the numbers chapter 9 prints stay those
    # of the element-wise form, bit for bit
    x = torch.randn(1, 5, 8).to(torch.bfloat16)
    cos, sin = rope_cos_sin(torch.arange(5), rope_inv_freq(8), compute_dtype=torch.bfloat16)
    got = apply_rope(x, cos, sin, layout)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, _grad_path(x, cos, sin, layout))
    exact = apply_rope(x.double(), cos.double(), sin.double(), layout)
    assert float((got.double() - exact).abs().max()) <= 2**-7 * float(exact.abs().max())


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradients_pass_gradcheck(layout):
    # finite differences, independent of the formula, for x and for the tables
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    angles = torch.rand(3, 3, dtype=torch.float64) * 6
    cos, sin = angles.cos().requires_grad_(), angles.sin().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, c, s: apply_rope(a, c, s, layout), (x, cos, sin))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_gradient_equals_the_transposed_rotation(layout):
    # d(sum(g * R x))/dx = Rᵀ g = rotation by the negative angle
    x = torch.randn(4, 10, dtype=torch.float64, requires_grad=True)
    g = torch.randn(4, 10, dtype=torch.float64)
    positions = torch.tensor([0, 3, 50, 999])
    inv = rope_inv_freq(10, dtype=torch.float64)
    cos, sin = rope_cos_sin(positions, inv)
    (apply_rope(x, cos, sin, layout) * g).sum().backward()
    assert torch.allclose(x.grad, rope_loop(g, -positions, layout=layout), atol=1e-12)


def test_out_whose_elements_share_memory_is_refused():
    # an expanded view writes one element from several places: last writer wins on the
    # GPU kernel, so it is refused on every device (the CPU raised torch's own error)
    x = torch.randn(2, 3, 7, 8)
    cos, sin = rope_cos_sin(torch.arange(7), rope_inv_freq(8))
    out = torch.empty(1, 3, 7, 8).expand(2, 3, 7, 8)
    with pytest.raises(ValueError, match="out must not have elements that share memory"):
        apply_rope(x, cos, sin, out=out)
