"""Reference for attention itself: multi-head attention, one scalar at a time."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from pecode.attention import MultiHeadAttention

__all__ = ["multi_head_attention_loop"]


def multi_head_attention_loop(
    module: MultiHeadAttention,
    x: Tensor,
    *,
    causal: bool = False,
    bias: Tensor | None = None,
    value_bias: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """Multi-head attention (Vaswani et al. 2017, eq. 1 and §3.2.2), token by token in float64.

    Uses the projection weights of ``module`` and ignores its position scheme; the
    arguments below can stand in for one.

    Shapes::

        x:          [B, L, D]
        bias:       [H, L, L], added to the scaled logits
        value_bias: [L, L, Dh], vector r_ij added to value j for query i (Shaw et al.)
        returns:    [B, L, D] (float64, on the CPU)

    ``scale`` multiplies ``q·k`` (default ``1/sqrt(Dh)``).

    Raises:
        ValueError: ``x`` does not have shape ``[B, L, module.embed_dim]``, or ``bias``
            is not ``[H, L, L]``, or ``value_bias`` is not ``[L, L, Dh]``.
    """
    if x.dim() != 3 or x.shape[-1] != module.embed_dim:
        raise ValueError(f"x must have shape [B, L, {module.embed_dim}], got {tuple(x.shape)}")
    batch, length, _ = x.shape
    heads, head_dim = module.num_heads, module.head_dim
    if bias is not None and tuple(bias.shape) != (heads, length, length):
        raise ValueError(
            f"bias must have shape [{heads}, {length}, {length}], got {tuple(bias.shape)}"
        )
    if value_bias is not None and tuple(value_bias.shape) != (length, length, head_dim):
        raise ValueError(
            f"value_bias must have shape [{length}, {length}, {head_dim}], "
            f"got {tuple(value_bias.shape)}"
        )
    scale = 1 / math.sqrt(head_dim) if scale is None else scale

    def weights(linear: torch.nn.Linear) -> tuple[list[list[float]], list[float]]:
        w = linear.weight.detach().double().cpu().tolist()
        b = linear.bias.detach().double().cpu().tolist() if linear.bias is not None else None
        return w, b if b is not None else [0.0] * len(w)

    def project(linear: torch.nn.Linear, vector: list[float]) -> list[float]:
        w, b = weights(linear)
        return [sum(w[o][i] * vector[i] for i in range(len(vector))) + b[o] for o in range(len(w))]

    xs = x.detach().double().cpu().tolist()
    out = torch.zeros(batch, length, module.embed_dim, dtype=torch.float64)
    for n in range(batch):
        qs = [project(module.q_proj, xs[n][t]) for t in range(length)]
        ks = [project(module.k_proj, xs[n][t]) for t in range(length)]
        vs = [project(module.v_proj, xs[n][t]) for t in range(length)]
        for i in range(length):
            concat = []
            for h in range(heads):
                lo, hi = h * head_dim, (h + 1) * head_dim
                visible = range(i + 1) if causal else range(length)
                logits = {}
                for j in visible:
                    dot = sum(qs[i][c] * ks[j][c] for c in range(lo, hi))
                    logits[j] = dot * scale
                    if bias is not None:
                        logits[j] += float(bias[h, i, j])
                top = max(logits.values())
                exps = {j: math.exp(value - top) for j, value in logits.items()}
                total = sum(exps.values())
                head_out = [0.0] * head_dim
                for j, e in exps.items():
                    for c in range(head_dim):
                        extra = float(value_bias[i, j, c]) if value_bias is not None else 0.0
                        head_out[c] += e / total * (vs[j][lo + c] + extra)
                concat += head_out
            out[n, i] = torch.tensor(project(module.out_proj, concat), dtype=torch.float64)
    return out
