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

    python -m pecode.inspect_config config.json [--context N] [--figure out.png]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from pecode._checks import check_int
from pecode.layer_pattern import NOPE_MODEL_TYPES, nope_layers_from_hf
from pecode.rope_base import BASE_BOUNDS
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

__all__ = ["ConfigReport", "LayerTypeReport", "Pitfall", "inspect_config", "main", "plot_report"]


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
    base_bound: float | None
    query_temperature: float | None
    trained_length_from: str = "original_max_position_embeddings"


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
            bound = (
                "not tabulated"
                if r.base_bound is None
                else f"{r.base_bound:.3g} (the base {r.base:g} is "
                + ("above it)" if r.base >= r.base_bound else "below it)")
            )
            lines += [
                "",
                f"[{r.layer_type}] "
                + (f"{r.layers} layer(s)" if r.layers else "layer count not in the config")
                + (f", {r.nope_layers} without positions (NoPE)" if r.nope_layers else "")
                + (f", sliding window {r.window:,}" if r.window else ""),
                f"  head_dim {r.head_dim}, rotary_dim {r.rotary_dim}, base {r.base:g}; {scaling}",
                f"  trained length {r.trained_length:,} (from {r.trained_length_from}); "
                f"attention factor {factors}",
                f"  wavelengths {2 * math.pi / float(r.inv_freq.max()):.3g} to "
                + (
                    f"{2 * math.pi / float(r.inv_freq[r.inv_freq > 0].min()):.3g} tokens"
                    if bool((r.inv_freq > 0).any())
                    else "inf"
                ),
                f"  critical dimension {r.critical_dimension} of {r.rotary_dim} (Liu et al.)",
                f"  pairs meeting unseen angles by {r.context:,}: {r.unseen_pairs} of "
                f"{r.rotary_dim // 2} with the config's scaling, {r.unseen_pairs_unscaled} "
                "without",
                f"  base bound for {r.context:,} tokens (Men et al.): {bound}",
            ]
            if r.query_temperature is not None:
                lines.append(f"  query temperature at {r.context:,}: x{r.query_temperature:.4g}")
        lines += ["", "Pitfalls:" if self.pitfalls else "Pitfalls: none known for this config."]
        lines += [f"  - [{p.key}] {p.text} ({p.reference})" for p in self.pitfalls]
        return "\n".join(lines)


def _layer_kinds(config: Mapping[str, Any], types: Sequence[str]) -> list[str]:
    """The layer type of each layer, as the model's config class fills them in."""
    count = config.get("num_hidden_layers")
    listed = config.get("layer_types")
    if isinstance(listed, list | tuple) and listed:
        return list(listed)
    if count is None:  # the config does not say how many layers
        return []
    if len(types) == 2 and config.get("sliding_window_pattern"):  # Gemma 3's flat form
        every = check_int("sliding_window_pattern", config["sliding_window_pattern"])
        return [
            "full_attention" if (i + 1) % every == 0 else "sliding_attention" for i in range(count)
        ]
    if len(types) == 2 and config.get("model_type") == "olmo3":  # 3 sliding, 1 full
        return ["full_attention" if (i + 1) % 4 == 0 else "sliding_attention" for i in range(count)]
    return [types[0]] * check_int("num_hidden_layers", count)


def _trained_length(config: Mapping[str, Any], arguments: Mapping[str, Any]) -> tuple[int, str]:
    """The trained length and the key it was read from."""
    original = arguments["scaling_params"].get("original_max_position_embeddings")
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
                    "vllm-project/vllm#48621; PrimeIntellect-ai/prime-rl#2802",
                )
            if model_type in ("deepseek_v2", "deepseek_v3") and block.get("mscale_all_dim"):
                scale = yarn_get_mscale(factor, block["mscale_all_dim"]) ** 2
                found["softmax-mscale"] = Pitfall(
                    "softmax-mscale",
                    f"the model multiplies its softmax scale by yarn_get_mscale(factor, "
                    f"mscale_all_dim)^2 = {scale:.4g}, in its attention code, not in the rope "
                    "tables; a port that reads only the rope block leaves it out",
                    "transformers modeling_deepseek_v3.yarn_apply_mscale",
                )
            if (
                r.scaling_params.get("truncate") is False
                and len(reports) > 1
                and r.layer_type in (config.get("rope_parameters") or {})
            ):
                found["per-layer-truncate"] = Pitfall(
                    "per-layer-truncate",
                    "a per-layer-type yarn block sets truncate: false; transformers 5.23 reads "
                    "truncate from the top level of rope_parameters and rounds the ramp anyway",
                    "transformers 5.23 modeling_rope_utils._compute_yarn_parameters",
                )
            found["static-yarn"] = Pitfall(
                "static-yarn",
                "YaRN here is static: the stretched frequencies and the factor apply at every "
                "length, short inputs included; Qwen's model cards advise adding the block only "
                "when long inputs are expected",
                "Qwen3 model card, 'Processing Long Texts'",
            )
        original = config.get("original_max_position_embeddings")
        in_block = "original_max_position_embeddings" in block
        if r.rope_type in ("yarn", "longrope") and not in_block and original is not None:
            found["top-level-original"] = Pitfall(
                "top-level-original",
                f"original_max_position_embeddings ({original}) is at the top level, not in the "
                "rope block; a reader of the block alone gets no trained length, and with it no "
                "long factors or attention factor",
                "pytorch/executorch#19235 (Phi-4-mini's longrope attention factor)",
            )
        if r.rope_type == "dynamic":
            found["dynamic-cache"] = Pitfall(
                "dynamic-cache",
                "dynamic scaling changes the frequencies with the current length, so keys cached "
                "at a shorter length were rotated with another base",
                "chapter 11's dynamic check",
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
            "Blaizzy/mlx-vlm#1709; ggml-org/llama.cpp#14367; ollama/ollama#13445",
        )
    if config.get("rope_parameters") is not None and config.get("rope_theta") is None:
        found["v5-rope-parameters"] = Pitfall(
            "v5-rope-parameters",
            "the base is only inside rope_parameters (transformers 5's form); code that reads "
            "rope_theta at the top level gets an error or a default base",
            "deepspeedai/DeepSpeed#8341",
        )
    return list(found.values())


def _window(config: Mapping[str, Any], layer_type: str) -> int | None:
    window = config.get("sliding_window")
    if window is None or layer_type != "sliding_attention":
        return None
    return check_int("sliding_window", window)


def inspect_config(
    config: Mapping[str, Any] | object, *, context: int | None = None
) -> ConfigReport:
    """Report what a config asks of RoPE, per layer type, at a target context.

    For each layer type of the config (:func:`~pecode.scaling.hf_layer_types`):

    * the frequencies and attention factor, as transformers computes them
      (:func:`~pecode.scaling.frequencies_from_hf_config`), at the trained length and at
      the target context (the frequencies of ``dynamic`` and ``longrope`` change with
      the length; transformers' attention factors do not);
    * the trained length ``L0``: ``original_max_position_embeddings`` (the block's or the
      top level's), else ``max_position_embeddings``;
    * Liu et al.'s critical dimension at the base and ``L0``: twice the number of rotated
      pairs that complete a turn within ``L0`` at the unscaled frequencies, which is
      :func:`~pecode.rope_base.critical_dimension` unless a pair turns exactly once;
    * the pairs whose angles at the target context were never seen in training
      (:func:`~pecode.scaling.unseen_angle_pairs` against the unscaled frequencies at the
      same base), with the config's scaling and without; on sliding layers the window,
      not the context, bounds the distance;
    * Men et al.'s base bound for the target context, when
      :data:`~pecode.rope_base.BASE_BOUNDS` has the rotary width and a tabulated context at
      least as long (the bound of the next tabulated context, which is no smaller);
    * the layer count, how many have no positions (NoPE), the sliding window, and the
      query temperature at the target context (:func:`~pecode.scaling.hf_query_temperature`).

    Args:
        config: a ``config.json`` as a dict, or a transformers config object.
        context: the target context in tokens; default ``max_position_embeddings``.

    Raises:
        TypeError, ValueError: as :func:`~pecode.scaling.hf_rope_arguments`; ``context`` not
            a positive int; no ``max_position_embeddings`` and no ``context``.
    """
    config = _hf_config_dict(config)
    if context is None:
        context = config.get("max_position_embeddings")
        if context is None:
            raise ValueError("context: the config has no max_position_embeddings; pass context=")
    check_int("context", context)
    types = hf_layer_types(config)
    kinds = _layer_kinds(config, types)
    nope = (
        nope_layers_from_hf(config)
        if config.get("model_type") in NOPE_MODEL_TYPES
        else (False,) * len(kinds)
    )
    temperature = hf_query_temperature(config)
    reports = []
    for layer_type in types:
        read_as = layer_type if len(types) > 1 or config.get("layer_types") else None
        arguments = hf_rope_arguments(config, layer_type=read_as)
        trained, trained_from = _trained_length(config, arguments)
        factors = {}
        for length in dict.fromkeys((trained, context)):
            inv_freq, factors[length] = frequencies_from_hf_config(
                config, layer_type=read_as, seq_len=length, dtype=torch.float64
            )
        unscaled, _ = rope_frequencies(
            "default", arguments["rotary_dim"], arguments["base"], dtype=torch.float64
        )
        rotated = inv_freq > 0
        window = _window(config, layer_type)
        reach = context if window is None else min(context, window)
        unseen = unseen_angle_pairs(unscaled, inv_freq, trained, reach) & rotated
        unseen_unscaled = unseen_angle_pairs(unscaled, unscaled, trained, reach)
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
                head_dim=arguments["head_dim"],
                rotary_dim=arguments["rotary_dim"],
                base=arguments["base"],
                rope_type=arguments["scaling"],
                scaling_params=dict(arguments["scaling_params"]),
                trained_length=trained,
                context=context,
                window=window,
                inv_freq=inv_freq,
                attention_factor=factors,
                critical_dimension=2 * int(((trained * unscaled >= 2 * math.pi) & rotated).sum()),
                unseen_pairs=int(unseen.sum()),
                unseen_pairs_unscaled=int(unseen_unscaled.sum()),
                base_bound=None
                if arguments["scaling"] == "proportional"
                else _tabulated_bound(arguments["rotary_dim"], reach),
                query_temperature=scale,
                trained_length_from=trained_from,
            )
        )
    return ConfigReport(
        model_type=str(config.get("model_type")),
        context=context,
        layer_types=tuple(reports),
        pitfalls=tuple(_pitfalls(config, reports)),
    )


def _tabulated_bound(dim: int, context: int) -> float | None:
    lengths = sorted(length for width, length in BASE_BOUNDS if width == dim and length >= context)
    return BASE_BOUNDS[(dim, lengths[0])] if lengths else None


def plot_report(report: ConfigReport, ax: Any = None) -> Any:
    """Each layer type's wavelengths ``2π/θ_i`` against the pair index, with the trained
    length and the target context drawn across: the pairs above the trained length never
    completed a turn in training. Returns the matplotlib Axes."""
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6.4, 3.6))
    for r in report.layer_types:
        rotated = r.inv_freq > 0
        wavelengths = (2 * math.pi / r.inv_freq[rotated]).numpy()
        ax.plot(range(len(wavelengths)), wavelengths, marker=".", label=f"{r.layer_type}")
        ax.axhline(r.trained_length, color="gray", linestyle="--", linewidth=0.8)
    ax.axhline(report.context, color="black", linestyle=":", linewidth=0.8)
    ax.set_yscale("log")
    ax.set_xlabel("pair index i")
    ax.set_ylabel("wavelength 2π/θ_i (tokens)")
    ax.set_title(f"{report.model_type}: dashed trained length, dotted target context")
    ax.legend(fontsize=8)
    return ax


def main(argv: Sequence[str] | None = None) -> int:
    """The command line: ``python -m pecode.inspect_config config.json [--context N]
    [--figure out.png]``. Prints the report; returns the exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m pecode.inspect_config",
        description="What a Hugging Face config.json asks of RoPE, per layer type.",
    )
    parser.add_argument("config", help="path to the model's config.json")
    parser.add_argument("--context", type=int, default=None, help="target context in tokens")
    parser.add_argument("--figure", default=None, help="write the wavelength plot to this file")
    args = parser.parse_args(argv)
    try:
        with open(args.config, encoding="utf-8") as file:
            config = json.load(file)
        report = inspect_config(config, context=args.context)
    except (OSError, TypeError, ValueError) as error:  # json's errors are ValueErrors
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(report)
    if args.figure:
        import matplotlib

        matplotlib.use("Agg")
        ax = plot_report(report)
        ax.figure.savefig(args.figure, dpi=120, bbox_inches="tight")
    return 0


if __name__ == "__main__":
    sys.exit(main())
