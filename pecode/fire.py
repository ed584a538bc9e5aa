"""FIRE: functional interpolation for relative positions (page 6.1).

Li, You, Guruganesh, Ainslie, Ontanon, Zaheer, Sanghai, Yang, Kumar and Bhojanapalli,
"Functional Interpolation for Relative Positions Improves Long Context Transformers"
(ICLR 2024, arXiv 2310.04418). Query ``i`` and key ``j <= i`` get in head ``h`` the bias

    b_h(i, j) = f_θ( ψ(i - j) / ψ(max(L, i)) )_h,    ψ(x) = log(c·x + 1),

which the paper builds in steps: a learned function ``f_θ`` of the offset; "progressive
interpolation", ``f_θ((i - j) / i)``, so every input lies in ``[0, 1]`` whatever the
length; the log transform ``ψ`` (more resolution for near keys); and the threshold ``L``
on the normaliser (short sequences are not stretched over ``[0, 1]``). ``c`` and ``L``
are learned.

The details follow the PyTorch listing of FIRE that the tests transcribe:

* ``f_θ``: ``Linear(1, hidden) -> ReLU -> Linear(hidden, H)``, ``hidden = 32``, one MLP
  whose ``H`` outputs are the heads, PyTorch's default initialisation (one hidden layer;
  some descriptions of the paper give ``f_θ`` two hidden layers of 32 units);
* ``ψ(x) = log(|c·x| + 1)``, ``c`` initialised to 0.1;
* ``L = |m · L0|`` with ``L0 = 512`` fixed and the multiplier ``m`` (initially 1) learned:
  the absolute value keeps it non-negative;
* the input is ``ψ(|i - j|) / (ψ(max(i, L)) + eps)`` with ``eps = 1e-6``; keys after the
  query get the mirror image, which causal attention masks (FIRE is defined for ``j <= i``).

Positions are those :class:`~pecode.attention.MultiHeadAttention` passes (0 for the first
token, as in the listing). ``log_transform=False`` replaces ``ψ`` by the identity (the
step before the log transform).

What FIRE can represent. The paper proves that FIRE can represent T5's relative bias,
ALiBi and KERPLE. :func:`fire_mlp_for_offsets` is this module's own construction (checked
in the tests, not a transcription of the paper's proof): for queries at positions
``i <= L`` the normaliser is the constant ``ψ(L)``, so the input is an increasing function
of ``i - j`` alone, and the piecewise-linear interpolant through the points
``(ψ(k) / (ψ(L) + eps), bias(k))`` reproduces any bias of the offset at ``k = 0 .. N-1``,
with one hidden unit per change of slope: one for ALiBi when ``ψ`` is the identity, two
per bucket boundary for T5, one per offset for ALiBi under the log. Past ``L`` the
normaliser grows with ``i``, the inputs move, and the bias is no longer the target.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from pecode._checks import (
    check_bool,
    check_floating_tensor,
    check_int,
    check_position_pair,
    check_real,
)
from pecode.attention import PositionScheme

__all__ = [
    "FIRE",
    "FireWeights",
    "fire_bias",
    "fire_inputs",
    "fire_mlp",
    "fire_mlp_for_offsets",
    "fire_psi",
    "fire_representing_alibi",
    "fire_representing_t5",
]


class FireWeights(NamedTuple):
    """The weights of ``f_θ``, shaped as :class:`torch.nn.Linear` holds them.

    Shapes::

        w1: [hidden, 1]    b1: [hidden]    w2: [H, hidden]    b2: [H]
    """

    w1: Tensor
    b1: Tensor
    w2: Tensor
    b2: Tensor


def _scalar(name: str, value: object, dtype: torch.dtype, device: torch.device) -> Tensor:
    """A 0-dim tensor of ``dtype`` from a number or a one-element floating tensor."""
    if isinstance(value, Tensor):
        check_floating_tensor(name, value)
        if value.numel() != 1:
            raise ValueError(f"{name} must hold one number, got shape {tuple(value.shape)}")
        return value.reshape(()).to(dtype=dtype, device=device)
    return torch.tensor(check_real(name, value), dtype=dtype, device=device)


def fire_psi(x: Tensor, c: Tensor | float, *, log_transform: bool = True) -> Tensor:
    """FIRE's transform ``ψ(x) = log(|c·x| + 1)``, or ``x`` itself.

    The listing's absolute value makes the sign of ``c`` irrelevant; for ``c > 0`` and
    ``x >= 0`` it is the paper's ``log(c·x + 1)``.

    Shapes::

        x: [...] (floating)    c: a number or a one-element tensor    returns: [...]

    Raises:
        TypeError: ``x`` is not a floating tensor, or ``c``/``log_transform`` have the
            wrong type.
        ValueError: ``c`` is a tensor of more than one element, or not finite.
    """
    check_floating_tensor("x", x)
    if not check_bool("log_transform", log_transform):
        return x
    return torch.log1p((_scalar("c", c, x.dtype, x.device) * x).abs())


def fire_inputs(
    q_positions: Tensor,
    k_positions: Tensor,
    c: Tensor | float,
    threshold: Tensor | float,
    *,
    eps: float = 1e-6,
    log_transform: bool = True,
    dtype: torch.dtype | None = None,
) -> Tensor:
    """The MLP's input ``ψ(|i - j|) / (ψ(max(i, L)) + eps)`` for query ``i``, key ``j``.

    The paper's progressive interpolation with a thresholded normaliser, as the
    listing computes it: ``threshold`` is ``L`` (the module passes ``|m · L0|``), ``eps``
    keeps the quotient finite where ``ψ(max(i, L)) = 0``. For ``j <= i <= L`` the input
    depends on ``i - j`` only; for ``i > L`` it is ``ψ(i - j) / ψ(i)``, in ``[0, 1]``.

    Shapes::

        q_positions: [Lq] or [B, Lq]    k_positions: [Lk] or [B, Lk]   (integer)
        returns: [Lq, Lk], or [B, Lq, Lk] if either is batched; ``dtype``, by default
                 ``c``'s if it is a tensor, else float32

    Raises:
        TypeError: positions are not integer tensors, ``c``/``threshold`` are not numbers
            or floating tensors, or ``eps`` is not a number.
        ValueError: positions are not ``[L]``/``[B, L]`` or their batches differ, ``c`` or
            ``threshold`` hold more than one number, or ``eps`` is negative.
    """
    check_position_pair(q_positions, k_positions)
    check_real("eps", eps)
    if eps < 0:
        raise ValueError(f"eps must be non-negative, got {eps:g}")
    if dtype is None:
        dtype = c.dtype if isinstance(c, Tensor) else torch.float32
    device = c.device if isinstance(c, Tensor) else q_positions.device
    threshold = _scalar("threshold", threshold, dtype, device)
    q_positions, k_positions = q_positions.to(device), k_positions.to(device)
    offset = (q_positions.unsqueeze(-1) - k_positions.unsqueeze(-2)).abs().to(dtype)  # exact
    normaliser = torch.maximum(q_positions.to(dtype), threshold)  # [..., Lq]
    num = fire_psi(offset, c, log_transform=log_transform)
    den = fire_psi(normaliser, c, log_transform=log_transform) + eps
    return num / den.unsqueeze(-1)


def fire_mlp(x: Tensor, w1: Tensor, b1: Tensor, w2: Tensor, b2: Tensor) -> Tensor:
    """``f_θ(x) = w2 · relu(w1 · x + b1) + b2`` for every entry of ``x``, heads first.

    Shapes::

        x: [..., Lq, Lk] (floating)    w1: [hidden, 1]    b1: [hidden]
        w2: [H, hidden]    b2: [H]     returns: [..., H, Lq, Lk]

    Raises:
        TypeError: an argument is not a floating tensor.
        ValueError: ``x`` has fewer than 2 dimensions, or the weights' shapes disagree.
    """
    check_floating_tensor("x", x)
    for name, value in (("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2)):
        check_floating_tensor(name, value)
    if x.dim() < 2:
        raise ValueError(f"x must have shape [..., Lq, Lk], got {tuple(x.shape)}")
    hidden = w1.shape[0]
    heads = w2.shape[0]
    expected = {"w1": (hidden, 1), "b1": (hidden,), "w2": (heads, hidden), "b2": (heads,)}
    for name, value in (("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2)):
        if tuple(value.shape) != expected[name]:
            raise ValueError(
                f"{name} must have shape {expected[name]} (w1 [hidden, 1], b1 [hidden], "
                f"w2 [H, hidden], b2 [H]), got {tuple(value.shape)}"
            )
    out = F.linear(F.relu(F.linear(x.unsqueeze(-1), w1, b1)), w2, b2)  # [..., Lq, Lk, H]
    return out.movedim(-1, -3)


def fire_bias(
    q_positions: Tensor,
    k_positions: Tensor,
    c: Tensor | float,
    threshold: Tensor | float,
    weights: FireWeights | tuple[Tensor, Tensor, Tensor, Tensor],
    *,
    eps: float = 1e-6,
    log_transform: bool = True,
) -> Tensor:
    """FIRE's bias ``f_θ(ψ(i - j) / ψ(max(L, i)))``, every head at once.

    :func:`fire_inputs` then :func:`fire_mlp`, in the weights' dtype.

    Shapes::

        q_positions: [Lq] or [B, Lq]    k_positions: [Lk] or [B, Lk]   (integer)
        weights: see :class:`FireWeights`
        returns: [H, Lq, Lk], or [B, H, Lq, Lk] if either positions are batched

    Raises:
        TypeError, ValueError: as :func:`fire_inputs` and :func:`fire_mlp`.
    """
    w1, b1, w2, b2 = weights
    check_floating_tensor("w1", w1)
    x = fire_inputs(
        q_positions,
        k_positions,
        c,
        threshold,
        eps=eps,
        log_transform=log_transform,
        dtype=w1.dtype,
    ).to(w1.device)
    return fire_mlp(x, w1, b1, w2, b2)


def fire_mlp_for_offsets(
    values: Tensor,
    c: float,
    threshold: float,
    *,
    eps: float = 1e-6,
    log_transform: bool = True,
    rtol: float = 1e-9,
) -> FireWeights:
    """Weights of ``f_θ`` whose FIRE bias is ``values[h, i - j]`` for ``j <= i <= L``.

    A construction of this module's own (see the module docstring). With the normaliser
    the constant ``ψ(L) + eps`` for queries at ``i <= L``, the input for offset ``k`` is
    the knot ``x_k = ψ(k) / (ψ(L) + eps)``, increasing in ``k``. The MLP is the
    piecewise-linear interpolant through ``(x_k, values[:, k])``,
    ``f(u) = v_0 + Σ_k Δs_k · relu(u - x_k)``, with a hidden unit only where some head's
    slope changes by more than ``rtol`` times the largest slope: offsets
    ``0 .. N-1`` are matched exactly up to rounding, and past ``x_{N-1}`` the last slope
    continues. Computed in float64.

    Shapes::

        values: [H, N] (floating; N >= 1 offsets 0 .. N-1)
        returns: FireWeights in float64 (hidden = the number of knots kept, at least 1)

    Raises:
        TypeError: ``values`` is not a floating tensor, or a number has the wrong type.
        ValueError: ``values`` is not 2-D with at least one column, ``c`` is zero with the
            log transform, ``threshold`` is negative, ``eps`` negative, both ``threshold``
            and ``eps`` zero, or ``rtol`` negative.
    """
    check_floating_tensor("values", values)
    if values.dim() != 2 or values.shape[1] == 0:
        raise ValueError(f"values must have shape [H, N] with N >= 1, got {tuple(values.shape)}")
    c = check_real("c", c)
    threshold = check_real("threshold", threshold)
    eps = check_real("eps", eps)
    rtol = check_real("rtol", rtol)
    check_bool("log_transform", log_transform)
    if log_transform and c == 0:
        raise ValueError("c must be nonzero: psi(x) = log(|c x| + 1) is 0 everywhere for c = 0")
    if threshold < 0 or eps < 0 or rtol < 0:
        raise ValueError(
            f"threshold, eps and rtol must be non-negative, got {threshold:g}, {eps:g}, {rtol:g}"
        )
    if threshold == 0 and eps == 0:
        raise ValueError("threshold and eps are both 0: the normaliser psi(max(i, L)) is 0")
    v = values.detach().to("cpu", torch.float64)
    heads, count = v.shape

    def psi(x: float) -> float:
        return math.log1p(abs(c * x)) if log_transform else x

    scale = psi(threshold) + eps
    knots = torch.tensor([psi(k) / scale for k in range(count)], dtype=torch.float64)
    slopes = (v[:, 1:] - v[:, :-1]) / (knots[1:] - knots[:-1])  # [H, N-1]
    changes = torch.cat([slopes[:, :1], slopes[:, 1:] - slopes[:, :-1]], dim=1)  # [H, N-1]
    if changes.numel():
        tol = rtol * float(slopes.abs().max())
        keep = (changes.abs() > tol).any(dim=0).nonzero().flatten()
    else:
        keep = torch.zeros(0, dtype=torch.int64)
    if keep.numel() == 0:  # a constant: one unit with no weight out
        return FireWeights(
            torch.ones(1, 1, dtype=torch.float64),
            torch.zeros(1, dtype=torch.float64),
            torch.zeros(heads, 1, dtype=torch.float64),
            v[:, 0].clone(),
        )
    return FireWeights(
        torch.ones(keep.numel(), 1, dtype=torch.float64),
        -knots[keep],
        changes[:, keep],
        v[:, 0].clone(),
    )


def fire_representing_alibi(
    slopes: Tensor,
    threshold: int,
    *,
    c: float = 0.1,
    eps: float = 1e-6,
    log_transform: bool = False,
) -> FireWeights:
    """Weights of ``f_θ`` whose FIRE bias is ALiBi's ``-m_h (i - j)`` for ``j <= i <= L``.

    :func:`fire_mlp_for_offsets` with ``values[h, k] = -slopes[h] · k`` for
    ``k = 0 .. threshold``. With ``log_transform=False`` (``ψ`` the identity) it has one
    hidden unit; under the log it needs one per offset.

    Shapes::

        slopes: [H] (floating)    returns: FireWeights in float64

    Raises:
        TypeError, ValueError: ``slopes`` is not a 1-D floating tensor, ``threshold`` is
            not a non-negative int, or as :func:`fire_mlp_for_offsets`.
    """
    check_floating_tensor("slopes", slopes)
    if slopes.dim() != 1:
        raise ValueError(f"slopes must have shape [H], got {tuple(slopes.shape)}")
    check_int("threshold", threshold, 0)
    offsets = torch.arange(threshold + 1, dtype=torch.float64)
    values = -slopes.detach().to("cpu", torch.float64).unsqueeze(-1) * offsets
    return fire_mlp_for_offsets(values, c, float(threshold), eps=eps, log_transform=log_transform)


def fire_representing_t5(
    table: Tensor,
    threshold: int,
    *,
    num_buckets: int = 32,
    max_distance: int = 128,
    c: float = 0.1,
    eps: float = 1e-6,
    log_transform: bool = True,
) -> FireWeights:
    """Weights of ``f_θ`` whose FIRE bias is T5's causal bias for ``j <= i <= L``.

    T5's decoder (``bidirectional=False``) gives offset ``k = i - j`` the bucket
    :func:`pecode.relative.t5_relative_position_bucket` of ``-k`` and head ``h`` the entry
    ``table[bucket, h]``: a step function of ``k``. :func:`fire_mlp_for_offsets` matches
    it at ``k = 0 .. threshold`` with at most two hidden units per bucket boundary.

    Shapes::

        table: [num_buckets, H] (floating; T5RelativePositionBias.bias.weight)
        returns: FireWeights in float64

    Raises:
        TypeError, ValueError: ``table`` is not ``[num_buckets, H]`` floating, ``threshold``
            is not a non-negative int, bad bucket settings (as
            :func:`~pecode.relative.t5_relative_position_bucket`), or as
            :func:`fire_mlp_for_offsets`.
    """
    from pecode.relative.t5 import t5_relative_position_bucket

    check_floating_tensor("table", table)
    check_int("threshold", threshold, 0)
    offsets = torch.arange(threshold + 1)
    buckets = t5_relative_position_bucket(-offsets, False, num_buckets, max_distance)
    if table.dim() != 2 or table.shape[0] != num_buckets:
        raise ValueError(
            f"table must have shape [num_buckets={num_buckets}, H], got {tuple(table.shape)}"
        )
    values = table.detach().to("cpu", torch.float64)[buckets].t()  # [H, threshold + 1]
    return fire_mlp_for_offsets(values, c, float(threshold), eps=eps, log_transform=log_transform)


class FIRE(PositionScheme):
    """FIRE as a :class:`~pecode.attention.PositionScheme`: a learned function of the
    normalised offset, every head an output of one MLP.

    The state-dict names are the listing's: ``mlp.0`` and ``mlp.2`` (the two linear
    layers), ``c``, ``init_L`` (the fixed ``L0``, a buffer here) and ``L_multiplier``.

    Args:
        num_heads: the attention layer's heads (the MLP's outputs).
        hidden: the MLP's hidden width, 32 by default.
        init_c: ``c``'s initial value (0.1).
        init_L: ``L0``, the threshold's fixed scale (512); ``L = |L_multiplier · L0|``.
        eps: added to the normaliser (1e-6).
        log_transform: ``ψ(x) = log(|c x| + 1)``; False for ``ψ`` the identity.

    Attributes:
        mlp: ``Linear(1, hidden) -> ReLU -> Linear(hidden, num_heads)``.
        c: the log transform's scale, learned.
        L_multiplier: the threshold's learned multiplier, initially 1.

    Raises:
        TypeError, ValueError: bad ``num_heads``, ``hidden``, ``init_c``, ``init_L``,
            ``eps`` or ``log_transform``.
    """

    score_bias_reads_keys = False  # the bias depends on the positions only

    def __init__(
        self,
        num_heads: int,
        hidden: int = 32,
        *,
        init_c: float = 0.1,
        init_L: float = 512.0,
        eps: float = 1e-6,
        log_transform: bool = True,
    ) -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads)
        self.hidden = check_int("hidden", hidden)
        self.eps = check_real("eps", eps)
        if self.eps < 0:
            raise ValueError(f"eps must be non-negative, got {self.eps:g}")
        self.log_transform = check_bool("log_transform", log_transform)
        self.mlp = nn.Sequential(nn.Linear(1, hidden), nn.ReLU(), nn.Linear(hidden, num_heads))
        self.c = nn.Parameter(torch.tensor(check_real("init_c", init_c)))
        self.register_buffer("init_L", torch.tensor(check_real("init_L", init_L)))
        self.L_multiplier = nn.Parameter(torch.tensor(1.0))

    @property
    def threshold(self) -> Tensor:
        """``L = |L_multiplier · L0|``, a 0-dim tensor (differentiable)."""
        return (self.L_multiplier * self.init_L).abs()

    @property
    def weights(self) -> FireWeights:
        """The MLP's weights as :func:`fire_mlp` takes them."""
        first, last = self.mlp[0], self.mlp[2]
        return FireWeights(first.weight, first.bias, last.weight, last.bias)

    def position_bias(
        self, q_positions: Tensor, k_positions: Tensor, dtype: torch.dtype | None = None
    ) -> Tensor:
        """:func:`fire_bias` with this module's parameters, in ``dtype`` (the parameters'
        by default): ``[H, Lq, Lk]``, or ``[B, H, Lq, Lk]`` for batched positions."""
        dtype = self.c.dtype if dtype is None else dtype
        weights = FireWeights(*(w.to(dtype) for w in self.weights))
        return fire_bias(
            q_positions,
            k_positions,
            self.c.to(dtype),
            self.threshold.to(dtype),
            weights,
            eps=self.eps,
            log_transform=self.log_transform,
        )

    def score_bias(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """The bias, in ``q``'s dtype or float32, whichever is wider.

        Raises:
            ValueError: ``q`` does not have ``num_heads`` heads.
        """
        if q.shape[1] != self.num_heads:
            raise ValueError(f"q has {q.shape[1]} heads, FIRE was built for {self.num_heads}")
        return self.position_bias(
            q_positions, k_positions, torch.promote_types(q.dtype, torch.float32)
        )

    def extra_repr(self) -> str:
        return (
            f"num_heads={self.num_heads}, hidden={self.hidden}, eps={self.eps!r}, "
            f"log_transform={self.log_transform}"
        )
