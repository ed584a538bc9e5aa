"""Multi-head latent attention (MLA) against a float64 loop and transformers' DeepSeek-V3.

:func:`pecode.reference.mla.latent_attention_loop` spells DeepSeek-V2's equations out one
scalar at a time; ``DeepseekV3Attention`` (transformers 5.23) is the model's own code,
run on a tiny random config with its weights copied into pecode's module by
:func:`pecode.hf.attention_from_deepseek`, with YaRN's attention factor on the tables,
left padding and biases. Neighbours: a RoPE that barely turns, and the other pair layout
for the rotary part, must differ.
"""

from __future__ import annotations

import copy

import pytest
import torch

from pecode.mla import LatentCache, MultiHeadLatentAttention
from pecode.reference.mla import latent_attention_loop
from pecode.rope import RotaryEmbedding

F64 = torch.float64


def layer(q_rank: int | None = 6, **options) -> MultiHeadLatentAttention:
    torch.manual_seed(0)
    module = MultiHeadLatentAttention(
        16, 3, kv_rank=5, rope_dim=4, nope_dim=6, v_dim=5, q_rank=q_rank, **options
    ).double()
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if name.endswith("norm.weight"):
                parameter.uniform_(0.5, 1.5)
            elif parameter.dim() == 2:
                parameter.mul_(3.0)  # logits of a few units, where positions matter
    return module


def x_of(length: int = 7) -> torch.Tensor:
    return torch.randn(2, length, 16, dtype=F64, generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("q_rank", [6, None], ids=["low-rank query", "one q_proj"])
def test_mla_equals_the_float64_loop(q_rank):
    module, x = layer(q_rank, rope=RotaryEmbedding(4, layout="interleaved", dtype=F64)), x_of()
    with torch.no_grad():
        ours = module(x)
    assert torch.allclose(ours, latent_attention_loop(module, x), atol=1e-12)


def test_cached_decoding_equals_one_pass_and_caches_the_latent_only():
    module, x = layer(), x_of(9)
    cache = LatentCache()
    with torch.no_grad():
        full = module(x)
        steps = [module(x[:, :4], cache=cache)]
        steps += [module(x[:, t : t + 1], cache=cache) for t in range(4, 9)]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-12)
    assert len(cache) == 9
    # per token: kv_rank + rope_dim = 9 float64 numbers, not 2·H·(head widths) = 2·3·(10 + 5)
    assert cache.bytes_per_token() == (5 + 4) * 8


def test_positions_enter_through_the_rope_part_only():
    # shifting every position by the same amount changes nothing (relative), while the
    # neighbour, a RoPE that barely turns, does
    module, x = layer(), x_of()
    with torch.no_grad():
        ours = module(x)
        shifted = module(x, positions=torch.arange(7) + 11)
        assert torch.allclose(ours, shifted, atol=1e-10)
        rope = module.rope
        module.rope = RotaryEmbedding(4, base=10.0**9, layout="interleaved")  # barely turns
        assert (module(x) - ours).abs().max() > 1e-3
        module.rope = rope


@pytest.mark.parametrize(
    ("options", "error", "match"),
    [
        ({"rope_dim": 5}, ValueError, "rope_dim must be even"),
        ({"kv_rank": 0}, ValueError, "kv_rank must be positive"),
        ({"rope": RotaryEmbedding(8)}, ValueError, "head_dim=4"),
        ({"logit_scale": -1.0}, ValueError, "logit_scale must be positive"),
    ],
)
def test_bad_options_raise_naming_them(options, error, match):
    arguments = {"kv_rank": 5, "rope_dim": 4, "nope_dim": 6, **options}
    with pytest.raises(error, match=match):
        MultiHeadLatentAttention(16, 2, **arguments)


def test_bad_calls_raise_naming_the_argument():
    module = layer()
    with pytest.raises(ValueError, match="positions must have shape"):
        module(x_of(), positions=torch.arange(6))
    with pytest.raises(TypeError, match="causal must be a bool"):
        module(x_of(), causal="True")
    with pytest.raises(TypeError, match="attn_mask must be bool or floating"):
        module(x_of(), attn_mask=torch.ones(2, 1, 7, 7, dtype=torch.long))
    with pytest.raises(ValueError, match="attn_mask"):
        module(x_of(), attn_mask=torch.ones(2, 1, 7, 5, dtype=torch.bool))


transformers = pytest.importorskip("transformers")


def deepseek_attention(q_rank: int | None, interleave: bool, bias: bool, mscale_all_dim: float):
    from transformers.models.deepseek_v3 import modeling_deepseek_v3 as deepseek

    config = transformers.DeepseekV3Config(
        vocab_size=32,
        hidden_size=16,
        num_attention_heads=3,
        num_key_value_heads=3,
        q_lora_rank=q_rank,
        kv_lora_rank=5,
        qk_rope_head_dim=4,
        qk_nope_head_dim=6,
        v_head_dim=5,
        max_position_embeddings=64,
        rope_interleave=interleave,
        attention_bias=bias,
        rope_parameters={  # DeepSeek-V3's block, shrunk: YaRN ×4 with mscale on the softmax
            "rope_type": "yarn",
            "rope_theta": 10000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 16,
            "beta_fast": 32,
            "beta_slow": 1,
            "mscale": 1.0,
            "mscale_all_dim": mscale_all_dim,  # 1: no factor on the tables, else one
        },
        attn_implementation="eager",
    )
    torch.manual_seed(3)
    attention = deepseek.DeepseekV3Attention(config, layer_idx=0).eval()
    with torch.no_grad():
        for name, parameter in attention.named_parameters():
            if name.endswith("layernorm.weight"):
                parameter.uniform_(0.5, 1.5)
            else:
                parameter.normal_(0.0, 0.5)
    return attention, deepseek.DeepseekV3RotaryEmbedding(config)


@pytest.mark.parametrize(
    ("q_rank", "interleave", "bias", "mscale_all_dim"),
    [
        (6, True, False, 1.0),
        (None, True, True, 0.8),
        (6, False, True, 0.8),
        (None, False, False, 1.0),
    ],
    ids=["V3's form", "one q_proj, biases, table factor", "half layout", "half layout, plain"],
)
def test_mla_equals_deepseek_v3_attention(q_rank, interleave, bias, mscale_all_dim):
    from pecode.hf import attention_from_deepseek

    theirs, rotary = deepseek_attention(q_rank, interleave, bias, mscale_all_dim)
    ours = attention_from_deepseek(theirs)
    assert ours.scale == theirs.scaling != (6 + 4) ** -0.5  # YaRN's mscale² on the softmax
    assert (rotary.attention_scaling == 1.0) == (mscale_all_dim == 1.0)
    x = torch.randn(2, 40, 16, generator=torch.Generator().manual_seed(4))  # past 16 positions
    real = torch.ones(2, 40, dtype=torch.bool)
    real[0, :3] = False  # row 0 padded on the left
    positions = (real.long().cumsum(-1) - 1).clamp(min=0)
    visible = real[:, None, None, :] & torch.ones(40, 40, dtype=torch.bool).tril()
    lowest = torch.finfo(torch.float32).min
    mask = torch.zeros(2, 1, 40, 40).masked_fill(~visible, lowest)
    with torch.no_grad():
        expected, _ = theirs(x, rotary(x, positions), mask)
        got = ours(x, positions, attn_mask=visible)
        assert (got - expected)[real].abs().max() < 1e-5
        assert expected.abs().max() > 0.5
        # the neighbour: the other pair layout for the rotary part
        other = copy.deepcopy(ours)
        other.rope.layout = "half" if interleave else "interleaved"
        assert (other(x, positions, attn_mask=visible) - expected)[real].abs().max() > 1e-3
