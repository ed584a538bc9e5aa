"""pecode's attention inside tiny random-weight Hugging Face models, against the models' own code.

Each case builds a model from a small config with every weight drawn at random, builds
pecode's :class:`~pecode.attention.MultiHeadAttention` from the model's attention with
:mod:`pecode.hf` (weights copied, position scheme from the config), and compares:

- Llama with grouped-query attention, for each rope type of transformers (default,
  linear, dynamic, yarn, llama3, longrope), its rotary embedding read from the config
  dict by ``RotaryEmbedding.from_hf_config``: the whole model's logits with pecode's
  layers, pecode's own masks and :class:`~pecode.attention.KVCache`, through a
  left-padded prefill and decoding steps that cross the trained length where the rope
  type depends on it (dynamic, longrope); then the same model run by
  :func:`pecode.hf.swap_llama_attention` inside transformers' ``generate``, on the
  model's own masks (eager's float masks, sdpa's boolean ones or none) and cache;
- GPT-NeoX (partial rotary), GPT-J (interleaved partial rotary), T5 (relative bias in
  the encoder and decoder, a layer that borrows the first layer's table, and the
  encoder-decoder attention) and BLOOM (ALiBi with left padding), one attention layer
  each.

Hugging Face runs its "eager" attention, an explicit softmax, so pecode's use of
``scaled_dot_product_attention`` is checked against an independent computation. The
DeBERTa and layout-conversion checks are in ``test_hf_parity_deberta.py`` and
``test_hf_parity.py``. The models run in float64 (Llama in float32, see
``llama_model``), but Hugging Face computes its rotary tables and some softmaxes in
float32 whatever the model's dtype, so the two agree to float32 round-off relative to
outputs of order one (measured: at most 7e-6 for Llama's logits of order 5, 6e-7 for
the other layers), not to float64's.
"""

from __future__ import annotations

import copy
import inspect
from collections.abc import Callable

import pytest
import torch
from torch import Tensor, nn

from pecode.alibi import ALiBi
from pecode.attention import ContentOnly, KVCache, MultiHeadAttention, PositionScheme
from pecode.relative import T5RelativePositionBias
from pecode.rope import RotaryEmbedding

transformers = pytest.importorskip("transformers")

from pecode.hf import (  # noqa: E402
    HFLlamaAttention,
    attention_from_bloom,
    attention_from_gpt_neox,
    attention_from_gptj,
    attention_from_llama,
    attention_from_t5,
    swap_attention,
    swap_llama_attention,
    unswap_attention,
)

# float32 round-off of the tables and softmaxes Hugging Face keeps in float32, for one
# layer's outputs of order one (measured: below 6e-7; see the module docstring)
TOLERANCE = 1e-5
# the same for a whole float32 Llama's logits, of order 5 (measured: below 7e-6 here and
# under ATEN_CPU_CAPABILITY=avx2, about 15 float32 ulps at 5)
LOGITS_TOLERANCE = 3e-5


@pytest.fixture(autouse=True)
def one_thread():
    """Run these tiny models on one thread, then restore the thread count.

    Their matrices have a few hundred entries: on a loaded machine the threads of a
    parallel region wait for each other far longer than they compute (measured on two
    busy cores: 71 s for this file with two threads, 9 s with one).
    """
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


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


def worst(ours: Tensor, theirs: Tensor) -> float:
    return float((ours - theirs).abs().max())


def left_padded_mask(lengths: list[int], total: int) -> Tensor:
    """``[B, total]`` attention mask (1 = token) for prompts of ``lengths`` padded on the left."""
    return torch.stack([torch.cat((torch.zeros(total - n), torch.ones(n))).long() for n in lengths])


def positions_from_mask(mask: Tensor) -> Tensor:
    """Each real token's position counted from the row's first real token; padding gets 0."""
    return ((mask.cumsum(-1) - 1) * mask).long()


# --------------------------------------------------------------------------- Llama

# The trained length of the length-dependent rope types: the prompts reach position 5 and
# the four decoding steps positions 6 to 9, so the last two steps cross it.
TRAINED = 8

# Llama's config.json fields for each rope type, as a dict; transformers' LlamaConfig and
# pecode's RotaryEmbedding.from_hf_config read the same dict.
LLAMA_ROPE = {
    "default": {"rope_type": "default", "rope_theta": 10000.0},
    "linear": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0},
    # dynamic NTK reads its trained length from max_position_embeddings (set below)
    "dynamic": {"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 4.0},
    "yarn": {
        "rope_type": "yarn",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "original_max_position_embeddings": TRAINED,
    },
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
    # Phi-3's form, with made-up factor lists of the right length (head_dim / 2)
    "longrope": {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "factor": 4.0,
        "short_factor": [1.0, 1.02, 1.05, 1.1],
        "long_factor": [1.0, 2.0, 5.0, 12.0],
        "original_max_position_embeddings": TRAINED,
    },
}
# the rope types whose frequencies change once a position reaches the trained length
LENGTH_DEPENDENT = ("dynamic", "longrope")


def llama_config(rope: str, rope_parameters: dict | None = None) -> dict:
    """A tiny Llama's ``config.json`` as a dict, with GQA and the rope type ``rope``."""
    return {
        "model_type": "llama",
        "vocab_size": 64,
        "hidden_size": 32,
        "intermediate_size": 48,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,  # grouped-query attention: groups of two query heads
        "max_position_embeddings": TRAINED if rope == "dynamic" else 4 * TRAINED,
        "rope_parameters": LLAMA_ROPE[rope] if rope_parameters is None else rope_parameters,
    }


def llama_model(config: dict, attn_implementation: str = "eager") -> nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    fields = {key: value for key, value in config.items() if key != "model_type"}
    hf_config = LlamaConfig(**fields, attn_implementation=attn_implementation)
    # float32: in float64, Hugging Face's eager softmax (computed in float32) turns the
    # mask's float64 minimum into -inf, so a left-padded row's padding queries, which see
    # no key, become NaN, and the second layer spreads the NaN to every real token
    return randomize(LlamaForCausalLM(hf_config).eval())


class SwappedAttention(nn.Module):
    """Stands in for a Hugging Face attention module: pecode's layer, masks and cache.

    It ignores what the model passes (its masks, rotary tables and cache) and uses the
    key mask and positions the test puts in ``call`` (positions ``None``: the cache's),
    and its own :class:`~pecode.attention.KVCache`: everything but the weights is
    pecode's, unlike :class:`pecode.hf.HFLlamaAttention`, which uses the model's masks
    and cache.
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


def llama_with_pecode(model: nn.Module, config: dict, call: dict) -> nn.Module:
    """A copy of ``model`` whose attention layers are pecode's, RoPE read from ``config``."""
    swapped = copy.deepcopy(model)
    for block in swapped.model.layers:
        rope = RotaryEmbedding.from_hf_config(config)  # the dict, verbatim
        layer = attention_from_llama(block.self_attn, position=rope)
        block.self_attn = SwappedAttention(layer, call)
    return swapped


# transformers 5.24 renamed the cache argument and output past_key_values to cache
CACHE_KEYWORD = (
    "cache"
    if "cache" in inspect.signature(transformers.LlamaForCausalLM.forward).parameters
    else "past_key_values"
)


def decode_with_hf(model: nn.Module, ids: Tensor, mask: Tensor, steps: Tensor) -> list[Tensor]:
    """Hugging Face's logits: a prefill of ``ids``, then ``steps`` one token at a time."""
    positions = positions_from_mask(mask)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True)
        logits, past = [out.logits], out[CACHE_KEYWORD]
        for t in range(steps.shape[1]):
            mask = torch.cat((mask, torch.ones(len(ids), 1, dtype=torch.long)), dim=1)
            positions = positions[:, -1:] + 1
            out = model(
                input_ids=steps[:, t : t + 1],
                attention_mask=mask,
                position_ids=positions,
                use_cache=True,
                **{CACHE_KEYWORD: past},
            )
            logits.append(out.logits)
    return logits


def decode_with_pecode(
    model: nn.Module, config: dict, ids: Tensor, mask: Tensor, steps: Tensor
) -> tuple[list[Tensor], nn.Module]:
    """The same with pecode's layers, masks and caches; positions given for the prefill only."""
    call = {"mask": mask, "positions": positions_from_mask(mask)}
    swapped = llama_with_pecode(model, config, call)
    with torch.no_grad():
        logits = [swapped(input_ids=ids, use_cache=False).logits]
        for t in range(steps.shape[1]):
            call["mask"] = torch.cat((call["mask"], torch.ones(len(ids), 1, dtype=torch.long)), 1)
            call["positions"] = None  # each row continues from its own position
            logits.append(swapped(input_ids=steps[:, t : t + 1], use_cache=False).logits)
    return logits, swapped


def prompts() -> tuple[Tensor, Tensor, Tensor]:
    """Token ids ``[2, 6]`` (row 0 padded with two tokens on the left), mask, 4 steps."""
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 64, (2, 6), generator=generator)
    steps = torch.randint(0, 64, (2, 4), generator=generator)
    return ids, left_padded_mask([4, 6], 6), steps


GREEDY = {
    "do_sample": False,
    "output_logits": True,
    "return_dict_in_generate": True,
    "pad_token_id": 0,
}


def generate_both(model: nn.Module, swapped: nn.Module, ids: Tensor, mask: Tensor | None, new: int):
    """Greedy ``generate`` of both models: the same tokens and logits; returns theirs."""
    theirs = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, **GREEDY)
    ours = swapped.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new, **GREEDY)
    assert torch.equal(ours.sequences, theirs.sequences)
    for step, (a, b) in enumerate(zip(ours.logits, theirs.logits, strict=True)):
        assert worst(a, b) < LOGITS_TOLERANCE, step
    return theirs


@pytest.mark.parametrize("rope", list(LLAMA_ROPE))
def test_llama_gqa_logits_with_left_padding_and_kv_cache_decoding(rope):
    config = llama_config(rope)
    model = llama_model(config)
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    ids, mask, steps = prompts()
    theirs = decode_with_hf(model, ids, mask, steps)
    ours, swapped = decode_with_pecode(model, config, ids, mask, steps)

    real = mask.bool()
    assert worst(ours[0][real], theirs[0][real]) < LOGITS_TOLERANCE
    for step in range(1, 5):
        assert worst(ours[step], theirs[step]) < LOGITS_TOLERANCE, step
    cache = swapped.model.layers[0].self_attn.cache
    assert cache.keys.shape[1] == model.config.num_key_value_heads  # the cache is GQA's
    assert cache.next_positions(1).tolist() == [[8], [10]]  # each row from its own position
    assert theirs[1].abs().max() > 1.0  # logits of order one or more, as the tolerance assumes


# A neighbour of each length-dependent rope type that agrees with it below the trained
# length and not past it: unscaled RoPE for dynamic, the short factors twice for longrope.
NEIGHBOURS = {
    "dynamic": {"rope_type": "default", "rope_theta": 10000.0},
    "longrope": {**LLAMA_ROPE["longrope"], "long_factor": LLAMA_ROPE["longrope"]["short_factor"]},
}


@pytest.mark.parametrize("rope", LENGTH_DEPENDENT)
def test_decoding_crosses_the_trained_length(rope):
    # The check above can fail where it matters: the steps at positions 8 and 9 (the last
    # two) are scaled, and a rope that never switches gets them wrong.
    config = llama_config(rope)
    model = llama_model(config)
    ids, mask, steps = prompts()
    theirs = decode_with_hf(model, ids, mask, steps)
    neighbour = llama_config(rope, NEIGHBOURS[rope])
    ours, _ = decode_with_pecode(model, neighbour, ids, mask, steps)
    real = mask.bool()
    assert worst(ours[0][real], theirs[0][real]) < LOGITS_TOLERANCE
    assert worst(ours[1], theirs[1]) < LOGITS_TOLERANCE  # positions 4 and 6: below 8
    assert worst(ours[2], theirs[2]) < LOGITS_TOLERANCE  # positions 5 and 7: below 8
    assert worst(ours[3], theirs[3]) > 100 * LOGITS_TOLERANCE  # positions 6 and 8: scaled
    assert worst(ours[4], theirs[4]) > 100 * LOGITS_TOLERANCE  # positions 7 and 9: scaled


@pytest.mark.parametrize("rope", list(LLAMA_ROPE))
def test_swap_llama_attention_inside_generate(rope):
    model = llama_model(llama_config(rope))  # eager: float masks
    swapped = swap_llama_attention(copy.deepcopy(model))
    assert all(isinstance(block.self_attn, HFLlamaAttention) for block in swapped.model.layers)
    ids, mask, _ = prompts()
    generate_both(model, swapped, ids, mask, 4)


@pytest.mark.parametrize("lengths", [[4, 6], [6, 6]], ids=["left-padded", "unpadded"])
def test_swap_llama_attention_with_sdpa_masks(lengths):
    # sdpa gives boolean masks, or none at all for an unpadded batch (a plain causal pass)
    config = llama_config("llama3")
    reference = llama_model(config)
    swapped = swap_llama_attention(llama_model(config, attn_implementation="sdpa"))
    ids, _, steps = prompts()
    mask = left_padded_mask(lengths, 6)
    theirs = decode_with_hf(reference, ids, mask, steps)
    ours = decode_with_hf(swapped, ids, mask, steps)
    real = mask.bool()
    assert worst(ours[0][real], theirs[0][real]) < LOGITS_TOLERANCE
    for step in range(1, 5):
        assert worst(ours[step], theirs[step]) < LOGITS_TOLERANCE, step


def test_hf_builders_and_wrapper_refuse_what_they_cannot_do():

    with pytest.raises(TypeError, match="q_proj"):
        attention_from_llama(nn.Linear(4, 4))
    with pytest.raises(TypeError, match="MultiHeadAttention"):
        HFLlamaAttention(nn.Linear(4, 4), 0)
    with pytest.raises(ValueError, match="ALiBi"):
        HFLlamaAttention(MultiHeadAttention(8, 2, position=ALiBi(2)), 0)
    with pytest.raises(ValueError, match="window or chunks"):
        HFLlamaAttention(MultiHeadAttention(8, 2, window=4), 0)

    model = llama_model(llama_config("default"))
    attention = model.model.layers[0].self_attn
    attention.q_proj = nn.Linear(32, 32, bias=True)  # Qwen2: q, k, v with a bias, o without
    with pytest.raises(ValueError, match="biases"):
        attention_from_llama(attention)

    model = llama_model(llama_config("default"))
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="flash_attention_2"):
        swap_llama_attention(model)

    wrapper = HFLlamaAttention(MultiHeadAttention(32, 4, position=RotaryEmbedding(8)), 0)
    with pytest.raises(ValueError, match="position_ids"):
        wrapper(torch.zeros(1, 3, 32))
    with pytest.raises(TypeError, match="attention_mask"):
        wrapper(
            torch.zeros(1, 3, 32), attention_mask=torch.ones(3, 3), position_ids=torch.arange(3)
        )


def test_wrapper_reads_the_cache_under_both_names_and_refuses_another():
    # transformers 5.24 passes cache=, 5.23 past_key_values=; before, cache= went into
    # **kwargs unread and every decoding step attended to its own token only
    from transformers import DynamicCache

    layer = MultiHeadAttention(32, 4, position=RotaryEmbedding(8)).eval()
    x = torch.randn(1, 5, 32, generator=torch.Generator().manual_seed(0))
    positions = torch.arange(5)[None]
    outputs = {}
    for name in ("cache", "past_key_values"):
        wrapper, cache = HFLlamaAttention(layer, 0), DynamicCache()
        with torch.no_grad():
            wrapper(x[:, :4], position_ids=positions[:, :4], **{name: cache})
            outputs[name], _ = wrapper(x[:, 4:], position_ids=positions[:, 4:], **{name: cache})
        assert cache.get_seq_length(0) == 5, name
    with torch.no_grad():
        full = layer(x, positions=positions, causal=True)
        uncached = layer(x[:, 4:], positions=positions[:, 4:])
    for name, out in outputs.items():
        assert worst(out, full[:, 4:]) < 1e-6, name
    assert worst(uncached, full[:, 4:]) > 1e-3  # what reading no cache gives instead
    wrapper = HFLlamaAttention(layer, 0)
    with pytest.raises(ValueError, match="two different caches"):
        wrapper(x, position_ids=positions, cache=DynamicCache(), past_key_values=DynamicCache())
    with pytest.raises(ValueError, match="a cache came as kv_cache="):
        wrapper(x, position_ids=positions, kv_cache=DynamicCache())


# tiny configs of models whose attention has Llama's four projections but computes
# something pecode does not rebuild (transformers 5.23): interleaved pairs and LayerNorm
OTHER_SEMANTICS = {
    "cohere": ("CohereConfig", "CohereForCausalLM", {"pad_token_id": 0, "eos_token_id": 1}),
}


@pytest.mark.parametrize("model_type", list(OTHER_SEMANTICS))
def test_llama_builders_refuse_attention_that_computes_something_else(model_type):
    # before the check these ran without error to logits far from transformers' own
    config_name, model_name, extra = OTHER_SEMANTICS[model_type]
    fields = {k: v for k, v in llama_config("default").items() if k != "model_type"}
    config = getattr(transformers, config_name)(**fields, **extra, attn_implementation="sdpa")
    model = getattr(transformers, model_name)(config).eval()
    with pytest.raises(ValueError, match=repr(model_type)):
        attention_from_llama(model.model.layers[0].self_attn)
    with pytest.raises(ValueError, match=repr(model_type)):
        swap_llama_attention(model)


def test_llama_builder_refuses_q_norm_and_reads_the_scaling():
    # a "llama" config does not vouch for the module: check what it computes
    model = llama_model(llama_config("default"))
    attention = model.model.layers[0].self_attn
    attention.q_norm = nn.LayerNorm(8)
    with pytest.raises(ValueError, match="q_norm"):
        attention_from_llama(attention)
    del attention.q_norm
    assert attention_from_llama(attention).logit_scale is None  # 1/sqrt(8), the scheme's
    attention.scaling = 0.5  # Granite's attention_multiplier in place of 1/sqrt(8)
    assert attention_from_llama(attention).logit_scale == 0.5


def test_swap_mistral_with_sliding_window_inside_generate():
    # the sliding-window cache returns the last sliding_window - 1 keys and the new ones:
    # with a window of 4, decoding past it (prompt 6, 5 new tokens) used to fail in SDPA
    from transformers import MistralConfig, MistralForCausalLM

    fields = {k: v for k, v in llama_config("default").items() if k != "model_type"}
    config = MistralConfig(**fields, sliding_window=4, attn_implementation="sdpa")
    model = randomize(MistralForCausalLM(config).eval())
    swapped = swap_llama_attention(copy.deepcopy(model))
    ids = torch.randint(1, 64, (2, 6), generator=torch.Generator().manual_seed(3))
    generate_both(model, swapped, ids, None, 5)


def test_swapped_model_refuses_a_static_cache():
    # StaticCache returns all its preallocated slots, not past + new keys
    swapped = swap_llama_attention(llama_model(llama_config("default"), "sdpa"))
    ids, _, _ = prompts()
    with pytest.raises(ValueError, match="StaticLayer"):
        swapped.generate(
            input_ids=ids, max_new_tokens=2, do_sample=False, cache_implementation="static"
        )


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
    assert hf.rotary_ndims == 4  # a quarter of each head rotates
    ids = torch.randint(0, 64, (2, 9), generator=torch.Generator().manual_seed(1))
    ((arguments, output),) = captured(hf, lambda: model(input_ids=ids))

    layer = attention_from_gpt_neox(hf)
    assert layer.position.rotary_dim == 4
    assert layer.q_proj.weight.dtype == torch.float64
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
    layer = attention_from_gptj(hf)
    assert (layer.position.layout, layer.position.rotary_dim) == ("interleaved", 8)
    with torch.no_grad():
        ours = layer(arguments["hidden_states"], positions=positions, causal=True)
    assert worst(ours, output[0]) < TOLERANCE
    assert output[0].abs().max() > 0.5
    hf.rotary_dim = None  # older configs allowed it (5.23's refuses it)
    with pytest.raises(ValueError, match="rotary_dim is None"):
        attention_from_gptj(hf)


# --------------------------------------------------------------------------- T5


def test_t5_relative_bias_and_encoder_decoder_attention():
    from transformers import T5Config, T5Model

    config = T5Config(
        vocab_size=64,
        d_model=32,
        d_kv=8,
        d_ff=32,
        num_layers=2,
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
    encoder_first = model.encoder.block[0].layer[0].SelfAttention
    encoder_second = model.encoder.block[1].layer[0].SelfAttention  # no table of its own
    decoder_self = model.decoder.block[0].layer[0].SelfAttention
    cross = model.decoder.block[0].layer[1].EncDecAttention

    def run():
        model(input_ids=enc_ids, attention_mask=enc_mask, decoder_input_ids=dec_ids)

    key_mask = enc_mask.bool()[:, None, None, :]
    cases = [  # (HF module, pecode layer, call options)
        (encoder_first, attention_from_t5(encoder_first), {"attn_mask": key_mask}),
        (
            encoder_second,
            attention_from_t5(encoder_second, bias_from=encoder_first),
            {"attn_mask": key_mask},
        ),
        (decoder_self, attention_from_t5(decoder_self), {"causal": True}),
        (cross, attention_from_t5(cross, cross_attention=True), {"attn_mask": key_mask}),
    ]
    for hf, layer, options in cases:
        ((arguments, output),) = captured(hf, run)
        context = arguments.get("key_value_states")
        with torch.no_grad():
            ours = layer(arguments["hidden_states"], context=context, **options)
        assert worst(ours, output[0]) < TOLERANCE, type(layer.position).__name__
        assert output[0].abs().max() > 0.5
    schemes = [layer.position for _, layer, _ in cases]
    assert [type(s) for s in schemes] == [T5RelativePositionBias] * 3 + [ContentOnly]
    assert [s.bidirectional for s in schemes[:3]] == [True, True, False]
    with pytest.raises(ValueError, match="bias_from"):
        attention_from_t5(encoder_second)


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

    layer = attention_from_bloom(hf)
    assert isinstance(layer.position, ALiBi)
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


# --------------------------------------------------------------------------- 2024–26 families

# Tiny configs of the families attention_from_hf rebuilds, each with what sets it apart
# from Llama made to matter at this size: a window of 3 keys (the prompts are 6 long and
# generate 5 more), a head width other than hidden_size / heads, soft caps and sinks at
# the logits' scale, layer types with different RoPE.
FAMILIES = {
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {"head_dim": 16}),
    "qwen3_moe": (
        "Qwen3MoeConfig",
        "Qwen3MoeForCausalLM",
        {"head_dim": 16, "num_experts": 2, "num_experts_per_tok": 1, "moe_intermediate_size": 16},
    ),
    "ministral": (
        "MinistralConfig",
        "MinistralForCausalLM",
        {
            "head_dim": 16,
            "sliding_window": 3,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
    "olmo2": ("Olmo2Config", "Olmo2ForCausalLM", {}),
    "olmo3": (
        "Olmo3Config",
        "Olmo3ForCausalLM",
        {
            "sliding_window": 3,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_scaling": {"rope_type": "linear", "factor": 4.0},
            "rope_theta": 500000.0,
        },
    ),
    "granite": ("GraniteConfig", "GraniteForCausalLM", {"attention_multiplier": 0.5}),
    "gemma2": (
        "Gemma2Config",
        "Gemma2ForCausalLM",
        {
            "head_dim": 16,
            "query_pre_attn_scalar": 12,
            "attn_logit_softcapping": 2.0,
            "final_logit_softcapping": None,
            "sliding_window": 3,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
    "gemma3_text": (
        "Gemma3TextConfig",
        "Gemma3ForCausalLM",
        {
            "head_dim": 16,
            "query_pre_attn_scalar": 12,
            # in the config, but Gemma 3's attention never applies it (nor may pecode)
            "attn_logit_softcapping": 2.0,
            "sliding_window": 3,
            "layer_types": ["sliding_attention", "full_attention"],
            "rope_theta": 1000.0,
            "rope_local_base_freq": 10.0,
            "rope_scaling": {"rope_type": "linear", "factor": 4.0},
        },
    ),
    "smollm3": ("SmolLM3Config", "SmolLM3ForCausalLM", {"no_rope_layers": [1, 0]}),
    "gpt_oss": (
        "GptOssConfig",
        "GptOssForCausalLM",
        {
            "head_dim": 8,
            "num_local_experts": 2,
            "num_experts_per_tok": 1,
            "sliding_window": 3,
            "layer_types": ["sliding_attention", "full_attention"],
        },
    ),
    # Phi-4-mini's form: one fused qkv_proj, RoPE on part of each head (there 3/4, here 1/2)
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"head_dim": 8, "partial_rotary_factor": 0.5}),
    "glm4": ("Glm4Config", "Glm4ForCausalLM", {"head_dim": 8, "partial_rotary_factor": 0.5}),
    "cohere2": (
        "Cohere2Config",
        "Cohere2ForCausalLM",
        {
            "sliding_window": 3,
            "layer_types": ["sliding_attention", "full_attention"],
            "logit_scale": 1.0,  # its default 1/16 shrinks the logits below the check's scale
        },
    ),
    "ministral3": (
        "Ministral3Config",
        "Ministral3ForCausalLM",
        {
            "head_dim": 8,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 2.0,
                "original_max_position_embeddings": 4,
                "llama_4_scaling_beta": 0.5,
            },
        },
    ),
    # Llama 4 (MoE feed-forward): complex RoPE in chunks of 4 with an L2 qk-norm on layer
    # 0, no RoPE and the query temperature by index (here from index 2) on layer 1
    "llama4_text": (
        "Llama4TextConfig",
        "Llama4ForCausalLM",
        {
            "head_dim": 8,
            "intermediate_size_mlp": 48,
            "num_local_experts": 2,
            "num_experts_per_tok": 1,
            "no_rope_layers": [1, 0],
            "attention_chunk_size": 4,
            "floor_scale": 3,
            "attn_scale": 1.0,
            "rope_parameters": {  # Llama 4 Scout's block: a step at the band
                "rope_type": "llama3",
                "rope_theta": 500000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 1.0,
                "original_max_position_embeddings": 8,
            },
        },
    ),
}


def family_model(model_type: str, attn_implementation: str = "eager") -> nn.Module:
    config_name, model_name, extra = FAMILIES[model_type]
    fields = {
        k: v
        for k, v in llama_config("default").items()
        if k not in ("model_type", "rope_parameters")
    }
    if "rope_parameters" not in extra:
        fields["rope_theta"] = extra.get("rope_theta", 10000.0)
    fields = {**fields, "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2, **extra}
    config = getattr(transformers, config_name)(**fields, attn_implementation=attn_implementation)
    return randomize(getattr(transformers, model_name)(config).eval())


# what sets each family apart, taken away from the swapped model: the logits must move
FAMILY_NEIGHBOURS = {
    "qwen2": lambda a: a.q_proj.bias.data.zero_(),
    "qwen3": lambda a: a.q_norm.weight.data.fill_(1.0),
    "qwen3_moe": lambda a: a.k_norm.weight.data.fill_(1.0),
    "ministral": lambda a: setattr(a, "position", RotaryEmbedding(16, base=500.0)),
    "olmo2": lambda a: a.k_norm.weight.data.fill_(1.0),
    "olmo3": lambda a: setattr(a, "position", RotaryEmbedding(8, base=500000.0)),
    "granite": lambda a: setattr(a, "logit_scale", None),
    "gemma2": lambda a: setattr(a, "softcap", None),
    "gemma3_text": lambda a: setattr(a, "position", RotaryEmbedding(16, base=10.0)),
    "smollm3": lambda a: setattr(a, "position", RotaryEmbedding(8)),
    "gpt_oss": lambda a: a.sinks.data.zero_(),
    "phi3": lambda a: setattr(a, "position", RotaryEmbedding(8)),  # the whole head rotated
    "glm4": lambda a: setattr(a, "position", RotaryEmbedding(8, rotary_dim=4)),  # half layout
    "cohere2": lambda a: setattr(a, "position", RotaryEmbedding(8, layout="interleaved")),
    "ministral3": lambda a: setattr(a, "query_temperature", None),
    # the temperature counted by position: left-padded rows differ
    "llama4_text": lambda a: a.query_temperature and a.query_temperature.update(by="position"),
}


@pytest.mark.parametrize(
    ("model_type", "implementation"),
    [(name, "eager") for name in FAMILIES]
    + [("qwen3", "sdpa"), ("gemma3_text", "sdpa"), ("llama4_text", "sdpa")],
)
def test_swap_attention_of_each_family_inside_generate(model_type, implementation):
    # sdpa: boolean masks, or none where a plain causal pass needs none
    model = family_model(model_type, implementation)
    swapped = swap_attention(copy.deepcopy(model))
    assert all(isinstance(block.self_attn, HFLlamaAttention) for block in swapped.model.layers)
    ids, mask, _ = prompts()
    theirs = generate_both(model, swapped, ids, mask, 5)
    assert theirs.logits[0].abs().max() > 0.5  # logits large enough for the tolerance to bite
    # the neighbour: without the family's own feature, the logits differ
    for block in swapped.model.layers:
        FAMILY_NEIGHBOURS[model_type](block.self_attn.layer)
    other = swapped.generate(input_ids=ids, attention_mask=mask, max_new_tokens=5, **GREEDY)
    assert (
        max(worst(a, b) for a, b in zip(other.logits, theirs.logits, strict=True))
        > 100 * LOGITS_TOLERANCE
    )


@pytest.mark.parametrize(
    "model_type", ["qwen3", "gemma3_text", "gpt_oss", "phi3", "olmo2", "llama4_text"]
)
def test_weights_edited_on_pecodes_side_go_back_to_transformers(model_type):
    # swap, change the pecode layers' weights (as fine-tuning would), unswap: the model
    # is transformers' again, computes what the edited pecode layers computed, and its
    # state dict loads into a fresh transformers model of the same config
    model = family_model(model_type)
    swapped = swap_attention(copy.deepcopy(model))
    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for block in swapped.model.layers:
            for parameter in block.self_attn.layer.parameters():
                parameter.add_(0.2 * torch.randn(parameter.shape, generator=generator))
    ids, mask, _ = prompts()
    real = mask.bool()
    with torch.no_grad():
        edited = swapped(input_ids=ids, attention_mask=mask).logits
        original = model(input_ids=ids, attention_mask=mask).logits
    assert worst(edited[real], original[real]) > 100 * LOGITS_TOLERANCE  # the edit shows
    back = unswap_attention(swapped)
    assert not any(isinstance(block.self_attn, HFLlamaAttention) for block in back.model.layers)
    state = back.state_dict()
    expected = {name: tuple(t.shape) for name, t in model.state_dict().items()}
    assert {name: tuple(t.shape) for name, t in state.items()} == expected
    fresh = type(model)(copy.deepcopy(model.config)).eval()
    fresh.load_state_dict(state, strict=True)
    with torch.no_grad():
        for again in (back, fresh):
            logits = again(input_ids=ids, attention_mask=mask).logits
            assert worst(logits[real], edited[real]) < LOGITS_TOLERANCE
    with pytest.raises(ValueError, match="no swapped attention"):
        unswap_attention(model)


def test_swap_and_unswap_keep_the_models_mode_and_gemmas_gains():
    # a model in eval mode stays in eval mode (with attention dropout, a module left in
    # training mode would drop attention weights at random); a bfloat16 Gemma 3 swapped
    # and unswapped with no edit gets back its norm gains bit for bit, though pecode holds
    # 1 + w rounded to bfloat16
    model = family_model("qwen2")
    model.config.attention_dropout = 0.5
    model = randomize(type(model)(model.config).eval())
    swapped = swap_attention(copy.deepcopy(model))
    assert not any(module.training for module in swapped.modules())
    ids, mask, _ = prompts()
    real = mask.bool()
    with torch.no_grad():
        theirs = model(input_ids=ids, attention_mask=mask).logits
        ours = swapped(input_ids=ids, attention_mask=mask).logits
    assert worst(ours[real], theirs[real]) < LOGITS_TOLERANCE
    assert not any(module.training for module in unswap_attention(swapped).modules())
    gemma = family_model("gemma3_text").to(torch.bfloat16)
    back = unswap_attention(swap_attention(copy.deepcopy(gemma)))
    for name, tensor in gemma.state_dict().items():
        assert torch.equal(back.state_dict()[name], tensor), name


def test_llama4_swap_reads_its_norm_and_temperature_and_survives_a_deepcopy():
    # Llama 4's decoder layer keeps position_ids from self_attn: swap_attention hooks the
    # layer to pass them on. The hook is a plain function, so a deepcopy of the swapped
    # model runs on its own layers; unswap removes it. Each Llama 4 feature bites.
    model = family_model("llama4_text")
    swapped = copy.deepcopy(swap_attention(copy.deepcopy(model)))
    ids, mask, _ = prompts()
    theirs = generate_both(model, swapped, ids, mask, 8)
    rope_layer, nope_layer = (block.self_attn.layer for block in swapped.model.layers)
    assert rope_layer.qk_norm == "l2"
    assert rope_layer.query_temperature is None
    assert type(nope_layer.position) is PositionScheme  # none
    assert nope_layer.query_temperature["by"] == "index"
    for neighbour in (
        lambda: setattr(rope_layer, "qk_norm", None),
        lambda: setattr(nope_layer, "query_temperature", None),
        # the half layout, the rest of the config as it is
        lambda: setattr(
            rope_layer, "position", RotaryEmbedding.from_hf_config(model.config, layout="half")
        ),
    ):
        saved = rope_layer.qk_norm, nope_layer.query_temperature, rope_layer.position
        neighbour()
        other = swapped.generate(input_ids=ids, attention_mask=mask, max_new_tokens=8, **GREEDY)
        rope_layer.qk_norm, nope_layer.query_temperature, rope_layer.position = saved
        moved = max(worst(a, b) for a, b in zip(other.logits, theirs.logits, strict=False))
        assert moved > 100 * LOGITS_TOLERANCE
    back = unswap_attention(swapped)
    assert all(not block._forward_pre_hooks for block in back.model.layers)


def test_llama4_normalises_queries_and_keys_after_a_scaled_rope():
    # YaRN puts its attention factor (here 1.14) on cos and sin; Llama 4's L2 norm comes
    # after RoPE and removes it. Normalised before RoPE, q and k kept it: logits 4 off.
    name, model_name, extra = FAMILIES["llama4_text"]
    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0}
    FAMILIES["llama4_yarn"] = (name, model_name, {**extra, "rope_parameters": yarn})
    try:
        model = family_model("llama4_yarn")
    finally:
        del FAMILIES["llama4_yarn"]
    assert model.model.rotary_emb.attention_scaling > 1.1
    swapped = swap_attention(copy.deepcopy(model))
    ids, mask, _ = prompts()
    generate_both(model, swapped, ids, mask, 5)


def test_swapped_model_compiles_on_its_first_call():
    # swap_attention builds the rotary tables to max_position_embeddings: a compiled lookup
    # cannot grow them, and before it did, the first compiled call raised. Dynamo's
    # "eager" backend traces what Inductor would compile, in a fraction of the time.
    model = family_model("qwen3")
    swapped = swap_attention(copy.deepcopy(model))
    ids, mask, _ = prompts()
    real = mask.bool()
    torch._dynamo.reset()
    with torch.no_grad():
        theirs = model(input_ids=ids, attention_mask=mask).logits
        ours = torch.compile(swapped, backend="eager")(input_ids=ids, attention_mask=mask).logits
    assert worst(ours[real], theirs[real]) < LOGITS_TOLERANCE
    rope = swapped.model.layers[0].self_attn.layer.position
    assert rope.cached_positions == model.config.max_position_embeddings
