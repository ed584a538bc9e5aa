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
import inspect

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


# -- how much a token costs in the cache: MLA's latent against every head's keys and values --


def test_cache_entries_of_deepseek_v3_defaults():
    from pecode.mla import cache_entries_per_token

    config = transformers.DeepseekV3Config()  # the defaults are DeepSeek-V3's sizes
    sizes = (config.num_attention_heads, config.kv_lora_rank, config.qk_rope_head_dim)
    assert (*sizes, config.qk_nope_head_dim, config.v_head_dim) == (128, 512, 64, 128, 128)
    entries = cache_entries_per_token(config)
    assert (
        entries == {"mla": 512 + 64, "mha": 128 * ((128 + 64) + 128)} == {"mla": 576, "mha": 40960}
    )
    assert cache_entries_per_token(config.to_dict(), num_kv_heads=8)["gqa"] == 8 * 320
    # bfloat16, per token and layer, then over the 61 layers
    assert (2 * entries["mla"], 2 * entries["mha"]) == (1152, 81920)
    assert 2 * entries["mla"] * config.num_hidden_layers == 70272  # 68.6 KiB per token
    assert 2 * entries["mha"] * config.num_hidden_layers == 4997120  # 4.77 MiB per token


@pytest.mark.parametrize("d_h", [64, 128])
def test_deepseek_v2_table_1(d_h):
    """DeepSeek-V2 (arXiv 2405.04434) Table 1, KV cache per token in elements, l layers:
    MHA 2 n_h d_h l, GQA 2 n_g d_h l, MQA 2 d_h l, MLA (d_c + d_h^R) l ≈ 9/2 d_h l with
    d_c = 4 d_h and d_h^R = d_h / 2; "equal to GQA with only 2.25 groups"."""
    from pecode.mla import kv_cache_entries_per_token, latent_cache_entries_per_token

    n_h, n_g, layers = 128, 8, 60  # DeepSeek-V2: 128 heads of d_h = 128, 60 layers
    assert kv_cache_entries_per_token(n_h, d_h) * layers == 2 * n_h * d_h * layers
    assert kv_cache_entries_per_token(n_g, d_h) * layers == 2 * n_g * d_h * layers
    assert kv_cache_entries_per_token(1, d_h) * layers == 2 * d_h * layers
    mla = latent_cache_entries_per_token(4 * d_h, d_h // 2) * layers
    assert mla == (4 * d_h + d_h // 2) * layers == 9 * d_h * layers // 2
    assert 2 * mla == 2 * 2 * 9 * d_h * layers // 4  # 2.25 groups' 2·n_g·d_h·l, n_g = 9/4
    if d_h == 128:  # DeepSeek-V2's d_c = 512, d_h^R = 64: 576 per layer, against 32768
        assert latent_cache_entries_per_token(512, 64) == 576
        assert kv_cache_entries_per_token(n_h, d_h) == 32768


def test_cache_entries_measured_in_transformers_and_pecode_caches():
    """A tiny DeepseekV3ForCausalLM with a DynamicCache: what it stores per token and layer
    (the latent and the rotated shared key), what expanding them to every head gives (what
    a multi-head cache would hold), and what pecode's LatentCache stores, on the same
    hidden states, against the formulas."""
    from transformers import DynamicCache

    from pecode.hf import attention_from_deepseek
    from pecode.mla import cache_entries_per_token

    config = transformers.DeepseekV3Config(
        vocab_size=32,
        hidden_size=16,
        intermediate_size=32,
        moe_intermediate_size=8,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        first_k_dense_replace=1,
        num_hidden_layers=2,
        num_attention_heads=3,
        num_key_value_heads=3,
        q_lora_rank=6,
        kv_lora_rank=5,
        qk_rope_head_dim=4,
        qk_nope_head_dim=6,
        v_head_dim=5,
        max_position_embeddings=64,
        rope_interleave=False,  # transformers caches the rotated key in pecode's half layout
        attn_implementation="eager",
    )
    torch.manual_seed(5)
    model = transformers.DeepseekV3ForCausalLM(config).eval()
    formula = cache_entries_per_token(config)
    assert formula == {"mla": 5 + 4, "mha": 3 * ((6 + 4) + 5)}
    batch, length = 2, 6
    ids = torch.randint(0, 32, (batch, length), generator=torch.Generator().manual_seed(6))
    seen = {}
    first = model.model.layers[0].self_attn

    def keep_input(module, args, kwargs):
        seen["x"] = kwargs["hidden_states"]

    hook = first.register_forward_pre_hook(keep_input, with_kwargs=True)
    cache = DynamicCache(config=config)
    with torch.no_grad():
        # transformers 5.24 renamed past_key_values to cache
        parameters = inspect.signature(type(model).forward).parameters
        model(
            ids, use_cache=True, **{"cache" if "cache" in parameters else "past_key_values": cache}
        )
    hook.remove()
    for index, layer in enumerate(cache.layers):
        stored = layer.keys.numel() + layer.values.numel()
        assert stored == formula["mla"] * batch * length  # per token and layer: 9
        attention = model.model.layers[index].self_attn
        with torch.no_grad():
            keys, values = attention.expand_kv(layer.keys, layer.values)
        assert keys.numel() + values.numel() == formula["mha"] * batch * length  # 45
    # pecode's LatentCache, filled by the same layer on the same hidden states
    ours, latent = attention_from_deepseek(first), LatentCache()
    with torch.no_grad():
        ours(seen["x"], torch.arange(length), cache=latent)
    assert latent.latents.numel() + latent.rope_keys.numel() == formula["mla"] * batch * length
    assert latent.bytes_per_token() == formula["mla"] * 4  # float32
    assert torch.allclose(latent.latents, cache.layers[0].keys[:, 0], atol=1e-6)
    assert torch.allclose(latent.rope_keys, cache.layers[0].values, atol=1e-6)


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (
            lambda f: f.kv_cache_entries_per_token(0, 64),
            ValueError,
            "num_kv_heads must be positive",
        ),
        (lambda f: f.kv_cache_entries_per_token(8, 64.0), TypeError, "key_dim must be an int"),
        (
            lambda f: f.latent_cache_entries_per_token(512, 0),
            ValueError,
            "rope_dim must be positive",
        ),
        (
            lambda f: f.cache_entries_per_token({"num_attention_heads": 8}),
            TypeError,
            "kv_lora_rank",
        ),
    ],
)
def test_bad_cache_sizes_raise_naming_them(call, error, match):
    import pecode.mla

    with pytest.raises(error, match=match):
        call(pecode.mla)
