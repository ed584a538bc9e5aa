"""The exponential series in the complex plane (chapter 7): partial sums and their error bound.

Chapter 7 derives Euler's formula ``exp(iθ) = cos θ + i sin θ`` from the Taylor series
of the exponential. These two functions compute what its figures and checks need: the
partial sums ``S_N(θ) = Σ_{n=0}^{N} (iθ)^n / n!`` for every ``N`` up to an order, and
the bound ``|θ|^{N+1} / (N+1)!`` on their distance from ``exp(iθ)``.
"""

from __future__ import annotations

import torch

__all__ = ["exp_partial_sums", "exp_remainder_bound"]


def _check_args(theta: torch.Tensor, order: int) -> None:
    if not isinstance(theta, torch.Tensor):
        raise TypeError(f"theta must be a torch.Tensor, got {type(theta).__name__}")
    if not theta.is_floating_point():
        raise TypeError(f"theta must be a real floating-point tensor, got {theta.dtype}")
    if isinstance(order, bool) or not isinstance(order, int):
        raise TypeError(f"order must be an int, got {type(order).__name__}")
    if order < 0:
        raise ValueError(f"order must be non-negative, got {order}")


def exp_partial_sums(theta: torch.Tensor, order: int) -> torch.Tensor:
    """Partial sums of the Taylor series of ``exp(iθ)``, for every order up to ``order``.

    ``out[N] = Σ_{n=0}^{N} (iθ)^n / n!``. Each term is the previous one times
    ``iθ / n``, so no factorial or large power is ever formed. Computed in float64
    (complex128) whatever the input dtype, because the terms of a long series cancel.

    Shapes:
        theta: ``[...]`` real angles in radians.
        returns: ``[order + 1, ...]`` complex128; ``out[N]`` has the shape of ``theta``.

    Implements the exponential series, ``exp(z) = Σ z^n / n!``, at ``z = iθ``
    (the series behind Euler's formula).

    Raises:
        TypeError: ``theta`` is not a real floating-point tensor, or ``order`` is not
            an int.
        ValueError: ``order`` is negative.
    """
    _check_args(theta, order)
    z = 1j * theta.to(torch.float64)
    term = torch.ones_like(z)
    sums = [term]
    for n in range(1, order + 1):
        term = term * z / n
        sums.append(sums[-1] + term)
    return torch.stack(sums)


def exp_remainder_bound(theta: torch.Tensor, order: int) -> torch.Tensor:
    """Upper bound ``|θ|^{N+1} / (N+1)!`` on ``|exp(iθ) - S_N(θ)|`` for real ``θ``.

    The Taylor remainder of ``exp(iθ)`` after the term of degree ``N`` is
    ``(i^{N+1} / N!) ∫_0^θ (θ - t)^N e^{it} dt``; since ``|e^{it}| = 1`` its modulus is
    at most ``|θ|^{N+1} / (N+1)!``, the Lagrange bound of a real Taylor series.

    Shapes:
        theta: ``[...]`` real angles in radians.
        returns: ``[...]`` float64, the bound for each angle.

    Raises:
        TypeError: ``theta`` is not a real floating-point tensor, or ``order`` is not
            an int.
        ValueError: ``order`` is negative.
    """
    _check_args(theta, order)
    magnitude = theta.to(torch.float64).abs()
    bound = torch.ones_like(magnitude)
    for n in range(1, order + 2):  # |θ|^(N+1)/(N+1)! as a product of |θ|/n, no overflow
        bound = bound * magnitude / n
    return bound
