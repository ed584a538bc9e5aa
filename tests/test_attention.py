"""pecode.attention against the float64 loop reference, plus its masks and its errors.

Grouped-query attention is checked against the same layer as multi-head attention with
each key/value head's weights repeated for its query heads; cross-attention against
``torch.nn.MultiheadAttention``; the KV cache's per-row positions against decoding each
row alone, without padding.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch import nn

from pecode.alibi import ALiBi
from pecode.attention import (
    ContentOnly,
    KVCache,
    MultiHeadAttention,
    PositionScheme,
    additive_mask,
    causal_mask,
    forward_in_chunks,
)
from pecode.reference import multi_head_attention_loop
from pecode.relative import (
    DebertaRelativePosition,
    ShawRelativePosition,
    T5RelativePositionBias,
    TransformerXLRelativePosition,
)
from pecode.rope import RotaryEmbedding


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
        ({"embed_dim": 12.0, "num_heads": 3}, TypeError, "embed_dim"),
        ({"embed_dim": 12, "num_heads": 3.0}, TypeError, "num_heads"),
        ({"embed_dim": 12, "num_heads": 4, "num_kv_heads": 3}, ValueError, "num_kv_heads=3"),
        ({"embed_dim": 12, "num_heads": 4, "num_kv_heads": 0}, ValueError, "num_kv_heads"),
        ({"embed_dim": 12, "num_heads": 4, "num_kv_heads": 2.0}, TypeError, "num_kv_heads"),
        ({"embed_dim": 12, "num_heads": 3, "context_dim": 0}, ValueError, "context_dim"),
        ({"embed_dim": 12, "num_heads": 3, "dropout": "0.1"}, TypeError, "dropout"),
        # "False" is truthy: before the check it gave the projections biases
        ({"embed_dim": 12, "num_heads": 3, "bias": "False"}, TypeError, "bias must be a bool"),
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


def test_causal_must_be_a_bool():
    # "False" is truthy: before the check it ran a causal pass with no error
    layer = make_layer()
    x = torch.randn(1, 4, 12, dtype=torch.float64)
    for value in ("False", 0, None):
        with pytest.raises(TypeError, match="causal must be a bool"):
            layer(x, causal=value)
        with pytest.raises(TypeError, match="causal must be a bool"):
            layer.attention_weights(x, causal=value)


def test_one_cache_serves_one_layer():
    # two layers of the same sizes would fill one cache with each other's keys, no error
    first, second = make_layer(seed=0), make_layer(seed=1)
    cache = KVCache()
    x = torch.randn(1, 3, 12, dtype=torch.float64)
    with torch.no_grad():
        first(x, cache=cache)
        first(x[:, :1], cache=cache)  # the same layer again: fine
        with pytest.raises(ValueError, match="another attention layer"):
            second(x[:, :1], cache=cache)
    assert len(cache) == 4  # the refused call added nothing


class _RecordingSDPA:
    """Stands in for scaled_dot_product_attention and records the masks it is given."""

    def __init__(self, monkeypatch):
        self.calls = []
        real = torch.nn.functional.scaled_dot_product_attention

        def record(q, k, v, attn_mask=None, is_causal=False, **kwargs):
            self.calls.append((attn_mask, is_causal))
            return real(q, k, v, attn_mask=attn_mask, is_causal=is_causal, **kwargs)

        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", record)


def test_a_causal_prefill_builds_no_mask_and_padding_a_boolean_one(monkeypatch):
    # An L×L float mask is 4·L² bytes a batch row (256 MiB at L = 8192): a causal prefill
    # needs none (SDPA's is_causal), a decoding step none either, and a padded prefill a
    # boolean one, as transformers' SDPA path. The outputs equal the float64 loop.
    layer = make_layer()
    x = torch.randn(2, 6, 12, dtype=torch.float64)
    keys = torch.ones(2, 6, dtype=torch.bool)
    keys[0, :2] = False  # row 0 left-padded by two
    sdpa = _RecordingSDPA(monkeypatch)
    cache = KVCache()
    with torch.no_grad():
        prefill = layer(x, causal=True, cache=cache)
        step = layer(x[:, :1], causal=True, cache=cache)
        padded = layer(x, causal=True, attn_mask=keys[:, None, None, :])
    (prefill_mask, prefill_causal), (step_mask, step_causal), (padded_mask, padded_causal) = (
        sdpa.calls
    )
    assert prefill_mask is None
    assert prefill_causal
    assert step_mask is None
    assert not step_causal
    assert padded_mask.dtype == torch.bool
    assert not padded_causal
    assert padded_mask.shape == (2, 1, 6, 6)
    full = torch.cat((x, x[:, :1]), dim=1)
    reference = multi_head_attention_loop(layer, full, causal=True)
    assert torch.allclose(prefill, reference[:, :6], atol=1e-12)
    assert torch.allclose(step, reference[:, 6:], atol=1e-12)
    # each row's real tokens alone (no positions: padding removed changes nothing else)
    assert torch.allclose(padded[1], reference[1, :6], atol=1e-12)
    alone = multi_head_attention_loop(layer, x[:1, 2:], causal=True)
    assert torch.allclose(padded[0, 2:], alone[0], atol=1e-12)


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


# --- a scheme built for another layer -----------------------------------------------------


@pytest.mark.parametrize(
    ("scheme", "match"),
    [
        (lambda: ALiBi(4), "num_heads=4"),
        (lambda: T5RelativePositionBias(2), "num_heads=2"),
        (lambda: TransformerXLRelativePosition(12, 2, 6), "num_heads=2"),
        (lambda: RotaryEmbedding(8), "head_dim=8"),
        (lambda: ShawRelativePosition(6, 2), "head_dim=6"),
    ],
)
def test_scheme_for_another_head_count_fails_at_construction(scheme, match):
    with pytest.raises(ValueError, match=match):
        MultiHeadAttention(12, 3, position=scheme())


def test_scheme_replaced_after_construction_fails_at_the_first_call():
    layer = make_layer()
    layer.position = T5RelativePositionBias(2)  # the layer has 3 heads
    with pytest.raises(ValueError, match="num_heads=2"):
        layer(torch.randn(1, 4, 12, dtype=torch.float64))


def test_a_bias_of_the_wrong_shape_is_reported_before_the_kernel():
    layer = make_layer(position=FixedBias(torch.zeros(2, 4, 4, dtype=torch.float64)))
    with pytest.raises(ValueError, match=r"FixedBias.*does not broadcast"):
        layer(torch.randn(1, 4, 12, dtype=torch.float64))


# --- grouped-query and multi-query attention ----------------------------------------------

WIDTH, HEADS = 16, 4  # head_dim 4


def with_random_parameters(scheme: PositionScheme, seed: int = 1) -> PositionScheme:
    """Every parameter of ``scheme`` random (Transformer-XL's u and v start at zero)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in scheme.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.5)
    return scheme


SCHEMES = {
    "none": lambda: None,
    "rope": lambda: RotaryEmbedding(WIDTH // HEADS),
    "alibi": lambda: ALiBi(HEADS),
    "t5": lambda: T5RelativePositionBias(HEADS, bidirectional=False, num_buckets=8),
    "shaw": lambda: ShawRelativePosition(WIDTH // HEADS, 3),  # value term: explicit weights
    "xl": lambda: TransformerXLRelativePosition(WIDTH, HEADS, WIDTH // HEADS),  # reads k
    "deberta": lambda: DebertaRelativePosition(WIDTH, HEADS, WIDTH // HEADS, 4),  # reads k
}


def scheme_layer(scheme_name: str, seed: int = 0, **kwargs) -> MultiHeadAttention:
    """A float64 layer with the scheme ``SCHEMES[scheme_name]``, all its parameters random."""
    scheme = SCHEMES[scheme_name]()
    if scheme is not None:
        scheme = with_random_parameters(scheme)
    torch.manual_seed(seed)
    return MultiHeadAttention(WIDTH, HEADS, position=scheme, **kwargs).double()


def gqa_pair(kv_heads: int, scheme_name: str) -> tuple[MultiHeadAttention, MultiHeadAttention]:
    """A layer with ``kv_heads`` key/value heads, and the same as multi-head attention.

    The second layer has ``num_kv_heads == num_heads`` and each key/value head's weights
    repeated for the query heads of its group (query head h reads head h // group): the
    independent reference, which never runs grouped-query code. They share the scheme.
    """
    grouped = scheme_layer(scheme_name, num_kv_heads=kv_heads)
    full = MultiHeadAttention(WIDTH, HEADS, position=grouped.position).double()
    state = grouped.state_dict()
    group = HEADS // kv_heads
    for name in ("k_proj.weight", "k_proj.bias", "v_proj.weight", "v_proj.bias"):
        per_head = state[name].unflatten(0, (kv_heads, WIDTH // HEADS))
        state[name] = per_head.repeat_interleave(group, dim=0).flatten(0, 1)
    full.load_state_dict(state)
    return grouped, full


@pytest.mark.parametrize("scheme_name", list(SCHEMES))
@pytest.mark.parametrize("kv_heads", [1, 2])
@pytest.mark.parametrize("causal", [False, True])
def test_grouped_query_attention_equals_repeated_key_value_weights(scheme_name, kv_heads, causal):
    grouped, full = gqa_pair(kv_heads, scheme_name)
    assert grouped.k_proj.weight.shape == (kv_heads * WIDTH // HEADS, WIDTH)
    x = torch.randn(2, 7, WIDTH, dtype=torch.float64)
    with torch.no_grad():
        expected = full(x, causal=causal)
        assert torch.allclose(grouped(x, causal=causal), expected, atol=1e-12)
        weights = grouped.attention_weights(x, causal=causal)
        assert torch.allclose(weights, full.attention_weights(x, causal=causal), atol=1e-12)
    assert not torch.allclose(expected, MultiHeadAttention(WIDTH, HEADS).double()(x), atol=1e-3)


@pytest.mark.parametrize("scheme_name", ["none", "rope", "alibi", "t5", "shaw"])
def test_grouped_query_cache_holds_key_value_heads_only(scheme_name):
    grouped, full = gqa_pair(2, scheme_name)
    x = torch.randn(2, 6, WIDTH, dtype=torch.float64)
    with torch.no_grad():
        stepwise, cache = forward_in_chunks(grouped, x, [3, 1, 1, 1])
        expected = full(x, causal=True)
    assert cache.keys.shape == (2, 2, 6, WIDTH // HEADS)
    assert cache.values.shape == (2, 2, 6, WIDTH // HEADS)
    assert torch.allclose(stepwise, expected, atol=1e-10)


def test_grouped_query_attention_with_per_row_positions_and_a_mask():
    grouped, full = gqa_pair(2, "rope")
    x = torch.randn(2, 5, WIDTH, dtype=torch.float64)
    positions = torch.tensor([[0, 0, 1, 2, 3], [4, 5, 6, 7, 8]])
    keep = torch.tensor([[False, True, True, True, True], [True] * 5])[:, None, None, :]
    with torch.no_grad():
        ours = grouped(x, positions=positions, attn_mask=keep, causal=True)
        expected = full(x, positions=positions, attn_mask=keep, causal=True)
    assert torch.allclose(ours, expected, atol=1e-12)


# --- KV cache: every row continues from its own position ----------------------------------


@pytest.mark.parametrize("scheme_name", ["rope", "alibi", "t5", "shaw"])
def test_kv_cache_continues_each_row_from_its_own_position(scheme_name):
    # Row 0: a prompt of 3 tokens, left-padded by 2; row 1: a prompt of 5. Then 3 decoding
    # steps with default positions. Each row must equal the same tokens run alone.
    layer = scheme_layer(scheme_name)
    gen = torch.Generator().manual_seed(3)
    short = torch.randn(1, 6, WIDTH, dtype=torch.float64, generator=gen)
    long = torch.randn(1, 8, WIDTH, dtype=torch.float64, generator=gen)
    pad = torch.randn(1, 2, WIDTH, dtype=torch.float64, generator=gen)
    prompt = torch.cat((torch.cat((pad, short[:, :3]), dim=1), long[:, :5]))
    positions = torch.tensor([[0, 0, 0, 1, 2], [0, 1, 2, 3, 4]])
    keep = torch.tensor([[False, False, True, True, True], [True] * 5])
    cache = KVCache()
    with torch.no_grad():
        mask = keep[:, None, None, :]
        outputs = [layer(prompt, positions=positions, attn_mask=mask, causal=True, cache=cache)]
        for t in range(3):
            keep = torch.cat((keep, torch.ones(2, 1, dtype=torch.bool)), dim=1)
            step = torch.cat((short[:, 3 + t : 4 + t], long[:, 5 + t : 6 + t]))
            mask = keep[:, None, None, :]
            outputs.append(layer(step, attn_mask=mask, causal=True, cache=cache))
        out = torch.cat(outputs, dim=1)
        alone_short, alone_long = layer(short, causal=True), layer(long, causal=True)
    assert torch.isfinite(out).all()
    assert torch.allclose(out[0, 2:], alone_short[0], atol=1e-10)
    assert torch.allclose(out[1], alone_long[0], atol=1e-10)
    assert cache.next_positions(2).tolist() == [[6, 7], [8, 9]]


def test_kv_cache_next_positions():
    cache = KVCache()
    assert cache.next_positions(3).tolist() == [0, 1, 2]
    assert cache.next_position == 0
    k = torch.zeros(2, 1, 4, 2)
    cache.append(k, k, torch.arange(4))
    assert cache.next_positions(2).tolist() == [4, 5]
    assert cache.next_position == 4
    cache.append(k[:, :, :1], k[:, :, :1], torch.tensor([[4], [9]]))
    assert cache.next_positions(1).tolist() == [[5], [10]]
    with pytest.raises(ValueError, match="next_positions"):
        cache.next_position  # noqa: B018
    with pytest.raises(ValueError, match="length"):
        cache.next_positions(0)


def test_explicit_weights_give_zero_to_a_query_that_sees_no_key():
    # Shaw's value term makes attention compute the weights itself; a left-padded query
    # under a causal mask sees no key. SDPA gives such a query zero weights; a plain
    # softmax over -inf only gives NaN, which the next layer would spread to every token.
    layer = scheme_layer("shaw")
    x = torch.randn(1, 4, WIDTH, dtype=torch.float64)
    keep = torch.tensor([[False, True, True, True]])[:, None, None, :]
    positions = torch.tensor([[0, 0, 1, 2]])
    with torch.no_grad():
        out = layer(x, positions=positions, attn_mask=keep, causal=True)
        weights = layer.attention_weights(x, positions=positions, attn_mask=keep, causal=True)
        alone = layer(x[:, 1:], causal=True)
    assert torch.isfinite(out).all()
    assert torch.equal(weights[0, :, 0], torch.zeros(HEADS, 4, dtype=torch.float64))
    assert torch.allclose(out[0, 0], layer.out_proj.bias)  # zero heads, then W_O's bias
    assert torch.allclose(out[:, 1:], alone, atol=1e-12)


# --- cross-attention ----------------------------------------------------------------------


def test_cross_attention_matches_torch_multihead_attention():
    torch.manual_seed(0)
    layer = MultiHeadAttention(12, 3, context_dim=10).double()
    reference = nn.MultiheadAttention(12, 3, kdim=10, vdim=10, batch_first=True).double()
    with torch.no_grad():
        reference.q_proj_weight.copy_(layer.q_proj.weight)
        reference.k_proj_weight.copy_(layer.k_proj.weight)
        reference.v_proj_weight.copy_(layer.v_proj.weight)
        reference.in_proj_bias.copy_(
            torch.cat((layer.q_proj.bias, layer.k_proj.bias, layer.v_proj.bias))
        )
        reference.out_proj.load_state_dict(layer.out_proj.state_dict())
    x = torch.randn(2, 4, 12, dtype=torch.float64)
    context = torch.randn(2, 6, 10, dtype=torch.float64)
    real = torch.tensor([[True] * 6, [True] * 4 + [False] * 2])  # row 1: 2 padded keys
    with torch.no_grad():
        ours = layer(x, context=context, attn_mask=real[:, None, None, :])
        theirs, _ = reference(x, context, context, key_padding_mask=~real, need_weights=False)
        # the padded context gives what the context cut to its real length gives
        cut = layer(x[1:], context=context[1:, :4])
        weights = layer.attention_weights(x, context=context)
    assert torch.allclose(ours, theirs, atol=1e-12)
    assert torch.allclose(ours[1:], cut, atol=1e-12)
    assert weights.shape == (2, 3, 4, 6)


@pytest.mark.parametrize("kv_heads", [1, 2])
def test_grouped_query_cross_attention_equals_repeated_weights(kv_heads):
    grouped, full = gqa_pair(kv_heads, "none")
    x = torch.randn(2, 3, WIDTH, dtype=torch.float64)
    context = torch.randn(2, 5, WIDTH, dtype=torch.float64)
    with torch.no_grad():
        assert torch.allclose(grouped(x, context=context), full(x, context=context), atol=1e-12)


def test_content_only_scale_equals_folding_the_scale_into_the_query_weights():
    # T5's encoder-decoder attention: no positions, logits q·k unscaled. The same layer
    # with W_Q and its bias multiplied by that factor times sqrt(Dh) and the default scale.
    torch.manual_seed(0)
    t5_like = MultiHeadAttention(12, 3, position=ContentOnly(logit_scale=1.0)).double()
    folded = MultiHeadAttention(12, 3).double()
    folded.load_state_dict(t5_like.state_dict())
    with torch.no_grad():
        folded.q_proj.weight.mul_(math.sqrt(4))
        folded.q_proj.bias.mul_(math.sqrt(4))
    x = torch.randn(2, 4, 12, dtype=torch.float64)
    context = torch.randn(2, 5, 12, dtype=torch.float64)
    with torch.no_grad():
        assert torch.allclose(t5_like(x, context=context), folded(x, context=context), atol=1e-12)
    assert ContentOnly().logit_scale(16) == 0.25
    with pytest.raises(ValueError, match="logit_scale"):
        ContentOnly(logit_scale=0.0)
    with pytest.raises(TypeError, match="logit_scale"):
        ContentOnly(logit_scale="1")


@pytest.mark.parametrize("scheme_name", ["rope", "alibi", "t5", "shaw", "xl", "deberta"])
def test_cross_attention_refuses_schemes_that_relate_positions(scheme_name):
    layer = MultiHeadAttention(WIDTH, HEADS, position=SCHEMES[scheme_name]())
    assert not layer.position.supports_cross_attention
    with pytest.raises(ValueError, match="cross-attention"):
        layer(torch.randn(1, 3, WIDTH), context=torch.randn(1, 5, WIDTH))


def test_cross_attention_accepts_a_scheme_that_opts_in():
    class SharedClock(PositionScheme):
        """A bias on the gap between time stamps that both sequences share."""

        supports_cross_attention = True

        def score_bias(self, q, k, q_positions, k_positions):
            return -0.1 * (q_positions[:, None] - k_positions[None, :]).abs().to(q.dtype)

    layer = make_layer(position=SharedClock())
    plain = make_layer()
    x = torch.randn(1, 2, 12, dtype=torch.float64)
    context = torch.randn(1, 3, 12, dtype=torch.float64)
    times = torch.tensor([0, 10])
    context_times = torch.tensor([0, 5, 10])
    with torch.no_grad():
        ours = layer(x, context=context, positions=times, context_positions=context_times)
        bias = -0.1 * (times[:, None] - context_times[None, :]).abs().double()
        q = plain._split_heads(plain.q_proj(x))
        k = plain._split_heads(plain.k_proj(context))
        v = plain._split_heads(plain.v_proj(context))
        weights = (q @ k.transpose(-2, -1) / 2 + bias).softmax(-1)
        expected = plain.out_proj(plain._merge_heads(weights @ v))
    assert torch.allclose(ours, expected, atol=1e-12)


def test_cross_attention_cache_projects_the_context_once():
    grouped, _ = gqa_pair(1, "none")
    calls = []
    grouped.k_proj.register_forward_hook(lambda *args: calls.append(1))
    x = torch.randn(2, 4, WIDTH, dtype=torch.float64)
    context = torch.randn(2, 5, WIDTH, dtype=torch.float64)
    with torch.no_grad():
        full = grouped(x, context=context)
        calls.clear()
        cache = KVCache()
        steps = [grouped(x[:, t : t + 1], context=context, cache=cache) for t in range(4)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-12)
    assert len(calls) == 1
    assert len(cache) == 5
    assert cache.keys.shape[1] == 1
    with torch.no_grad(), pytest.raises(ValueError, match="another context"):
        grouped(x[:, :1], context=context.clone(), cache=cache)
    with torch.no_grad(), pytest.raises(ValueError, match="pass that context"):
        grouped(x[:, :1], cache=cache)
    self_cache = KVCache()
    with torch.no_grad():
        grouped(x[:, :1], cache=self_cache)
        with pytest.raises(ValueError, match="self-attention keys"):
            grouped(x[:, :1], context=context, cache=self_cache)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"context": torch.randn(1, 5, 12), "causal": True}, ValueError, "causal"),
        ({"context": torch.randn(2, 5, 12)}, ValueError, "batch"),
        ({"context": torch.randn(1, 5, 7)}, ValueError, "context must have shape"),
        ({"context": torch.randn(1, 5, 12).double()}, TypeError, "dtype"),
        ({"context": torch.randn(1, 0, 12)}, ValueError, "context must contain"),
        ({"context": [[0.0] * 12]}, TypeError, "context must be a torch.Tensor"),
        ({"context_positions": torch.arange(4)}, ValueError, "context_positions needs"),
        (
            {"context": torch.randn(1, 5, 12), "context_positions": torch.arange(4)},
            ValueError,
            "context_positions must have shape",
        ),
        (
            {"context": torch.randn(1, 5, 12), "attn_mask": torch.ones(4, 4).bool()},
            ValueError,
            "attn_mask",
        ),
        ({"positions": [0, 1, 2, 3]}, TypeError, "positions must be a torch.Tensor"),
    ],
)
def test_cross_attention_rejects_bad_input(kwargs, error, match):
    layer = MultiHeadAttention(12, 3)
    with pytest.raises(error, match=match):
        layer(torch.randn(1, 4, 12), **kwargs)


def test_a_layer_with_another_context_width_needs_a_context():
    layer = MultiHeadAttention(12, 3, context_dim=8)
    with pytest.raises(ValueError, match="context_dim=8"):
        layer(torch.randn(1, 4, 12))


@pytest.mark.parametrize("kv_heads", [1, 4])
def test_explicit_weights_have_exact_gradients(kv_heads):
    # the explicit path works in place where autograd allows it; gradcheck compares its
    # gradients with finite differences, a padded query that sees no key included
    layer = scheme_layer("shaw", num_kv_heads=kv_heads)
    keep = torch.tensor([[False, True, True]])[:, None, None, :]
    x = torch.randn(1, 3, WIDTH, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(
        lambda x: layer(x, attn_mask=keep, causal=True), (x,), eps=1e-6, atol=1e-8
    )


def test_masks_whose_first_axis_would_meet_heads_or_queries_are_refused():
    # a [B, Lk] key mask with B == Lq, or [B, Lq, Lk] with B == H, broadcast by accident
    layer = MultiHeadAttention(12, 3)
    x = torch.randn(3, 3, 12)
    keep = torch.tensor([[False, True, True], [True] * 3, [True] * 3])
    with torch.no_grad():
        padded = layer(x, attn_mask=keep[:, None, None, :])
        with pytest.raises(ValueError, match=r"mask\[:, None, None, :\]"):
            layer(x, attn_mask=keep)
        with pytest.raises(ValueError, match="heads"):
            layer(x, attn_mask=keep[:, None, :].expand(3, 3, 3))
        # unambiguous shapes still pass: [Lq, Lk] with B != Lq, and [Lk]
        shared = torch.ones(3, 3, dtype=torch.bool).tril()
        assert torch.equal(layer(x[:2], attn_mask=shared), layer(x[:2], causal=True))
        assert torch.equal(layer(x[2:], attn_mask=keep[2]), layer(x[2:]))
    assert not torch.allclose(padded[0], layer(x)[0])  # the 4-D mask did mask row 0


def test_a_refused_mask_leaves_the_cache_as_it_was():
    # the dtype was checked after the keys were appended: a retry saw them twice
    layer = MultiHeadAttention(16, 2, position=RotaryEmbedding(8)).to(torch.float64)
    x = torch.randn(2, 4, 16, dtype=torch.float64)
    cache = KVCache()
    with torch.no_grad():
        with pytest.raises(TypeError, match="attn_mask"):
            layer(x, causal=True, attn_mask=torch.ones(2, 1, 1, 4, dtype=torch.long), cache=cache)
        assert len(cache) == 0
        assert cache.next_position == 0
        retried = layer(x, causal=True, cache=cache)
        assert torch.equal(retried, layer(x, causal=True))


def test_positions_with_one_row_serve_the_whole_batch():
    # transformers passes position_ids of shape [1, L] for a whole batch
    layer = MultiHeadAttention(16, 2, position=RotaryEmbedding(8)).to(torch.float64)
    x = torch.randn(3, 5, 16, dtype=torch.float64)
    positions = torch.arange(2, 7)
    with torch.no_grad():
        expected = layer(x, positions=positions, causal=True)
        assert torch.equal(layer(x, positions=positions[None], causal=True), expected)
        assert torch.equal(layer(x, positions=positions.expand(3, 5), causal=True), expected)


def test_a_heads_bias_reaches_pytorchs_fused_cpu_kernel():
    """ALiBi's [H, L, L] bias is handed to SDPA as [1, H, L, L]: PyTorch's fused CPU
    kernel takes a float mask only in 2-D or 4-D, and refuses the call when restricted to
    it otherwise. Checked against the float64 loop with the loop's own ALiBi bias."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from pecode.reference.alibi import alibi_bias_loop

    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 4, position=ALiBi(4)).eval()
    x = torch.randn(2, 9, 16)
    bias = alibi_bias_loop(layer.position.slopes.tolist(), list(range(9)), list(range(9)))
    with torch.no_grad(), sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        fused = layer(x, causal=True)
    reference = multi_head_attention_loop(layer.double(), x.double(), causal=True, bias=bias)
    torch.testing.assert_close(fused.double(), reference, rtol=1e-5, atol=1e-5)
