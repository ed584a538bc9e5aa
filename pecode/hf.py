"""pecode's attention inside Hugging Face transformers models.

Two things:

1. **Builders**, ``attention_from_*``: given one attention module of a transformers
   model, a :class:`~pecode.attention.MultiHeadAttention` with the same weights (copied)
   and the matching position scheme. :func:`attention_from_hf` for the decoders that
   share Llama's four projections (checked: Llama, Mistral, Ministral and Ministral 3,
   Qwen2/3, OLMo 2/3, Granite, Gemma 2/3, SmolLM3, gpt-oss, Phi-3/Phi-4-mini with their
   fused q/k/v projection, GLM-4 and Cohere 2 with interleaved pairs; each model type's
   own normalisation, logit scale, soft cap, sinks, query temperature and RoPE per layer
   type, partial rotary included; other model types are refused), and for older
   designs GPT-NeoX (partial rotary), GPT-J (interleaved partial rotary), BLOOM (ALiBi)
   and T5 (relative bias; unscaled encoder-decoder attention). The pecode layer
   computes what the transformers module computes before any residual it adds
   (BLOOM's); it takes pecode's arguments (``positions``, ``attn_mask``, ``causal``,
   ``cache``), not the transformers module's.
2. **A whole model running on pecode**: :func:`swap_attention` puts an
   :class:`HFLlamaAttention` in place of every decoder layer's ``self_attn``. That thin
   module has the forward signature of transformers' decoder attention and uses the
   model's own attention masks (sliding windows included) and KV cache, so
   ``model(...)`` and ``model.generate(...)`` run as before, with pecode computing the
   rotary tables, the rotation and the attention.

The signatures of transformers' attention modules change between releases; these
functions are tested against transformers 5.23, the pinned release, and against the
newest one (``make test-hf-latest``, which CI runs): ``tests/test_hf_models.py``, tiny
random-weight models compared logit by logit. ``transformers`` is not a dependency of
pecode: this module reads the modules it is given and never imports it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from pecode._checks import check_int
from pecode.alibi import ALiBi
from pecode.attention import ContentOnly, KVCache, MultiHeadAttention, PositionScheme
from pecode.mla import MultiHeadLatentAttention
from pecode.relative import T5RelativePositionBias
from pecode.rope import RotaryEmbedding, RotaryEmbeddingPerLayerType
from pecode.scaling import hf_query_temperature

__all__ = [
    "SWAP_TABLE_ROWS",
    "HFLlamaAttention",
    "attention_from_bloom",
    "attention_from_deepseek",
    "attention_from_gpt_neox",
    "attention_from_gptj",
    "attention_from_hf",
    "attention_from_llama",
    "attention_from_t5",
    "swap_attention",
    "swap_llama_attention",
    "unswap_attention",
]

# the attention implementations whose masks HFLlamaAttention reads: 4-D tensors or None
_MASK_IMPLEMENTATIONS = ("eager", "sdpa")

SWAP_TABLE_ROWS = 131072
"""The most rows of cos and sin :func:`swap_attention` builds up front, per layer type: the
config's ``max_position_embeddings`` up to this (64 MiB for a 128-wide head in float32),
so that ``torch.compile`` of the swapped model works on its first call (a compiled
lookup cannot grow the tables). Past it, one eager call on the longest input grows them."""


# --------------------------------------------------------------------------- weights


def _linear(module: nn.Module, name: str, what: str) -> nn.Linear:
    """The ``nn.Linear`` ``module.<name>``, or a TypeError saying which module was expected."""
    if not isinstance(module, nn.Module):
        raise TypeError(f"hf_attention must be an nn.Module ({what}), got {type(module).__name__}")
    linear = getattr(module, name, None)
    if not isinstance(linear, nn.Linear):
        raise TypeError(
            f"hf_attention must be {what} with an nn.Linear {name!r}; "
            f"{type(module).__name__} has none"
        )
    return linear


def _copy_linear(target: nn.Linear, weight: Tensor, bias: Tensor | None = None) -> None:
    """Copy ``weight`` (and ``bias``) into ``target``; the shapes must match."""
    with torch.no_grad():
        target.weight.copy_(weight)
        if target.bias is not None:
            target.bias.copy_(bias)


def _split_fused_qkv(
    layer: MultiHeadAttention, fused: nn.Linear, heads: int, head_dim: int
) -> None:
    """Copy a fused projection whose rows are, per head, that head's q, then k, then v.

    GPT-NeoX's and BLOOM's ``query_key_value``: output row ``(h * 3 + j) * head_dim + i``
    is row ``i`` of head ``h`` of q (``j = 0``), k (1) or v (2).
    """
    width = heads * head_dim
    weight = fused.weight.view(heads, 3, head_dim, fused.in_features)
    bias = None if fused.bias is None else fused.bias.view(heads, 3, head_dim)
    for index, name in enumerate(("q_proj", "k_proj", "v_proj")):
        _copy_linear(
            getattr(layer, name),
            weight[:, index].reshape(width, fused.in_features),
            None if bias is None else bias[:, index].reshape(width),
        )


def _on_weights_of(layer: MultiHeadAttention, weight: Tensor) -> MultiHeadAttention:
    """``layer`` moved to ``weight``'s device and dtype (RoPE tables stay float32/64)."""
    return layer.to(device=weight.device, dtype=weight.dtype)


def _table_dtype(weight: Tensor) -> torch.dtype:
    """float64 RoPE tables for a float64 model, float32 for any other."""
    return torch.float64 if weight.dtype == torch.float64 else torch.float32


def _config_dict(hf_attention: nn.Module) -> dict[str, Any]:
    """The transformers config of ``hf_attention`` as a dict (what ``config.json`` holds)."""
    config = getattr(hf_attention, "config", None)
    if isinstance(config, Mapping):
        return dict(config)
    if config is None or not callable(getattr(config, "to_dict", None)):
        raise TypeError(
            f"hf_attention ({type(hf_attention).__name__}) has no transformers config "
            "(a .config with to_dict())"
        )
    return config.to_dict()


def _dropout(value: object) -> float:
    """A dropout probability given as a float or an ``nn.Dropout``."""
    return float(value.p) if isinstance(value, nn.Dropout) else float(value or 0.0)


@dataclass(frozen=True)
class _Family:
    """What a model type's attention computes beyond Llama's, read in transformers 5.23."""

    qk_norm: str | None = None  # "head" or "projection": its q_norm/k_norm, before RoPE;
    # "l2": Llama 4's qk_norm, without a gain, after RoPE (where the module has one)
    gemma_norm: bool = False  # the norm's gain is stored as w - 1: x̂ · (1 + w)
    softcap_key: str | None = None  # the config key of the logit soft cap
    sinks: bool = False  # learned sink logits (module.sinks)
    nope_layers: str | None = None  # the config key listing which layers use RoPE (1) or not (0)
    temperature: bool = False  # the rope block's log-length query temperature on every layer
    fused_qkv: bool = False  # one qkv_proj: all query heads' rows, then keys', then values'
    layout: str = "half"  # the RoPE pairs: "interleaved" for GLM-4's and Cohere 2's
    rope_only_on: str | None = None  # the one layer type with RoPE (Cohere 2: sliding)
    # the decoder layer keeps position_ids from self_attn (Llama 4): a hook passes them
    position_ids_from_block: bool = False

    @property
    def norm_gains(self) -> bool:
        """Whether the module has a q_norm and a k_norm with gains to copy."""
        return self.qk_norm in ("head", "projection")


# config.model_type of the models whose attention pecode rebuilds: four projections
# (q_proj, k_proj, v_proj, o_proj), rotate_half RoPE (or none), softmax(q·k · scaling)
_FAMILIES: dict[str, _Family] = {
    "llama": _Family(),
    "mistral": _Family(),
    "ministral": _Family(),  # Ministral 8B: Mistral with sliding layers
    "ministral3": _Family(temperature=True),  # Ministral 3, Mistral Large 3's text
    "qwen2": _Family(),  # q, k, v with a bias, o without
    "qwen3": _Family(qk_norm="head"),
    "qwen3_moe": _Family(qk_norm="head"),
    "olmo2": _Family(qk_norm="projection"),
    "olmo3": _Family(qk_norm="projection"),
    "granite": _Family(),  # q·k scaled by attention_multiplier (module.scaling)
    "gemma2": _Family(softcap_key="attn_logit_softcapping"),
    # Gemma 3's config has attn_logit_softcapping, but its attention never applies it
    "gemma3_text": _Family(qk_norm="head", gemma_norm=True),
    "smollm3": _Family(nope_layers="no_rope_layers"),
    "phi3": _Family(fused_qkv=True),  # Phi-3, Phi-4-mini: partial rotary from the config
    "glm4": _Family(layout="interleaved"),  # RoPE on the first half of each head
    "cohere2": _Family(layout="interleaved", rope_only_on="sliding_attention"),
    "gpt_oss": _Family(sinks=True),
    # Llama 4: complex (interleaved) RoPE and chunks on 3 of 4 layers, the temperature on
    # the NoPE ones (MoE or not: the attention is the same)
    "llama4_text": _Family(
        qk_norm="l2",
        nope_layers="no_rope_layers",
        temperature=True,
        layout="interleaved",
        position_ids_from_block=True,
    ),
}


def _family(hf_attention: nn.Module, config: Mapping[str, Any]) -> _Family:
    """The family of ``hf_attention``'s model, or a ValueError naming what differs."""
    model_type = config.get("model_type")
    if model_type not in _FAMILIES:
        raise ValueError(
            f"hf_attention belongs to a model of type {model_type!r}; attention_from_hf "
            f"rebuilds the attention of {', '.join(map(repr, _FAMILIES))} (others with the same "
            "projections rotate or normalise differently: Cohere's LayerNorm of q and k, "
            "DeepSeek's MLA, attention_from_deepseek); for a multimodal model, swap its "
            "language model: swap_attention(model.language_model)"
        )
    family = _FAMILIES[model_type]
    gains = family.norm_gains
    for name in ("q_norm", "k_norm"):
        if (getattr(hf_attention, name, None) is not None) != gains:
            raise ValueError(
                f"hf_attention {'lacks' if gains else 'has'} a {name}, which a "
                f"{model_type!r} attention {'has' if gains else 'lacks'}: a module edited "
                "after loading, which pecode will not guess at"
            )
    if config.get("use_bidirectional_attention"):
        raise ValueError("use_bidirectional_attention: pecode rebuilds causal decoders only")
    return family


def _layer_type(hf_attention: nn.Module, config: Mapping[str, Any]) -> str | None:
    """The layer type of ``hf_attention`` (``"full_attention"``, ``"sliding_attention"``...)."""
    layer_type = getattr(hf_attention, "layer_type", None)
    if isinstance(layer_type, str):
        return layer_type
    listed, index = config.get("layer_types"), getattr(hf_attention, "layer_idx", None)
    if isinstance(listed, list | tuple) and isinstance(index, int) and 0 <= index < len(listed):
        return listed[index]
    return None


def _uses_rope(family: _Family, config: Mapping[str, Any], hf_attention: nn.Module) -> bool:
    if family.rope_only_on is not None:
        return _layer_type(hf_attention, config) == family.rope_only_on
    if family.nope_layers is None:
        return True
    return bool(config[family.nope_layers][hf_attention.layer_idx])


def _qkv_weights(
    hf_attention: nn.Module, family: _Family, config: Mapping[str, Any], head_dim: int, what: str
) -> list[tuple[Tensor, Tensor | None]]:
    """(weight, bias) of q, k and v: the module's own projections, or Phi-3's ``qkv_proj``
    cut in three (its rows are all of q's heads, then k's, then v's)."""
    if not family.fused_qkv:
        projections = [_linear(hf_attention, name, what) for name in ("q_proj", "k_proj", "v_proj")]
        return [(linear.weight, linear.bias) for linear in projections]
    fused = _linear(hf_attention, "qkv_proj", what)
    heads = check_int("num_attention_heads", config.get("num_attention_heads"))
    kv_heads = check_int("num_key_value_heads", config.get("num_key_value_heads") or heads)
    widths = (heads * head_dim, kv_heads * head_dim, kv_heads * head_dim)
    if sum(widths) != fused.out_features:
        raise ValueError(
            f"hf_attention.qkv_proj has {fused.out_features} outputs, not the {sum(widths)} of "
            f"{heads} query and {kv_heads} key/value heads of head_dim={head_dim}"
        )
    biases = (None,) * 3 if fused.bias is None else fused.bias.split(widths)
    return list(zip(fused.weight.split(widths), biases, strict=True))


def _norm_options(hf_attention: nn.Module, family: _Family, head_dim: int) -> dict[str, Any]:
    """``qk_norm`` and ``qk_norm_eps`` of the pecode layer for the module's q_norm."""
    if family.qk_norm == "l2":  # Llama 4: on the RoPE layers, if use_qk_norm
        norm = getattr(hf_attention, "qk_norm", None)
        return {} if norm is None else {"qk_norm": "l2", "qk_norm_eps": float(norm.eps)}
    if family.qk_norm is None:
        return {}
    norm = hf_attention.q_norm
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", None))
    width = norm.weight.shape[-1]
    kind = "head" if width == head_dim else "projection"
    if kind != family.qk_norm:
        raise ValueError(
            f"hf_attention.q_norm normalises {width} features, not what this model type's "
            f"{family.qk_norm!r} norm does (head_dim={head_dim})"
        )
    return {"qk_norm": kind, "qk_norm_eps": float(eps)}


# --------------------------------------------------------------------------- builders


def attention_from_hf(
    hf_attention: nn.Module,
    *,
    position: PositionScheme | None = None,
    layer_type: str | None = None,
) -> MultiHeadAttention:
    """pecode's attention with the weights and positions of a transformers decoder's attention.

    For the model types that share Llama's four projections (``config.model_type``, read
    in transformers 5.23): Llama, Mistral, Ministral and Ministral 3, Qwen2 and Qwen3
    (and Qwen3-MoE's attention), OLMo 2 and 3, Granite, Gemma 2 and 3, SmolLM3, gpt-oss,
    Phi-3/Phi-4-mini (one fused ``qkv_proj``, cut in three; partial rotary from
    ``partial_rotary_factor``), GLM-4 (interleaved pairs on part of each head),
    Cohere 2 (interleaved pairs on its sliding layers, none on its global ones) and
    Llama 4 (interleaved pairs, its ``L2Norm`` of q and k as ``qk_norm="l2"``, and on
    its NoPE layers the query temperature by index).
    The pecode layer gets what each computes: grouped key/value heads and the head
    width as the checkpoint has them, the projections' biases, the model's ``scaling``
    as ``logit_scale``, Qwen3's and Gemma 3's per-head and OLMo's whole-projection
    RMSNorm of q and k (Gemma's gain ``1 + w``), Gemma 2's soft cap, gpt-oss's sinks,
    Ministral 3's and Llama 4's query temperature, and the rotary embedding of the
    config (any rope type, per layer type where the config has one block per type, in
    the model's layout) or none for SmolLM3's and Llama 4's NoPE layers. The sliding
    windows and Llama 4's chunks are the masks' business: the model passes each layer
    its own (:func:`swap_attention`), and pecode's own masks can use the layer's
    ``window`` and ``chunk`` options. The result is on the module's device and dtype; call
    it with ``causal=True`` and the model's positions, or run a whole model on it with
    :func:`swap_attention`.

    Args:
        hf_attention: a decoder layer's ``self_attn`` (``q_proj``, ``k_proj``,
            ``v_proj``, ``o_proj``, ``head_dim``, ``scaling`` and the model's ``config``).
        position: a scheme to use instead of building one from the config (to share one
            :class:`~pecode.rope.RotaryEmbedding` between the layers of a model).
        layer_type: the layer type whose rope block to read; by default the module's
            own (``layer_type``, or ``config.layer_types[layer_idx]``).

    Raises:
        TypeError: ``hf_attention`` lacks those attributes, or ``position`` is not a
            :class:`~pecode.attention.PositionScheme`.
        ValueError: the config's ``model_type`` is not one of those above, the module
            has a ``q_norm`` its model type lacks (or lacks one it has), or the config's
            RoPE block is refused by :func:`pecode.scaling.hf_rope_arguments` (the
            message names the key).
    """
    what = "a transformers decoder attention"
    if not isinstance(getattr(hf_attention, "qkv_proj", None), nn.Linear):  # not Phi-3's
        _linear(hf_attention, "q_proj", what)
    head_dim = check_int("hf_attention.head_dim", getattr(hf_attention, "head_dim", None))
    config = _config_dict(hf_attention)
    family = _family(hf_attention, config)
    qkv = _qkv_weights(hf_attention, family, config, head_dim, what)
    o = _linear(hf_attention, "o_proj", what)
    (q_weight, _), (k_weight, _), _ = qkv
    hidden, heads = q_weight.shape[1], q_weight.shape[0] // head_dim
    kv_heads = k_weight.shape[0] // head_dim
    qkv_bias = [bias is not None for _, bias in qkv]
    if len(set(qkv_bias)) > 1:
        raise ValueError(
            f"the projections q_proj, k_proj, v_proj have biases {qkv_bias}: MultiHeadAttention "
            "gives q, k and v a bias or none"
        )
    layer_type = _layer_type(hf_attention, config) if layer_type is None else layer_type
    rope_layer = _uses_rope(family, config, hf_attention)
    if position is None and rope_layer:
        position = RotaryEmbedding.from_hf_config(
            config, layer_type=layer_type, dtype=_table_dtype(q_weight), layout=family.layout
        )
    scaling = getattr(hf_attention, "scaling", None)
    softcap = config.get(family.softcap_key) if family.softcap_key else None
    temperature = hf_query_temperature(config) if family.temperature else None
    if temperature is not None and temperature["layers"] == "nope" and rope_layer:
        temperature = None  # Llama 4's: its NoPE layers only
    layer = MultiHeadAttention(
        hidden,
        heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        position=position,
        qkv_bias=qkv_bias[0],
        out_bias=o.bias is not None,
        dropout=_dropout(getattr(hf_attention, "attention_dropout", 0.0)),
        logit_scale=None if scaling is None or scaling == head_dim**-0.5 else float(scaling),
        softcap=None if softcap is None else float(softcap),
        sinks=family.sinks,
        query_temperature=temperature,
        **_norm_options(hf_attention, family, head_dim),
    )
    layer = _on_weights_of(layer, q_weight)
    for ours, (weight, bias) in zip(("q_proj", "k_proj", "v_proj"), qkv, strict=True):
        _copy_linear(getattr(layer, ours), weight, bias)
    _copy_linear(layer.out_proj, o.weight, o.bias)
    with torch.no_grad():
        if family.norm_gains:
            for name in ("q_norm", "k_norm"):
                gain = getattr(hf_attention, name).weight
                getattr(layer, name).weight.copy_(gain + 1 if family.gemma_norm else gain)
        if family.sinks:
            layer.sinks.copy_(hf_attention.sinks)
    return layer


attention_from_llama = attention_from_hf
"""The name of :func:`attention_from_hf` in pecode 0.1.0, when it read Llama and Mistral only."""


def attention_from_deepseek(hf_attention: nn.Module) -> MultiHeadLatentAttention:
    """pecode's multi-head latent attention with the weights of a ``DeepseekV3Attention``.

    DeepSeek-V2/V3's MLA (:mod:`pecode.mla`): the query through ``q_proj`` or
    ``q_a_proj → q_a_layernorm → q_b_proj``, the latent and shared rotary key from
    ``kv_a_proj_with_mqa`` and ``kv_a_layernorm``, every head's key content and value
    from ``kv_b_proj``; RoPE on the ``qk_rope_head_dim`` features from the config (YaRN
    with its attention factor on cos and sin), in adjacent pairs when the config's
    ``rope_interleave`` is true (transformers then writes the rotated pairs out in half
    order, which changes no dot product) and in halves otherwise; the softmax scale is
    the module's ``scaling`` (``qk_head_dim ** -0.5`` times YaRN's ``mscale²``). Call
    the result with the model's positions; it attends causally.

    Raises:
        TypeError: ``hf_attention`` lacks those projections or a config.
        ValueError: the config's ``model_type`` is not ``deepseek_v3``, it has attention
            dropout, or its RoPE block is refused by
            :func:`pecode.scaling.hf_rope_arguments`.
    """
    what = "a DeepseekV3Attention"
    config = _config_dict(hf_attention)
    if config.get("model_type") != "deepseek_v3":
        raise ValueError(
            f"hf_attention belongs to a model of type {config.get('model_type')!r}; "
            "attention_from_deepseek reads DeepSeek-V3's multi-head latent attention"
        )
    if _dropout(config.get("attention_dropout")):
        raise ValueError(
            f"attention_dropout={config['attention_dropout']}: MultiHeadLatentAttention has "
            "no attention dropout (DeepSeek-V3 trains without it)"
        )
    norms = [hf_attention.kv_a_layernorm, getattr(hf_attention, "q_a_layernorm", None)]
    eps = {float(norm.variance_epsilon) for norm in norms if norm is not None}
    if len(eps) > 1:
        raise ValueError(f"q_a_layernorm and kv_a_layernorm have different epsilons {eps}")
    kv_down, kv_up = (
        _linear(hf_attention, "kv_a_proj_with_mqa", what),
        _linear(hf_attention, "kv_b_proj", what),
    )
    q_rank = config.get("q_lora_rank")
    layout = "interleaved" if config.get("rope_interleave", True) else "half"
    rope = RotaryEmbedding.from_hf_config(config, dtype=_table_dtype(kv_down.weight), layout=layout)
    layer = MultiHeadLatentAttention(
        kv_down.in_features,
        check_int("num_attention_heads", config.get("num_attention_heads")),
        kv_rank=check_int("kv_lora_rank", config.get("kv_lora_rank")),
        rope_dim=check_int("qk_rope_head_dim", config.get("qk_rope_head_dim")),
        nope_dim=check_int("qk_nope_head_dim", config.get("qk_nope_head_dim")),
        v_dim=check_int("v_head_dim", config.get("v_head_dim")),
        q_rank=q_rank,
        rope=rope,
        logit_scale=float(hf_attention.scaling),
        bias=kv_down.bias is not None,
        eps=eps.pop(),
    )
    layer = _on_weights_of(layer, kv_down.weight)
    pairs = [
        ("kv_down", kv_down),
        ("kv_up", kv_up),
        ("out_proj", _linear(hf_attention, "o_proj", what)),
    ]
    if q_rank is None:
        pairs.append(("q_proj", _linear(hf_attention, "q_proj", what)))
    else:
        pairs += [
            ("q_down", _linear(hf_attention, "q_a_proj", what)),
            ("q_up", _linear(hf_attention, "q_b_proj", what)),
        ]
    for ours, theirs in pairs:
        _copy_linear(getattr(layer, ours), theirs.weight, theirs.bias)
    with torch.no_grad():
        layer.kv_norm.weight.copy_(hf_attention.kv_a_layernorm.weight)
        if q_rank is not None:
            layer.q_norm.weight.copy_(hf_attention.q_a_layernorm.weight)
    return layer


def attention_from_gpt_neox(hf_attention: nn.Module) -> MultiHeadAttention:
    """pecode's attention with the weights and partial RoPE of a ``GPTNeoXAttention``.

    GPT-NeoX (Black et al. 2022) rotates the first ``partial_rotary_factor`` of each head
    (a quarter in the released models), in the half layout within those features; the
    rotary embedding is read from the model's config by
    :meth:`RotaryEmbedding.from_hf_config <pecode.rope.RotaryEmbedding.from_hf_config>`.
    The fused ``query_key_value`` projection is split into q, k and v. Call the result
    with ``causal=True``.

    Raises:
        TypeError: ``hf_attention`` lacks ``query_key_value``, ``dense``, ``head_size``
            or a config.
        ValueError: the config's RoPE block is refused (the message names the key).
    """
    what = "a transformers GPTNeoXAttention"
    fused, dense = (
        _linear(hf_attention, "query_key_value", what),
        _linear(hf_attention, "dense", what),
    )
    head_dim = check_int("hf_attention.head_size", getattr(hf_attention, "head_size", None))
    hidden = fused.in_features
    heads = hidden // head_dim
    rope = RotaryEmbedding.from_hf_config(
        _config_dict(hf_attention), dtype=_table_dtype(fused.weight)
    )
    layer = MultiHeadAttention(
        hidden,
        heads,
        position=rope,
        bias=fused.bias is not None,
        dropout=_dropout(getattr(hf_attention, "attention_dropout", 0.0)),
    )
    layer = _on_weights_of(layer, fused.weight)
    _split_fused_qkv(layer, fused, heads, head_dim)
    _copy_linear(layer.out_proj, dense.weight, dense.bias)
    return layer


def attention_from_gptj(hf_attention: nn.Module) -> MultiHeadAttention:
    """pecode's attention with the weights and interleaved partial RoPE of ``GPTJAttention``.

    GPT-J (Wang and Komatsuzaki 2021) rotates the pairs ``(2i, 2i + 1)`` of the first
    ``rotary_dim`` features of each head, with base 10000 (fixed in its code, not in
    its config). Call the result with ``causal=True`` and the model's ``position_ids``
    as ``positions``.

    Raises:
        TypeError: ``hf_attention`` lacks the projections or the head sizes.
        ValueError: ``rotary_dim`` is ``None``: transformers' GPT-J then builds tables as
            wide as the whole model, which fit a head only in a one-head model.
    """
    what = "a transformers GPTJAttention"
    projections = {
        name: _linear(hf_attention, name, what)
        for name in ("q_proj", "k_proj", "v_proj", "out_proj")
    }
    heads = check_int(
        "hf_attention.num_attention_heads", getattr(hf_attention, "num_attention_heads", None)
    )
    head_dim = check_int("hf_attention.head_dim", getattr(hf_attention, "head_dim", None))
    rotary_dim = getattr(hf_attention, "rotary_dim", None)
    if rotary_dim is None:
        raise ValueError(
            "hf_attention.rotary_dim is None: transformers' GPT-J then rotates with tables "
            "as wide as the model, not as a head; give the config a rotary_dim"
        )
    weight = projections["q_proj"].weight
    rope = RotaryEmbedding(
        head_dim, rotary_dim=rotary_dim, layout="interleaved", dtype=_table_dtype(weight)
    )
    layer = MultiHeadAttention(
        heads * head_dim,
        heads,
        position=rope,
        bias=projections["q_proj"].bias is not None,
        dropout=_dropout(getattr(hf_attention, "attn_dropout", 0.0)),
    )
    layer = _on_weights_of(layer, weight)
    for name, linear in projections.items():
        _copy_linear(getattr(layer, name), linear.weight, linear.bias)
    return layer


def attention_from_bloom(hf_attention: nn.Module) -> MultiHeadAttention:
    """pecode's attention with the weights and ALiBi of a transformers ``BloomAttention``.

    BLOOM (Le Scao et al. 2022) adds ALiBi's bias (Press et al. 2022) with the paper's
    slopes; the fused ``query_key_value`` projection is split into q, k and v. BLOOM's
    module also adds the residual to its output; the pecode layer returns attention
    alone. Call it with ``causal=True`` and, for padded batches, the key mask as
    ``attn_mask``.

    Raises:
        TypeError: ``hf_attention`` lacks ``query_key_value``, ``dense``, ``num_heads``
            or ``head_dim``.
    """
    what = "a transformers BloomAttention"
    fused, dense = (
        _linear(hf_attention, "query_key_value", what),
        _linear(hf_attention, "dense", what),
    )
    heads = check_int("hf_attention.num_heads", getattr(hf_attention, "num_heads", None))
    head_dim = check_int("hf_attention.head_dim", getattr(hf_attention, "head_dim", None))
    layer = MultiHeadAttention(
        fused.in_features,
        heads,
        position=ALiBi(heads),
        bias=fused.bias is not None,
        dropout=_dropout(getattr(hf_attention, "attention_dropout", 0.0)),
    )
    layer = _on_weights_of(layer, fused.weight)
    _split_fused_qkv(layer, fused, heads, head_dim)
    _copy_linear(layer.out_proj, dense.weight, dense.bias)
    return layer


def attention_from_t5(
    hf_attention: nn.Module,
    *,
    cross_attention: bool = False,
    bias_from: nn.Module | None = None,
) -> MultiHeadAttention:
    """pecode's attention with the weights and relative bias of a transformers ``T5Attention``.

    T5 (Raffel et al. 2020) does not scale ``q·k`` and adds a learned bias per
    relative-position bucket and head; the encoder's buckets are bidirectional, the
    decoder's causal. Only the first layer of each stack holds the bias table, and the
    other layers reuse it: for those, pass the first layer's attention as ``bias_from``
    (its table is copied). The encoder-decoder attention has no bias
    (``cross_attention=True``: :class:`~pecode.attention.ContentOnly` with a factor of
    one; call the layer with ``context=`` the encoder's output). Call a decoder's
    self-attention with ``causal=True``.

    Args:
        hf_attention: a ``T5Attention`` (``SelfAttention`` or ``EncDecAttention``).
        cross_attention: whether it is the encoder-decoder attention.
        bias_from: the ``T5Attention`` that holds the table, for a self-attention layer
            that has none.

    Raises:
        TypeError: ``hf_attention`` lacks the projections ``q``, ``k``, ``v``, ``o`` or
            the sizes; ``cross_attention`` is not a bool.
        ValueError: ``n_heads * d_kv`` differs from ``d_model`` (T5-11B's 128 heads of 128
            in a model of width 1024; :class:`~pecode.attention.MultiHeadAttention` needs
            them equal), a self-attention layer without a table and no ``bias_from``, or a
            ``bias_from`` where there is nothing to take from it.
    """
    what = "a transformers T5Attention"
    projections = {name: _linear(hf_attention, name, what) for name in ("q", "k", "v", "o")}
    if not isinstance(cross_attention, bool):
        raise TypeError(f"cross_attention must be a bool, got {type(cross_attention).__name__}")
    heads = check_int("hf_attention.n_heads", getattr(hf_attention, "n_heads", None))
    head_dim = check_int(
        "hf_attention.key_value_proj_dim", getattr(hf_attention, "key_value_proj_dim", None)
    )
    width = projections["q"].in_features
    if heads * head_dim != width:
        raise ValueError(
            f"hf_attention has {heads} heads of d_kv={head_dim} in a model of width "
            f"d_model={width}: MultiHeadAttention needs n_heads * d_kv = d_model"
        )
    has_table = bool(getattr(hf_attention, "has_relative_attention_bias", False))
    if cross_attention:
        if has_table or bias_from is not None:
            raise ValueError(
                "cross_attention=True: T5's encoder-decoder attention has no position bias, "
                "but hf_attention has a table or bias_from was given"
            )
        scheme: PositionScheme = ContentOnly(logit_scale=1.0)
    else:
        if has_table and bias_from is not None:
            raise ValueError("bias_from given, but hf_attention holds a bias table of its own")
        source = hf_attention if has_table else bias_from
        table = getattr(source, "relative_attention_bias", None)
        if not isinstance(table, nn.Embedding):
            raise ValueError(
                "hf_attention has no relative_attention_bias table (T5 keeps it in the first "
                "layer of each stack): pass that layer's attention as bias_from"
            )
        scheme = T5RelativePositionBias(
            heads,
            bidirectional=not getattr(hf_attention, "is_decoder", False),
            num_buckets=source.relative_attention_num_buckets,
            max_distance=source.relative_attention_max_distance,
        )
        with torch.no_grad():
            scheme.bias.weight.copy_(table.weight)
    layer = MultiHeadAttention(
        width,
        heads,
        position=scheme,
        bias=False,
        dropout=_dropout(getattr(hf_attention, "dropout", 0.0)),
    )
    layer = _on_weights_of(layer, projections["q"].weight)
    for ours, theirs in (("q_proj", "q"), ("k_proj", "k"), ("v_proj", "v"), ("out_proj", "o")):
        _copy_linear(getattr(layer, ours), projections[theirs].weight)
    return layer


# --------------------------------------------------------------------------- a whole model


# the transformers 5.23 cache layers whose update returns the stored keys then the new
# ones (the sliding one stores at most sliding_window - 1); a static layer returns all
# its preallocated slots instead
_CACHE_LAYERS = ("DynamicLayer", "DynamicSlidingWindowLayer")


class _TransformersCacheLayer(KVCache):
    """One layer of a transformers ``Cache`` seen as a :class:`~pecode.attention.KVCache`.

    Keys and values live in the transformers cache (``update`` appends and returns the
    stored keys followed by the new ones), so the model's ``generate`` and its masks see
    the lengths they expect. The length is the number of stored keys, which for a
    sliding-window layer stops at ``sliding_window - 1``: that is how many keys the
    model's mask covers before the new ones. Key positions are not kept:
    :class:`HFLlamaAttention` accepts only schemes that use them in ``transform_qk``
    (before caching), never afterwards.

    Raises:
        ValueError: the layer is of another kind (``StaticCache``'s preallocated slots,
            a quantized cache), or ``update`` returns other than stored + new keys.
    """

    def __init__(self, cache: Any, layer_idx: int) -> None:
        super().__init__()
        self._cache, self._layer_idx = cache, layer_idx
        layers = getattr(cache, "layers", None)
        known = isinstance(layers, list | tuple) and layer_idx < len(layers)
        self._layer = layers[layer_idx] if known else None  # DynamicCache() adds layers lazily
        kind = type(self._layer).__name__
        if self._layer is not None and kind not in _CACHE_LAYERS:
            raise ValueError(
                f"past_key_values holds a {kind} for layer {layer_idx}; HFLlamaAttention "
                f"takes the cache layers {', '.join(_CACHE_LAYERS)} (a DynamicCache, the "
                "default: not cache_implementation='static')"
            )

    def __len__(self) -> int:
        keys = getattr(self._layer, "keys", None)
        if isinstance(keys, Tensor) and getattr(self._layer, "is_initialized", True):
            return keys.shape[-2]  # what update returns before the new keys
        return int(self._cache.get_seq_length(self._layer_idx))

    def append(self, k: Tensor, v: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Any]:
        expected = len(self) + k.shape[-2]
        self.keys, self.values = self._cache.update(k, v, self._layer_idx)
        if self.keys.shape[-2] != expected:
            raise ValueError(
                f"the transformers cache returned {self.keys.shape[-2]} keys for layer "
                f"{self._layer_idx}, not the {expected} stored and new ones HFLlamaAttention "
                "expects"
            )
        return self.keys, self.values, None  # no key positions: see the class docstring


class HFLlamaAttention(nn.Module):
    """pecode's attention behind the forward signature of transformers' ``LlamaAttention``.

    ``forward(hidden_states, position_embeddings, attention_mask, past_key_values,
    cache, **kwargs) -> (output, None)``, as a Llama decoder layer calls its
    ``self_attn`` in transformers 5.23 (``past_key_values=``) and 5.24 (``cache=``).
    It ignores the model's rotary tables (``position_embeddings``):
    the pecode layer rotates by the ``position_ids`` the decoder layer passes. It uses
    the model's attention mask (a 4-D float mask from ``"eager"``, a boolean one or
    ``None`` for a plain causal pass from ``"sdpa"``) and the model's KV cache, so
    ``generate`` works unchanged. Attention weights are not returned
    (``output_attentions`` gives none).

    Args:
        layer: the pecode attention (:func:`attention_from_llama`), whose scheme uses
            positions only to transform queries and keys (RoPE, or none).
        layer_idx: the decoder layer's index, its slot in the transformers cache.

    Raises:
        TypeError: ``layer`` is not a :class:`~pecode.attention.MultiHeadAttention`.
        ValueError: its scheme adds a bias or an output term (ALiBi, T5, ...), or it has
            a ``window`` or ``chunk``: those read the key positions, which the
            transformers cache does not keep.
    """

    def __init__(self, layer: MultiHeadAttention, layer_idx: int) -> None:
        super().__init__()
        if not isinstance(layer, MultiHeadAttention):
            raise TypeError(f"layer must be a MultiHeadAttention, got {type(layer).__name__}")
        scheme = type(layer.position)
        if scheme.score_bias is not PositionScheme.score_bias or layer.position.has_output_term:
            raise ValueError(
                f"layer's scheme {scheme.__name__} reads key positions after caching (a bias or "
                "an output term); HFLlamaAttention takes RoPE or no positions"
            )
        if layer.window is not None or layer.chunk is not None:
            raise ValueError(
                "layer has a window or chunks, which read key positions after caching; "
                "inside a transformers model the model's masks carry them: leave them unset"
            )
        self.layer = layer
        self.layer_idx = check_int("layer_idx", layer_idx, minimum=0)
        self.is_causal = True  # what transformers' attention functions read
        # what unswap_attention rebuilds: the transformers class and its config (shared),
        # and Gemma's norm gains as stored
        self.hf_class: type[nn.Module] | None = None
        self.hf_config: Any = None
        self.hf_gains: dict[str, Tensor] | None = None
        # set just before each call by the decoder layer's hook where the layer keeps
        # position_ids to itself (Llama 4; see swap_attention), used once
        self.block_position_ids: Tensor | None = None

    def extra_repr(self) -> str:
        return f"layer_idx={self.layer_idx}"

    def forward(
        self,
        hidden_states: Tensor,
        position_embeddings: tuple[Tensor, Tensor] | None = None,
        attention_mask: Tensor | None = None,
        past_key_values: Any = None,
        cache: Any = None,
        **kwargs: Any,
    ) -> tuple[Tensor, None]:
        """Attention over the cache and ``hidden_states``; ``(output, None)``.

        The model's cache comes as ``cache`` (transformers 5.24 and later) or
        ``past_key_values`` (earlier releases, and 5.24's deprecated name). A cache
        object under any other keyword is refused: read silently as no cache, every
        decoding step would attend to its own token only.

        Shapes::

            hidden_states:  [B, L, D]
            position_ids:   [B, L] or [1, L] (keyword; the decoder layer passes it)
            attention_mask: [B, 1, L, Lk] (float: added to the logits; bool: True = may
                            attend) or None (causal)
            returns:        ([B, L, D], None)

        Raises:
            ValueError: no ``position_ids`` among the keywords; ``cache`` and
                ``past_key_values`` both given and different; a cache under another
                keyword.
            TypeError: ``attention_mask`` is neither a 4-D tensor nor ``None`` (the mask
                objects of flash or flex attention).
        """
        transformers_cache = _the_cache(past_key_values, cache, kwargs)
        positions = kwargs.get("position_ids")
        if positions is None:  # Llama 4's decoder layer: from its hook
            positions, self.block_position_ids = self.block_position_ids, None
        if positions is None:
            raise ValueError(
                "position_ids: the decoder layer passed none to self_attn; HFLlamaAttention "
                "rotates by them (transformers' Llama decoder layer passes them)"
            )
        if attention_mask is not None and not (
            isinstance(attention_mask, Tensor) and attention_mask.dim() == 4
        ):
            raise TypeError(
                f"attention_mask must be a 4-D tensor or None (attn_implementation "
                f"{' or '.join(map(repr, _MASK_IMPLEMENTATIONS))}), got "
                f"{type(attention_mask).__name__}"
            )
        batch = hidden_states.shape[0]
        if positions.dim() == 2 and positions.shape[0] == 1 and batch > 1:
            positions = positions.expand(batch, -1)  # one row of positions for the batch
        layer_cache = None
        if transformers_cache is not None:
            layer_cache = _TransformersCacheLayer(transformers_cache, self.layer_idx)
        out = self.layer(
            hidden_states,
            positions=positions,
            attn_mask=attention_mask,
            causal=attention_mask is None,  # transformers' masks already hold causality
            cache=layer_cache,
        )
        return out, None


def _pass_position_ids(block: nn.Module, args: tuple, kwargs: dict[str, Any]) -> None:
    """A decoder layer's forward pre-hook: hand its ``position_ids`` to its swapped
    attention (Llama 4's decoder layer does not pass them on)."""
    attention = getattr(block, "self_attn", None)
    if isinstance(attention, HFLlamaAttention):
        attention.block_position_ids = kwargs.get("position_ids")


def _position_ids_hooks(block: nn.Module) -> list[int]:
    """The keys of :func:`_pass_position_ids` among ``block``'s forward pre-hooks."""
    return [key for key, hook in block._forward_pre_hooks.items() if hook is _pass_position_ids]


def _is_cache(value: object) -> bool:
    """Whether ``value`` looks like a transformers ``Cache`` (it never imports them)."""
    return callable(getattr(value, "update", None)) and callable(
        getattr(value, "get_seq_length", None)
    )


def _the_cache(past_key_values: Any, cache: Any, kwargs: Mapping[str, Any]) -> Any:
    """The one cache a decoder layer passed, under either of its names."""
    if past_key_values is not None and cache is not None and past_key_values is not cache:
        raise ValueError(
            "cache and past_key_values are two different caches: pass one (transformers "
            "5.24 renamed past_key_values to cache)"
        )
    elsewhere = [name for name, value in kwargs.items() if _is_cache(value)]
    if elsewhere:
        raise ValueError(
            f"a cache came as {elsewhere[0]}=, a keyword HFLlamaAttention does not read (it "
            "reads cache= and past_key_values=): this transformers release renamed it, and "
            "pecode does not know the new name yet"
        )
    return cache if cache is not None else past_key_values


def swap_attention(model: nn.Module) -> nn.Module:
    """Run a transformers decoder's attention on pecode, in place.

    Every module with a ``self_attn`` (the decoder layers) gets an
    :class:`HFLlamaAttention` around :func:`attention_from_hf` of its attention; the
    layers of one layer type share one :class:`~pecode.rope.RotaryEmbedding` built from
    the model's config (:class:`~pecode.rope.RotaryEmbeddingPerLayerType`), and NoPE
    layers get none. The model types are :func:`attention_from_hf`'s. The weights are
    copied: the model holds pecode's layers afterwards, not transformers' (``copy.deepcopy``
    it first to keep the original).

    The rotary tables are built up front to the config's ``max_position_embeddings``
    (at most :data:`SWAP_TABLE_ROWS`), so ``torch.compile(model)`` works on its first
    call; ``"dynamic"`` and ``"longrope"`` scaling choose their frequencies per call
    and run eagerly only (:meth:`~pecode.rope.RotaryEmbedding.cos_sin`). Llama 4's
    decoder layers get a forward pre-hook that hands their ``position_ids`` to the
    attention (they do not pass them on); :func:`unswap_attention` removes it.

    Returns:
        ``model``, changed.

    Raises:
        TypeError: ``model`` is not an ``nn.Module`` with a transformers ``config``.
        ValueError: its attention implementation is neither ``"eager"`` nor ``"sdpa"``
            (flash and flex attention pass masks of their own kinds), it has no
            ``self_attn`` to swap, or :func:`attention_from_hf` refuses a layer.
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    config = getattr(model, "config", None)
    if config is None or not callable(getattr(config, "to_dict", None)):
        raise TypeError(f"model ({type(model).__name__}) has no transformers config")
    implementation = getattr(config, "_attn_implementation", None)
    if implementation not in _MASK_IMPLEMENTATIONS:
        raise ValueError(
            f"model's attn_implementation is {implementation!r}; swap_attention reads "
            f"the masks of {' and '.join(map(repr, _MASK_IMPLEMENTATIONS))}: load the model "
            "with one of them"
        )
    blocks = [
        block
        for block in model.modules()
        if isinstance(getattr(block, "self_attn", None), nn.Module)
        and not isinstance(block.self_attn, HFLlamaAttention)
    ]
    if not blocks:
        raise ValueError(f"model ({type(model).__name__}) has no self_attn to swap")
    first = blocks[0].self_attn
    attention_config = _config_dict(first)  # a multimodal model's text config
    family = _family(first, attention_config)  # refuse an unknown model before building
    projection = "qkv_proj" if family.fused_qkv else "q_proj"
    weight = _linear(first, projection, "a transformers decoder attention").weight
    rows = min(
        check_int("max_position_embeddings", attention_config.get("max_position_embeddings") or 1),
        SWAP_TABLE_ROWS,
    )
    rotary = RotaryEmbeddingPerLayerType.from_hf_config(
        attention_config, dtype=_table_dtype(weight), layout=family.layout, initial_positions=rows
    )
    for block in blocks:
        hf_attention = block.self_attn
        layer_type = _layer_type(hf_attention, attention_config)
        family = _family(hf_attention, attention_config)
        position = None
        if _uses_rope(family, attention_config, hf_attention):
            position = rotary[layer_type if layer_type in rotary.embeddings else "full_attention"]
        layer = attention_from_hf(hf_attention, position=position, layer_type=layer_type)
        wrapper = HFLlamaAttention(layer, getattr(hf_attention, "layer_idx", None))
        wrapper.hf_class, wrapper.hf_config = type(hf_attention), hf_attention.config
        if family.gemma_norm:  # 1 + w rounded in a bf16 model: keep w to give it back exactly
            wrapper.hf_gains = {
                name: getattr(hf_attention, name).weight.detach().clone()
                for name in ("q_norm", "k_norm")
            }
        block.self_attn = wrapper.train(hf_attention.training)  # new modules start in training
        if family.position_ids_from_block and not _position_ids_hooks(block):
            # a module-level function, not a closure: a deepcopy of the model keeps working
            block.register_forward_pre_hook(_pass_position_ids, with_kwargs=True)
    return model


def unswap_attention(model: nn.Module) -> nn.Module:
    """Put transformers' own attention back into a model :func:`swap_attention` changed.

    Each :class:`HFLlamaAttention` becomes a new module of the class it replaced, built
    from the same config, holding the pecode layer's current weights in transformers'
    form: q, k, v and o (Phi-3's fused ``qkv_proj`` concatenated again), the QK-norm
    gains (Gemma's stored as ``w - 1``) and the sinks. So weights trained or edited on
    pecode's side load back: ``unswap_attention(model).state_dict()`` has the keys and
    shapes of the original model's, and ``save_pretrained`` writes a checkpoint
    transformers reads. In place, like the swap.

    Returns:
        ``model``, changed.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``.
        ValueError: it holds no swapped attention, or one built by hand (an
            :class:`HFLlamaAttention` that :func:`swap_attention` did not make).
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f"model must be an nn.Module, got {type(model).__name__}")
    blocks = [
        block
        for block in model.modules()
        if isinstance(getattr(block, "self_attn", None), HFLlamaAttention)
    ]
    if not blocks:
        raise ValueError(f"model ({type(model).__name__}) has no swapped attention to undo")
    for block in blocks:
        wrapper = block.self_attn
        if wrapper.hf_class is None:
            raise ValueError(
                f"the HFLlamaAttention of layer {wrapper.layer_idx} was not made by "
                "swap_attention: there is no transformers module to rebuild"
            )
        hf_attention = wrapper.hf_class(wrapper.hf_config, wrapper.layer_idx)
        weight = wrapper.layer.q_proj.weight
        hf_attention = hf_attention.to(device=weight.device, dtype=weight.dtype)
        family = _family(hf_attention, _config_dict(hf_attention))
        _copy_back(wrapper.layer, hf_attention, family, wrapper.hf_gains)
        block.self_attn = hf_attention.train(wrapper.training)
        for key in _position_ids_hooks(block):
            del block._forward_pre_hooks[key]
            block._forward_pre_hooks_with_kwargs.pop(key, None)
    return model


def _copy_back(
    layer: MultiHeadAttention,
    hf_attention: nn.Module,
    family: _Family,
    gains: Mapping[str, Tensor] | None = None,
) -> None:
    """The pecode layer's weights into a fresh transformers attention, in its form.

    ``gains``: Gemma's stored ``w`` at swap time; where pecode's ``1 + w`` has not moved
    since, ``w`` itself goes back (``gain - 1`` would carry the rounding of ``1 + w`` in
    bfloat16)."""
    with torch.no_grad():
        if family.fused_qkv:
            parts = (layer.q_proj, layer.k_proj, layer.v_proj)
            weight = torch.cat([part.weight for part in parts])
            bias = None if layer.q_proj.bias is None else torch.cat([p.bias for p in parts])
            _copy_linear(hf_attention.qkv_proj, weight, bias)
        else:
            for name in ("q_proj", "k_proj", "v_proj"):
                ours = getattr(layer, name)
                _copy_linear(getattr(hf_attention, name), ours.weight, ours.bias)
        _copy_linear(hf_attention.o_proj, layer.out_proj.weight, layer.out_proj.bias)
        if family.norm_gains:
            for name in ("q_norm", "k_norm"):
                gain = getattr(layer, name).weight
                if family.gemma_norm:
                    kept = None if gains is None else gains[name].to(gain.device)
                    unchanged = kept is not None and torch.equal((kept + 1).to(gain.dtype), gain)
                    gain = kept if unchanged else gain.float() - 1
                getattr(hf_attention, name).weight.copy_(gain)
        if family.sinks:
            hf_attention.sinks.copy_(layer.sinks)


swap_llama_attention = swap_attention
"""The name of :func:`swap_attention` in pecode 0.1.0, when it read Llama and Mistral only."""
