"""Offset biases inside FlexAttention: ALiBi, T5, KERPLE without an ``Lq×Lk`` tensor.

A bias that depends on the offset ``p_q - p_k`` alone is a table over the offsets that
occur, ``H·(Lq + Lk - 1)`` numbers. FlexAttention (:func:`torch.nn.attention.flex_attention`)
reads that table inside its kernel through a ``score_mod``, and the causal, window,
chunk and padding limits through a block mask, so nothing of size ``Lq×Lk`` is stored;
the dense path of :class:`~pecode.attention.MultiHeadAttention` folds the same bias into
an ``[B, H, Lq, Lk]`` float mask for SDPA. Chapter 11 measures both.

What FlexAttention does here (PyTorch 2.13), and what this module does about it:

* it runs compiled (Inductor generates C++ on the CPU, Triton on a GPU); uncompiled it
  computes every score and warns. The first call of each shape compiles for seconds, so
  lengths are padded up to a power of two (at least 128; padded keys are masked, padded
  queries dropped): a handful of shapes, each compiled once per process and cached on
  disk by Inductor;
* on the CPU it has no backward and takes float32, float16 and bfloat16 only:
  :func:`flex_unsupported` says so, and the layer then takes its dense path;
* on a GPU its backward reaches captured tensors that require grad, such as a learned
  bias table (PyTorch 2.6 and later); not run in this book's CI, which has no GPU.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

__all__ = ["flex_unsupported", "offset_bias_attention", "offset_range"]

_MIN_BUCKET = 128  # FlexAttention's block size: shorter inputs are padded to one block
_compiled: dict[str, Callable[..., Any]] = {}


def offset_range(q_positions: Tensor, k_positions: Tensor) -> tuple[int, int]:
    """The smallest and largest offset ``p_q - p_k`` over all pairs (each row its own).

    Shapes::

        q_positions: [Lq] or [B, Lq]    k_positions: [Lk] or [B, Lk]   (integer)
    """
    low = int(q_positions.min()) - int(k_positions.max())
    high = int(q_positions.max()) - int(k_positions.min())
    return low, high


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
        if needs_grad:
            return "FlexAttention has no backward on the CPU"
        if q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
            return f"FlexAttention on the CPU takes float32, float16 and bfloat16, not {q.dtype}"
    return None


def _bucket(length: int) -> int:
    """``length`` padded up to a power of two of at least one block."""
    return max(_MIN_BUCKET, 1 << (length - 1).bit_length())


def _pad_seq(t: Tensor, length: int, dim: int) -> Tensor:
    """``t`` padded along ``dim`` to ``length`` with copies of its last entry."""
    extra = length - t.shape[dim]
    if extra == 0:
        return t
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
        attn_mask: bool, broadcastable to [B, H, Lq, Lk] with four axes
        returns: [B, H, Lq, Dh]

    Raises:
        ValueError: ``table`` does not cover the offsets of the positions.
    """
    batch, heads, q_len, _ = q.shape
    k_len = k.shape[2]
    high = low + table.shape[-1] - 1
    needed_low, needed_high = offset_range(q_positions, k_positions)
    if needed_low < low or needed_high > high:
        raise ValueError(f"table covers offsets {low} .. {high}, not those of the positions")
    q_pad, k_pad = _bucket(q_len), _bucket(k_len)
    q, k, v = (_pad_seq(t, n, 2) for t, n in ((q, q_pad), (k, k_pad), (v, k_pad)))
    qp = _pad_seq(q_positions.reshape(-1, q_len), q_pad, 1).expand(batch, q_pad)
    kp = _pad_seq(k_positions.reshape(-1, k_len), k_pad, 1).expand(batch, k_pad)
    table = table.to(q.dtype)
    # every option is a tensor and every closure has one form, so that a new length,
    # offset or option is new data for the compiled kernel, not a recompile
    allowed = attn_mask if attn_mask is not None else q.new_ones((1, 1, 1, 1), dtype=torch.bool)
    allowed = allowed.expand(*allowed.shape[:3], k_len)  # padded keys: never seen
    allowed = torch.cat([allowed, allowed.new_zeros(*allowed.shape[:3], k_pad - k_len)], -1)
    allowed = _pad_seq(allowed, q_pad, 2) if allowed.shape[2] != 1 else allowed
    allowed = allowed.expand(batch, heads, q_pad, k_pad)
    as_tensor = q.new_tensor
    low_t = as_tensor(low, dtype=torch.int64)
    offset = as_tensor(k_len - q_len, dtype=torch.int64)  # causal: i sees keys <= i + offset
    is_causal = as_tensor(causal, dtype=torch.bool)
    reach = as_tensor(window if window is not None else 2**62, dtype=torch.int64)
    chunked = as_tensor(chunk is not None, dtype=torch.bool)
    chunk_t = as_tensor(chunk if chunk is not None else 1, dtype=torch.int64)

    def score_mod(score: Tensor, b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return score + table[h, qp[b, q_idx] - kp[b, kv_idx] - low_t]

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        p_q, p_k = qp[b, q_idx], kp[b, kv_idx]
        keep = allowed[b, h, q_idx, kv_idx] & ((p_q - p_k).abs() < reach)
        keep = keep & ((kv_idx <= q_idx + offset) | ~is_causal)
        return keep & ((p_q // chunk_t == p_k // chunk_t) | ~chunked)

    with warnings.catch_warnings():  # a first call compiles: torch's lazy imports may warn
        warnings.simplefilter("ignore")
        block_mask = _compiled_function("create_block_mask")(
            mask_mod, batch, heads, q_pad, k_pad, device=q.device
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
    return out[:, :, :q_len]
