"""T5 (Raffel et al. 2020, §2.1): a learned bias per head and log-spaced offset bucket.

:func:`~pecode.relative.t5_relative_position_bucket` maps ``key - query`` to a bucket,
as in the T5 code; :class:`~pecode.relative.T5RelativePositionBias` is the scheme.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from pecode._checks import check_bool, check_int, check_integer_tensor
from pecode.attention import PositionScheme
from pecode.relative._pairs import pairwise_offsets

__all__ = ["T5RelativePositionBias", "t5_relative_position_bucket"]


def t5_relative_position_bucket(
    relative_position: Tensor,
    bidirectional: bool = True,
    num_buckets: int = 32,
    max_distance: int = 128,
) -> Tensor:
    """T5's bucket for each relative position ``key_position - query_position``.

    Raffel et al. (2020), §2.1, as in the T5 code (Mesh TensorFlow): with
    ``bidirectional`` the buckets are split in half, the upper half for keys after the
    query. Within a half of ``n`` buckets, distances below ``n / 2`` get a bucket each;
    larger ones share logarithmically spaced buckets up to ``max_distance``, and every
    distance beyond falls into the last bucket. Causal (``bidirectional=False``): keys
    after the query all get bucket 0. The log is computed in float32, as in the original.

    Shapes::

        relative_position: [...] (integer)    returns: [...] (int64, in 0 .. num_buckets-1)

    Raises:
        TypeError: ``relative_position`` is not an integer tensor, a count not an int, or
            ``bidirectional`` not a bool.
        ValueError: ``num_buckets`` too small (at least 2, or 4 when bidirectional) or
            ``max_distance`` not larger than the exact range.
    """
    check_integer_tensor("relative_position", relative_position)
    check_bool("bidirectional", bidirectional)
    check_int("num_buckets", num_buckets, 4 if bidirectional else 2)
    check_int("max_distance", max_distance, 1)
    relative_position = relative_position.long()
    if bidirectional:
        half = num_buckets // 2
        offset = (relative_position > 0).long() * half
        distance = relative_position.abs()
    else:
        half = num_buckets
        offset = torch.zeros_like(relative_position)
        distance = (-relative_position).clamp(min=0)  # keys in the future: distance 0
    max_exact = half // 2
    if max_distance <= max_exact:
        raise ValueError(f"max_distance={max_distance} must exceed the exact range {max_exact}")
    # log-spaced buckets from max_exact up to max_distance; clamp avoids log(0) below
    scaled = distance.clamp(min=max_exact).to(torch.float32) / max_exact
    log_ratio = torch.log(scaled) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (half - max_exact)).long()
    large = large.clamp(max=half - 1)
    return offset + torch.where(distance < max_exact, distance, large)


class T5RelativePositionBias(PositionScheme):
    """T5's learned bias per head and relative-position bucket (Raffel et al. 2020, §2.1).

    ``b_h(i, j) = table[bucket(pos_j - pos_i), h]`` is added to the logits; T5 keeps only
    the content term ``q·k`` otherwise. T5 does not divide the logits by ``sqrt(Dh)``
    (its initialization absorbs the factor), so :meth:`logit_scale` is 1 unless
    ``scale_logits=True``.

    Args:
        num_heads: ``H`` (positive).
        bidirectional: encoder (True) or decoder (False) buckets.
        num_buckets, max_distance: as in :func:`t5_relative_position_bucket`.
        scale_logits: divide ``q·k`` by ``sqrt(Dh)`` after all.

    Raises:
        TypeError, ValueError: bad counts or flags, as in
            :func:`t5_relative_position_bucket`, or ``scale_logits`` not a bool.
    """

    score_bias_reads_keys = False  # the bias depends on the positions only

    def __init__(
        self,
        num_heads: int,
        *,
        bidirectional: bool = True,
        num_buckets: int = 32,
        max_distance: int = 128,
        scale_logits: bool = False,
    ) -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads, 1)
        t5_relative_position_bucket(
            torch.zeros(1, dtype=torch.long), bidirectional, num_buckets, max_distance
        )
        self.bidirectional = bidirectional
        self.num_buckets = num_buckets
        self.max_distance = max_distance
        self.scale_logits = check_bool("scale_logits", scale_logits)
        self.bias = nn.Embedding(num_buckets, num_heads)

    def logit_scale(self, head_dim: int) -> float:
        """1 (T5), or ``1/sqrt(head_dim)`` with ``scale_logits=True``."""
        return super().logit_scale(head_dim) if self.scale_logits else 1.0

    def position_bias(self, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """The bias: ``[H, Lq, Lk]``, or ``[B, H, Lq, Lk]`` for batched positions."""
        buckets = t5_relative_position_bucket(
            pairwise_offsets(q_positions, k_positions),
            self.bidirectional,
            self.num_buckets,
            self.max_distance,
        )
        # indexing the [H, buckets] view gives the heads axis first, contiguous: a strided
        # [Lq, Lk, H] view would make CUDA's fused attention copy the mask at every call
        bias = self.bias.weight.t()[:, buckets.to(self.bias.weight.device)]
        return bias if buckets.dim() == 2 else bias.movedim(0, -3)

    def score_bias(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """The learned bias, independent of ``q`` and ``k``."""
        return self.position_bias(q_positions, k_positions)

    def offset_bias(self, q: Tensor, offsets: Tensor) -> Tensor:
        """The bias ``[H, n]`` of each offset ``p_q - p_k`` (FlexAttention's table)."""
        buckets = t5_relative_position_bucket(
            -offsets, self.bidirectional, self.num_buckets, self.max_distance
        )
        return self.bias.weight.t()[:, buckets.to(self.bias.weight.device)]

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, bidirectional={self.bidirectional}, "
            f"num_buckets={self.num_buckets}, max_distance={self.max_distance}, "
            f"scale_logits={self.scale_logits}"
        )
