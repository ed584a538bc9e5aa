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
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "KVCache",
    "MultiHeadAttention",
    "PositionScheme",
    "additive_mask",
    "causal_mask",
    "forward_in_chunks",
]


class PositionScheme(nn.Module):
    """How positions enter attention; this base class adds no position information.

    Subclasses override one or both hooks. Shapes, with ``B`` the batch, ``H`` the
    heads, ``Lq``/``Lk`` the query/key lengths and ``Dh`` the head dimension::

        q: [B, H, Lq, Dh]    k: [B, H, Lk, Dh]
        q_positions: [Lq] or [B, Lq]    k_positions: [Lk] or [B, Lk]   (integer)

    A scheme that holds parameters (a learned bias table, say) registers them as
    usual; :class:`MultiHeadAttention` owns the scheme, so they train with it.
    """

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
    total: Tensor | None = None
    if bias is not None:
        if not bias.is_floating_point():
            raise TypeError(f"bias must be a floating tensor, got {bias.dtype}")
        total = bias.to(dtype)
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            as_float = torch.zeros(attn_mask.shape, dtype=dtype, device=device)
            as_float = as_float.masked_fill(~attn_mask, float("-inf"))
        elif attn_mask.is_floating_point():
            as_float = attn_mask.to(dtype)
        else:
            raise TypeError(f"attn_mask must be bool or floating, got {attn_mask.dtype}")
        total = as_float if total is None else total + as_float
    if causal:
        allowed = causal_mask(q_len, k_len, device=device)
        blocked = torch.zeros(q_len, k_len, dtype=dtype, device=device)
        blocked = blocked.masked_fill(~allowed, float("-inf"))
        total = blocked if total is None else total + blocked
    return total


class KVCache:
    """Keys, values and key positions of earlier calls, for decoding one step at a time.

    :class:`MultiHeadAttention` appends each call's keys *after*
    :meth:`PositionScheme.transform_qk` (for RoPE: already rotated), its values and
    its positions, and attends over everything cached. This is exact for schemes
    whose ``transform_qk`` treats each key by its own position (none, RoPE); the
    other hooks receive all cached keys and their positions. One cache per layer.

    Shapes::

        keys, values: [B, H, Lk, Dh]    positions: [Lk] or [B, Lk]
    """

    def __init__(self) -> None:
        self.keys: Tensor | None = None
        self.values: Tensor | None = None
        self.positions: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.keys is None else self.keys.shape[-2]

    @property
    def next_position(self) -> int:
        """One past the largest cached position (the default position of the next token)."""
        return 0 if self.positions is None else int(self.positions.max()) + 1

    def append(self, k: Tensor, v: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Add new keys, values and positions; return the cached ones, new included.

        Raises:
            ValueError: the new keys do not match the cached batch, heads or head size.
        """
        if self.keys is None or self.values is None or self.positions is None:
            self.keys, self.values, self.positions = k, v, positions
            return k, v, positions
        if k.shape[:2] != self.keys.shape[:2] or k.shape[-1] != self.keys.shape[-1]:
            raise ValueError(
                f"new keys of shape {tuple(k.shape)} do not fit the cache's "
                f"{tuple(self.keys.shape)}"
            )
        old, new = self.positions, positions
        if old.dim() != new.dim():  # a mix of [L] and [B, L]: expand both to [B, L]
            batch = k.shape[0]
            old = old.expand(batch, -1) if old.dim() == 1 else old
            new = new.expand(batch, -1) if new.dim() == 1 else new
        self.keys = torch.cat((self.keys, k), dim=-2)
        self.values = torch.cat((self.values, v), dim=-2)
        self.positions = torch.cat((old, new), dim=-1)
        return self.keys, self.values, self.positions


class MultiHeadAttention(nn.Module):
    """Multi-head self-attention (Vaswani et al. 2017, §3.2) with a pluggable position scheme.

    ``out = Concat(head_1..head_H) W_O`` with
    ``head_h = softmax(q_h k_hᵀ / sqrt(Dh) + bias_h) v_h``, computed by
    :func:`torch.nn.functional.scaled_dot_product_attention`.

    Args:
        embed_dim: model width ``D``; must be divisible by ``num_heads``.
        num_heads: number of heads ``H`` (positive).
        position: a :class:`PositionScheme`, or ``None`` for no positions inside
            attention (the right choice when positions were added to the embeddings).
        bias: whether the four projections have a bias.
        dropout: dropout on the attention probabilities, active in training mode only.

    Raises:
        ValueError: ``num_heads`` or ``embed_dim`` is not positive, ``embed_dim`` is not
            divisible by ``num_heads``, or ``dropout`` is outside ``[0, 1)``.
        TypeError: ``position`` is not a :class:`PositionScheme`.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        position: PositionScheme | None = None,
        bias: bool = True,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        if num_heads <= 0:
            raise ValueError(f"num_heads must be positive, got {num_heads}")
        if embed_dim <= 0:
            raise ValueError(f"embed_dim must be positive, got {embed_dim}")
        if embed_dim % num_heads != 0:
            raise ValueError(f"embed_dim={embed_dim} must be divisible by num_heads={num_heads}")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {dropout}")
        if position is not None and not isinstance(position, PositionScheme):
            raise TypeError(
                f"position must be a PositionScheme or None, got {type(position).__name__}"
            )
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.position = position if position is not None else PositionScheme()
        self.q_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.k_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.v_proj = nn.Linear(embed_dim, embed_dim, bias=bias)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def forward(
        self,
        x: Tensor,
        *,
        positions: Tensor | None = None,
        causal: bool = False,
        attn_mask: Tensor | None = None,
        cache: KVCache | None = None,
    ) -> Tensor:
        """Attend over ``x`` (and, with a ``cache``, over the keys of earlier calls).

        Shapes, with ``Lk = L`` plus the cached length::

            x:         [B, L, D] (floating)
            positions: [L] or [B, L] (integer); default 0 .. L-1, or with a cache
                       cache.next_position .. cache.next_position + L - 1
            attn_mask: broadcastable to [B, H, L, Lk]; bool (True = may attend) or float
            returns:   [B, L, D]

        With ``causal=True`` and a cache, the ``L`` queries are the last ``L`` of the
        ``Lk`` keys (:func:`causal_mask`), so feeding a sequence token by token gives
        the same outputs as one causal pass over it.

        Raises:
            ValueError: ``x`` is not 3-D with last dimension ``embed_dim``, or
                ``positions`` / ``attn_mask`` do not fit ``x``.
            TypeError: ``x`` is not floating, ``positions`` is not integer, or
                ``cache`` is not a :class:`KVCache`.
        """
        q, k, v, mask, q_positions, k_positions = self._prepare(
            x, positions, causal, attn_mask, cache
        )
        dropout = self.dropout if self.training else 0.0
        if self.position.has_output_term:
            weights = F.dropout(self._weights(q, k, mask), p=dropout, training=self.training)
            out = weights @ v + self.position.output_term(weights, q_positions, k_positions)
        else:
            scale = self.position.logit_scale(self.head_dim)
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, dropout_p=dropout, scale=scale
            )
        return self.out_proj(self._merge_heads(out))

    def attention_weights(
        self,
        x: Tensor,
        *,
        positions: Tensor | None = None,
        causal: bool = False,
        attn_mask: Tensor | None = None,
    ) -> Tensor:
        """The attention probabilities that :meth:`forward` uses (no dropout).

        For inspection and figures; :meth:`forward` never materializes them.

        Shapes::

            x: [B, L, D]    returns: [B, H, L, L], each row sums to 1
        """
        q, k, _, mask, _, _ = self._prepare(x, positions, causal, attn_mask, None)
        return self._weights(q, k, mask)

    def _weights(self, q: Tensor, k: Tensor, mask: Tensor | None) -> Tensor:
        """softmax(q·kᵀ · scale + mask): the weights, computed explicitly."""
        logits = (q @ k.transpose(-2, -1)) * self.position.logit_scale(self.head_dim)
        if mask is not None:
            logits = logits + mask
        return logits.softmax(dim=-1)

    def _prepare(
        self,
        x: Tensor,
        positions: Tensor | None,
        causal: bool,
        attn_mask: Tensor | None,
        cache: KVCache | None,
    ) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor, Tensor]:
        """Project to heads, apply the position scheme, extend the cache, build the mask.

        Returns ``q, k, v, mask, q_positions, k_positions`` (``k``, ``v`` and
        ``k_positions`` include the cached keys).
        """
        self._check_input(x)
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache or None, got {type(cache).__name__}")
        batch, length, _ = x.shape
        start = 0 if cache is None else cache.next_position
        positions = self._check_positions(positions, batch, length, x.device, start)
        k_len = length + (0 if cache is None else len(cache))
        if attn_mask is not None:  # checked before the cache grows
            _check_mask_shape(attn_mask, batch, self.num_heads, length, k_len)
        q = self._split_heads(self.q_proj(x))
        k = self._split_heads(self.k_proj(x))
        v = self._split_heads(self.v_proj(x))
        q, k = self.position.transform_qk(q, k, positions, positions)
        k_positions = positions
        if cache is not None:
            k, v, k_positions = cache.append(k, v, positions)
        bias = self.position.score_bias(q, k, positions, k_positions)
        mask = additive_mask(
            attn_mask,
            causal=causal,
            bias=bias,
            q_len=length,
            k_len=k_len,
            dtype=q.dtype,
            device=q.device,
        )
        return q, k, v, mask, positions, k_positions

    def _check_input(self, x: Tensor) -> None:
        if not isinstance(x, Tensor):
            raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
        if not x.is_floating_point():
            raise TypeError(f"x must be a floating tensor, got {x.dtype}")
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(
                f"x must have shape [batch, seq, {self.embed_dim}], got {tuple(x.shape)}"
            )
        if x.shape[1] == 0:
            raise ValueError("x must contain at least one position (seq > 0)")

    @staticmethod
    def _check_positions(
        positions: Tensor | None, batch: int, length: int, device: torch.device, start: int = 0
    ) -> Tensor:
        if positions is None:
            return torch.arange(start, start + length, device=device)
        if positions.is_floating_point() or positions.dtype == torch.bool:
            raise TypeError(f"positions must be an integer tensor, got {positions.dtype}")
        if positions.shape not in ((length,), (batch, length)):
            raise ValueError(
                f"positions must have shape [{length}] or [{batch}, {length}], "
                f"got {tuple(positions.shape)}"
            )
        return positions.to(device)

    def _split_heads(self, t: Tensor) -> Tensor:
        batch, length, _ = t.shape
        return t.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

    def _merge_heads(self, t: Tensor) -> Tensor:
        batch, _, length, _ = t.shape
        return t.transpose(1, 2).reshape(batch, length, self.embed_dim)


def _check_mask_shape(mask: Tensor, batch: int, heads: int, q_len: int, k_len: int) -> None:
    """Raise ValueError unless ``mask`` broadcasts to ``[batch, heads, q_len, k_len]``."""
    target = (batch, heads, q_len, k_len)
    try:
        shape = torch.broadcast_shapes(mask.shape, target)
    except RuntimeError:
        shape = None
    if shape != target:
        raise ValueError(
            f"attn_mask of shape {tuple(mask.shape)} does not broadcast to {list(target)}"
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
