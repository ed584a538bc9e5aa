"""The forget gate of the Forgetting Transformer (Lin, Nikishin, He and Courville, ICLR 2025).

Lin et al., "Forgetting Transformer: Softmax Attention with a Forget Gate"
(arXiv:2503.02130), the section "Forgetting Attention": each head has a scalar forget
gate per time step, ``f_t = sigmoid(w_fᵀ x_t + b_f)``, and the unnormalised attention
score of query ``i`` and key ``j <= i`` is multiplied by ``F_ij = f_{j+1} ··· f_i``.
In logit form,

    ``D_ij = log F_ij = sum_{l=j+1}^{i} log f_l = c_i - c_j``,   ``c_t = sum_{l<=t} log f_l``

is added to the logits, and ``D_ij = -inf`` for ``j > i``: the paper defines Forgetting
Attention for causal attention only. The gate of key ``j`` itself is not in the
product (a key is not forgotten before the next step), and the first token's gate is
never used. The paper's models use no other position encoding (its FoX configurations
turn RoPE off); :class:`ForgettingGate` is such a scheme on its own.

**Where the gate reads from.** A :class:`~pecode.attention.PositionScheme` sees each
head's queries and keys, not the layer input ``x``. :class:`ForgettingGate` reads the
gate from the head's keys: ``f_t = sigmoid(<w_h, k_t> + b_h)``. Since ``k_t = W_k x_t``
(one key head's rows of the key projection), ``<w_h, k_t> = <W_kᵀ w_h, x_t>``: this is the
paper's gate with ``w_f`` restricted to the span of that key head's projection rows
(``Dh`` of the model's ``D`` directions), not the paper's full ``D``-wide gate. With
``qk_norm`` the keys are normalised first, and the gate reads the normalised keys.

**ALiBi** (Press et al. 2022) is the case of a constant gate: with
``f_t = exp(-m_h)`` for every ``t``, ``D_ij = -m_h (i - j)``, ALiBi's causal bias with
slope ``m_h`` (checked in the tests against :mod:`pecode.alibi`).
:func:`constant_gate_logits` gives the gate bias ``b_h`` of that constant gate.

**Order, not positions.** The sum runs over the keys in the order the layer holds
them; the integer positions are not read. The queries are the *last* ``Lq`` of the
``Lk`` keys (the layout of decoding with a :class:`~pecode.attention.KVCache`, whose
keys, cached ones included, reach :meth:`ForgettingGate.score_bias`), so query ``i``
is key ``Lk - Lq + i``. Left padding changes nothing a query sees: the sum between a
real key and its query runs over real tokens only. A
:class:`~pecode.streaming.SinkCache` that evicts keys drops their gates from the sum.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pecode._checks import check_floating_tensor, check_heads, check_int, check_query_key
from pecode.attention import PositionScheme

__all__ = [
    "GATE_INIT_STD",
    "ForgettingGate",
    "constant_gate_logits",
    "forgetting_bias",
    "log_forget_gates",
]

_NAME = "ForgettingGate"

GATE_INIT_STD = 0.02
"""Standard deviation of the gate weights at initialisation (the authors' code draws
every linear layer's weights with ``initializer_range = 0.02`` and zeroes the biases)."""


def forgetting_bias(log_f: Tensor, q_len: int | None = None) -> Tensor:
    """The Forgetting Attention logit bias ``D`` from the log forget gates of the keys.

    ``D[..., i, j] = sum_{l=j+1}^{i'} log_f[..., l]`` for ``j <= i'`` and ``-inf`` for
    ``j > i'``, where ``i' = Lk - q_len + i`` is query ``i``'s index among the keys (the
    queries are the last ``q_len`` keys). Computed as ``c_{i'} - c_j`` with ``c`` the
    cumulative sum of ``log_f`` over the keys, in ``log_f``'s dtype or float32 if
    narrower (the authors' kernel also sums in float32; over long sequences the
    difference of two large sums loses the low digits).

    Shapes::

        log_f:   [..., Lk] (floating, each entry <= 0: the log of a gate in (0, 1])
        returns: [..., q_len, Lk]

    Args:
        log_f: the log forget gate of each key, ``log f_t``.
        q_len: the number of queries, at most ``Lk``; default ``Lk``.

    Raises:
        TypeError: ``log_f`` is not a floating tensor, or ``q_len`` is not an int.
        ValueError: ``log_f`` has no key axis or no keys, an entry is positive or NaN
            (a gate was passed instead of its log?), or ``q_len`` is not in ``1 .. Lk``.
    """
    check_floating_tensor("log_f", log_f)
    if log_f.dim() == 0 or log_f.shape[-1] == 0:
        raise ValueError(f"log_f must have a key axis [..., Lk], Lk > 0, got {tuple(log_f.shape)}")
    k_len = log_f.shape[-1]
    q_len = k_len if q_len is None else check_int("q_len", q_len)
    if q_len > k_len:
        raise ValueError(f"q_len={q_len} exceeds Lk={k_len}: the queries are the last keys")
    if not bool((log_f <= 0).all()):
        raise ValueError(
            "log_f must be <= 0 everywhere (the log of a forget gate in (0, 1]); got "
            f"max {float(log_f.max()):g}: pass log f, not f"
        )
    c = log_f.to(torch.promote_types(log_f.dtype, torch.float32)).cumsum(dim=-1)
    c_query = c[..., k_len - q_len :].unsqueeze(-1)  # [..., Lq, 1]
    bias = c_query - c.unsqueeze(-2)  # [..., Lq, Lk]
    query_index = torch.arange(k_len - q_len, k_len, device=log_f.device).unsqueeze(-1)
    after = torch.arange(k_len, device=log_f.device) > query_index  # [Lq, Lk]: j > i'
    return bias.masked_fill(after, float("-inf"))


def log_forget_gates(k: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
    """``log f_t = log sigmoid(<w_h, k_t> + b_h)`` for each head ``h`` and key ``t``.

    Computed in ``k``'s dtype or float32 if narrower, as the authors' code computes the
    gate's ``logsigmoid`` in float32.

    Shapes::

        k: [B, H, Lk, Dh]    weight: [H, Dh]    bias: [H]
        returns: [B, H, Lk]

    Raises:
        TypeError: an argument is not a floating tensor.
        ValueError: ``k`` is not 4-D, or ``weight`` and ``bias`` do not match its heads
            and head dimension.
    """
    check_heads("k", k)
    heads, head_dim = k.shape[1], k.shape[-1]
    check_floating_tensor("weight", weight, (heads, head_dim))
    check_floating_tensor("bias", bias, (heads,))
    dtype = torch.promote_types(k.dtype, torch.float32)
    logits = torch.einsum("bhld,hd->bhl", k.to(dtype), weight.to(dtype))
    return F.logsigmoid(logits + bias.to(dtype).unsqueeze(-1))


def constant_gate_logits(slopes: Tensor) -> Tensor:
    """The gate bias ``b`` with ``sigmoid(b) = exp(-m)``: a constant gate that is ALiBi.

    With the gate weights at zero, ``f_t = sigmoid(b_h) = exp(-m_h)`` for every token
    and :func:`forgetting_bias` is ALiBi's causal bias ``-m_h (i - j)``. Solving,
    ``b = -log(exp(m) - 1)``; the authors' code uses the same expression to start the
    biases of its data-independent gates at chosen decay times ``T = 1 / m``.

    Shapes::

        slopes: [H] (floating, positive)    returns: [H], same dtype

    Raises:
        TypeError: ``slopes`` is not a floating tensor.
        ValueError: ``slopes`` is not 1-D, or a slope is not positive and finite.
    """
    check_floating_tensor("slopes", slopes)
    if slopes.dim() != 1:
        raise ValueError(f"slopes must be 1-D [H], got {tuple(slopes.shape)}")
    if not bool(((slopes > 0) & torch.isfinite(slopes)).all()):
        raise ValueError(f"slopes must be positive and finite, got {slopes.tolist()}")
    return -torch.log(torch.expm1(slopes))


class ForgettingGate(PositionScheme):
    """Forgetting Attention's forget gate as a :class:`~pecode.attention.PositionScheme`.

    Each query head ``h`` has a gate ``f_t = sigmoid(<w_h, k_t> + b_h)`` read from the keys
    it attends to (with grouped-query attention, its group's key head), and its logits
    get :func:`forgetting_bias` of those gates: ``-inf`` above the causal diagonal, so
    attention with it is causal even when ``causal=False`` is passed. See the module
    docstring for how this gate relates to the paper's, which reads the layer input.

    Args:
        num_heads: the attention layer's (query) heads.
        head_dim: the per-head width ``Dh``.

    Attributes:
        weight: ``w_h`` per head, ``[num_heads, head_dim]``, learned.
        bias: ``b_h`` per head, ``[num_heads]``, learned.

    Raises:
        TypeError, ValueError: ``num_heads`` or ``head_dim`` is not a positive int.
    """

    score_bias_reads_keys = True  # the gates are read from the keys

    def __init__(self, num_heads: int, head_dim: int) -> None:
        super().__init__()
        self.num_heads = check_int("num_heads", num_heads)
        self.head_dim = check_int("head_dim", head_dim)
        self.weight = nn.Parameter(torch.empty(num_heads, head_dim))
        self.bias = nn.Parameter(torch.empty(num_heads))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """The authors' initialisation of the gate projection: weights normal with
        standard deviation :data:`GATE_INIT_STD`, biases zero (so ``f ≈ 1/2`` at first)."""
        with torch.no_grad():
            self.weight.normal_(0.0, GATE_INIT_STD)
            self.bias.zero_()

    def score_bias(self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """The bias ``[B, H, Lq, Lk]``; the positions are not read (see the module docstring).

        Raises:
            TypeError: ``q`` or ``k`` is not a floating tensor.
            ValueError: ``q`` and ``k`` do not fit each other, do not have ``num_heads``
                heads of ``head_dim``, or there are more queries than keys.
        """
        check_query_key(q, k)
        check_heads("k", k, num_heads=self.num_heads, head_dim=self.head_dim, built_by=_NAME)
        return forgetting_bias(log_forget_gates(k, self.weight, self.bias), q.shape[2])

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}"
