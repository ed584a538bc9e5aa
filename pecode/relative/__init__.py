"""Relative position encodings: Shaw et al., Transformer-XL/XLNet, T5 and DeBERTa.

A package with one module per scheme, each name importable from ``pecode.relative``
itself:

- ``pecode.relative.shaw``: Shaw et al.'s relation vectors, in the direct form and the
  memory-efficient one;
- ``pecode.relative.transformer_xl``: Transformer-XL/XLNet, with the relative shift;
- ``pecode.relative.t5``: T5's buckets and learned bias;
- ``pecode.relative.deberta``: DeBERTa, in the paper's form and the released code's.

Each method is a set of pure functions over per-head tensors plus a thin
:class:`~pecode.attention.PositionScheme` that holds its parameters, so it runs inside
:class:`~pecode.attention.MultiHeadAttention`:

========================================  ==========================================
scheme                                     hooks it uses
========================================  ==========================================
:class:`ShawRelativePosition`              ``score_bias`` (key term), ``output_term``
                                           (value term)
:class:`TransformerXLRelativePosition`     ``score_bias`` (terms (b), (c), (d); with
                                           ``causal=True`` only the causal part)
:class:`T5RelativePositionBias`            ``score_bias`` (a learned bias per bucket),
                                           ``logit_scale`` (1, as in T5)
:class:`DebertaRelativePosition`           ``score_bias`` (c2p + p2c, as the released
                                           code indexes them), ``logit_scale``
                                           (``1/sqrt(3 d)``)
========================================  ==========================================

Shapes use ``B`` batch, ``H`` heads, ``Lq``/``Lk`` query/key lengths, ``Dh`` head
dimension. Positions are integer tensors ``[L]`` (shared by the batch) or ``[B, L]``.
"""

from __future__ import annotations

from pecode.relative.deberta import (
    DebertaRelativePosition,
    deberta_attention,
    deberta_log_bucket,
    deberta_position_terms,
    deberta_relative_index,
    deberta_table_rows,
)
from pecode.relative.shaw import (
    ShawRelativePosition,
    shaw_key_logits,
    shaw_key_logits_naive,
    shaw_relative_index,
    shaw_value_term,
    shaw_value_term_naive,
)
from pecode.relative.t5 import T5RelativePositionBias, t5_relative_position_bucket
from pecode.relative.transformer_xl import (
    TransformerXLRelativePosition,
    relative_distances,
    relative_shift,
    sinusoidal_relative_encoding,
    transformer_xl_position_terms,
)

__all__ = [
    "DebertaRelativePosition",
    "ShawRelativePosition",
    "T5RelativePositionBias",
    "TransformerXLRelativePosition",
    "deberta_attention",
    "deberta_log_bucket",
    "deberta_position_terms",
    "deberta_relative_index",
    "deberta_table_rows",
    "relative_distances",
    "relative_shift",
    "shaw_key_logits",
    "shaw_key_logits_naive",
    "shaw_relative_index",
    "shaw_value_term",
    "shaw_value_term_naive",
    "sinusoidal_relative_encoding",
    "t5_relative_position_bucket",
    "transformer_xl_position_terms",
]
