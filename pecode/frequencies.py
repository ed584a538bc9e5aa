"""RoPE's rotation frequencies, in a module of their own.

:func:`rope_inv_freq` is the one formula that :mod:`pecode.rope` (the rotation and its
tables) and :mod:`pecode.scaling` (the long-context rules, which change the
frequencies) both start from. It lives here, importing neither of them, so that the two
modules depend on it and not on each other. ``pecode.rope.rope_inv_freq`` is the same
function, re-exported. Its argument checks, :func:`check_rope_base` and
:func:`check_rope_dim`, serve the two modules' own arguments too, so that a bad base or
width is reported alike everywhere, under the caller's name (``rope_theta``, ``head_dim``).
"""

from __future__ import annotations

import math
from numbers import Real

import torch
from torch import Tensor

__all__ = ["check_rope_base", "check_rope_dim", "rope_inv_freq"]


def check_rope_base(name: str, base: object) -> float:
    """Return ``base`` as a float if it is a finite real number greater than 1.

    ``θ_i = base^(-2i/d)`` is defined for every ``base > 0``, but only ``base > 1`` gives
    RoPE's frequencies: one that starts at 1 and decreases geometrically, so that the
    pairs span wavelengths from ``2π`` tokens up to ``2π base^((d-2)/d)``. ``base = 1``
    gives every pair the same frequency, ``0 < base < 1`` frequencies that increase, and
    ``base = inf`` frequencies of 0 after the first pair (the tables would silently hold
    ``cos = 1, sin = 0``). Published bases (``rope_theta`` in Hugging Face configs) run
    from 10000 to about 1e8.

    Args:
        name: the argument's name in the caller (``"base"``, ``"rope_theta"``), used in
            the error messages.
        base: the value to check.

    Raises:
        TypeError: ``base`` is not a real number (a ``str`` or a ``bool`` included).
        ValueError: ``base`` is NaN, infinite, or not greater than 1.
    """
    if isinstance(base, bool) or not isinstance(base, Real):
        raise TypeError(f"{name} must be a real number, got {type(base).__name__}")
    base = float(base)
    if not math.isfinite(base):
        raise ValueError(f"{name} must be finite, got {base}")
    if not base > 1.0:
        raise ValueError(f"{name} must be greater than 1, got {base}")
    return base


def check_rope_dim(name: str, dim: object) -> int:
    """Return ``dim`` if it is a positive even int: RoPE rotates features in pairs.

    Args:
        name: the argument's name in the caller (``"dim"``, ``"head_dim"``,
            ``"rotary_dim"``), used in the error messages.
        dim: the value to check.

    Raises:
        TypeError: ``dim`` is not an int (a ``bool`` included).
        ValueError: ``dim`` is not positive and even.
    """
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{name} must be an int, got {type(dim).__name__}")
    if dim <= 0 or dim % 2 != 0:
        raise ValueError(f"{name} must be a positive even number (RoPE rotates pairs), got {dim}")
    return dim


def rope_inv_freq(dim: int, base: float = 10000.0, *, dtype: torch.dtype = torch.float32) -> Tensor:
    """The rotation frequencies ``θ_i = base^(-2i/dim)`` for ``i = 0 .. dim/2 - 1``.

    RoFormer §3.2.2: ``Θ = {θ_i = 10000^(-2(i-1)/d), i = 1..d/2}`` (1-based there).
    Computed in float64 and then rounded to ``dtype``.

    Shapes::

        returns: [dim // 2], ``dtype`` (float32 by default)

    Args:
        dim: the number of rotated features (even).
        base: the base of the geometric progression (10000 in RoFormer); a finite real
            number greater than 1 (:func:`~pecode.frequencies.check_rope_base` says why).
        dtype: float32 (the contract's default) or float64.

    Raises:
        TypeError: ``dim`` is not an int, ``base`` is not a real number, or ``dtype`` is
            not float32/float64.
        ValueError: ``dim`` is not positive and even, or ``base`` is not finite and
            greater than 1.
    """
    check_rope_dim("dim", dim)
    base = check_rope_base("base", base)
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    return (base**-exponents).to(dtype)
