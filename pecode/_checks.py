"""Argument checks shared by the pecode modules, so every module words its errors alike."""

from __future__ import annotations

import torch
from torch import Tensor


def check_int(name: str, value: object, minimum: int = 1) -> int:
    """Return ``value`` if it is an int (not a bool) of at least ``minimum``.

    Raises:
        TypeError: ``value`` is not an int.
        ValueError: ``value`` is below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if value < minimum:
        wanted = {0: "non-negative", 1: "positive"}.get(minimum, f"at least {minimum}")
        raise ValueError(f"{name} must be {wanted}, got {value}")
    return value


def check_integer_tensor(name: str, value: object) -> Tensor:
    """Return ``value`` if it is a tensor of an integer dtype (not bool), of any shape.

    Raises:
        TypeError: ``value`` is not a tensor, or its dtype is floating, complex or bool.
    """
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if value.is_floating_point() or value.is_complex() or value.dtype == torch.bool:
        raise TypeError(f"{name} must be an integer tensor, got {value.dtype}")
    return value


def check_positions(name: str, positions: object) -> Tensor:
    """Return ``positions`` if it is an integer tensor of shape ``[L]`` or ``[B, L]``.

    Raises:
        TypeError: ``positions`` is not an integer tensor.
        ValueError: ``positions`` is not 1-D or 2-D.
    """
    check_integer_tensor(name, positions)
    if positions.dim() not in (1, 2):
        raise ValueError(f"{name} must have shape [L] or [B, L], got {tuple(positions.shape)}")
    return positions


def check_position_pair(q_positions: object, k_positions: object) -> None:
    """Check query and key positions as :func:`check_positions` does, and their batches.

    Raises:
        TypeError: either is not an integer tensor.
        ValueError: either is not 1-D or 2-D, or both are batched with different sizes.
    """
    check_positions("q_positions", q_positions)
    check_positions("k_positions", k_positions)
    batched = q_positions.dim() == 2 and k_positions.dim() == 2
    if batched and q_positions.shape[0] != k_positions.shape[0]:
        raise ValueError(
            f"q_positions and k_positions have different batch sizes: "
            f"{q_positions.shape[0]} and {k_positions.shape[0]}"
        )
