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
Training uses an autograd Function whose backward is the same kernel rotating by
``-θ``: one read and one write of each element in each direction.

**The switch.** :func:`pecode.rope.apply_rope` takes ``compiled=``; ``None`` (the
default) reads the environment variable ``PECODE_ROPE_COMPILE`` (:data:`ENV_VAR`) at
each call, and a bad value raises there, whatever the size. Only inputs above
``pecode.rope_kernels.SMALL_NUMEL`` elements follow it (smaller inputs, a decoding step
among them, stay eager: there a compiled call, with its guards and wrappers (a few
hundred microseconds on a slow 2-core machine), costs more than the rotation):

* ``"auto"`` (or unset, or empty): compile only where it pays and cannot surprise:
  a CPU input of at least :data:`AUTO_MIN_NUMEL` elements, more than one position (a
  decoding step never compiles), in a layout and dtype where the eager path needs more
  than one pass (the half layout, and interleaved bf16; interleaved float32 is one
  complex multiplication already), on Linux with a C++ compiler on the ``PATH``. A call
  compiles (seconds; Inductor also caches the build on disk, so that a later process
  mostly loads it) the first time it meets a new variant (below); later calls of the
  same variant, at any length, reuse it. If the compiler is missing or fails to build a
  kernel, apply_rope stays eager for the rest of the process and says so once, as an
  INFO record of the ``pecode.rope_compiled`` logger (silent unless logging is
  configured; the compiler's full message is a DEBUG record) and in
  :func:`unavailable_reason`; nothing is written to stderr. Any other error (a bad
  input, memory) is raised as it is and changes nothing;
* ``"1"`` (``"true"``, ``"on"``, ``"yes"``): use the compiled kernel for every CPU input
  it takes, in both layouts; ``compiled=True`` does so for small inputs too. A missing
  or failing compiler raises ``RuntimeError``;
* ``"0"`` (``"false"``, ``"off"``, ``"no"``) or ``compiled=False``: never compile.

Whatever the switch, the compiled path is skipped (and apply_rope runs its other
paths) where :func:`pecode.rope_kernels.can_rotate` says no (inside ``torch.compile``,
``torch.export`` or ``torch.func`` transforms, tables that need gradients, float64
arithmetic, bf16 tables), off the CPU (CUDA has its Triton kernel), under a
``TorchDispatchMode`` or a ``TorchFunctionMode`` (``torch.set_default_device`` and
``with torch.device(...)`` among them), for tensor subclasses, and for shapes and
strides outside the few the kernels take: ``x`` contiguous, or ``[B, H, L, dim]`` viewed
from ``[B, L, H, dim]`` as attention's split heads give; tables shared by every row
(``[L, dim/2]``, or leading axes of size 1, no more axes than ``x``) or one per batch
row (``[B, 1, L, dim/2]``); ``out`` contiguous. In the interleaved layout, a bf16 ``x``
whose pairs do not start at even offsets (an odd storage offset) is rotated eagerly.

**Compiled variants.** The lengths, heads and batch are dynamic dimensions, so a new
length does not recompile. There is one kernel per layout and dtype, and within it a
graph per variant that ``torch.compile`` tells apart: tables shared or per batch row,
contiguous or split-head ``x`` (a gradient in backward may bring a layout of its own),
sizes of 1 (PyTorch specialises them), each thread count (it guards on
``torch.get_num_threads()``), inference mode. Each new variant compiles once per
process. A kernel compiles at most :data:`MAX_GRAPHS` variants (or
``torch._dynamo.config.recompile_limit``, if lower, so that dynamo never warns on
stderr): past that, the variants it has keep running compiled and a new one runs the
kernel's formula eagerly. :func:`compile_count` counts the graphs, :func:`run_count`
the calls that ran one.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading
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
    "compile_count",
    "compiler_missing",
    "resolve_mode",
    "run_count",
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
"""Compiled variants per kernel (layout and dtype); a new variant past them runs eagerly."""

_ON = ("1", "true", "on", "yes")
_OFF = ("0", "false", "off", "no")
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_PLAIN = (Tensor, torch.nn.Parameter)
_LOG = logging.getLogger(__name__)
_LOCK = threading.RLock()  # held while a kernel is built and while a counter changes


class _State:
    """What this process has learnt: why compiling is off, the kernels, the counters."""

    reason: str | None = None  # why the compiled path is unavailable, once known
    probed = False  # whether the C++ compiler was looked for
    kernels: dict[tuple[str, torch.dtype], Callable[..., Any]] = {}  # noqa: RUF012
    graphs: dict[tuple[str, torch.dtype], int] = {}  # noqa: RUF012
    runs: dict[tuple[str, torch.dtype], int] = {}  # noqa: RUF012
    env: tuple[str, str] = ("", "auto")  # the last value of ENV_VAR read, and its mode


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
        raw = os.environ.get(ENV_VAR, "")
        last, mode = _State.env
        if raw == last:  # checked already: a decoding step pays a lookup, not the parsing
            return mode
        value = raw.strip().lower()
        if value in ("", "auto"):
            mode = "auto"
        elif value in _ON:
            mode = "on"
        elif value in _OFF:
            mode = "off"
        else:
            raise ValueError(
                f"the environment variable {ENV_VAR} must be 'auto', '1' or '0' "
                f"(or true/false, on/off, yes/no), got {raw!r}"
            )
        _State.env = (raw, mode)
        return mode
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


def run_count() -> int:
    """How many kernel calls ran a compiled graph in this process (not those that ran eagerly)."""
    return sum(_State.runs.values())


def compiler_missing() -> str | None:
    """Why Inductor cannot build C++ here (no compiler on the PATH), or None."""
    compiler = os.environ.get("CXX") or ("clang++" if sys.platform == "darwin" else "g++")
    if shutil.which(compiler) is None:
        return f"no C++ compiler: {compiler!r} is not on the PATH (set CXX to use another)"
    return None


def _modes_active() -> bool:
    """Whether a dispatch or function mode (a default device among them) would see the ops."""
    return torch._C._len_torch_dispatch_stack() > 0 or torch._C._len_torch_function_stack() > 0


def _split_heads(x: Tensor) -> bool:
    """Whether ``x`` is ``[B, H, L, dim]`` viewed from a contiguous ``[B, L, H, dim]``."""
    return x.dim() == 4 and x.transpose(1, 2).is_contiguous()


def _plan(
    x: Tensor, cos: Tensor, sin: Tensor, out: Tensor | None = None
) -> tuple[Tensor, Tensor, Tensor] | None:
    """``x`` and the tables as the kernels take them, or None where the kernels do not apply.

    The kernels take ``x`` as ``[B, H, L, dim]``: contiguous (any number of leading
    axes, merged into ``H``), or attention's split heads (``[B, L, H, dim]`` transposed
    to ``[B, H, L, dim]``); the tables as ``[1, 1, L, dim/2]`` (shared by every row:
    ``[L, dim/2]`` or leading axes of size 1) or ``[B, 1, L, dim/2]`` (one per batch
    row), float32; ``out``, when given, contiguous. A table of one position is
    expanded to ``L`` rows (a small copy). Tables with more axes than ``x`` are left to
    the eager paths: the result would have their shape, not ``x``'s.

    Shapes::

        x:        [..., L, dim], float32/bfloat16/float16, on the CPU
        cos, sin: [..., L or 1, dim // 2], float32, the same shape
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
    if x.stride(-1) != 1 or _modes_active():
        return None
    length, dim = x.shape[-2], x.shape[-1]
    if dim % 2 or cos.shape[-1] != dim // 2 or sin.shape != cos.shape or cos.dim() > x.dim():
        return None
    split_heads = _split_heads(x)
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


def _rotate(
    x: Tensor,
    cos: Tensor,
    sin: Tensor,
    layout: str,
    out: Tensor | None = None,
    compiled: bool | str | None = None,
) -> Tensor | None:
    """Rotate ``x`` with a compiled kernel, or return None to leave it to the eager paths.

    Called by :func:`pecode.rope_kernels.rotate` for CPU inputs, after ``apply_rope``
    checked the arguments (``layout`` is ``"half"`` or ``"interleaved"``) and
    :func:`~pecode.rope_kernels.can_rotate`, with the tables in the working dtype;
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
    planned = _plan(x, cos, sin, out)
    if planned is None:
        return None
    x4, cos4, sin4 = planned
    key = (layout, x.dtype)
    strict = mode == "on"  # a failing compiler raises; in "auto" the eager paths take over
    try:
        if _kernel(key, strict) is None:  # unavailable in auto mode
            return None
        if torch.is_grad_enabled() and x.requires_grad:
            return _CompiledRotate.apply(x, cos4, sin4, layout, strict)
        if out is None:
            out = torch.empty_like(x, memory_format=torch.contiguous_format)
        return out if _launch(key, x4, cos4, sin4, out.view(x4.shape)) else None
    except _CompileFailed as failed:
        if strict:
            raise RuntimeError(
                f"apply_rope(compiled=True): torch.compile could not build the RoPE kernel "
                f"({failed}); pass compiled=False or set {ENV_VAR}=0 to stay eager"
            ) from failed.__cause__
        return None


class _CompiledRotate(torch.autograd.Function):
    """RoPE for training on the compiled kernel: the backward is the kernel rotating by ``-θ``.

    ``_CompiledRotate.apply(x, cos4, sin4, layout, strict)`` with the tables as
    :func:`_plan` gives them. Forward and backward each read and write every element
    once; the backward treats the tables as constants (``apply_rope`` falls back to
    autograd when they need gradients) and is itself a ``_CompiledRotate`` when a graph
    of the backward is asked for (second derivatives). ``strict``: a compiler failure
    in the forward raises :class:`_CompileFailed` (``compiled=True``), where otherwise
    the kernel's formula runs eagerly, as it always does in the backward.
    """

    @staticmethod
    def forward(x: Tensor, cos4: Tensor, sin4: Tensor, layout: str, strict: bool) -> Tensor:
        """The kernel into a new contiguous tensor of ``x``'s shape."""
        return _rotate_any(x, cos4, sin4, layout, strict)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: Tensor) -> None:
        """Keep the tables and the layout (``x`` itself is not needed)."""
        _, cos4, sin4, layout, _ = inputs
        ctx.save_for_backward(cos4, sin4)
        ctx.layout = layout

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor | None, ...]:
        """``grad`` rotated by ``-θ``: the same kernel with ``sin`` negated."""
        cos4, sin4 = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph=True: record it
            rotated = _CompiledRotate.apply(grad, cos4, -sin4, ctx.layout, False)
        else:
            rotated = _rotate_any(grad, cos4, -sin4, ctx.layout, strict=False)
        return rotated, None, None, None, None


def _rotate_any(x: Tensor, cos4: Tensor, sin4: Tensor, layout: str, strict: bool) -> Tensor:
    """The kernel on ``x`` of any strides, into a new contiguous tensor of ``x``'s shape.

    A gradient may come in any layout: it is copied first unless contiguous or split
    heads. Where the compiled kernel cannot run (the compiler failed, a mode is active,
    bf16 pairs at odd offsets) its formula runs eagerly instead; with ``strict``, a
    compiler failure propagates (``_rotate`` turns it into a RuntimeError).
    """
    if not x.is_contiguous() and not _split_heads(x):
        x = x.contiguous()
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    x4 = x.view(1, -1, *x.shape[-2:]) if x.is_contiguous() and cos4.shape[0] == 1 else x
    key, out4 = (layout, x.dtype), out.view(x4.shape)
    try:
        if _launch(key, x4, cos4, sin4, out4):
            return out
    except _CompileFailed:
        if strict:
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


def _build_errors() -> tuple[type[BaseException], ...]:
    """The exceptions by which ``torch.compile`` says that it could not build a kernel."""
    from torch._dynamo.exc import BackendCompilerFailed  # InductorError is one, in 2.13
    from torch._inductor import exc

    inductor_error = getattr(exc, "InductorError", exc.CppCompileError)  # new in torch 2.7
    return BackendCompilerFailed, exc.CppCompileError, inductor_error


def _failed(err: BaseException) -> _CompileFailed:
    """Stay eager from now on because of ``err`` (logged in full at DEBUG), and say why."""
    summary = f"{type(err).__name__}: {err}".splitlines()[0][:300]
    _LOG.debug("pecode: torch.compile failed to build a RoPE kernel", exc_info=err)
    _give_up(f"torch.compile failed ({summary})")
    return _CompileFailed(summary)


def _give_up(reason: str) -> None:
    """Stay eager for the rest of the process, and say so once (no stderr)."""
    with _LOCK:
        if _State.reason is not None:
            return
        _State.reason = reason
    _LOG.info("pecode: apply_rope stays eager: %s", reason)


def _kernel(key: tuple[str, torch.dtype], strict: bool) -> Callable[..., Any] | None:
    """The compiled kernel for ``key`` (built lazily), or None where it may not be used.

    Raises:
        RuntimeError: ``strict`` and the compiler is missing or failed before.
        _CompileFailed: building the kernel failed.
    """
    if not _State.probed:
        missing = compiler_missing()
        _State.probed = True
        if missing is not None:
            _give_up(missing)
    if _State.reason is not None:
        if strict:
            raise RuntimeError(
                f"apply_rope(compiled=True): the compiled RoPE kernel is unavailable "
                f"({_State.reason}); pass compiled=False or set {ENV_VAR}=0 to stay eager"
            )
        return None
    kernel = _State.kernels.get(key)
    if kernel is None:
        with _LOCK:  # one build per kernel, whichever thread asks first
            kernel = _State.kernels.get(key)
            if kernel is None:
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")  # torch's deprecations in lazy imports
                        kernel = _State.kernels[key] = _build(key)
                except Exception as err:  # torch.compile itself is unusable here
                    raise _failed(err) from err
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
    if not eager and (kernel is None or _State.reason is not None or _modes_active()):
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
    if eager:  # the kernels' iota on x's device, whatever the default device
        with torch.no_grad(), torch.device(x4.device):
            source(*args, target)
        return True
    from torch._dynamo import config, maybe_mark_dynamic

    for t in (args[0], target):  # batch, heads, length: any size without recompiling
        for axis in range(3):
            maybe_mark_dynamic(t, axis)
    for t in args[1:]:  # the tables' batch and length
        maybe_mark_dynamic(t, 0)
        maybe_mark_dynamic(t, 2)
    graphs = _State.graphs.get(key, 0)
    try:
        with torch.no_grad():
            if graphs >= min(MAX_GRAPHS, config.recompile_limit):
                # the variants compiled so far still run; a new one runs eagerly, silently
                with torch.compiler.set_stance("eager_on_recompile"):
                    kernel(*args, target)
            elif graphs == 0:  # the first call compiles: torch's lazy imports may warn
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    kernel(*args, target)
            else:
                kernel(*args, target)
    except Exception as err:
        if isinstance(err, _build_errors()):
            raise _failed(err) from err
        raise  # not the compiler: a bad input, or memory
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
    """``torch.compile`` the kernel of ``key``, with its own code object and counters.

    Dynamo keeps compiled variants per code object, so each key gets a copy of its
    function's code (and its own recompile limit). The backend is Inductor, counting
    the graphs it builds and the calls that run them; the interleaved float kernels
    leave vectorisation to the C++ compiler (``cpp.simdlen=1``), which handles the
    size-2 inner axis better.
    """
    from torch._inductor.compile_fx import compile_fx  # seconds to import: only when needed

    layout, dtype = key
    source = _source(key)
    options: dict[str, Any] = {
        "compile_threads": 1,  # compile in this process: no worker pool
        # Inductor's FX graph cache keys a graph without the vector ISA that
        # ATEN_CPU_CAPABILITY picks: a kernel generated for AVX-512 and read back under
        # avx2 ran with no error and gave wrong numbers (torch 2.13; under "default" it
        # failed to compile). The C++ code cache, keyed by the compiler's flags, stays on.
        "fx_graph_cache": False,
    }
    if source is _interleaved_kernel:
        options["cpp.simdlen"] = 1
    name = f"rope_{layout}_{str(dtype).removeprefix('torch.')}"
    names = {"co_name": name, **({"co_qualname": name} if sys.version_info >= (3, 11) else {})}
    function = types.FunctionType(source.__code__.replace(**names), source.__globals__, name)

    def backend(graph: torch.fx.GraphModule, example_inputs: list) -> Callable[..., Any]:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a new variant compiles: torch may warn meanwhile
            compiled = compile_fx(graph, example_inputs, config_patches=options)
        with _LOCK:
            _State.graphs[key] = _State.graphs.get(key, 0) + 1

        def run(*args: Any) -> Any:
            with _LOCK:
                _State.runs[key] = _State.runs.get(key, 0) + 1
            return compiled(*args)

        run._boxed_call = getattr(compiled, "_boxed_call", False)  # type: ignore[attr-defined]
        return run

    return torch.compile(function, backend=backend, fullgraph=True, dynamic=False)
