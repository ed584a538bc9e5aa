"""Long-context RoPE: one registry of frequency rules for reading past the trained length.

A model trained with RoPE on sequences of length ``L0`` has seen every rotation angle
``m θ_i`` with ``0 <= m < L0``. Pairs whose wavelength ``2π/θ_i`` exceeds ``L0`` never
completed a turn in training, so at positions past ``L0`` they rotate to angles the
model never saw. Every method here changes the frequencies (and some the logit scale)
so that a longer context maps back into, or close to, the trained range:

* ``"default"``: ``θ_i = base^(-2i/d)`` (RoFormer), via ``pecode.rope.rope_inv_freq``;
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
* ``"base_change"``: a new base ``rope_theta`` (LLaMA 2 Long: 500000; Code Llama: 1e6);
  the same frequencies as ``"default"`` with ``base=rope_theta``.

:func:`rope_frequencies` returns ``(inv_freq, attention_factor)``: the frequencies and a
factor that multiplies both ``cos`` and ``sin`` tables, so that every attention logit
``q·k`` is multiplied by ``attention_factor ** 2`` (Peng et al. 2023, "length scaling").

Hugging Face transformers. The kinds ``linear``, ``dynamic``, ``yarn`` and ``llama3`` are
also rope types of transformers, and their parameters are spelled as in its
``rope_scaling`` entries; ``ntk`` and ``base_change`` are not (in transformers a base
change is the config's ``rope_theta`` with the default rule), and pecode has no
``longrope`` or ``proportional``. Where pecode departs from transformers 5.23 (read in its
``modeling_rope_utils.py``; ``tests/test_scaling.py`` checks each point):

* every kind: pecode takes the current length, the head dimension and the base as
  arguments, not from a config; it computes in float64, transformers in float32; it
  raises on ``factor < 1``, where transformers logs a warning;
* ``linear``: no other difference;
* ``dynamic``: transformers takes ``L0`` from the config's top-level
  ``max_position_embeddings`` (an ``original_max_position_embeddings`` in the block is
  ignored); pecode requires ``original_max_position_embeddings``: pass the config's
  ``max_position_embeddings`` there;
* ``yarn``: transformers fills a missing ``original_max_position_embeddings`` from
  ``max_position_embeddings``, and replaces a ``factor`` of ``None`` by their ratio;
  pecode requires both. Given ``mscale`` without ``mscale_all_dim``, transformers
  ignores ``mscale`` and uses ``0.1 ln s + 1``, while DeepSeek-V2's released code (whose
  configs brought the two keys; its defaults are ``mscale=1``, ``mscale_all_dim=0``)
  gives ``0.1 · mscale · ln s + 1``; pecode raises rather than choose, and an explicit
  ``attention_factor`` settles it. transformers' ``truncate`` (``False`` in gpt-oss's
  config: the ramp's ends are not rounded to whole pairs) is not implemented: pecode
  always rounds them and rejects ``truncate``. A ``beta_fast`` or ``beta_slow`` of 0
  means the default in transformers; pecode requires ``beta_fast > beta_slow > 0``;
* ``llama3``: transformers fills a missing ``original_max_position_embeddings`` from
  ``max_position_embeddings``; pecode requires it. The rule is the same.

One YaRN block has not always meant one thing in transformers either. pecode uses
``factor`` as given and runs the ramp from ``original_max_position_embeddings``, as
transformers does from release 4.56.0 (August 2025). Releases 4.43 to 4.50 (July 2024 to
March 2025) ignored ``original_max_position_embeddings`` and ran the ramp from the
top-level ``max_position_embeddings``; releases 4.51.0 to 4.55.x (April to August 2025)
replaced ``factor`` by ``max_position_embeddings / original_max_position_embeddings``
whenever the latter was set (transformers issue #38224, fixed by PR #40320).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from pecode._checks import check_int
from pecode.rope import rope_inv_freq

__all__ = [
    "PUBLISHED_CONFIGS",
    "SCALING_KINDS",
    "ScalingKind",
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
    unless ``mscale = 1``. Pass ``attention_factor`` to :func:`rope_frequencies` instead.

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
    dim: int, base: float, original_max_position_embeddings: int, beta_fast: float, beta_slow: float
) -> tuple[int, int]:
    """The pair indices ``(low, high)`` between which YaRN's ramp runs.

    Pair ``i`` turns ``r_i = L0 / λ_i = L0 θ_i / (2π)`` times over the trained context
    (Peng et al. 2023). Solving ``r_i = β`` for ``i`` gives
    ``i(β) = d ln(L0 / (2π β)) / (2 ln b)``; ``low = floor(i(beta_fast))`` and
    ``high = ceil(i(beta_slow))``, clipped to ``[0, d - 1]`` as in the authors' code.
    Pairs ``i <= low`` keep their frequency; pairs ``i >= high`` are divided by ``s``.

    Raises:
        ValueError: a parameter is not positive, or ``beta_fast <= beta_slow``.
    """
    beta_fast, beta_slow = _number("beta_fast", beta_fast), _number("beta_slow", beta_slow)
    if not beta_fast > beta_slow > 0:
        raise ValueError(
            f"need beta_fast > beta_slow > 0, got beta_fast={beta_fast}, beta_slow={beta_slow}"
        )
    original = check_int("original_max_position_embeddings", original_max_position_embeddings)

    def pair_index(rotations: float) -> float:
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low = math.floor(pair_index(beta_fast))
    high = math.ceil(pair_index(beta_slow))
    return max(low, 0), min(high, dim - 1)


def _yarn(dim: int, base: float, params: dict[str, Any]) -> tuple[Tensor, float]:
    # Peng et al. 2023 ("NTK-by-parts" and the temperature); the ramp runs linearly over
    # the pair index between the correction range, as in the authors' released code
    # (the paper's γ ramps linearly in r; the two agree outside the ramp).
    factor = _factor(params)
    original = params["original_max_position_embeddings"]
    low, high = yarn_correction_range(
        dim, base, original, params.get("beta_fast", 32.0), params.get("beta_slow", 1.0)
    )
    if params.get("attention_factor") is not None:
        attention_factor = _number("attention_factor", params["attention_factor"])
        if attention_factor <= 0:
            raise ValueError(f"attention_factor must be positive, got {attention_factor}")
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
    if not high_freq_factor > low_freq_factor > 0:
        raise ValueError(
            "need high_freq_factor > low_freq_factor > 0, got "
            f"low_freq_factor={low_freq_factor}, high_freq_factor={high_freq_factor}"
        )
    original = check_int(
        "original_max_position_embeddings", params["original_max_position_embeddings"]
    )
    inv_freq = rope_inv_freq(dim, base, dtype=torch.float64)
    wavelength = 2 * math.pi / inv_freq
    smooth = (original / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
    middle = (1.0 - smooth) * inv_freq / factor + smooth * inv_freq
    result = torch.where(wavelength > original / low_freq_factor, inv_freq / factor, middle)
    return torch.where(wavelength < original / high_freq_factor, inv_freq, result), 1.0


def _base_change(dim: int, base: float, params: dict[str, Any]) -> tuple[Tensor, float]:
    # Xiong et al. 2023 ("adjusted base frequency", 10000 -> 500000) and
    # Rozière et al. 2023 (Code Llama, 10000 -> 1e6): the trained base is replaced.
    rope_theta = _number("rope_theta", params["rope_theta"])
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
        ("beta_fast", "beta_slow", "mscale", "mscale_all_dim", "attention_factor"),
        "Peng et al. 2023 (YaRN)",
    ),
    "llama3": ScalingKind(
        _llama3,
        ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
        reference="Meta's Llama 3.1 reference code (meta-llama/llama-models, apply_scaling)",
    ),
    "base_change": ScalingKind(
        _base_change,
        ("rope_theta",),
        reference="Xiong et al. 2023 (LLaMA 2 Long); Rozière et al. 2023 (Code Llama)",
    ),
}
"""Every kind by name, with its rule, its required and optional parameters and its reference."""


def rope_frequencies(
    kind: str, dim: int, base: float = 10000.0, *, dtype: torch.dtype = torch.float32, **params: Any
) -> tuple[Tensor, float]:
    """RoPE frequencies and attention factor for one long-context method.

    Every rule is computed in float64 and rounded to ``dtype`` at the end. The
    attention factor multiplies both the cos and the sin table, hence each rotated
    ``q`` and ``k``, hence every logit by its square.

    Parameters by kind (required; *optional*):

    * ``default``: none;
    * ``linear``, ``ntk``: ``factor``;
    * ``dynamic``: ``factor``, ``original_max_position_embeddings``; *seq_len* (the
      current length; default the original). Hugging Face's form; ``factor=1`` gives
      the YaRN paper's ``max(1, seq_len / original)``;
    * ``yarn``: ``factor``, ``original_max_position_embeddings``; *beta_fast* (32),
      *beta_slow* (1), *mscale*, *mscale_all_dim*, *attention_factor*. ``factor`` is
      used as given, never derived from a ``max_position_embeddings`` (which pecode does
      not take; see the module docstring for what transformers did);
    * ``llama3``: ``factor``, ``low_freq_factor``, ``high_freq_factor``,
      ``original_max_position_embeddings``;
    * ``base_change``: ``rope_theta`` (the new base).

    Shapes::

        returns: (inv_freq [dim // 2] in ``dtype``, attention_factor: float)

    Args:
        kind: one of :data:`SCALING_KINDS`.
        dim: the number of rotated features (even).
        base: the trained base ``b`` (10000 in RoFormer).
        dtype: float32 (default) or float64.
        **params: the kind's parameters, spelled as in Hugging Face ``rope_scaling``
            (the module docstring lists where transformers reads them differently).

    Raises:
        ValueError: unknown ``kind`` (the message lists the kinds), a missing or unknown
            parameter (the message lists what the kind accepts), or an invalid value
            (``factor < 1``, ``beta_fast <= beta_slow``, ``high_freq_factor <=
            low_freq_factor``, ``dim < 4`` for the NTK rules, ...).
        TypeError: a parameter has the wrong type, or ``dtype`` is not float32/float64.
    """
    if kind not in SCALING_KINDS:
        raise ValueError(f"unknown scaling kind {kind!r}; accepted kinds: {sorted(SCALING_KINDS)}")
    spec = SCALING_KINDS[kind]
    accepted = spec.required + spec.optional
    missing = [name for name in spec.required if params.get(name) is None]
    if missing:
        raise ValueError(f"scaling kind {kind!r} needs {list(spec.required)}; missing {missing}")
    unknown = sorted(set(params) - set(accepted))
    if unknown:
        raise ValueError(
            f"scaling kind {kind!r} does not take {unknown}; "
            f"it accepts {list(accepted) or 'no parameters'}"
        )
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
500000 as the base Xiong et al. showed effective up to 32,768 tokens (chapter 10 says what
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
