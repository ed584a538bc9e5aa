"""Float64 loop references for the long-context RoPE rules of :mod:`pecode.scaling`.

Each function is written from the paper's or the model card's definition, one pair
at a time with ``math``, and shares no code with :mod:`pecode.scaling`. The YaRN
boundaries are found by scanning the pairs' turn counts ``r_i``, not by the closed
form that :func:`pecode.scaling.yarn_correction_range` uses.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = [
    "default_inv_freq_loop",
    "dynamic_inv_freq_loop",
    "dynamic_ntk_paper_inv_freq_loop",
    "llama3_inv_freq_loop",
    "ntk_inv_freq_loop",
    "pi_angles_loop",
    "yarn_boundaries_scan",
    "yarn_inv_freq_code_loop",
    "yarn_inv_freq_paper_loop",
]


def _tensor(values: list[float]) -> Tensor:
    return torch.tensor(values, dtype=torch.float64)


def default_inv_freq_loop(dim: int, base: float) -> Tensor:
    """``θ_i = base^(-2i/dim)``, one ``math.pow`` per pair (RoFormer). Returns ``[dim // 2]``."""
    return _tensor([math.pow(base, -2.0 * i / dim) for i in range(dim // 2)])


def pi_angles_loop(positions: list[float], dim: int, base: float, factor: float) -> Tensor:
    """Position interpolation as Chen et al. (2023) state it: rotate position ``m`` by
    the default angles of position ``m / s``. Returns ``[len(positions), dim // 2]``."""
    return _tensor(
        [
            [(m / factor) * math.pow(base, -2.0 * i / dim) for i in range(dim // 2)]
            for m in positions
        ]
    )


def ntk_inv_freq_loop(dim: int, base: float, factor: float) -> Tensor:
    """NTK-aware frequencies with base ``b s^(d/(d-2))`` (bloc97; Peng et al. 2023)."""
    new_base = base * math.pow(factor, dim / (dim - 2))
    return default_inv_freq_loop(dim, new_base)


def dynamic_inv_freq_loop(
    dim: int, base: float, factor: float, original: int, seq_len: int
) -> Tensor:
    """Dynamic NTK: the NTK base with ``s' = s L / L0 - (s - 1)`` when ``L > L0``, else
    the trained base (emozilla's 2023 post; Hugging Face transformers' ``dynamic`` rope
    type)."""
    if seq_len <= original:
        return default_inv_freq_loop(dim, base)
    grown = factor * seq_len / original - (factor - 1.0)
    return default_inv_freq_loop(dim, base * math.pow(grown, dim / (dim - 2)))


def dynamic_ntk_paper_inv_freq_loop(dim: int, base: float, original: int, seq_len: int) -> Tensor:
    """Dynamic NTK as the YaRN paper states it (Peng et al. 2023, §3.3): at every forward
    pass the NTK-aware rule with the scale ``s = max(1, l'/L)``, ``l'`` the current length
    and ``L`` the trained one. Returns ``[dim // 2]``."""
    scale = max(1.0, seq_len / original)
    return ntk_inv_freq_loop(dim, base, scale)


def _turns(dim: int, base: float, original: int) -> list[float]:
    """``r_i = L0 / λ_i``: how many full turns pair ``i`` makes over the trained context."""
    return [original / (2 * math.pi * math.pow(base, 2.0 * i / dim)) for i in range(dim // 2)]


def yarn_boundaries_scan(
    dim: int, base: float, original: int, beta_fast: float = 32.0, beta_slow: float = 1.0
) -> tuple[int, int]:
    """YaRN's ramp ends found by scanning: ``low`` is the last pair that still turns at
    least ``beta_fast`` times over the trained context, ``high`` the first pair that
    turns at most ``beta_slow`` times."""
    turns = _turns(dim, base, original)
    low = max((i for i, r in enumerate(turns) if r >= beta_fast), default=0)
    high = min((i for i, r in enumerate(turns) if r <= beta_slow), default=dim - 1)
    return low, high


def yarn_inv_freq_paper_loop(
    dim: int, base: float, factor: float, original: int, alpha: float = 1.0, beta: float = 32.0
) -> Tensor:
    """YaRN's "NTK-by-parts" frequencies as the paper defines them:
    ``h(θ_i) = (1 - γ(r_i)) θ_i / s + γ(r_i) θ_i`` with ``γ(r) = 0`` for ``r < α``,
    ``1`` for ``r > β`` and ``(r - α)/(β - α)`` in between (Peng et al. 2023)."""
    out = []
    for theta, r in zip(
        default_inv_freq_loop(dim, base).tolist(), _turns(dim, base, original), strict=True
    ):
        if r < alpha:
            gamma = 0.0
        elif r > beta:
            gamma = 1.0
        else:
            gamma = (r - alpha) / (beta - alpha)
        out.append((1.0 - gamma) * theta / factor + gamma * theta)
    return _tensor(out)


def yarn_inv_freq_code_loop(
    dim: int,
    base: float,
    factor: float,
    original: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
) -> Tensor:
    """YaRN's frequencies as the authors' released code computes them: a ramp that is
    linear in the pair index between the scanned boundaries."""
    low, high = yarn_boundaries_scan(dim, base, original, beta_fast, beta_slow)
    out = []
    for i, theta in enumerate(default_inv_freq_loop(dim, base).tolist()):
        if i <= low:
            weight = 0.0  # keep θ_i
        elif i >= high:
            weight = 1.0  # θ_i / s
        else:
            weight = (i - low) / (high - low)
        out.append((1.0 - weight) * theta + weight * theta / factor)
    return _tensor(out)


def llama3_inv_freq_loop(
    dim: int,
    base: float,
    factor: float,
    low_freq_factor: float,
    high_freq_factor: float,
    original: int,
) -> Tensor:
    """The Llama 3.1 rule, one band test per pair: wavelength below
    ``L0 / high_freq_factor`` keeps ``θ_i``; above ``L0 / low_freq_factor`` gives
    ``θ_i / s``; in between, ``(1 - w) θ_i / s + w θ_i`` with
    ``w = (L0 / λ_i - low_freq_factor) / (high_freq_factor - low_freq_factor)``."""
    out = []
    for theta in default_inv_freq_loop(dim, base).tolist():
        wavelength = 2 * math.pi / theta
        if wavelength < original / high_freq_factor:
            out.append(theta)
        elif wavelength > original / low_freq_factor:
            out.append(theta / factor)
        else:
            w = (original / wavelength - low_freq_factor) / (high_freq_factor - low_freq_factor)
            out.append((1 - w) * theta / factor + w * theta)
    return _tensor(out)
