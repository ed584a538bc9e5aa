"""xPos: RoPE with an exponential decay, Sun et al. (2023), "A Length-Extrapolatable
Transformer" (ACL 2023, arXiv 2212.10554), §3.

xPos keeps RoPE's rotation and multiplies pair ``i`` of the rotated query at position
``n`` by ``ζ_i^(n/B)`` and of the rotated key at position ``m`` by ``ζ_i^(-m/B)``, with

    ``ζ_i = (i / (d/2) + γ) / (1 + γ)``,  ``i = 0 .. d/2 - 1``,  ``γ = 0.4``,  ``B = 512``.

Every ``ζ_i`` lies in ``[γ/(1+γ), 1)``, so the score of pair ``i`` is RoPE's times
``ζ_i^((n - m)/B)``: it depends on ``n - m`` only and decays as the key falls behind
the query, fastest in the high-frequency pairs (small ``i``), where RoPE's own score
oscillates most. The formula for ``ζ_i`` is the paper's (its ``ζ̂``, with ``γ = 0.4``);
the scale base ``B = 512`` that divides the exponent is the authors' code's
(``torchscale``'s ``XPOS(head_dim, scale_base=512)``), as in audiocraft (which calls
``γ`` ``smoothing``, as here) and ``rotary-embedding-torch`` (``xpos_scale_base``).

**Where the positions are counted from.** The decay only needs ``n - m``, so any fixed
origin ``c`` may be subtracted from every position: ``ζ^((n-c)/B) ζ^(-(m-c)/B) =
ζ^((n-m)/B)``. The implementations centre positions on the current call:
``rotary-embedding-torch`` subtracts ``L // 2`` (``L`` the call's length) and
``torchscale`` ``ceil(L / 2)``, which halves the largest exponent. That origin changes
from call to call, so keys scaled in one call are wrong in the next: torchscale caches
the *unscaled* keys and scales all of them again at every decoding step. pecode's
:class:`~pecode.attention.KVCache` keeps keys *after* :meth:`XPos.transform_qk`, so the
origin here is a fixed ``centre`` (0 by default, the paper's positions; audiocraft's
choice too): a key's scale depends on its own position only, and cached keys stay
valid (``tests/test_xpos.py`` checks decoding token by token against one pass, and that
a per-call centre breaks it).

**How far it reaches.** ``ζ_0^(±(p - c)/B)`` leaves a float type's range quickly:
``γ/(1+γ) = 2/7`` and ``B = 512`` give ``e^(±1.25 (p - c)/512)``, which overflows float32
near ``|p - c| = 36 000``. :class:`XPos` refuses positions farther from ``centre`` than
:func:`xpos_position_limit` (17 847 in float32 and bfloat16, 1 983 in float16,
144 759 in float64, with the paper's ``γ`` and ``B``), where the scale and its inverse
stay within the square root of the type's normal range, leaving the other half for
the values of ``q`` and ``k``. A longer context needs ``centre`` in its middle, or
float64.

The pure functions are :func:`xpos_zeta`, :func:`xpos_scale`, :func:`apply_xpos`
(:func:`pecode.rope.apply_rope` with its tables multiplied by the scale) and
:func:`xpos_position_limit`; :class:`XPos` is the
:class:`~pecode.attention.PositionScheme`, which takes its cos/sin tables from a
:class:`~pecode.rope.RotaryEmbedding`.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from pecode._checks import check_int, check_positions, check_real
from pecode.attention import PositionScheme
from pecode.frequencies import check_rope_dim
from pecode.rope import RotaryEmbedding, apply_rope

__all__ = [
    "XPOS_SCALE_BASE",
    "XPOS_SMOOTHING",
    "XPos",
    "apply_xpos",
    "xpos_position_limit",
    "xpos_scale",
    "xpos_zeta",
]

XPOS_SMOOTHING = 0.4
"""``γ`` of ``ζ_i = (i/(d/2) + γ)/(1 + γ)``, the value of the paper and the authors' code."""

XPOS_SCALE_BASE = 512.0
"""``B``, the divisor of the position in the exponent ``ζ^(n/B)`` (the authors' code)."""


def _check_dtype(dtype: object) -> None:
    if dtype not in (torch.float32, torch.float64):
        raise TypeError(f"dtype must be torch.float32 or torch.float64, got {dtype}")


def xpos_zeta(
    dim: int, smoothing: float = XPOS_SMOOTHING, *, dtype: torch.dtype = torch.float32
) -> Tensor:
    """The decay bases ``ζ_i = (i/(dim/2) + γ)/(1 + γ)`` for ``i = 0 .. dim/2 - 1``.

    Sun et al. (2023), §3 (the paper's ``ζ̂``), with ``γ = smoothing``; computed in
    float64 and rounded to ``dtype``. They rise from ``γ/(1+γ)`` for the highest
    frequency (pair 0) towards 1.

    Shapes::

        returns: [dim // 2], ``dtype``

    Raises:
        TypeError: ``dim`` is not an int, ``smoothing`` is not a real number, or
            ``dtype`` is not float32/float64.
        ValueError: ``dim`` is not positive and even, or ``smoothing`` is not positive
            and finite.
    """
    check_rope_dim("dim", dim)
    smoothing = check_real("smoothing", smoothing, above=0)
    _check_dtype(dtype)
    pairs = dim // 2
    index = torch.arange(pairs, dtype=torch.float64)
    return ((index / pairs + smoothing) / (1.0 + smoothing)).to(dtype)


def xpos_scale(
    positions: Tensor,
    zeta: Tensor,
    scale_base: float = XPOS_SCALE_BASE,
    *,
    centre: int = 0,
    inverse: bool = False,
) -> Tensor:
    """The factors ``ζ_i^((p - centre)/B)`` (queries) or ``ζ_i^(-(p - centre)/B)`` (keys).

    Computed in float32, or float64 when ``zeta`` is float64, whatever the dtype of
    ``positions`` (as :func:`pecode.rope.rope_cos_sin`). Nothing is checked against the
    range of the dtype: far from ``centre`` the factors underflow to 0 or overflow to
    ``inf`` (see :func:`xpos_position_limit`).

    Shapes::

        positions: [..., L] (integer or floating)
        zeta:      [dim // 2] (from xpos_zeta)
        returns:   [..., L, dim // 2]

    Args:
        positions: token positions (the paper's ``n`` for queries, ``m`` for keys).
        zeta: the decay bases of :func:`xpos_zeta`.
        scale_base: ``B``, positive.
        centre: the origin subtracted from every position (0: the paper's positions).
        inverse: ``True`` for the keys' factor ``ζ^(-(p - centre)/B)``.

    Raises:
        TypeError: ``positions`` or ``zeta`` is not a tensor, ``positions`` is bool,
            ``zeta`` is not floating, ``scale_base`` is not a real number, ``centre``
            is not an int or ``inverse`` not a bool.
        ValueError: ``zeta`` is not 1-D, ``positions`` is 0-D, ``scale_base`` is not
            positive and finite, or ``centre`` is negative.
    """
    for name, value in (("positions", positions), ("zeta", zeta)):
        if not isinstance(value, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
    if not zeta.is_floating_point():
        raise TypeError(f"zeta must be a floating tensor, got {zeta.dtype}")
    if zeta.dim() != 1:
        raise ValueError(f"zeta must be 1-D [dim // 2], got shape {tuple(zeta.shape)}")
    if positions.dim() == 0:
        raise ValueError("positions must have at least one dimension [..., L]")
    if positions.dtype == torch.bool:
        raise TypeError("positions must be integer or floating, got torch.bool")
    scale_base = check_real("scale_base", scale_base, above=0)
    check_int("centre", centre, minimum=0)
    if not isinstance(inverse, bool):
        raise TypeError(f"inverse must be a bool, got {type(inverse).__name__}")
    dtype = torch.float64 if torch.float64 in (zeta.dtype, positions.dtype) else torch.float32
    exponent = (positions.to(dtype) - centre) / scale_base
    if inverse:
        exponent = -exponent
    return zeta.to(device=positions.device, dtype=dtype).pow(exponent.unsqueeze(-1))


def apply_xpos(x: Tensor, cos: Tensor, sin: Tensor, scale: Tensor, layout: str = "half") -> Tensor:
    """Rotate each pair of ``x`` as RoPE does and multiply it by its factor ``scale``.

    A pair ``(a, b)`` at position ``p`` with factor ``s`` becomes
    ``s·(a cos pθ_i - b sin pθ_i, a sin pθ_i + b cos pθ_i)``: this is
    :func:`pecode.rope.apply_rope` with the tables ``s·cos`` and ``s·sin``, their
    products taken in the wider of the tables' and ``scale``'s dtypes and rounded to the
    tables' dtype, so the rotation itself runs in the dtype it runs in for RoPE.

    Shapes::

        x:               [..., L, dim]
        cos, sin, scale: [..., L or 1, dim // 2], broadcastable against x (batched
                         tables [B, 1, L, dim // 2] for x [B, H, L, dim])
        returns:         [..., L, dim], x.dtype

    Raises:
        TypeError: ``cos``, ``sin`` or ``scale`` is not a floating tensor; see
            :func:`pecode.rope.apply_rope` for ``x``.
        ValueError: ``scale`` does not have the tables' shape; see
            :func:`pecode.rope.apply_rope` for the rest.
    """
    for name, table in (("cos", cos), ("sin", sin), ("scale", scale)):
        if not isinstance(table, Tensor) or not table.is_floating_point():
            raise TypeError(f"{name} must be a floating torch.Tensor")
    if scale.shape != cos.shape:
        raise ValueError(
            f"scale must have the shape of cos and sin {tuple(cos.shape)}, got {tuple(scale.shape)}"
        )
    wide = torch.promote_types(cos.dtype, scale.dtype)
    scale = scale.to(device=cos.device, dtype=wide)
    cos = (cos.to(wide) * scale).to(cos.dtype)
    sin = (sin.to(wide) * scale).to(sin.dtype)
    return apply_rope(x, cos, sin, layout)


def xpos_position_limit(
    smoothing: float = XPOS_SMOOTHING,
    scale_base: float = XPOS_SCALE_BASE,
    dtype: torch.dtype = torch.float32,
) -> int:
    """The largest distance ``|p - centre|`` at which :class:`XPos` accepts a position.

    There the steepest factor, ``ζ_0^(±|p - centre|/B)`` with ``ζ_0 = γ/(1+γ)``, and its
    inverse both lie within ``[sqrt(tiny), 1/sqrt(tiny)]``, ``tiny`` the smallest normal
    number of ``dtype``: half of the type's exponent range, the other half left for the
    values of ``q`` and ``k`` and the products of attention. It does not depend on the
    head dimension (``ζ_0`` does not).

    Raises:
        TypeError: ``smoothing`` or ``scale_base`` is not a real number, or ``dtype`` is
            not a floating dtype.
        ValueError: ``smoothing`` or ``scale_base`` is not positive and finite.
    """
    smoothing = check_real("smoothing", smoothing, above=0)
    scale_base = check_real("scale_base", scale_base, above=0)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype}")
    half_range = -math.log(torch.finfo(dtype).tiny) / 2
    return math.floor(half_range * scale_base / -math.log(smoothing / (1.0 + smoothing)))


class XPos(PositionScheme):
    """xPos as a position scheme: RoPE, the query scaled up and the key scaled down.

    Query pair ``i`` at position ``n`` is rotated as by RoPE and multiplied by
    ``ζ_i^((n - centre)/B)``; key pair ``i`` at position ``m`` by ``ζ_i^(-(m - centre)/B)``
    (:func:`xpos_scale`). The rotation tables come from a
    :class:`~pecode.rope.RotaryEmbedding` (``rotary``) and the factors are computed
    in float64 for each call, then rounded into the tables. A key's factor depends on
    its own position only, so keys cached by :class:`~pecode.attention.KVCache` stay
    valid while decoding. Positions farther than :func:`xpos_position_limit` from
    ``centre`` are refused (see the module's docstring). Without a causal mask, a key
    *after* its query gets a growing factor, ``ζ^(-(m - n)/B)`` (the paper's models are
    causal).

    Args:
        head_dim: the per-head dimension of q and k (all of it rotated and scaled).
        base: RoPE's frequency base.
        smoothing: ``γ`` of :func:`xpos_zeta` (0.4).
        scale_base: ``B`` (512).
        centre: the fixed origin of the positions in the exponent (0: the paper's).
        layout: ``"half"`` or ``"interleaved"`` (see :func:`pecode.rope.apply_rope`);
            the authors' code and ``rotary-embedding-torch`` pair ``2i`` with ``2i+1``.
        dtype: float32 or float64 tables.

    Raises:
        TypeError, ValueError: ``head_dim`` not positive and even, a bad ``base``,
            ``layout`` or ``dtype`` (as :class:`~pecode.rope.RotaryEmbedding`), or a bad
            ``smoothing``, ``scale_base`` or ``centre`` (as :func:`xpos_scale`).
    """

    def __init__(
        self,
        head_dim: int,
        *,
        base: float = 10000.0,
        smoothing: float = XPOS_SMOOTHING,
        scale_base: float = XPOS_SCALE_BASE,
        centre: int = 0,
        layout: str = "half",
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        _check_dtype(dtype)
        self.rotary = RotaryEmbedding(head_dim, base=base, layout=layout, dtype=dtype)
        self.head_dim, self.layout = head_dim, layout
        self.smoothing = check_real("smoothing", smoothing, above=0)
        self.scale_base = check_real("scale_base", scale_base, above=0)
        self.centre = check_int("centre", centre, minimum=0)
        # float64 and no buffer: module.to(torch.bfloat16) must not round the bases
        self._zeta = xpos_zeta(head_dim, self.smoothing, dtype=torch.float64)

    @property
    def zeta(self) -> Tensor:
        """The decay bases ``ζ_i`` of this scheme, float64 (:func:`xpos_zeta`); a copy."""
        return self._zeta.clone()

    def position_limit(self, dtype: torch.dtype) -> int:
        """The largest ``|position - centre|`` accepted for q or k of ``dtype``.

        The narrower of ``dtype`` and the tables' dtype decides
        (:func:`xpos_position_limit`).
        """
        return min(
            xpos_position_limit(self.smoothing, self.scale_base, dtype),
            xpos_position_limit(self.smoothing, self.scale_base, self.rotary.table_dtype),
        )

    def _scaled(self, x: Tensor, positions: Tensor, inverse: bool, name: str) -> Tensor:
        """Rotate and scale ``x [B, H, L, head_dim]`` by ``positions [L]`` or ``[B, L]``."""
        positions_name = f"{name}_positions"
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise TypeError(f"{name} must be a floating torch.Tensor")
        check_positions(positions_name, positions)
        if x.dim() != 4 or x.shape[-1] != self.head_dim:
            raise ValueError(
                f"{name} must have shape [B, H, L, {self.head_dim}], got {tuple(x.shape)}"
            )
        batch, length = x.shape[0], x.shape[-2]
        batched = positions.dim() == 2
        if positions.shape[-1] != length or (batched and positions.shape[0] not in (1, batch)):
            raise ValueError(
                f"{positions_name} must have shape [{length}] or [{batch}, {length}] for "
                f"{name} of shape {tuple(x.shape)}, got {tuple(positions.shape)}"
            )
        if positions.numel() and not torch.compiler.is_compiling():
            low, high = torch.stack(torch.aminmax(positions)).tolist()
            limit = self.position_limit(x.dtype)
            if max(abs(low - self.centre), abs(high - self.centre)) > limit:
                raise ValueError(
                    f"{positions_name} span {low}..{high}, farther than {limit} from "
                    f"centre={self.centre}: xPos's factors would leave the range of "
                    f"{x.dtype} (xpos_position_limit); give XPos a centre in the middle of "
                    f"the positions, or use float64"
                )
        cos, sin = self.rotary.cos_sin(positions)
        zeta = self._zeta.to(cos.device)
        scale = xpos_scale(
            positions.to(cos.device), zeta, self.scale_base, centre=self.centre, inverse=inverse
        )
        if batched:  # [B, L, d/2] -> [B, 1, L, d/2], shared by the heads
            cos, sin, scale = cos.unsqueeze(1), sin.unsqueeze(1), scale.unsqueeze(1)
        device = x.device
        return apply_xpos(x, cos.to(device), sin.to(device), scale.to(device), self.layout)

    def transform_qk(
        self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Rotate both; scale ``q`` by ``ζ^((n - centre)/B)`` and ``k`` by ``ζ^(-(m - centre)/B)``.

        Raises:
            TypeError: ``q`` or ``k`` is not a floating tensor, or positions are not
                integer tensors.
            ValueError: a shape does not fit, a position is negative, or a position is
                farther than :meth:`position_limit` from ``centre``.
        """
        return (
            self._scaled(q, q_positions, False, "q"),
            self._scaled(k, k_positions, True, "k"),
        )

    def extra_repr(self) -> str:
        return (
            f"head_dim={self.head_dim}, base={self.rotary.base}, smoothing={self.smoothing}, "
            f"scale_base={self.scale_base}, centre={self.centre}, layout={self.layout!r}, "
            f"dtype={self.rotary.table_dtype}"
        )
