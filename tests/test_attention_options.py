"""The 2024–26 options of ``MultiHeadAttention`` against a float64 loop written from their sources.

Each option (explicit head width, separate biases, QK-norm, logit scale, soft cap, learned
sinks, sliding window, chunks, log-length query temperature) is compared with
:func:`pecode.reference.attention_layer_loop`, which spells each one out one scalar at
a time, and with a neighbour: the same layer without the option, which must differ (so
the comparison can fail). Then all together with RoPE and grouped keys, cached decoding
against a full pass, and the errors of bad options.
"""

from __future__ import annotations

import pytest
import torch

from pecode.attention import KVCache, MultiHeadAttention
from pecode.reference import attention_layer_loop
from pecode.rope import RotaryEmbedding

F64 = torch.float64


def layer(seed: int = 0, **options) -> MultiHeadAttention:
    """A float64 layer, D = 12, H = 4, every weight (gains and sinks too) drawn at random."""
    torch.manual_seed(seed)
    module = MultiHeadAttention(12, 4, **options).double()
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if name.endswith("norm.weight"):
                parameter.uniform_(0.5, 1.5)
            elif name == "sinks":
                parameter.normal_(0.0, 1.0)
            elif parameter.dim() == 2:
                parameter.mul_(2.0)  # logits of a few units, where tanh and sinks matter
    return module


def x_of(length: int = 7, seed: int = 1) -> torch.Tensor:
    return torch.randn(2, length, 12, dtype=F64, generator=torch.Generator().manual_seed(seed))


OPTIONS = {
    "head_dim 5 (H·Dh = 20 != D)": {"head_dim": 5},
    "grouped keys": {"num_kv_heads": 2},
    "qkv bias, no output bias": {"qkv_bias": True, "out_bias": False, "bias": False},
    "qk_norm per head": {"qk_norm": "head"},
    "qk_norm over the projection": {"qk_norm": "projection", "qk_norm_eps": 1e-5},
    "qk_norm per head without a gain": {"qk_norm": "l2"},
    "logit scale": {"logit_scale": 0.8},
    "soft cap": {"softcap": 1.5},
    "sinks": {"sinks": True},
    "window 3": {"window": 3},
    "chunks of 3": {"chunk": 3},
    "query temperature": {"query_temperature": {"beta": 0.5, "length": 2, "offset": 1}},
    "query temperature by index": {
        "query_temperature": {"beta": 0.5, "length": 2, "offset": 1, "by": "index"}
    },
}
# the option that changes the layer's output when it is taken away (the neighbour)
CHANGES_OUTPUT = set(OPTIONS) - {"head_dim 5 (H·Dh = 20 != D)", "grouped keys"}


@pytest.mark.parametrize("name", list(OPTIONS))
@pytest.mark.parametrize("causal", [True, False])
def test_each_option_equals_the_loop(name, causal):
    module, x = layer(**OPTIONS[name]), x_of()
    with torch.no_grad():
        ours = module(x, causal=causal)
    assert torch.allclose(ours, attention_layer_loop(module, x, causal=causal), atol=1e-12)
    if name in CHANGES_OUTPUT:
        plain = MultiHeadAttention(12, 4).double()
        own = module.state_dict()
        plain.load_state_dict(
            {k: v for k, v in own.items() if k in plain.state_dict()}, strict=False
        )
        if name.startswith("qkv bias"):  # the neighbour: biases on all four projections
            plain.out_proj.bias.data.fill_(0.3)
        with torch.no_grad():
            assert (plain(x, causal=causal) - ours).abs().max() > 1e-3, name


def test_all_options_together_with_rope_positions_and_grouped_keys():
    options = {
        "num_kv_heads": 2,
        "head_dim": 6,
        "qkv_bias": True,
        "out_bias": False,
        "qk_norm": "head",
        "softcap": 2.0,
        "sinks": True,
        "window": 4,
        "query_temperature": {"beta": 0.3, "length": 3},
    }
    module = layer(position=RotaryEmbedding(6, base=100.0), **options)
    x = x_of(8)
    positions = [3, 4, 5, 6, 7, 8, 9, 10]  # not from 0: RoPE and the temperature read them
    with torch.no_grad():
        ours = module(x, positions=torch.tensor(positions), causal=True)
    assert torch.allclose(ours, attention_layer_loop(module, x, positions), atol=1e-12)


@pytest.mark.parametrize("by", ["position", "index"])
def test_temperature_counts_the_position_or_the_index(by):
    # positions 3..10 against indices 0..7: Ministral 3 counts the first, Llama 4 the second
    temperature = {"beta": 0.5, "length": 3, "by": by}
    rope = RotaryEmbedding(6, dtype=F64)
    module = layer(position=rope, head_dim=6, query_temperature=temperature)
    x, positions = x_of(8), torch.arange(3, 11)
    with torch.no_grad():
        ours = module(x, positions=positions, causal=True)
        module.query_temperature["by"] = "index" if by == "position" else "position"
        other = module(x, positions=positions, causal=True)
        module.query_temperature["by"] = by
    assert torch.allclose(ours, attention_layer_loop(module, x, positions.tolist()), atol=1e-12)
    assert (ours - other).abs().max() > 1e-3  # the neighbour: the other count


@pytest.mark.parametrize(
    "options",
    [
        {"window": 3},
        {"chunk": 3},
        {"sinks": True, "softcap": 1.0},
        {"query_temperature": {"beta": 1.0, "length": 2}},
        {"query_temperature": {"beta": 1.0, "length": 2, "by": "index"}, "qk_norm": "l2"},
    ],
    ids=["window", "chunk", "sinks and softcap", "temperature", "temperature by index"],
)
def test_cached_decoding_equals_one_causal_pass(options):
    module, x = layer(position=RotaryEmbedding(4), head_dim=4, **options), x_of(9)
    cache = KVCache()
    with torch.no_grad():
        full = module(x, causal=True)
        steps = [module(x[:, :4], causal=True, cache=cache)]
        steps += [module(x[:, t : t + 1], causal=True, cache=cache) for t in range(4, 9)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-12)


def test_attention_weights_include_the_options():
    # the sinks take their share: a row sums to less than 1
    module, x = layer(sinks=True, window=2), x_of()
    with torch.no_grad():
        weights = module.attention_weights(x, causal=True)
    assert (weights.sum(-1) < 1).all()
    assert (weights[..., 3, :2] == 0).all()  # the window: query 3 sees keys 2 and 3 only


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"qk_norm": "rms"}, ValueError, "qk_norm must be one of"),
        ({"qk_norm": "head", "qk_norm_eps": 0.0}, ValueError, "qk_norm_eps must be positive"),
        ({"logit_scale": -1.0}, ValueError, "logit_scale must be positive"),
        ({"softcap": "50"}, TypeError, "softcap must be a real number"),
        ({"sinks": 1}, TypeError, "sinks must be a bool"),
        ({"window": 0}, ValueError, "window must be positive"),
        ({"chunk": 2.0}, TypeError, "chunk"),
        ({"qkv_bias": "no"}, TypeError, "qkv_bias must be a bool"),
        ({"head_dim": 0}, ValueError, "head_dim must be positive"),
        ({"query_temperature": {"beta": 0.1}}, ValueError, "query_temperature takes"),
        ({"query_temperature": 0.1}, TypeError, "query_temperature must be a dict"),
        (
            {"query_temperature": {"beta": 0.1, "length": 2, "by": "time"}},
            ValueError,
            r"query_temperature\['by'\] must be",
        ),
    ],
)
def test_bad_options_raise_naming_the_option(options, error, match):
    with pytest.raises(error, match=match):
        MultiHeadAttention(12, 4, **options)


def test_position_options_are_for_self_attention():
    module = MultiHeadAttention(12, 4, window=2)
    with pytest.raises(ValueError, match="window reads query and key positions"):
        module(torch.randn(1, 3, 12), context=torch.randn(1, 5, 12))


def test_gradients_through_the_options_are_exact():
    # softcap and sinks take the explicit path, whose in-place steps autograd must allow;
    # gradcheck compares the backward with finite differences in float64
    options = {"softcap": 1.0, "sinks": True, "qk_norm": "head", "window": 3}
    module = layer(position=RotaryEmbedding(4), head_dim=4, **options)
    x = x_of(6).requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x: module(x, causal=True), (x,))
    module(x, causal=True).sum().backward()
    assert all(parameter.grad is not None for parameter in module.parameters())
