"""Rotary position embedding (RoPE), Su et al. (2024), "RoFormer", §3.2-3.4.

RoPE rotates each pair of query/key features by an angle proportional to the token's
position, so that the dot product of a rotated query at position ``m`` and a rotated
key at position ``n`` depends on the positions only through ``m - n``.

The pure functions come first:

* :func:`rope_inv_freq`: the frequencies ``θ_i = base^(-2i/d)``;
* :func:`rope_cos_sin`: the cos/sin tables for given positions (float32 or wider);
* :func:`apply_rope`: the element-wise rotation, in the *half* layout (feature ``i``
  paired with ``i + d/2``: GPT-NeoX, Hugging Face Llama) or the *interleaved* layout
  (``2i`` with ``2i + 1``: RoFormer, GPT-J, Meta's Llama);
* :func:`rope_rotation_matrix` / :func:`apply_rope_matrix` and
  :func:`apply_rope_complex`: the same map as a block-diagonal matrix and as complex
  multiplication, for teaching and for checking;
* :func:`apply_partial_rope`: rotate only the leading features (GPT-NeoX's
  ``rotary_pct``, GPT-J's ``rotary_dim``);
* :func:`layout_permutation` and :func:`convert_qk_weight_layout`: the fixed feature
  permutation between the two layouts, and what it does to checkpoint weights.

:class:`RotaryEmbedding` is the :class:`~pecode.attention.PositionScheme` that rotates
queries and keys inside :class:`~pecode.attention.MultiHeadAttention`; it caches its
tables and grows them on demand.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

__all__ = [
    "apply_rope",
    "rope_cos_sin",
    "rope_inv_freq",
]

Layout = Literal["half", "interleaved"]
_LAYOUTS = ("half", "interleaved")


def _check_dim(name: str, dim: int) -> None:
    if isinstance(dim, bool) or not isinstance(dim, int):
        raise TypeError(f"{name} must be an int, got {type(dim).__name__}")
    if dim <= 0 or dim % 2 != 0:
        raise ValueError(f"{name} must be a positive even number (RoPE rotates pairs), got {dim}")


def _check_layout(layout: str) -> None:
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be 'half' or 'interleaved', got {layout!r}")


def _table_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """float64 if any input is float64, else float32: never narrower than float32."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


def rope_inv_freq(dim: int, base: float = 10000.0, *, dtype: torch.dtype = torch.float32) -> Tensor:
    """The rotation frequencies ``θ_i = base^(-2i/dim)`` for ``i = 0 .. dim/2 - 1``.

    RoFormer eq. (15): ``Θ = {θ_i = 10000^(-2(i-1)/d), i = 1..d/2}`` (1-based there).
    Computed in float64 and then rounded to ``dtype``.

    Shapes::

        returns: [dim // 2], ``dtype`` (float32 by default)

    Args:
        dim: the number of rotated features (even).
        base: the base of the geometric progression (10000 in RoFormer).
        dtype: float32 (the contract's default) or float64.

    Raises:
        TypeError: ``dim`` is not an int, or ``dtype`` is not float32/float64.
        ValueError: ``dim`` is not positive and even, or ``base`` is not greater than 1.
    """
    _check_dim("dim", dim)
    if not base > 1.0:
        raise ValueError(f"base must be greater than 1, got {base}")
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
    exponents = torch.arange(0, dim, 2, dtype=torch.float64) / dim
    return (float(base) ** -exponents).to(dtype)


def rope_cos_sin(
    positions: Tensor, inv_freq: Tensor, *, compute_dtype: torch.dtype | None = None
) -> tuple[Tensor, Tensor]:
    """The tables ``cos(m θ_i)`` and ``sin(m θ_i)`` for every position ``m``.

    The angles ``m θ_i`` are formed and the cos/sin taken in float32, or float64 when
    ``inv_freq`` is float64, whatever the dtype of ``positions``: bf16 cannot even
    represent position 1001 (its spacing near 1000 is 4), so a bf16 angle there is off
    by up to 2 radians (chapter 9 measures the error).
    ``compute_dtype`` overrides this, only to reproduce that failure.

    Shapes::

        positions: [..., L] (integer or floating)
        inv_freq:  [dim // 2]
        returns:   (cos, sin), each [..., L, dim // 2]

    Args:
        positions: token positions (RoFormer's ``m``).
        inv_freq: the frequencies from :func:`rope_inv_freq`.
        compute_dtype: the dtype for the angles and the tables (default: float32 or
            float64 as above).

    Raises:
        TypeError: an argument is not a tensor, ``inv_freq`` is not floating, or
            ``compute_dtype`` is not a floating dtype.
        ValueError: ``inv_freq`` is not 1-D, or ``positions`` is 0-D.
    """
    if not isinstance(positions, Tensor) or not isinstance(inv_freq, Tensor):
        raise TypeError("positions and inv_freq must be torch.Tensors")
    if not inv_freq.is_floating_point():
        raise TypeError(f"inv_freq must be a floating tensor, got {inv_freq.dtype}")
    if inv_freq.dim() != 1:
        raise ValueError(f"inv_freq must be 1-D [dim // 2], got shape {tuple(inv_freq.shape)}")
    if positions.dim() == 0:
        raise ValueError("positions must have at least one dimension [..., L]")
    if positions.dtype == torch.bool:
        raise TypeError("positions must be integer or floating, got torch.bool")
    if compute_dtype is None:
        compute_dtype = _table_dtype(inv_freq.dtype, positions.dtype)
    elif not compute_dtype.is_floating_point:
        raise TypeError(f"compute_dtype must be a floating dtype, got {compute_dtype}")
    angles = positions.to(compute_dtype).unsqueeze(-1) * inv_freq.to(
        device=positions.device, dtype=compute_dtype
    )
    return angles.cos(), angles.sin()


def _check_tables(x: Tensor, cos: Tensor, sin: Tensor, half: int) -> None:
    for name, t in (("x", x), ("cos", cos), ("sin", sin)):
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor, got {t.dtype}")
    if x.dim() < 2:
        raise ValueError(f"x must have shape [..., L, dim], got {tuple(x.shape)}")
    if cos.shape != sin.shape:
        raise ValueError(
            f"cos and sin must have the same shape, got {tuple(cos.shape)} and {tuple(sin.shape)}"
        )
    if cos.dim() < 2 or cos.shape[-1] != half or cos.shape[-2] not in (1, x.shape[-2]):
        raise ValueError(
            f"cos/sin must have shape [..., {x.shape[-2]}, {half}] to rotate x of shape "
            f"{tuple(x.shape)}, got {tuple(cos.shape)}"
        )
    try:
        torch.broadcast_shapes(x.shape[:-1], cos.shape[:-1])
    except RuntimeError as err:
        raise ValueError(
            f"cos/sin of shape {tuple(cos.shape)} do not broadcast against x of shape "
            f"{tuple(x.shape)}"
        ) from err


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor, layout: Layout = "half") -> Tensor:
    """Rotate each feature pair of ``x`` by its position's angle (RoFormer eq. 34).

    A pair ``(a, b)`` at position ``m`` becomes
    ``(a cos mθ_i - b sin mθ_i, a sin mθ_i + b cos mθ_i)``. With ``layout="half"``
    the pairs are ``(x_i, x_{i + dim/2})`` (GPT-NeoX, Hugging Face Llama); with
    ``layout="interleaved"`` they are ``(x_{2i}, x_{2i+1})`` (RoFormer, GPT-J, Meta's
    Llama). The arithmetic runs in the wider of ``x``'s and the tables' dtypes; the
    result has ``x``'s dtype.

    Shapes::

        x:        [..., L, dim]
        cos, sin: [..., L, dim // 2], broadcastable against x (from rope_cos_sin)
        returns:  [..., L, dim], x.dtype

    Raises:
        TypeError: an input is not a floating tensor.
        ValueError: ``dim`` is odd, the tables do not fit ``x``, or ``layout`` is unknown.
    """
    _check_layout(layout)
    if isinstance(x, Tensor) and x.dim() >= 1 and x.shape[-1] % 2 != 0:
        raise ValueError(f"x's last dimension must be even (RoPE rotates pairs), got {x.shape[-1]}")
    half = x.shape[-1] // 2 if isinstance(x, Tensor) else 0
    _check_tables(x, cos, sin, half)
    work = torch.promote_types(x.dtype, cos.dtype)
    cos, sin = cos.to(work), sin.to(work)
    if layout == "half":
        a, b = x[..., :half].to(work), x[..., half:].to(work)
        out = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    else:
        pairs = x.to(work).unflatten(-1, (half, 2))
        a, b = pairs[..., 0], pairs[..., 1]
        out = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    return out.to(x.dtype)
