"""Multi-head latent attention (MLA) and its decoupled RoPE (DeepSeek-V2, arXiv 2405.04434, §2.1).

MLA caches one small latent per token instead of every head's keys and values: the
latent ``c = RMSNorm(W_DKV x)`` (``kv_rank`` features), from which each head reads its
key content ``k^C_h = W_UK,h c`` and its value ``v_h = W_UV,h c`` back up. Without
positions, ``W_UK`` could be folded into the query at inference (``q_h · W_UK,h c =
(W_UK,hᵀ q_h) · c``), so attention would run on the latents directly. RoPE breaks that:
``R_m q_h · R_n W_UK,h c = q_h · R_{n-m} W_UK,h c``, a matrix that changes with the
offset, between the two projections. So MLA splits each head: ``nope_dim`` features
without positions, and ``rope_dim`` features rotated by RoPE, whose key ``k^R =
RoPE(W_KR x)`` is computed from ``x`` directly and shared by all heads. The cache holds
``c`` and ``k^R``: ``kv_rank + rope_dim`` numbers per token and layer (576 in DeepSeek-V3,
against ``128 · (192 + 128) = 40960`` for its 128 heads' keys and values cached as
multi-head attention would, or ``2 · 128 · 128 = 32768`` in the DeepSeek-V2 paper's
Table 1, which counts heads of one width ``d_h = 128``): :func:`cache_entries_per_token`.

This module is the teaching form: it expands the latents into every head's keys and
values and calls ``scaled_dot_product_attention``; the absorbed form is an optimisation
of the same numbers.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pecode._checks import check_int, check_integer_tensor, check_real
from pecode.attention import _check_mask, _fold_mask
from pecode.rope import RotaryEmbedding

__all__ = [
    "LatentCache",
    "MultiHeadLatentAttention",
    "cache_entries_per_token",
    "kv_cache_entries_per_token",
    "latent_cache_entries_per_token",
]


def kv_cache_entries_per_token(
    num_kv_heads: int, key_dim: int, value_dim: int | None = None
) -> int:
    """Numbers a key/value cache holds per token and layer: ``Hkv · (Dk + Dv)``.

    Multi-head attention caches every head's key and value (``Hkv = H``; DeepSeek-V2,
    arXiv 2405.04434, Table 1: ``2 n_h d_h`` per layer), grouped-query attention one per
    group (``2 n_g d_h``), multi-query attention one (``2 d_h``). Multiply by the
    element size for bytes and by the layers for the model.

    Args:
        num_kv_heads: the key/value heads ``Hkv`` (``H`` for MHA, the groups for GQA, 1
            for MQA).
        key_dim: the width of one head's key.
        value_dim: the width of one head's value (default ``key_dim``).

    Raises:
        TypeError, ValueError: an argument that is not a positive int.
    """
    check_int("num_kv_heads", num_kv_heads)
    check_int("key_dim", key_dim)
    value_dim = key_dim if value_dim is None else check_int("value_dim", value_dim)
    return num_kv_heads * (key_dim + value_dim)


def latent_cache_entries_per_token(kv_rank: int, rope_dim: int) -> int:
    """Numbers MLA's cache holds per token and layer: ``kv_rank + rope_dim``.

    The latent ``c`` and the one rotated key ``k^R`` that every head shares (DeepSeek-V2,
    Table 1: ``(d_c + d_h^R) l`` for ``l`` layers; with ``d_c = 4 d_h`` and ``d_h^R =
    d_h / 2``, ``4.5 d_h`` per layer, the cache of grouped-query attention with 2.25
    groups). :class:`LatentCache` holds exactly these.

    Raises:
        TypeError, ValueError: an argument that is not a positive int.
    """
    return check_int("kv_rank", kv_rank) + check_int("rope_dim", rope_dim)


def cache_entries_per_token(config: Any, *, num_kv_heads: int | None = None) -> dict[str, int]:
    """Cached numbers per token and layer of a DeepSeek-V2/V3 config: MLA against MHA.

    Reads ``num_attention_heads``, ``kv_lora_rank``, ``qk_rope_head_dim``,
    ``qk_nope_head_dim`` and ``v_head_dim`` from a transformers config or its dict
    (``config.json``). ``"mla"`` is :func:`latent_cache_entries_per_token` (576 for
    DeepSeek-V3: 1152 bytes per token and layer in bfloat16); ``"mha"`` the keys
    (``qk_nope_head_dim + qk_rope_head_dim`` wide) and values of every head, as a
    multi-head cache of the same heads would hold them (40960 for DeepSeek-V3);
    ``"gqa"``, when ``num_kv_heads`` is given, those of ``num_kv_heads`` key/value heads.

    Raises:
        TypeError: ``config`` is neither a mapping nor an object with those attributes, or
            a size is not an int.
        ValueError: a size that is not positive.
    """
    names = ("num_attention_heads", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim")
    read = config.get if isinstance(config, Mapping) else lambda name: getattr(config, name, None)
    sizes = {name: read(name) for name in (*names, "v_head_dim")}
    missing = [name for name in names if sizes[name] is None]
    if missing:
        raise TypeError(f"config has no {', '.join(missing)}: is it a DeepSeek-V2/V3 config?")
    heads = sizes["num_attention_heads"]
    key_dim = sizes["qk_nope_head_dim"] + sizes["qk_rope_head_dim"]
    value_dim = sizes["qk_nope_head_dim"] if sizes["v_head_dim"] is None else sizes["v_head_dim"]
    entries = {
        "mla": latent_cache_entries_per_token(sizes["kv_lora_rank"], sizes["qk_rope_head_dim"]),
        "mha": kv_cache_entries_per_token(
            check_int("num_attention_heads", heads), key_dim, value_dim
        ),
    }
    if num_kv_heads is not None:
        entries["gqa"] = kv_cache_entries_per_token(num_kv_heads, key_dim, value_dim)
    return entries


class LatentCache:
    """The latents ``c`` and rotated shared keys ``k^R`` of earlier calls, for one layer.

    Shapes::

        latents: [B, Lk, kv_rank]    rope_keys: [B, 1, Lk, rope_dim]
    """

    def __init__(self) -> None:
        self.latents: Tensor | None = None
        self.rope_keys: Tensor | None = None

    def __len__(self) -> int:
        return 0 if self.latents is None else self.latents.shape[1]

    def append(self, latents: Tensor, rope_keys: Tensor) -> tuple[Tensor, Tensor]:
        """Add a call's latents and rotated keys; return all of them, the new ones last."""
        if self.latents is None or self.rope_keys is None:
            self.latents, self.rope_keys = latents, rope_keys
        else:
            self.latents = torch.cat((self.latents, latents), dim=1)
            self.rope_keys = torch.cat((self.rope_keys, rope_keys), dim=2)
        return self.latents, self.rope_keys

    def bytes_per_token(self) -> int:
        """What one token costs in this cache: ``(kv_rank + rope_dim) ·`` element size."""
        if self.latents is None or self.rope_keys is None:
            return 0
        return (
            self.latents.shape[-1] * self.latents.element_size()
            + self.rope_keys.shape[-1] * self.rope_keys.element_size()
        )


class MultiHeadLatentAttention(nn.Module):
    """MLA (DeepSeek-V2/V3): queries and keys split into a RoPE-free and a RoPE part.

    Per head ``h``: ``q_h = [q^C_h, RoPE(q^R_h)]`` (from ``q_proj``, or through a
    low-rank ``q_down → RMSNorm → q_up`` when ``q_rank`` is given), ``k_h = [W_UK,h c,
    RoPE(k^R)]`` with one ``k^R`` for all heads, ``v_h = W_UV,h c``, and the output
    ``out_proj(concat_h softmax(q_h · k_h · scale) v_h)``. ``kv_down`` maps ``x`` to
    ``[c, k^R]`` (``kv_rank + rope_dim`` outputs, the latent normalised by ``kv_norm``),
    ``kv_up`` the latent to every head's ``[k^C_h, v_h]``.

    Args:
        embed_dim: the model width ``D``.
        num_heads: ``H``.
        kv_rank: the latent's width (DeepSeek-V3: 512).
        rope_dim: the rotated features per head, shared key included (64).
        nope_dim: the features per head without positions (128).
        v_dim: the value width per head (default ``nope_dim``).
        q_rank: the query's low rank (1536 in DeepSeek-V3), or None for one ``q_proj``.
        rope: the :class:`~pecode.rope.RotaryEmbedding` of the ``rope_dim`` features
            (default: base 10000, ``layout="interleaved"`` as DeepSeek's weights are).
        logit_scale: the factor on ``q·k`` (default ``(nope_dim + rope_dim) ** -0.5``;
            DeepSeek-V3 multiplies it by YaRN's ``mscale²``).
        bias: a bias on ``q_down``, ``kv_down`` and ``out_proj`` (DeepSeek's
            ``attention_bias``; ``q_proj``, ``q_up`` and ``kv_up`` have none).
        eps: the RMSNorms' epsilon.

    No attention dropout (DeepSeek-V2/V3 train without it). Positions default to the
    cache's length onwards for every row; a left-padded batch passes its own.

    Raises:
        TypeError, ValueError: a size that is not a positive int, ``rope_dim`` odd, a
            ``rope`` that is not a ``RotaryEmbedding`` of head width ``rope_dim``, a
            ``logit_scale`` or ``eps`` that is not positive.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        *,
        kv_rank: int,
        rope_dim: int,
        nope_dim: int,
        v_dim: int | None = None,
        q_rank: int | None = None,
        rope: RotaryEmbedding | None = None,
        logit_scale: float | None = None,
        bias: bool = False,
        eps: float = 1e-6,
    ) -> None:
        super().__init__()
        for name, value in (
            ("embed_dim", embed_dim),
            ("num_heads", num_heads),
            ("kv_rank", kv_rank),
            ("rope_dim", rope_dim),
            ("nope_dim", nope_dim),
        ):
            check_int(name, value)
        v_dim = nope_dim if v_dim is None else check_int("v_dim", v_dim)
        if rope_dim % 2:
            raise ValueError(f"rope_dim must be even (RoPE turns pairs), got {rope_dim}")
        if rope is None:
            rope = RotaryEmbedding(rope_dim, layout="interleaved")
        if not isinstance(rope, RotaryEmbedding) or rope.head_dim != rope_dim:
            raise ValueError(
                f"rope must be a RotaryEmbedding with head_dim={rope_dim}, got {rope!r}"
            )
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.kv_rank, self.rope_dim, self.nope_dim, self.v_dim = kv_rank, rope_dim, nope_dim, v_dim
        self.q_rank = None if q_rank is None else check_int("q_rank", q_rank)
        qk_dim = nope_dim + rope_dim
        self.scale = (
            qk_dim**-0.5
            if logit_scale is None
            else check_real("logit_scale", logit_scale, above=0.0)
        )
        eps = check_real("eps", eps, above=0.0)
        if q_rank is None:
            self.q_proj = nn.Linear(embed_dim, num_heads * qk_dim, bias=False)
        else:
            self.q_down = nn.Linear(embed_dim, q_rank, bias=bias)
            self.q_norm = nn.RMSNorm(q_rank, eps=eps)
            self.q_up = nn.Linear(q_rank, num_heads * qk_dim, bias=False)
        self.kv_down = nn.Linear(embed_dim, kv_rank + rope_dim, bias=bias)
        self.kv_norm = nn.RMSNorm(kv_rank, eps=eps)
        self.kv_up = nn.Linear(kv_rank, num_heads * (nope_dim + v_dim), bias=False)
        self.out_proj = nn.Linear(num_heads * v_dim, embed_dim, bias=bias)
        self.rope = rope

    def forward(
        self,
        x: Tensor,
        positions: Tensor | None = None,
        *,
        causal: bool = True,
        attn_mask: Tensor | None = None,
        cache: LatentCache | None = None,
    ) -> Tensor:
        """Self-attention over the cache and ``x``.

        Shapes::

            x:         [B, L, D]
            positions: [L] or [B, L] (integer; default: the cache's length onwards)
            attn_mask: [B, 1, L, Lk] (bool: True = may attend; float: added) or None
            returns:   [B, L, D]

        Raises:
            TypeError: ``x`` is not a floating tensor, ``causal`` not a bool, or
                ``positions`` not an integer tensor.
            ValueError: ``x`` does not end in ``embed_dim``, or ``positions`` or
                ``attn_mask`` has the wrong shape (as in
                :class:`~pecode.attention.MultiHeadAttention`).
        """
        positions, attn_mask = self._check_call(x, positions, causal, attn_mask, cache)
        (batch, length, _), heads = x.shape, self.num_heads
        qk_dim = self.nope_dim + self.rope_dim
        q = self._queries(x).view(batch, length, heads, qk_dim).transpose(1, 2)
        q_nope, q_rope = q.split([self.nope_dim, self.rope_dim], dim=-1)
        latents, k_rope = self.kv_down(x).split([self.kv_rank, self.rope_dim], dim=-1)
        latents = self.kv_norm(latents)
        k_rope = k_rope.unsqueeze(1)  # [B, 1, L, rope_dim]: one rotary key for every head
        q_rope, k_rope = self.rope.transform_qk(q_rope, k_rope, positions, positions)
        if cache is not None:
            latents, k_rope = cache.append(latents, k_rope)
        k_len = latents.shape[1]
        kv = self.kv_up(latents).view(batch, k_len, heads, self.nope_dim + self.v_dim)
        k_nope, v = kv.transpose(1, 2).split([self.nope_dim, self.v_dim], dim=-1)
        q = torch.cat((q_nope, q_rope), dim=-1)
        k = torch.cat((k_nope, k_rope.expand(-1, heads, -1, -1)), dim=-1)
        mask = _fold_mask(attn_mask, causal, None, length, k_len, q.dtype, q.device)
        is_causal = isinstance(mask, str)  # a causal prefill: SDPA's is_causal, no L×L mask
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=None if is_causal else mask, is_causal=is_causal, scale=self.scale
        )
        return self.out_proj(out.transpose(1, 2).reshape(batch, length, heads * self.v_dim))

    def _check_call(
        self,
        x: Tensor,
        positions: Tensor | None,
        causal: bool,
        attn_mask: Tensor | None,
        cache: LatentCache | None,
    ) -> tuple[Tensor, Tensor | None]:
        """:meth:`forward`'s checks; the positions (default: on from the cache) and the
        mask with four dimensions."""
        if not isinstance(x, Tensor) or not x.is_floating_point():
            raise TypeError(f"x must be a floating torch.Tensor, got {type(x).__name__}")
        if x.dim() != 3 or x.shape[-1] != self.embed_dim:
            raise ValueError(f"x must have shape [B, L, {self.embed_dim}], got {tuple(x.shape)}")
        if not isinstance(causal, bool):
            raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
        batch, length, _ = x.shape
        past = 0 if cache is None else len(cache)
        if positions is None:
            positions = torch.arange(past, past + length, device=x.device)
        check_integer_tensor("positions", positions)
        if positions.shape not in ((length,), (1, length), (batch, length)):
            raise ValueError(
                f"positions must have shape [{length}] or [{batch}, {length}], "
                f"got {tuple(positions.shape)}"
            )
        if attn_mask is not None:
            _check_mask(attn_mask, (batch, self.num_heads, length, past + length))
            attn_mask = attn_mask[(None,) * (4 - attn_mask.dim())]
        return positions, attn_mask

    def _queries(self, x: Tensor) -> Tensor:
        if self.q_rank is None:
            return self.q_proj(x)
        return self.q_up(self.q_norm(self.q_down(x)))

    def extra_repr(self) -> str:
        return (
            f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, kv_rank={self.kv_rank}, "
            f"rope_dim={self.rope_dim}, nope_dim={self.nope_dim}, v_dim={self.v_dim}, "
            f"q_rank={self.q_rank}, logit_scale={self.scale}"
        )
