"""The compiled CPU path of :func:`pecode.rope.apply_rope`: one fused pass, built by Inductor.

pecode ships no compiled code. On the CPU it may still ask PyTorch's own compiler,
``torch.compile`` with Inductor, which writes a C++ loop and builds it with the system's
C++ compiler (``g++``) the first time a kernel is needed. The loop reads each element of
``x`` once and writes it once, where the eager half layout needs three passes
(:mod:`pecode.rope_kernels`). Each kernel is the rotate-half form with the swap of the
pair as a flip of one axis of size 2::

    out = x · cos + flip(x) · (∓sin)     (the sign: − for the first of a pair, + for the second)

with ``x`` seen as ``[..., L, 2, dim/2]`` (half layout: the flip swaps the halves) or
``[..., L, dim/2, 2]`` (interleaved: it swaps neighbours). The arithmetic is float32;
bf16/fp16 results are the float32 rotation rounded once, as in the eager path. A bf16
pair is one 32-bit word, and the interleaved kernel for bf16 rotates words: it widens
each half to float32 by a shift and rounds back to nearest-even on the bits, so that
the compiler can vectorise it (its loop over pairs of 2-byte elements stays scalar).
Training uses :class:`CompiledRotate`, whose backward is the same kernel rotating by
``-θ``: one read and one write of each element in each direction.

**The switch.** :func:`pecode.rope.apply_rope` takes ``compiled=``; ``None`` (the
default) reads the environment variable ``PECODE_ROPE_COMPILE`` (:data:`ENV_VAR`) at
each call above ``pecode.rope_kernels.SMALL_NUMEL`` elements (smaller inputs, a
decoding step among them, stay eager without reading it: there a compiled call, with
its guards and wrappers (a few hundred microseconds on a slow 2-core machine), costs
more than the rotation):

* ``"auto"`` (or unset, or empty): compile only where it pays and cannot surprise:
  a CPU input of at least :data:`AUTO_MIN_NUMEL` elements, more than one position (a
  decoding step never compiles), in a layout and dtype where the eager path needs more
  than one pass (the half layout, and interleaved bf16; interleaved float32 is one
  complex multiplication already), on Linux with a C++ compiler on the ``PATH``. The
  first such call compiles (seconds, once per kernel and process; the kernels are also
  cached on disk by Inductor); later calls of any length reuse it. If the compiler is
  missing or fails, apply_rope stays eager for the rest of the process and says so
  once, as an INFO record of the ``pecode.rope_compiled`` logger (silent unless logging
  is configured) and in :func:`unavailable_reason`; nothing is written to stderr;
* ``"1"`` (``"true"``, ``"on"``, ``"yes"``): use the compiled kernel for every CPU input
  it takes, in both layouts; ``compiled=True`` does so for small inputs too. A missing
  or failing compiler raises ``RuntimeError``;
* ``"0"`` (``"false"``, ``"off"``, ``"no"``) or ``compiled=False``: never compile.

Whatever the switch, the compiled path is skipped (and apply_rope runs its other
paths) where :func:`pecode.rope_kernels.can_rotate` says no (inside ``torch.compile``,
``torch.export`` or ``torch.func`` transforms, tables that need gradients, float64
arithmetic, bf16 tables), off the CPU (CUDA has its Triton kernel), under a
``TorchDispatchMode``, for tensor subclasses, and for shapes and strides outside
:func:`plan`'s few (``x`` contiguous, or ``[B, H, L, dim]`` viewed from
``[B, L, H, dim]`` as attention's split heads give; tables shared by every row or one
per batch row; ``out`` contiguous).

**Few compiled variants.** The lengths, heads and batch are dynamic dimensions, so a
new length does not recompile. One kernel per layout and dtype; within it, a variant
for tables shared or per batch row, for contiguous or split-head ``x``, for sizes of 1
(PyTorch specialises them) and for each thread count (``torch.compile`` guards on
``torch.get_num_threads()``). A kernel stops compiling after :data:`MAX_GRAPHS`
variants (a later new variant runs eagerly), below ``torch._dynamo``'s own recompile
limit, which would otherwise warn on stderr. :func:`compile_count` counts them.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import types
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "AUTO_MIN_NUMEL",
    "ENV_VAR",
    "MAX_GRAPHS",
    "CompiledRotate",
    "compile_count",
    "compiler_missing",
    "plan",
    "resolve_mode",
    "rotate",
    "unavailable_reason",
]

ENV_VAR = "PECODE_ROPE_COMPILE"
"""The environment variable read when ``apply_rope(..., compiled=None)``."""

AUTO_MIN_NUMEL = 2**21
"""``"auto"`` compiles inputs of at least this many elements ([1, 16, 1024, 128], say).

Measured on 2 cores (AMD EPYC, AVX2), compiled against eager in interleaved rounds:
the compiled call carries a fixed cost of a few hundred microseconds there (dynamo's
guards, Inductor's wrapper, the views), so it is slower below about 2^19 elements
(half layout, float32) to 2^21 (interleaved bf16), and from 2^21 up every case that
``"auto"`` takes is faster, forward and forward + backward (half float32: 0.7-0.8x
eager's time; half bf16: 0.3-0.4x; interleaved bf16: about 0.85x)."""

MAX_GRAPHS = 6
"""Compiled variants per kernel (layout and dtype) before new variants run eagerly."""

_ON = ("1", "true", "on", "yes")
_OFF = ("0", "false", "off", "no")
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_PLAIN = (Tensor, torch.nn.Parameter)
_LOG = logging.getLogger(__name__)


class _State:
    """What this process has learnt: why compiling is off, the kernels, the graph count."""

    reason: str | None = None  # why the compiled path is unavailable, once known
    probed = False  # whether the C++ compiler was looked for
    kernels: dict[tuple[str, torch.dtype], Callable[..., Any]] = {}  # noqa: RUF012
    graphs: dict[tuple[str, torch.dtype], int] = {}  # noqa: RUF012


def resolve_mode(compiled: bool | str | None) -> str:
    """``"auto"``, ``"on"`` or ``"off"``: what ``apply_rope(..., compiled=compiled)`` asks.

    ``None`` reads :data:`ENV_VAR` (unset or empty means ``"auto"``), so a notebook can
    set it with ``os.environ`` at any time.

    Raises:
        TypeError: ``compiled`` is not None, a bool or a str.
        ValueError: ``compiled`` is a str other than ``"auto"``, or the environment
            variable holds a value other than auto/1/0 (true/false, on/off, yes/no).
    """
    if compiled is None:
        value = os.environ.get(ENV_VAR, "").strip().lower()
        if value in ("", "auto"):
            return "auto"
        if value in _ON:
            return "on"
        if value in _OFF:
            return "off"
        raise ValueError(
            f"the environment variable {ENV_VAR} must be 'auto', '1' or '0' "
            f"(or true/false, on/off, yes/no), got {os.environ[ENV_VAR]!r}"
        )
    if compiled is True:
        return "on"
    if compiled is False:
        return "off"
    if isinstance(compiled, str):
        if compiled == "auto":
            return "auto"
        raise ValueError(f"compiled must be True, False, 'auto' or None, got {compiled!r}")
    raise TypeError(f"compiled must be a bool, 'auto' or None, got {type(compiled).__name__}")


def unavailable_reason() -> str | None:
    """Why the compiled path is off in this process, or None (it works, or was not needed yet)."""
    return _State.reason


def compile_count() -> int:
    """How many graphs this process has compiled for RoPE (every kernel, every variant)."""
    return sum(_State.graphs.values())


def plan(
    x: Tensor, cos: Tensor, sin: Tensor, out: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor] | None:
    """``x`` and the tables as the kernels take them, or None where the kernels do not apply.

    The kernels take ``x`` as ``[B, H, L, dim]``: contiguous (any number of leading
    axes, merged into ``H``), or attention's split heads (``[B, L, H, dim]`` transposed
    to ``[B, H, L, dim]``); the tables as ``[1, 1, L, dim/2]`` (shared by every row:
    ``[L, dim/2]`` or leading axes of size 1) or ``[B, 1, L, dim/2]`` (one per batch
    row), float32; ``out``, when given, contiguous. A table of one position is
    expanded to ``L`` rows (a small copy).

    Shapes::

        x:        [..., L, dim], float32/bfloat16/float16, on the CPU
        cos, sin: [..., L or 1, dim // 2], float32
        returns:  (x4 [B, H, L, dim], cos4, sin4 [1 or B, 1, L, dim // 2]) or None
    """
    if not (type(x) in _PLAIN and type(cos) in _PLAIN and type(sin) in _PLAIN):
        return None
    if out is not None and (type(out) not in _PLAIN or not out.is_contiguous()):
        return None
    if x.dtype not in _DTYPES or cos.dtype != torch.float32 or sin.dtype != torch.float32:
        return None
    if not (x.is_cpu and cos.is_cpu and sin.is_cpu) or x.numel() == 0:
        return None
    if x.stride(-1) != 1 or torch._C._len_torch_dispatch_stack() > 0:
        return None
    length, dim = x.shape[-2], x.shape[-1]
    split_heads = x.dim() == 4 and x.transpose(1, 2).is_contiguous()
    lead = cos.shape[:-2]
    if all(size == 1 for size in lead):  # one table for every row
        if x.is_contiguous():
            x = x.view(1, -1, length, dim)
        elif not split_heads:
            return None
        cos, sin = cos.reshape(1, 1, -1, dim // 2), sin.reshape(1, 1, -1, dim // 2)
    elif (
        x.dim() == 4
        and cos.dim() == 4
        and cos.shape[0] == x.shape[0]
        and cos.shape[1] == 1
        and (x.is_contiguous() or split_heads)
    ):
        pass  # one table per batch row, shared by the heads
    else:
        return None
    if cos.shape[-2] != length:  # one position for all: give every row its table
        cos = cos.expand(cos.shape[0], 1, length, dim // 2)
        sin = sin.expand(sin.shape[0], 1, length, dim // 2)
    return x, cos.contiguous(), sin.contiguous()


def rotate(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    layout: str,
    out: Tensor | None = None,
    compiled: bool | str | None = None,
) -> Tensor | None:
    """Rotate ``x`` with a compiled kernel, or return None to leave it to the eager paths.

    Called by :func:`pecode.rope_kernels.rotate` for CPU inputs, after
    :func:`~pecode.rope_kernels.can_rotate` and with the tables in the working dtype;
    ``out``, if given, has the result's shape and ``x``'s dtype, and no gradient is
    needed. The switch ``compiled`` is described in the module's docstring.

    Shapes::

        x:        [..., L, dim]
        cos, sin: [..., L or 1, dim // 2], broadcastable against x
        out:      the result's shape (x's), x.dtype
        returns:  the rotated x (out when given), or None

    Raises:
        TypeError, ValueError: a bad ``compiled`` or :data:`ENV_VAR` (:func:`resolve_mode`).
        RuntimeError: ``compiled=True`` (or the variable set to 1) and no working C++
            compiler.
    """
    mode = resolve_mode(compiled)
    if mode == "off":
        return None
    if mode == "auto" and not _pays(x, layout):
        return None
    planned = plan(x, cos, sin, out)
    if planned is None:
        return None
    x4, cos4, sin4 = planned
    key = (layout, x.dtype)
    if _kernel(key, mode) is None:  # unavailable in auto mode, or too many variants
        return None
    try:
        if torch.is_grad_enabled() and x.requires_grad:
            return CompiledRotate.apply(x, cos4, sin4, layout)
        if out is None:
            out = torch.empty(x.shape, dtype=x.dtype)
        return out if _launch(key, x4, cos4, sin4, out.view(x4.shape)) else None
    except _CompileFailed as failed:
        if mode == "on":
            raise RuntimeError(
                f"apply_rope(compiled=True): torch.compile could not build the RoPE kernel "
                f"({failed}); pass compiled=False or set {ENV_VAR}=0 to stay eager"
            ) from failed.__cause__
        return None


class CompiledRotate(torch.autograd.Function):
    """RoPE for training on the compiled kernel: the backward is the kernel rotating by ``-θ``.

    ``CompiledRotate.apply(x, cos4, sin4, layout)`` with the tables as :func:`plan`
    gives them. Forward and backward each read and write every element once; the
    backward treats the tables as constants (``apply_rope`` falls back to autograd
    when they need gradients) and is itself a ``CompiledRotate`` when a graph of the
    backward is asked for (second derivatives).
    """

    @staticmethod
    def forward(x: Tensor, cos4: Tensor, sin4: Tensor, layout: str) -> Tensor:
        """The kernel into a new contiguous tensor of ``x``'s shape."""
        return _rotate_any(x, cos4, sin4, layout)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        """Keep the tables and the layout (``x`` itself is not needed)."""
        _, cos4, sin4, layout = inputs
        ctx.save_for_backward(cos4, sin4)
        ctx.layout = layout

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        """``grad`` rotated by ``-θ``: the same kernel with ``sin`` negated."""
        cos4, sin4 = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: record it
            return CompiledRotate.apply(grad, cos4, -sin4, ctx.layout), None, None, None
        return _rotate_any(grad, cos4, -sin4, ctx.layout, backward=True), None, None, None


def _rotate_any(x: Tensor, cos4: Tensor, sin4: Tensor, layout: str, backward: bool = False):
    """The kernel on ``x`` of any strides, into a new contiguous tensor of ``x``'s shape.

    A gradient may come in any layout: it is copied first unless contiguous or split
    heads. Where the compiled kernel cannot run (too many variants; in the backward, a
    compiler that failed) its formula runs eagerly instead; a compiler failure in the
    forward propagates (``rotate`` decides what it means).
    """
    if not x.is_contiguous() and not (x.dim() == 4 and x.transpose(1, 2).is_contiguous()):
        x = x.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype)
    x4 = x.view(1, -1, *x.shape[-2:]) if x.is_contiguous() and cos4.shape[0] == 1 else x
    key, out4 = (layout, x.dtype), out.view(x4.shape)
    try:
        if _launch(key, x4, cos4, sin4, out4):
            return out
    except _CompileFailed:
        if not backward:
            raise
    _launch(key, x4, cos4, sin4, out4, eager=True)
    return out


def _pays(x: Tensor, layout: str) -> bool:
    """``"auto"``'s rule: large, more than one position, eager needs several passes, Linux."""
    return (
        x.numel() >= AUTO_MIN_NUMEL
        and x.shape[-2] > 1
        and (layout == "half" or x.dtype == torch.bfloat16)
        and sys.platform.startswith("linux")
    )


class _CompileFailed(Exception):
    """The compiler failed: the message says why; ``__cause__`` is its exception."""


def compiler_missing() -> str | None:
    """Why Inductor cannot build C++ here (no compiler on the PATH), or None."""
    compiler = os.environ.get("CXX") or ("clang++" if sys.platform == "darwin" else "g++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler: {compiler!r} is not on the PATH (set CXX to use another)"
    return None


def _give_up(reason: str) -> None:
    """Stay eager for the rest of the process, and say so once (no stderr)."""
    if _State.reason is None:
        _State.reason = reason
        _LOG.info("pecode: apply_rope stays eager: %s", reason)


def _kernel(key: tuple[str, torch.dtype], mode: str) -> Callable[..., Any] | None:
    """The compiled kernel for ``key`` (built lazily), or None where it may not be used."""
    if not _State.probed:
        _State.probed = True
        missing = compiler_missing()
        if missing is not None:
            _give_up(missing)
    if _State.reason is not None:
        if mode == "on":
            raise RuntimeError(
                f"apply_rope(compiled=True): the compiled RoPE kernel is unavailable "
                f"({_State.reason}); pass compiled=False or set {ENV_VAR}=0 to stay eager"
            )
        return None
    if _State.graphs.get(key, 0) >= MAX_GRAPHS:
        return None
    kernel = _State.kernels.get(key)
    if kernel is None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's own deprecations in its lazy imports
            kernel = _State.kernels[key] = _build(key)
    return kernel


def _launch(
    key: tuple[str, torch.dtype],
    x4: Tensor,
    cos4: Tensor,
    sin4: Tensor,
    out4: Tensor,
    *,
    eager: bool = False,
) -> bool:
    """Run the kernel of ``key`` (``out4`` = ``x4`` rotated); False if it may not run.

    ``eager=True`` runs the kernel's formula without compiling it (a few passes).

    Raises:
        _CompileFailed: the compiler failed (the process stays eager from now on).
    """
    kernel = _State.kernels.get(key)
    may_run = _State.reason is None and _State.graphs.get(key, 0) < MAX_GRAPHS
    if not eager and (kernel is None or not may_run):
        return False
    # as the kernel sees them: one graph, for tensors without gradients
    x4, cos4, sin4 = x4.detach(), cos4.detach(), sin4.detach()
    half = x4.shape[-1] // 2
    source = _source(key)
    if source is _half_kernel:
        args = (x4.unflatten(-1, (2, half)), cos4.unsqueeze(-2), sin4.unsqueeze(-2))
        target = out4.unflatten(-1, (2, half))
    elif source is _interleaved_bf16_kernel and not eager:
        try:  # a pair is one 32-bit word, if the pairs start at even offsets
            args, target = (x4.view(torch.int32), cos4, sin4), out4.view(torch.int32)
        except RuntimeError:
            return False
    else:  # interleaved float kernel; eagerly, for bf16 too
        source = _interleaved_kernel
        args = (x4.unflatten(-1, (half, 2)), cos4.unsqueeze(-1), sin4.unsqueeze(-1))
        target = out4.unflatten(-1, (half, 2))
    if eager:
        with torch.no_grad():
            source(*args, target)
        return True
    from torch._dynamo import maybe_mark_dynamic

    for t in (args[0], target):  # batch, heads, length: any size without recompiling
        for axis in range(3):
            maybe_mark_dynamic(t, axis)
    for t in args[1:]:  # the tables' batch and length
        maybe_mark_dynamic(t, 0)
        maybe_mark_dynamic(t, 2)
    try:
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch's own deprecations while it compiles
            kernel(*args, target)
    except Exception as err:
        reason = f"{type(err).__name__}: {err}".splitlines()[0][:300]
        _give_up(f"torch.compile failed ({reason})")
        raise _CompileFailed(reason) from err
    return True


# The kernels, as torch.compile traces them. x and out are viewed so that the pair is one
# axis of size 2 (half: [..., 2, dim/2]; interleaved: [..., dim/2, 2]); the flip of that
# axis swaps the two features of each pair and the sign, -1 for the first and +1 for the
# second, comes from an iota: no table but cos and sin is read.


def _half_kernel(x: Tensor, cos: Tensor, sin: Tensor, out: Tensor) -> None:
    """x, out: [B, H, L, 2, h]; cos, sin: [1 or B, 1, L, 1, h]."""
    sign = torch.arange(2, dtype=torch.float32).mul(2).sub(1).unsqueeze(-1)  # [[-1], [1]]
    out.copy_(x.float() * cos + x.flip(-2).float() * (sin * sign))


def _interleaved_kernel(x: Tensor, cos: Tensor, sin: Tensor, out: Tensor) -> None:
    """x, out: [B, H, L, h, 2]; cos, sin: [1 or B, 1, L, h, 1]."""
    sign = torch.arange(2, dtype=torch.float32).mul(2).sub(1)  # [-1, 1]
    out.copy_(x.float() * cos + x.flip(-1).float() * (sin * sign))


def _bf16_bits(value: Tensor) -> Tensor:
    """float32 -> the bits of the nearest bf16 (ties to even; NaN -> 0x7FC0), in int32."""
    bits = torch.where(value != value, 0x7FC00000, value.view(torch.int32))
    return ((bits + ((bits >> 16) & 1) + 0x7FFF) >> 16) & 0xFFFF


def _interleaved_bf16_kernel(words: Tensor, cos: Tensor, sin: Tensor, out: Tensor) -> None:
    """words, out: [B, H, L, h] int32, one bf16 pair (a, b) each; cos, sin: [1 or B, 1, L, h]."""
    a = (words << 16).view(torch.float32)  # the low half: bf16 -> float32 is a shift
    b = (words & -65536).view(torch.float32)  # the high half, 0xFFFF0000
    out.copy_(_bf16_bits(a * cos - b * sin) | (_bf16_bits(a * sin + b * cos) << 16))


def _source(key: tuple[str, torch.dtype]) -> Callable[..., None]:
    """The kernel function of ``key``, as Python (what ``torch.compile`` traces).

    bf16 pairs are rotated as 32-bit words where the first element of a pair is the low
    half of its word (little-endian machines: x86, Arm as Linux runs it).
    """
    layout, dtype = key
    if layout == "half":
        return _half_kernel
    if dtype == torch.bfloat16 and sys.byteorder == "little":
        return _interleaved_bf16_kernel
    return _interleaved_kernel


def _build(key: tuple[str, torch.dtype]) -> Callable[..., Any]:
    """``torch.compile`` the kernel of ``key``, with its own code object and graph count.

    Dynamo keeps compiled variants per code object, so each key gets a copy of its
    function's code (and its own recompile limit). The backend is Inductor, counting
    the graphs it builds; the interleaved float kernels leave vectorisation to the C++
    compiler (``cpp.simdlen=1``), which handles the size-2 inner axis better.
    """
    from torch._inductor.compile_fx import compile_fx  # seconds to import: only when needed

    layout, dtype = key
    source = _source(key)
    options: dict[str, Any] = {"compile_threads": 1}  # compile in this process: no worker pool
    if source is _interleaved_kernel:
        options["cpp.simdlen"] = 1
    name = f"rope_{layout}_{str(dtype).removeprefix('torch.')}"
    names = {"co_name": name, **({"co_qualname": name} if sys.version_info >= (3, 11) else {})}
    function = types.FunctionType(source.__code__.replace(**names), source.__globals__, name)

    def backend(graph: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        _State.graphs[key] = _State.graphs.get(key, 0) + 1
        return compile_fx(graph, example_inputs, config_patches=options)

    return torch.compile(function, backend=backend, fullgraph=True, dynamic=False)
