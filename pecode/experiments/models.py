"""The model of chapter 13 and the ways a trained RoPE model can be read at longer lengths.

* :class:`TinyDecoder`: embeddings, an optional absolute encoding, pre-LN blocks built
  on :class:`~pecode.attention.MultiHeadAttention`, and a linear read-out; ``window=``
  in its forward pass masks every key that lies ``window`` or more positions back;
  ``"rope_nope"`` builds a hybrid stack, RoPE layers with NoPE layers among them in
  the pattern of :func:`pecode.layer_pattern.nope_layers` (Llama 4, SmolLM3), and
  ``"p_rope"`` rotates only the fastest share of every head's pairs (p-RoPE);
* :func:`sliding_window_mask`: that mask;
* :func:`yarn_paper_frequencies`: YaRN's frequencies with the ramp as the paper writes
  it (linear in the number of turns ``r``), beside pecode's ``"yarn"`` kind, whose ramp
  is the authors' code's (linear in the pair index, ends rounded outwards);
* :func:`with_rope_scaling`: the same trained RoPE model read with long-context
  frequencies, without retraining;
* :func:`attention_beyond`: how much attention each head puts on keys far back;
* :func:`cpu_threads` (defined in :mod:`pecode.utils`, re-exported here): a fixed thread
  count, so that runs are repeatable, and :func:`map_jobs`: independent training runs
  spread over worker processes, each with that thread count, so that the results do not
  depend on how many workers ran them.
"""

from __future__ import annotations

import copy
import functools
import math
import multiprocessing
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import torch
from torch import Tensor, nn

from pecode._checks import check_int
from pecode.absolute import LearnedPositionalEncoding, SinusoidalPositionalEncoding
from pecode.alibi import ALiBi
from pecode.attention import KVCache, MultiHeadAttention, PositionScheme
from pecode.fire import FIRE
from pecode.forgetting import ForgettingGate
from pecode.kerple import Kerple
from pecode.layer_pattern import nope_layers
from pecode.relative import T5RelativePositionBias
from pecode.rerope import ReRoPE
from pecode.rope import RotaryEmbedding, apply_rope, rope_cos_sin, rope_inv_freq
from pecode.scaling import (
    log_length_query_scale,
    logn_query_scale,
    rope_frequencies,
    yarn_attention_factor,
)
from pecode.utils import cpu_threads

__all__ = [
    "BIAS_FAMILY_SCHEMES",
    "HYBRID_SCHEMES",
    "LOCAL_WINDOW_SHARE",
    "NOPE_EVERY",
    "PRACTICE_READINGS",
    "P_ROPE_FRACTION",
    "REROPE_WINDOW_SHARE",
    "ROPE_READINGS",
    "ROPE_SCALINGS",
    "SCHEMES",
    "FrequencyRotary",
    "ScaledQueries",
    "SilencedPairs",
    "TinyDecoder",
    "attention_beyond",
    "attention_entropy",
    "attention_on_first_keys",
    "attention_to_sinks",
    "check_scheme",
    "cpu_threads",
    "map_jobs",
    "sliding_window_mask",
    "with_pairs_silenced",
    "with_rope_scaling",
    "yarn_paper_frequencies",
]

SCHEMES: tuple[str, ...] = ("none", "sinusoidal", "learned", "t5", "alibi", "rope")
"""The position schemes :class:`TinyDecoder` accepts: ``none`` is NoPE (causal mask only)."""

HYBRID_SCHEMES: tuple[str, ...] = ("rope_nope", "p_rope", "rope_sinks", "rope_local_global")
"""RoPE variants accepted beside ``SCHEMES`` but not in it (a sweep over ``SCHEMES``
stays chapter 13's): ``"rope_nope"`` mixes RoPE and no positions layer by layer (NoPE
layers in the pattern of :func:`pecode.layer_pattern.nope_layers`), ``"p_rope"`` feature
by feature (:data:`P_ROPE_FRACTION` of each head's pairs rotate); ``"rope_sinks"`` is
RoPE with a learned sink logit per head in every layer (gpt-oss's ``sinks``);
``"rope_local_global"`` alternates RoPE layers with a sliding window of
:data:`LOCAL_WINDOW_SHARE` of the training length and RoPE layers that see everything,
the windowed one first (gpt-oss's alternation)."""

BIAS_FAMILY_SCHEMES: tuple[str, ...] = ("kerple", "fire", "forgetting")
"""Additive biases after ALiBi (page 6.1), accepted beside ``SCHEMES`` but not in it:
``"kerple"``, :class:`~pecode.kerple.Kerple`'s logarithmic kernel (the authors' better
one); ``"fire"``, :class:`~pecode.fire.FIRE` with its learned threshold initialised at
the training length (``init_L``; the module's default is 512); ``"forgetting"``,
:class:`~pecode.forgetting.ForgettingGate` (its gate read from the keys), the Forgetting
Transformer's scheme, with no other positions. Every layer has its own module (the
authors' KERPLE code shares one across layers)."""

LOCAL_WINDOW_SHARE: float = 0.125
"""The sliding window of a ``"rope_local_global"`` model's local layers, as a share of
the training length (at least 1 token): gpt-oss's is 128 tokens of a 4,096-token
pre-training context (1/32), Gemma 3's 1,024 of 32,768 (1/32, its 4B and larger
models); the tiny models take 1/8 so that the window holds more than the copy's offset."""

P_ROPE_FRACTION: float = 0.25
"""The share of each head's pairs that a ``"p_rope"`` model rotates: the fastest ones, at
RoPE's frequencies for the whole head, the others not at all (Hugging Face's
``proportional`` rope type with ``partial_rotary_factor`` 0.25, Gemma 4's global layers;
p-RoPE, Barbero et al. 2024)."""

NOPE_EVERY: int = 4
"""Llama 4's and SmolLM3's ``no_rope_layer_interval``: one NoPE layer in every four, the
last of each group. :class:`TinyDecoder` uses ``min(NOPE_EVERY, num_layers)`` unless
told otherwise, so that a stack of fewer than four layers still ends with a NoPE layer."""

ROPE_SCALINGS: tuple[str, ...] = ("linear", "ntk", "yarn")
"""Test-time RoPE scalings that are kinds of :mod:`pecode.scaling` (``"yarn"``: the
authors' code's ramp, as in Hugging Face transformers)."""

ROPE_READINGS: tuple[str, ...] = (
    *ROPE_SCALINGS,
    "yarn_paper",
    "yarn_frequencies",
    "yarn_temperature",
)
"""The readings of chapter 13: ``ROPE_SCALINGS``; ``"yarn_paper"``,
YaRN with the paper's ramp (:func:`yarn_paper_frequencies`); and YaRN's two parts
apart: ``"yarn_frequencies"``, the code's ramp with attention factor 1, and
``"yarn_temperature"``, the trained frequencies with YaRN's attention factor."""


PRACTICE_READINGS: tuple[str, ...] = ("logn", "log_length", "rerope", "leaky_rerope")
"""Readings of a trained RoPE model from 2023–26 practice (chapter 11.1), accepted by
:func:`with_rope_scaling` beside ``ROPE_READINGS``: ``"logn"``, Qwen's query factor
:func:`~pecode.scaling.logn_query_scale`; ``"log_length"``, Ministral 3's
:func:`~pecode.scaling.log_length_query_scale` (offset 0, every layer) with ``β = 0.1``
counted in training lengths; ``"rerope"``, :class:`~pecode.rerope.ReRoPE` (the clipping
alone: Su's patches also scale the queries by Qwen's ``logn``) with the window
:data:`REROPE_WINDOW_SHARE` of the training length; ``"leaky_rerope"``, Leaky ReRoPE with
that window and the leak that brings the test length's longest distance down to the
training length's (plain RoPE at the training length itself)."""

REROPE_WINDOW_SHARE: float = 0.5
"""ReRoPE's window as a share of the training length in ``PRACTICE_READINGS``."""


def check_scheme(scheme: object, accepted: Sequence[str] | None = None) -> None:
    """Raise ``ValueError`` naming the accepted schemes unless ``scheme`` is one of
    ``accepted`` (by default every scheme :class:`TinyDecoder` builds)."""
    if accepted is None:
        accepted = SCHEMES + HYBRID_SCHEMES + BIAS_FAMILY_SCHEMES
    if scheme not in accepted:
        raise ValueError(f"unknown scheme {scheme!r}; accepted: {list(accepted)}")


def sliding_window_mask(length: int, window: int) -> Tensor:
    """Boolean mask, ``True`` where query ``t`` may attend to key ``u``: ``0 <= t - u < window``.

    Causal and local: every key ``window`` or more positions back is masked, so a
    relative scheme only ever sees offsets ``0 .. window - 1``.

    Shapes::

        returns: [length, length](bool)

    Raises:
        TypeError, ValueError: ``length`` or ``window`` is not a positive int.
    """
    check_int("length", length, 1)
    check_int("window", window, 1)
    offset = torch.arange(length)[:, None] - torch.arange(length)[None, :]
    return (offset >= 0) & (offset < window)


def _position_scheme(
    scheme: str, head_dim: int, num_heads: int, train_length: int
) -> PositionScheme | None:
    """The scheme inside attention (``None`` for NoPE and the absolute encodings)."""
    if scheme == "t5":
        # Decoder buckets; as in T5 (512 tokens, max_distance 128) the last bucket is
        # reached within the training length, so every bucket used later was trained
        # (16 buckets: 8 exact offsets, then log-spaced up to max_distance). The logits
        # are scaled by 1/sqrt(Dh) like every other scheme here.
        return T5RelativePositionBias(
            num_heads,
            bidirectional=False,
            num_buckets=16,
            max_distance=max(train_length, 16),
            scale_logits=True,
        )
    if scheme == "alibi":
        return ALiBi(num_heads)
    if scheme == "kerple":
        return Kerple(num_heads, "log")
    if scheme == "fire":
        return FIRE(num_heads, init_L=float(train_length))
    if scheme == "forgetting":
        return ForgettingGate(num_heads, head_dim)
    if scheme == "rope":
        return RotaryEmbedding(head_dim)
    if scheme == "p_rope":
        share = {"partial_rotary_factor": P_ROPE_FRACTION}
        return RotaryEmbedding(head_dim, scaling="proportional", scaling_params=share)
    return None


class _Block(nn.Module):
    """Pre-LN decoder block: ``x + Attn(LN(x))``, then ``x + MLP(LN(x))``."""

    def __init__(
        self,
        dim: int,
        num_heads: int,
        position: PositionScheme | None,
        sinks: bool = False,
        window: int | None = None,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attention = MultiHeadAttention(
            dim, num_heads, position=position, sinks=sinks, window=window
        )
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(
        self, x: Tensor, attn_mask: Tensor | None = None, cache: KVCache | None = None
    ) -> Tensor:
        x = x + self.attention(self.norm1(x), causal=True, attn_mask=attn_mask, cache=cache)
        return x + self.mlp(self.norm2(x))


class TinyDecoder(nn.Module):
    """A small decoder-only Transformer whose position scheme is a constructor argument.

    Token embedding, then for ``sinusoidal``/``learned`` the absolute encoding added to
    it (:class:`~pecode.absolute.SinusoidalPositionalEncoding`,
    :class:`~pecode.absolute.LearnedPositionalEncoding` with ``max_len`` rows), then
    ``num_layers`` pre-LN blocks (Xiong et al. 2020) with causal
    :class:`~pecode.attention.MultiHeadAttention` carrying the scheme (T5 bias, ALiBi,
    RoPE, one of ``BIAS_FAMILY_SCHEMES``, or nothing), a final LayerNorm and a linear
    read-out. ``none`` adds no position information at all: only the causal mask
    (NoPE, Kazemnejad et al. 2023). ``rope_nope`` is RoPE in every layer except the NoPE ones of
    ``nope_layers(num_layers, every=nope_every)``, the last of each group of
    ``nope_every`` (Llama 4, SmolLM3; with chapter 13's two layers and the default
    interval: RoPE, then NoPE). RoPE has no parameters, so a ``rope_nope`` model has the
    same parameters as a ``rope`` one, under the same names, and the same seed
    initializes them identically. So has ``p_rope``, RoPE in every layer on the fastest
    :data:`P_ROPE_FRACTION` of each head's pairs only. ``rope_sinks`` adds to RoPE's
    parameters one learned sink logit per head and layer (``attention.sinks``, zeros at
    first: gpt-oss), and initializes the others as RoPE's.

    Shapes::

        tokens: [batch, seq] (int64, in 0 .. vocab_size-1)    returns: [batch, seq, output_size]

    Args:
        scheme: one of ``SCHEMES``, ``HYBRID_SCHEMES`` or ``BIAS_FAMILY_SCHEMES``.
        vocab_size: number of token ids.
        max_len: the training length; rows of the learned table, and T5's
            ``max_distance`` (at least 16, which T5's 16 decoder buckets need).
        dim, num_heads, num_layers: width, heads per layer, blocks.
        output_size: logits per position (default ``vocab_size``); chapter 13 reads
            two tasks from one model, so its read-out has both tasks' classes.
        nope_every: ``rope_nope`` only: one NoPE layer in every ``nope_every``, the last
            of each group (default ``min(NOPE_EVERY, num_layers)``).

    Raises:
        ValueError: unknown ``scheme``, or sizes that are not positive ints
            (``dim`` must be divisible by ``num_heads``, the head size even), or
            ``nope_every`` given for a scheme other than ``rope_nope``.
        TypeError: a size is not an int.
    """

    def __init__(
        self,
        scheme: str,
        *,
        vocab_size: int,
        max_len: int,
        dim: int = 64,
        num_heads: int = 4,
        num_layers: int = 2,
        output_size: int | None = None,
        nope_every: int | None = None,
    ) -> None:
        super().__init__()
        check_scheme(scheme)
        check_int("vocab_size", vocab_size, 2)
        check_int("max_len", max_len, 1)
        check_int("dim", dim, 1)
        check_int("num_heads", num_heads, 1)
        check_int("num_layers", num_layers, 1)
        output_size = vocab_size if output_size is None else output_size
        check_int("output_size", output_size, 2)
        if dim % num_heads or (dim // num_heads) % 2:
            raise ValueError(f"dim={dim} must split into num_heads={num_heads} even head sizes")
        self.scheme, self.vocab_size, self.max_len = scheme, vocab_size, max_len
        # True where a layer has no positions: every layer of "none", none of the others'
        self.nope_layers: tuple[bool, ...] = (scheme == "none",) * num_layers
        if scheme == "rope_nope":
            if nope_every is None:
                nope_every = min(NOPE_EVERY, num_layers)
            self.nope_layers = nope_layers(num_layers, every=nope_every)
        elif nope_every is not None:
            raise ValueError(f"nope_every is for scheme 'rope_nope' only, not {scheme!r}")
        self.nope_every = nope_every
        self.embedding = nn.Embedding(vocab_size, dim)
        self.absolute: nn.Module | None = None
        if scheme == "sinusoidal":
            self.absolute = SinusoidalPositionalEncoding(dim)
        elif scheme == "learned":
            self.absolute = LearnedPositionalEncoding(max_len, dim)
        head_dim = dim // num_heads
        layer_schemes = [
            "none" if nope else ("rope" if scheme in ("rope_nope", "rope_sinks") else scheme)
            for nope in self.nope_layers
        ]
        if scheme == "rope_local_global":
            layer_schemes = ["rope"] * num_layers
        sinks = scheme == "rope_sinks"
        local = max(1, int(LOCAL_WINDOW_SHARE * max_len)) if scheme == "rope_local_global" else None
        self.blocks = nn.ModuleList(
            _Block(
                dim,
                num_heads,
                _position_scheme(name, head_dim, num_heads, max_len),
                sinks,
                window=local if i % 2 == 0 else None,
            )
            for i, name in enumerate(layer_schemes)
        )
        self.norm = nn.LayerNorm(dim)
        self.readout = nn.Linear(dim, output_size)

    def extra_repr(self) -> str:
        attention = self.blocks[0].attention
        return (
            f"scheme={self.scheme!r}, vocab_size={self.vocab_size}, max_len={self.max_len}, "
            f"dim={attention.embed_dim}, num_heads={attention.num_heads}, "
            f"num_layers={len(self.blocks)}, output_size={self.readout.out_features}"
            + (
                f", nope_every={self.nope_every}, nope_layers="
                f"{tuple(i for i, nope in enumerate(self.nope_layers) if nope)}"
                if self.scheme == "rope_nope"
                else ""
            )
        )

    def forward(
        self,
        tokens: Tensor,
        *,
        window: int | None = None,
        caches: Sequence[KVCache] | None = None,
    ) -> Tensor:
        """Logits for the targets at every position.

        Args:
            tokens: ``[batch, seq]`` token ids.
            window: if given, every attention layer sees only the keys less than
                ``window`` positions back (:func:`sliding_window_mask`); the weights
                are unchanged. ``None``: the whole causal prefix.
            caches: one :class:`~pecode.attention.KVCache` per block, for reading a
                sequence a piece at a time: ``tokens`` continue the cached ones, at the
                positions the caches give (a :class:`~pecode.streaming.SinkCache`
                streams). Only for schemes inside attention.

        Raises:
            TypeError: ``tokens`` is not an integer tensor, or ``window`` not an int.
            ValueError: ``tokens`` is not 2-D, holds an id outside the vocabulary, or
                (``learned``) is longer than ``max_len``: a learned table has no rows
                there, so the model is not defined; ``window`` is not positive;
                ``caches`` (a list or tuple of KVCache, else ``TypeError``) with
                ``window``, with an absolute scheme (whose positions are added before
                attention), or not one per block.
        """
        if caches is not None:
            if not isinstance(caches, list | tuple) or not all(
                isinstance(cache, KVCache) for cache in caches
            ):
                raise TypeError("caches must be a list or tuple of KVCache, one per block")
            if window is not None or self.absolute is not None:
                raise ValueError(
                    "caches: only for a scheme inside attention, without window "
                    f"(scheme {self.scheme!r}, window={window})"
                )
            if len(caches) != len(self.blocks):
                raise ValueError(f"caches: one per block ({len(self.blocks)}), got {len(caches)}")
        if (
            not isinstance(tokens, Tensor)
            or tokens.is_floating_point()
            or tokens.dtype == torch.bool
        ):
            raise TypeError("tokens must be an integer tensor")
        if tokens.dim() != 2:
            raise ValueError(f"tokens must have shape [batch, seq], got {tuple(tokens.shape)}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise ValueError(f"tokens must lie in 0 .. {self.vocab_size - 1}")
        mask = None
        if window is not None:
            mask = sliding_window_mask(tokens.shape[1], window).to(tokens.device)
        x = self.embedding(tokens)
        if self.absolute is not None:
            x = self.absolute(x)  # the learned table raises past max_len
        for i, block in enumerate(self.blocks):
            x = block(x, mask, None if caches is None else caches[i])
        return self.readout(self.norm(x))


def yarn_paper_frequencies(
    head_dim: int,
    base: float,
    factor: float,
    original_length: int,
    *,
    alpha: float = 1.0,
    beta: float = 32.0,
) -> Tensor:
    """YaRN's "NTK-by-parts" frequencies with the ramp of the paper (Peng et al. 2023, §3.2).

    ``θ'_i = (1 - γ(r_i)) θ_i / s + γ(r_i) θ_i`` with ``r_i = L0 θ_i / (2π)`` the turns of
    pair ``i`` over the trained length and ``γ(r) = clip((r - α) / (β - α), 0, 1)``: pairs
    that turn more than ``β`` times keep their frequency, pairs that turn less than
    ``α`` times are divided by ``s``, and the ramp is linear in ``r`` in between. The
    authors' released code and Hugging Face transformers (pecode's ``"yarn"``) ramp
    linearly in the pair index instead, between indices rounded outwards
    (:func:`pecode.scaling.yarn_correction_range`). Inside the ramps the two differ.
    Outside they agree only where the code's ends fall where the paper's do: the code
    clips its low end to pair 0, so when even pair 0 turns fewer than ``beta`` times
    (``L0 < 2π β``) the code still keeps pair 0 whole, while the paper divides part of
    it (chapter 13 prints both at ``L0 = 32``).

    Shapes::

        returns: [head_dim // 2](float64)

    Raises:
        TypeError, ValueError: ``head_dim`` not a positive even int, ``original_length``
            not a positive int, ``factor < 1``, or not ``beta > alpha > 0``.
    """
    check_int("original_length", original_length, 1)
    for name, value in (("base", base), ("factor", factor), ("alpha", alpha), ("beta", beta)):
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"{name} must be a number, got {type(value).__name__}")
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value}")
    if factor < 1:
        raise ValueError(f"factor must be >= 1, got {factor}")
    if not beta > alpha > 0:
        raise ValueError(f"need beta > alpha > 0, got alpha={alpha}, beta={beta}")
    theta = rope_inv_freq(head_dim, base, dtype=torch.float64)
    turns = original_length * theta / (2 * math.pi)
    gamma = ((turns - alpha) / (beta - alpha)).clamp(0.0, 1.0)
    return (1.0 - gamma) * theta / factor + gamma * theta


class FrequencyRotary(PositionScheme):
    """RoPE with given frequencies and attention factor (half layout, float32 tables).

    What :class:`~pecode.rope.RotaryEmbedding` computes with a scaling kind, for
    frequencies that no kind of :mod:`pecode.scaling` produces (the paper's YaRN ramp):
    the tables are formed in float64, multiplied by ``attention_factor`` and rounded to
    float32, as there.

    Shapes::

        inv_freq: [head_dim // 2]

    Raises:
        TypeError: ``inv_freq`` is not a floating tensor.
        ValueError: ``inv_freq`` is not 1-D, or ``attention_factor`` is not positive.
    """

    def __init__(self, inv_freq: Tensor, attention_factor: float = 1.0) -> None:
        super().__init__()
        if not isinstance(inv_freq, Tensor) or not inv_freq.is_floating_point():
            raise TypeError("inv_freq must be a floating tensor")
        if inv_freq.dim() != 1:
            raise ValueError(f"inv_freq must be 1-D, got shape {tuple(inv_freq.shape)}")
        if not (math.isfinite(attention_factor) and attention_factor > 0):
            raise ValueError(f"attention_factor must be positive, got {attention_factor}")
        self.inv_freq = inv_freq.detach().to(torch.float64).clone()
        self.attention_factor = float(attention_factor)

    def extra_repr(self) -> str:
        return f"head_dim={2 * self.inv_freq.numel()}, attention_factor={self.attention_factor}"

    def _rotate(self, x: Tensor, positions: Tensor) -> Tensor:
        cos, sin = rope_cos_sin(positions.cpu(), self.inv_freq)
        cos = (cos * self.attention_factor).to(torch.float32).to(x.device)
        sin = (sin * self.attention_factor).to(torch.float32).to(x.device)
        if cos.dim() == 3:  # [B, L, r] -> [B, 1, L, r], shared by the heads
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        return apply_rope(x, cos, sin, "half")

    def transform_qk(
        self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Rotate ``q`` by ``q_positions`` and ``k`` by ``k_positions``."""
        return self._rotate(q, q_positions), self._rotate(k, k_positions)


class SilencedPairs(PositionScheme):
    """A rotary scheme whose queries lose some pairs after the rotation: a probe.

    ``transform_qk`` rotates as ``rotary`` does, then zeroes the query's two features of
    every pair in ``pairs`` (pair ``i`` is features ``i`` and ``i + head_dim / 2``, the
    half layout), so those pairs add nothing to any score, at any distance; the keys and
    everything else are untouched. :func:`with_pairs_silenced` puts it in every layer.

    Raises:
        TypeError: ``rotary`` is not a :class:`~pecode.rope.RotaryEmbedding`, or a pair
            is not an int.
        ValueError: ``rotary`` is not in the half layout, or ``pairs`` is empty, repeats
            a pair or names one outside ``0 .. head_dim / 2 - 1``.
    """

    def __init__(self, rotary: RotaryEmbedding, pairs: Sequence[int]) -> None:
        super().__init__()
        if not isinstance(rotary, RotaryEmbedding):
            raise TypeError(f"rotary must be a RotaryEmbedding, got {type(rotary).__name__}")
        if rotary.layout != "half":
            raise ValueError(f"rotary must use the half layout, got {rotary.layout!r}")
        half = rotary.head_dim // 2
        pairs = tuple(pairs)
        for pair in pairs:
            check_int("pairs", pair, 0)
            if pair >= half:
                raise ValueError(f"pairs: {pair} is not a pair of a {rotary.head_dim}-wide head")
        if not pairs or len(set(pairs)) != len(pairs):
            raise ValueError(f"pairs must be distinct and non-empty, got {list(pairs)}")
        self.rotary, self.pairs = rotary, pairs
        silenced = [*pairs, *(pair + half for pair in pairs)]  # both features of each pair
        keep = torch.ones(rotary.head_dim)
        keep[silenced] = 0.0
        self.register_buffer("keep", keep, persistent=False)

    def extra_repr(self) -> str:
        return f"pairs={list(self.pairs)}"

    def transform_qk(
        self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Rotate as ``rotary`` does; then zero the silenced pairs of ``q``."""
        q, k = self.rotary.transform_qk(q, k, q_positions, k_positions)
        return q * self.keep.to(q.dtype), k


def with_pairs_silenced(model: TinyDecoder, pairs: Sequence[int]) -> TinyDecoder:
    """A copy of a trained RoPE or p-RoPE model in which ``pairs`` add nothing to a score.

    Every layer's :class:`~pecode.rope.RotaryEmbedding` is wrapped in a
    :class:`SilencedPairs`; the weights are untouched and nothing is retrained. Chapter
    13 silences a ``p_rope`` model's unrotated pairs, then its rotated ones, to measure
    which of them each task uses.

    Raises:
        TypeError: ``model`` is not a :class:`TinyDecoder`.
        ValueError: ``model`` is not a ``rope`` or ``p_rope`` model, or bad ``pairs``
            (:class:`SilencedPairs`).
    """
    if not isinstance(model, TinyDecoder):
        raise TypeError(f"model must be a TinyDecoder, got {type(model).__name__}")
    if model.scheme not in ("rope", "p_rope"):
        raise ValueError(f"model must use scheme 'rope' or 'p_rope', got {model.scheme!r}")
    silenced = copy.deepcopy(model)
    for block in silenced.blocks:
        block.attention.position = SilencedPairs(block.attention.position, pairs)
    return silenced


class ScaledQueries(PositionScheme):
    """A rotary scheme whose rotated queries are multiplied by a factor of their position.

    ``transform_qk`` rotates as ``rotary`` does, then multiplies each query by ``scale
    (q_positions)`` (a length-dependent temperature: Qwen's ``logn``, Llama 4's
    log-length factor); the keys are untouched. A probe of :func:`with_rope_scaling`.

    Raises:
        TypeError: ``rotary`` is not a PositionScheme or ``scale`` is not callable.
        ValueError: ``rotary`` adds a bias, an output term or its own logit scale, which
            this wrapper would drop (it passes on ``transform_qk`` only).
    """

    def __init__(self, rotary: PositionScheme, scale: Callable[[Tensor], Tensor]) -> None:
        super().__init__()
        if not isinstance(rotary, PositionScheme):
            raise TypeError(f"rotary must be a PositionScheme, got {type(rotary).__name__}")
        kind = type(rotary)
        if (
            kind.score_bias is not PositionScheme.score_bias
            or kind.logit_scale is not PositionScheme.logit_scale
            or rotary.has_output_term
        ):
            raise ValueError(
                f"rotary must only transform q and k; {kind.__name__} also adds a bias, a "
                "logit scale or an output term, which ScaledQueries would drop"
            )
        if not callable(scale):
            raise TypeError(f"scale must be callable, got {type(scale).__name__}")
        self.rotary, self.scale = rotary, scale

    def extra_repr(self) -> str:
        scale = self.scale
        if isinstance(scale, functools.partial):  # name(settings), as built by _reading
            settings = ", ".join(f"{k}={v!r}" for k, v in scale.keywords.items())
            scale = f"{scale.func.__name__}({settings})"
        else:
            scale = getattr(scale, "__name__", type(scale).__name__)
        return f"scale={scale!r}"

    def transform_qk(
        self, q: Tensor, k: Tensor, q_positions: Tensor, k_positions: Tensor
    ) -> tuple[Tensor, Tensor]:
        """Rotate; then multiply each query by the scale of its position."""
        q, k = self.rotary.transform_qk(q, k, q_positions, k_positions)
        factor = self.scale(q_positions).to(q.device, q.dtype).unsqueeze(-1)  # [.., L, 1]
        if factor.dim() == 3:  # [B, L, 1] -> [B, 1, L, 1]
            factor = factor.unsqueeze(1)
        return q * factor, k


def _reading(old: RotaryEmbedding, kind: str, factor: float, train_length: int) -> PositionScheme:
    """The position scheme of one layer of a RoPE model read with ``kind``."""
    if kind == "logn":
        return ScaledQueries(old, functools.partial(logn_query_scale, length=train_length))
    if kind == "log_length":
        rule = functools.partial(log_length_query_scale, beta=0.1, length=train_length)
        return ScaledQueries(old, rule)
    if kind in ("rerope", "leaky_rerope"):
        if train_length < 3:  # a window of at least 1 with room past it
            raise ValueError(
                f"{kind} needs a model trained on at least 3 tokens, got max_len={train_length}"
            )
        window = int(REROPE_WINDOW_SHARE * train_length)
        longest = round(factor * train_length) - 1
        if kind == "rerope":
            return ReRoPE(old, window)
        if longest <= train_length - 1:
            return old  # no distance past the training length's: plain RoPE
        return ReRoPE(old, window, leak=(longest - window) / (train_length - 1 - window))
    if kind == "yarn_paper":
        inv_freq = yarn_paper_frequencies(old.head_dim, old.base, factor, train_length)
        return FrequencyRotary(inv_freq, yarn_attention_factor(factor))
    if kind == "yarn_frequencies":
        inv_freq, _ = rope_frequencies(
            "yarn",
            old.head_dim,
            old.base,
            dtype=torch.float64,
            factor=factor,
            original_max_position_embeddings=train_length,
        )
        return FrequencyRotary(inv_freq, 1.0)
    if kind == "yarn_temperature":
        trained = rope_inv_freq(old.head_dim, old.base, dtype=torch.float64)
        return FrequencyRotary(trained, yarn_attention_factor(factor))
    params: dict[str, float | int] = {"factor": factor}
    if kind == "yarn":
        params["original_max_position_embeddings"] = train_length
    return RotaryEmbedding(old.head_dim, base=old.base, scaling=kind, scaling_params=params)


def with_rope_scaling(model: TinyDecoder, kind: str, factor: float) -> TinyDecoder:
    """A copy of a trained RoPE model whose rotations use long-context frequencies.

    For a kind of ``ROPE_SCALINGS``, each layer's
    :class:`~pecode.rope.RotaryEmbedding` is replaced by one with ``scaling=kind`` and
    ``factor`` (``original_max_position_embeddings`` = the training length for YaRN);
    for ``"yarn_paper"``, by a :class:`FrequencyRotary` with
    :func:`yarn_paper_frequencies` and YaRN's attention factor ``0.1 ln s + 1``; for
    ``"yarn_frequencies"``, by the ``"yarn"`` frequencies with attention factor 1; for
    ``"yarn_temperature"``, by the trained frequencies with YaRN's factor. The
    weights are untouched, nothing is retrained: the copy's ``state_dict`` equals the
    original's.

    Args:
        model: a :class:`TinyDecoder` built with ``scheme="rope"``.
        kind: one of ``ROPE_READINGS`` (``"linear"``: Chen et al. 2023; ``"ntk"``:
            NTK-aware; ``"yarn"``, ``"yarn_paper"``: Peng et al. 2023) or
            ``PRACTICE_READINGS``.
        factor: the context extension ``s >= 1``, usually test length / training length.

    Raises:
        TypeError: ``model`` is not a :class:`TinyDecoder`.
        ValueError: ``model`` does not use RoPE, ``kind`` is unknown, or ``factor < 1``.
    """
    if not isinstance(model, TinyDecoder):
        raise TypeError(f"model must be a TinyDecoder, got {type(model).__name__}")
    if model.scheme != "rope":
        raise ValueError(f"model must use scheme 'rope', got {model.scheme!r}")
    if kind not in ROPE_READINGS + PRACTICE_READINGS:
        raise ValueError(
            f"unknown kind {kind!r}; accepted: {list(ROPE_READINGS + PRACTICE_READINGS)}"
        )
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not factor >= 1:
        raise ValueError(f"factor must be a number >= 1, got {factor!r}")
    scaled = copy.deepcopy(model)
    for block in scaled.blocks:
        old = block.attention.position
        assert isinstance(old, RotaryEmbedding)
        block.attention.position = _reading(old, kind, float(factor), model.max_len)
    return scaled


@torch.no_grad()
def attention_beyond(
    model: TinyDecoder,
    tokens: Tensor,
    distance: int,
    *,
    window: int | None = None,
    batch_size: int = 4,
) -> Tensor:
    """Share of each head's attention on keys ``distance`` or more positions back.

    The attention probabilities of every layer
    (:meth:`pecode.attention.MultiHeadAttention.attention_weights`
    on the input the layer receives in the forward pass), summed over the keys at
    ``j <= i - distance`` of each query ``i``, and averaged over the queries that have
    such keys (``i >= distance``) and over the rows of ``tokens``.

    Shapes::

        tokens: [batch, seq] (seq > distance)    returns: [num_layers, num_heads] (float64)

    Raises:
        ValueError: ``distance`` is not a positive int below ``seq``; ``tokens`` is not
            a non-empty ``[batch, seq]`` tensor.
        TypeError, ValueError: ``batch_size`` is not a positive int.
    """
    _check_rows(tokens, batch_size)
    length = tokens.shape[-1]
    check_int("distance", distance, 1)
    if distance >= length:
        raise ValueError(f"distance={distance} must be below the input length {length}")
    offsets = torch.arange(length)[:, None] - torch.arange(length)[None, :]  # i - j
    far = (offsets >= distance).to(torch.float64)
    totals = torch.zeros(
        len(model.blocks), model.blocks[0].attention.num_heads, dtype=torch.float64
    )
    for rows in tokens.split(batch_size):
        for layer, weights in enumerate(_layer_weights(model, rows, window)):  # [B, H, L, L]
            mass = (weights.double() * far).sum(-1)[..., distance:]  # [B, H, L - distance]
            totals[layer] += mass.mean(-1).sum(0)
    return totals / tokens.shape[0]


@torch.no_grad()
def attention_entropy(
    model: TinyDecoder, tokens: Tensor, *, last: int, batch_size: int = 4
) -> Tensor:
    """Mean entropy (nats) of each layer's attention rows, for the last ``last`` queries.

    The attention probabilities of every layer
    (:meth:`pecode.attention.MultiHeadAttention.attention_weights` on the input the layer
    receives in the forward pass), each row's entropy ``-Σ_j p_j ln p_j``, averaged over
    the heads, the queries at positions ``seq - last .. seq - 1`` and the rows of
    ``tokens``. A query that sees ``n`` keys spread evenly has entropy ``ln n``.

    Shapes::

        tokens: [batch, seq]    returns: [num_layers] (float64)

    Raises:
        ValueError: ``last`` is not a positive int of at most ``seq``; ``tokens`` is not
            a non-empty ``[batch, seq]`` tensor.
        TypeError, ValueError: ``batch_size`` is not a positive int.
    """
    _check_rows(tokens, batch_size)
    length = tokens.shape[-1]
    check_int("last", last, 1)
    if last > length:
        raise ValueError(f"last={last} must be at most the input length {length}")
    totals = torch.zeros(len(model.blocks), dtype=torch.float64)
    for rows in tokens.split(batch_size):
        for layer, weights in enumerate(_layer_weights(model, rows)):  # [B, H, L, L]
            p = weights[..., -last:, :].double()
            entropy = -(p * torch.log(p.clamp(min=1e-300))).sum(-1)  # 0 ln 0 = 0
            totals[layer] += entropy.mean((1, 2)).sum(0)
    return totals / tokens.shape[0]


@torch.no_grad()
def attention_on_first_keys(
    model: TinyDecoder, tokens: Tensor, *, keys: int, start: int, batch_size: int = 4
) -> tuple[Tensor, Tensor]:
    """Each head's attention on the first ``keys`` keys, and what an even spread gives.

    The attention probabilities of every layer (as :func:`attention_beyond`), summed
    over keys ``0 .. keys-1`` for each query at positions ``start .. seq-1``, averaged
    over those queries and the rows of ``tokens``; beside it the same average of
    ``keys / (i + 1)``, the share of a query ``i`` that spreads evenly over its keys.
    StreamingLLM's *attention sinks* are heads far above that share.

    Shapes::

        tokens: [batch, seq]    returns: ([num_layers, num_heads], []) float64

    Raises:
        ValueError: ``keys`` or ``start`` is not a positive int, or ``start`` is not
            past ``keys`` and below ``seq``; ``tokens`` is not a non-empty
            ``[batch, seq]`` tensor.
        TypeError, ValueError: ``batch_size`` is not a positive int.
    """
    _check_rows(tokens, batch_size)
    length = tokens.shape[-1]
    check_int("keys", keys, 1)
    check_int("start", start, 1)
    if not keys <= start < length:
        raise ValueError(f"start={start} must lie in keys={keys} .. seq-1={length - 1}")
    totals = torch.zeros(
        len(model.blocks), model.blocks[0].attention.num_heads, dtype=torch.float64
    )
    for rows in tokens.split(batch_size):
        for layer, weights in enumerate(_layer_weights(model, rows)):  # [B, H, L, L]
            mass = weights[..., start:, :keys].double().sum(-1)  # [B, H, L - start]
            totals[layer] += mass.mean(-1).sum(0)
    even = (keys / torch.arange(start + 1, length + 1, dtype=torch.float64)).mean()
    return totals / tokens.shape[0], even


@torch.no_grad()
def attention_to_sinks(
    model: TinyDecoder, tokens: Tensor, *, start: int, batch_size: int = 4
) -> Tensor:
    """The share of each head's attention that its learned sink takes (gpt-oss's
    ``sinks``: the probability of the extra column the softmax drops), averaged over
    the queries at positions ``start .. seq-1`` and the rows of ``tokens``: one minus
    the sum of the weights over the keys.

    Shapes::

        tokens: [batch, seq]    returns: [num_layers, num_heads] (float64)

    Raises:
        ValueError: the model has no learned sinks, ``start`` is not an int in
            ``0 .. seq-1``, or ``tokens`` is not a non-empty ``[batch, seq]`` tensor.
        TypeError, ValueError: ``batch_size`` is not a positive int.
    """
    _check_rows(tokens, batch_size)
    if any(block.attention.sinks is None for block in model.blocks):
        raise ValueError(f"model has no learned sinks (scheme {model.scheme!r})")
    check_int("start", start, 0)
    if start >= tokens.shape[-1]:
        raise ValueError(f"start={start} must be below the input length {tokens.shape[-1]}")
    totals = torch.zeros(
        len(model.blocks), model.blocks[0].attention.num_heads, dtype=torch.float64
    )
    for rows in tokens.split(batch_size):
        for layer, weights in enumerate(_layer_weights(model, rows)):  # [B, H, L, L]
            dropped = 1 - weights[..., start:, :].double().sum(-1)  # [B, H, L - start]
            totals[layer] += dropped.mean(-1).sum(0)
    return totals / tokens.shape[0]


def _check_rows(tokens: object, batch_size: object) -> None:
    """The token rows and batch size of the attention measurements."""
    if not isinstance(tokens, Tensor) or tokens.dim() != 2:
        shape = tuple(tokens.shape) if isinstance(tokens, Tensor) else type(tokens).__name__
        raise ValueError(f"tokens must be a [batch, seq] tensor, got {shape}")
    if tokens.shape[0] == 0:
        raise ValueError("tokens holds no row")
    check_int("batch_size", batch_size, 1)


def _layer_weights(model: TinyDecoder, tokens: Tensor, window: int | None = None) -> list[Tensor]:
    """The attention probabilities of every layer of ``model`` on ``tokens``, ``[B, H, L, L]``
    each: :meth:`~pecode.attention.MultiHeadAttention.attention_weights` on the input the
    layer receives in the forward pass, with its mask."""
    captured: list[Tensor] = []
    hooks = [
        block.attention.register_forward_hook(
            lambda module, args, kwargs, output: captured.append(
                module.attention_weights(args[0], causal=True, attn_mask=kwargs.get("attn_mask"))
            ),
            with_kwargs=True,
        )
        for block in model.blocks
    ]
    try:
        model(tokens, window=window)
    finally:
        for hook in hooks:
            hook.remove()
    return captured


def readings(
    scheme: str, rope_readings: Sequence[str], window: int | None
) -> list[tuple[str, str | None, int | None]]:
    """The ways a sweep reads one trained model: ``(name, rope reading, window)``.

    The model as trained; a RoPE model also with each of ``rope_readings``
    (``rope+<kind>``); with ``window``, also with that test-time window
    (``<scheme>+window``).
    """
    found: list[tuple[str, str | None, int | None]] = [(scheme, None, None)]
    if scheme == "rope":
        found += [(f"rope+{kind}", kind, None) for kind in rope_readings]
    if window is not None:
        found.append((f"{scheme}+window", None, window))
    return found


def _run_job(job: tuple[Callable[..., Any], tuple[Any, ...]]) -> Any:
    function, arguments = job
    return function(*arguments)


def map_jobs(
    function: Callable[..., Any], jobs: Sequence[tuple[Any, ...]], workers: int = 1
) -> list[Any]:
    """``[function(*job) for job in jobs]``, spread over ``workers`` processes.

    With ``workers=1`` the jobs run here, one after the other. Otherwise each runs in a
    fresh process (the ``spawn`` start method: no state inherited from this one), so
    ``function`` must be importable by name (defined at module level in a package) and
    must fix its own seeds and thread count; the results, returned in job order, are
    then the same whatever ``workers`` is.

    Raises:
        ValueError: ``workers`` is not a positive int.
    """
    check_int("workers", workers, 1)
    if workers == 1 or len(jobs) <= 1:
        return [function(*job) for job in jobs]
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(min(workers, len(jobs)), mp_context=context) as pool:
        return list(pool.map(_run_job, [(function, tuple(job)) for job in jobs]))
