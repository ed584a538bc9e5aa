"""Sandwich: the sinusoidal table's inner product as a relative bias (page 6.1).

Chi, Fan, Rudnicky and Ramadge, "Dissecting Transformer Length Extrapolation via the Lens
of Receptive Field Analysis" (ACL 2023, arXiv 2212.10356). Two rows ``p_m`` and ``p_n``
of the sinusoidal table of width ``d̄`` (Vaswani et al. 2017, §3.5) have the inner product

    p_m · p_n = Σ_i [sin(m ω_i) sin(n ω_i) + cos(m ω_i) cos(n ω_i)] = Σ_i cos((m - n) ω_i),

``ω_i = base ** (-2i / d̄)`` for ``i = 0 .. d̄/2 - 1``: a function of ``m - n`` alone,
``d̄ / 2`` at ``m = n``, falling (with ripples) as ``|m - n|`` grows. Sandwich adds it to
the attention logits, divided in head ``h = 1 .. H`` by the compression ratio ``8h / H``
(the ``h`` of ALiBi's slope ``2 ** (-8h / H)``), and learns nothing. ``d̄`` is a
hyperparameter of its own, not the head width; 128 by default.

Sources: the paper's construction as its appendix code builds it (the Gram matrix of the
width-``d̄`` table, divided by ``8h / H``; transcribed in attention-gym's
``test/test_sandwich.py``), and attention-gym's FlexAttention ``score_mod``, which agrees
with it. NeMo's ``SandwichRelativePositionEmbedding`` differs: it sums over
``i = 1 .. d̄/2`` (other frequencies) and subtracts ``d̄ / 2`` (a constant per head, which
no softmax sees). The tests check both relationships.

:func:`sandwich_inner_product` is ``p_m · p_n``; :func:`sandwich_bias` the per-head bias;
:class:`Sandwich` the scheme. The cosines are summed in float64 over the distinct
distances only and then looked up, so a long sequence costs one table of its distances.
"""

from __future__ import annotations

import torch
from torch import Tensor

from pecode._checks import check_int, check_integer_tensor, check_position_pair, check_real
from pecode.absolute import sinusoidal_frequencies
from pecode.attention import PositionScheme

__all__ = ["Sandwich", "sandwich_bias", "sandwich_inner_product", "sandwich_ratios"]

_CHUNK = 1 << 14  # distances per float64 block: 16384 x d̄/2 cosines at a time


def _check_d_bar(d_bar: object) -> int:
    check_int("d_bar", d_bar, 2)
    if d_bar % 2:
        raise ValueError(f"d_bar must be even (sine and cosine pairs), got {d_bar}")
    return d_bar


def _check_base(base: object) -> float:
    return check_real("base", base, above=1.0)


def sandwich_ratios(num_heads: int) -> Tensor:
    """The compression ratio of each head, ``8h / H`` for ``h = 1 .. H``, in float64.

    Head ``h`` divides the inner product by it, so the first head's bias is the largest.

    Shapes::

        returns: [num_heads](float64, CPU)

    Raises:
        TypeError: ``num_heads`` is not an int.
        ValueError: ``num_heads`` is not positive.
    """
    check_int("num_heads", num_heads)
    return torch.arange(1, num_heads + 1, dtype=torch.float64) * 8.0 / num_heads


def _lookup(distance: Tensor) -> tuple[Tensor, Tensor]:
    """The distinct ``|distance|`` values (int64, CPU) and each entry's index into them."""
    d = distance.abs().long()
    if d.numel() == 0:
        return torch.zeros(1, dtype=torch.int64), d
    largest = int(d.max())
    if largest < d.numel():  # every distance up to the largest: index by the distance itself
        return torch.arange(largest + 1, dtype=torch.int64), d
    values, index = torch.unique(d, return_inverse=True)
    return values.cpu(), index


def _inner_product_table(values: Tensor, d_bar: int, base: float) -> Tensor:
    """``Σ_i cos(v ω_i)`` for each distance ``v`` (float64, CPU), in blocks."""
    freqs = sinusoidal_frequencies(d_bar, base)  # float64, ω_0 = 1 > ... > ω_{d̄/2-1}
    flat = values.to(torch.float64)
    out = torch.empty_like(flat)
    for start in range(0, flat.numel(), _CHUNK):
        angles = flat[start : start + _CHUNK].unsqueeze(-1) * freqs
        out[start : start + _CHUNK] = angles.cos().sum(-1)
    return out


def sandwich_inner_product(
    distance: Tensor,
    d_bar: int = 128,
    base: float = 10000.0,
    *,
    dtype: torch.dtype = torch.float64,
) -> Tensor:
    """``p_m · p_n = Σ_{i=0}^{d̄/2-1} cos(d · base^(-2i/d̄))`` for each distance ``d = m - n``.

    The inner product of rows ``m`` and ``n`` of the sinusoidal table of width ``d_bar``
    (:func:`pecode.absolute.sinusoidal_table`), written through its difference: even in
    ``d``, ``d_bar / 2`` at ``d = 0``. Angles and sums in float64, then cast to ``dtype``.

    Shapes::

        distance: [...] (integer)    returns: [...] (``dtype``, on ``distance.device``)

    Raises:
        TypeError: ``distance`` is not an integer tensor, or ``d_bar``/``base`` have the
            wrong type.
        ValueError: ``d_bar`` is odd or below 2, or ``base`` is not greater than 1.
    """
    check_integer_tensor("distance", distance)
    d_bar, base = _check_d_bar(d_bar), _check_base(base)
    values, index = _lookup(distance)
    table = _inner_product_table(values, d_bar, base).to(dtype=dtype, device=distance.device)
    return table[index]


def sandwich_bias(
    distance: Tensor,
    num_heads: int,
    d_bar: int = 128,
    base: float = 10000.0,
    *,
    dtype: torch.dtype = torch.float32,
) -> Tensor:
    """Sandwich's bias: head ``h = 1 .. H`` adds ``p_m · p_n / (8h / H)`` to the logit.

    ``distance[..., i, j]`` is the query position minus the key position (its sign does not
    matter: the bias is even). The per-head values are formed in float64 and rounded once
    to ``dtype``. No causal mask is included: attention applies its own.

    Shapes::

        distance: [..., Lq, Lk] (integer)
        returns:  [..., H, Lq, Lk] (``dtype``, on ``distance.device``)

    Raises:
        TypeError: ``distance`` is not an integer tensor, or an argument has the wrong type.
        ValueError: ``distance`` has fewer than 2 dimensions, ``num_heads`` is not
            positive, ``d_bar`` is odd or below 2, or ``base`` is not greater than 1.
    """
    check_integer_tensor("distance", distance)
    if distance.dim() < 2:
        raise ValueError(f"distance must have shape [..., Lq, Lk], got {tuple(distance.shape)}")
    ratios = sandwich_ratios(num_heads)
    d_bar, base = _check_d_bar(d_bar), _check_base(base)
    values, index = _lookup(distance)
    per_head = _inner_product_table(values, d_bar, base) / ratios.unsqueeze(-1)  # [H, N]
    bias = per_head.to(dtype=dtype, device=distance.device)[:, index]  # [H, ..., Lq, Lk]
    return bias.movedim(0, -3).contiguous()


class Sandwich(PositionScheme):
    """Sandwich as a :class:`~pecode.attention.PositionScheme`: a fixed bias per head.

    Args:
        num_heads: the attention layer's heads.
        d_bar: the width of the sinusoidal table whose inner product is the bias (even).
        base: the table's base, 10000 as in Vaswani et al.

    Raises:
        TypeError, ValueError: bad ``num_heads``, ``d_bar`` or ``base``.
    """

    score_bias_reads_keys = False  # the bias depends on the positions only

    def __init__(self, num_heads: int, d_bar: int = 128, base: float = 10000.0) -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads)
        self.d_bar = _check_d_bar(d_bar)
        self.base = _check_base(base)

    def score_bias(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """The bias ``[H, Lq, Lk]`` (``[B, H, Lq, Lk]`` for batched positions), in
        ``q``'s dtype or float32, whichever is wider.

        Raises:
            ValueError: ``q`` does not have ``num_heads`` heads.
            TypeError, ValueError: positions as
                ``pecode._checks.check_position_pair`` refuses them.
        """
        if q.shape[1] != self.num_heads:
            raise ValueError(f"q has {q.shape[1]} heads, Sandwich was built for {self.num_heads}")
        check_position_pair(q_positions, k_positions)
        distance = q_positions.unsqueeze(-1) - k_positions.unsqueeze(-2)
        dtype = torch.promote_types(q.dtype, torch.float32)
        bias = sandwich_bias(distance, self.num_heads, self.d_bar, self.base, dtype=dtype)
        return bias.to(q.device)

    def offset_bias(self, q: Tensor, offsets: Tensor) -> Tensor:
        """The bias ``[H, n]`` of each offset ``p_q - p_k`` (FlexAttention's table).

        Raises:
            ValueError: ``q`` does not have ``num_heads`` heads.
        """
        if q.shape[1] != self.num_heads:
            raise ValueError(f"q has {q.shape[1]} heads, Sandwich was built for {self.num_heads}")
        dtype = torch.promote_types(q.dtype, torch.float32)
        distance = offsets.view(1, -1)  # one row of offsets: [1, n] -> [H, 1, n]
        bias = sandwich_bias(distance, self.num_heads, self.d_bar, self.base, dtype=dtype)
        return bias[:, 0].to(q.device)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, d_bar={self.d_bar}, base={self.base!r}"
