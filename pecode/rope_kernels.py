"""The fast paths of :func:`pecode.rope.apply_rope`: the same rotation in fewer passes over memory.

:mod:`pecode.rope` holds the math of RoPE; this module holds what makes it fast, and
nothing here changes a result beyond float rounding (``tests/test_rope_kernels.py``
compares every path with the float64 loop of :mod:`pecode.reference.rope`). RoPE is
memory-bound (chapter 12): each element is read once, multiplied by two table entries
and written once, so its speed is set by the passes over ``x`` and by the calls that
Python makes, not by the arithmetic.

:func:`pecode.rope.apply_rope` asks :func:`can_rotate` whether this module may run,
and :func:`rotate` picks the path:

* **CUDA**, when Triton imports: one kernel of :mod:`pecode.rope_triton` for any size,
  one read and one write of each element, with or without gradients (the backward is
  the same kernel rotating by ``-θ``), into ``out`` when given;
* **the CPU, compiled**: where ``apply_rope``'s switch ``compiled`` (by default the
  environment variable ``PECODE_ROPE_COMPILE``, ``"auto"``) asks for it, one kernel
  that ``torch.compile`` builds, forward and backward (:mod:`pecode.rope_compiled`);
  ``"auto"`` takes large half-layout and bf16 inputs, never a decoding step, and only
  while a C++ compiler works;
* **small inputs** otherwise (a decode step: one token, every head): :func:`rotate_small`,
  the element-wise formula in the fewest PyTorch calls, because there the calls, not
  the memory, cost the time; differentiable;
* **gradients for x only** (training): :class:`RotateFunction`, a
  :class:`torch.autograd.Function` whose forward is the no-grad kernel and whose
  backward is the same kernel rotating by ``-θ`` (the transpose of a rotation is its
  inverse; flash-attn's rotary backward is its forward with ``conjugate=True``);
* **no gradient** (inference): :func:`rotate_no_grad`, optionally into a caller's
  ``out`` tensor so that nothing is allocated.

:func:`can_rotate` says no, and ``apply_rope`` runs its own element-wise formula, when
the tables need gradients, when the arithmetic would be narrower than float32 (bf16
tables: chapter 9 reproduces that arithmetic), under ``torch.compile`` or
``torch.export`` (the compiler fuses the formula itself) and under ``torch.func``
transforms or forward-mode AD (the formula is made of ordinary operators they know).

The eager no-grad kernel (the CPU, and CUDA without Triton): interleaved pairs are
adjacent, so the rotation is one complex multiplication, one pass over memory;
half-layout pairs are ``dim/2`` apart, which no single PyTorch operator can pair up, so
it takes three operations (``x · [cos, cos]``, then ``- b sin`` and ``+ a sin`` on the
halves), run one cache-sized block of positions at a time so that the last two find the
block still in the cache. bf16/fp16 inputs are rotated in a float32 block buffer and
rounded once.
"""

from __future__ import annotations

import importlib.util
import math
from typing import Any

import torch
import torch.autograd.forward_ad as forward_ad
from torch import Tensor

from pecode import rope_compiled

__all__ = [
    "RotateFunction",
    "can_rotate",
    "overlaps",
    "rotate",
    "rotate_no_grad",
    "rotate_small",
]

_WIDE = (torch.float32, torch.float64)

SMALL_NUMEL = 2**15
"""Inputs with at most this many elements take :func:`rotate_small` (Python calls dominate)."""

_CACHE_BLOCK_BYTES = 2**20  # one block of x: small enough to stay in a core's L2 cache
_BUFFER_BYTES = 2**22  # float32 scratch for bf16/fp16 inputs: fits the last-level cache


def can_rotate(x: Tensor, cos: Tensor, sin: Tensor) -> bool:
    """Whether this module may rotate ``x``; otherwise ``apply_rope`` uses its formula.

    False under ``torch.compile``/``torch.export`` (the compiler fuses the element-wise
    formula; the kernels' stride checks and ``out=`` calls would break its graph), under
    ``torch.func`` transforms and forward-mode AD, when ``cos`` or ``sin`` needs a
    gradient, and when the working dtype (the wider of ``x``'s and the tables') is
    narrower than float32. Cheap: a few attribute reads, no loop.
    """
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        return False
    if forward_ad._current_level >= 0:  # inside a forward-mode AD level
        return False
    if torch.is_grad_enabled() and (cos.requires_grad or sin.requires_grad):
        return False
    if x.dtype == cos.dtype:
        return x.dtype in _WIDE
    return torch.promote_types(x.dtype, cos.dtype) in _WIDE


def rotate(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    layout: str,
    out: Tensor | None = None,
    compiled: bool | str | None = None,
) -> Tensor:
    """Rotate ``x`` as :func:`pecode.rope.apply_rope` does, on the fastest path that applies.

    ``apply_rope`` has checked the arguments and :func:`can_rotate`; ``out``, if given,
    has the result's shape and ``x``'s dtype and no gradient is needed. On the CPU,
    the compiled kernel (:mod:`pecode.rope_compiled`) is asked first, with the switch
    ``compiled``, except for small inputs (at most ``SMALL_NUMEL`` elements) unless
    ``compiled=True``: a decoding step stays eager, whatever the environment variable says.

    Shapes::

        x:        [..., L, dim]
        cos, sin: [..., L or 1, dim // 2], broadcastable against x
        out:      the broadcast shape [..., L, dim], x.dtype
        returns:  the broadcast shape, x.dtype
    """
    work = cos.dtype if x.dtype == cos.dtype else torch.promote_types(x.dtype, cos.dtype)
    if cos.dtype != work:
        cos = cos.to(work)
    if sin.dtype != work:
        sin = sin.to(work)
    if x.is_cpu and (compiled is True or (compiled is not False and x.numel() > SMALL_NUMEL)):
        rotated = rope_compiled._rotate(x, cos, sin, layout, out, compiled)
        if rotated is not None:
            return rotated
    if x.numel() <= SMALL_NUMEL and not _use_triton(x, cos, sin, out):
        rotated = rotate_small(x, cos, sin, layout)
        return rotated if out is None else out.copy_(rotated)
    if torch.is_grad_enabled() and x.requires_grad:
        if cos.dim() > 2 and _result_shape(x, cos) != x.shape:
            return rotate_small(x, cos, sin, layout)  # x broadcast to more rows: autograd sums
        return RotateFunction.apply(x, cos, sin, layout)
    return rotate_no_grad(x, cos, sin, layout, out=out)


def rotate_small(
    x: Tensor, cos: Tensor, sin: Tensor, layout: str, *, conjugate: bool = False
) -> Tensor:
    """The rotation in the fewest PyTorch calls, for inputs where each call costs more than memory.

    Half layout: ``x · [cos, cos] + roll(x, dim/2) · [-sin, sin]`` (the rotate-half form
    with the roll doing the swap); interleaved: complex multiplication by
    ``cos + i sin``. Computed in the tables' dtype, returned in ``x``'s; differentiable.
    ``conjugate=True`` rotates by ``-θ``.

    Shapes::

        x: [..., L, dim]    cos, sin: [..., L or 1, dim // 2]    returns: broadcast shape
    """
    if conjugate:
        sin = -sin
    wide = x if x.dtype == cos.dtype else x.to(cos.dtype)
    half = x.shape[-1] // 2
    if layout == "half":
        cos_full = torch.cat((cos, cos), dim=-1)
        sin_full = torch.cat((-sin, sin), dim=-1)
        rotated = torch.mul(wide, cos_full).addcmul_(wide.roll(half, -1), sin_full)
    else:
        try:
            pairs = torch.view_as_complex(wide.unflatten(-1, (half, 2)))
        except RuntimeError:  # pairs not at even offsets: copy first
            fresh = wide.clone(memory_format=torch.contiguous_format)
            pairs = torch.view_as_complex(fresh.unflatten(-1, (half, 2)))
        rotated = torch.view_as_real(pairs * torch.complex(cos, sin)).flatten(-2)
    return rotated if rotated.dtype == x.dtype else rotated.to(x.dtype)


class RotateFunction(torch.autograd.Function):
    """RoPE with a hand-written gradient: the backward is the rotation by ``-θ``.

    ``y = R(θ) x`` with ``R`` orthogonal, so ``∂L/∂x = R(θ)ᵀ ∂L/∂y = R(-θ) ∂L/∂y``: the
    backward calls the same kernel as the forward with ``sin`` negated, and allocates
    nothing but the gradient. It treats ``cos`` and ``sin`` as constants (use
    :func:`pecode.rope.apply_rope`, which falls back to autograd when they need
    gradients). The backward is itself a :class:`RotateFunction`, so second derivatives
    work too.

    ``RotateFunction.apply(x, cos, sin, layout, conjugate=False)`` with ``cos``/``sin``
    already in the working dtype and shaped so that the result has ``x``'s shape.
    """

    @staticmethod
    def forward(
        x: Tensor, cos: Tensor, sin: Tensor, layout: str, conjugate: bool = False
    ) -> Tensor:
        """The no-grad kernel (:func:`rotate_no_grad`); ``conjugate=True`` rotates by ``-θ``."""
        return rotate_no_grad(x, cos, sin, layout, conjugate=conjugate)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        """Keep the tables and the layout for the backward (``x`` itself is not needed)."""
        _, cos, sin, layout, *rest = inputs
        ctx.save_for_backward(cos, sin)
        ctx.layout, ctx.conjugate = layout, bool(rest[0]) if rest else False

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        """The gradient for ``x``: ``grad`` rotated the other way, by the same Function."""
        cos, sin = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: record it, for second derivatives
            grad_x = RotateFunction.apply(grad, cos, sin, ctx.layout, not ctx.conjugate)
        else:  # the usual backward: the kernel alone, without a Function's bookkeeping
            grad_x = rotate_no_grad(grad, cos, sin, ctx.layout, conjugate=not ctx.conjugate)
        return grad_x, None, None, None, None


def rotate_no_grad(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    layout: str,
    *,
    out: Tensor | None = None,
    conjugate: bool = False,
) -> Tensor:
    """The rotation without autograd, in as few passes over memory as eager PyTorch allows.

    Arithmetic in the tables' dtype (float32 or float64), one rounding to ``x``'s dtype.
    Writes into ``out`` when given (any strides, not overlapping ``x``), else into a new
    tensor. ``conjugate=True`` rotates by ``-θ`` (the backward of the rotation).

    Shapes::

        x:        [..., L, dim]
        cos, sin: [..., L or 1, dim // 2], float32 or float64, broadcastable against x
        out:      the broadcast shape, x.dtype
        returns:  out, or a new tensor of the broadcast shape and x.dtype
    """
    if _use_triton(x, cos, sin, out):
        if out is None:
            out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
        return _triton().launch(x, cos, sin, layout, out, conjugate)
    sign = -1.0 if conjugate else 1.0
    if out is None:
        out = torch.empty(_result_shape(x, cos), dtype=x.dtype, device=x.device)
    if x.dtype == cos.dtype:
        _rotate_in_blocks(x, cos, sin, layout, out, sign)
    else:
        _rotate_narrow(x, cos, sin, layout, out, sign)
    return out


def overlaps(a: Tensor, b: Tensor) -> bool:
    """Whether two tensors may share an element: their byte spans in one storage meet.

    Conservative (strided views that interleave without touching count as overlapping);
    False for tensor subclasses other than parameters (fake tensors have no storage).
    """
    plain = (Tensor, torch.nn.Parameter)
    if type(a) not in plain or type(b) not in plain or a.device != b.device:
        return False
    if a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr():
        return False
    (a0, a1), (b0, b1) = _byte_span(a), _byte_span(b)
    return a0 < b1 and b0 < a1


def _byte_span(t: Tensor) -> tuple[int, int]:
    extent = sum((size - 1) * abs(stride) for size, stride in zip(t.shape, t.stride(), strict=True))
    return t.data_ptr(), t.data_ptr() + (extent + 1) * t.element_size()


def _result_shape(x: Tensor, cos: Tensor) -> torch.Size:
    if cos.dim() <= 2:
        return x.shape
    return torch.Size((*torch._C._infer_size(x.shape[:-1], cos.shape[:-1]), x.shape[-1]))


def _rows_per_block(out: Tensor, block_bytes: int, element_size: int | None = None) -> int:
    """Positions per block so that one block of ``out`` holds about ``block_bytes``."""
    length = out.shape[-2]
    if not out.is_cpu or length == 0:
        return max(length, 1)  # one block: a GPU has no cache to fit
    row_bytes = out.numel() // length * (element_size or out.element_size())
    return max(1, block_bytes // max(row_bytes, 1))


def _blocks(t: Tensor, rows: int, length: int) -> list[Tensor] | tuple[Tensor, ...]:
    """``t`` split into blocks of ``rows`` positions (the same block for every block if t has 1)."""
    if t.shape[-2] == 1 and length > 1:
        return [t] * math.ceil(length / rows)
    return t.split(rows, dim=-2)


def _blocks_of(x: Tensor, cos: Tensor, sin: Tensor, out: Tensor, rows: int):
    """Matching blocks of ``rows`` positions of ``x``, the tables and ``out``."""
    length = out.shape[-2]
    return zip(
        _blocks(x, rows, length),
        _blocks(cos, rows, length),
        _blocks(sin, rows, length),
        out.split(rows, dim=-2),
        strict=True,
    )


def _rotate_in_blocks(
    x: Tensor, cos: Tensor, sin: Tensor, layout: str, out: Tensor, sign: float
) -> None:
    """Rotate ``x`` (the tables' dtype) into ``out``, by cache-sized blocks of positions."""
    length = out.shape[-2]
    if layout == "half":
        cos = torch.cat((cos, cos), dim=-1)  # full width: the first pass runs over whole rows
        rows = _rows_per_block(out, _CACHE_BLOCK_BYTES)
        for xb, cb, sb, ob in _blocks_of(x, cos, sin, out, rows):
            _rotate_half_block(xb, cb, sb, ob, sign)
        return
    rotor = torch.complex(cos, sin if sign > 0 else -sin)  # e^{±imθ}, a small table
    target = _complex_pairs(out)
    pairs = _complex_pairs(x) if x.dtype == out.dtype and x.shape == out.shape else None
    if pairs is not None and target is not None:  # one pass over the whole tensor
        torch.mul(pairs, rotor, out=target)
        return
    rows = _rows_per_block(out, _CACHE_BLOCK_BYTES)  # a copy first: keep it in the cache
    for xb, rb, ob in zip(
        _blocks(x, rows, length), _blocks(rotor, rows, length), out.split(rows, dim=-2), strict=True
    ):
        _rotate_interleaved_block(xb, rb, ob)


def _rotate_half_block(x: Tensor, cos_full: Tensor, sin: Tensor, out: Tensor, sign: float) -> None:
    """Half layout, three passes: ``(a cos, b cos)``, then ``- b sin`` and ``+ a sin``."""
    half = x.shape[-1] // 2
    a, b = x.split(half, dim=-1)
    out_a, out_b = out.split(half, dim=-1)
    torch.mul(x, cos_full, out=out)
    out_a.addcmul_(b, sin, value=-sign)  # a cos - b sin
    out_b.addcmul_(a, sin, value=sign)  # b cos + a sin


def _complex_pairs(t: Tensor) -> Tensor | None:
    """``t``'s adjacent pairs as complex numbers (a view), or None where strides forbid it."""
    try:
        return torch.view_as_complex(t.unflatten(-1, (t.shape[-1] // 2, 2)))
    except RuntimeError:
        return None


def _rotate_interleaved_block(x: Tensor, rotor: Tensor, out: Tensor) -> None:
    """Interleaved layout: copy a block of ``x`` into ``out``, multiply its pairs in place."""
    target = _complex_pairs(out)
    if target is None:  # out's pairs are not adjacent at even offsets: rotate elsewhere
        out.copy_(_rotate_complex(x, rotor))
        return
    out.copy_(x)
    target.mul_(rotor)


def _rotate_complex(x: Tensor, rotor: Tensor) -> Tensor:
    pairs = _complex_pairs(x)
    if pairs is None:
        pairs = _complex_pairs(x.clone(memory_format=torch.contiguous_format))
    return torch.view_as_real(pairs * rotor).flatten(-2)


def _rotate_narrow(
    x: Tensor, cos: Tensor, sin: Tensor, layout: str, out: Tensor, sign: float
) -> None:
    """bf16/fp16 ``x``: rotate a block of positions at a time in a float32 buffer, round once.

    No full-size float32 tensor is allocated; each element is rounded to ``x``'s dtype
    once, so the result is the float32 rotation rounded, as the element-wise form gives.
    """
    length = out.shape[-2]
    rows = min(_rows_per_block(out, _BUFFER_BYTES, cos.element_size()), length)
    buffer = torch.empty((*out.shape[:-2], rows, out.shape[-1]), dtype=cos.dtype, device=x.device)
    for xb, cb, sb, ob in _blocks_of(x, cos, sin, out, rows):
        scratch = buffer[..., : ob.shape[-2], :]
        _rotate_in_blocks(xb, cb, sb, layout, scratch, sign)
        ob.copy_(scratch)  # the one rounding to x's dtype


_TRITON: dict[str, Any] = {}
_TRITON_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_PLAIN = (Tensor, torch.nn.Parameter)


def _triton():
    """:mod:`pecode.rope_triton`, or None where Triton is missing or failed to import."""
    if "module" not in _TRITON:
        module = None
        if importlib.util.find_spec("triton") is not None:
            try:
                from pecode import rope_triton as module
            except Exception:  # an unusable Triton install: the eager paths still work
                module = None
        _TRITON["module"] = module
    return _TRITON["module"]


def _triton_device(x: Tensor) -> bool:
    """Whether ``x`` lives where the kernel runs (CUDA; tests point it at Triton's
    CPU interpreter)."""
    return x.is_cuda


def _use_triton(x: Tensor, cos: Tensor, sin: Tensor, out: Tensor | None = None) -> bool:
    """Whether the Triton kernel rotates ``x``: a CUDA input of a shape and strides it takes.

    It takes ``x`` of at most four dimensions in float32/bfloat16/float16, with float32
    tables of one shape and strides that do not broadcast ``x`` to more rows, each with
    a contiguous last dimension (``out`` too). Not under a ``TorchDispatchMode`` (a fake
    or a tracking mode would not see the kernel's reads and writes).
    """
    return (
        _triton_device(x)
        and type(x) in _PLAIN  # a subclass (DTensor, say) may hold no local storage
        and x.dtype in _TRITON_DTYPES
        and cos.dtype == sin.dtype == torch.float32
        and x.dim() <= 4
        and cos.dim() <= x.dim()
        and cos.shape == sin.shape
        and cos.stride() == sin.stride()
        and _result_shape(x, cos) == x.shape
        and x.stride(-1) == 1
        and cos.stride(-1) == 1
        and (out is None or out.stride(-1) == 1)
        and torch._C._len_torch_dispatch_stack() == 0
        and _triton() is not None
    )
