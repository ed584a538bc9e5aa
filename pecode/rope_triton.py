"""RoPE on CUDA as one Triton kernel: one read and one write of every element.

:mod:`pecode.rope_kernels` sends a CUDA input here when Triton imports (it ships with
PyTorch's CUDA wheels); everything else stays on its eager paths. One program rotates a
block of rows (positions of one head) and the whole head dimension:

* it reads the pair ``(a, b)`` of every feature (``x[j]`` and ``x[j + dim/2]`` in the
  half layout, ``x[2j]`` and ``x[2j + 1]`` interleaved) and the row's ``cos``/``sin``;
* it writes ``(a cos - b sin, a sin + b cos)`` in float32, rounded once to ``x``'s dtype;
* ``conjugate=True`` negates ``sin``: the rotation by ``-θ``, which is the backward.

The tables are broadcast by strides (a stride of 0 where they repeat), so per-batch
position tables ``[B, 1, L, dim/2]`` cost no copy, and ``out`` may be any view whose
last dimension is contiguous: nothing is allocated when the caller passes it.

``tests/test_rope_kernels.py`` checks the kernel against the float64 loop of
:mod:`pecode.reference.rope`, on a GPU and, with ``TRITON_INTERPRET=1``, on the CPU.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl
from torch import Tensor

__all__ = ["launch"]

_ELEMENTS_PER_PROGRAM = 4096  # of x: enough work per program to hide memory latency
_MAX_GRID_Y = 65535  # CUDA's limit on a grid's second axis (the position blocks)


@triton.jit
def _rope_kernel(
    x_ptr,
    cos_ptr,
    sin_ptr,
    out_ptr,
    length,
    heads,
    x_stride_b,
    x_stride_h,
    x_stride_l,
    out_stride_b,
    out_stride_h,
    out_stride_l,
    table_stride_b,
    table_stride_h,
    table_stride_l,
    HALF: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_HALF: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    CONJUGATE: tl.constexpr,
):
    # axis 0: one (batch, head) row; axis 1: a block of positions. Axis 0 runs fastest,
    # so the programs that run together read the same rows of the tables, which then
    # come from the L2 cache, not from memory. Offsets in int64 so that tensors past
    # 2**31 elements stay right.
    row = tl.program_id(0)
    position = tl.program_id(1) * BLOCK_L + tl.arange(0, BLOCK_L)
    batch = (row // heads).to(tl.int64)
    head = (row % heads).to(tl.int64)
    position_64 = position.to(tl.int64)
    x_row = batch * x_stride_b + head * x_stride_h + position_64 * x_stride_l
    out_row = batch * out_stride_b + head * out_stride_h + position_64 * out_stride_l
    table_row = batch * table_stride_b + head * table_stride_h + position_64 * table_stride_l

    pair = tl.arange(0, BLOCK_HALF)
    mask = (position < length)[:, None] & (pair < HALF)[None, :]
    cos = tl.load(cos_ptr + table_row[:, None] + pair[None, :], mask=mask, other=0.0)
    sin = tl.load(sin_ptr + table_row[:, None] + pair[None, :], mask=mask, other=0.0)
    if CONJUGATE:
        sin = -sin
    dtype = out_ptr.dtype.element_ty
    if INTERLEAVED:
        # one contiguous read of each row, then its even and odd features apart
        feature = tl.arange(0, 2 * BLOCK_HALF)
        row_mask = (position < length)[:, None] & (feature < 2 * HALF)[None, :]
        x = tl.load(x_ptr + x_row[:, None] + feature[None, :], mask=row_mask, other=0.0)
        a, b = tl.split(tl.reshape(x.to(tl.float32), (BLOCK_L, BLOCK_HALF, 2)))
        rotated = tl.join(a * cos - b * sin, a * sin + b * cos)
        rotated = tl.reshape(rotated, (BLOCK_L, 2 * BLOCK_HALF)).to(dtype)
        tl.store(out_ptr + out_row[:, None] + feature[None, :], rotated, mask=row_mask)
    else:
        first = pair[None, :]
        second = pair[None, :] + HALF
        a = tl.load(x_ptr + x_row[:, None] + first, mask=mask, other=0.0).to(tl.float32)
        b = tl.load(x_ptr + x_row[:, None] + second, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + out_row[:, None] + first, (a * cos - b * sin).to(dtype), mask=mask)
        tl.store(out_ptr + out_row[:, None] + second, (a * sin + b * cos).to(dtype), mask=mask)


def _frame(t: Tensor) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``t``'s shape and strides as four axes: missing leading axes and axes of size 1
    get stride 0, so that a table broadcasts by its strides alone (no view is made:
    each view costs a microsecond or two of Python, which a decode step notices)."""
    pad = 4 - t.dim()
    shape = (1,) * pad + tuple(t.shape)
    strides = (0,) * pad + tuple(t.stride())
    return shape, tuple(
        0 if size == 1 else stride for size, stride in zip(shape, strides, strict=True)
    )


def launch(
    x: Tensor, cos: Tensor, sin: Tensor, layout: str, out: Tensor, conjugate: bool = False
) -> Tensor:
    """Rotate ``x`` into ``out`` with one kernel launch; returns ``out``.

    The caller (:mod:`pecode.rope_kernels`) has checked what the kernel needs: ``x`` of
    at most four dimensions, float32/bfloat16/float16, last dimension contiguous;
    ``cos`` and ``sin`` float32 of one shape and strides, broadcastable to ``x``
    without growing it, last dimension contiguous; ``out`` of ``x``'s shape and dtype,
    last dimension contiguous, not overlapping ``x``. All on one device (CUDA, or the
    CPU under ``TRITON_INTERPRET=1``).

    Shapes::

        x, out:   [..., L, dim]   (at most 4 dimensions)
        cos, sin: [..., L or 1, dim // 2]
    """
    (batch, heads, length, dim), x_strides = _frame(x)
    _, out_strides = _frame(out)
    _, table_strides = _frame(cos)
    half = dim // 2
    if batch * heads * length == 0 or half == 0:
        return out
    block_half = triton.next_power_of_2(half)
    block_l = min(triton.next_power_of_2(length), max(1, _ELEMENTS_PER_PROGRAM // (2 * block_half)))
    block_l = max(block_l, triton.next_power_of_2(triton.cdiv(length, _MAX_GRID_Y)))
    grid = (batch * heads, triton.cdiv(length, block_l))
    # Triton launches on the current device's stream: make it x's (a model spread over
    # several GPUs calls with tensors on any of them)
    with torch.cuda.device(x.device) if x.is_cuda else contextlib.nullcontext():
        _rope_kernel[grid](
            x,
            cos,
            sin,
            out,
            length,
            heads,
            *x_strides[:3],
            *out_strides[:3],
            *table_strides[:3],
            HALF=half,
            BLOCK_L=block_l,
            BLOCK_HALF=block_half,
            INTERLEAVED=layout == "interleaved",
            CONJUGATE=conjugate,
            num_warps=4,
        )
    return out
