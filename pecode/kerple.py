"""KERPLE: kernelized relative positional biases (Chi et al., NeurIPS 2022; page 6.1).

Each head adds to the logit of query ``i`` and key ``j`` a bias that falls with the
distance ``d = |i - j|``, from a conditionally positive definite kernel with two learned
parameters per head (§4 of the paper):

* logarithmic: ``-r1 · log(1 + r2 · d)``, ``r1, r2 > 0``;
* power: ``-r1 · d ** r2``, ``r1 > 0``, ``0 < r2 <= 2``.

ALiBi is the power kernel with ``r2 = 1`` and ``r1`` its slope (within the clamp below:
ALiBi's smallest slopes, ``2^-8`` for 4 or 8 heads, are under it). The authors' code keeps
each parameter at or above ``0.01`` (and the power at most 2) by clamping it, and draws
``r1`` (log) or ``r2`` (power) uniformly in ``(0, 2)`` and the other in ``(0, 1)``.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pecode._checks import check_int
from pecode.attention import PositionScheme

__all__ = ["KERPLE_KINDS", "Kerple", "kerple_bias"]

KERPLE_KINDS: tuple[str, ...] = ("log", "power")
"""The two kernels of the paper that the authors' code trains."""

EPS = 1e-2
"""The smallest value the authors' code lets each parameter take."""


def kerple_bias(kind: str, distance: Tensor, scale: Tensor, shape: Tensor) -> Tensor:
    """The KERPLE bias of each head for each distance.

    ``kind="log"``: ``-scale · log(1 + shape · |d|)``; ``kind="power"``:
    ``-scale · |d| ** shape``. ``scale`` and ``shape`` are clamped as the authors' code
    keeps them: both at least ``0.01``, the power at most 2.

    Shapes::

        distance: [..., Lq, Lk] (integer)    scale, shape: [H]
        returns:  [..., H, Lq, Lk], in scale's dtype

    Raises:
        ValueError: ``kind`` is not one of :data:`KERPLE_KINDS`, or ``scale`` and
            ``shape`` are not 1-D of the same length.
        TypeError: ``distance`` is not an integer tensor.
    """
    if kind not in KERPLE_KINDS:
        raise ValueError(f"kind must be one of {list(KERPLE_KINDS)}, got {kind!r}")
    if not isinstance(distance, Tensor) or distance.is_floating_point():
        raise TypeError("distance must be an integer tensor")
    if scale.dim() != 1 or scale.shape != shape.shape:
        raise ValueError(
            f"scale and shape must be 1-D of one length (heads), got {tuple(scale.shape)} "
            f"and {tuple(shape.shape)}"
        )
    d = distance.abs().to(scale.dtype).unsqueeze(-3)  # [..., 1, Lq, Lk]
    r1 = scale.clamp(min=EPS).view(-1, 1, 1)
    if kind == "log":
        r2 = shape.clamp(min=EPS).view(-1, 1, 1)
        return -r1 * torch.log1p(r2 * d)
    r2 = shape.clamp(min=EPS, max=2.0).view(-1, 1, 1)
    return -r1 * d.pow(r2)


class Kerple(PositionScheme):
    """KERPLE as a :class:`~pecode.attention.PositionScheme`: a learned bias per head.

    Args:
        num_heads: the attention layer's heads.
        kind: ``"log"`` or ``"power"`` (:data:`KERPLE_KINDS`).

    Attributes:
        scale: ``r1`` per head, learned.
        shape: ``r2`` per head (the log kernel's rate, the power kernel's exponent).

    Raises:
        TypeError, ValueError: bad ``num_heads`` or ``kind``.
    """

    score_bias_reads_keys = False  # the bias depends on the positions only

    def __init__(self, num_heads: int, kind: str = "log") -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads)
        if kind not in KERPLE_KINDS:
            raise ValueError(f"kind must be one of {list(KERPLE_KINDS)}, got {kind!r}")
        self.kind = kind
        self.scale = nn.Parameter(torch.empty(num_heads))
        self.shape = nn.Parameter(torch.empty(num_heads))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The authors' initialization: the log kernel's ``r1`` and the power kernel's
        exponent uniform in ``(0, 2)``, the other parameter uniform in ``(0, 1)``."""
        wide, narrow = (self.scale, self.shape) if self.kind == "log" else (self.shape, self.scale)
        with torch.no_grad():
            wide.uniform_(0.0, 2.0)
            narrow.uniform_(0.0, 1.0)

    def score_bias(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """The bias ``[H, Lq, Lk]`` (``[B, H, Lq, Lk]`` for batched positions).

        Raises:
            ValueError: ``q`` does not have ``num_heads`` heads.
        """
        if q.shape[1] != self.num_heads:
            raise ValueError(f"q has {q.shape[1]} heads, Kerple was built for {self.num_heads}")
        distance = q_positions.unsqueeze(-1) - k_positions.unsqueeze(-2)
        dtype = torch.promote_types(q.dtype, torch.float32)
        return kerple_bias(self.kind, distance, self.scale.to(dtype), self.shape.to(dtype))

    def offset_bias(self, q: Tensor, offsets: Tensor) -> Tensor:
        """The bias ``[H, n]`` of each offset ``p_q - p_k`` (FlexAttention's table).

        Raises:
            ValueError: ``q`` does not have ``num_heads`` heads.
        """
        if q.shape[1] != self.num_heads:
            raise ValueError(f"q has {q.shape[1]} heads, Kerple was built for {self.num_heads}")
        dtype = torch.promote_types(q.dtype, torch.float32)
        distance = offsets.view(1, -1)  # one row of offsets: [1, n] -> [H, 1, n]
        return kerple_bias(self.kind, distance, self.scale.to(dtype), self.shape.to(dtype))[:, 0]

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, kind={self.kind!r}"
