"""Reference for RoPE: the rotation one feature pair at a time, and explicit matrices."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = [
    "rerope_logits_loop",
    "rope_attention_loop",
    "rope_inv_freq_loop",
    "rope_loop",
    "rope_matrix_loop",
]


def rope_inv_freq_loop(dim: int, base: float = 10000.0) -> list[float]:
    """``θ_i = base^(-2(i-1)/d)`` for ``i = 1 .. d/2`` (RoFormer §3.2.2), as Python floats.

    Raises:
        ValueError: ``dim`` is not positive and even.
    """
    if dim <= 0 or dim % 2:
        raise ValueError(f"dim must be positive and even, got {dim}")
    return [math.pow(base, -2 * (i - 1) / dim) for i in range(1, dim // 2 + 1)]


def rope_matrix_loop(position: float, dim: int, base: float = 10000.0) -> Tensor:
    """The block-diagonal rotation matrix ``R^d_{Θ,m}`` of RoFormer §3.2.2, in float64.

    Block ``i`` (rows and columns ``2i, 2i+1``) is the 2-D rotation by ``m θ_i``;
    this is the interleaved layout, exactly as the paper writes it.

    Shapes::

        returns: [dim, dim](float64)

    Raises:
        ValueError: ``dim`` is not positive and even.
    """
    thetas = rope_inv_freq_loop(dim, base)
    matrix = torch.zeros(dim, dim, dtype=torch.float64)
    for i, theta in enumerate(thetas):
        angle = position * theta
        c, s = math.cos(angle), math.sin(angle)
        matrix[2 * i, 2 * i] = c
        matrix[2 * i, 2 * i + 1] = -s
        matrix[2 * i + 1, 2 * i] = s
        matrix[2 * i + 1, 2 * i + 1] = c
    return matrix


def rope_loop(
    x: Tensor,
    positions: Tensor,
    base: float = 10000.0,
    layout: str = "interleaved",
    *,
    inv_freq: Sequence[float] | None = None,
) -> Tensor:
    """Rotate every feature pair of every token, one scalar at a time, in float64.

    Pair ``i`` is ``(2i, 2i+1)`` for ``layout="interleaved"`` and ``(i, i + d/2)``
    for ``layout="half"``; the pair ``(a, b)`` at position ``m`` becomes
    ``(a cos mθ_i - b sin mθ_i, a sin mθ_i + b cos mθ_i)``, with
    ``θ_i = base^(-2i/d)``, or ``inv_freq[i]`` when given (scaled frequencies, say).

    Shapes::

        x:         [..., L, dim]
        positions: [L]
        inv_freq:  dim // 2 numbers
        returns:   [..., L, dim] (float64, on the CPU)

    Raises:
        ValueError: ``dim`` is odd, ``positions`` does not have length ``L``,
            ``inv_freq`` does not have ``dim // 2`` entries, or ``layout`` is unknown.
    """
    if layout not in ("half", "interleaved"):
        raise ValueError(f"layout must be 'half' or 'interleaved', got {layout!r}")
    length, dim = x.shape[-2], x.shape[-1]
    if tuple(positions.shape) != (length,):
        raise ValueError(f"positions must have shape [{length}], got {tuple(positions.shape)}")
    if dim % 2:
        raise ValueError(f"x's last dimension must be even, got {dim}")
    thetas = rope_inv_freq_loop(dim, base) if inv_freq is None else [float(t) for t in inv_freq]
    if len(thetas) != dim // 2:
        raise ValueError(f"inv_freq must have dim // 2 = {dim // 2} entries, got {len(thetas)}")
    half = dim // 2
    flat = x.detach().double().cpu().reshape(-1, length, dim)
    out = torch.empty_like(flat)
    for row in range(flat.shape[0]):
        for t in range(length):
            m = float(positions[t])
            for i, theta in enumerate(thetas):
                first, second = (2 * i, 2 * i + 1) if layout == "interleaved" else (i, i + half)
                a, b = float(flat[row, t, first]), float(flat[row, t, second])
                c, s = math.cos(m * theta), math.sin(m * theta)
                out[row, t, first] = a * c - b * s
                out[row, t, second] = a * s + b * c
    return out.reshape(x.shape)


def rope_attention_loop(
    module: torch.nn.Module,
    x: Tensor,
    positions: Tensor,
    *,
    base: float = 10000.0,
    layout: str = "half",
    rotary_dim: int | None = None,
    causal: bool = False,
) -> Tensor:
    """Multi-head attention with RoPE on q and k (RoFormer §3.2.2), token by token in float64.

    Uses the projection weights of a :class:`~pecode.attention.MultiHeadAttention`;
    each head's query and key are rotated with :func:`rope_loop` (the first
    ``rotary_dim`` features only, if given), values are not.

    Shapes::

        x:         [B, L, D]
        positions: [L]
        returns:   [B, L, D] (float64, on the CPU)
    """
    batch, length, _ = x.shape
    heads, head_dim = module.num_heads, module.head_dim
    rotary = head_dim if rotary_dim is None else rotary_dim
    xd = x.detach().double().cpu()

    def project(linear: torch.nn.Linear) -> Tensor:
        w = linear.weight.detach().double().cpu()
        b = linear.bias.detach().double().cpu() if linear.bias is not None else 0.0
        return (xd @ w.T + b).reshape(batch, length, heads, head_dim).transpose(1, 2)

    q, k, v = project(module.q_proj), project(module.k_proj), project(module.v_proj)
    q = torch.cat((rope_loop(q[..., :rotary], positions, base, layout), q[..., rotary:]), -1)
    k = torch.cat((rope_loop(k[..., :rotary], positions, base, layout), k[..., rotary:]), -1)
    out = torch.zeros(batch, heads, length, head_dim, dtype=torch.float64)
    for n in range(batch):
        for h in range(heads):
            for i in range(length):
                visible = range(i + 1) if causal else range(length)
                logits = [float(q[n, h, i] @ k[n, h, j]) / math.sqrt(head_dim) for j in visible]
                top = max(logits)
                exps = [math.exp(value - top) for value in logits]
                for j, e in zip(visible, exps, strict=True):
                    out[n, h, i] += e / sum(exps) * v[n, h, j]
    merged = out.transpose(1, 2).reshape(batch, length, heads * head_dim)
    w_o = module.out_proj.weight.detach().double().cpu()
    b_o = module.out_proj.bias.detach().double().cpu() if module.out_proj.bias is not None else 0.0
    return merged @ w_o.T + b_o


def rerope_logits_loop(
    q: Tensor,
    k: Tensor,
    window: int,
    base: float = 10000.0,
    *,
    leak: float | None = None,
    layout: str = "half",
) -> Tensor:
    """ReRoPE's scaled logits, one query, key and pair at a time, in float64.

    Written from Su's reference code (github.com/bojone/rerope, ``rerope_patch.py`` and
    ``leaky_rerope_patch.py``): query ``i`` and key ``j`` at distance ``d = i - j`` are
    scored with RoPE at ``d`` when ``|d| < window``; otherwise at ``±window`` (ReRoPE) or
    ``±(window + (|d| - window) / leak)`` (Leaky ReRoPE), divided by ``sqrt(head_dim)``.
    Pair ``p`` contributes ``(a_q a_k + b_q b_k) cos(d' θ_p) + (a_q b_k - b_q a_k)
    sin(d' θ_p)``, the dot product of ``q`` rotated by ``i`` and ``k`` by ``j``.

    Shapes::

        q, k:    [..., L, Dh] (positions 0 .. L-1)
        returns: [..., L, L] (float64, on the CPU)
    """
    length, dim = q.shape[-2], q.shape[-1]
    qd = q.detach().double().cpu().reshape(-1, length, dim)
    kd = k.detach().double().cpu().reshape(-1, length, dim)
    thetas = [base ** (-2 * p / dim) for p in range(dim // 2)]
    if layout == "half":
        pairs = [(p, p + dim // 2) for p in range(dim // 2)]
    else:
        pairs = [(2 * p, 2 * p + 1) for p in range(dim // 2)]
    out = torch.zeros(qd.shape[0], length, length, dtype=torch.float64)
    for row in range(qd.shape[0]):
        for i in range(length):
            for j in range(length):
                d = i - j
                if abs(d) >= window:
                    size = window if leak is None else window + (abs(d) - window) / leak
                    d = math.copysign(size, d)
                total = 0.0
                for (first, second), theta in zip(pairs, thetas, strict=True):
                    aq, bq = float(qd[row, i, first]), float(qd[row, i, second])
                    ak, bk = float(kd[row, j, first]), float(kd[row, j, second])
                    c, s = math.cos(d * theta), math.sin(d * theta)
                    total += (aq * ak + bq * bk) * c + (aq * bk - bq * ak) * s
                out[row, i, j] = total / math.sqrt(dim)
    return out.reshape(*q.shape[:-2], length, length)
