"""pecode's attention inside tiny random-weight Hugging Face models, against the models' own code.

Each case builds a model from a small config with every weight drawn at random, copies one
attention layer's weights into a :class:`~pecode.attention.MultiHeadAttention` with the
matching position scheme, and compares: Llama with grouped-query attention (the whole
model's logits, with pecode's layers swapped in, through a left-padded prefill and
KV-cache decoding), GPT-NeoX (partial rotary), GPT-J (interleaved partial rotary), T5
(relative bias in the encoder and the decoder, and the encoder-decoder attention) and
BLOOM (ALiBi with left padding). Hugging Face runs its "eager" attention, an explicit
softmax, so pecode's use of ``scaled_dot_product_attention`` is checked against an
independent computation. The DeBERTa and layout-conversion checks are in
``test_hf_parity_deberta.py`` and ``test_hf_parity.py``.

The models run in float64 (Llama in float32, see ``llama_model``), but Hugging Face
computes its rotary tables and some softmaxes in float32 whatever the model's dtype, so
the two agree to float32 round-off relative to outputs of order one (measured: at most
3e-6 for Llama's logits of order 5, 5e-7 for the other layers), not to float64's.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from pecode.alibi import ALiBi
from pecode.attention import ContentOnly, KVCache, MultiHeadAttention
from pecode.relative import T5RelativePositionBias
from pecode.rope import RotaryEmbedding

transformers = pytest.importorskip("transformers")

# float32 round-off of the tables and softmaxes Hugging Face keeps in float32, for outputs
# and logits of order one (the measured errors are below 1e-6; see the module docstring)
TOLERANCE = 1e-5


def randomize(model: nn.Module, seed: int = 0) -> nn.Module:
    """Draw every parameter at random, scaled so that attention is far from uniform."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
            if parameter.dim() == 2 and "embed" not in name and "wte" not in name:
                noise = noise * parameter.shape[1] ** -0.5 * 1.5
            elif parameter.dim() == 1 and "norm" in name.lower() and "weight" in name:
                noise = 1.0 + 0.1 * noise
            elif parameter.dim() == 1:
                noise = 0.1 * noise
            parameter.copy_(noise)
    return model


def captured(module: nn.Module, run: Callable[[], object]) -> list[tuple[dict, object]]:
    """Run ``run()``; return the arguments (by name) and the output of each call of ``module``."""
    signature = inspect.signature(module.forward)
    calls = []

    def hook(_module, args, kwargs, output):
        calls.append((signature.bind(*args, **kwargs).arguments, output))

    handle = module.register_forward_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            run()
    finally:
        handle.remove()
    return calls


def copy_linear(target: nn.Linear, weight: Tensor, bias: Tensor | None = None) -> None:
    with torch.no_grad():
        target.weight.copy_(weight)
        if target.bias is not None:
            target.bias.copy_(bias)


def worst(ours: Tensor, theirs: Tensor) -> float:
    return float((ours - theirs).abs().max())


def left_padded_mask(lengths: list[int], total: int) -> Tensor:
    """``[B, total]`` attention mask (1 = token) for prompts of ``lengths`` padded on the left."""
    return torch.stack([torch.cat((torch.zeros(total - n), torch.ones(n))).long() for n in lengths])


def positions_from_mask(mask: Tensor) -> Tensor:
    """Each real token's position counted from the row's first real token; padding gets 0."""
    return ((mask.cumsum(-1) - 1) * mask).long()


# --------------------------------------------------------------------------- Llama


def llama_model(rope_parameters: dict) -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,  # grouped-query attention: groups of two query heads
        max_position_embeddings=128,
        rope_parameters=rope_parameters,
        attn_implementation="eager",
    )
    # float32: in float64, Hugging Face's eager softmax (computed in float32) turns the
    # mask's float64 minimum into -inf, so a left-padded row's padding queries, which see
    # no key, become NaN, and the second layer spreads the NaN to every real token
    return randomize(LlamaForCausalLM(config).eval())


def pecode_rope(
    head_dim: int, rope_parameters: dict, rotary_dim: int | None = None, dtype=torch.float64
):
    """RotaryEmbedding for a Hugging Face ``rope_parameters`` dict of the kinds pecode had."""
    params = dict(rope_parameters)
    kind, base = params.pop("rope_type"), params.pop("rope_theta")
    params.pop("partial_rotary_factor", None)
    scaling = None if kind == "default" else kind
    return RotaryEmbedding(
        head_dim,
        base=base,
        rotary_dim=rotary_dim,
        scaling=scaling,
        scaling_params=params or None,
        dtype=dtype,
    )


class SwappedAttention(nn.Module):
    """Stands in for a Hugging Face attention module: pecode's layer with its weights.

    It ignores what the model passes (its masks, rotary tables and cache) and uses the
    key mask and positions the test puts in ``call`` (positions ``None``: the cache's),
    and its own :class:`~pecode.attention.KVCache`.
    """

    def __init__(self, layer: MultiHeadAttention, call: dict) -> None:
        super().__init__()
        self.layer, self.call, self.cache = layer, call, KVCache()

    def forward(self, hidden_states: Tensor, *args, **kwargs) -> tuple[Tensor, None]:
        mask = self.call["mask"].bool()[:, None, None, :]
        out = self.layer(
            hidden_states,
            positions=self.call["positions"],
            attn_mask=mask,
            causal=True,
            cache=self.cache,
        )
        return out, None


def llama_with_pecode(model: nn.Module, call: dict) -> nn.Module:
    """A copy of ``model`` whose attention layers are pecode's, with the same weights."""
    config = model.config
    swapped = copy.deepcopy(model)
    for block in swapped.model.layers:
        hf = block.self_attn
        layer = MultiHeadAttention(
            config.hidden_size,
            config.num_attention_heads,
            num_kv_heads=config.num_key_value_heads,
            position=pecode_rope(hf.head_dim, config.rope_parameters, dtype=torch.float32),
            bias=config.attention_bias,
        )
        for ours, theirs in (("q_proj", "q_proj"), ("k_proj", "k_proj"), ("v_proj", "v_proj")):
            copy_linear(getattr(layer, ours), getattr(hf, theirs).weight, getattr(hf, theirs).bias)
        copy_linear(layer.out_proj, hf.o_proj.weight, hf.o_proj.bias)
        block.self_attn = SwappedAttention(layer, call)
    return swapped


LLAMA_ROPE = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    # original length 64: with head_dim 8 the four wavelengths (6.3, 63, 628, 6283) fall
    # in all three of Llama 3.1's regimes (kept, smoothed, divided by the factor)
    "llama3": {
        "rope_type": "llama3",
        "rope_theta": 10000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64,
    },
}


@pytest.mark.parametrize("rope", list(LLAMA_ROPE))
def test_llama_gqa_logits_with_left_padding_and_kv_cache_decoding(rope):
    model = llama_model(LLAMA_ROPE[rope])
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (2, 6), generator=generator)
    steps = torch.randint(0, 64, (2, 3), generator=generator)
    mask = left_padded_mask([4, 6], 6)  # row 0: two padding tokens on the left
    positions = positions_from_mask(mask)
    real = mask.bool()

    with torch.no_grad():  # Hugging Face: prefill, then three tokens with its own cache
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        theirs, past, hf_mask, hf_positions = [out.logits], out.past_key_values, mask, positions
        for t in range(3):
            hf_mask = torch.cat((hf_mask, torch.ones(2, 1, dtype=torch.long)), dim=1)
            hf_positions = hf_positions[:, -1:] + 1
            out = model(
                input_ids=steps[:, t : t + 1],
                attention_mask=hf_mask,
                position_ids=hf_positions,
                past_key_values=past,
                use_cache=True,
            )
            theirs.append(out.logits)

    call = {"mask": mask, "positions": positions}
    swapped = llama_with_pecode(model, call)
    with torch.no_grad():  # pecode: positions given for the prefill only, then the cache's
        ours = [swapped(input_ids=ids, use_cache=False).logits]
        for t in range(3):
            call["mask"] = torch.cat((call["mask"], torch.ones(2, 1, dtype=torch.long)), dim=1)
            call["positions"] = None
            ours.append(swapped(input_ids=steps[:, t : t + 1], use_cache=False).logits)

    assert worst(ours[0][real], theirs[0][real]) < TOLERANCE
    for step in range(1, 4):
        assert worst(ours[step], theirs[step]) < TOLERANCE, step
    cache = swapped.model.layers[0].self_attn.cache
    assert cache.keys.shape[1] == model.config.num_key_value_heads  # the cache is GQA's
    assert cache.next_positions(1).tolist() == [[7], [9]]  # each row from its own position
    assert theirs[1].abs().max() > 1.0  # logits of order one: the tolerance is relative


# --------------------------------------------------------------------------- GPT-NeoX


def test_gpt_neox_partial_rotary_attention():
    from transformers import GPTNeoXConfig, GPTNeoXModel

    config = GPTNeoXConfig(
        vocab_size=64,
        hidden_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        intermediate_size=64,
        max_position_embeddings=128,
        rope_parameters={
            "rope_type": "default",
            "rope_theta": 10000.0,
            "partial_rotary_factor": 0.25,
        },
        attn_implementation="eager",
    )
    model = randomize(GPTNeoXModel(config).double().eval())
    hf = model.layers[0].attention
    heads, head_dim = 4, 16
    assert hf.rotary_ndims == 4  # a quarter of each head rotates
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    ((arguments, output),) = captured(hf, lambda: model(input_ids=ids))

    rope = pecode_rope(head_dim, config.rope_parameters, rotary_dim=hf.rotary_ndims)
    layer = MultiHeadAttention(64, heads, position=rope).double()
    # the fused projection holds, per head, the rows of q, then k, then v
    weight = hf.query_key_value.weight.view(heads, 3, head_dim, 64)
    bias = hf.query_key_value.bias.view(heads, 3, head_dim)
    for index, name in enumerate(("q_proj", "k_proj", "v_proj")):
        copy_linear(
            getattr(layer, name), weight[:, index].reshape(64, 64), bias[:, index].reshape(64)
        )
    copy_linear(layer.out_proj, hf.dense.weight, hf.dense.bias)
    with torch.no_grad():
        ours = layer(arguments["hidden_states"], causal=True)
    assert worst(ours, output[0]) < TOLERANCE
    assert output[0].abs().max() > 0.5


# --------------------------------------------------------------------------- GPT-J


def test_gpt_j_interleaved_partial_rotary_attention():
    from transformers import GPTJConfig, GPTJModel

    config = GPTJConfig(
        vocab_size=64,
        n_embd=64,
        n_layer=1,
        n_head=4,
        rotary_dim=8,
        n_positions=128,
        bos_token_id=0,
        eos_token_id=0,
    )
    config._attn_implementation = "eager"
    model = randomize(GPTJModel(config).double().eval())
    hf = model.h[0].attn
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    positions = torch.tensor([list(range(9)), list(range(5, 14))])  # row 1 starts at 5
    ((arguments, output),) = captured(hf, lambda: model(input_ids=ids, position_ids=positions))

    # GPT-J rotates pairs (2i, 2i + 1) of the first rotary_dim features of each head
    rope = RotaryEmbedding(16, rotary_dim=8, layout="interleaved", dtype=torch.float64)
    layer = MultiHeadAttention(64, 4, position=rope, bias=False).double()
    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        copy_linear(getattr(layer, name), getattr(hf, name).weight)
    with torch.no_grad():
        ours = layer(arguments["hidden_states"], positions=positions, causal=True)
    assert worst(ours, output[0]) < TOLERANCE
    assert output[0].abs().max() > 0.5


# --------------------------------------------------------------------------- T5


def t5_bias(hf: nn.Module, *, bidirectional: bool) -> T5RelativePositionBias:
    """pecode's T5 bias with the table of Hugging Face's attention module ``hf``."""
    scheme = T5RelativePositionBias(
        4, bidirectional=bidirectional, num_buckets=8, max_distance=20
    ).double()
    with torch.no_grad():
        scheme.bias.weight.copy_(hf.relative_attention_bias.weight)
    return scheme


def test_t5_relative_bias_and_encoder_decoder_attention():
    from transformers import T5Config, T5Model

    config = T5Config(
        vocab_size=64,
        d_model=32,
        d_kv=8,
        d_ff=32,
        num_layers=1,
        num_decoder_layers=1,
        num_heads=4,
        relative_attention_num_buckets=8,
        relative_attention_max_distance=20,
        dropout_rate=0.0,
        feed_forward_proj="relu",
        decoder_start_token_id=0,
        attn_implementation="eager",
    )
    model = randomize(T5Model(config).double().eval())
    generator = torch.Generator().manual_seed(1)
    # 30 encoder tokens: offsets reach the log-spaced buckets and past max_distance
    enc_ids = torch.randint(0, 64, (2, 30), generator=generator)
    enc_mask = torch.ones(2, 30, dtype=torch.long)
    enc_mask[1, 24:] = 0  # row 1: six padding tokens on the right
    dec_ids = torch.randint(0, 64, (2, 25), generator=generator)
    encoder_self = model.encoder.block[0].layer[0].SelfAttention
    decoder_self = model.decoder.block[0].layer[0].SelfAttention
    cross = model.decoder.block[0].layer[1].EncDecAttention

    def run():
        model(input_ids=enc_ids, attention_mask=enc_mask, decoder_input_ids=dec_ids)

    key_mask = enc_mask.bool()[:, None, None, :]
    cases = [  # (HF module, pecode scheme, call options)
        (encoder_self, t5_bias(encoder_self, bidirectional=True), {"attn_mask": key_mask}),
        (decoder_self, t5_bias(decoder_self, bidirectional=False), {"causal": True}),
        (cross, ContentOnly(logit_scale=1.0), {"attn_mask": key_mask}),  # no bias, unscaled
    ]
    for hf, scheme, options in cases:
        ((arguments, output),) = captured(hf, run)
        layer = MultiHeadAttention(32, 4, position=scheme, bias=False).double()
        for ours, theirs in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("out_proj", "o")):
            copy_linear(getattr(layer, ours), getattr(hf, theirs).weight)
        context = arguments.get("key_value_states")
        with torch.no_grad():
            ours = layer(arguments["hidden_states"], context=context, **options)
        assert worst(ours, output[0]) < TOLERANCE, type(scheme).__name__
        assert output[0].abs().max() > 0.5


# --------------------------------------------------------------------------- BLOOM


def test_bloom_alibi_attention_with_left_padding():
    from transformers import BloomConfig, BloomModel

    heads = 6  # not a power of two: the slopes interleave two geometric sequences
    config = BloomConfig(vocab_size=64, hidden_size=48, n_layer=1, n_head=heads)
    config._attn_implementation = "eager"
    model = randomize(BloomModel(config).double().eval())
    hf = model.h[0].self_attention
    ids = torch.randint(0, 64, (2, 10), generator=torch.Generator().manual_seed(1))
    mask = left_padded_mask([7, 10], 10)
    ((arguments, output),) = captured(hf, lambda: model(input_ids=ids, attention_mask=mask))

    layer = MultiHeadAttention(48, heads, position=ALiBi(heads)).double()
    # the fused projection holds, per head, the rows of q, then k, then v
    weight = hf.query_key_value.weight.view(heads, 3, 8, 48)
    bias = hf.query_key_value.bias.view(heads, 3, 8)
    for index, name in enumerate(("q_proj", "k_proj", "v_proj")):
        copy_linear(
            getattr(layer, name), weight[:, index].reshape(48, 48), bias[:, index].reshape(48)
        )
    copy_linear(layer.out_proj, hf.dense.weight, hf.dense.bias)
    with torch.no_grad():  # BLOOM's positions; ALiBi sees only their differences
        ours = layer(
            arguments["hidden_states"],
            positions=positions_from_mask(mask),
            attn_mask=mask.bool()[:, None, None, :],
            causal=True,
        )
    theirs = output[0] - arguments["residual"]  # BLOOM's attention adds the residual
    real = mask.bool()
    assert worst(ours[real], theirs[real]) < TOLERANCE
    assert theirs[real].abs().max() > 0.5
