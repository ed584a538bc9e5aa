"""Long-context RoPE: one registry of frequency rules for reading past the trained length.

A model trained with RoPE on sequences of length ``L0`` has seen every rotation angle
``m θ_i`` with ``0 <= m < L0``. Pairs whose wavelength ``2π/θ_i`` exceeds ``L0`` never
completed a turn in training, so at positions past ``L0`` they rotate to angles the
model never saw. Every method here changes the frequencies (and some the logit scale)
so that a longer context maps back into, or close to, the trained range:

* ``"default"``: ``θ_i = base^(-2i/d)`` (RoFormer), via
  :func:`pecode.frequencies.rope_inv_freq`;
* ``"linear"``: position interpolation, ``θ_i / s`` (Chen et al. 2023);
* ``"ntk"``: NTK-aware, base ``b · s^(d/(d-2))`` (bloc97, described by Peng et al. 2023);
* ``"dynamic"``: dynamic NTK, the NTK base with its factor grown from the current
  length ``L``: ``s L / L0 - (s - 1)``, the rule of emozilla's 2023 post and of Hugging
  Face transformers' ``"dynamic"`` rope type. The YaRN paper (Peng et al. 2023, §3.3)
  describes Dynamic NTK as the NTK rule with ``max(1, L / L0)``: that is this rule with
  ``factor=1``;
* ``"yarn"``: YaRN, a per-pair ramp between ``θ_i`` and ``θ_i / s`` plus a logit
  temperature (Peng et al. 2023);
* ``"llama3"``: the Llama 3.1 rule, three wavelength bands, smooth in the middle one
  (Meta's reference code, ``apply_scaling`` in meta-llama/llama-models; the Llama 3
  paper gives the base 500000 but not this rule);
* ``"longrope"``: LongRoPE as Phi-3 uses it (Ding et al. 2024): every pair's frequency
  divided by its own searched factor, from one list up to ``L0`` and another past it,
  and a logit factor ``sqrt(1 + ln s / ln L0)``; the rule of transformers' ``"longrope"``;
* ``"proportional"``: transformers' ``"proportional"`` rope type (Gemma 4): the leading
  pairs rotate with the frequencies of the full head width, the others not at all;
* ``"base_change"``: a new base ``rope_theta`` (LLaMA 2 Long: 500000; Code Llama: 1e6);
  the same frequencies as ``"default"`` with ``base=rope_theta``.

:func:`rope_frequencies` returns ``(inv_freq, attention_factor)``: the frequencies and a
factor that multiplies both ``cos`` and ``sin`` tables, so that every attention logit
``q·k`` is multiplied by ``attention_factor ** 2`` (Peng et al. 2023, "length scaling").

Hugging Face configs. :func:`frequencies_from_hf_config` and :func:`hf_rope_arguments`
take a model's ``config.json``, loaded as a dict, as it is: its ``rope_scaling`` block
(transformers 4 configs) or ``rope_parameters`` block (transformers 5 configs, which also
hold ``rope_theta`` and ``partial_rotary_factor``), the older key ``type`` for
``rope_type``, and every rope type of transformers 5.23 (``default``, ``linear``,
``dynamic``, ``yarn``, ``longrope``, ``llama3``, ``proportional``). They translate the
config into this module's arguments and give what transformers 5.23's
``ROPE_INIT_FUNCTIONS`` give for it (``tests/test_hf_rope_configs.py`` checks every rope
type on model-like configs). The translation reads a config as transformers 5.23 does:

* the rotated width is ``int(head_dim * partial_rotary_factor)``;
* ``dynamic``: ``L0`` is the top-level ``max_position_embeddings``;
* ``yarn``, ``llama3``, ``longrope``: a missing ``original_max_position_embeddings`` is
  the top-level one (Phi-3 keeps it there), else ``max_position_embeddings``; a
  ``factor`` of ``None`` (yarn) or a missing one (longrope) is
  ``max_position_embeddings / original_max_position_embeddings``;
* ``yarn``: a ``beta_fast`` or ``beta_slow`` of ``None`` or 0 is the default (32, 1);
  ``mscale`` without a nonzero ``mscale_all_dim`` is ignored (factor ``0.1 ln s + 1``;
  DeepSeek-V2's released code, whose configs brought the two keys, would give
  ``0.1 · mscale · ln s + 1``); ``truncate: false`` (gpt-oss) keeps the ramp's ends
  unrounded, and ``truncate: null`` counts as false;
* ``longrope``: Phi-3's older name ``"su"`` is read as ``"longrope"``, and so is
  ``"yarn"`` when ``model_type`` is ``phi3`` (as Phi-3's configuration class reads them;
  in transformers 5.23 that class then rejects a config whose
  ``original_max_position_embeddings`` is at the top level, as Phi-3's are).

It refuses, with an error that names the key, what transformers accepts with a warning
or resolves silently: a key no rope type takes (a close match is suggested), a value
given twice that disagrees (``rope_theta`` in the block and at the top level), a factor
below 1, a config with no ``rope_theta`` (transformers then uses its model class's
default, which is not 10000 for every class), and a multimodal ``mrope_section`` of a
model type whose section layout pecode does not know (it reads Qwen2-VL's and
Qwen2.5-VL's chunked sections, Qwen3-VL's and Qwen3.5's interleaved ones, Qwen2-VL's
older ``"type": "mrope"`` as the default rope type).

pecode's own kinds are stricter than transformers where a config could mean two things:
they take the current length, the head dimension and the base as arguments, never from
a config; they compute in float64 (transformers in float32); ``dynamic`` requires
``original_max_position_embeddings`` (pass the config's ``max_position_embeddings``);
``yarn`` and ``llama3`` require it too and ``yarn`` a ``factor``; ``yarn`` raises on
``mscale`` without ``mscale_all_dim`` (pass ``attention_factor`` to choose) and on a
``beta_fast`` or ``beta_slow`` of 0.

One YaRN block has not always meant one thing in transformers. pecode uses ``factor``
as given and runs the ramp from ``original_max_position_embeddings``, as transformers
does from release 4.56.0 (August 2025). Releases 4.43 to 4.50 (July 2024 to March 2025)
ignored ``original_max_position_embeddings`` and ran the ramp from the top-level
``max_position_embeddings``; releases 4.51.0 to 4.55.x (April to August 2025) replaced
``factor`` by ``max_position_embeddings / original_max_position_embeddings`` whenever
the latter was set (transformers issue #38224, fixed by PR #40320). The key names moved
as well: transformers 5.23 still reads a ``rope_scaling`` block and the key ``type``
(its config classes convert both) but writes ``rope_parameters`` with ``rope_theta`` in it.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from pecode._checks import check_int
from pecode.frequencies import check_rope_base, rope_inv_freq
from pecode.mrope import mrope_pair_axes

__all__ = [
    "HF_ROPE_TYPES",
    "PUBLISHED_CONFIGS",
    "SCALING_KINDS",
    "ScalingKind",
    "frequencies_from_hf_config",
    "hf_layer_types",
    "hf_query_temperature",
    "hf_rope_arguments",
    "log_length_query_scale",
    "logn_query_scale",
    "rope_frequencies",
    "unseen_angle_pairs",
    "yarn_attention_factor",
    "yarn_correction_range",
    "yarn_get_mscale",
]


def _number(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    return float(value)


def _factor(params: dict[str, Any]) -> float:
    factor = _number("factor", params["factor"])
    if factor < 1.0:
        raise ValueError(f"factor must be >= 1 (the context is extended, not shrunk), got {factor}")
    return factor


def _positive(name: str, value: Any) -> float:
    value = _number(name, value)
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def _ntk_exponent(dim: int) -> float:
    if dim < 4:
        raise ValueError(
            f"dim must be at least 4 for NTK-aware scaling (exponent d/(d-2)), got {dim}"
        )
    return dim / (dim - 2)


def _default(dim: int, base: float, params: dict[str, Any]) -> tuple[Tensor, float]:
    return rope_inv_freq(dim, base, dtype=torch.float64), 1.0


def _linear(dim: int, base: float, params: dict[str, Any]) -> tuple[Tensor, float]:
    # Chen et al. 2023: f'(x, m) = f(x, m L / L'); dividing every θ_i by
    # s = L'/L gives the same angles m θ_i / s.
    return rope_inv_freq(dim, base, dtype=torch.float64) / _factor(params), 1.0


def _ntk(dim: int, base: float, params: dict[str, Any]) -> tuple[Tensor, float]:
    # Peng et al. 2023 ("NTK-aware"): b' = b s^(|D|/(|D|-2)); the highest frequency
    # θ_0 = 1 is kept and the lowest θ_{d/2-1} is divided by exactly s.
    new_base = base * _factor(params) ** _ntk_exponent(dim)
    return rope_inv_freq(dim, new_base, dtype=torch.float64), 1.0


def _dynamic(dim: int, base: float, params: dict[str, Any]) -> tuple[Tensor, float]:
    # Dynamic NTK as emozilla's 2023 post and Hugging Face transformers compute it:
    # b' = b ((s L / L0) - (s - 1))^(d/(d-2)) for the current length L > L0, else b.
    # With s = 1 the bracket is L / L0: the YaRN paper's Dynamic NTK (its §3.3).
    factor = _factor(params)
    original = check_int(
        "original_max_position_embeddings", params["original_max_position_embeddings"]
    )
    seq_len = params.get("seq_len")
    seq_len = original if seq_len is None else check_int("seq_len", seq_len)
    exponent = _ntk_exponent(dim)
    length = max(seq_len, original)
    new_base = base * (factor * length / original - (factor - 1.0)) ** exponent
    return rope_inv_freq(dim, new_base, dtype=torch.float64), 1.0


def yarn_get_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's ``sqrt(1/t) = 0.1 · mscale · ln(s) + 1`` for ``s > 1``, else 1.

    Peng et al. 2023 (the attention temperature) with ``mscale = 1``; the ``mscale`` coefficient is
    the generalization used by DeepSeek-V2 configs and Hugging Face transformers.

    Raises:
        TypeError, ValueError: ``factor`` or ``mscale`` is not a finite number.
    """
    factor, mscale = _number("factor", factor), _number("mscale", mscale)
    return 1.0 if factor <= 1.0 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_attention_factor(
    factor: float, mscale: float | None = None, mscale_all_dim: float | None = None
) -> float:
    """The factor YaRN applies to ``cos`` and ``sin`` (so to ``q`` and ``k``).

    ``mscale_s / mscale_all`` when both ``mscale`` and ``mscale_all_dim`` are given and
    nonzero (DeepSeek-V2 style, where ``mscale_all_dim`` is applied again in the softmax
    scale); ``0.1 ln(s) + 1`` (Peng et al. 2023) when neither is given, or when both are
    given and one is 0. These cases agree with Hugging Face transformers (5.23). Note that
    ``mscale = mscale_all_dim`` gives a factor of exactly 1.

    ``mscale`` without ``mscale_all_dim`` (or the reverse) raises: transformers then
    ignores ``mscale`` (``0.1 ln(s) + 1``), DeepSeek-V2's released code, whose default
    ``mscale_all_dim`` is 0, gives ``0.1 · mscale · ln(s) + 1``, and the two differ
    unless ``mscale = 1``. Pass ``attention_factor`` to :func:`rope_frequencies` instead
    (:func:`frequencies_from_hf_config` reads such a config as transformers does).

    Raises:
        ValueError: only one of ``mscale``, ``mscale_all_dim`` is given.
    """
    if (mscale is None) != (mscale_all_dim is None):
        raise ValueError(
            "give both mscale and mscale_all_dim, or neither: with only mscale, Hugging Face "
            "transformers uses 0.1 ln(s) + 1 and DeepSeek-V2's code 0.1 mscale ln(s) + 1; "
            "pass attention_factor to choose"
        )
    if mscale and mscale_all_dim:
        return yarn_get_mscale(factor, mscale) / yarn_get_mscale(factor, mscale_all_dim)
    return yarn_get_mscale(factor)


def yarn_correction_range(
    dim: int,
    base: float,
    original_max_position_embeddings: int,
    beta_fast: float,
    beta_slow: float,
    *,
    truncate: bool = True,
) -> tuple[float, float]:
    """The pair indices ``(low, high)`` between which YaRN's ramp runs.

    Pair ``i`` turns ``r_i = L0 / λ_i = L0 θ_i / (2π)`` times over the trained context
    (Peng et al. 2023). Solving ``r_i = β`` for ``i`` gives
    ``i(β) = d ln(L0 / (2π β)) / (2 ln b)``; ``low = floor(i(beta_fast))`` and
    ``high = ceil(i(beta_slow))``, clipped to ``[0, d - 1]`` as in the authors' code.
    Pairs ``i <= low`` keep their frequency; pairs ``i >= high`` are divided by ``s``.
    With ``truncate=False`` (Hugging Face's ``truncate``, ``false`` in gpt-oss's config)
    the two ends are not rounded: ``low = i(beta_fast)``, ``high = i(beta_slow)``, clipped.

    Raises:
        ValueError: a parameter is not positive, or ``beta_fast <= beta_slow``.
        TypeError: ``truncate`` is not a bool.
    """
    beta_fast, beta_slow = _number("beta_fast", beta_fast), _number("beta_slow", beta_slow)
    if not beta_fast > beta_slow > 0:
        raise ValueError(
            f"need beta_fast > beta_slow > 0, got beta_fast={beta_fast}, beta_slow={beta_slow}"
        )
    original = check_int("original_max_position_embeddings", original_max_position_embeddings)
    if not isinstance(truncate, bool):
        raise TypeError(f"truncate must be a bool, got {type(truncate).__name__}")

    def pair_index(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_index(beta_fast), pair_index(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def _yarn(dim: int, base: float, params: dict[str, Any]) -> tuple[Tensor, float]:
    # Peng et al. 2023 ("NTK-by-parts" and the temperature); the ramp runs linearly over
    # the pair index between the correction range, as in the authors' released code
    # (the paper's γ ramps linearly in r). They differ inside the ramp, and outside it
    # too where the code's low end is clipped to 0: when pair 0 turns fewer than
    # beta_fast times, the code keeps it whole and the paper's γ divides part of it.
    factor = _factor(params)
    beta_fast, beta_slow = params.get("beta_fast"), params.get("beta_slow")
    low, high = yarn_correction_range(
        dim,
        base,
        params["original_max_position_embeddings"],
        32.0 if beta_fast is None else beta_fast,  # the paper's α and β for LLaMA
        1.0 if beta_slow is None else beta_slow,
        truncate=True if params.get("truncate") is None else params["truncate"],
    )
    if params.get("attention_factor") is not None:
        attention_factor = _positive("attention_factor", params["attention_factor"])
    else:
        attention_factor = yarn_attention_factor(
            factor, params.get("mscale"), params.get("mscale_all_dim")
        )
    extrapolation = rope_inv_freq(dim, base, dtype=torch.float64)
    interpolation = extrapolation / factor
    span = max(high - low, 1e-3)  # the authors' guard against low == high
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / span).clamp(0.0, 1.0)
    # ramp 0: keep θ_i (extrapolate); ramp 1: θ_i / s (interpolate)
    return extrapolation * (1.0 - ramp) + interpolation * ramp, attention_factor


def _llama3(dim: int, base: float, params: dict[str, Any]) -> tuple[Tensor, float]:
    # Llama 3.1 (Meta's reference code, apply_scaling in meta-llama/llama-models, and
    # Hugging Face transformers' "llama3" rope type):
    # wavelength < L0/high_freq_factor: keep; > L0/low_freq_factor: divide by s;
    # in between, interpolate in 1/λ with weight (L0/λ - low) / (high - low).
    factor = _factor(params)
    low_freq_factor = _number("low_freq_factor", params["low_freq_factor"])
    high_freq_factor = _number("high_freq_factor", params["high_freq_factor"])
    if not high_freq_factor >= low_freq_factor > 0:
        raise ValueError(
            "need high_freq_factor >= low_freq_factor > 0, got "
            f"low_freq_factor={low_freq_factor}, high_freq_factor={high_freq_factor}"
        )
    original = check_int(
        "original_max_position_embeddings", params["original_max_position_embeddings"]
    )
    inv_freq = rope_inv_freq(dim, base, dtype=torch.float64)
    wavelength = 2 * math.pi / inv_freq
    if high_freq_factor == low_freq_factor:  # no middle band: a step (Llama 4 Scout)
        middle = inv_freq  # reached only at λ = L0/low exactly, where transformers gives 0/0
    else:
        smooth = (original / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
        middle = (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
    result = torch.where(wavelength > original / low_freq_factor, inv_freq / factor, middle)
    return torch.where(wavelength < original / high_freq_factor, inv_freq, result), 1.0


def _factor_list(name: str, values: Any, length: int) -> Tensor:
    if isinstance(values, (str, bytes)) or not isinstance(values, (list, tuple)):
        raise TypeError(f"{name} must be a list of numbers, got {type(values).__name__}")
    if len(values) != length:
        raise ValueError(
            f"{name} must have one factor per rotated pair, {length}, got {len(values)}"
        )
    return torch.tensor(
        [_positive(f"{name}[{i}]", value) for i, value in enumerate(values)], dtype=torch.float64
    )


def _longrope(dim: int, base: float, params: dict[str, Any]) -> tuple[Tensor, float]:
    # LongRoPE (Ding et al. 2024) as Phi-3 uses it and transformers' "longrope" computes
    # it: θ_i / λ_i with one searched list λ for sequences up to L0 and another past L0,
    # and the logit factor sqrt(1 + ln s / ln L0) for both.
    original = check_int(
        "original_max_position_embeddings", params["original_max_position_embeddings"], 2
    )
    seq_len = check_int("seq_len", params["seq_len"])
    short = _factor_list("short_factor", params["short_factor"], dim // 2)
    long = _factor_list("long_factor", params["long_factor"], dim // 2)
    if params.get("attention_factor") is not None:
        attention_factor = _positive("attention_factor", params["attention_factor"])
    elif params.get("factor") is not None:
        factor = _factor(params)
        attention_factor = math.sqrt(1 + math.log(factor) / math.log(original))
    else:
        raise ValueError(
            "longrope needs factor (its attention factor is sqrt(1 + ln factor / ln "
            "original_max_position_embeddings)) or attention_factor"
        )
    rescale = long if seq_len > original else short
    return rope_inv_freq(dim, base, dtype=torch.float64) / rescale, attention_factor


def _proportional(dim: int, base: float, params: dict[str, Any]) -> tuple[Tensor, float]:
    # transformers' "proportional" rope type (Gemma 4): the first
    # int(partial_rotary_factor * dim // 2) pairs keep the frequencies of the full width
    # d (exponent 2i/d, not 2i/(rotated width)); the others get frequency 0 (not
    # rotated); all are divided by factor.
    factor = 1.0 if params.get("factor") is None else _factor(params)
    fraction = params.get("partial_rotary_factor")
    fraction = 1.0 if fraction is None else _number("partial_rotary_factor", fraction)
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"partial_rotary_factor must be in [0, 1], got {fraction}")
    inv_freq = rope_inv_freq(dim, base, dtype=torch.float64)
    inv_freq[int(fraction * dim // 2) :] = 0.0
    return inv_freq / factor, 1.0


def _base_change(dim: int, base: float, params: dict[str, Any]) -> tuple[Tensor, float]:
    # Xiong et al. 2023 ("adjusted base frequency", 10000 -> 500000) and
    # Rozière et al. 2023 (Code Llama, 10000 -> 1e6): the trained base is replaced.
    rope_theta = check_rope_base("rope_theta", params["rope_theta"])
    return rope_inv_freq(dim, rope_theta, dtype=torch.float64), 1.0


@dataclass(frozen=True)
class ScalingKind:
    """One entry of :data:`SCALING_KINDS`: the rule and the parameters it takes."""

    rule: Callable[[int, float, dict[str, Any]], tuple[Tensor, float]]
    required: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    reference: str = ""


SCALING_KINDS: dict[str, ScalingKind] = {
    "default": ScalingKind(_default, reference="Su et al. 2024 (RoFormer)"),
    "linear": ScalingKind(_linear, ("factor",), reference="Chen et al. 2023 (PI)"),
    "ntk": ScalingKind(_ntk, ("factor",), reference="bloc97 (2023), described in Peng et al. 2023"),
    "dynamic": ScalingKind(
        _dynamic,
        ("factor", "original_max_position_embeddings"),
        ("seq_len",),
        "emozilla (2023); Hugging Face transformers; factor=1: Peng et al. 2023 (YaRN), §3.3",
    ),
    "yarn": ScalingKind(
        _yarn,
        ("factor", "original_max_position_embeddings"),
        ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor", "truncate"),
        "Peng et al. 2023 (YaRN)",
    ),
    "llama3": ScalingKind(
        _llama3,
        ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
        reference="Meta's Llama 3.1 reference code (meta-llama/llama-models, apply_scaling)",
    ),
    "longrope": ScalingKind(
        _longrope,
        ("short_factor", "long_factor", "original_max_position_embeddings", "seq_len"),
        ("factor", "attention_factor"),
        "Ding et al. 2024 (LongRoPE), as in Phi-3 and Hugging Face transformers' longrope",
    ),
    "proportional": ScalingKind(
        _proportional,
        optional=("factor", "partial_rotary_factor"),
        reference="Hugging Face transformers' proportional rope type (Gemma 4)",
    ),
    "base_change": ScalingKind(
        _base_change,
        ("rope_theta",),
        reference="Xiong et al. 2023 (LLaMA 2 Long); Rozière et al. 2023 (Code Llama)",
    ),
}
"""Every kind by name, with its rule, its required and optional parameters and its reference."""


def _closeness(name: str, options: Any) -> float:
    """How close ``name`` comes to its nearest option (1: equal, 0: nothing alike)."""
    return max((difflib.SequenceMatcher(None, name, str(o)).ratio() for o in options), default=0)


def _did_you_mean(name: object, options: Any) -> str:
    matches = difflib.get_close_matches(str(name), list(options), n=1)
    return f" (did you mean {matches[0]!r}?)" if matches else ""


def rope_frequencies(
    kind: str, dim: int, base: float = 10000.0, *, dtype: torch.dtype = torch.float32, **params: Any
) -> tuple[Tensor, float]:
    """RoPE frequencies and attention factor for one long-context method.

    Every rule is computed in float64 and rounded to ``dtype`` at the end. The
    attention factor multiplies both the cos and the sin table, hence each rotated
    ``q`` and ``k``, hence every logit by its square.

    Parameters by kind (required; *optional*; a parameter given as ``None`` counts as
    not given):

    * ``default``: none;
    * ``linear``, ``ntk``: ``factor``;
    * ``dynamic``: ``factor``, ``original_max_position_embeddings``; *seq_len* (the
      current length; default the original). Hugging Face's form; ``factor=1`` gives
      the YaRN paper's ``max(1, seq_len / original)``;
    * ``yarn``: ``factor``, ``original_max_position_embeddings``; *beta_fast* (32),
      *beta_slow* (1), *mscale*, *mscale_all_dim*, *attention_factor*, *truncate*
      (``True``: round the ramp's ends to whole pairs). ``factor`` is used as given,
      never derived from a ``max_position_embeddings`` (which pecode does not take; see
      the module docstring for what transformers did);
    * ``llama3``: ``factor``, ``low_freq_factor``, ``high_freq_factor``,
      ``original_max_position_embeddings``;
    * ``longrope``: ``short_factor``, ``long_factor`` (``dim // 2`` positive numbers
      each), ``original_max_position_embeddings``, ``seq_len`` (the current length:
      ``long_factor`` applies when it exceeds the original); *factor* or
      *attention_factor* (one of them is needed);
    * ``proportional``: *factor* (1), *partial_rotary_factor* (1): the leading
      ``int(partial_rotary_factor * dim // 2)`` pairs rotate, the others have
      frequency 0;
    * ``base_change``: ``rope_theta`` (the new base).

    Shapes::

        returns: (inv_freq [dim // 2] in ``dtype``, attention_factor: float)

    Args:
        kind: one of :data:`SCALING_KINDS`.
        dim: the number of rotated features (even).
        base: the trained base ``b`` (10000 in RoFormer).
        dtype: float32 (default) or float64.
        **params: the kind's parameters, spelled as in Hugging Face ``rope_scaling``
            (the module docstring lists where transformers reads them differently;
            :func:`frequencies_from_hf_config` reads a config as transformers does).

    Raises:
        ValueError: unknown ``kind`` or parameter (the message suggests a close
            spelling and lists what the kind accepts), a missing parameter, or an
            invalid value (``factor < 1``, ``beta_fast <= beta_slow``,
            ``high_freq_factor <= low_freq_factor``, ``dim < 4`` for the NTK rules, a
            factor list of the wrong length, ...).
        TypeError: ``kind`` is not a str, a parameter has the wrong type, or ``dtype``
            is not float32/float64.
    """
    if not isinstance(kind, str):
        raise TypeError(f"kind must be a str, got {type(kind).__name__}")
    if kind not in SCALING_KINDS:
        raise ValueError(
            f"unknown scaling kind {kind!r}{_did_you_mean(kind, SCALING_KINDS)}; "
            f"accepted kinds: {sorted(SCALING_KINDS)}"
        )
    spec = SCALING_KINDS[kind]
    accepted = spec.required + spec.optional
    unknown = sorted(set(params) - set(accepted))
    if unknown:  # before the missing ones: a misspelt name is both
        raise ValueError(
            f"scaling kind {kind!r} does not take {unknown}{_did_you_mean(unknown[0], accepted)}; "
            f"it accepts {list(accepted) or 'no parameters'}"
        )
    missing = [name for name in spec.required if params.get(name) is None]
    if missing:
        raise ValueError(f"scaling kind {kind!r} needs {list(spec.required)}; missing {missing}")
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    rope_inv_freq(dim, base)  # validates dim and base with the contract's messages
    inv_freq, attention_factor = spec.rule(dim, float(base), params)
    return inv_freq.to(dtype), float(attention_factor)


PUBLISHED_CONFIGS: dict[str, dict[str, Any]] = {
    "llama2_long": {"kind": "base_change", "base": 10000.0, "rope_theta": 500000.0},
    "code_llama": {"kind": "base_change", "base": 10000.0, "rope_theta": 1000000.0},
    "llama3.1": {
        "kind": "llama3",
        "base": 500000.0,
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 8192,
    },
    "qwen3_yarn": {
        "kind": "yarn",
        "base": 1000000.0,
        "factor": 4.0,
        "original_max_position_embeddings": 32768,
    },
}
"""Published settings, as ``rope_frequencies`` arguments (``dim`` left out).

``llama2_long``: Xiong et al. 2023; the Llama 3 paper (Dubey et al. 2024, §3.2) reports
500000 as the base Xiong et al. showed effective up to 32,768 tokens (chapter 11 says what
could be checked). ``code_llama``: Rozière et al. 2023. ``llama3.1``: the constants of
Meta's reference ``apply_scaling`` (factor 8, band factors 1 and 4, original length
8192), which the ``rope_scaling`` block of the Llama 3.1 configs on the Hugging Face Hub
repeats, with the base 500000 of the Llama 3 paper. ``qwen3_yarn``: the block the Qwen3
model cards tell users to add for 131072 tokens, with Qwen3's ``rope_theta``.
"""


def unseen_angle_pairs(
    trained_inv_freq: Tensor, inv_freq: Tensor, original_length: int, length: int
) -> Tensor:
    """Which pairs reach rotation angles that training never produced.

    Training on positions ``0 .. L0`` shows pair ``i`` every angle in ``[0, L0 θ_i]``;
    when ``L0 θ_i >= 2π`` that is the whole circle and nothing is new. Otherwise a
    context of ``length`` positions with frequencies ``θ'_i`` is out of distribution
    for pair ``i`` when ``length · θ'_i > L0 · θ_i`` (beyond a relative 1e-9, so that
    an exact interpolation counts as seen).

    Shapes::

        trained_inv_freq, inv_freq: [dim // 2]
        returns:                    [dim // 2] (bool)

    Raises:
        ValueError: the frequency tensors differ in shape, or a length is not positive.
    """
    if trained_inv_freq.shape != inv_freq.shape:
        raise ValueError(
            f"trained_inv_freq and inv_freq must have the same shape, got "
            f"{tuple(trained_inv_freq.shape)} and {tuple(inv_freq.shape)}"
        )
    check_int("original_length", original_length)
    check_int("length", length)
    trained = trained_inv_freq.to(torch.float64)
    seen = original_length * trained
    reach = length * inv_freq.to(torch.float64)
    return (seen < 2 * math.pi) & (reach > seen * (1 + 1e-9))


# ----------------------------------------------------------------- Hugging Face configs

HF_ROPE_TYPES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "default": ((), ()),
    "linear": (("factor",), ()),
    "dynamic": (("factor",), ("original_max_position_embeddings",)),
    "yarn": (
        ("factor",),
        (
            "original_max_position_embeddings",
            "attention_factor",
            "beta_fast",
            "beta_slow",
            "mscale",
            "mscale_all_dim",
            "truncate",
        ),
    ),
    "longrope": (
        ("short_factor", "long_factor"),
        ("original_max_position_embeddings", "factor", "attention_factor"),
    ),
    "llama3": (
        ("factor", "low_freq_factor", "high_freq_factor"),
        ("original_max_position_embeddings",),
    ),
    "proportional": ((), ("factor",)),
}
"""The rope types of Hugging Face transformers 5.23, each with the keys its block must
hold and the keys it may hold, besides ``rope_type`` (or the older ``type``),
``rope_theta`` and ``partial_rotary_factor``, which any block may hold. These are the keys
of transformers' ``_validate_<type>_rope_parameters``, except that
``original_max_position_embeddings`` may be missing where transformers fills it in from
the top level, and that ``dynamic`` may repeat it (transformers ignores it there; pecode
takes it only if it equals ``max_position_embeddings``). Each rope type is the
:data:`SCALING_KINDS` entry of the same name."""

_HF_ANY_BLOCK = ("rope_type", "type", "rope_theta", "partial_rotary_factor")
# multi-axis RoPE: the pairs per position axis, and how the model class lays them out
# (its code decides, not mrope_interleaved: Qwen3-VL's rotary embedding never reads it)
_HF_MROPE_KEYS = ("mrope_section", "mrope_interleaved")
_HF_MROPE_LAYOUTS = {
    "qwen2_vl": "chunked",
    "qwen2_vl_text": "chunked",
    "qwen2_5_vl": "chunked",
    "qwen2_5_vl_text": "chunked",
    "qwen3_vl": "interleaved",
    "qwen3_vl_text": "interleaved",
    "qwen3_vl_moe": "interleaved",
    "qwen3_vl_moe_text": "interleaved",
    "qwen3_5": "interleaved",
    "qwen3_5_text": "interleaved",
    "qwen3_5_moe": "interleaved",
    "qwen3_5_moe_text": "interleaved",
}
# keys some blocks carry for the attention, not the frequencies: Ministral 3's and
# Mistral Large 3's query temperature, and the length it counts in (transformers'
# Ministral3Config lists both in ignore_keys_at_rope_validation)
_HF_ATTENTION_KEYS = ("llama_4_scaling_beta", "max_position_embeddings")
# model types whose rotary embedding ignores partial_rotary_factor (the whole head turns)
_HF_FULL_ROTARY_MODELS = ("llama4", "llama4_text")
_HF_LONGROPE_MODELS = ("phi3", "phi4_multimodal")  # whose config classes read "yarn" as longrope
# HunYuan's rotary embedding reads a "dynamic" block with a nonzero alpha as NTK-aware
# scaling with factor alpha, fixed (its "ntk_alpha"); other model classes ignore alpha
_HF_ALPHA_MODELS = ("hunyuan", "hunyuan_v1_dense", "hunyuan_v1_moe")
# keys HunYuan's published "dynamic" blocks carry that its rotary embedding never reads
_HF_ALPHA_UNREAD = ("beta_fast", "beta_slow", "mscale", "mscale_all_dim")
# Configuration classes that build one block per layer type from a flat (transformers 4)
# config: the full-attention layers get rope_theta and the rope_scaling block, the
# sliding ones unscaled RoPE with this base (Gemma 3: its own key; OLMo 3: the class's
# default_theta, 500000, whatever rope_theta says).
_HF_SLIDING_BASE = {
    "gemma3": "rope_local_base_freq",
    "gemma3_text": "rope_local_base_freq",
    "olmo3": 500000.0,
}


def _agreed(name: str, *sources: tuple[str, Any]) -> Any:
    """The value a config gives for ``name`` in one or more places (``None`` if none);
    places that disagree raise, where transformers would silently prefer one."""
    given = [(where, value) for where, value in sources if value is not None]
    if any(value != given[0][1] for _, value in given[1:]):
        places = ", ".join(f"{where}={value!r}" for where, value in given)
        raise ValueError(f"{name} is given twice with different values: {places}")
    return given[0][1] if given else None


def _hf_config_dict(config: object) -> Mapping[str, Any]:
    """The config as a dict: a loaded ``config.json``, or a transformers config object
    (its ``to_dict()``); a multimodal config's ``text_config`` when the rope keys are
    there (Gemma 3, Mistral 3)."""
    if not isinstance(config, Mapping):
        to_dict = getattr(config, "to_dict", None)
        if not callable(to_dict) or not isinstance(written := to_dict(), Mapping):
            raise TypeError(
                "config must be a dict (a loaded config.json) or a transformers config, got "
                f"{type(config).__name__}"
            )
        config = written
    text = config.get("text_config")
    rope_keys = ("rope_parameters", "rope_scaling", "rope_theta")
    if isinstance(text, Mapping) and all(config.get(key) is None for key in rope_keys):
        return text
    return config


def _is_per_layer_type(block: Mapping[str, Any]) -> bool:
    return bool(
        block
        and "rope_type" not in block
        and "type" not in block
        and all(value is None or isinstance(value, Mapping) for value in block.values())
    )


def _hf_blocks_per_layer_type(config: Mapping[str, Any]) -> dict[str, dict[str, Any]] | None:
    """The blocks per layer type that transformers 5.23's Gemma 3 and OLMo 3 config
    classes build from a flat (transformers 4) config, or None for other configs."""
    sliding_base = _HF_SLIDING_BASE.get(config.get("model_type"))
    parameters = config.get("rope_parameters")
    if sliding_base is None or (isinstance(parameters, Mapping) and _is_per_layer_type(parameters)):
        return None
    model_type = config["model_type"]
    if parameters is not None:
        raise ValueError(
            f"rope_parameters: transformers' {model_type} config class reads it only as one "
            "block per layer type ({'full_attention': ..., 'sliding_attention': ...}); a "
            "flat block belongs in rope_scaling"
        )
    scaling = config.get("rope_scaling") or {}
    if not isinstance(scaling, Mapping):
        raise TypeError(f"rope_scaling must be a dict, got {type(scaling).__name__}")
    full = dict(scaling) if scaling else {"rope_type": "default"}
    theta = _agreed(
        "rope_theta",
        ("rope_scaling['rope_theta']", scaling.get("rope_theta")),
        ("rope_theta", config.get("rope_theta")),
    )
    if theta is None:
        raise ValueError(
            f"rope_theta: the {model_type} config gives none (transformers then uses its "
            "class's default_theta); add it to the config"
        )
    full["rope_theta"] = theta
    if isinstance(sliding_base, str):
        if config.get(sliding_base) is None:
            raise ValueError(
                f"{sliding_base}: the {model_type} config gives none, the base of its sliding "
                "layers (transformers then uses 10000); add it to the config"
            )
        sliding_theta = config[sliding_base]
    else:
        if _number("rope_theta", theta) != sliding_base:
            raise ValueError(
                f"rope_theta={theta!r}: transformers 5.23 reads a flat {model_type} config "
                f"with base {sliding_base:g} on its sliding layers whatever rope_theta says; "
                "write rope_parameters per layer type ({'full_attention': ..., "
                "'sliding_attention': ...}) to say which base they have"
            )
        sliding_theta = sliding_base
    return {
        "full_attention": full,
        "sliding_attention": {"rope_type": "default", "rope_theta": sliding_theta},
    }


def _hf_block(
    config: Mapping[str, Any], layer_type: str | None
) -> tuple[str, dict[str, Any], bool]:
    """Where the block is, the block, and whether it is one of a block per layer type."""
    if layer_type is not None and not isinstance(layer_type, str):
        raise TypeError(f"layer_type must be a str or None, got {type(layer_type).__name__}")
    converted = _hf_blocks_per_layer_type(config)
    if converted is not None:  # Gemma 3, OLMo 3 written by transformers 4
        where, block = f"{config['model_type']} rope_scaling read per layer type", converted
    else:
        blocks = [key for key in ("rope_parameters", "rope_scaling") if config.get(key) is not None]
        if len(blocks) == 2 and config["rope_parameters"] != config["rope_scaling"]:
            raise ValueError("config has both rope_parameters and rope_scaling, and they differ")
        if not blocks:
            _check_layer_type_listed(config, layer_type)
            return "rope_parameters", {}, False
        where, block = blocks[0], config[blocks[0]]
        if not isinstance(block, Mapping):
            raise TypeError(f"{where} must be a dict, got {type(block).__name__}")
    if _is_per_layer_type(block):  # transformers 5: one block per layer type (Gemma 3)
        if layer_type not in block:
            raise ValueError(
                f"{where} holds one block per layer type, {sorted(block)}: pass layer_type= "
                f"one of them (got {layer_type!r})"
            )
        return f"{where}[{layer_type!r}]", dict(block[layer_type] or {}), True
    _check_layer_type_listed(config, layer_type)
    return where, dict(block), False


def hf_layer_types(config: Mapping[str, Any] | object) -> list[str]:
    """The layer types whose rope block a config gives, sorted.

    Those of its blocks per layer type (transformers 5's form, or Gemma 3's and OLMo 3's
    flat form read as their config classes read it), leaving out a type whose block is
    null; else those its ``layer_types`` lists (one block serves them all); else
    ``["full_attention"]``.

    Raises:
        TypeError, ValueError: as :func:`hf_rope_arguments` for the config.
    """
    config = _hf_config_dict(config)
    blocks = _hf_blocks_per_layer_type(config)
    if blocks is None:
        blocks = config.get("rope_parameters") or config.get("rope_scaling")
    if isinstance(blocks, Mapping) and _is_per_layer_type(blocks):
        return sorted(name for name, block in blocks.items() if block is not None)
    listed = config.get("layer_types")
    if isinstance(listed, list | tuple) and listed:
        return sorted(set(listed))
    return ["full_attention"]


def _check_layer_type_listed(config: Mapping[str, Any], layer_type: str | None) -> None:
    # one block serves every layer type (Gemma 2, Cohere 2, gpt-oss): a layer_type is
    # accepted if the config's layer_types, where it lists them, has it
    listed = config.get("layer_types")
    if layer_type is not None and isinstance(listed, list | tuple) and layer_type not in listed:
        raise ValueError(
            f"layer_type={layer_type!r} is not among the config's layer_types {sorted(set(listed))}"
        )


def _hf_rope_type(block: dict[str, Any], where: str, model_type: Any) -> str:
    rope_type = _agreed(
        "rope_type",
        (f"{where}['rope_type']", block.get("rope_type")),
        (f"{where}['type']", block.get("type")),
    )
    rope_type = "default" if rope_type is None else rope_type
    if not isinstance(rope_type, str):
        raise TypeError(f"{where}['rope_type'] must be a str, got {type(rope_type).__name__}")
    if rope_type == "su" or (rope_type == "yarn" and model_type in _HF_LONGROPE_MODELS):
        rope_type = "longrope"  # Phi-3's older names, as its configuration class reads them
    if rope_type == "mrope":  # Qwen2-VL's first configs; its configuration class renames it
        rope_type = "default"
    if rope_type not in HF_ROPE_TYPES:
        raise ValueError(
            f"unknown rope_type {rope_type!r} in {where}{_did_you_mean(rope_type, HF_ROPE_TYPES)}; "
            f"the rope types of transformers 5.23: {list(HF_ROPE_TYPES)}"
        )
    required, optional = HF_ROPE_TYPES[rope_type]
    accepted = _HF_ANY_BLOCK + _HF_ATTENTION_KEYS + _HF_MROPE_KEYS + required + optional
    if rope_type == "dynamic" and block.get("alpha"):
        if model_type not in _HF_ALPHA_MODELS:
            raise ValueError(
                f"{where}['alpha']: only HunYuan's model classes read it (a fixed NTK factor; "
                f"model_type one of {list(_HF_ALPHA_MODELS)}); model_type is {model_type!r}, "
                "whose rotary embedding would ignore it"
            )
        accepted += ("alpha", *_HF_ALPHA_UNREAD)
    unknown = [key for key in block if key not in accepted]
    if unknown:  # the likeliest misspelling first: a misspelt rope_type makes others unknown
        key = max(unknown, key=lambda key: _closeness(key, accepted))
        raise ValueError(
            f"{where} has the key {key!r}{_did_you_mean(key, accepted)}, which rope_type "
            f"{rope_type!r} does not take; it takes {sorted(accepted)}"
        )
    missing = [key for key in required if key not in block]
    if missing:
        raise ValueError(
            f"{where} with rope_type {rope_type!r} needs {list(required)}; missing {missing}"
        )
    return rope_type


def _hf_layer_type_head_dim(
    config: Mapping[str, Any], layer_type: str | None
) -> tuple[str, Any] | None:
    """The head width of ``layer_type``'s layers where the config gives them their own:
    transformers' ``per_layer_config`` (a config object's ``to_dict()``, keyed by layer
    index) or a published Gemma 4 config's ``global_head_dim`` (its full-attention
    layers; transformers turns it into ``per_layer_config``)."""
    if layer_type is None:
        return None
    per_layer, kinds = config.get("per_layer_config"), config.get("layer_types")
    if per_layer and kinds:
        widths = {
            (per_layer.get(str(i)) or per_layer.get(i) or {}).get("head_dim")
            for i, kind in enumerate(kinds)
            if kind == layer_type
        }
        if len(widths) > 1:
            raise ValueError(
                f"per_layer_config: the {layer_type} layers have different head widths "
                f"{sorted(widths, key=str)}; one RoPE table per layer type needs one width"
            )
        width = next(iter(widths), None)
        return None if width is None else (f"per_layer_config's {layer_type} head_dim", width)
    if layer_type == "full_attention" and config.get("global_head_dim") is not None:
        return "global_head_dim", config["global_head_dim"]
    if layer_type == "full_attention" and config.get("model_type") in ("gemma4", "gemma4_text"):
        raise ValueError(
            "global_head_dim: a Gemma 4 config without it gets transformers' class default "
            "(512) on its full-attention layers, not head_dim; add it to the config"
        )
    return None


def _hf_head_dim(
    config: Mapping[str, Any], head_dim: int | None, layer_type: str | None = None
) -> int:
    # The width RoPE applies to: DeepSeek's multi-head latent attention rotates only
    # qk_rope_head_dim features (its transformers config sets head_dim to it); Gemma 4's
    # full-attention layers have their own width.
    own = _hf_layer_type_head_dim(config, layer_type)
    if own is not None:
        where, value = own
    elif config.get("qk_rope_head_dim") is not None:
        where, value = "qk_rope_head_dim", config["qk_rope_head_dim"]
    elif config.get("head_dim") is not None:
        where, value = "head_dim", config["head_dim"]
    elif config.get("hidden_size") is not None and config.get("num_attention_heads") is not None:
        hidden = check_int("hidden_size", config["hidden_size"])
        heads = check_int("num_attention_heads", config["num_attention_heads"])
        where, value = "hidden_size // num_attention_heads", hidden // heads
    else:
        where, value = None, None
    value = _agreed("head_dim", (f"config's {where}", value), ("head_dim argument", head_dim))
    if value is None:
        raise ValueError(
            "head_dim: the config has no qk_rope_head_dim, head_dim, or hidden_size and "
            "num_attention_heads; pass head_dim="
        )
    return check_int("head_dim", value)


def _hf_max_positions(config: Mapping[str, Any], why: str) -> int:
    value = config.get("max_position_embeddings")
    if value is None:
        raise ValueError(f"max_position_embeddings: the config has none, and {why}")
    return check_int("max_position_embeddings", value)


def _hf_ratio(config: Mapping[str, Any], original: int, rope_type: str) -> float:
    # transformers' factor when the block gives none: the extended over the trained length
    maximum = _hf_max_positions(config, f"{rope_type} with no factor needs it (factor = ratio)")
    if maximum < original:
        raise ValueError(
            f"factor = max_position_embeddings / original_max_position_embeddings = "
            f"{maximum} / {original} is below 1"
        )
    return maximum / original


def hf_rope_arguments(
    config: Mapping[str, Any], *, head_dim: int | None = None, layer_type: str | None = None
) -> dict[str, Any]:
    """A Hugging Face ``config.json``, loaded as a dict, as ``RotaryEmbedding`` arguments.

    The config is taken as it is (the module docstring lists how it is read): its
    ``rope_parameters`` or ``rope_scaling`` block, ``rope_theta``,
    ``partial_rotary_factor`` (or GPT-NeoX's ``rotary_pct`` and ``rotary_emb_base``),
    ``max_position_embeddings`` and ``original_max_position_embeddings``, and for the
    head width ``qk_rope_head_dim`` (DeepSeek), else ``head_dim``, else
    ``hidden_size // num_attention_heads``. A block alone can be passed as
    ``{"rope_parameters": block, "head_dim": ..., "max_position_embeddings": ...}``.
    A missing ``partial_rotary_factor`` means 1, transformers' generic default; a model
    class with another default (GPT-NeoX's ``rotary_pct`` 0.25) needs the key in the
    config, as the configs transformers writes have it. Only the frequencies are read:
    the layout (GPT-J's and DeepSeek's interleaved pairs) and any extra softmax scale
    (DeepSeek multiplies it by ``yarn_get_mscale(factor, mscale_all_dim) ** 2``) are the
    model's code, not its RoPE config.

    Returns a dict with ``head_dim``, ``rotary_dim`` (``int(head_dim *
    partial_rotary_factor)``; ``head_dim`` for ``proportional``), ``base`` (the
    ``rope_theta``), ``scaling`` (a kind of :data:`SCALING_KINDS`, named as the rope
    type) and ``scaling_params`` (that kind's parameters, without ``seq_len``: the
    current length is the caller's, for ``dynamic`` and ``longrope``;
    :class:`~pecode.rope.RotaryEmbedding` takes it from the positions of each call),
    and for a block with ``mrope_section`` (multi-axis RoPE) ``sections`` and
    ``section_layout``. ``RotaryEmbedding.from_hf_config(config)`` builds the module
    from them.

    Per layer type. A config with one block per layer type (transformers 5's
    ``rope_parameters: {"full_attention": ..., "sliding_attention": ...}``) needs
    ``layer_type``; so does a Gemma 3 or OLMo 3 config in transformers 4's flat form,
    which is read as their config classes read it: ``rope_theta`` and ``rope_scaling``
    for the full-attention layers; unscaled RoPE with base ``rope_local_base_freq``
    (Gemma 3) or 500000 (OLMo 3; another ``rope_theta`` is refused, since transformers
    would still use 500000 there) for the sliding ones. One block for all layers
    (Gemma 2, Cohere 2, gpt-oss) takes any ``layer_type`` the config's ``layer_types``
    lists. A multimodal config (a ``text_config`` holding the rope keys) is read from
    its ``text_config``.

    Other model classes' readings: HunYuan's ``dynamic`` block with a nonzero ``alpha``
    is NTK-aware scaling with factor ``alpha``, fixed (``scaling="ntk"``; the block's
    unread ``beta_fast``, ``beta_slow``, ``mscale``, ``mscale_all_dim`` are accepted,
    a ``factor`` other than 1 is refused); ``llama_4_scaling_beta`` (Ministral 3) is
    the attention's query temperature, not a frequency, and is left to the attention
    (:func:`hf_query_temperature`); ``llama3`` with ``low_freq_factor ==
    high_freq_factor`` (Llama 4 Scout) is a step with no middle band.

    Args:
        config: the model's ``config.json`` as a dict (``json.load``), or a
            transformers config object (read through its ``to_dict()``).
        head_dim: the per-head width, for configs that spell it in their own way
            (GPT-J's ``n_embd / n_head``); it must agree with the config's if both give one.
        layer_type: which layer type's block to read (``"full_attention"``,
            ``"sliding_attention"``, ...), for the configs above; a layer type with a
            head width of its own (transformers' ``per_layer_config``, Gemma 4's
            ``global_head_dim`` on its full-attention layers) is read with it.

    Raises:
        TypeError: ``config`` is neither a dict nor a transformers config, or a value
            has the wrong type.
        ValueError: a key no rope type takes (the message suggests a close spelling), a
            required key missing, an unknown ``rope_type``, a value given twice with
            different values, no ``rope_theta``, or a value :func:`rope_frequencies`
            rejects; each message names the key.
    """
    config = _hf_config_dict(config)
    no_block = config.get("rope_parameters") is None and config.get("rope_scaling") is None
    if no_block and ("rope_type" in config or "type" in config):
        raise ValueError(
            "config looks like a rope block alone: pass the whole config.json, or "
            "{'rope_parameters': block, 'head_dim': ..., 'max_position_embeddings': ...}"
        )
    where, block, per_layer_type = _hf_block(config, layer_type)
    rope_type = _hf_rope_type(block, where, config.get("model_type"))

    # a block per layer type has its own base; the top level's is another layer type's
    top_level = (
        ()
        if per_layer_type
        else (
            ("rope_theta", config.get("rope_theta")),
            ("rotary_emb_base", config.get("rotary_emb_base")),
        )
    )
    theta = _agreed("rope_theta", (f"{where}['rope_theta']", block.get("rope_theta")), *top_level)
    _agreed(
        "max_position_embeddings",
        (f"{where}['max_position_embeddings']", block.get("max_position_embeddings")),
        ("max_position_embeddings", config.get("max_position_embeddings")),
    )
    if theta is None:
        raise ValueError(
            "rope_theta: the config gives none (transformers then uses its model class's "
            "default_theta, which is not 10000 for every class); add it to the config"
        )
    base = check_rope_base("rope_theta", theta)
    head_dim = _hf_head_dim(config, head_dim, layer_type)
    fraction = _agreed(
        "partial_rotary_factor",
        (f"{where}['partial_rotary_factor']", block.get("partial_rotary_factor")),
        ("partial_rotary_factor", config.get("partial_rotary_factor")),
        ("rotary_pct", config.get("rotary_pct")),
    )
    fraction = 1.0 if fraction is None else _number("partial_rotary_factor", fraction)
    if fraction != 1.0 and config.get("model_type") in _HF_FULL_ROTARY_MODELS:
        raise ValueError(
            f"partial_rotary_factor={fraction} in a {config['model_type']!r} config: that "
            "model's rotary embedding ignores it and rotates the whole head (remove the key)"
        )
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"partial_rotary_factor must be in (0, 1], got {fraction}")

    params: dict[str, Any] = {}
    rotary_dim = int(head_dim * fraction)
    if rope_type == "proportional":
        rotary_dim, params["partial_rotary_factor"] = head_dim, fraction
    elif rotary_dim < 2 or rotary_dim % 2:
        raise ValueError(
            f"partial_rotary_factor={fraction} with head_dim={head_dim} rotates "
            f"int({head_dim} * {fraction}) = {rotary_dim} features; RoPE needs a positive even "
            "number"
        )

    def original_length() -> int:
        value = _agreed(
            "original_max_position_embeddings",
            (
                f"{where}['original_max_position_embeddings']",
                block.get("original_max_position_embeddings"),
            ),
            ("original_max_position_embeddings", config.get("original_max_position_embeddings")),
        )
        if value is None:
            return _hf_max_positions(config, f"{rope_type} needs a trained length")
        return check_int("original_max_position_embeddings", value)

    if rope_type in ("linear", "llama3", "proportional") and block.get("factor") is not None:
        params["factor"] = block["factor"]
    if rope_type == "llama3":
        params["low_freq_factor"] = block["low_freq_factor"]
        params["high_freq_factor"] = block["high_freq_factor"]
        params["original_max_position_embeddings"] = original_length()
    elif rope_type == "dynamic" and block.get("alpha"):  # HunYuan: NTK with factor alpha
        if block.get("factor") not in (None, 1, 1.0):
            raise ValueError(
                f"{where} has alpha={block['alpha']!r} and factor={block['factor']!r}: HunYuan's "
                "rotary embedding uses alpha and ignores factor; set factor to 1"
            )
        rope_type, params["factor"] = "ntk", block["alpha"]
    elif rope_type == "dynamic":
        trained = _hf_max_positions(config, "dynamic reads the trained length from it")
        if block.get("original_max_position_embeddings") not in (None, trained):
            raise ValueError(
                f"{where}['original_max_position_embeddings']="
                f"{block['original_max_position_embeddings']!r} differs from "
                f"max_position_embeddings={trained}: transformers' dynamic rope type reads the "
                "trained length from max_position_embeddings and ignores the block's value"
            )
        params.update(factor=block["factor"], original_max_position_embeddings=trained)
    elif rope_type == "yarn":
        original = original_length()
        factor = block["factor"]
        params["factor"] = _hf_ratio(config, original, rope_type) if factor is None else factor
        params["original_max_position_embeddings"] = original
        for key in ("beta_fast", "beta_slow"):
            if block.get(key) not in (None, 0):  # transformers: `or` its default
                params[key] = block[key]
        mscales = {key: block.get(key) for key in ("mscale", "mscale_all_dim")}
        for key, value in mscales.items():
            if value is not None:
                _number(key, value)
        if block.get("attention_factor") is not None:
            params["attention_factor"] = block["attention_factor"]
        elif mscales["mscale"] and mscales["mscale_all_dim"]:  # else transformers ignores them
            params.update(mscales)
        if "truncate" in block:
            truncate = block["truncate"]
            if truncate is not None and not isinstance(truncate, bool):
                raise TypeError(f"truncate must be a bool, got {type(truncate).__name__}")
            params["truncate"] = bool(truncate)  # transformers tests its truth: null is false
    elif rope_type == "longrope":
        original = original_length()
        params.update(
            short_factor=block["short_factor"],
            long_factor=block["long_factor"],
            original_max_position_embeddings=original,
        )
        if block.get("attention_factor") is not None:
            params["attention_factor"] = block["attention_factor"]
        factor = block.get("factor")
        if factor is None and config.get("max_position_embeddings") is not None:
            factor = _hf_ratio(config, original, rope_type)
        if factor is not None:
            params["factor"] = factor

    checked = (
        {"seq_len": params["original_max_position_embeddings"]} if rope_type == "longrope" else {}
    )
    rope_frequencies(rope_type, rotary_dim, base, dtype=torch.float64, **params, **checked)
    arguments = {
        "head_dim": head_dim,
        "rotary_dim": rotary_dim,
        "base": base,
        "scaling": rope_type,
        "scaling_params": params,
    }
    if block.get("mrope_section") is not None:
        arguments.update(_hf_sections(block, where, config.get("model_type"), rotary_dim))
    return arguments


def _hf_sections(
    block: Mapping[str, Any], where: str, model_type: Any, rotary_dim: int
) -> dict[str, Any]:
    """``sections`` and ``section_layout`` of a block with ``mrope_section``."""
    if model_type not in _HF_MROPE_LAYOUTS:
        raise ValueError(
            f"{where}['mrope_section'] in a {model_type!r} config: pecode knows the section "
            f"layouts of the model types {list(_HF_MROPE_LAYOUTS)} (Qwen2-VL and Qwen2.5-VL "
            "chunked, Qwen3-VL and Qwen3.5 interleaved); another model's code may lay them "
            "out otherwise"
        )
    layout = _HF_MROPE_LAYOUTS[model_type]
    flag = block.get("mrope_interleaved")
    if flag is not None and bool(flag) != (layout == "interleaved"):
        raise ValueError(
            f"{where}['mrope_interleaved']={flag!r}, but {model_type!r}'s rotary embedding "
            f"lays the sections out {layout} whatever the flag says"
        )
    sections = block["mrope_section"]
    try:
        pairs = len(mrope_pair_axes(sections, layout))
    except (TypeError, ValueError) as error:
        raise type(error)(f"{where}['mrope_section']: {error}") from None
    if pairs != rotary_dim // 2:
        raise ValueError(
            f"{where}['mrope_section'] {list(sections)} adds up to {pairs} pairs, not the "
            f"{rotary_dim // 2} pairs of rotary_dim {rotary_dim}"
        )
    return {"sections": list(sections), "section_layout": layout}


def frequencies_from_hf_config(
    config: Mapping[str, Any],
    *,
    head_dim: int | None = None,
    seq_len: int | None = None,
    layer_type: str | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[Tensor, float]:
    """The frequencies and attention factor a Hugging Face ``config.json`` gives.

    What transformers 5.23's ``ROPE_INIT_FUNCTIONS[rope_type](config, device,
    seq_len=seq_len)`` returns for the same config (for ``default``, what the model's
    rotary embedding computes), in float64 rounded to ``dtype`` rather than in float32.
    :func:`hf_rope_arguments` says how the config is read.

    Shapes::

        returns: (inv_freq [rotary_dim // 2] in ``dtype``, attention_factor: float)

    Args:
        config: the model's ``config.json`` as a dict.
        head_dim: the per-head width, if the config does not give it in a key
            :func:`hf_rope_arguments` reads.
        seq_len: the current sequence length (the largest position + 1). Used by
            ``dynamic`` (past ``max_position_embeddings`` the base grows) and
            ``longrope`` (past ``original_max_position_embeddings`` the long factors
            apply); ``None`` gives what transformers builds at initialisation, the
            trained length. Other rope types do not depend on it.
        layer_type: for a ``rope_parameters`` block per layer type, which one to read.
        dtype: float32 (default) or float64.

    Raises:
        TypeError, ValueError: as :func:`hf_rope_arguments`; ``seq_len`` not a positive int.
    """
    arguments = hf_rope_arguments(config, head_dim=head_dim, layer_type=layer_type)
    kind, params = arguments["scaling"], dict(arguments["scaling_params"])
    if seq_len is not None:
        check_int("seq_len", seq_len)
    if kind == "dynamic" and seq_len is not None:
        params["seq_len"] = seq_len
    if kind == "longrope":
        params["seq_len"] = (
            params["original_max_position_embeddings"] if seq_len is None else seq_len
        )
    return rope_frequencies(kind, arguments["rotary_dim"], arguments["base"], dtype=dtype, **params)


# ------------------------------------------------------- length-dependent query temperature


def log_length_query_scale(
    positions: Tensor, beta: float, length: int, *, offset: int = 0
) -> Tensor:
    """The factor ``1 + β ln(1 + ⌊(p + offset) / length⌋)`` that multiplies each query.

    A query far into a long context sees many more keys, and its softmax flattens; this
    factor sharpens it again, one step per ``length`` positions (the log-length scaling
    of Scalable-Softmax, Nakanishi 2025, taken in steps). Llama 4 multiplies the queries
    of its NoPE layers by it with ``β = attn_scale = 0.1``, ``length = floor_scale =
    8192`` and ``offset = 1`` (``Llama4TextAttention`` in transformers); Ministral 3 and
    Mistral Large 3 multiply every query, after RoPE, with ``β = llama_4_scaling_beta``,
    ``length = original_max_position_embeddings`` and ``offset = 0``
    (``get_llama_4_attn_scale``). It is 1 for every position below ``length - offset``.

    Shapes::

        positions: [...] (integer)
        returns:   [...] float64 on positions' device

    Raises:
        TypeError: ``positions`` is not an integer tensor, or ``beta`` not a number.
        ValueError: ``length`` not a positive int, ``offset`` negative, or a negative
            position.
    """
    if not isinstance(positions, Tensor) or positions.is_floating_point() or positions.is_complex():
        what = positions.dtype if isinstance(positions, Tensor) else type(positions).__name__
        raise TypeError(f"positions must be an integer torch.Tensor, got {what}")
    beta = _number("beta", beta)
    check_int("length", length)
    check_int("offset", offset, minimum=0)
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError(f"positions must be non-negative, got {int(positions.min())}")
    steps = torch.div(positions.to(torch.int64) + offset, length, rounding_mode="floor")
    return 1.0 + beta * torch.log1p(steps.to(torch.float64))


def logn_query_scale(positions: Tensor, length: int) -> Tensor:
    """Qwen's ``logn`` attention: each query times ``max(1, ln(p + 1) / ln(length))``.

    Queries at positions ``p + 1 <= length`` are unchanged; past the trained length
    ``length`` a query is sharpened by the log of its context in units of that length
    (Qwen-7B's ``use_logn_attn``: ``math.log(i, seq_length)`` for ``i > seq_length``, at
    1-based ``i = p + 1``): a softmax over ``n`` keys flattens as ``n`` grows, and a
    factor ``log n`` on the logits keeps its entropy from growing with it.

    Shapes::

        positions: [...] (integer)
        returns:   [...] float64 on positions' device

    Raises:
        TypeError: ``positions`` is not an integer tensor.
        ValueError: ``length`` is not an int of at least 2, or a negative position.
    """
    if not isinstance(positions, Tensor) or positions.is_floating_point() or positions.is_complex():
        what = positions.dtype if isinstance(positions, Tensor) else type(positions).__name__
        raise TypeError(f"positions must be an integer torch.Tensor, got {what}")
    check_int("length", length, 2)
    if positions.numel() and int(positions.min()) < 0:
        raise ValueError(f"positions must be non-negative, got {int(positions.min())}")
    count = positions.to(torch.float64) + 1
    return torch.clamp(torch.log(count) / math.log(length), min=1.0)


def hf_query_temperature(config: Mapping[str, Any] | object) -> dict[str, Any] | None:
    """The log-length query temperature a Hugging Face config asks for, or None.

    Returns :func:`log_length_query_scale`'s arguments ``{"beta", "length", "offset"}``,
    what it counts (``"by"``) and which layers it is for (``"layers"``): Llama 4
    (``attn_temperature_tuning``) counts each query's index in the sequence
    (``"index"``: ``arange(L)`` plus the cache's length, padding included) on the
    layers without RoPE only (``"nope"``); Ministral 3 / Mistral Large 3 (a
    ``llama_4_scaling_beta`` in the rope block) count the position (``"position"``)
    on every layer (``"all"``). None when the config has neither. The dict is
    :class:`~pecode.attention.MultiHeadAttention`'s ``query_temperature``.

    Raises:
        TypeError, ValueError: as :func:`hf_rope_arguments` for the config; a value of
            the wrong type or range, naming the key.
    """
    config = _hf_config_dict(config)
    if config.get("attn_temperature_tuning"):
        for key in ("attn_scale", "floor_scale"):
            if config.get(key) is None:
                raise ValueError(f"{key}: attn_temperature_tuning is on but the config has none")
        return {
            "beta": _number("attn_scale", config["attn_scale"]),
            "length": check_int("floor_scale", config["floor_scale"]),
            "offset": 1,
            "by": "index",  # arange(L) + the cache's length, not position_ids
            "layers": "nope",
        }
    block = config.get("rope_parameters") or config.get("rope_scaling") or {}
    if not isinstance(block, Mapping) or block.get("llama_4_scaling_beta") is None:
        return None
    original = block.get("original_max_position_embeddings")
    if original is None:
        raise ValueError(
            "original_max_position_embeddings: the rope block has llama_4_scaling_beta but no "
            "original_max_position_embeddings, the length its temperature counts in"
        )
    return {
        "beta": _number("llama_4_scaling_beta", block["llama_4_scaling_beta"]),
        "length": check_int("original_max_position_embeddings", original),
        "offset": 0,
        "by": "position",
        "layers": "all",
    }
