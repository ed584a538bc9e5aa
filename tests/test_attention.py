"""pecode.attention against the float64 loop reference, plus its masks and its errors."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pecode.attention import (
    KVCache,
    MultiHeadAttention,
    PositionScheme,
    additive_mask,
    causal_mask,
    forward_in_chunks,
)
from pecode.reference import multi_head_attention_loop


def make_layer(embed_dim=12, num_heads=3, seed=0, **kwargs) -> MultiHeadAttention:
    torch.manual_seed(seed)
    return MultiHeadAttention(embed_dim, num_heads, **kwargs).double()


class FixedBias(PositionScheme):
    def __init__(self, bias: torch.Tensor) -> None:
        super().__init__()
        self.bias = bias

    def score_bias(self, q, k, q_positions, k_positions):
        return self.bias


class SwapQK(PositionScheme):
    """A deliberately odd transform, to see that the hook's output is what attention uses."""

    def transform_qk(self, q, k, q_positions, k_positions):
        return k, q


@pytest.mark.parametrize("causal", [False, True])
def test_matches_loop_reference(causal):
    layer = make_layer()
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    with torch.no_grad():
        fast = layer(x, causal=causal)
    assert torch.allclose(fast, multi_head_attention_loop(layer, x, causal=causal), atol=1e-12)


def test_score_bias_enters_before_softmax():
    layer = make_layer()
    bias = torch.randn(3, 5, 5, dtype=torch.float64)
    biased = make_layer(position=FixedBias(bias))
    biased.load_state_dict(layer.state_dict())
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    with torch.no_grad():
        fast = biased(x)
    assert torch.allclose(fast, multi_head_attention_loop(layer, x, bias=bias), atol=1e-12)
    assert not torch.allclose(fast, layer(x), atol=1e-3)


def test_transform_qk_is_applied():
    plain, swapped = make_layer(), make_layer(position=SwapQK())
    x = torch.randn(1, 4, 12, dtype=torch.float64)
    with torch.no_grad():
        w_plain = plain.attention_weights(x)
        w_swapped = swapped.attention_weights(x)
        # swapping q and k transposes the logits: the weights become softmax(Sᵀ)
        q = plain._split_heads(plain.q_proj(x))
        k = plain._split_heads(plain.k_proj(x))
        expected = (k @ q.transpose(-2, -1) / math.sqrt(plain.head_dim)).softmax(-1)
    assert torch.allclose(w_swapped, expected, atol=1e-12)
    assert not torch.allclose(w_swapped, w_plain, atol=1e-3)


def test_boolean_and_float_masks_agree_with_causal_flag():
    layer = make_layer()
    x = torch.randn(2, 6, 12, dtype=torch.float64)
    allowed = torch.ones(6, 6, dtype=torch.bool).tril()
    additive = torch.zeros(6, 6, dtype=torch.float64).masked_fill(~allowed, float("-inf"))
    with torch.no_grad():
        reference = layer(x, causal=True)
        assert torch.allclose(layer(x, attn_mask=allowed), reference, atol=1e-12)
        assert torch.allclose(layer(x, attn_mask=additive), reference, atol=1e-12)


def test_attention_weights_are_what_forward_uses():
    layer = make_layer()
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    with torch.no_grad():
        weights = layer.attention_weights(x, causal=True)
        v = layer._split_heads(layer.v_proj(x))
        manual = layer.out_proj(layer._merge_heads(weights @ v))
        assert torch.allclose(layer(x, causal=True), manual, atol=1e-12)
    assert torch.allclose(weights.sum(-1), torch.ones(2, 3, 5, dtype=torch.float64))
    assert torch.all(weights.triu(diagonal=1) == 0)


@given(
    length=st.integers(1, 9),
    heads=st.integers(1, 4),
    head_dim=st.integers(1, 5),
    seed=st.integers(0, 2**16),
)
def test_permutation_equivariance_property(length, heads, head_dim, seed):
    generator = torch.Generator().manual_seed(seed)
    layer = make_layer(heads * head_dim, heads, seed=seed)
    x = torch.randn(1, length, heads * head_dim, dtype=torch.float64, generator=generator)
    perm = torch.randperm(length, generator=generator)
    with torch.no_grad():
        assert torch.allclose(layer(x[:, perm]), layer(x)[:, perm], atol=1e-10)


def test_causal_attention_is_not_equivariant():
    layer = make_layer()
    x = torch.randn(1, 5, 12, dtype=torch.float64)
    perm = torch.tensor([4, 3, 2, 1, 0])
    with torch.no_grad():
        assert not torch.allclose(layer(x[:, perm], causal=True), layer(x, causal=True)[:, perm])


def test_dropout_only_in_training():
    layer = make_layer(dropout=0.5)
    x = torch.randn(1, 6, 12, dtype=torch.float64)
    layer.eval()
    with torch.no_grad():
        assert torch.equal(layer(x), layer(x))
    layer.train()
    torch.manual_seed(1)
    first = layer(x)
    torch.manual_seed(2)
    assert not torch.allclose(first, layer(x))


def test_gradients_flow_to_every_projection():
    layer = make_layer()
    layer(torch.randn(2, 4, 12, dtype=torch.float64), causal=True).sum().backward()
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        assert getattr(layer, name).weight.grad.abs().sum() > 0, name


def test_explicit_positions_are_validated():
    layer = make_layer()
    x = torch.randn(2, 4, 12, dtype=torch.float64)
    with torch.no_grad():
        layer(x, positions=torch.arange(4))
        layer(x, positions=torch.arange(8).view(2, 4))
    with pytest.raises(TypeError, match="positions"):
        layer(x, positions=torch.arange(4.0))
    with pytest.raises(ValueError, match="positions"):
        layer(x, positions=torch.arange(5))


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"embed_dim": 12, "num_heads": 0}, ValueError, "num_heads"),
        ({"embed_dim": 12, "num_heads": -2}, ValueError, "num_heads"),
        ({"embed_dim": 0, "num_heads": 1}, ValueError, "embed_dim"),
        ({"embed_dim": 10, "num_heads": 3}, ValueError, "divisible"),
        ({"embed_dim": 12, "num_heads": 3, "dropout": 1.0}, ValueError, "dropout"),
        ({"embed_dim": 12, "num_heads": 3, "position": "rope"}, TypeError, "position"),
    ],
)
def test_constructor_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        MultiHeadAttention(**kwargs)


@pytest.mark.parametrize(
    ("x", "error", "match"),
    [
        (torch.randn(4, 12), ValueError, r"x must have shape"),
        (torch.randn(1, 4, 10), ValueError, r"x must have shape"),
        (torch.zeros(1, 4, 12, dtype=torch.long), TypeError, "floating"),
        (torch.randn(1, 0, 12), ValueError, "at least one"),
        ([[0.0] * 12], TypeError, "torch.Tensor"),
    ],
)
def test_forward_rejects_bad_input(x, error, match):
    layer = MultiHeadAttention(12, 3)
    with pytest.raises(error, match=match):
        layer(x)


def test_forward_rejects_masks_that_do_not_fit():
    layer = MultiHeadAttention(12, 3)
    x = torch.randn(2, 4, 12)
    with pytest.raises(ValueError, match="attn_mask"):
        layer(x, attn_mask=torch.ones(5, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="attn_mask"):
        layer(x, attn_mask=torch.ones(4, 4, dtype=torch.long))


def test_causal_mask_aligns_queries_with_the_last_keys():
    assert torch.equal(causal_mask(3, 3), torch.tensor([[1, 0, 0], [1, 1, 0], [1, 1, 1]]).bool())
    assert torch.equal(causal_mask(2, 4), torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]]).bool())
    with pytest.raises(ValueError, match="q_len"):
        causal_mask(5, 3)
    with pytest.raises(ValueError, match="positive"):
        causal_mask(0, 3)


def test_additive_mask_combines_and_returns_none_when_empty():
    common = {"q_len": 3, "k_len": 3, "dtype": torch.float32, "device": torch.device("cpu")}
    assert additive_mask(None, causal=False, bias=None, **common) is None
    bias = torch.full((3, 3), 0.5)
    combined = additive_mask(torch.eye(3, dtype=torch.bool), causal=True, bias=bias, **common)
    assert torch.equal(torch.isinf(combined), ~torch.eye(3, dtype=torch.bool))
    assert torch.all(combined.diagonal() == 0.5)
    with pytest.raises(TypeError, match="bias"):
        additive_mask(None, causal=False, bias=torch.ones(3, 3, dtype=torch.long), **common)


class FixedValueTerm(PositionScheme):
    """Adds Σ_j a_ij r_ij to each head's output, r_ij the same for every head."""

    def __init__(self, value_bias: torch.Tensor) -> None:
        super().__init__()
        self.value_bias = value_bias  # [L, L, Dh]

    def output_term(self, weights, q_positions, k_positions):
        return torch.einsum("bhij,ijd->bhid", weights, self.value_bias)


class HalfScale(PositionScheme):
    def logit_scale(self, head_dim):
        return 0.5 / math.sqrt(head_dim)


@pytest.mark.parametrize("causal", [False, True])
def test_output_term_matches_loop_reference(causal):
    value_bias = torch.randn(5, 5, 4, dtype=torch.float64)
    layer = make_layer(position=FixedValueTerm(value_bias))
    assert layer.position.has_output_term
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    with torch.no_grad():
        fast = layer(x, causal=causal)
        slow = multi_head_attention_loop(layer, x, causal=causal, value_bias=value_bias)
    assert torch.allclose(fast, slow, atol=1e-12)


def test_logit_scale_is_used_by_both_paths():
    layer = make_layer(position=HalfScale())
    x = torch.randn(2, 5, 12, dtype=torch.float64)
    slow = multi_head_attention_loop(layer, x, scale=0.5 / math.sqrt(4))
    with torch.no_grad():
        assert torch.allclose(layer(x), slow, atol=1e-12)
        weights = layer.attention_weights(x)
        v = layer._split_heads(layer.v_proj(x))
        assert torch.allclose(layer.out_proj(layer._merge_heads(weights @ v)), slow, atol=1e-12)


def test_base_scheme_has_no_output_term():
    assert not PositionScheme().has_output_term
    with pytest.raises(NotImplementedError):
        PositionScheme().output_term(torch.zeros(1, 1, 1, 1), torch.arange(1), torch.arange(1))


# --- KV cache ----------------------------------------------------------------------------


class PositionsBias(PositionScheme):
    """A bias that depends on key - query position, to see the cache hands over positions."""

    def score_bias(self, q, k, q_positions, k_positions):
        return -0.3 * (q_positions[:, None] - k_positions[None, :]).abs().to(q.dtype)


@pytest.mark.parametrize("scheme", [None, PositionsBias()])
@pytest.mark.parametrize("chunks", [[1] * 6, [3, 1, 2], [6]])
def test_kv_cache_decoding_equals_full_causal_pass(scheme, chunks):
    layer = make_layer(position=scheme)
    x = torch.randn(2, 6, 12, dtype=torch.float64)
    with torch.no_grad():
        full = layer(x, causal=True)
        stepwise, cache = forward_in_chunks(layer, x, chunks)
    assert len(cache) == 6
    assert cache.next_position == 6
    assert torch.allclose(stepwise, full, atol=1e-10)


def test_forward_in_chunks_checks_sizes():
    layer = make_layer()
    x = torch.randn(1, 4, 12, dtype=torch.float64)
    with pytest.raises(ValueError, match="chunk_sizes"):
        forward_in_chunks(layer, x, [2, 1])
    with pytest.raises(ValueError, match="chunk_sizes"):
        forward_in_chunks(layer, x, [5, -1])


def test_kv_cache_with_output_term_scheme():
    class ValueTerm(PositionScheme):
        def output_term(self, weights, q_positions, k_positions):
            rel = (k_positions[None, :] - q_positions[:, None]).to(weights.dtype)
            return (weights * rel).sum(-1, keepdim=True).expand(*weights.shape[:3], 4)

    layer = make_layer(position=ValueTerm())
    x = torch.randn(1, 5, 12, dtype=torch.float64)
    with torch.no_grad():
        full = layer(x, causal=True)
        cache = KVCache()
        steps = [layer(x[:, t : t + 1], causal=True, cache=cache) for t in range(5)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-10)


def test_kv_cache_errors():
    layer = make_layer()
    cache = KVCache()
    with torch.no_grad():
        layer(torch.randn(2, 3, 12, dtype=torch.float64), cache=cache)
        with pytest.raises(ValueError, match="cache"):
            layer(torch.randn(1, 1, 12, dtype=torch.float64), cache=cache)
        with pytest.raises(TypeError, match="cache"):
            layer(torch.randn(2, 1, 12, dtype=torch.float64), cache={})
        short = torch.ones(1, 3, dtype=torch.bool)  # with the cache the keys are 3 + 1
        with pytest.raises(ValueError, match="attn_mask"):
            layer(torch.randn(2, 1, 12, dtype=torch.float64), cache=cache, attn_mask=short)
    assert len(cache) == 3  # a refused call leaves the cache as it was
