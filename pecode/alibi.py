"""ALiBi: attention with linear biases (Press, Smith and Lewis, ICLR 2022).

ALiBi adds no position vectors anywhere. Each head ``h`` adds a fixed penalty
``-m_h * (i - j)`` to the logit of query ``i`` and key ``j``: linear in the distance,
with a head-specific slope ``m_h`` that is set before training and never learned.

Pure functions first (:func:`alibi_slopes`, :func:`alibi_bias`,
:func:`alibi_bias_from_positions`, :func:`alibi_key_bias`), then :class:`ALiBi`, the
:class:`~pecode.attention.PositionScheme` that hands the bias to
:class:`~pecode.attention.MultiHeadAttention`, which adds it to the logits through
``scaled_dot_product_attention`` as a float mask.
"""

from __future__ import annotations

from collections.abc import Sequence
from numbers import Real
from typing import Any

import torch
from torch import Tensor

from pecode._checks import check_bool, check_int, check_position_pair
from pecode.attention import PositionScheme

__all__ = ["ALiBi", "alibi_bias", "alibi_bias_from_positions", "alibi_key_bias", "alibi_slopes"]


def _slope_exponents(num_heads: int) -> list[tuple[int, int]]:
    """``log2`` of each slope as an exact fraction ``(numerator, denominator)``."""
    if num_heads & (num_heads - 1) == 0:  # a power of two: the paper's sequence
        return [(-8 * (h + 1), num_heads) for h in range(num_heads)]
    # Otherwise (official code): the slopes of the largest power of two below,
    # then the slopes of twice that power that are not among them, largest first.
    power = 1 << (num_heads.bit_length() - 1)
    extra = [(-8 * (2 * k + 1), 2 * power) for k in range(num_heads - power)]
    return _slope_exponents(power) + extra


def alibi_slopes(
    num_heads: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """The ALiBi slope ``m_h`` of each head (Press et al. 2022, §3).

    For ``n`` a power of two, the paper's geometric sequence that starts at
    ``2**(-8/n)`` with that same ratio: ``m_h = 2**(-8 (h + 1) / n)``, so 8 heads get
    ``1/2, 1/4, ..., 1/256``. For other ``n``, the rule of the paper's official code:
    with ``p = 2**floor(log2 n)``, the ``p`` slopes for ``p`` heads, followed by the
    first ``n - p`` of the slopes ``2**(-8 (2k + 1) / (2p))``, ``k = 0, 1, ...``,
    i.e. those slopes for ``2p`` heads that the first ``p`` do not already contain.
    Exponents are exact fractions; each slope is ``2.0 ** exponent`` in float64.

    Shapes::

        returns: [num_heads]

    Args:
        num_heads: number of heads (positive).
        dtype: floating dtype of the result.
        device: device of the result.

    Raises:
        TypeError: ``num_heads`` is not an int, or ``dtype`` is not floating.
        ValueError: ``num_heads`` is not positive.
    """
    check_int("num_heads", num_heads)
    if not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating dtype, got {dtype}")
    # Python's float power, element by element: the same exponent always gives the
    # same float (a vectorized exp2 may round differently depending on the length)
    slopes = [2.0 ** (num / den) for num, den in _slope_exponents(num_heads)]
    return torch.tensor(slopes, dtype=torch.float64).to(dtype=dtype, device=device)


def _as_slopes(heads_or_slopes: int | Tensor) -> Tensor:
    if isinstance(heads_or_slopes, Tensor):
        if not heads_or_slopes.is_floating_point():
            raise TypeError(f"slopes must be a floating tensor, got {heads_or_slopes.dtype}")
        if heads_or_slopes.dim() != 1 or heads_or_slopes.numel() == 0:
            raise ValueError(
                f"slopes must be a non-empty 1-D tensor [H], got shape "
                f"{tuple(heads_or_slopes.shape)}"
            )
        if not bool(torch.isfinite(heads_or_slopes).all()):
            raise ValueError(f"slopes must be finite, got {heads_or_slopes.tolist()}")
        return heads_or_slopes
    return alibi_slopes(heads_or_slopes, dtype=torch.float64)


def _slopes_from_sequence(values: object) -> Tensor:
    """Custom slopes given as numbers, as a float64 CPU tensor."""
    numbers = list(values) if isinstance(values, Sequence) and not isinstance(values, str) else None
    if numbers is None or any(isinstance(v, bool) or not isinstance(v, Real) for v in numbers):
        raise TypeError(
            f"slopes must be a floating tensor or a sequence of numbers, got {values!r}"
        )
    return torch.tensor([float(v) for v in numbers], dtype=torch.float64, device="cpu")


def _check_not_empty(name: str, positions: Tensor) -> None:
    if positions.shape[-1] == 0:
        raise ValueError(f"{name} must have L > 0 positions, got {tuple(positions.shape)}")


def alibi_bias_from_positions(
    slopes: Tensor,
    q_positions: Tensor,
    k_positions: Tensor,
    *,
    symmetric: bool = False,
) -> Tensor:
    """ALiBi's logit bias for queries and keys at the given integer positions.

    Causal (default, the paper's setting, §3): ``bias[h, i, j] = -m_h (p_i - p_j)``
    where the key is not after the query (``p_j <= p_i``) and ``-inf`` where it is:
    the paper defines the bias only on the keys a causal query sees, so the causal
    mask is part of it. Symmetric (for encoders, a later variant):
    ``bias[h, i, j] = -m_h |p_i - p_j|``, finite everywhere.

    Shapes::

        slopes:      [H] (floating)
        q_positions: [Lq] or [B, Lq] (integer)
        k_positions: [Lk] or [B, Lk] (integer)
        returns:     [H, Lq, Lk], or [B, H, Lq, Lk] if either positions are batched;
                     dtype of ``slopes``

    Raises:
        TypeError: ``slopes`` is not floating, or positions are not integer tensors.
        ValueError: ``slopes`` is not 1-D, positions are not ``[L]`` / ``[B, L]``,
            batch sizes differ, or (causal) some query has no key at or before it.
    """
    slopes = _as_slopes(slopes)
    check_position_pair(q_positions, k_positions)
    _check_not_empty("q_positions", q_positions)
    _check_not_empty("k_positions", k_positions)
    if not check_bool("symmetric", symmetric):
        q_first = q_positions.min(dim=-1).values  # the earliest query of each sequence
        if bool((k_positions.min(dim=-1).values > q_first).any()):
            raise ValueError("causal ALiBi: some query has no key at or before its position")
    return _bias(slopes, q_positions, k_positions, symmetric)


def _bias(slopes: Tensor, q_positions: Tensor, k_positions: Tensor, symmetric: bool) -> Tensor:
    """The bias itself, without checks (see :func:`alibi_bias_from_positions`)."""
    # distance[..., i, j] = p_i - p_j, exact in int64
    distance = q_positions.to(slopes.device, torch.int64).unsqueeze(-1) - k_positions.to(
        slopes.device, torch.int64
    ).unsqueeze(-2)
    if distance.dim() == 3:  # batched positions
        distance = distance.unsqueeze(1)  # [B, 1, Lq, Lk]
    return _distance_bias(slopes.view(-1, 1, 1), distance, symmetric)


def _distance_bias(m: Tensor, distance: Tensor, symmetric: bool) -> Tensor:
    """``-m |d|``, or (causal) ``-m d`` with ``-inf`` where ``d < 0``; ``m`` broadcasts."""
    if symmetric:
        return -m * distance.abs().to(m.dtype)
    return (-m * distance.to(m.dtype)).masked_fill(distance < 0, float("-inf"))


def alibi_bias(
    heads_or_slopes: int | Tensor,
    q_len: int,
    k_len: int | None = None,
    *,
    symmetric: bool = False,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """ALiBi's bias for ``q_len`` queries over ``k_len`` keys (Press et al. 2022, §3).

    Keys sit at positions ``0 .. k_len - 1`` and the queries are the *last* ``q_len``
    of them (the layout of decoding with a key/value cache), so query ``i`` is at
    position ``k_len - q_len + i``. See :func:`alibi_bias_from_positions` for the
    values: ``-m_h (i - j)`` on and below the diagonal and ``-inf`` above it
    (causal), or ``-m_h |i - j|`` (``symmetric=True``).

    Shapes::

        returns: [H, q_len, k_len]

    Args:
        heads_or_slopes: a head count (slopes from :func:`alibi_slopes`) or a
            tensor of slopes ``[H]``.
        q_len: number of queries (positive).
        k_len: number of keys, at least ``q_len``; defaults to ``q_len``.
        symmetric: the bidirectional variant ``-m |i - j|`` instead of the causal one.
        dtype, device: of the result; the bias is computed in float64 first.

    Raises:
        TypeError: a length or head count is not an int, or slopes are not floating.
        ValueError: a length or head count is not positive, ``q_len > k_len``,
            or slopes are not 1-D.
    """
    check_int("q_len", q_len)
    k_len = q_len if k_len is None else check_int("k_len", k_len)
    if q_len > k_len:
        raise ValueError(f"q_len={q_len} exceeds k_len={k_len}: queries are the last keys")
    slopes = _as_slopes(heads_or_slopes).to(device="cpu", dtype=torch.float64)
    k_positions = torch.arange(k_len)
    bias = alibi_bias_from_positions(
        slopes, k_positions[k_len - q_len :], k_positions, symmetric=symmetric
    )
    return bias.to(dtype=dtype, device=device)


def alibi_key_bias(
    heads_or_slopes: int | Tensor,
    k_len: int,
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> Tensor:
    """The official implementation's form of causal ALiBi: ``m_h * j``, the same for every query.

    Under a causal mask, query ``i``'s bias ``-m_h (i - j)`` equals ``m_h j`` minus the
    constant ``m_h i``, and a softmax ignores a constant added to its row; so this
    ``[H, 1, k_len]`` bias, broadcast over queries *and combined with a causal mask*,
    gives exactly the attention of :func:`alibi_bias` (proof:
    :func:`pecode.proofs.alibi.alibi_causal_row_shift`). Without a causal mask it
    is not ALiBi: every query then favours the last keys.

    Keep it in float32 or wider. The values reach ``m_h (k_len - 1)`` at the recent
    keys, where 16-bit floats are coarse. The official code casts it to the dtype of
    the activations (float16 in its training command), BLOOM's training code and
    Hugging Face's ``build_alibi_tensor`` to the model's dtype; in bfloat16, for BLOOM's
    112 heads at 2048 keys, that moves an attention weight by more than 0.5 (measured
    in chapter 6, section ``ch06-check-precision``). The ``dtype`` argument rounds the
    float64 values once.

    Shapes::

        returns: [H, 1, k_len]

    Raises:
        TypeError, ValueError: as :func:`alibi_bias`.
    """
    check_int("k_len", k_len)
    slopes = _as_slopes(heads_or_slopes).to(device="cpu", dtype=torch.float64)
    bias = slopes.view(-1, 1, 1) * torch.arange(k_len, dtype=torch.float64)
    return bias.to(dtype=dtype, device=device)


class ALiBi(PositionScheme):
    """ALiBi as a :class:`~pecode.attention.PositionScheme` (Press et al. 2022).

    :meth:`score_bias` returns :func:`alibi_bias_from_positions` for the positions
    :class:`~pecode.attention.MultiHeadAttention` passes, so position offsets (a
    cache, a shifted window) are honoured. The causal variant includes the causal
    mask, so attention with it is causal even when ``causal=False`` is passed.

    The slopes are fixed, not learned, and are not saved in the state dict; the module
    keeps them as Python floats and rebuilds its float64 ``slopes`` buffer from them
    after every ``to()``/``to_empty()`` (so building on the ``meta`` device, then
    ``to_empty()`` and ``load_state_dict``, gives the exact slopes, and
    ``module.to(torch.bfloat16)`` does not round them).

    Args:
        num_heads: number of heads; must equal the attention module's.
        symmetric: use the bidirectional variant ``-m |i - j|`` (encoders).
        slopes: custom slopes ``[num_heads]`` instead of :func:`alibi_slopes`: a
            floating tensor or a sequence of numbers (on the ``meta`` device, only a
            sequence holds values), all finite.

    Raises:
        TypeError, ValueError: bad ``num_heads`` or ``slopes`` (not floating numbers,
            not 1-D, not finite, or a tensor on the ``meta`` device), or ``slopes`` does
            not have ``num_heads`` entries.
    """

    score_bias_reads_keys = False  # the bias depends on the positions only

    def __init__(
        self,
        num_heads: int,
        *,
        symmetric: bool = False,
        slopes: Tensor | Sequence[float] | None = None,
    ) -> None:
        super().__init__()
        check_int("num_heads", num_heads)
        if slopes is None:
            with torch.device("cpu"):  # real values even when the module is built on "meta"
                slopes = alibi_slopes(num_heads, dtype=torch.float64)
        elif isinstance(slopes, Tensor) and slopes.is_meta:
            raise ValueError(
                "slopes is a tensor on the meta device, which holds no values, and ALiBi's "
                "slopes are not saved in the state dict: pass them as a list of floats"
            )
        elif not isinstance(slopes, Tensor):
            slopes = _slopes_from_sequence(slopes)
        slopes = _as_slopes(slopes)
        if slopes.numel() != num_heads:
            raise ValueError(f"slopes has {slopes.numel()} entries, expected num_heads={num_heads}")
        self.num_heads = num_heads
        self.symmetric = check_bool("symmetric", symmetric)
        self._slope_values = tuple(slopes.double().tolist())  # what the buffer is built from
        # not persistent: the slopes are fixed by the head count, not learned weights;
        # float64 so that a float64 model gets the exact slopes
        self.register_buffer("slopes", self._slope_tensor(None), persistent=False)

    def _slope_tensor(self, device: torch.device | None) -> Tensor:
        return torch.tensor(self._slope_values, dtype=torch.float64, device=device)

    def _apply(self, fn: Any, recurse: bool = True) -> ALiBi:
        # to_empty() leaves the buffer uninitialised and .to(torch.bfloat16) rounds it:
        # rebuild it, exact and in float64, wherever it now lives (H floats: cheap).
        super()._apply(fn, recurse)
        if not self.slopes.is_meta:
            self.slopes = self._slope_tensor(self.slopes.device)
        return self

    def reset_parameters(self) -> None:
        """Rebuild the ``slopes`` buffer from the slopes given (nothing here is learned)."""
        if not self.slopes.is_meta:
            self.slopes = self._slope_tensor(self.slopes.device)

    def _exact_slopes(self, device: torch.device) -> Tensor:
        """The float64 slopes, rebuilt on ``device`` if ``load_state_dict(assign=True)``
        left them on the ``meta`` device."""
        if self.slopes.is_meta:
            self.slopes = self._slope_tensor(device)
        return self.slopes

    def score_bias(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """The ALiBi bias, ``[H, Lq, Lk]`` (or ``[B, H, Lq, Lk]`` for batched positions).

        Raises:
            ValueError: ``q`` does not have ``num_heads`` heads.
        """
        if q.shape[1] != self.num_heads:
            raise ValueError(f"q has {q.shape[1]} heads, ALiBi was built for {self.num_heads}")
        # float32 or wider: the bias is exact enough before the cast to q's dtype
        dtype = torch.promote_types(q.dtype, torch.float32)
        slopes = self._exact_slopes(q.device).to(device=q.device, dtype=dtype)
        if q_positions is k_positions:  # self-attention: every query sees itself
            return _bias(slopes, q_positions, k_positions, self.symmetric)
        return alibi_bias_from_positions(slopes, q_positions, k_positions, symmetric=self.symmetric)

    def offset_bias(self, q: Tensor, offsets: Tensor) -> Tensor:
        """The bias ``[H, n]`` of each offset ``p_q - p_k`` (FlexAttention's table).

        Raises:
            ValueError: ``q`` does not have ``num_heads`` heads.
        """
        if q.shape[1] != self.num_heads:
            raise ValueError(f"q has {q.shape[1]} heads, ALiBi was built for {self.num_heads}")
        dtype = torch.promote_types(q.dtype, torch.float32)
        slopes = self._exact_slopes(q.device).to(device=q.device, dtype=dtype)
        return _distance_bias(slopes.view(-1, 1), offsets.to(q.device, torch.int64), self.symmetric)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, symmetric={self.symmetric}"
