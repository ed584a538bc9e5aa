"""Helpers for the tests of pecode.relative: a layer's per-head projections."""

from __future__ import annotations

import torch

from pecode.attention import MultiHeadAttention


def heads(x: torch.Tensor, layer: MultiHeadAttention, which: str) -> torch.Tensor:
    """Per-head projections of ``x`` with the layer's own weights: ``[B, H, L, Dh]``."""
    projection = getattr(layer, f"{which}_proj")
    batch, length, _ = x.shape
    out = projection(x).view(batch, length, layer.num_heads, layer.head_dim)
    return out.transpose(1, 2)
