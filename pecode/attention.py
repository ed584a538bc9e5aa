"""Multi-head attention whose position scheme is a parameter.

Every encoding in the book enters attention in one of four places:

1. added to the token embeddings before attention (sinusoidal, learned): outside
   this module, the scheme here is ``None``;
2. as a transformation of queries and keys (RoPE): :meth:`PositionScheme.transform_qk`;
3. as an additive term on the attention logits, which may depend on the queries and
   keys (ALiBi, T5, Shaw's key term, Transformer-XL's and DeBERTa's position terms):
   :meth:`PositionScheme.score_bias`, with :meth:`PositionScheme.logit_scale` for
   schemes that rescale the logits (DeBERTa);
4. as a term added to the output that depends on the attention weights (Shaw's value
   term): :meth:`PositionScheme.output_term`.

:class:`MultiHeadAttention` calls the hooks and hands the result to
:func:`torch.nn.functional.scaled_dot_product_attention`, with the bias and any
masks folded into one float mask, so every scheme uses PyTorch's fused kernels. Only a
scheme that overrides :meth:`PositionScheme.output_term` needs the weights themselves;
attention then computes them explicitly.

The same module does grouped-query attention (``num_kv_heads`` key/value heads, each
shared by a group of consecutive query heads; Ainslie et al. 2023), multi-query attention
(``num_kv_heads=1``; Shazeer 2019), and cross-attention (keys and values from a separate
``context``, the encoder-decoder attention of Vaswani et al. 2017, §3.2.3).
"""

from __future__ import annotations

import math
import warnings
import weakref
from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pecode._checks import check_bool, check_int, check_integer_tensor, check_real
from pecode.flex import (
    FlexRecompileLimit,
    flex_unsupported,
    offset_bias_attention,
    offset_range,
)
from pecode.scaling import log_length_query_scale

__all__ = [
    "ContentOnly",
    "KVCache",
    "MultiHeadAttention",
    "PositionScheme",
    "additive_mask",
    "causal_mask",
    "forward_in_chunks",
]


class PositionScheme(nn.Module):
    """How positions enter attention; this base class adds no position information.

    Subclasses override one or both hooks. Shapes, with ``B`` the batch, ``H`` the query
    heads, ``Hkv`` the key/value heads (``H`` unless the layer has grouped-query
    attention), ``Lq``/``Lk`` the query/key lengths and ``Dh`` the head dimension::

        q: [B, H, Lq, Dh]    k: [B, Hkv, Lk, Dh] in transform_qk, [B, H, Lk, Dh] in score_bias
        q_positions: [Lq] or [B, Lq]    k_positions: [Lk] or [B, Lk]   (integer)

    :meth:`transform_qk` sees the ``Hkv`` key heads as they are projected (and cached);
    :meth:`score_bias` sees them repeated to the ``H`` query heads (query head ``h``
    uses key head ``h // (H // Hkv)``), so a scheme that combines each query head with
    its own keys needs no knowledge of the grouping. A scheme whose bias never reads
    ``k`` sets :attr:`score_bias_reads_keys` to ``False`` and spares that copy.

    A scheme that holds parameters (a learned bias table, say) registers them as
    usual; :class:`MultiHeadAttention` owns the scheme, so they train with it.
    """

    #: False in a scheme whose :meth:`score_bias` never reads ``k`` (only its shape,
    #: dtype or device): grouped-query attention then hands it the ``Hkv`` key heads
    #: instead of a copy repeated to ``H`` heads.
    score_bias_reads_keys: bool = True

    #: The number of position indices each token has, ``None`` for one (positions
    #: ``[L]`` or ``[B, L]``) and ``A`` for a scheme that reads ``[B, L, A]`` (M-RoPE's
    #: time, height and width; 2-D RoPE's row and column).
    position_axes: int | None = None

    def transform_qk(
        self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Return transformed ``(q, k)`` of the same shapes (identity here)."""
        return q, k

    def score_bias(
        self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor
    ) -> Tensor | None:
        """Return an additive logit bias broadcastable to ``[B, H, Lq, Lk]``, or ``None``.

        The bias is added to the *scaled* logits ``q·k * logit_scale(Dh)``, before the
        softmax; it receives ``q`` and ``k`` after :meth:`transform_qk`.
        """
        return None

    def logit_scale(self, head_dim: int) -> float:
        """The factor on ``q·k``; ``1 / sqrt(head_dim)`` as in Vaswani et al. (2017)."""
        return 1.0 / math.sqrt(head_dim)

    def offset_bias(self, q: Tensor, offsets: Tensor) -> Tensor:
        """The bias as a function of the offset ``p_q - p_k`` alone, for each offset given.

        Shapes::

            q: [B, H, Lq, Dh] (for its heads, dtype and device)    offsets: [n] (integer)
            returns: [H, n] (the layer casts it to q's dtype, as it does the dense bias)

        The base class does not define one. A scheme whose :meth:`score_bias` depends on
        the offset alone (ALiBi, T5, KERPLE, Sandwich) overrides it to agree with
        :meth:`score_bias`; :class:`MultiHeadAttention` can then compute the bias inside
        FlexAttention from this table instead of an ``Lq×Lk`` mask (:mod:`pecode.flex`).
        """
        raise NotImplementedError

    _offset_table = False  # set for each subclass when it is defined

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # decided once per class, not per call, so that torch.compile (2.7 included)
        # reads a class attribute instead of tracing a walk over the MRO
        owner = next(c for c in cls.__mro__ if "score_bias" in vars(c))
        cls._offset_table = owner is not PositionScheme and "offset_bias" in vars(owner)

    @property
    def has_offset_bias(self) -> bool:
        """True when the class that defines :meth:`score_bias` also defines
        :meth:`offset_bias` (a subclass that changes only the bias has no table)."""
        return self._offset_table

    def output_term(self, weights: Tensor, q_positions: Tensor, k_positions: Tensor) -> Tensor:
        """Return a term added to each head's output, computed from the attention weights.

        Shapes::

            weights: [B, H, Lq, Lk] (after dropout)    returns: [B, H, Lq, Dh]

        The base class does not define one; a scheme that overrides this method makes
        attention compute the weights explicitly instead of calling the fused kernel.
        """
        raise NotImplementedError

    @property
    def has_output_term(self) -> bool:
        """True when a subclass overrides :meth:`output_term`."""
        return type(self).output_term is not PositionScheme.output_term

    @property
    def supports_cross_attention(self) -> bool:
        """Whether the scheme may be used in cross-attention.

        In cross-attention the queries and the keys index two different sequences (a
        decoder's tokens and an encoder's), so an offset ``key position - query
        position`` means nothing. True only for a scheme that overrides none of
        :meth:`transform_qk`, :meth:`score_bias` and :meth:`output_term` (the base
        class, :class:`ContentOnly`): T5, BART and Whisper use no positions in their
        encoder-decoder attention. A scheme whose two sequences share one coordinate
        system (time stamps, image coordinates) sets the class attribute
        ``supports_cross_attention = True`` to be accepted.
        """
        cls = type(self)
        return all(
            getattr(cls, hook) is getattr(PositionScheme, hook)
            for hook in ("transform_qk", "score_bias", "output_term")
        )


class ContentOnly(PositionScheme):
    """No positions inside attention, with a chosen factor on ``q·k``.

    T5 does not scale its logits by ``1/sqrt(Dh)`` (Raffel et al. 2020), in its
    encoder-decoder attention either, which has no position bias:
    ``ContentOnly(logit_scale=1.0)`` is that layer's scheme.

    Args:
        logit_scale: the factor on ``q·k``; ``None`` for ``1/sqrt(Dh)``.

    Raises:
        TypeError: ``logit_scale`` is not a real number.
        ValueError: ``logit_scale`` is not positive and finite.
    """

    def __init__(self, logit_scale: float | None = None) -> None:
        super().__init__()
        if logit_scale is not None:
            if isinstance(logit_scale, bool) or not isinstance(logit_scale, (int, float)):
                raise TypeError(
                    f"logit_scale must be a number or None, got {type(logit_scale).__name__}"
                )
            if not (math.isfinite(logit_scale) and logit_scale > 0):
                raise ValueError(f"logit_scale must be positive and finite, got {logit_scale}")
            logit_scale = float(logit_scale)
        self.scale = logit_scale

    def logit_scale(self, head_dim: int) -> float:
        """The chosen factor, or ``1/sqrt(head_dim)``."""
        return super().logit_scale(head_dim) if self.scale is None else self.scale

    def extra_repr(self) -> str:
        return f"logit_scale={self.scale}"


def causal_mask(q_len: int, k_len: int, device: torch.device | str | None = None) -> Tensor:
    """Boolean causal mask, ``True`` where a query may attend to a key.

    The queries are the last ``q_len`` of ``k_len`` positions (the layout of
    decoding with a cache), so query ``i`` sees keys ``0 .. i + k_len - q_len``.

    Shapes::

        returns: [q_len, k_len](bool)

    Raises:
        ValueError: a length is not positive, or ``q_len > k_len``.
    """
    if q_len <= 0 or k_len <= 0:
        raise ValueError(f"q_len and k_len must be positive, got q_len={q_len}, k_len={k_len}")
    if q_len > k_len:
        raise ValueError(f"q_len={q_len} exceeds k_len={k_len}: queries must have keys to see")
    offset = k_len - q_len
    return torch.ones(q_len, k_len, dtype=torch.bool, device=device).tril(diagonal=offset)


def _four_dims(mask: Tensor | None) -> Tensor | None:
    """A per-head mask ``[H, L, Lk]`` as ``[1, H, L, Lk]``: the same values, in a shape
    PyTorch's fused CPU attention kernel accepts (it takes a float mask only in 2-D or
    4-D; a mask that needs a gradient, a learned bias in training, still goes unfused)."""
    return mask.unsqueeze(0) if mask is not None and mask.dim() == 3 else mask


def additive_mask(
    attn_mask: Tensor | None,
    *,
    causal: bool,
    bias: Tensor | None,
    q_len: int,
    k_len: int,
    dtype: torch.dtype,
    device: torch.device,
) -> Tensor | None:
    """Fold a boolean or float mask, the causal mask and a logit bias into one float mask.

    Masked entries become ``-inf``; the result is what ``scaled_dot_product_attention``
    adds to its scaled logits. ``None`` when there is nothing to add.

    Shapes::

        attn_mask: broadcastable to [B, H, q_len, k_len]; bool (True = may attend)
                   or floating (added to the logits)
        bias:      broadcastable to [B, H, q_len, k_len], floating
        returns:   broadcastable to [B, H, q_len, k_len], ``dtype``

    Raises:
        TypeError: ``attn_mask`` is neither bool nor floating, or ``bias`` is not floating.
    """
    if bias is not None and not bias.is_floating_point():
        raise TypeError(f"bias must be a floating tensor, got {bias.dtype}")
    if attn_mask is not None and not (
        attn_mask.dtype == torch.bool or attn_mask.is_floating_point()
    ):
        raise TypeError(f"attn_mask must be bool or floating, got {attn_mask.dtype}")
    # the bool masks are combined first (1 byte an entry), then written into the float
    # total in one masked_fill: no float copy of a mask, no full-size addition for it
    blocked: Tensor | None = None  # True where a query may not see a key
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        blocked = ~attn_mask
    if causal:
        later = ~causal_mask(q_len, k_len, device=device)
        blocked = later if blocked is None else blocked | later
    total: Tensor | None = None if bias is None else bias.to(dtype)
    if attn_mask is not None and attn_mask.is_floating_point():
        total = attn_mask.to(dtype) if total is None else total + attn_mask.to(dtype)
    if blocked is None:
        return total
    if total is None:
        total = torch.zeros((), dtype=dtype, device=device)
    return total.masked_fill(blocked, float("-inf"))


class KVCache:
    """Keys, values and key positions of earlier calls, for decoding one step at a time.

    **Self-attention.** :class:`MultiHeadAttention` appends each call's keys *after*
    :meth:`PositionScheme.transform_qk` (for RoPE: already rotated), its values and
    its positions, and attends over everything cached. This is exact for schemes
    whose ``transform_qk`` treats each key by its own position (none, RoPE); the
    other hooks receive all cached keys and their positions. One cache per layer (the
    first layer that uses it owns it, :meth:`bind`); with grouped-query attention it
    holds the ``Hkv`` key/value heads only.

    Each row continues from its own position: after a prefill with per-row positions
    ``[B, L]`` (left padding, each row's real tokens counted from 0), the next token of
    row ``b`` is at one past row ``b``'s largest cached position (:meth:`next_positions`).
    The cache keeps no padding mask: keep passing the prefill's key mask, extended by
    the new keys, as ``attn_mask``.

    **Multi-axis positions** (M-RoPE, ``RotaryEmbedding(sections=...)``): positions
    ``[B, L, A]`` are cached as they are, and the next text token of row ``b`` is at
    one past the largest index of row ``b`` on *any* axis, on every axis (Qwen2-VL's
    rule for text after an image). Decoding after a prompt with images continues from
    the cached positions themselves: no ``rope_deltas`` kept beside the cache, so none
    can be left over from another prompt. Text positions ``[L]``/``[B, L]`` passed to a
    multi-axis cache mean the same index on every axis.

    **Cross-attention.** The first call with a ``context`` stores the context's keys and
    values; later calls with the same context tensor reuse them instead of projecting
    the context again.

    Shapes::

        keys, values: [B, Hkv, Lk, Dh]    positions: [Lk], [B, Lk] or [B, Lk, A]
    """

    def __init__(self) -> None:
        self.keys: Tensor | None = None
        self.values: Tensor | None = None
        self.positions: Tensor | None = None
        self.context: Tensor | None = None  # the context of a cross-attention cache
        self._next: Tensor | None = None  # one past each row's largest position: [] or [B]
        self._owner: weakref.ref | None = None  # the layer it serves (not kept alive by it)

    def bind(self, layer: nn.Module) -> None:
        """Tie the cache to the attention layer that uses it (done on its first call).

        One cache passed to two layers would mix their keys and values with no error
        (same shapes); the second layer is refused instead.

        Raises:
            ValueError: the cache already serves another layer.
        """
        owner = None if self._owner is None else self._owner()
        if owner is None:
            self._owner = weakref.ref(layer)
        elif owner is not layer:
            raise ValueError(
                f"this KVCache holds the keys of another attention layer "
                f"({type(owner).__name__} at {id(owner):#x}): give each layer its own KVCache"
            )

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    def next_positions(self, length: int, device: torch.device | str | None = None) -> Tensor:
        """Positions of the next ``length`` tokens, each row continuing from its own.

        Row ``b`` continues from one past its *largest* cached position. After a
        left-padded prefill this agrees with transformers' ``generate`` only if the
        padding's positions are at most the last real one: transformers 4.x gives
        padding position 1 (``masked_fill(mask == 0, 1)``), so a row with a single real
        token at position 0 continues from 2 here, from 1 there. Pass ``positions``
        explicitly to follow another convention.

        Shapes::

            returns: [length] while every row shares its positions (0 .. length-1 for an
                     empty cache), [B, length] once per-row positions were cached,
                     [B, length, A] once multi-axis positions were (the same index on
                     every axis: one past the row's largest on any axis, onwards)

        Raises:
            TypeError, ValueError: ``length`` is not a positive int.
        """
        check_int("length", length)
        if self._next is None:
            return torch.arange(length, device=device)
        steps = torch.arange(length, device=self._next.device)
        following = self._next.unsqueeze(-1) + steps
        if self.positions is not None and self.positions.dim() == 3:  # [B, Lk, A]
            batch, _, axes = self.positions.shape
            return following.expand(batch, length).unsqueeze(-1).expand(batch, length, axes)
        return following

    @property
    def next_position(self) -> int:
        """One past the largest cached position, when all rows continue from the same one.

        Raises:
            ValueError: the rows continue from different positions (after a left-padded
                prefill): use :meth:`next_positions`.
        """
        if self._next is None:
            return 0
        if self._next.dim() == 1 and bool((self._next != self._next[0]).any()):
            raise ValueError(
                f"the rows of this cache continue from different positions "
                f"{self._next.tolist()}: use next_positions(length)"
            )
        return int(self._next.max())

    def append(self, k: Tensor, v: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Add new keys, values and positions; return the cached ones, new included.

        Raises:
            ValueError: the cache holds a context's keys (cross-attention), or the new
                keys do not match the cached batch, heads or head size.
        """
        if self.context is not None:
            raise ValueError("this KVCache holds the keys of a context (cross-attention)")
        # one past the largest index: [] for [L], [B] for [B, L] and (over every axis) [B, L, A]
        new_next = positions.amax(dim=(-2, -1) if positions.dim() == 3 else -1) + 1
        if self.keys is None or self.values is None or self.positions is None:
            self.keys, self.values, self.positions, self._next = k, v, positions, new_next
            return k, v, positions
        if k.shape[:2] != self.keys.shape[:2] or k.shape[-1] != self.keys.shape[-1]:
            raise ValueError(
                f"new keys of shape {tuple(k.shape)} do not fit the cache's "
                f"{tuple(self.keys.shape)}"
            )
        old, new = self.positions, positions
        if old.dim() != new.dim():  # a mix of [L], [B, L] and [B, L, A]: expand to the widest
            batch = k.shape[0]
            old = old.expand(batch, -1) if old.dim() == 1 else old
            new = new.expand(batch, -1) if new.dim() == 1 else new
            if old.dim() != new.dim():  # text positions: the same index on every axis
                axes = max(old, new, key=Tensor.dim).shape[-1]
                old = old.unsqueeze(-1).expand(-1, -1, axes) if old.dim() == 2 else old
                new = new.unsqueeze(-1).expand(-1, -1, axes) if new.dim() == 2 else new
        self.keys = torch.cat((self.keys, k), dim=-2)
        self.values = torch.cat((self.values, v), dim=-2)
        self.positions = torch.cat((old, new), dim=1 if old.dim() == 3 else -1)
        self._next = torch.maximum(self._next, new_next)  # [] and [B] broadcast to [B]
        return self.keys, self.values, self.positions

    def store_context(
        self, k: Tensor, v: Tensor, positions: Tensor, context: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Keep a context's keys, values and positions for cross-attention; return them.

        Raises:
            ValueError: the cache is not empty.
        """
        if len(self):
            raise ValueError("store_context needs an empty KVCache")
        self.keys, self.values, self.positions, self.context = k, v, positions, context
        return k, v, positions


class MultiHeadAttention(nn.Module):
    """Multi-head attention (Vaswani et al. 2017, §3.2) with a pluggable position scheme.

    ``out = Concat(head_1..head_H) W_O`` with
    ``head_h = softmax(q_h k_gᵀ / sqrt(Dh) + bias_h) v_g``, computed by
    :func:`torch.nn.functional.scaled_dot_product_attention`, where ``g = h // (H / Hkv)``
    is the key/value head that query head ``h`` reads. ``Hkv = H`` is multi-head
    attention, ``1 < Hkv < H`` grouped-query attention (Ainslie et al. 2023), ``Hkv = 1``
    multi-query attention (Shazeer 2019). The grouping is Hugging Face's (``repeat_kv``)
    and SDPA's (``enable_gqa``), so the K/V weights of such checkpoints load as they are.

    Self-attention, or with a ``context`` in :meth:`forward`, cross-attention: queries
    from ``x``, keys and values from the context.

    Args:
        embed_dim: model width ``D``; must be divisible by ``num_heads``.
        num_heads: number of query heads ``H`` (positive).
        num_kv_heads: number of key/value heads ``Hkv``; must divide ``num_heads``.
            Default ``num_heads``.
        context_dim: width of the context that cross-attention projects keys and values
            from; default ``embed_dim``. With another width the layer does
            cross-attention only.
        position: a :class:`PositionScheme`, or ``None`` for no positions inside
            attention (the right choice when positions were added to the embeddings).
        bias: whether the four projections have a bias.
        dropout: dropout on the attention probabilities, active in training mode only.
        kernel: how an offset bias (:meth:`PositionScheme.offset_bias`: ALiBi, T5,
            KERPLE, Sandwich) reaches the logits. ``"dense"`` folds it into a
            ``[B, H, L, Lk]`` float mask for SDPA. ``"flex"`` computes it inside
            FlexAttention from an ``H·(L + Lk)`` table (:mod:`pecode.flex`) whenever
            FlexAttention can compute the call, and takes the dense path otherwise (on
            the CPU: when a gradient is needed, in float64, or without AVX2; dropout in
            training). ``"auto"`` (the default) does as ``"flex"`` from
            ``L·Lk >= 2048²`` on (a choice: there the mask takes 16 MiB a head in
            float32, and FlexAttention's compile, a few seconds per padded length, is
            paid once per process; chapter 12 measures memory and time), and falls back
            to the dense path, with a warning, if FlexAttention fails.

    Options of the 2024–26 families (each off by default; with none of them the layer
    is the one above):

        head_dim: the per-head width ``Dh``, when it is not ``D / H`` (Gemma, some
            Qwen3 sizes, Mistral-Nemo: ``H·Dh != D``).
        qkv_bias, out_bias: a bias on the q, k, v projections and on the output one,
            where they differ (Qwen2/2.5: q, k, v with a bias, the output without;
            gpt-oss: all four); ``None`` follows ``bias``.
        qk_norm: RMS-normalise queries and keys before the position scheme, with a
            learned gain (``q_norm``, ``k_norm``): ``"head"`` over each head's ``Dh``
            features (Qwen3, Gemma 3; Dehghani et al. 2023's QK-norm),
            ``"projection"`` over the whole projection (OLMo 2), ``"l2"`` over each
            head without a gain and *after* the scheme (Llama 4's ``L2Norm``: an RMS
            norm despite its name; after RoPE, it also removes the attention factor a
            scaled RoPE puts on cos and sin). ``qk_norm_eps`` is the RMSNorm epsilon
            (default 1e-6).
        logit_scale: the factor on ``q·k`` in place of the scheme's (Gemma's
            ``query_pre_attn_scalar ** -0.5``, Granite's ``attention_multiplier``).
        softcap: logits become ``softcap · tanh(logits / softcap)`` before the mask
            (Gemma 2's ``attn_logit_softcapping``).
        sinks: a learned logit per head (``sinks``, zeros at first) that joins each
            softmax as one more column and is dropped after it, so a query can attend
            to nothing (gpt-oss; Xiao et al. 2024's attention sinks, learned).
        window: a query sees only keys fewer than ``window`` positions away
            (``|p_q - p_k| < window``; with ``causal``, the ``window`` latest keys:
            Mistral, Gemma 2/3 and gpt-oss sliding layers).
        chunk: a query sees only keys of its own chunk of ``chunk`` positions
            (``p_q // chunk == p_k // chunk``: Llama 4's chunked attention).
        query_temperature: multiply each query, after the scheme, by
            :func:`pecode.scaling.log_length_query_scale` of its position, with this
            dict's ``beta``, ``length`` and ``offset`` (Llama 4's NoPE layers,
            Ministral 3; :func:`pecode.scaling.hf_query_temperature` reads it from a
            config). With ``"by": "index"`` the count is the query's index in the
            sequence (the cache's length before it, padding included) instead of its
            position, as Llama 4 counts; the two differ in left-padded rows.

    ``window``, ``chunk`` and ``query_temperature`` read positions, so they are for
    self-attention; ``softcap`` and ``sinks`` change the softmax, so the layer then
    computes its weights explicitly (all ``L×Lk`` of them) instead of calling SDPA.

    The projections: ``q_proj`` (``D -> H·Dh``), ``k_proj`` and ``v_proj``
    (``context_dim -> Hkv·Dh``), ``out_proj`` (``H·Dh -> D``), with ``Dh = D / H``
    unless ``head_dim`` is given.

    Raises:
        TypeError: ``embed_dim``, ``num_heads``, ``num_kv_heads`` or ``context_dim`` is
            not an int, ``dropout`` not a number, or ``position`` is not a
            :class:`PositionScheme`.
        ValueError: one of them is not positive, ``embed_dim`` is not divisible by
            ``num_heads`` (without ``head_dim``) or ``num_heads`` by ``num_kv_heads``,
            ``dropout`` is outside ``[0, 1)``, ``position`` was built for another
            ``num_heads`` or ``head_dim`` (a ``num_heads`` or ``head_dim`` attribute
            that differs), or an option above is out of its range (each message names
            it; a bool option that is not a bool is a ``TypeError``).
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        num_kv_heads: int | None = None,
        context_dim: int | None = None,
        position: PositionScheme | None = None,
        bias: bool = True,
        dropout: float = 0.0,
        kernel: str = "auto",
        head_dim: int | None = None,
        qkv_bias: bool | None = None,
        out_bias: bool | None = None,
        qk_norm: str | None = None,
        qk_norm_eps: float = 1e-6,
        logit_scale: float | None = None,
        softcap: float | None = None,
        sinks: bool = False,
        window: int | None = None,
        chunk: int | None = None,
        query_temperature: Mapping[str, Any] | None = None,
    ) -> None:
        super().__init__()
        check_int("embed_dim", embed_dim)
        check_int("num_heads", num_heads)
        num_kv_heads = (
            num_heads if num_kv_heads is None else check_int("num_kv_heads", num_kv_heads)
        )
        context_dim = embed_dim if context_dim is None else check_int("context_dim", context_dim)
        if head_dim is None and embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim={embed_dim} must be divisible by num_heads={num_heads}")
        if num_heads % num_kv_heads != 0:
            raise ValueError(
                f"num_heads={num_heads} must be divisible by num_kv_heads={num_kv_heads}"
            )
        check_bool("bias", bias)
        qkv_bias = bias if qkv_bias is None else check_bool("qkv_bias", qkv_bias)
        out_bias = bias if out_bias is None else check_bool("out_bias", out_bias)
        if isinstance(dropout, bool) or not isinstance(dropout, (int, float)):
            raise TypeError(f"dropout must be a number, got {type(dropout).__name__}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        self.embed_dim, self.context_dim = embed_dim, context_dim
        self.num_heads, self.num_kv_heads = num_heads, num_kv_heads
        self.head_dim = (
            embed_dim // num_heads if head_dim is None else check_int("head_dim", head_dim)
        )
        self.dropout = dropout
        if kernel not in _KERNELS:
            raise ValueError(f"kernel must be one of {list(_KERNELS)}, got {kernel!r}")
        self.kernel = kernel
        self.position = self._check_scheme(position)
        q_width, kv_width = num_heads * self.head_dim, num_kv_heads * self.head_dim
        self.q_proj = nn.Linear(embed_dim, q_width, bias=qkv_bias)
        self.k_proj = nn.Linear(context_dim, kv_width, bias=qkv_bias)
        self.v_proj = nn.Linear(context_dim, kv_width, bias=qkv_bias)
        self.out_proj = nn.Linear(q_width, embed_dim, bias=out_bias)
        self.qk_norm = qk_norm
        if qk_norm is not None:
            if qk_norm not in _QK_NORMS:
                raise ValueError(
                    f"qk_norm must be one of {list(_QK_NORMS)} or None, got {qk_norm!r}"
                )
            eps = check_real("qk_norm_eps", qk_norm_eps, above=0.0)
            per_head, gain = qk_norm != "projection", qk_norm != "l2"
            self.q_norm = nn.RMSNorm(
                self.head_dim if per_head else q_width, eps=eps, elementwise_affine=gain
            )
            self.k_norm = nn.RMSNorm(
                self.head_dim if per_head else kv_width, eps=eps, elementwise_affine=gain
            )
        self.logit_scale = (
            None if logit_scale is None else check_real("logit_scale", logit_scale, above=0.0)
        )
        self.softcap = None if softcap is None else check_real("softcap", softcap, above=0.0)
        if check_bool("sinks", sinks):
            self.sinks = nn.Parameter(torch.zeros(num_heads))
        else:
            self.register_parameter("sinks", None)
        self.window = None if window is None else check_int("window", window)
        self.chunk = None if chunk is None else check_int("chunk", chunk)
        self.query_temperature = _check_temperature(query_temperature)
        if kernel == "flex" and (self.softcap is not None or self.sinks is not None):
            raise ValueError(
                "kernel='flex' computes the softmax inside FlexAttention, where softcap and "
                "sinks do not reach: use kernel='dense' with them"
            )
        self._check_scheme(self.position)  # again, now that logit_scale and softcap are set

    def extra_repr(self) -> str:
        qkv_bias, out_bias = self.q_proj.bias is not None, self.out_proj.bias is not None
        bias = (
            f"bias={qkv_bias}"
            if qkv_bias == out_bias
            else (f"qkv_bias={qkv_bias}, out_bias={out_bias}")
        )
        options = {
            "qk_norm": self.qk_norm,
            "logit_scale": self.logit_scale,
            "softcap": self.softcap,
            "sinks": self.sinks is not None or None,
            "window": self.window,
            "chunk": self.chunk,
            "query_temperature": self.query_temperature,
            "kernel": None if self.kernel == "auto" else self.kernel,
        }
        extra = "".join(f", {k}={v!r}" for k, v in options.items() if v is not None)
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, "
            f"num_kv_heads={self.num_kv_heads}, head_dim={self.head_dim}, "
            f"context_dim={self.context_dim}, {bias}, dropout={self.dropout}{extra}"
        )

    def forward(
        self,
        x: Tensor,
        *,
        context: Tensor | None = None,
        positions: Tensor | None = None,
        context_positions: Tensor | None = None,
        causal: bool = False,
        attn_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """Attend from ``x`` over ``x``, or over ``context`` (cross-attention).

        Shapes, with ``Lk`` the keys: ``L`` plus the cached length, or ``Lc``::

            x:         [B, L, D] (floating)
            context:   [B, Lc, context_dim], same dtype as x
            positions: [L], [1, L] or [B, L] (integer); default 0 .. L-1, or with a self-attention
                       cache each row's next positions (KVCache.next_positions); with a
                       multi-axis scheme (RotaryEmbedding(sections=...)) also [1, L, A] or
                       [B, L, A], one index per axis (M-RoPE)
            context_positions: [Lc] or [B, Lc] (integer); default 0 .. Lc-1
            attn_mask: broadcastable to [B, H, L, Lk]; bool (True = may attend) or float;
                       a key padding mask [B, Lk] is attn_mask[:, None, None, :] (a 3-D
                       mask, or a 2-D one with B == L > 1, is refused as ambiguous)
            returns:   [B, L, D]

        With ``causal=True`` and a cache, the ``L`` queries are the last ``L`` of the
        ``Lk`` keys (:func:`causal_mask`), so feeding a sequence token by token gives
        the same outputs as one causal pass over it. Cross-attention is never causal,
        and accepts only a scheme that does not relate query and key positions
        (:attr:`PositionScheme.supports_cross_attention`); with a cache it projects the
        context once and reuses its keys while the same context tensor is passed.

        Raises:
            ValueError: ``x`` or ``context`` has the wrong shape, ``positions``,
                ``context_positions`` or ``attn_mask`` do not fit (multi-axis
                ``positions`` with a scheme of one axis, another number of axes, or with
                ``window``, ``chunk`` or ``query_temperature``, which read one index per
                token), ``causal=True`` or a position-relating scheme in
                cross-attention, a cache filled by the other kind of attention or by
                another context, or a scheme whose bias does not fit ``[B, H, L, Lk]``.
            TypeError: ``x`` or ``context`` is not floating (or their dtypes differ),
                positions are not integer tensors, or ``cache`` is not a
                :class:`KVCache`.
        """
        q, k, v, mask, q_positions, k_positions = self._prepare(
            x, context, positions, context_positions, causal, attn_mask, cache, flex=True
        )
        if isinstance(mask, _FlexCall):  # an offset bias, computed inside FlexAttention
            out = self._flex(q, k, v, mask, q_positions, k_positions)
            if out is not None:
                return self.out_proj(self._merge_heads(out))
            mask = self._mask(q, k, mask.attn_mask, mask.causal, q_positions, k_positions)
        dropout = self.dropout if self.training else 0.0
        if self.position.has_output_term or self.softcap is not None or self.sinks is not None:
            weights = F.dropout(self._weights(q, k, mask), p=dropout, training=self.training)
            out = _grouped_matmul(weights, v)
            if self.position.has_output_term:
                out = out + self.position.output_term(weights, q_positions, k_positions)
        else:
            scale = self._logit_scale()
            grouped = self.num_kv_heads != self.num_heads  # SDPA has enable_gqa since torch 2.5
            is_causal = isinstance(mask, str)  # _CAUSAL: a causal prefill, no mask tensor
            out = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=None if is_causal else _four_dims(mask),
                dropout_p=dropout,
                is_causal=is_causal,
                scale=scale,
                enable_gqa=grouped,
            )
        return self.out_proj(self._merge_heads(out))

    def attention_weights(
        self,
        x: Tensor,
        *,
        context: Tensor | None = None,
        positions: Tensor | None = None,
        context_positions: Tensor | None = None,
        causal: bool = False,
        attn_mask: Tensor | None = None,
    ) -> Tensor:
        """The attention probabilities that :meth:`forward` uses (no dropout).

        For inspection and figures; :meth:`forward` never materializes them.

        Shapes::

            x: [B, L, D]    context: [B, Lc, context_dim]
            returns: [B, H, L, L] (or [B, H, L, Lc]), each row sums to 1
        """
        q, k, _, mask, _, _ = self._prepare(
            x, context, positions, context_positions, causal, attn_mask, None
        )
        return self._weights(q, k, mask)

    def _weights(self, q: Tensor, k: Tensor, mask: Tensor | str | None) -> Tensor:
        """softmax(q·kᵀ · scale + mask): the weights, computed explicitly (all L×Lk).

        A query that may see no key (a left-padded query under a causal mask) gets
        weights 0, as from ``scaled_dot_product_attention``, instead of the NaN of
        ``softmax`` over ``-inf`` only, which the next layer would spread to every token.
        """
        # in place where autograd allows it: the logits are as large as the weights
        logits = _grouped_matmul(q, k.transpose(-2, -1))
        logits.mul_(self._logit_scale())
        if self.softcap is not None:  # Gemma 2: cap·tanh(logits/cap), before the mask
            logits = torch.tanh(logits / self.softcap) * self.softcap
        if self.sinks is not None:
            return self._weights_with_sinks(logits, mask)
        if mask is None:
            return logits.softmax(dim=-1)
        logits.add_(_as_float_mask(mask, logits))
        sees_nothing = torch.isneginf(logits.amax(dim=-1, keepdim=True))
        # finite logits in those rows first: a NaN softmax would give NaN gradients
        weights = logits.masked_fill_(sees_nothing, 0.0).softmax(dim=-1)
        del logits  # freed before the copy below
        return weights.masked_fill(sees_nothing, 0.0)

    def _logit_scale(self) -> float:
        if self.logit_scale is not None:
            return self.logit_scale
        return self.position.logit_scale(self.head_dim)

    def _weights_with_sinks(self, logits: Tensor, mask: Tensor | str | None) -> Tensor:
        """softmax over the logits and one sink logit per head, the sink's column dropped."""
        if mask is not None:
            logits = logits + _as_float_mask(mask, logits)
        sink = self.sinks.to(logits.dtype).view(1, -1, 1, 1).expand(*logits.shape[:-1], 1)
        return torch.cat((logits, sink), dim=-1).softmax(dim=-1)[..., :-1]

    def _prepare(
        self,
        x: Tensor,
        context: Tensor | None,
        positions: Tensor | None,
        context_positions: Tensor | None,
        causal: bool,
        attn_mask: Tensor | None,
        cache: KVCache | None,
        flex: bool = False,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | str | _FlexCall | None, Tensor, Tensor]:
        """Project to heads, apply the position scheme, use the cache, build the mask.

        Returns ``q, k, v, mask, q_positions, k_positions`` (``k``, ``v`` and
        ``k_positions`` include the cached keys); ``mask`` as :func:`_fold_mask`, or,
        with ``flex`` and a call FlexAttention can compute, a :class:`_FlexCall`.
        """
        batch, length = self._check_call(x, context, causal, cache)
        cross = context is not None
        if positions is None and cache is not None and not cross:
            positions = cache.next_positions(length, x.device)  # each row continues
        # the queries' first index, once the cache made room (a SinkCache evicts)
        past = 0 if cache is None or cross else len(cache)
        axes = None if cross else self.position.position_axes
        positions = self._check_positions("positions", positions, batch, length, x.device, axes)
        if not cross and cache is not None and cache.positions is not None:
            multi_axis = cache.positions.dim() == 3 or positions.dim() == 3
        else:
            multi_axis = positions.dim() == 3
        for option in ("window", "chunk", "query_temperature"):
            if multi_axis and getattr(self, option) is not None:
                raise ValueError(
                    f"positions: {option} reads one index per token, but these positions "
                    "have one per axis ([B, L, A], M-RoPE)"
                )
        reuse = cross and cache is not None and len(cache) > 0  # the context's cached keys
        if cross:
            k_len = len(cache) if reuse else context.shape[1]
            k_positions = self._check_positions(
                "context_positions", context_positions, batch, context.shape[1], x.device
            )
        else:
            if context_positions is not None:
                raise ValueError("context_positions needs a context (cross-attention)")
            k_len = length + (0 if cache is None else len(cache))
            k_positions = positions
        if attn_mask is not None:  # checked before the cache grows
            _check_mask(attn_mask, (batch, self.num_heads, length, k_len))
            attn_mask = attn_mask[(None,) * (4 - attn_mask.dim())]  # SDPA wants >= 2 axes
        q = self._split_heads(self._normed(self.q_proj(x), "q"))
        after = self.qk_norm == "l2"  # Llama 4 normalises the rotated q and k
        if reuse:
            k, v, k_positions = cache.keys, cache.values, cache.positions  # normalised
            q, _ = self.position.transform_qk(q, k, positions, k_positions)
        else:
            source = context if cross else x
            k = self._split_heads(self._normed(self.k_proj(source), "k"), self.num_kv_heads)
            v = self._split_heads(self.v_proj(source), self.num_kv_heads)
            q, k = self.position.transform_qk(q, k, positions, k_positions)
            k = self.k_norm(k) if after else k  # before the cache keeps it
            if cache is not None and cross:
                k, v, k_positions = cache.store_context(k, v, k_positions, context)
            elif cache is not None:
                k, v, k_positions = cache.append(k, v, k_positions)
        q = self.q_norm(q) if after else q
        if self.query_temperature is not None:  # after the scheme, as Llama 4 and Ministral 3
            q = q * self._temperature(positions, past).to(q.device, q.dtype)
        offsets = self._flex_offsets(q, k, v, attn_mask, positions, k_positions) if flex else None
        if offsets is not None:
            return q, k, v, _FlexCall(attn_mask, causal, *offsets), positions, k_positions
        mask = self._mask(q, k, attn_mask, causal, positions, k_positions)
        return q, k, v, mask, positions, k_positions

    def _mask(
        self,
        q: Tensor,
        k: Tensor,
        attn_mask: Tensor | None,
        causal: bool,
        q_positions: Tensor,
        k_positions: Tensor,
    ) -> Tensor | str | None:
        """The window's and chunks' limits, the scheme's bias and the masks, folded."""
        batch, _, length, _ = q.shape
        k_len = k.shape[2]
        attn_mask = self._with_position_mask(attn_mask, q_positions, k_positions)
        bias = self.position.score_bias(q, self._keys_for_bias(k), q_positions, k_positions)
        if bias is not None:
            _check_broadcast(
                f"the bias of {type(self.position).__name__}",
                bias,
                (batch, self.num_heads, length, k_len),
            )
        return _fold_mask(attn_mask, causal, bias, length, k_len, q.dtype, q.device)

    def _flex_offsets(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        attn_mask: Tensor | None,
        q_positions: Tensor,
        k_positions: Tensor,
    ) -> tuple[int, int] | None:
        """The offsets ``(low, high)`` FlexAttention's table must cover, or ``None`` when
        ``kernel`` or this call leave the attention to the dense path."""
        if self.kernel == "dense" or not self.position.has_offset_bias:
            return None
        if self.position.has_output_term or self.softcap is not None or self.sinks is not None:
            return None
        if attn_mask is not None and attn_mask.dtype != torch.bool:
            return None
        if self.training and self.dropout > 0:  # FlexAttention has no dropout
            return None
        if self.kernel == "auto" and (_FLEX_FAILED or q.shape[2] * k.shape[2] < _AUTO_FLEX_ENTRIES):
            return None
        tensors = (q, k, v, *self.position.parameters())
        needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in tensors)
        if flex_unsupported(q, needs_grad) is not None:
            return None
        # one table serves every row: rows at far-apart positions would need one as wide
        # as their distance, and then the dense mask is the smaller
        low, high = offset_range(q_positions, k_positions)
        return (low, high) if high - low + 1 <= 4 * (q.shape[2] + k.shape[2]) else None

    def _flex(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        call: _FlexCall,
        q_positions: Tensor,
        k_positions: Tensor,
    ) -> Tensor | None:
        """The attention by FlexAttention, the bias read from the scheme's offset table;
        ``None`` if FlexAttention failed under ``kernel="auto"`` (the caller goes dense)."""
        low, high = call.low, call.high
        table = self.position.offset_bias(q, torch.arange(low, high + 1, device=q.device))
        _check_broadcast(
            f"the offset bias of {type(self.position).__name__}",
            table[:, None, None, :],
            (self.num_heads, 1, 1, high - low + 1),
        )
        options = {
            "scale": self._logit_scale(),
            "causal": call.causal,
            "window": self.window,
            "chunk": self.chunk,
            "attn_mask": call.attn_mask,
        }
        args = (q, k, v, table, low, q_positions, k_positions)
        try:
            return offset_bias_attention(*args, **options)
        except FlexRecompileLimit as error:  # this call goes dense, with a warning once
            _flex_warn_once("recompile", error, "this call and others like it use the dense mask")
            return None
        except Exception as error:
            if self.kernel == "flex":
                raise
            global _FLEX_FAILED  # auto: any failure of FlexAttention means the dense path
            _FLEX_FAILED = True
            _flex_warn_once("failed", error, "kernel='auto' uses the dense mask from now on")
            return None

    def _temperature(self, positions: Tensor, past: int) -> Tensor:
        """The query temperature, ``[B or 1, 1, L, 1]``, of the position or the index."""
        options = dict(self.query_temperature)
        if options.pop("by") == "index":
            positions = torch.arange(past, past + positions.shape[-1], device=positions.device)
        return log_length_query_scale(positions, **options).unsqueeze(-1).unsqueeze(-3)

    def _normed(self, t: Tensor, which: str) -> Tensor:
        """``t`` ([B, L, heads·Dh]) RMS-normalised before the scheme as ``qk_norm`` says
        (unchanged if None, or for ``"l2"``, which comes after the scheme)."""
        if self.qk_norm in (None, "l2"):
            return t
        norm = self.q_norm if which == "q" else self.k_norm
        if self.qk_norm == "projection":
            return norm(t)
        return norm(t.unflatten(-1, (-1, self.head_dim))).flatten(-2)

    def _with_position_mask(
        self, attn_mask: Tensor | None, q_positions: Tensor, k_positions: Tensor
    ) -> Tensor | None:
        """``attn_mask`` with the sliding window's and the chunks' limits folded in."""
        if self.window is None and self.chunk is None:
            return attn_mask
        # [.., L, 1] against [.., 1, Lk]
        q_pos, k_pos = q_positions.unsqueeze(-1), k_positions.unsqueeze(-2)
        visible = torch.ones((), dtype=torch.bool, device=q_pos.device)
        if self.window is not None:
            visible = visible & ((q_pos - k_pos).abs() < self.window)
        if self.chunk is not None:
            visible = visible & (
                q_pos.div(self.chunk, rounding_mode="floor")
                == k_pos.div(self.chunk, rounding_mode="floor")
            )
        visible = visible.unsqueeze(-3)  # the head axis: [L, Lk] -> [1, L, Lk], [B, 1, L, Lk]
        if visible.dim() == 3:
            visible = visible.unsqueeze(0)
        if attn_mask is None:
            return visible
        if attn_mask.dtype == torch.bool:
            return attn_mask & visible
        return attn_mask.masked_fill(~visible, float("-inf"))

    def _keys_for_bias(self, k: Tensor) -> Tensor:
        """``k`` repeated to the query heads, for a scheme whose bias reads the keys."""
        scheme = type(self.position)
        reads_keys = (
            scheme.score_bias is not PositionScheme.score_bias and scheme.score_bias_reads_keys
        )
        if not reads_keys or self.num_kv_heads == self.num_heads:
            return k
        return k.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)

    def _check_scheme(self, position: object) -> PositionScheme:
        """``position`` (a fresh base scheme for ``None``), checked against the layer's sizes."""
        if position is None:
            return PositionScheme()
        if not isinstance(position, PositionScheme):
            raise TypeError(
                f"position must be a PositionScheme or None, got {type(position).__name__}"
            )
        # a scheme whose bias is the whole logit (ReRoPE's bias_holds_logits): the layer's
        # logit_scale or softcap would act on q·k alone, which the scheme zeroes
        if getattr(self, "kernel", None) == "flex" and not position.has_offset_bias:
            raise ValueError(
                f"kernel='flex' needs a scheme whose bias is a function of the offset "
                f"(PositionScheme.offset_bias: ALiBi, T5, KERPLE, Sandwich); "
                f"{type(position).__name__} has none: use kernel='auto' or 'dense'"
            )
        if getattr(position, "bias_holds_logits", False):
            for option in ("logit_scale", "softcap"):
                if getattr(self, option, None) is not None:
                    raise ValueError(
                        f"{option}: the position scheme {type(position).__name__} computes the "
                        f"whole logit in its bias, where the layer's {option} would not reach; "
                        "leave it unset"
                    )
        for name, value in (("num_heads", self.num_heads), ("head_dim", self.head_dim)):
            built_for = getattr(position, name, None)
            if isinstance(built_for, int) and built_for != value:
                raise ValueError(
                    f"the position scheme {type(position).__name__} was built for "
                    f"{name}={built_for}, the attention layer has {name}={value}"
                )
        return position

    def _check_call(
        self, x: Tensor, context: Tensor | None, causal: bool, cache: KVCache | None
    ) -> tuple[int, int]:
        """Check the inputs of one call against each other; return ``(batch, length)``."""
        self._check_tensor("x", x, self.embed_dim)
        check_bool("causal", causal)  # "False" is truthy: it would run causal
        self._check_scheme(self.position)  # it may have been replaced since __init__
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache or None, got {type(cache).__name__}")
        if cache is not None:
            cache.bind(self)
        batch, length, _ = x.shape
        if context is None:
            if self.context_dim != self.embed_dim:
                raise ValueError(
                    f"this layer projects keys from context_dim={self.context_dim}: "
                    f"pass a context (cross-attention)"
                )
            if cache is not None and cache.context is not None:
                raise ValueError(
                    "this KVCache holds the keys of a context (cross-attention): pass that "
                    "context, or give self-attention a KVCache of its own"
                )
            if cache is not None and cache.keys is not None and cache.keys.shape[0] != batch:
                raise ValueError(f"x has batch {batch}, the cache holds {cache.keys.shape[0]}")
            return batch, length
        self._check_tensor("context", context, self.context_dim)
        if context.shape[0] != batch:
            raise ValueError(f"context has batch {context.shape[0]}, x has batch {batch}")
        if context.dtype != x.dtype:
            raise TypeError(f"context has dtype {context.dtype}, x has {x.dtype}")
        if causal:
            raise ValueError(
                "causal=True is for self-attention: in cross-attention every query may see "
                "the whole context (mask its padding with attn_mask)"
            )
        for option in ("window", "chunk", "query_temperature"):
            if getattr(self, option) is not None:
                raise ValueError(
                    f"{option} reads query and key positions, which in cross-attention index "
                    "two different sequences: it is for self-attention"
                )
        if not self.position.supports_cross_attention:
            raise ValueError(
                f"{type(self.position).__name__} relates query and key positions, but in "
                f"cross-attention they index two different sequences: use position=None or "
                f"ContentOnly (T5, BART and Whisper use no positions there), or set "
                f"supports_cross_attention = True on a scheme whose sequences share "
                f"one coordinate system"
            )
        if cache is not None and len(cache) and cache.context is not context:
            if cache.context is None:
                raise ValueError(
                    "this KVCache holds self-attention keys: give cross-attention a "
                    "KVCache of its own"
                )
            raise ValueError(
                "this KVCache holds the keys of another context: use a fresh KVCache "
                "for a new context"
            )
        return batch, length

    @staticmethod
    def _check_tensor(name: str, t: object, width: int) -> None:
        if not isinstance(t, Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if not t.is_floating_point():
            raise TypeError(f"{name} must be a floating tensor, got {t.dtype}")
        if t.dim() != 3 or t.shape[-1] != width:
            raise ValueError(f"{name} must have shape [batch, seq, {width}], got {tuple(t.shape)}")
        if t.shape[1] == 0:
            raise ValueError(f"{name} must contain at least one position (seq > 0)")

    @staticmethod
    def _check_positions(
        name: str,
        positions: object,
        batch: int,
        length: int,
        device: torch.device,
        axes: int | None = None,
    ) -> Tensor:
        """``positions`` checked and expanded to ``[L]``, ``[B, L]`` or (``axes`` given,
        the scheme's number of position axes) ``[B, L, axes]``."""
        if positions is None:
            return torch.arange(length, device=device)
        check_integer_tensor(name, positions)
        if positions.dim() == 3:  # one index per axis (M-RoPE)
            if axes is None:
                raise ValueError(
                    f"{name} of shape {tuple(positions.shape)} has one index per axis "
                    "([B, L, A]), which needs a multi-axis position scheme (M-RoPE's "
                    "RotaryEmbedding(sections=...), 2-D RoPE); "
                    f"give [{length}] or [{batch}, {length}]"
                )
            if positions.shape[0] not in (1, batch) or tuple(positions.shape[1:]) != (
                length,
                axes,
            ):
                raise ValueError(
                    f"{name} must have shape [{batch}, {length}, {axes}] ([B, L, A], one index "
                    f"per axis of the scheme's {axes}), got {tuple(positions.shape)}"
                )
            return positions.expand(batch, length, axes).to(device)
        if positions.shape == (1, length):  # one row for the batch (HF's position_ids)
            positions = positions.expand(batch, length)
        if positions.shape not in ((length,), (batch, length)):
            raise ValueError(
                f"{name} must have shape [{length}], [1, {length}] or [{batch}, {length}], "
                f"got {tuple(positions.shape)}"
            )
        return positions.to(device)

    def _split_heads(self, t: Tensor, heads: int | None = None) -> Tensor:
        """``[B, L, heads * Dh] -> [B, heads, L, Dh]`` (``heads`` defaults to ``num_heads``)."""
        batch, length, _ = t.shape
        heads = self.num_heads if heads is None else heads
        return t.view(batch, length, heads, self.head_dim).transpose(1, 2)

    def _merge_heads(self, t: Tensor) -> Tensor:
        batch, _, length, _ = t.shape
        return t.transpose(1, 2).reshape(batch, length, self.num_heads * self.head_dim)


_QK_NORMS = ("head", "projection", "l2")
_KERNELS = ("auto", "dense", "flex")

# kernel="auto" takes FlexAttention from this many query-key pairs on (2048²): below it
# the dense mask is small and FlexAttention's compile would not be repaid
_AUTO_FLEX_ENTRIES = 2048 * 2048
_FLEX_FAILED = False  # set once FlexAttention failed under kernel="auto"


class _FlexCall:
    """What :meth:`MultiHeadAttention.forward` needs to run FlexAttention: the masks and
    the offsets its table covers."""

    __slots__ = ("attn_mask", "causal", "high", "low")

    def __init__(self, attn_mask: Tensor | None, causal: bool, low: int, high: int) -> None:
        self.attn_mask, self.causal, self.low, self.high = attn_mask, causal, low, high


_FLEX_WARNED: set[str] = set()  # the kinds of FlexAttention failure already reported


def _flex_warn_once(kind: str, error: Exception, consequence: str) -> None:
    """A RuntimeWarning the first time FlexAttention fails in this way."""
    if kind in _FLEX_WARNED:
        return
    _FLEX_WARNED.add(kind)
    first_line = str(error).splitlines()[0] if str(error) else ""
    warnings.warn(
        f"FlexAttention failed ({type(error).__name__}: {first_line}); {consequence}",
        RuntimeWarning,
        stacklevel=4,
    )


def _check_temperature(temperature: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``query_temperature`` as :func:`pecode.scaling.log_length_query_scale`'s arguments."""
    if temperature is None:
        return None
    if not isinstance(temperature, Mapping):
        raise TypeError(
            f"query_temperature must be a dict or None, got {type(temperature).__name__}"
        )
    unknown = sorted(set(temperature) - {"beta", "length", "offset", "by", "layers"})
    if unknown or "beta" not in temperature or "length" not in temperature:
        raise ValueError(
            "query_temperature takes 'beta', 'length' and optionally 'offset' (the "
            "arguments of log_length_query_scale) and 'by' ('position' or 'index'), got "
            f"{sorted(temperature)}"
        )
    by = temperature.get("by", "position")
    if by not in ("position", "index"):
        raise ValueError(f"query_temperature['by'] must be 'position' or 'index', got {by!r}")
    return {
        "beta": check_real("query_temperature['beta']", temperature["beta"]),
        "length": check_int("query_temperature['length']", temperature["length"]),
        "offset": check_int("query_temperature['offset']", temperature.get("offset", 0), minimum=0),
        "by": by,
    }


# _fold_mask's answer for a causal pass whose queries and keys are the same positions
# and nothing else masked: SDPA's is_causal, no tensor (an L×L mask is 4·L² bytes per
# batch row, 256 MiB at L = 8192)
_CAUSAL = "causal"


def _fold_mask(
    attn_mask: Tensor | None,
    causal: bool,
    bias: Tensor | None,
    q_len: int,
    k_len: int,
    dtype: torch.dtype,
    device: torch.device,
) -> Tensor | str | None:
    """The least the attention needs: ``None``, ``_CAUSAL``, a bool mask or a float one.

    A causal prefill without padding or bias is ``_CAUSAL`` (SDPA's ``is_causal``, whose
    top-left diagonal is :func:`causal_mask`'s when ``q_len == k_len``); one query sees
    every key, so causality adds nothing to a decoding step; a bool mask stays bool
    (1 byte an entry, as transformers' SDPA masks); a bias or a float mask is folded
    by :func:`additive_mask`. SDPA gives the same numbers for all of them (measured
    bit for bit on the CPU, forward and backward, with and without GQA and dropout).
    """
    causal = causal and q_len > 1
    if bias is None and attn_mask is None:
        if not causal:
            return None
        return _CAUSAL if q_len == k_len else causal_mask(q_len, k_len, device=device)
    if bias is None and attn_mask.dtype == torch.bool:
        return attn_mask & causal_mask(q_len, k_len, device=device) if causal else attn_mask
    return additive_mask(
        attn_mask, causal=causal, bias=bias, q_len=q_len, k_len=k_len, dtype=dtype, device=device
    )


def _as_float_mask(mask: Tensor | str, logits: Tensor) -> Tensor:
    """A :func:`_fold_mask` answer as the float mask to add to ``logits`` (L×Lk anyway)."""
    is_causal = isinstance(mask, str)  # _CAUSAL
    return additive_mask(
        None if is_causal else mask,
        causal=is_causal,
        bias=None,
        q_len=logits.shape[-2],
        k_len=logits.shape[-1],
        dtype=logits.dtype,
        device=logits.device,
    )


def _grouped_matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` per head, where ``b``'s head ``g`` serves a group of ``H / Hkv`` of ``a``'s.

    A view, not a copy, of ``b`` repeated to ``H`` heads (``repeat_kv`` without the
    copy). Shapes::

        a: [B, H, M, K]    b: [B, Hkv, K, N]    returns: [B, H, M, N]
    """
    kv_heads = b.shape[1]
    return (a.unflatten(1, (kv_heads, -1)) @ b.unsqueeze(2)).flatten(1, 2)


def _check_mask(mask: Tensor, target: tuple[int, int, int, int]) -> None:
    """Check ``attn_mask``'s dtype and shape against ``target`` = ``(B, H, Lq, Lk)``.

    A mask with fewer than four axes lines up with the last ones, so its leading axis
    meets the heads (3 axes) or the queries (2 axes). A key padding mask ``[B, Lk]``
    then broadcasts by accident when ``B == Lq`` and masks row ``b``'s keys for query
    ``b`` of every row; ``[B, Lq, Lk]`` does when ``B == H``. Refuse both.
    """
    if not isinstance(mask, Tensor):
        raise TypeError(f"attn_mask must be a torch.Tensor or None, got {type(mask).__name__}")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(f"attn_mask must be bool or floating, got {mask.dtype}")
    batch, _, q_len, _ = target
    ambiguous = (mask.dim() == 3 and mask.shape[0] != 1) or (
        mask.dim() == 2 and mask.shape[0] == batch == q_len and batch > 1
    )
    if ambiguous:
        raise ValueError(
            f"attn_mask of shape {tuple(mask.shape)} has fewer axes than [batch, num_heads, "
            f"q_len, k_len] = {list(target)}, so its first axis would line up with the "
            f"{'heads' if mask.dim() == 3 else 'queries'}: give it all four axes "
            f"(a key padding mask [B, Lk] is mask[:, None, None, :], a mask [B, Lq, Lk] is "
            f"mask[:, None], one shared by every row [Lq, Lk] is mask[None, None])"
        )
    _check_broadcast("attn_mask", mask, target)


def _check_broadcast(name: str, t: Tensor, target: tuple[int, int, int, int]) -> None:
    """Raise ValueError unless ``t`` broadcasts to ``target`` = ``(B, H, Lq, Lk)``."""
    try:
        shape = torch.broadcast_shapes(t.shape, target)
    except RuntimeError:
        shape = None
    if shape != target:
        raise ValueError(
            f"{name} of shape {tuple(t.shape)} does not broadcast to [batch, num_heads, "
            f"q_len, k_len] = {list(target)}"
        )


def forward_in_chunks(
    layer: MultiHeadAttention, x: Tensor, chunk_sizes: list[int]
) -> tuple[Tensor, KVCache]:
    """Run a causal ``layer`` over ``x`` piece by piece with a fresh :class:`KVCache`.

    ``chunk_sizes = [5, 1, 1, ...]`` is a prompt of five tokens followed by decoding one
    token at a time; the result should equal ``layer(x, causal=True)``.

    Shapes::

        x: [B, L, D]    returns: ([B, L, D], the cache holding all L keys)

    Raises:
        ValueError: the chunk sizes are not positive or do not add up to ``L``.
    """
    if any(size <= 0 for size in chunk_sizes) or sum(chunk_sizes) != x.shape[1]:
        raise ValueError(
            f"chunk_sizes must be positive and add up to {x.shape[1]}, got {chunk_sizes}"
        )
    cache, outputs, start = KVCache(), [], 0
    for size in chunk_sizes:
        outputs.append(layer(x[:, start : start + size], causal=True, cache=cache))
        start += size
    return torch.cat(outputs, dim=1), cache
