"""Reference for 2-D RoPE on a grid: every pair turned by a linear function of (row, column)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["axial_frequencies_loop", "grid_rope_loop"]


def axial_frequencies_loop(head_dim: int, base: float = 10000.0) -> list[tuple[float, float]]:
    """RoPE-Axial's ``(θ_row, θ_col)`` of each of the ``head_dim / 2`` pairs, as floats.

    Pair ``j < head_dim / 4`` reads the row with ``base^(-4j / head_dim)``, pair
    ``head_dim / 4 + i`` the column with ``base^(-4i / head_dim)`` (Qwen2-VL's vision
    tower: 1-D RoPE's ladder for ``head_dim / 2`` features, once per axis).

    Raises:
        ValueError: ``head_dim`` is not a positive multiple of 4.
    """
    if head_dim <= 0 or head_dim % 4:
        raise ValueError(f"head_dim must be a positive multiple of 4, got {head_dim}")
    quarter = head_dim // 4
    ladder = [math.pow(base, -4 * i / head_dim) for i in range(quarter)]
    return [(theta, 0.0) for theta in ladder] + [(0.0, theta) for theta in ladder]


def grid_rope_loop(
    x: Tensor,
    positions: Tensor,
    frequencies: Sequence[Sequence[Sequence[float]]] | Tensor,
    layout: str = "half",
) -> Tensor:
    """Turn pair ``j`` of head ``h`` at ``(row, col)`` by
    ``frequencies[h][j][0] · row + frequencies[h][j][1] · col``, one scalar at a time.

    The pair ``(a, b)`` becomes ``(a cos φ - b sin φ, a sin φ + b cos φ)``; it is
    ``(j, j + dim/2)`` for ``layout="half"`` and ``(2j, 2j + 1)`` for
    ``"interleaved"``. RoPE-Axial is :func:`axial_frequencies_loop` for every head.

    Shapes::

        x:           [..., H, L, dim]
        positions:   [L, 2] (row, column)
        frequencies: [H][dim / 2][2] numbers (row, column)
        returns:     [..., H, L, dim] (float64, on the CPU)

    Raises:
        ValueError: the shapes do not fit, or ``layout`` is unknown.
    """
    if layout not in ("half", "interleaved"):
        raise ValueError(f"layout must be 'half' or 'interleaved', got {layout!r}")
    heads, length, dim = x.shape[-3:]
    if tuple(positions.shape) != (length, 2):
        raise ValueError(f"positions must have shape [{length}, 2], got {tuple(positions.shape)}")
    table = [[(float(f[0]), float(f[1])) for f in head] for head in frequencies]
    if len(table) != heads or any(len(head) != dim // 2 for head in table) or dim % 2:
        raise ValueError(f"frequencies must be [{heads}][{dim // 2}][2] for x of shape {x.shape}")
    flat = x.detach().double().cpu().reshape(-1, heads, length, dim)
    out = torch.empty_like(flat)
    for row in range(flat.shape[0]):
        for h in range(heads):
            for t in range(length):
                r, c = float(positions[t, 0]), float(positions[t, 1])
                for j, (theta_row, theta_col) in enumerate(table[h]):
                    angle = theta_row * r + theta_col * c
                    first, second = (j, j + dim // 2) if layout == "half" else (2 * j, 2 * j + 1)
                    a, b = float(flat[row, h, t, first]), float(flat[row, h, t, second])
                    out[row, h, t, first] = a * math.cos(angle) - b * math.sin(angle)
                    out[row, h, t, second] = a * math.sin(angle) + b * math.cos(angle)
    return out.reshape(x.shape)
