"""Reference for RoPE: the rotation one feature pair at a time, and explicit matrices."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["rope_inv_freq_loop", "rope_loop", "rope_matrix_loop"]


def rope_inv_freq_loop(dim: int, base: float = 10000.0) -> list[float]:
    """``θ_i = base^(-2(i-1)/d)`` for ``i = 1 .. d/2`` (RoFormer eq. 15), as Python floats.

    Raises:
        ValueError: ``dim`` is not positive and even.
    """
    if dim <= 0 or dim % 2:
        raise ValueError(f"dim must be positive and even, got {dim}")
    return [math.pow(base, -2 * (i - 1) / dim) for i in range(1, dim // 2 + 1)]


def rope_matrix_loop(position: float, dim: int, base: float = 10000.0) -> Tensor:
    """The block-diagonal rotation matrix ``R^d_{Θ,m}`` of RoFormer eq. (15), in float64.

    Block ``i`` (rows and columns ``2i, 2i+1``) is the 2-D rotation by ``m θ_i``;
    this is the interleaved layout, exactly as the paper writes it.

    Shapes::

        returns: [dim, dim](float64)

    Raises:
        ValueError: ``dim`` is not positive and even.
    """
    thetas = rope_inv_freq_loop(dim, base)
    matrix = torch.zeros(dim, dim, dtype=torch.float64)
    for i, theta in enumerate(thetas):
        angle = position * theta
        c, s = math.cos(angle), math.sin(angle)
        matrix[2 * i, 2 * i] = c
        matrix[2 * i, 2 * i + 1] = -s
        matrix[2 * i + 1, 2 * i] = s
        matrix[2 * i + 1, 2 * i + 1] = c
    return matrix


def rope_loop(
    x: Tensor, positions: Tensor, base: float = 10000.0, layout: str = "interleaved"
) -> Tensor:
    """Rotate every feature pair of every token, one scalar at a time, in float64.

    Pair ``i`` is ``(2i, 2i+1)`` for ``layout="interleaved"`` and ``(i, i + d/2)``
    for ``layout="half"``; the pair ``(a, b)`` at position ``m`` becomes
    ``(a cos mθ_i - b sin mθ_i, a sin mθ_i + b cos mθ_i)``.

    Shapes::

        x:         [..., L, dim]
        positions: [L]
        returns:   [..., L, dim] (float64, on the CPU)

    Raises:
        ValueError: ``dim`` is odd, ``positions`` does not have length ``L``, or
            ``layout`` is unknown.
    """
    if layout not in ("half", "interleaved"):
        raise ValueError(f"layout must be 'half' or 'interleaved', got {layout!r}")
    length, dim = x.shape[-2], x.shape[-1]
    if tuple(positions.shape) != (length,):
        raise ValueError(f"positions must have shape [{length}], got {tuple(positions.shape)}")
    thetas = rope_inv_freq_loop(dim, base)
    half = dim // 2
    flat = x.detach().double().cpu().reshape(-1, length, dim)
    out = torch.empty_like(flat)
    for row in range(flat.shape[0]):
        for t in range(length):
            m = float(positions[t])
            for i, theta in enumerate(thetas):
                first, second = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + half)
                a, b = float(flat[row, t, first]), float(flat[row, t, second])
                c, s = math.cos(m * theta), math.sin(m * theta)
                out[row, t, first] = a * c - b * s
                out[row, t, second] = a * s + b * c
    return out.reshape(x.shape)
