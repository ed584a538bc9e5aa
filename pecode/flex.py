"""Offset biases inside FlexAttention: ALiBi, T5, KERPLE without an ``Lq×Lk`` tensor.

A bias that depends on the offset ``p_q - p_k`` alone is a table over the offsets that
occur, ``H·(Lq + Lk - 1)`` numbers. FlexAttention (:func:`torch.nn.attention.flex_attention`)
reads that table inside its kernel through a ``score_mod``, and the causal, window,
chunk and padding limits through a block mask, so nothing of size ``Lq×Lk`` is stored;
the dense path of :class:`~pecode.attention.MultiHeadAttention` folds the same bias into
an ``[B, H, Lq, Lk]`` float mask for SDPA. Chapter 12 measures both (section ``ch11-flex``).

What FlexAttention does here (PyTorch 2.13), and what this module does about it:

* it runs compiled (Inductor generates C++ on the CPU, Triton on a GPU); uncompiled it
  computes every score. The first call of each shape compiles for seconds, so the
  lengths, the batch and the table are padded up to powers of two (lengths at least
  128; padded keys are masked, padded queries and rows dropped) and every option is a
  tensor of one layout: a handful of shapes, each compiled once per process and cached
  on disk by Inductor. Past PyTorch's limit of recompiles it would run uncompiled; here
  it raises :class:`FlexRecompileLimit` instead, and the layer takes its dense path;
* on the CPU it has no backward and takes float32, float16 and bfloat16 only:
  :func:`flex_unsupported` says so, and the layer then takes its dense path;
* on the CPU it compiles only from PyTorch 2.9 on (2.7's and 2.8's generated C++ does
  not compile), with ATen's AVX2 or AVX-512 kernels and not on macOS;
  and Inductor's on-disk cache does not tell apart kernels compiled under different
  ``ATEN_CPU_CAPABILITY`` values (reusing an AVX2 kernel under AVX-512 gave wrong
  outputs here), so this module compiles into a folder of that cache per capability;
* on a GPU its backward reaches captured tensors that require grad, such as a learned
  bias table (PyTorch 2.6 and later); not run in this book's CI, which has no GPU.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = [
    "FlexRecompileLimit",
    "MaskMod",
    "ScoreMod",
    "flex_unsupported",
    "limits_mask_mod",
    "offset_bias_attention",
    "offset_range",
    "offset_score_mod",
]

_MIN_BUCKET = 128  # FlexAttention's block size: shorter inputs are padded to one block
_compiled: dict[str, Callable[..., Any]] = {}

ScoreMod = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]
"""FlexAttention's ``score_mod(score, b, h, q_idx, kv_idx) -> score``."""

MaskMod = Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]
"""FlexAttention's ``mask_mod(b, h, q_idx, kv_idx) -> keep`` (bool)."""


class FlexRecompileLimit(RuntimeError):
    """FlexAttention would need one compile more than PyTorch allows in this process."""


def offset_range(q_positions: Tensor, k_positions: Tensor) -> tuple[int, int]:
    """The smallest and largest offset ``p_q - p_k`` over all pairs of positions (over
    the whole batch: a table that covers them serves every row).

    Shapes::

        q_positions: [Lq] or [B, Lq]    k_positions: [Lk] or [B, Lk]   (integer)
    """
    low = int(q_positions.min()) - int(k_positions.max())
    high = int(q_positions.max()) - int(k_positions.min())
    return low, high


def _torch_version() -> tuple[int, int]:
    """PyTorch's (major, minor) version."""
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


def flex_unsupported(q: Tensor, needs_grad: bool) -> str | None:
    """Why FlexAttention cannot compute this call, or ``None`` if it can.

    Shapes::

        q: [B, H, Lq, Dh]
    """
    if importlib.util.find_spec("torch.nn.attention.flex_attention") is None:
        return "this PyTorch has no FlexAttention"
    if q.device.type not in ("cpu", "cuda"):
        return f"FlexAttention runs on the CPU and CUDA, not on {q.device.type}"
    if q.device.type == "cpu":
        if _torch_version() < (2, 9):
            # Inductor's C++ for FlexAttention does not compile in PyTorch 2.7 and 2.8
            # (checked with a bare flex_attention call; 2.9 and 2.13 compile it)
            return f"FlexAttention on the CPU needs PyTorch 2.9 or later, not {torch.__version__}"
        capability = torch.backends.cpu.get_cpu_capability()
        if capability not in ("AVX2", "AVX512") or sys.platform == "darwin":
            # PyTorch compiles FlexAttention for the CPU with AVX2 or AVX-512 only, and
            # not on macOS (torch._inductor.kernel.flex.flex_cpu.check_cpu_supported)
            return f"FlexAttention on the CPU needs AVX2 or AVX-512 off macOS, not {capability}"
        if needs_grad:
            return "FlexAttention has no backward on the CPU"
        if q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            return f"FlexAttention on the CPU takes float32, float16 and bfloat16, not {q.dtype}"
    return None


def _bucket(size: int, smallest: int = _MIN_BUCKET) -> int:
    """``size`` padded up to a power of two, at least ``smallest``."""
    return max(smallest, 1 << (size - 1).bit_length())


def _pad(t: Tensor, length: int, dim: int) -> Tensor:
    """``t`` padded along ``dim`` to ``length`` with copies of its last entry, contiguous."""
    extra = length - t.shape[dim]
    if extra == 0:
        return t.contiguous()
    last = t.narrow(dim, t.shape[dim] - 1, 1)
    return torch.cat([t, last.expand(*t.shape[:dim], extra, *t.shape[dim + 1 :])], dim=dim)


def _compiled_function(name: str) -> Callable[..., Any]:
    """``flex_attention`` or ``create_block_mask``, compiled once per process.

    Static shapes: the buckets keep their number small, and PyTorch 2.13's dynamic-shape
    C++ kernel for FlexAttention failed to compile here (an undeclared variable). An
    uncompiled ``create_block_mask`` evaluates the mask on all query-key pairs.
    """
    if name not in _compiled:
        from torch.nn.attention import flex_attention as module

        _compiled[name] = torch.compile(getattr(module, name), dynamic=False)
    return _compiled[name]


def offset_bias_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    table: Tensor,
    low: int,
    q_positions: Tensor,
    k_positions: Tensor,
    *,
    scale: float,
    causal: bool,
    window: int | None = None,
    chunk: int | None = None,
    attn_mask: Tensor | None = None,
) -> Tensor:
    """``softmax(q·kᵀ·scale + table[h, p_q - p_k - low] + masks) v`` by FlexAttention.

    The masks are those of :class:`~pecode.attention.MultiHeadAttention`: ``causal``
    (the queries are the last ``Lq`` of the ``Lk`` keys), ``window``
    (``|p_q - p_k| < window``), ``chunk`` (``p_q // chunk == p_k // chunk``) and a bool
    ``attn_mask`` (True = may attend). A query that may see no key gets zeros.

    Shapes::

        q: [B, H, Lq, Dh]    k, v: [B, Hkv, Lk, Dh]    table: [H, n] (n offsets from low)
        q_positions: [Lq] or [B, Lq]    k_positions: [Lk] or [B, Lk]   (integer)
        attn_mask: bool, four axes, broadcastable to [B, H, Lq, Lk]
        returns: [B, H, Lq, Dh]

    Raises:
        ValueError: ``table`` does not cover the offsets of the positions.
        TypeError: ``attn_mask`` is not a bool tensor of four axes.
        FlexRecompileLimit: one more compile than PyTorch allows in this process.
    """
    batch, heads, q_len, _ = q.shape
    k_len = k.shape[2]
    _check_call(table, low, q_positions, k_positions, attn_mask)
    # powers of two, so that a new length, batch or offset span is seldom a new shape
    rows, q_pad, k_pad = _bucket(batch, 1), _bucket(q_len), _bucket(k_len)
    q, k, v = (_pad(_pad(t, n, 2), rows, 0) for t, n in ((q, q_pad), (k, k_pad), (v, k_pad)))
    qp = _pad(_pad(q_positions.reshape(-1, q_len).expand(batch, q_len), q_pad, 1), rows, 0)
    kp = _pad(_pad(k_positions.reshape(-1, k_len).expand(batch, k_len), k_pad, 1), rows, 0)
    # contiguous positions span q_len + k_len - 1 offsets: one width per length bucket
    table = table.to(q.dtype)  # as the dense path casts its mask
    width = _bucket(table.shape[1], q_pad + k_pad)
    table = torch.cat([table, table.new_zeros(heads, width - table.shape[1])], 1)
    allowed = _allowed(attn_mask, batch, rows, k_len, q_pad, k_pad, q.device)
    score_mod = offset_score_mod(table, low, qp, kp)
    mask_mod = limits_mask_mod(allowed, qp, kp, k_len - q_len, causal, window, chunk)
    with _compiling():
        block_mask = _compiled_function("create_block_mask")(
            mask_mod, rows, heads, q_pad, k_pad, device=q.device
        )
        out = _compiled_function("flex_attention")(
            q,
            k,
            v,
            score_mod=score_mod,
            block_mask=block_mask,
            scale=scale,
            enable_gqa=k.shape[1] != heads,
        )
    return out[:batch, :, :q_len]


def offset_score_mod(table: Tensor, low: int, qp: Tensor, kp: Tensor) -> ScoreMod:
    """FlexAttention's ``score_mod`` for an offset bias: ``score + table[h, p_q - p_k - low]``.

    Shapes::

        table: [H, n]    qp: [B, Lq]    kp: [B, Lk]   (the positions, integer)
    """
    low_t = qp.new_tensor(low)  # a tensor: a new offset is new data, not a recompile

    def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score + table[h, qp[b, q_idx] - kp[b, kv_idx] - low_t]

    return score_mod


def limits_mask_mod(
    allowed: Tensor,
    qp: Tensor,
    kp: Tensor,
    offset: int,
    causal: bool,
    window: int | None,
    chunk: int | None,
) -> MaskMod:
    """FlexAttention's ``mask_mod``: ``allowed``, the causal limit (query ``i`` sees keys
    up to ``i + offset``), the window ``|p_q - p_k| < window`` and the chunks
    ``p_q // chunk == p_k // chunk``. Each option is a tensor, so that a new value is new
    data for the compiled kernel, not a new kernel.

    Shapes::

        allowed: [B, 1 or H, 1 or Lq, Lk] (bool)    qp: [B, Lq]    kp: [B, Lk]
    """
    as_tensor = qp.new_tensor
    per_head, per_query = (as_tensor(allowed.shape[i] > 1) for i in (1, 2))
    offset_t, is_causal = as_tensor(offset), as_tensor(causal, dtype=torch.bool)
    reach = as_tensor(window if window is not None else 2**62)
    chunked = as_tensor(chunk is not None, dtype=torch.bool)
    chunk_t = as_tensor(chunk or 1)

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        p_q, p_k = qp[b, q_idx], kp[b, kv_idx]
        keep = allowed[b, h * per_head, q_idx * per_query, kv_idx]
        keep = keep & ((p_q - p_k).abs() < reach)
        keep = keep & ((kv_idx <= q_idx + offset_t) | ~is_causal)
        return keep & ((p_q // chunk_t == p_k // chunk_t) | ~chunked)

    return mask_mod


def _check_call(
    table: Tensor, low: int, q_positions: Tensor, k_positions: Tensor, attn_mask: Tensor | None
) -> None:
    high = low + table.shape[-1] - 1
    needed_low, needed_high = offset_range(q_positions, k_positions)
    if needed_low < low or needed_high > high:
        raise ValueError(f"table covers offsets {low} .. {high}, not those of the positions")
    if attn_mask is not None and (attn_mask.dtype != torch.bool or attn_mask.dim() != 4):
        raise TypeError("attn_mask must be a bool tensor with four axes [B, H, Lq, Lk]")


def _allowed(
    attn_mask: Tensor | None,
    batch: int,
    rows: int,
    k_len: int,
    q_pad: int,
    k_pad: int,
    device: torch.device,
) -> Tensor:
    """``attn_mask`` (all True if None) as ``[rows, 1 or H, 1 or q_pad, k_pad]``, the
    padded keys and the padded rows masked."""
    allowed = torch.ones((batch, 1, 1, k_len), dtype=torch.bool, device=device)
    if attn_mask is not None:
        allowed = allowed & attn_mask  # [B, 1 or H, 1 or Lq, Lk]
    allowed = torch.cat([allowed, allowed.new_zeros(*allowed.shape[:3], k_pad - k_len)], -1)
    allowed = _pad(allowed, q_pad, 2) if allowed.shape[2] != 1 else allowed
    return torch.cat([allowed, allowed.new_zeros(rows - batch, *allowed.shape[1:])], 0)


class _compiling:
    """Calls of the compiled functions: torch's deprecation warnings from lazy imports
    silenced, and the recompile limit raised as :class:`FlexRecompileLimit` instead of
    a silent run without compiling (which would compute every score)."""

    def __enter__(self) -> None:
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.simplefilter("ignore", DeprecationWarning)
        import torch._dynamo
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        # Inductor's disk cache does not tell kernels compiled under another ATen CPU
        # capability apart (reusing an AVX2 FlexAttention kernel under AVX-512 gave wrong
        # outputs): these kernels get a folder per capability
        self._cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        capability = torch.backends.cpu.get_cpu_capability()
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(cache_dir(), f"pecode-{capability}")

        config = torch._dynamo.config
        self._patch = (
            config.patch(fail_on_recompile_limit_hit=True)
            if hasattr(config, "fail_on_recompile_limit_hit")
            else contextlib.nullcontext()
        )
        self._patch.__enter__()

    def __exit__(self, kind: type | None, error: BaseException | None, trace: Any) -> None:
        self._patch.__exit__(kind, error, trace)
        self._warnings.__exit__(kind, error, trace)
        if self._cache is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = self._cache
        if error is not None and type(error).__name__ == "FailOnRecompileLimitHit":
            raise FlexRecompileLimit(str(error)) from error
