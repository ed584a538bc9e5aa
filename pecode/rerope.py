"""ReRoPE and Leaky ReRoPE: RoPE with relative distances clipped past a window (chapter 11.1).

Su (2023, "ReRoPE", github.com/bojone/rerope) keeps RoPE's relative distance ``d = i - j``
below a window ``w`` and holds it at ``w`` beyond (ReRoPE), or lets it grow ``k`` times
slower there, ``w + (d - w) / k`` (Leaky ReRoPE). A model trained on ``L > w`` tokens
then never meets a distance it did not see, however long the input, with no retraining:
:func:`clipped_distance` is the rule. The reference code computes two score matrices
(it is causal), one with RoPE at the true positions and one at the clipped distance, and
picks per entry; :class:`ReRoPE` does the same as a
:class:`~pecode.attention.PositionScheme`, with a third for keys after the query. Su's
patches also multiply each query by ``max(1, ln(p + 1) / ln L_train)`` (Qwen's ``logn``,
:func:`pecode.scaling.logn_query_scale`); :class:`ReRoPE` is the clipping alone.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from pecode._checks import check_int
from pecode.attention import PositionScheme
from pecode.rope import RotaryEmbedding, apply_rope, rope_cos_sin, rope_inv_freq

__all__ = ["ReRoPE", "clipped_distance"]


def _check_leak(leak: object) -> float | None:
    if leak is None:
        return None
    if isinstance(leak, bool) or not isinstance(leak, int | float):
        raise TypeError(f"leak must be a number or None, got {type(leak).__name__}")
    if not (math.isfinite(leak) and leak > 1):
        raise ValueError(f"leak must be a finite number greater than 1, got {leak}")
    return float(leak)


def clipped_distance(distance: Tensor, window: int, leak: float | None = None) -> Tensor:
    """The relative distance ReRoPE rotates by: ``d`` where ``|d| < w``, else ``±w``
    (ReRoPE) or ``±(w + (|d| - w) / leak)`` (Leaky ReRoPE), the sign of ``d``.

    Shapes::

        distance: [...] (integer)    returns: [...] float64

    Raises:
        TypeError: ``distance`` is not an integer tensor, ``window`` not an int, ``leak``
            not a number.
        ValueError: ``window`` not positive, ``leak`` not greater than 1.
    """
    if not isinstance(distance, Tensor) or distance.is_floating_point():
        what = distance.dtype if isinstance(distance, Tensor) else type(distance).__name__
        raise TypeError(f"distance must be an integer torch.Tensor, got {what}")
    check_int("window", window)
    leak = _check_leak(leak)
    d = distance.to(torch.float64)
    beyond = window if leak is None else window + (d.abs() - window) / leak
    return torch.where(d.abs() < window, d, d.sign() * beyond)


class ReRoPE(PositionScheme):
    """RoPE whose relative distances stop at a window (ReRoPE) or slow down past it (Leaky).

    The scheme leaves ``q`` and ``k`` as they are (a KV cache keeps them unrotated, as the
    reference code's decoding does) and computes the whole logit in :meth:`score_bias`:
    ``q_i · R(d'_ij) k_j`` with ``d'`` = :func:`clipped_distance`, from three products,
    RoPE at the true positions (``|d| < w``) and at the clipped distances on either side,
    picked entry by entry; :meth:`logit_scale` is then 0, so that the plain ``q · k`` adds
    nothing. The bias carries the rotary's ``1/sqrt(head_dim)``, so a layer with its own
    ``logit_scale`` or ``softcap`` refuses the scheme
    (:attr:`bias_holds_logits`). It costs three ``L × L``
    products (the reference code, causal only, two) and a dense bias.

    Args:
        rotary: the model's RoPE (unscaled, every feature rotated), whose frequencies and
            layout it uses.
        window: ``w``, the largest distance kept as it is plus one.
        leak: ``k`` for Leaky ReRoPE, or None for ReRoPE.

    Raises:
        TypeError: ``rotary`` is not a :class:`~pecode.rope.RotaryEmbedding`, ``window``
            not an int, ``leak`` not a number.
        ValueError: ``rotary`` has a scaling, partial rotary or sections; ``window`` not
            positive; ``leak`` not greater than 1.
    """

    #: Whether :meth:`score_bias` is the whole scaled logit (it is, here), so that
    #: :class:`~pecode.attention.MultiHeadAttention` refuses a layer ``logit_scale`` or
    #: ``softcap``, which would act on the zeroed ``q · k`` alone.
    bias_holds_logits = True

    def __init__(self, rotary: RotaryEmbedding, window: int, *, leak: float | None = None) -> None:
        super().__init__()
        if not isinstance(rotary, RotaryEmbedding):
            raise TypeError(f"rotary must be a RotaryEmbedding, got {type(rotary).__name__}")
        if rotary.scaling is not None or rotary.rotary_dim != rotary.head_dim or rotary.sections:
            raise ValueError(
                "rotary must be plain RoPE over the whole head (no scaling, partial rotary "
                "or sections): ReRoPE clips the distances of the frequencies it was trained with"
            )
        self.window = check_int("window", window)
        self.leak = _check_leak(leak)
        self.head_dim, self.layout = rotary.head_dim, rotary.layout
        inv_freq = rope_inv_freq(rotary.head_dim, rotary.base, dtype=torch.float64)
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        self._base_scale = rotary.logit_scale(rotary.head_dim)

    def extra_repr(self) -> str:
        leak = "" if self.leak is None else f", leak={self.leak!r}"
        return f"head_dim={self.head_dim}, window={self.window}{leak}"

    def logit_scale(self, head_dim: int) -> float:
        """0: the bias holds the whole scaled logit."""
        return 0.0

    def _rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        """``x [B, H, L, Dh]`` rotated by real-valued positions ``[L]`` or ``[B, L]``."""
        cos, sin = rope_cos_sin(positions.to(torch.float64), self.inv_freq.to(positions.device))
        if cos.dim() == 3:  # [B, L, r] -> [B, 1, L, r]
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return apply_rope(x, cos.to(x.dtype), sin.to(x.dtype), self.layout)

    def score_bias(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """``q_i · R(d'_ij) k_j / sqrt(head_dim)`` for every query ``i`` and key ``j``."""
        w, leak = self.window, self.leak
        qp, kp = q_positions.to(torch.float64), k_positions.to(torch.float64)
        distance = q_positions.unsqueeze(-1) - k_positions.unsqueeze(-2)  # [.., Lq, Lk]
        if distance.dim() == 3:
            distance = distance.unsqueeze(1)  # [B, 1, Lq, Lk], shared by the heads
        near = self._rotate(q, qp) @ self._rotate(k, kp).transpose(-2, -1)
        # past the window the distance is i' - j' with j' = j / leak (ReRoPE: j' = 0)
        kk = k if leak is None else self._rotate(k, kp / leak)
        logits = near
        for sign in (1.0, -1.0):
            # ReRoPE: the query at +-w; leaky: at (i +- w (leak - 1)) / leak
            shifted = (
                torch.full_like(qp, sign * w)
                if leak is None
                else (qp + sign * w * (leak - 1)) / leak
            )
            far = self._rotate(q, shifted) @ kk.transpose(-2, -1)
            beyond = distance >= w if sign > 0 else distance <= -w
            logits = torch.where(beyond, far, logits)
        return logits * self._base_scale
