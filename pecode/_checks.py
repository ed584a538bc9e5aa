"""Argument checks shared by the pecode modules, so every module words its errors alike."""

from __future__ import annotations

import math
from numbers import Real

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


def check_bool(name: str, value: object) -> bool:
    """Return ``value`` if it is a bool (a truthy string such as ``"no"`` is refused).

    Raises:
        TypeError: ``value`` is not a bool.
    """
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be a bool, got {type(value).__name__}")
    return value


def check_real(name: str, value: object, *, above: float | None = None) -> float:
    """Return ``value`` as a float if it is a finite real number greater than ``above``.

    Raises:
        TypeError: ``value`` is not a real number (a ``str`` or a ``bool`` included).
        ValueError: ``value`` is NaN or infinite, or not greater than ``above``.
    """
    if isinstance(value, bool) or not isinstance(value, Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if above is not None and not value > above:
        wanted = "positive" if above == 0 else f"greater than {above:g}"
        raise ValueError(f"{name} must be {wanted}, got {value:g}")
    return value


def check_tensor(name: str, value: object) -> Tensor:
    """Return ``value`` if it is a tensor (of any dtype and shape).

    Raises:
        TypeError: ``value`` is not a tensor.
    """
    if not isinstance(value, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    return value


def check_floating_tensor(name: str, value: object, shape: tuple[int, ...] | None = None) -> Tensor:
    """Return ``value`` if it is a floating tensor, of exactly ``shape`` when one is given.

    Raises:
        TypeError: ``value`` is not a tensor, or not floating.
        ValueError: ``value`` does not have ``shape``.
    """
    check_tensor(name, value)
    if not value.is_floating_point():
        raise TypeError(f"{name} must be a floating tensor, got {value.dtype}")
    if shape is not None and tuple(value.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {list(shape)}, got {tuple(value.shape)}")
    return value


def check_heads(
    name: str,
    value: object,
    *,
    num_heads: int | None = None,
    head_dim: int | None = None,
    built_by: str | None = None,
    layout: str = "[B, H, L, Dh]",
) -> Tensor:
    """Return ``value`` if it is a floating per-head tensor ``[B, H, L, last]``.

    ``num_heads`` and ``head_dim``, where given, are the sizes ``H`` and ``last`` must
    have; ``built_by`` names what asks for them (a position scheme), so that the error
    says where the expected size comes from.

    Raises:
        TypeError: ``value`` is not a floating tensor.
        ValueError: ``value`` is not 4-D, or its heads or last dimension differ.
    """
    check_floating_tensor(name, value)
    if value.dim() != 4:
        raise ValueError(f"{name} must have shape {layout}, got {tuple(value.shape)}")
    source = f"{built_by} was built for" if built_by else "expected"
    if num_heads is not None and value.shape[1] != num_heads:
        raise ValueError(f"{name} has {value.shape[1]} heads, {source} num_heads={num_heads}")
    if head_dim is not None and value.shape[-1] != head_dim:
        raise ValueError(
            f"{name} has head dimension {value.shape[-1]}, {source} head_dim={head_dim}"
        )
    return value


def check_query_key(q: object, k: object) -> None:
    """Check ``q`` and ``k`` as :func:`check_heads` does, and that they fit each other.

    Shapes::

        q: [B, H, Lq, Dh]    k: [B, H, Lk, Dh]

    Raises:
        TypeError: either is not a floating tensor.
        ValueError: either is not 4-D, or they differ in batch, heads or head dimension.
    """
    check_heads("q", q)
    check_heads("k", k)
    if (k.shape[0], k.shape[1], k.shape[3]) != (q.shape[0], q.shape[1], q.shape[3]):
        raise ValueError(
            f"q and k must agree in batch, heads and head dimension ([B, H, L, Dh]), "
            f"got q {tuple(q.shape)} and k {tuple(k.shape)}"
        )
