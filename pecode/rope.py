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
tables and grows them on demand, and, called as a module, returns the ``(cos, sin)`` of
Hugging Face's ``rotary_emb(x, position_ids)``.

This module is the math. :mod:`pecode.rope_kernels` holds the fast paths that
:func:`apply_rope` hands its work to when they apply (the same numbers in fewer passes
over memory, and a backward that is the inverse rotation), among them the kernel that
``torch.compile`` builds on the CPU (:mod:`pecode.rope_compiled`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn

from pecode import rope_compiled, rope_kernels
from pecode._checks import check_int, check_integer_tensor, check_positions
from pecode.attention import PositionScheme
from pecode.frequencies import check_rope_base, check_rope_dim, rope_inv_freq
from pecode.mrope import mrope_pair_axes
from pecode.scaling import hf_layer_types, hf_rope_arguments, rope_frequencies

__all__ = [
    "TABLE_ROWS_ALWAYS_CACHED",
    "RotaryEmbedding",
    "RotaryEmbeddingPerLayerType",
    "apply_partial_rope",
    "apply_rope",
    "apply_rope_complex",
    "apply_rope_matrix",
    "apply_rope_rotate_half",
    "convert_qk_weight_layout",
    "layout_permutation",
    "rope_cos_sin",
    "rope_formula",
    "rope_inv_freq",
    "rope_rotation_matrix",
    "rotate_half",
]

_LAYOUTS = ("half", "interleaved")
# The scaling kinds whose frequencies follow the positions of each call (see RotaryEmbedding)
_PER_CALL_SCALING = ("dynamic", "longrope")


def _check_layout(layout: str) -> None:
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be 'half' or 'interleaved', got {layout!r}")


def _check_tensors(**tensors: object) -> None:
    for name, value in tensors.items():
        if not isinstance(value, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")


def _table_dtype(*dtypes: torch.dtype) -> torch.dtype:
    """float64 if any input is float64, else float32: never narrower than float32."""
    return torch.float64 if torch.float64 in dtypes else torch.float32


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
    _check_tensors(positions=positions, inv_freq=inv_freq)
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


def _check_rope_inputs(
    x: Tensor, cos: Tensor, sin: Tensor, layout: str, out: Tensor | None, compiled: object = None
) -> None:
    """The checks of :func:`apply_rope`, cheap enough for a decode step (no loop, no copy)."""
    if layout != "half" and layout != "interleaved":
        raise ValueError(f"layout must be 'half' or 'interleaved', got {layout!r}")
    if compiled is not None or not torch.compiler.is_compiling():  # no guard on the environment
        rope_compiled.resolve_mode(compiled)  # None: the environment variable, at every call
    if not (
        isinstance(x, Tensor)
        and isinstance(cos, Tensor)
        and isinstance(sin, Tensor)
        and x.is_floating_point()
        and cos.is_floating_point()
        and sin.is_floating_point()
    ):
        for name, t in (("x", x), ("cos", cos), ("sin", sin)):
            if not isinstance(t, Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
            if not t.is_floating_point():
                raise TypeError(f"{name} must be a floating tensor, got {t.dtype}")
    shape, table = x.shape, cos.shape
    if len(shape) < 2:
        raise ValueError(f"x must have shape [..., L, dim], got {tuple(shape)}")
    if shape[-1] % 2 != 0:
        raise ValueError(f"x's last dimension must be even (RoPE rotates pairs), got {shape[-1]}")
    if table != sin.shape:
        raise ValueError(
            f"cos and sin must have the same shape, got {tuple(table)} and {tuple(sin.shape)}"
        )
    if len(table) < 2 or 2 * table[-1] != shape[-1] or table[-2] not in (1, shape[-2]):
        raise ValueError(
            f"cos/sin must have shape [..., {shape[-2]}, {shape[-1] // 2}] to rotate x of "
            f"shape {tuple(shape)}, got {tuple(table)} (x's positions must be its "
            f"second-to-last axis: transpose x [B, L, H, dim] to [B, H, L, dim] with "
            f"x.transpose(1, 2))"
        )
    if len(table) > 2:  # batched tables ([B, 1, L, dim/2], say): they must broadcast
        _check_head_axis(shape, table, "cos/sin", "cos[:, None], sin[:, None]")
        try:
            shape = torch.Size((*_broadcast(shape[:-1], table[:-1]), shape[-1]))
        except RuntimeError as err:
            raise ValueError(
                f"cos/sin of shape {tuple(table)} do not broadcast against x of shape "
                f"{tuple(x.shape)}"
            ) from err
    if out is not None:
        _check_out(out, x, cos, sin, shape)


def _check_head_axis(
    x_shape: torch.Size, shape: torch.Size, name: str, fix: str, trailing: int = 2
) -> None:
    """Refuse batched tables with fewer axes than ``x``: their batch would meet x's heads.

    ``shape`` ends in ``trailing`` axes that match x's ``[L, dim]``; the axes before
    them are the batch. ``rope_cos_sin(positions [B, L])`` gives ``[B, L, dim/2]``;
    against ``x [B, H, L, dim]`` that ``B`` lines up with ``H``, which rotates each head
    by another row's positions when ``B == H`` (and fails to broadcast otherwise).
    Leading axes of size 1 are shared by every row either way, so they pass.
    """
    lead = shape[:-trailing]
    if 0 < len(lead) < len(x_shape) - 2 and any(size != 1 for size in lead):
        raise ValueError(
            f"{name} of shape {tuple(shape)} have fewer axes than x of shape {tuple(x_shape)}, "
            f"so their batch axis would line up with x's head axis: add the head axis "
            f"({fix} for x [B, H, L, dim] and positions [B, L])"
        )


def _broadcast(a: torch.Size, b: torch.Size) -> torch.Size:
    """The broadcast of two shapes; RuntimeError if they do not broadcast."""
    if torch.compiler.is_compiling():  # the compiler traces the Python rule
        return torch.broadcast_shapes(a, b)
    return torch._C._infer_size(a, b)  # the C++ rule: 0.1 µs instead of 10


def _check_out(out: Tensor, x: Tensor, cos: Tensor, sin: Tensor, shape: torch.Size) -> None:
    if not isinstance(out, Tensor):
        raise TypeError(f"out must be a torch.Tensor or None, got {type(out).__name__}")
    if out.dtype != x.dtype:
        raise TypeError(f"out must have x's dtype {x.dtype}, got {out.dtype}")
    if out.shape != shape:
        raise ValueError(f"out must have the result's shape {tuple(shape)}, got {tuple(out.shape)}")
    if out.device != x.device:
        raise ValueError(f"out must be on x's device {x.device}, got {out.device}")
    if torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad or sin.requires_grad):
        raise ValueError(
            "out= is for inference: it cannot be used while x, cos or sin requires grad "
            "(call apply_rope without out=, or under torch.no_grad())"
        )
    if not torch.compiler.is_compiling() and any(
        rope_kernels.overlaps(out, t) for t in (x, cos, sin)
    ):
        raise ValueError("out must not share memory with x, cos or sin")
    if not torch.compiler.is_compiling() and torch._debug_has_internal_overlap(out) == 1:
        raise ValueError("out must not have elements that share memory (an expanded view)")


def apply_rope(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    layout: str = "half",
    *,
    out: Tensor | None = None,
    compiled: bool | str | None = None,
) -> Tensor:
    """Rotate each feature pair of ``x`` by its position's angle (RoFormer §3.4.2).

    A pair ``(a, b)`` at position ``m`` becomes
    ``(a cos mθ_i - b sin mθ_i, a sin mθ_i + b cos mθ_i)``. With ``layout="half"``
    the pairs are ``(x_i, x_{i + dim/2})`` (GPT-NeoX, Hugging Face Llama); with
    ``layout="interleaved"`` they are ``(x_{2i}, x_{2i+1})`` (RoFormer, GPT-J, Meta's
    Llama). The arithmetic runs in the wider of ``x``'s and the tables' dtypes; the
    result has ``x``'s dtype.

    **The positions are x's second-to-last axis** (``[..., L, dim]``): x in the
    ``[B, L, H, dim]`` layout (torchtune, Meta's Llama, flash-attn) must be given as
    ``x.transpose(1, 2)``. When ``L == H`` the wrong layout cannot be told from the
    shapes and is rotated by the wrong axis without error.

    The element-wise formula, :func:`rope_formula`, is the definition. When the
    arithmetic is float32 or float64 and the tables need no gradient,
    :mod:`pecode.rope_kernels` computes the same numbers in fewer passes over memory,
    with a backward that is the rotation by ``-θ``; under ``torch.compile``,
    ``torch.export`` and ``torch.func`` transforms the formula runs as written. On the
    CPU a kernel built by ``torch.compile`` (:mod:`pecode.rope_compiled`) does it in one
    pass: ``compiled=None`` follows the environment variable ``PECODE_ROPE_COMPILE``
    (default ``"auto"``: large half-layout or bf16 inputs, never a decoding step, the
    first such call compiling for seconds; eager when no C++ compiler works),
    ``True`` always where it applies, ``False`` never.

    Shapes::

        x:        [..., L, dim]
        cos, sin: [..., L or 1, dim // 2], broadcastable against x (from rope_cos_sin);
                  batched tables have x's number of axes: [B, 1, L, dim // 2] for
                  x [B, H, L, dim] (cos[:, None] of rope_cos_sin(positions [B, L]))
        out:      optional, the result's shape and x's dtype: written and returned, so
                  that nothing is allocated (inference only)
        returns:  [..., L, dim] (the broadcast shape), x.dtype

    Raises:
        TypeError: an input is not a floating tensor, ``out`` is not a tensor of
            ``x``'s dtype, or ``compiled`` is not a bool, ``"auto"`` or None.
        ValueError: ``dim`` is odd, the tables do not fit ``x`` (batched tables with fewer
            axes than ``x`` included: their batch would meet x's heads), ``layout`` is unknown,
            ``out`` has the wrong shape or device, shares memory with an input, or is
            given while an input requires grad, or ``compiled`` (or
            ``PECODE_ROPE_COMPILE``) has an unknown value.
        RuntimeError: ``compiled=True`` (or ``PECODE_ROPE_COMPILE=1``) where no C++
            compiler works.
    """
    _check_rope_inputs(x, cos, sin, layout, out, compiled)
    if rope_kernels.can_rotate(x, cos, sin):
        return rope_kernels.rotate(x, cos, sin, layout, out=out, compiled=compiled)
    rotated = rope_formula(x, cos, sin, layout)
    return rotated if out is None else out.copy_(rotated)


def rope_formula(x: Tensor, cos: Tensor, sin: Tensor, layout: str) -> Tensor:
    """The rotation of :func:`apply_rope` as written, element by element, without checks.

    ``(a, b) -> (a cos - b sin, a sin + b cos)`` for every pair, in the wider of ``x``'s
    and the tables' dtypes, returned in ``x``'s. :func:`apply_rope` runs it when the
    kernels of :mod:`pecode.rope_kernels` do not apply, and ``torch.compile`` fuses it
    when a compiled model calls ``apply_rope``.
    """
    work = torch.promote_types(x.dtype, cos.dtype)
    cos, sin = cos.to(work), sin.to(work)
    half = x.shape[-1] // 2
    if layout == "half":
        a, b = x[..., :half].to(work), x[..., half:].to(work)
        rotated = torch.cat((a * cos - b * sin, a * sin + b * cos), dim=-1)
    else:
        pairs = x.to(work).unflatten(-1, (half, 2))
        a, b = pairs[..., 0], pairs[..., 1]
        rotated = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    return rotated.to(x.dtype)


def rotate_half(x: Tensor) -> Tensor:
    """``(x_1, x_2) -> (-x_2, x_1)`` on the two halves of the last dimension.

    The 90-degree rotation of every half-layout pair, written as one permutation with
    signs, so that RoPE becomes ``x * cos + rotate_half(x) * sin`` with full-width
    tables (the form of GPT-NeoX and Hugging Face Llama).

    Shapes::

        x: [..., dim]    returns: [..., dim]

    Raises:
        ValueError: the last dimension is odd.
    """
    if x.shape[-1] % 2 != 0:
        raise ValueError(f"x's last dimension must be even, got {x.shape[-1]}")
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def apply_rope_rotate_half(x: Tensor, cos_full: Tensor, sin_full: Tensor) -> Tensor:
    """RoPE in the half layout as ``x * cos_full + rotate_half(x) * sin_full``.

    ``cos_full`` must repeat the half-width table as ``cat((cos, cos), -1)``, so that
    features ``i`` and ``i + dim/2`` see the same angle. Any other full-width table
    (``cos.repeat_interleave(2, -1)``, say) is accepted and computed as given; it is
    then no rotation (chapter 9 shows what goes wrong).

    Shapes::

        x:                  [..., L, dim]
        cos_full, sin_full: [..., L, dim], broadcastable against x; batched tables have
                            x's number of axes ([B, 1, L, dim] for x [B, H, L, dim])
        returns:            [..., L, dim]

    Raises:
        ValueError: the last dimension is odd, the tables' last dimension differs, or
            batched tables have fewer axes than ``x``.
    """
    if cos_full.shape[-1] != x.shape[-1] or sin_full.shape[-1] != x.shape[-1]:
        raise ValueError(
            f"cos_full/sin_full must have last dimension {x.shape[-1]}, "
            f"got {cos_full.shape[-1]} and {sin_full.shape[-1]}"
        )
    _check_head_axis(x.shape, cos_full.shape, "cos_full", "cos_full[:, None], sin_full[:, None]")
    return x * cos_full + rotate_half(x) * sin_full


def _pairs(dim: int, layout: str) -> tuple[Tensor, Tensor]:
    """Indices of the first and second feature of every pair."""
    half = dim // 2
    if layout == "half":
        return torch.arange(half), torch.arange(half) + half
    return torch.arange(0, dim, 2), torch.arange(1, dim, 2)


def rope_rotation_matrix(
    positions: Tensor, inv_freq: Tensor, layout: str = "interleaved"
) -> Tensor:
    """The ``dim x dim`` rotation matrix ``R^d_{Θ,m}`` of RoFormer §3.2.2, per position.

    Block-diagonal with 2x2 rotations ``[[cos mθ_i, -sin mθ_i], [sin mθ_i, cos mθ_i]]``
    on pairs ``(2i, 2i+1)`` (``"interleaved"``, the paper's form) or ``(i, i + dim/2)``
    (``"half"``: the same matrix with rows and columns permuted). Multiplying by it
    costs ``O(dim²)`` per token against ``O(dim)`` for :func:`apply_rope`: use it to
    teach and to check, not to compute.

    Shapes::

        positions: [..., L]
        inv_freq:  [dim // 2]
        returns:   [..., L, dim, dim] (float32, or float64 for float64 inv_freq)

    Raises:
        ValueError: ``layout`` is unknown; see :func:`rope_cos_sin` for the rest.
    """
    _check_layout(layout)
    cos, sin = rope_cos_sin(positions, inv_freq)
    dim = 2 * inv_freq.shape[0]
    first, second = _pairs(dim, layout)
    matrix = cos.new_zeros((*cos.shape[:-1], dim, dim))
    matrix[..., first, first] = cos
    matrix[..., first, second] = -sin
    matrix[..., second, first] = sin
    matrix[..., second, second] = cos
    return matrix


def apply_rope_matrix(
    x: Tensor, positions: Tensor, inv_freq: Tensor, layout: str = "interleaved"
) -> Tensor:
    """RoPE as a matrix product ``R^d_{Θ,m} x_m`` (RoFormer §3.2.2), ``O(dim²)`` per token.

    Shapes::

        x:         [..., L, dim]
        positions: [L]
        inv_freq:  [dim // 2]
        returns:   [..., L, dim], in the matrix's dtype (float32 or float64)

    Raises:
        TypeError: an argument is not a tensor (see :func:`rope_cos_sin`).
        ValueError: ``dim`` differs from ``2 * len(inv_freq)``, ``positions`` is not 1-D,
            or ``layout`` is unknown.
    """
    _check_tensors(x=x, positions=positions, inv_freq=inv_freq)
    if x.shape[-1] != 2 * inv_freq.shape[0]:
        raise ValueError(
            f"x's last dimension {x.shape[-1]} must be 2 * len(inv_freq) = {2 * inv_freq.shape[0]}"
        )
    if positions.dim() != 1:
        raise ValueError(f"positions must be 1-D [L], got shape {tuple(positions.shape)}")
    matrix = rope_rotation_matrix(positions, inv_freq, layout)
    return torch.einsum("lij,...lj->...li", matrix, x.to(matrix.dtype))


def apply_rope_complex(
    x: Tensor, positions: Tensor, inv_freq: Tensor, layout: str = "interleaved"
) -> Tensor:
    """RoPE as complex multiplication ``z_i · e^{i m θ_i}`` (RoFormer §3.2.1).

    Each pair ``(a, b)`` is read as ``z = a + ib`` and multiplied by the unit complex
    number ``e^{imθ}`` (the form of Meta's Llama code). Computed in complex64, or
    complex128 when ``x`` or ``inv_freq`` is float64.

    Shapes::

        x:         [..., L, dim]
        positions: [..., L], broadcastable against x's leading axes; batched positions
                   have x's number of axes less one ([B, 1, L] for x [B, H, L, dim])
        inv_freq:  [dim // 2]
        returns:   [..., L, dim], float32 or float64

    Raises:
        TypeError: an argument is not a tensor (see :func:`rope_cos_sin`).
        ValueError: ``dim`` differs from ``2 * len(inv_freq)``, ``layout`` is unknown, or
            batched positions have fewer axes than ``x`` less one.
    """
    _check_layout(layout)
    _check_tensors(x=x, positions=positions, inv_freq=inv_freq)
    if x.shape[-1] != 2 * inv_freq.shape[0]:
        raise ValueError(
            f"x's last dimension {x.shape[-1]} must be 2 * len(inv_freq) = {2 * inv_freq.shape[0]}"
        )
    _check_head_axis(x.shape, positions.shape, "positions", "positions[:, None]", trailing=1)
    real = _table_dtype(x.dtype, inv_freq.dtype)
    cos, sin = rope_cos_sin(positions, inv_freq.to(real))
    rotor = torch.complex(cos, sin)  # e^{i m θ}
    half = x.shape[-1] // 2
    if layout == "interleaved":
        z = torch.view_as_complex(x.to(real).unflatten(-1, (half, 2)).contiguous())
        return torch.view_as_real(z * rotor).flatten(-2)
    z = torch.complex(x[..., :half].to(real), x[..., half:].to(real))
    turned = z * rotor
    return torch.cat((turned.real, turned.imag), dim=-1)


def apply_partial_rope(
    x: Tensor, cos: Tensor, sin: Tensor, layout: str = "half", *, compiled: bool | str | None = None
) -> Tensor:
    """Rotate the first ``2 * cos.shape[-1]`` features of ``x`` and pass the rest through.

    Partial rotary embedding as in GPT-NeoX (``rotary_pct``, half layout) and GPT-J
    (``rotary_dim``, interleaved layout): the tables are built for ``rotary_dim``
    features, and the remaining ``dim - rotary_dim`` features carry no position.

    Shapes::

        x:        [..., L, dim]
        cos, sin: [..., L, rotary_dim // 2] with rotary_dim <= dim
        returns:  [..., L, dim]

    ``compiled`` is :func:`apply_rope`'s switch.

    Raises:
        ValueError: ``rotary_dim`` exceeds ``dim``; see :func:`apply_rope` for the rest.
    """
    rotary_dim = 2 * cos.shape[-1]
    if rotary_dim > x.shape[-1]:
        raise ValueError(f"the tables rotate {rotary_dim} features but x has only {x.shape[-1]}")
    if rotary_dim == x.shape[-1]:  # full rotation: no pass-through features to copy
        return apply_rope(x, cos, sin, layout, compiled=compiled)
    rotated = apply_rope(x[..., :rotary_dim], cos, sin, layout, compiled=compiled)
    return torch.cat((rotated, x[..., rotary_dim:]), dim=-1)


def layout_permutation(dim: int) -> Tensor:
    """The feature permutation that turns the half layout into the interleaved one.

    ``perm[2i] = i`` and ``perm[2i + 1] = i + dim/2``, so that for every position
    ``apply_rope(x[..., perm], layout="interleaved") ==
    apply_rope(x, layout="half")[..., perm]``. Its inverse ``argsort(perm)`` goes back.

    Shapes::

        returns: [dim](int64)

    Raises:
        TypeError, ValueError: ``dim`` is not a positive even int.
    """
    check_rope_dim("dim", dim)
    half = dim // 2
    return torch.stack((torch.arange(half), torch.arange(half) + half), dim=-1).flatten()


def convert_qk_weight_layout(weight: Tensor, num_heads: int, source: str, target: str) -> Tensor:
    """Reorder the output rows of a query or key projection from one RoPE layout to the other.

    A checkpoint trained with interleaved RoPE (Meta's Llama) gives the same attention
    scores under half-layout RoPE (Hugging Face's port) once the rows of ``W_q`` and
    ``W_k`` of every head are permuted with :func:`layout_permutation`; ``W_v`` and
    ``W_o`` stay as they are, because the permutation cancels in ``q·k``.

    Shapes::

        weight:  [num_heads * head_dim, in_features] (a bias [num_heads * head_dim] too)
        returns: same shape

    Raises:
        ValueError: a layout is unknown, or the rows do not split into ``num_heads``
            heads of even size.
    """
    _check_layout(source)
    _check_layout(target)
    if num_heads <= 0 or weight.shape[0] % num_heads != 0:
        raise ValueError(
            f"weight's {weight.shape[0]} rows do not split into num_heads={num_heads} heads"
        )
    head_dim = weight.shape[0] // num_heads
    if head_dim % 2 != 0:
        raise ValueError(f"head_dim={head_dim} must be even for RoPE")
    if source == target:
        return weight.clone()
    perm = layout_permutation(head_dim)
    if source == "interleaved":  # interleaved slot 2i holds half slot i: undo it
        perm = torch.argsort(perm)
    heads = weight.reshape(num_heads, head_dim, *weight.shape[1:])
    return heads[:, perm.to(weight.device)].reshape(weight.shape)


TABLE_ROWS_ALWAYS_CACHED = 4096
"""Rows :class:`RotaryEmbedding` may always grow its tables to (1 MiB of float32 cos and sin
at ``rotary_dim`` 64). Beyond them a table grows (doubling) only while it stays within
twice the larger of the rows it holds and the positions a call asks for; a call far past
it (one token at position ``10**6``) gets rows for its own positions instead."""


class RotaryEmbedding(PositionScheme):
    """RoPE as a position scheme: rotates queries and keys (never values) by their positions.

    Caches cos/sin tables for positions ``0 .. N-1`` (float32, or float64 with
    ``dtype=torch.float64``) and grows them, doubling, when a call needs the next
    positions. A call far past the tables (one token at position ``10**6``) gets rows
    computed for its positions alone: the tables never grow past twice the largest of
    the rows they held, the positions of the call and ``TABLE_ROWS_ALWAYS_CACHED``.
    The tables stay in their dtype even after ``module.to(torch.bfloat16)``: they are
    rebuilt, and the rotation runs in float32 before rounding to the input's dtype
    (chapter 9 shows why). They hold no learned values and are not in the state dict:
    built on the ``meta`` device, the module rebuilds them when ``to_empty()`` gives it
    memory (or when :meth:`reset_parameters` is called). Positions come from
    :class:`~pecode.attention.MultiHeadAttention` as ``[L]`` or ``[B, L]``: offsets
    for a KV cache and per-row positions for left padding need nothing else. Called as
    a module, ``rotary(x, position_ids)`` returns Hugging Face's ``(cos, sin)``
    (:meth:`forward`); :meth:`from_hf_config` builds the module of a Hugging Face
    model from its ``config.json``.

    Under ``torch.compile`` and ``torch.export`` the tables cannot grow (growing reads the
    positions on the host): give ``initial_positions`` at least the longest sequence, or
    call the module once eagerly, before compiling (:meth:`cos_sin`).

    Args:
        head_dim: the per-head dimension of q and k.
        base: the frequency base (10000 in RoFormer).
        layout: ``"half"`` or ``"interleaved"`` (see :func:`apply_rope`).
        rotary_dim: rotate only the first ``rotary_dim`` features (default all).
        initial_positions: table length to build up front (a non-negative int).
        dtype: float32 or float64 tables.
        scaling: a long-context kind of :func:`pecode.scaling.rope_frequencies`
            (``"linear"``, ``"yarn"``, ...); its attention factor multiplies the cos
            and sin tables. ``"dynamic"`` follows Hugging Face transformers
            (``dynamic_rope_update``): past ``original_max_position_embeddings`` the
            frequencies are those of the longest length seen so far, until a call that
            stays below that length brings back the unscaled ones; so they depend on
            earlier calls (:meth:`reset_parameters` forgets them). ``"longrope"``
            (Phi-3) follows transformers too: each call uses ``long_factor`` when its
            largest position is at least ``original_max_position_embeddings``, else
            ``short_factor``, whatever came before; its attention factor is one for
            both. For either kind, a decoding step that changes the frequencies
            computes the row of its own position only, and keys cached before the
            change keep their old rotation, as in transformers.
        scaling_params: that kind's parameters (``factor``, ...), without ``seq_len``,
            which ``"dynamic"`` and ``"longrope"`` take from the positions of each call.
        compiled: :func:`apply_rope`'s switch for the compiled CPU kernel (None: the
            environment variable ``PECODE_ROPE_COMPILE``, ``"auto"`` by default); the
            attribute ``compiled`` can be changed later.
        sections: multi-axis RoPE (M-RoPE, Qwen2-VL's ``mrope_section``): how many of
            the ``rotary_dim / 2`` pairs each position axis turns (time, height,
            width); positions then come as ``[B, L, A]`` to :meth:`rotate` and
            :meth:`transform_qk` (``[A, B, L]`` to :meth:`forward`, as transformers
            passes them), and ``[L]`` or ``[B, L]`` mean the same index on every axis
            (text), which is 1-D RoPE. :class:`~pecode.attention.MultiHeadAttention`
            takes ``[B, L, A]`` too, and its :class:`~pecode.attention.KVCache`
            continues decoding from one past the largest cached index on any axis.
        section_layout: ``"chunked"`` (Qwen2/2.5-VL) or ``"interleaved"``
            (Qwen3-VL, ``mrope_interleaved``): see :mod:`pecode.mrope`.

    Raises:
        TypeError, ValueError: ``head_dim``/``rotary_dim`` not positive and even,
            ``rotary_dim > head_dim``, an unknown layout, ``base`` not a finite number
            greater than 1, ``initial_positions`` not a non-negative int, a ``dtype``
            other than float32/float64, a scaling kind or parameter that
            :func:`pecode.scaling.rope_frequencies` rejects, a ``seq_len`` in
            ``scaling_params``, a ``compiled`` other than a bool, ``"auto"`` or None,
            or ``sections`` that :func:`pecode.mrope.mrope_pair_axes` refuses or that do
            not add up to ``rotary_dim / 2``.
    """

    @property
    def position_axes(self) -> int | None:  # type: ignore[override]
        """``len(sections)`` for M-RoPE (positions ``[B, L, A]``), else ``None``."""
        return None if self.sections is None else len(self.sections)

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        layout: str = "half",
        rotary_dim: int | None = None,
        initial_positions: int = 0,
        dtype: torch.dtype = torch.float32,
        scaling: str | None = None,
        scaling_params: Mapping[str, Any] | None = None,
        compiled: bool | str | None = None,
        sections: Sequence[int] | None = None,
        section_layout: str = "chunked",
    ) -> None:
        super().__init__()
        check_rope_dim("head_dim", head_dim)
        rotary_dim = head_dim if rotary_dim is None else rotary_dim
        check_rope_dim("rotary_dim", rotary_dim)
        if rotary_dim > head_dim:
            raise ValueError(f"rotary_dim={rotary_dim} exceeds head_dim={head_dim}")
        _check_layout(layout)
        check_int("initial_positions", initial_positions, minimum=0)
        if dtype not in (torch.float32, torch.float64):
            raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")
        if scaling is not None and not isinstance(scaling, str):
            raise TypeError(f"scaling must be a str or None, got {type(scaling).__name__}")
        if scaling_params is not None and not isinstance(scaling_params, Mapping):
            raise TypeError(
                f"scaling_params must be a dict or None, got {type(scaling_params).__name__}"
            )
        if scaling is None and scaling_params:
            raise ValueError("scaling_params given without a scaling kind")
        if scaling in _PER_CALL_SCALING and "seq_len" in (scaling_params or {}):
            raise ValueError(
                f"scaling_params['seq_len']: RotaryEmbedding(scaling={scaling!r}) takes the "
                "current length from the positions of each call; leave seq_len out"
            )
        self.head_dim, self.rotary_dim, self.layout = head_dim, rotary_dim, layout
        self.base, self.table_dtype = check_rope_base("base", base), dtype
        self.scaling, self.scaling_params = scaling, dict(scaling_params or {})
        if compiled is not None:  # None reads the environment variable at each call
            rope_compiled.resolve_mode(compiled)
        self.compiled = compiled
        self.layer_type: str | None = None  # the layer type of a config it was read for
        self.sections = None if sections is None else tuple(sections)
        self.section_layout = section_layout
        pair_axes = None
        if sections is None and section_layout != "chunked":
            raise ValueError(f"section_layout={section_layout!r} needs sections")
        if sections is not None:
            pair_axes = mrope_pair_axes(sections, section_layout)
            if len(pair_axes) != rotary_dim // 2:
                raise ValueError(
                    f"sections {list(sections)} add up to {len(pair_axes)} pairs, not the "
                    f"rotary_dim / 2 = {rotary_dim // 2} pairs rotated"
                )
        self.register_buffer("pair_axes", pair_axes, persistent=False)
        # The frequencies of the tables, in float64 on the CPU even when the module is
        # built on "meta": everything the tables are rebuilt from (validates the scaling).
        with torch.device("cpu"):
            self._inv_freq, self._attention_factor = self._frequencies(0)
        # "dynamic", "longrope": the length the frequencies are for ("dynamic" keeps the
        # longest, Hugging Face's rule), the length the tables were built for, and the
        # latest other frequencies (length, inv_freq, attention factor)
        self._seq_len = self._table_len = self._original_length()
        self._scaled: tuple[int, Tensor, float] | None = None
        # The tables are buffers so that .to(device) moves them. .to(torch.bfloat16)
        # would round them too, so _apply rebuilds them whenever their dtype changed.
        empty = torch.empty(0, rotary_dim // 2, dtype=dtype)
        self.register_buffer("cos_cached", empty, persistent=False)
        self.register_buffer("sin_cached", empty.clone(), persistent=False)
        if initial_positions > 0:
            self._build(initial_positions)

    @classmethod
    def from_hf_config(
        cls,
        config: Mapping[str, Any],
        *,
        head_dim: int | None = None,
        layer_type: str | None = None,
        **kwargs: Any,
    ) -> RotaryEmbedding:
        """The rotary embedding of a Hugging Face model, from its ``config.json``.

        ``RotaryEmbedding(**hf_rope_arguments(config, head_dim=head_dim,
        layer_type=layer_type), **kwargs)``: the head and rotated widths, the base and the
        scaling come from the config, read as transformers 5.23 reads it
        (:func:`pecode.scaling.hf_rope_arguments` says how, and what it refuses). The
        layout is the model's code, not its config: the default ``"half"`` is that of
        transformers' Llama-like models, whose rotary embedding's ``forward(x,
        position_ids)`` this module's :meth:`forward` then reproduces; pass
        ``layout="interleaved"`` for a model that rotates adjacent pairs (GPT-J).

        A config with a block per layer type (Gemma 3, OLMo 3) needs ``layer_type``; the
        module remembers it, and :meth:`forward` refuses another. For a module that
        serves every layer type, as those models' ``rotary_emb`` does, see
        :class:`RotaryEmbeddingPerLayerType`.

        Args:
            config: the model's ``config.json`` as a dict (``json.load``), or a
                transformers config object (``model.config``).
            head_dim: the per-head width, for configs that spell it in their own way.
            layer_type: which layer type's block to read (``"full_attention"``, ...).
            **kwargs: the other arguments of :class:`RotaryEmbedding` (``layout``,
                ``initial_positions``, ``dtype``).

        Raises:
            TypeError, ValueError: as :func:`pecode.scaling.hf_rope_arguments` (each
                message names the config key), or as :class:`RotaryEmbedding` for
                ``kwargs``; ``TypeError`` for a keyword the config already sets
                (``base``, ``scaling``, ...).
        """
        arguments = hf_rope_arguments(config, head_dim=head_dim, layer_type=layer_type)
        clashes = sorted(set(arguments) & set(kwargs))
        if clashes:
            raise TypeError(
                f"from_hf_config takes {clashes} from the config; pass only the other "
                "arguments (layout, initial_positions, dtype)"
            )
        module = cls(**arguments, **kwargs)
        module.layer_type = layer_type
        return module

    @property
    def cached_positions(self) -> int:
        """How many positions the cached tables cover."""
        return self.cos_cached.shape[0]

    def _frequencies(self, seq_len: int) -> tuple[Tensor, float]:
        if self.scaling is None:
            return rope_inv_freq(self.rotary_dim, self.base, dtype=torch.float64), 1.0
        params = dict(self.scaling_params)
        if self.scaling in _PER_CALL_SCALING:
            params["seq_len"] = max(seq_len, 1)
        return rope_frequencies(
            self.scaling, self.rotary_dim, self.base, dtype=torch.float64, **params
        )

    def _original_length(self) -> int:
        """The trained length past which ``"dynamic"`` and ``"longrope"`` change their
        frequencies (0 for the other kinds)."""
        if self.scaling not in _PER_CALL_SCALING:
            return 0
        return self.scaling_params["original_max_position_embeddings"]

    def _frequencies_at(self, length: int) -> tuple[Tensor, float]:
        """The frequencies for sequences of ``length`` (``"dynamic"`` and ``"longrope"``
        depend on it)."""
        if length == self._original_length():  # kinds not in _PER_CALL_SCALING: 0 == 0
            return self._inv_freq, self._attention_factor
        if self._scaled is None or self._scaled[0] != length:  # O(rotary_dim)
            with torch.device("cpu"):
                self._scaled = (length, *self._frequencies(length))
        return self._scaled[1], self._scaled[2]

    def _rows(self, positions: Tensor, length: int, device: torch.device) -> tuple[Tensor, Tensor]:
        """The table rows of ``positions`` for sequences of ``length``, on ``device``."""
        # Angles in float64 on the CPU (not every accelerator has float64), stored in
        # table_dtype: float32 angles would be off by ~m * 6e-8.
        inv_freq, attention_factor = self._frequencies_at(length)
        cos, sin = rope_cos_sin(positions.cpu(), inv_freq)
        cos, sin = cos * attention_factor, sin * attention_factor
        return cos.to(device, self.table_dtype), sin.to(device, self.table_dtype)

    def _build(self, size: int, device: torch.device | None = None) -> None:
        device = self.cos_cached.device if device is None else device
        if device.type == "meta":  # shapes only: to_empty() builds the values
            self.cos_cached = torch.empty(
                size, self.rotary_dim // 2, dtype=self.table_dtype, device=device
            )
            self.sin_cached = torch.empty_like(self.cos_cached)
            return
        positions = torch.arange(size, device="cpu")
        self.cos_cached, self.sin_cached = self._rows(positions, self._table_len, device)

    def reset_parameters(self) -> None:
        """Rebuild the tables from the module's arguments; forget ``"dynamic"``'s length.

        There is nothing learned to reset: the tables follow from the arguments. After a
        build on the ``meta`` device, ``to_empty()`` already rebuilds them; this is for
        code that calls ``reset_parameters`` on every module (FSDP's ``param_init_fn``,
        say), and for starting a new sequence with ``"dynamic"`` scaling.
        """
        self._seq_len = self._table_len = self._original_length()
        self._build(self.cached_positions)

    def cos_sin(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Look up the tables for integer ``positions`` ([..., L] -> [..., L, rotary_dim/2]).

        In eager mode the tables grow (doubling) to cover the largest position, or, for
        a position far past them, the call gets the rows of its positions alone; either
        way this reads the positions on the host (one synchronisation on a GPU). Under
        ``torch.compile`` or ``torch.export`` nothing is read on the host: the tables must
        already cover every position (build them with ``initial_positions=``, or call
        the module once in eager mode), and an asynchronous device-side check raises
        for a negative or uncovered position. ``"dynamic"`` and ``"longrope"`` scaling
        take their frequencies from the largest position of the call, so they run in
        eager mode only: a call that changes them builds new tables if it asks for at
        least half the positions up to its largest (a prefill), else it gets the rows of
        its own positions (a decoding step).

        Raises:
            TypeError: ``positions`` is not an integer tensor.
            ValueError: a position is negative (eager).
            RuntimeError: a position is negative or past the tables (compiled), or
                ``"dynamic"`` or ``"longrope"`` scaling under the compiler.
        """
        check_integer_tensor("positions", positions)
        if torch.compiler.is_compiling():
            return self._lookup_compiled(positions)
        low, high = torch.stack(torch.aminmax(positions)).tolist() if positions.numel() else (0, -1)
        if low < 0:
            raise ValueError(f"positions must be non-negative, got {low}")
        if self.cos_cached.is_meta:  # left on "meta" by load_state_dict(assign=True)
            self._build(self.cached_positions, positions.device)
        elif self.cos_cached.dtype != self.table_dtype:  # cast by hand, not by Module.to
            self._build(self.cached_positions)
        device, needed, requested = self.cos_cached.device, high + 1, positions.numel()
        length = self._table_len
        if self.scaling in _PER_CALL_SCALING and requested:
            length = self._call_length(needed)
        if length != self._table_len:  # new frequencies: the tables are stale
            if needed > 2 * requested:  # a decoding step: its own rows, O(1) per step
                return self._rows(positions, length, device)
            self._table_len = length  # a prefill: a new table, no larger than the call
            self._build(needed)
        elif needed > self.cached_positions:
            size = max(needed, 2 * self.cached_positions)  # doubling
            largest = max(self.cached_positions, requested, TABLE_ROWS_ALWAYS_CACHED)
            if size > 2 * largest:  # far past the tables: this call's rows only
                return self._rows(positions, length, device)
            self._build(size)
        index = positions.to(device)
        return self.cos_cached[index], self.sin_cached[index]

    def cos_sin_axes(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """Multi-axis rows: pair ``j`` of each row at the position of its axis.

        Shapes::

            positions: [..., A] (integer; A = len(sections))
            returns:   (cos, sin), each [..., rotary_dim / 2]

        Raises:
            ValueError: the module has no ``sections``, or ``positions``' last axis is
                not ``A``; else as :meth:`cos_sin`.
        """
        if self.sections is None:
            raise ValueError("positions with an axis dimension need RotaryEmbedding(sections=...)")
        check_integer_tensor("positions", positions)
        if positions.dim() == 0 or positions.shape[-1] != len(self.sections):
            raise ValueError(
                f"positions must end in one index per axis ({len(self.sections)} for sections "
                f"{list(self.sections)}), got shape {tuple(positions.shape)}"
            )
        cos, sin = self.cos_sin(positions)  # [..., A, P]: every pair at every axis
        index = self.pair_axes.to(cos.device).expand(*cos.shape[:-2], 1, -1)
        return cos.gather(-2, index).squeeze(-2), sin.gather(-2, index).squeeze(-2)

    def _call_length(self, needed: int) -> int:
        """The length whose frequencies a call needing positions ``0 .. needed - 1`` uses,
        by Hugging Face's rules (``dynamic_rope_update`` in transformers).

        ``"dynamic"``: the length grows with a call that needs more positions than any
        before, and falls back to the trained length ``L0`` only when a call stays below
        it. ``"longrope"``: ``L0 + 1`` (the long factors) when the call needs more than
        ``L0`` positions, else ``L0`` (the short ones), whatever came before.
        """
        original = self._original_length()
        if self.scaling == "longrope":
            return original + 1 if needed > original else original
        if needed > self._seq_len:
            self._seq_len = needed
        elif needed < original:
            self._seq_len = original
        return self._seq_len

    def _lookup_compiled(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        """The table lookup the compiler sees: no host read, an asynchronous range check."""
        if self.scaling in _PER_CALL_SCALING:
            raise RuntimeError(
                f"RotaryEmbedding(scaling={self.scaling!r}) chooses its frequencies from "
                "the largest position of each call, which torch.compile/torch.export "
                "cannot follow: run it eagerly"
            )
        index = positions.to(self.cos_cached.device)
        covered = (index >= 0).all() & (index < self.cached_positions).all()
        torch._assert_async(
            covered,
            "RotaryEmbedding: a position is negative or past the cached tables; under "
            "torch.compile/torch.export build them first (initial_positions=, or one "
            "eager call)",
        )
        return self.cos_cached[index], self.sin_cached[index]

    def _apply(self, fn: Any, recurse: bool = True) -> RotaryEmbedding:
        # Module.to(torch.bfloat16) casts the buffers, and to_empty() after a build on
        # "meta" leaves them uninitialised: rebuild the tables in table_dtype right away,
        # so that a compiled model never sees rounded or garbage tables.
        was_meta = self.cos_cached.is_meta
        super()._apply(fn, recurse)
        from_meta = was_meta and not self.cos_cached.is_meta
        if from_meta or self.cos_cached.dtype != self.table_dtype:
            self._build(self.cached_positions)
        return self

    def forward(
        self, x: Tensor, position_ids: Tensor, layer_type: str | None = None
    ) -> tuple[Tensor, Tensor]:
        """Hugging Face's rotary call: full-width ``(cos, sin)`` for ``position_ids``.

        The contract of ``LlamaRotaryEmbedding.forward`` in transformers: ``x`` only
        sets the dtype and device of the result; each table has ``rotary_dim`` columns,
        the half-width table repeated so that every feature sees the angle of its pair
        (``cat((cos, cos), -1)`` for ``layout="half"``, ``repeat_interleave(2, -1)``
        for ``"interleaved"``), and carries the scaling's attention factor. With the
        half layout, rotate with transformers' ``apply_rotary_pos_emb`` (it adds the
        head axis) or with ``apply_rope_rotate_half(x, cos[:, None], sin[:, None])``.
        For a bfloat16 ``x`` the tables are rounded to bfloat16, as in transformers,
        which costs accuracy (chapter 9); :meth:`rotate` keeps them in float32.
        ``layer_type`` is the third argument of Gemma 3's and OLMo 3's ``rotary_emb``: a
        module read for one layer type (:meth:`from_hf_config`) refuses another; one
        built otherwise serves any.

        Shapes::

            x:            floating, any shape (only its dtype and device are used)
            position_ids: [B, L] (integer; any [..., L]); with ``sections``, [A, B, L]
                          as Qwen2-VL's and Qwen3-VL's models pass them
            returns:      (cos, sin), each [B, L, rotary_dim], x's dtype and device

        Raises:
            TypeError: ``x`` is not a floating tensor or ``position_ids`` is not an
                integer tensor.
            ValueError: ``position_ids`` is 0-D or has a negative position, or
                ``layer_type`` is not the one the module was read for.
        """
        if layer_type is not None and not isinstance(layer_type, str):
            raise TypeError(f"layer_type must be a str or None, got {type(layer_type).__name__}")
        if layer_type is not None and self.layer_type not in (None, layer_type):
            raise ValueError(
                f"layer_type={layer_type!r}: this RotaryEmbedding holds the tables of "
                f"{self.layer_type!r} layers (RotaryEmbeddingPerLayerType holds one per type)"
            )
        if not isinstance(x, Tensor) or not x.is_floating_point():
            what = x.dtype if isinstance(x, Tensor) else type(x).__name__
            raise TypeError(f"x must be a floating torch.Tensor, got {what}")
        check_integer_tensor("position_ids", position_ids)
        if position_ids.dim() == 0:
            raise ValueError("position_ids must have at least one dimension [..., L]")
        if self.sections is not None and position_ids.dim() == 3:  # transformers' [A, B, L]
            cos, sin = self.cos_sin_axes(position_ids.movedim(0, -1))
        else:
            cos, sin = self.cos_sin(position_ids)
        if self.layout == "half":
            cos, sin = torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)
        else:
            cos, sin = cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)
        return cos.to(x.device, x.dtype), sin.to(x.device, x.dtype)

    def rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """Rotate ``x [B, H, L, head_dim]`` by ``positions [L]`` or ``[B, L]`` (or, with
        ``sections``, ``[B, L, A]``: one index per axis).

        The positions are x's second-to-last axis: give ``[B, L, H, head_dim]`` as
        ``x.transpose(1, 2)``; with ``L == H`` the wrong layout passes every check.

        Raises:
            TypeError: ``x`` is not a tensor, or ``positions`` is not an integer tensor.
            ValueError: ``x``'s last dimension is not ``head_dim``, or ``positions`` does
                not have shape ``[L]`` or ``[B, L]`` for ``x``.
        """
        return self._rotate(x, positions, "x", "positions")

    def _rotate(self, x: Tensor, positions: Tensor, name: str, positions_name: str) -> Tensor:
        if not isinstance(x, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
        if self.sections is not None and isinstance(positions, Tensor) and positions.dim() == 3:
            return self._rotate_axes(x, positions, name, positions_name)
        check_positions(positions_name, positions)
        if x.dim() < 2 or x.shape[-1] != self.head_dim:
            raise ValueError(
                f"{name} of shape {tuple(x.shape)} does not end in head_dim={self.head_dim}, "
                f"the head_dim this RotaryEmbedding was built for"
            )
        batch, length = x.shape[0], x.shape[-2]
        batched = positions.dim() == 2
        if positions.shape[-1] != length or (
            batched and (x.dim() != 4 or positions.shape[0] not in (1, batch))
        ):
            raise ValueError(
                f"{positions_name} must have shape [{length}] or [{batch}, {length}] to rotate "
                f"{name} of shape {tuple(x.shape)} ([B, H, L, head_dim]; transpose "
                f"[B, L, H, head_dim] with .transpose(1, 2)), got {tuple(positions.shape)}"
            )
        cos, sin = self.cos_sin(positions)
        if batched:  # [B, L, r] -> [B, 1, L, r], shared by the heads
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        cos, sin = cos.to(x.device), sin.to(x.device)
        return apply_partial_rope(x, cos, sin, self.layout, compiled=self.compiled)

    def _rotate_axes(self, x: Tensor, positions: Tensor, name: str, positions_name: str) -> Tensor:
        """``_rotate`` for multi-axis positions ``[B or 1, L, A]``."""
        check_integer_tensor(positions_name, positions)
        axes = len(self.sections)
        if x.dim() != 4 or x.shape[-1] != self.head_dim:
            raise ValueError(
                f"{name} must have shape [B, H, L, {self.head_dim}] for multi-axis positions, "
                f"got {tuple(x.shape)}"
            )
        batch, length = x.shape[0], x.shape[-2]
        if positions.shape[0] not in (1, batch) or tuple(positions.shape[1:]) != (length, axes):
            raise ValueError(
                f"{positions_name} must have shape [{batch}, {length}, {axes}] ([B, L, A]) to "
                f"rotate {name} of shape {tuple(x.shape)}, got {tuple(positions.shape)}"
            )
        cos, sin = self.cos_sin_axes(positions)
        cos, sin = cos.unsqueeze(1).to(x.device), sin.unsqueeze(1).to(x.device)
        return apply_partial_rope(x, cos, sin, self.layout, compiled=self.compiled)

    def transform_qk(
        self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Rotate ``q`` by ``q_positions`` and ``k`` by ``k_positions``."""
        return (
            self._rotate(q, q_positions, "q", "q_positions"),
            self._rotate(k, k_positions, "k", "k_positions"),
        )

    def extra_repr(self) -> str:
        layer_type = "" if self.layer_type is None else f", layer_type={self.layer_type!r}"
        if self.sections is not None:
            layer_type += (
                f", sections={list(self.sections)}, section_layout={self.section_layout!r}"
            )
        return (
            f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
            f"layout={self.layout!r}, dtype={self.table_dtype}, scaling={self.scaling!r}, "
            f"scaling_params={self.scaling_params}{layer_type}"
        )


class RotaryEmbeddingPerLayerType(nn.Module):
    """One :class:`RotaryEmbedding` per layer type, as Gemma 3's and OLMo 3's
    ``rotary_emb`` holds one table per type.

    ``module(x, position_ids, layer_type)`` returns that type's ``(cos, sin)``
    (:meth:`RotaryEmbedding.forward`), the call of those models' decoder; as a
    mapping, ``module[layer_type]`` is that type's :class:`RotaryEmbedding`, the
    position scheme for a :class:`~pecode.attention.MultiHeadAttention` of that type.

    Args:
        embeddings: the rotary embedding of each layer type, by name.

    Raises:
        TypeError: a value is not a :class:`RotaryEmbedding`, or a name not a str.
        ValueError: no layer types.
    """

    def __init__(self, embeddings: Mapping[str, RotaryEmbedding]) -> None:
        super().__init__()
        if not isinstance(embeddings, Mapping) or not embeddings:
            raise ValueError("embeddings must be a non-empty dict of layer type -> RotaryEmbedding")
        for name, embedding in embeddings.items():
            if not isinstance(name, str):
                raise TypeError(f"layer types must be str, got {type(name).__name__}")
            if not isinstance(embedding, RotaryEmbedding):
                raise TypeError(
                    f"embeddings[{name!r}] must be a RotaryEmbedding, got "
                    f"{type(embedding).__name__}"
                )
        self.embeddings = nn.ModuleDict(dict(embeddings))

    @classmethod
    def from_hf_config(
        cls, config: Mapping[str, Any] | object, **kwargs: Any
    ) -> RotaryEmbeddingPerLayerType:
        """Every layer type's rotary embedding from a Hugging Face config.

        The layer types are those of the config's blocks per layer type, or of its
        ``layer_types`` (one block for all), or ``"full_attention"`` alone; each is
        :meth:`RotaryEmbedding.from_hf_config` with that ``layer_type``.

        Raises:
            TypeError, ValueError: as :meth:`RotaryEmbedding.from_hf_config`.
        """
        types = hf_layer_types(config)
        return cls(
            {
                name: RotaryEmbedding.from_hf_config(config, layer_type=name, **kwargs)
                for name in types
            }
        )

    def __getitem__(self, layer_type: str) -> RotaryEmbedding:
        if layer_type not in self.embeddings:
            raise KeyError(f"no layer type {layer_type!r}; this module has {list(self.embeddings)}")
        return self.embeddings[layer_type]

    def forward(self, x: Tensor, position_ids: Tensor, layer_type: str) -> tuple[Tensor, Tensor]:
        """That layer type's ``(cos, sin)`` (:meth:`RotaryEmbedding.forward`).

        Raises:
            KeyError: no such layer type.
        """
        return self[layer_type](x, position_ids)
