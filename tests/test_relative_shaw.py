"""pecode.relative.shaw: Shaw et al.'s key and value terms against the paper's loop, both
forms against each other, and their errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from relative_helpers import heads

from pecode.attention import MultiHeadAttention
from pecode.bench import peak_tensor_memory
from pecode.reference.relative import (
    shaw_attention_loop,
)
from pecode.relative import (
    ShawRelativePosition,
    shaw_key_logits,
    shaw_key_logits_naive,
    shaw_relative_index,
    shaw_value_term,
    shaw_value_term_naive,
)


def test_shaw_index_by_hand():
    index = shaw_relative_index(torch.arange(4), torch.arange(4), 2)
    # row i, column j holds clip(j - i, 2) + 2
    expected = torch.tensor([[2, 3, 4, 4], [1, 2, 3, 4], [0, 1, 2, 3], [0, 0, 1, 2]])
    assert torch.equal(index, expected)
    assert torch.equal(shaw_relative_index(torch.arange(3), torch.arange(3), 0), torch.zeros(3, 3))


@pytest.mark.parametrize(
    ("q_positions", "k_positions"),
    [
        (torch.arange(9), torch.arange(9)),
        (torch.arange(5, 9), torch.arange(9)),  # queries at the end, as with a cache
        (torch.tensor([[0, 3, 4, 9], [2, 2, 5, 1]]), torch.tensor([[1, 2, 3], [7, 0, 4]])),
    ],
)
def test_shaw_naive_and_efficient_agree_forward_and_backward(q_positions, k_positions):
    gen = torch.Generator().manual_seed(0)
    batch, heads_, dh, k = 2, 3, 8, 3
    lq, lk = q_positions.shape[-1], k_positions.shape[-1]
    q = torch.randn(batch, heads_, lq, dh, generator=gen, requires_grad=True)
    weights = torch.rand(batch, heads_, lq, lk, generator=gen, requires_grad=True)
    key_table = torch.randn(2 * k + 1, dh, generator=gen, requires_grad=True)
    value_table = torch.randn(2 * k + 1, dh, generator=gen, requires_grad=True)
    grad_logits = torch.randn(batch, heads_, lq, lk, generator=gen)
    grad_out = torch.randn(batch, heads_, lq, dh, generator=gen)

    results = []
    for key_fn, value_fn in (
        (shaw_key_logits_naive, shaw_value_term_naive),
        (shaw_key_logits, shaw_value_term),
    ):
        logits = key_fn(q, key_table, q_positions, k_positions, k)
        term = value_fn(weights, value_table, q_positions, k_positions, k)
        grads = torch.autograd.grad(
            (logits * grad_logits).sum() + (term * grad_out).sum(),
            (q, weights, key_table, value_table),
        )
        results.append((logits, term, *grads))
    for naive, fast in zip(*results, strict=True):
        # to 1e-5 relative to the largest entry (table gradients sum many terms)
        scale = max(1.0, fast.abs().max().item())
        assert (naive - fast).abs().max().item() <= 1e-5 * scale


def test_shaw_key_logits_by_loop():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 5, 3, generator=gen, dtype=torch.float64)
    table = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    got = shaw_key_logits(q, table, torch.arange(5), torch.arange(5), 2)
    for h in range(2):
        for i in range(5):
            for j in range(5):
                row = max(-2, min(2, j - i)) + 2
                expected = sum(float(q[0, h, i, c]) * float(table[row, c]) for c in range(3))
                assert got[0, h, i, j].item() == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("memory_efficient", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_shaw_module_matches_the_paper_loop(memory_efficient, causal):
    torch.manual_seed(2)
    scheme = ShawRelativePosition(4, 2, memory_efficient=memory_efficient)
    layer = MultiHeadAttention(8, 2, position=scheme).double()
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    with torch.no_grad():
        got = layer(x, causal=causal)
        z = shaw_attention_loop(
            heads(x, layer, "q"),
            heads(x, layer, "k"),
            heads(x, layer, "v"),
            scheme.key_table,
            scheme.value_table,
            2,
            causal=causal,
        )
        expected = layer.out_proj(z.transpose(1, 2).reshape(2, 6, 8))
    assert torch.allclose(got, expected, atol=1e-12)


def test_shaw_logits_depend_only_on_the_offset():
    # shift every position by 100: the same logits
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 1, 6, 4, generator=gen)
    table = torch.randn(7, 4, generator=gen)
    base = shaw_key_logits(q, table, torch.arange(6), torch.arange(6), 3)
    shifted = shaw_key_logits(q, table, torch.arange(100, 106), torch.arange(100, 106), 3)
    assert torch.equal(base, shifted)


def test_shaw_bad_input():
    q = torch.randn(1, 1, 3, 4)
    with pytest.raises(ValueError, match="max_distance"):
        shaw_relative_index(torch.arange(3), torch.arange(3), -1)
    with pytest.raises(TypeError, match="max_distance"):
        shaw_relative_index(torch.arange(3), torch.arange(3), 1.5)
    with pytest.raises(TypeError, match="q_positions"):
        shaw_relative_index(torch.arange(3.0), torch.arange(3), 1)
    with pytest.raises(ValueError, match="key_table"):
        shaw_key_logits(q, torch.randn(4, 4), torch.arange(3), torch.arange(3), 2)
    with pytest.raises(ValueError, match="key_table"):
        shaw_key_logits_naive(q, torch.randn(5, 3), torch.arange(3), torch.arange(3), 2)
    with pytest.raises(ValueError, match=r"q must have shape"):
        shaw_key_logits(q[0], torch.randn(5, 4), torch.arange(3), torch.arange(3), 2)
    with pytest.raises(ValueError, match="lengths"):
        shaw_key_logits(q, torch.randn(5, 4), torch.arange(2), torch.arange(3), 2)
    with pytest.raises(ValueError, match="lengths"):
        shaw_value_term(
            torch.rand(1, 1, 3, 3), torch.randn(5, 4), torch.arange(3), torch.arange(4), 2
        )
    with pytest.raises(ValueError, match="batch"):
        shaw_relative_index(torch.zeros(2, 3, dtype=torch.long), torch.zeros(3, 3).long(), 1)
    with pytest.raises(ValueError, match="head_dim"):
        ShawRelativePosition(0, 2)
    with pytest.raises(ValueError, match="max_distance"):
        ShawRelativePosition(4, -2)


def test_shaw_errors_name_the_callers_arguments():
    # the scheme's own tables are not the caller's arguments: a query of the wrong head
    # dimension is reported as such, not as a key_table of the wrong shape
    scheme = ShawRelativePosition(8, 2)
    positions = torch.arange(4)
    with pytest.raises(ValueError, match=r"q has head dimension 16, .* built for head_dim=8"):
        scheme.score_bias(torch.randn(2, 2, 4, 16), None, positions, positions)
    batched = torch.arange(12).view(3, 4)
    q = torch.randn(2, 2, 4, 8)
    for logits in (shaw_key_logits, shaw_key_logits_naive):
        with pytest.raises(ValueError, match="k_positions have batch 3, q has batch 2"):
            logits(q, scheme.key_table, batched, batched, 2)
    weights = torch.rand(2, 2, 4, 4)
    for term in (shaw_value_term, shaw_value_term_naive):
        with pytest.raises(ValueError, match="k_positions have batch 3, weights has batch 2"):
            term(weights, scheme.value_table, batched, batched, 2)
    with pytest.raises(ValueError, match=r"weights must have lengths \[Lq, Lk\] = \[4, 4\]"):
        scheme.output_term(torch.rand(2, 2, 4, 5), positions, positions)
    with pytest.raises(TypeError, match=r"key_table must be a torch\.Tensor, got list"):
        shaw_key_logits(q, [[0.0] * 8] * 5, positions, positions, 2)
    with pytest.raises(TypeError, match="memory_efficient must be a bool"):
        ShawRelativePosition(8, 2, memory_efficient="no")


@pytest.mark.parametrize("memory_efficient", [True, False])
def test_left_padded_causal_stack_keeps_the_real_tokens_exact(memory_efficient):
    # Row 0 is 4 tokens left-padded by 2, row 1 is 6 tokens. Under a causal mask a padded
    # query sees no key; Shaw's value term makes attention compute the weights itself,
    # and a plain softmax over -inf only gives NaN there. The second layer reads the
    # padded rows as keys (masked, but NaN * 0 is NaN), so the NaN would reach every real
    # token of the row. The padded queries must come out as from the SDPA path (zero
    # heads, so W_O's bias), and the real tokens as in the same stack without padding.
    torch.manual_seed(5)
    layers = [
        MultiHeadAttention(8, 2, position=ShawRelativePosition(4, 3, memory_efficient=m)).double()
        for m in (memory_efficient, memory_efficient)
    ]

    def stack(x, **kwargs):
        for layer in layers:
            x = layer(x, causal=True, **kwargs)
        return x

    x = torch.randn(2, 6, 8, dtype=torch.float64)
    keep = torch.tensor([[False, False, True, True, True, True], [True] * 6])
    positions = torch.tensor([[0, 0, 0, 1, 2, 3], [0, 1, 2, 3, 4, 5]])
    with torch.no_grad():
        padded = stack(x, positions=positions, attn_mask=keep[:, None, None, :])
        alone = stack(x[:1, 2:])
        full = stack(x[1:])
        first_layer = layers[0](
            x, positions=positions, attn_mask=keep[:, None, None, :], causal=True
        )
    assert torch.isfinite(padded).all()
    assert torch.allclose(padded[0, 2:], alone[0], atol=1e-12)
    assert torch.allclose(padded[1], full[0], atol=1e-12)
    bias = layers[0].out_proj.bias
    assert torch.allclose(first_layer[0, :2], bias.expand(2, -1), atol=1e-12)


def test_naive_shaw_holds_the_big_tensor_and_the_efficient_one_does_not():
    length, dh, k = 128, 32, 8
    q = torch.randn(1, 1, length, dh)
    table = torch.randn(2 * k + 1, dh)
    positions = torch.arange(length)
    big = length * length * dh * 4  # [L, L, Dh] float32
    naive = peak_tensor_memory(lambda: shaw_key_logits_naive(q, table, positions, positions, k))
    fast = peak_tensor_memory(lambda: shaw_key_logits(q, table, positions, positions, k))
    assert naive >= big
    assert fast < big / 4


@given(
    st.integers(1, 9),
    st.integers(1, 9),
    st.integers(0, 12),
    st.integers(1, 6),
    st.integers(-20, 20),
)
def test_shaw_forms_agree_for_any_sizes(q_len, k_len, max_distance, head_dim, start):
    gen = torch.Generator().manual_seed(q_len * 1000 + k_len * 100 + max_distance)
    q = torch.randn(1, 2, q_len, head_dim, generator=gen, dtype=torch.float64)
    weights = torch.rand(1, 2, q_len, k_len, generator=gen, dtype=torch.float64)
    table = torch.randn(2 * max_distance + 1, head_dim, generator=gen, dtype=torch.float64)
    qp, kp = torch.arange(start, start + q_len), torch.arange(k_len)
    assert torch.allclose(
        shaw_key_logits(q, table, qp, kp, max_distance),
        shaw_key_logits_naive(q, table, qp, kp, max_distance),
        atol=1e-12,
    )
    assert torch.allclose(
        shaw_value_term(weights, table, qp, kp, max_distance),
        shaw_value_term_naive(weights, table, qp, kp, max_distance),
        atol=1e-12,
    )
