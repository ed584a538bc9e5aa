"""What a Hugging Face ``config.json`` asks of RoPE, layer type by layer type (chapter 11.1).

:func:`inspect_config` reads a config as transformers 5.23 reads it (through
:func:`pecode.scaling.hf_rope_arguments`: ``rope_scaling`` or ``rope_parameters``, one
block or a block per layer type, partial and proportional rotary, M-RoPE sections) and
returns a :class:`ConfigReport`: for each layer type its frequencies and attention
factor, the trained length, Liu et al.'s critical dimension, the pairs that meet angles
training never showed at the target context (with the config's scaling and without),
Men et al.'s base bound where it is tabulated, sliding windows, NoPE layers and query
temperatures; and the pitfalls the config walks into, each with the report of an engine
that fell into it. From the shell::

    python -m pecode.inspect_config config.json [--context N]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from pecode._checks import check_int
from pecode.layer_pattern import NOPE_MODEL_TYPES, nope_layers, nope_layers_from_hf
from pecode.rope_base import first_negative_margin
from pecode.scaling import (
    _hf_config_dict,
    frequencies_from_hf_config,
    hf_layer_types,
    hf_query_temperature,
    hf_rope_arguments,
    log_length_query_scale,
    rope_frequencies,
    unseen_angle_pairs,
    yarn_get_mscale,
)

__all__ = [
    "MARGIN_SCAN_LIMIT",
    "REPORT_WIDTH",
    "ConfigReport",
    "LayerTypeReport",
    "Pitfall",
    "inspect_config",
    "main",
]


@dataclass(frozen=True)
class Pitfall:
    """A known way engines have read this kind of config differently.

    Attributes:
        key: a short identifier (``"yarn-attention-factor"``, ...).
        text: what goes wrong, with this config's numbers.
        reference: where it was reported (an issue or pull request).
    """

    key: str
    text: str
    reference: str


@dataclass(frozen=True)
class LayerTypeReport:
    """One layer type of a config (see :func:`inspect_config` for each field's rule)."""

    layer_type: str
    layers: int
    nope_layers: int
    head_dim: int
    rotary_dim: int
    base: float
    rope_type: str
    scaling_params: dict[str, Any]
    trained_length: int
    context: int
    window: int | None
    inv_freq: torch.Tensor
    attention_factor: dict[int, float]
    critical_dimension: int
    unseen_pairs: int
    unseen_pairs_unscaled: int
    first_negative_margin: int | None
    query_temperature: float | None
    trained_length_from: str = "original_max_position_embeddings"
    window_kind: str = "sliding window"
    temperature_layers: str = "all"

    @property
    def rotated_pairs(self) -> int:
        """The pairs that rotate (fewer than ``rotary_dim / 2`` for ``proportional``)."""
        return int((self.inv_freq > 0).sum())

    @property
    def reach(self) -> int:
        """The longest distance a query looks back (the context, or the window if shorter)."""
        return self.context if self.window is None else min(self.context, self.window)


@dataclass(frozen=True)
class ConfigReport:
    """What :func:`inspect_config` found: one :class:`LayerTypeReport` per layer type and
    the config's :class:`Pitfall` s. ``str(report)`` is the readable report."""

    model_type: str
    context: int
    layer_types: tuple[LayerTypeReport, ...]
    pitfalls: tuple[Pitfall, ...] = field(default_factory=tuple)

    def __str__(self) -> str:
        lines = [f"model_type {self.model_type}, target context {self.context:,} tokens"]
        for r in self.layer_types:
            scaling = r.rope_type
            if r.scaling_params:
                shown = {k: v for k, v in r.scaling_params.items() if not isinstance(v, list)}
                scaling += " " + ", ".join(
                    f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}" for k, v in shown.items()
                )
            factors = ", ".join(f"{v:.4g} at {k:,}" for k, v in r.attention_factor.items())
            if r.first_negative_margin is None:
                margin = f"stays >= 0 up to {r.reach:,}"
            else:
                margin = f"first < 0 at distance {r.first_negative_margin:,}, within {r.reach:,}"
            rotating = r.rotated_pairs
            lines += [
                "",
                f"[{r.layer_type}] "
                + (f"{r.layers} layer(s)" if r.layers else "layer count not in the config")
                + (f", {r.nope_layers} without positions (NoPE)" if r.nope_layers else "")
                + (f", {r.window_kind} {r.window:,}" if r.window else ""),
                f"  head_dim {r.head_dim}, rotary_dim {r.rotary_dim}, base {r.base:g}; {scaling}",
                f"  trained length {r.trained_length:,} (from {r.trained_length_from}); "
                f"attention factor {factors}",
                f"  wavelengths {2 * math.pi / float(r.inv_freq.max()):.3g} to "
                f"{2 * math.pi / float(r.inv_freq[r.inv_freq > 0].min()):.3g} tokens",
                f"  critical dimension {r.critical_dimension} of {2 * rotating} rotating "
                f"features (Liu et al.), within {min(r.trained_length, r.reach):,} tokens",
                f"  pairs meeting unseen angles by distance {r.reach:,}: {r.unseen_pairs} of "
                f"{rotating} with the config's scaling, {r.unseen_pairs_unscaled} without",
                f"  Men et al.'s sum of cos(m theta_i) over the pairs: {margin}",
            ]
            if r.query_temperature is not None:
                where = "every layer" if r.temperature_layers == "all" else "the NoPE layers"
                lines.append(
                    f"  query temperature on {where} at position {r.context - 1:,}: "
                    f"x{r.query_temperature:.4g}"
                )
        lines += ["", "Pitfalls:" if self.pitfalls else "Pitfalls: none known for this config."]
        lines += [f"  - [{p.key}] {p.text} ({p.reference})" for p in self.pitfalls]
        return "\n".join(_wrapped(line) for line in lines)


REPORT_WIDTH = 80
"""The width ``str(ConfigReport)`` wraps its lines to."""


def _wrapped(line: str) -> str:
    """``line`` wrapped to :data:`REPORT_WIDTH`, continuation lines indented past its
    own indent (and a list item's dash)."""
    stripped = line.lstrip(" ")
    indent = " " * (len(line) - len(stripped) + 2)
    return textwrap.fill(line, REPORT_WIDTH, subsequent_indent=indent, break_on_hyphens=False)


def _layer_kinds(config: Mapping[str, Any], types: Sequence[str]) -> list[str]:
    """The layer type of each layer, as the model's config class fills them in."""
    count = config.get("num_hidden_layers")
    listed = config.get("layer_types")
    if isinstance(listed, list | tuple) and listed:
        return list(listed)
    if count is None:  # the config does not say how many layers
        return []
    count = check_int("num_hidden_layers", count)
    if len(types) == 2 and config.get("sliding_window_pattern"):  # Gemma 3's flat form
        every = check_int("sliding_window_pattern", config["sliding_window_pattern"])
    elif len(types) == 2 and config.get("model_type") == "olmo3":  # 3 sliding, 1 full
        every = 4
    else:
        return [types[0]] * count
    # full attention on the last layer of each group: the interval of Cohere2's NoPE layers
    full = nope_layers(count, every=every)
    return ["full_attention" if is_full else "sliding_attention" for is_full in full]


def _trained_length(
    config: Mapping[str, Any], arguments: Sequence[Mapping[str, Any]]
) -> tuple[int, str]:
    """The model's trained length, one for all layer types, and the key it was read from:
    an ``original_max_position_embeddings`` of any layer type's block or of the top
    level, else ``max_position_embeddings``."""
    originals = [a["scaling_params"].get("original_max_position_embeddings") for a in arguments]
    original = next((value for value in originals if value is not None), None)
    if original is None:
        original = config.get("original_max_position_embeddings")
    if original is not None:
        return check_int("original_max_position_embeddings", original), (
            "original_max_position_embeddings"
        )
    if config.get("max_position_embeddings") is None:
        raise ValueError(
            "max_position_embeddings: the config has neither it nor an "
            "original_max_position_embeddings, so its trained length is unknown; add one"
        )
    return check_int("max_position_embeddings", config["max_position_embeddings"]), (
        "max_position_embeddings; the config gives no original length"
    )


def _block(config: Mapping[str, Any], layer_type: str) -> Mapping[str, Any]:
    block = config.get("rope_parameters") or config.get("rope_scaling") or {}
    return block.get(layer_type) or {} if layer_type in block else block


def _pitfalls(config: Mapping[str, Any], reports: Sequence[LayerTypeReport]) -> list[Pitfall]:
    found: dict[str, Pitfall] = {}
    model_type = config.get("model_type")
    for r in reports:
        block = _block(config, r.layer_type)
        factor = r.scaling_params.get("factor")
        if r.rope_type == "yarn" and factor is not None:
            default = 0.1 * math.log(factor) + 1
            theirs = r.attention_factor[r.context]
            if not math.isclose(default, theirs, rel_tol=1e-9):
                found["yarn-attention-factor"] = Pitfall(
                    "yarn-attention-factor",
                    f"the block sets the attention factor to {theirs:.4g} (attention_factor, or "
                    f"mscale / mscale_all_dim); an engine that ignores those keys applies "
                    f"0.1 ln {factor:g} + 1 = {default:.4g} to q and k, logits x"
                    f"{(default / theirs) ** 2:.3f}",
                    "vllm-project/vllm#48621, #48351; PrimeIntellect-ai/prime-rl#2802",
                )
            if model_type in ("deepseek_v2", "deepseek_v3") and block.get("mscale_all_dim"):
                scale = yarn_get_mscale(factor, block["mscale_all_dim"]) ** 2
                found["softmax-mscale"] = Pitfall(
                    "softmax-mscale",
                    f"the model multiplies its softmax scale by yarn_get_mscale(factor, "
                    f"mscale_all_dim)^2 = {scale:.4g}, in its attention code, not in the rope "
                    "tables; a port that reads only the rope block leaves it out",
                    "transformers 5.23 modeling_deepseek_v3.yarn_apply_mscale",
                )
            per_layer = config.get("rope_parameters") or {}
            if r.scaling_params.get("truncate") is False and r.layer_type in per_layer:
                found["per-layer-truncate"] = Pitfall(
                    "per-layer-truncate",
                    "a per-layer-type yarn block sets truncate: false; transformers 5.23 reads "
                    "truncate from the top level of rope_parameters and rounds the ramp anyway "
                    "(pecode reads the block)",
                    "transformers 5.23 modeling_rope_utils._compute_yarn_parameters",
                )
        original = config.get("original_max_position_embeddings")
        in_block = "original_max_position_embeddings" in block
        if r.rope_type in ("yarn", "longrope") and not in_block and original is not None:
            found["top-level-original"] = Pitfall(
                "top-level-original",
                f"original_max_position_embeddings ({original}) is at the top level, not in the "
                "rope block; transformers copies it into the block, and a reader of the block "
                "alone gets no trained length, hence no long factors or attention factor",
                "transformers 5.23 modeling_rope_utils.standardize_rope_params",
            )
        if r.query_temperature is not None and "llama_4_scaling_beta" in block:
            found["nested-temperature"] = Pitfall(
                "nested-temperature",
                "the query temperature (llama_4_scaling_beta) sits inside the rope block; an "
                "engine that looks for it at the top level applies none",
                "vllm-project/vllm#48621",
            )
    blocks = {json.dumps(dict(_block(config, r.layer_type)), sort_keys=True) for r in reports}
    if len(reports) > 1 and (len(blocks) > 1 or len({r.base for r in reports}) > 1):
        found["per-layer-type"] = Pitfall(
            "per-layer-type",
            "layer types have different RoPE ("
            + "; ".join(f"{r.layer_type}: base {r.base:g}, {r.rope_type}" for r in reports)
            + "); an engine that shares one setting across layers is wrong on some of them",
            "Blaizzy/mlx-vlm#1709; ggml-org/llama.cpp#14367; ollama/ollama#13445, #13452",
        )
    if config.get("rope_parameters") is not None and config.get("rope_theta") is None:
        found["v5-rope-parameters"] = Pitfall(
            "v5-rope-parameters",
            "the base is only inside rope_parameters (transformers 5's form); code that reads "
            "rope_theta at the top level fails or falls back to a default base",
            "deepspeedai/DeepSpeed#8341, #8345",
        )
    return list(found.values())


@dataclass(frozen=True)
class _ReachLimit:
    """A config key that limits how far back a query looks, and the layers it limits."""

    model_types: tuple[str, ...] | None  # the families it applies to; None: every one
    key: str  # the config key read
    kind: str  # what the report calls it
    layer_types: tuple[str, ...] | None  # the layer types it limits; None: every one
    unless_layer_types: bool = False  # not for a config that lists layer_types


_REACH_LIMITS = (
    # Llama 4: attention chunks on its RoPE layers (transformers' "chunked_attention")
    _ReachLimit(("llama4", "llama4_text"), "attention_chunk_size", "attention chunks of", None),
    # Mistral 7B without layer_types: the sliding window of its mask, on every layer
    _ReachLimit(("mistral",), "sliding_window", "sliding window", None, unless_layer_types=True),
    # any config: a sliding window on its "sliding_attention" layers
    _ReachLimit(None, "sliding_window", "sliding window", ("sliding_attention",)),
)
"""What limits a layer type's reach, per family; :func:`_window` takes the first that
applies and whose key the config sets."""


def _window(config: Mapping[str, Any], layer_type: str) -> tuple[int | None, str]:
    """How far a query of ``layer_type``'s RoPE layers looks back, and what limits it
    (the first of :data:`_REACH_LIMITS` that applies), or None if nothing does."""
    model_type = config.get("model_type")
    for limit in _REACH_LIMITS:
        applies = (
            (limit.model_types is None or model_type in limit.model_types)
            and (limit.layer_types is None or layer_type in limit.layer_types)
            and not (limit.unless_layer_types and config.get("layer_types"))
        )
        if applies and config.get(limit.key) is not None:
            return check_int(limit.key, config[limit.key]), limit.kind
    return None, "sliding window"


def inspect_config(
    config: Mapping[str, Any] | object, *, context: int | None = None
) -> ConfigReport:
    """Report what a config asks of RoPE, per layer type, at a target context.

    For each layer type of the config (:func:`~pecode.scaling.hf_layer_types`):

    * the frequencies and attention factor, as transformers computes them
      (:func:`~pecode.scaling.frequencies_from_hf_config`), at the trained length and at
      the target context (the frequencies of ``dynamic`` and ``longrope`` change with
      the length; transformers' attention factors do not);
    * the trained length ``L0``, one for the model: an ``original_max_position_embeddings``
      (any layer type's block, or the top level), else ``max_position_embeddings``;
    * Liu et al.'s critical dimension: twice the number of rotating pairs that complete a
      turn within the distances training showed the layer (``L0``, or its window if
      shorter), at the trained frequencies (the unscaled ones, or HunYuan's fixed base);
      this is :func:`~pecode.rope_base.critical_dimension` unless a pair turns exactly
      once;
    * the pairs whose angles at the layer's longest distance (the target context, or its
      sliding window or attention chunk) were never seen in training
      (:func:`~pecode.scaling.unseen_angle_pairs`), with the config's scaling and without;
    * the first distance at which Men et al.'s ``Σ_i cos(m θ_i)`` turns negative, over every
      pair of the query·key product (a pair that never rotates adds 1) at the layer's
      own (scaled) frequencies (:func:`~pecode.rope_base.first_negative_margin`),
      scanned up to that longest distance or :data:`MARGIN_SCAN_LIMIT`;
    * the layer count, how many have no positions (NoPE), the sliding window or chunk,
      and the query temperature at the last position of the target context
      (:func:`~pecode.scaling.hf_query_temperature`; Llama 4 applies it on its NoPE
      layers only).

    Args:
        config: a ``config.json`` as a dict, or a transformers config object.
        context: the target context in tokens; default ``max_position_embeddings`` (or a
            YaRN block's ``factor`` times its original length, when longer).
    Raises:
        TypeError, ValueError: as :func:`~pecode.scaling.hf_rope_arguments`; ``context`` not
            a positive int; no ``max_position_embeddings`` and no ``context``.
    """
    config = _hf_config_dict(config)
    types = hf_layer_types(config)
    read_as = {
        layer_type: layer_type if len(types) > 1 or config.get("layer_types") else None
        for layer_type in types
    }
    arguments = {t: hf_rope_arguments(config, layer_type=read_as[t]) for t in types}
    trained, trained_from = _trained_length(config, list(arguments.values()))
    if context is None:
        context = _released_context(config, list(arguments.values()), trained)
    check_int("context", context)
    kinds = _layer_kinds(config, types)
    nope = (
        nope_layers_from_hf(config)
        if config.get("model_type") in NOPE_MODEL_TYPES
        else (False,) * len(kinds)
    )
    temperature = hf_query_temperature(config)
    reports = []
    for layer_type in types:
        args = arguments[layer_type]
        factors = {}
        for length in dict.fromkeys((trained, context)):
            inv_freq, factors[length] = frequencies_from_hf_config(
                config, layer_type=read_as[layer_type], seq_len=length, dtype=torch.float64
            )
        rotated = inv_freq > 0
        # the frequencies the model was trained with: the unscaled ones at its base, or,
        # for a fixed base change (HunYuan's alpha, read as "ntk"), the changed ones
        if args["scaling"] == "ntk":
            trained_freq = inv_freq
        else:
            trained_freq, _ = rope_frequencies(
                "default", args["rotary_dim"], args["base"], dtype=torch.float64
            )
        window, window_kind = _window(config, layer_type)
        reach = context if window is None else min(context, window)
        span = min(trained, reach)  # the distances training showed this layer type
        unseen = unseen_angle_pairs(trained_freq, inv_freq, span, reach) & rotated
        unseen_unscaled = unseen_angle_pairs(trained_freq, trained_freq, span, reach) & rotated
        scale = None
        if temperature is not None:
            scale = float(
                log_length_query_scale(
                    torch.tensor([context - 1]),
                    temperature["beta"],
                    temperature["length"],
                    offset=temperature["offset"],
                )[0]
            )
        indices = [i for i, kind in enumerate(kinds) if kind == layer_type]
        reports.append(
            LayerTypeReport(
                layer_type=layer_type,
                layers=len(indices),
                nope_layers=sum(1 for i in indices if i < len(nope) and nope[i]),
                head_dim=args["head_dim"],
                rotary_dim=args["rotary_dim"],
                base=args["base"],
                rope_type=args["scaling"],
                scaling_params=dict(args["scaling_params"]),
                trained_length=trained,
                context=context,
                window=window,
                inv_freq=inv_freq,
                attention_factor=factors,
                critical_dimension=2 * int(((span * trained_freq >= 2 * math.pi) & rotated).sum()),
                unseen_pairs=int(unseen.sum()),
                unseen_pairs_unscaled=int(unseen_unscaled.sum()),
                first_negative_margin=first_negative_margin(
                    _whole_head(config, args, inv_freq), min(reach, MARGIN_SCAN_LIMIT)
                ),
                query_temperature=scale,
                trained_length_from=trained_from,
                window_kind=window_kind,
                temperature_layers="all" if temperature is None else temperature["layers"],
            )
        )
    return ConfigReport(
        model_type=str(config.get("model_type")),
        context=context,
        layer_types=tuple(reports),
        pitfalls=tuple(_pitfalls(config, reports)),
    )


MARGIN_SCAN_LIMIT = 1 << 20
"""The longest distance :func:`inspect_config` scans for Men et al.'s sum (about a
second); a report on a longer reach says so."""


def _whole_head(config: Mapping[str, Any], args: Mapping[str, Any], inv_freq: Tensor) -> Tensor:
    """The frequency of every pair of a query·key product: the rotary pairs' (0 for those
    ``proportional`` leaves still), then 0 for each pair that never rotates: the features
    past ``rotary_dim`` and DeepSeek's ``qk_nope_head_dim``. Men et al.'s sum runs over
    all of them; a pair that never rotates adds ``cos 0 = 1``."""
    still = (args["head_dim"] - args["rotary_dim"]) // 2 + (
        config.get("qk_nope_head_dim") or 0
    ) // 2
    return torch.cat((inv_freq, inv_freq.new_zeros(still)))


def _released_context(
    config: Mapping[str, Any], arguments: Sequence[Mapping[str, Any]], trained: int
) -> int:
    """The context a config releases: ``max_position_embeddings``, or a YaRN block's
    ``factor`` times its ``original_max_position_embeddings`` where that is longer (the
    block Qwen's model cards tell users to add to a config they leave unchanged)."""
    longest = config.get("max_position_embeddings")
    for args in arguments:
        params = args["scaling_params"]
        if args["scaling"] == "yarn" and params.get("original_max_position_embeddings"):
            stretched = round(params["factor"] * params["original_max_position_embeddings"])
            longest = stretched if longest is None else max(longest, stretched)
    if longest is None:
        raise ValueError("context: the config has no max_position_embeddings; pass context=")
    return check_int("max_position_embeddings", longest)


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: ``python -m pecode.inspect_config config.json [--context N]``.
    Prints the report; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m pecode.inspect_config",
        description="What a Hugging Face config.json asks of RoPE, per layer type.",
    )
    parser.add_argument("config", help="path to the model's config.json")
    parser.add_argument("--context", type=int, default=None, help="target context in tokens")
    args = parser.parse_args(argv)
    try:
        with open(args.config, encoding="utf-8") as file:
            config = json.load(file)
        report = inspect_config(config, context=args.context)
    except (OSError, TypeError, ValueError) as error:  # json's errors are ValueErrors
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
