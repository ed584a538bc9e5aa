"""StreamingLLM's cache: attention sinks and a window of recent keys, re-indexed (chapter 11.1).

Xiao et al. (2024, "Efficient Streaming Language Models with Attention Sinks") keep the
keys and values of the first ``num_sinks`` tokens (the *sinks*, 4 in the paper) and of the
latest ``window`` tokens, and evict the rest, so that memory and time per token stay
bounded however long the stream. Positions are *re-indexed* inside the cache: a key is
rotated at its index in the cache, not in the text, so the query always sits at most
``num_sinks + window - 1`` positions after any key it sees (§3.2 of the paper).

The authors' code keeps keys unrotated and rotates the whole cache at its indices at
every step. :class:`SinkCache` keeps the keys as the layer rotated them and, when
tokens leave, rotates the kept recent ones back by the number of positions they moved:
for RoPE, ``R(p - e) k = R(-e) R(p) k``. Each key is rotated back once from the key as it
came in, by its total move, so its rounding does not grow with the number of moves (a
window's worth, at most).

``window`` counts the new token: a query sees the sinks and the ``window - 1`` tokens
before it, so it sits at most ``num_sinks + window - 1`` positions after any key. The
authors' evaluation script trims its cache to ``start + recent`` after each step and then
adds the new token, so its ``start + recent`` is ``SinkCache(start, recent + 1)`` here.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from pecode._checks import check_bool, check_int
from pecode.attention import KVCache, PositionScheme
from pecode.rope import _PER_CALL_SCALING, RotaryEmbedding, apply_partial_rope

__all__ = ["SinkCache"]


def _moves_keys(scheme: PositionScheme) -> bool:
    """Whether the scheme rotates keys by their positions (RoPE) rather than leaving them."""
    if isinstance(scheme, RotaryEmbedding):
        if scheme.sections is not None or scheme.scaling in _PER_CALL_SCALING:
            raise TypeError(
                "SinkCache re-indexes RoPE keys by rotating them back, which needs one "
                "fixed rotation per position: not M-RoPE sections nor "
                f"{list(_PER_CALL_SCALING)} scaling (got sections={scheme.sections}, "
                f"scaling={scheme.scaling!r})"
            )
        return True
    if type(scheme).transform_qk is not PositionScheme.transform_qk:
        raise TypeError(
            f"SinkCache does not know how to move the keys of {type(scheme).__name__}: it "
            "takes a RotaryEmbedding, or a scheme that leaves keys as they are (no "
            "positions, ALiBi, T5, ReRoPE), whose bias reads the cached positions"
        )
    return False


class SinkCache(KVCache):
    """A :class:`~pecode.attention.KVCache` that keeps ``num_sinks`` first and ``window``
    latest keys (StreamingLLM, Xiao et al. 2024), with positions re-indexed in the cache.

    Use it as a ``KVCache`` with ``positions=None``: each call, the layer asks
    :meth:`next_positions`, which makes room for the new tokens (evicting the oldest
    non-sink keys) and, with ``reindex=True``, gives them the next indices *in the
    cache*, at most ``num_sinks + window - 1``; the kept recent keys move down by as
    many positions as were evicted (RoPE keys are rotated back). With ``reindex=False``
    the tokens keep their positions in the text, and a query meets its sinks at
    distances that grow with the stream.

    Args:
        num_sinks: the first tokens kept for good (``0``: a plain sliding window).
        window: how many of the latest tokens are kept, the new ones included; a call
            may add at most ``window`` tokens.
        reindex: positions in the cache (StreamingLLM) or in the text.

    One position per token, shared by the batch (``[L]`` positions): the rows of a
    stream advance together. The cache keeps no padding mask: an ``attn_mask`` passed
    to the layer must match the cached keys (evicted columns dropped).

    Raises:
        TypeError: ``num_sinks`` or ``window`` is not an int, ``reindex`` not a bool;
            (at the layer's first call, with ``reindex``) a scheme whose keys it cannot
            move: M-RoPE, ``"dynamic"``/``"longrope"`` RoPE, or another key transform.
        ValueError: ``num_sinks`` negative, ``window`` not positive.
    """

    def __init__(self, num_sinks: int, window: int, *, reindex: bool = True) -> None:
        super().__init__()
        self.num_sinks = check_int("num_sinks", num_sinks, 0)
        self.window = check_int("window", window, 1)
        self.reindex = check_bool("reindex", reindex)
        self._arrived: Tensor | None = None  # the keys as the layer gave them
        self._moved: Tensor | None = None  # how far each has moved down since: [Lk] ints
        self._rotary: RotaryEmbedding | None = None  # the layer's RoPE, when keys move
        self._factor = 1.0  # its attention factor, which its tables carry

    def __repr__(self) -> str:
        return (
            f"SinkCache(num_sinks={self.num_sinks}, window={self.window}, "
            f"reindex={self.reindex}, cached={len(self)})"
        )

    @property
    def capacity(self) -> int:
        """How many keys it holds at most, ``num_sinks + window``."""
        return self.num_sinks + self.window

    def bind(self, layer: nn.Module) -> None:
        """As :meth:`~pecode.attention.KVCache.bind`; with ``reindex``, also checks that
        the layer's keys can move."""
        super().bind(layer)
        scheme = getattr(layer, "position", None)
        self._rotary = None
        if self.reindex and isinstance(scheme, PositionScheme) and _moves_keys(scheme):
            self._rotary = scheme  # the keys move with their positions: rotate them back
            zero = torch.zeros(1, dtype=torch.long, device=scheme.cos_cached.device)
            self._factor = float(scheme.cos_sin(zero)[0][0, 0])  # cos(0) times the factor

    def next_positions(self, length: int, device: torch.device | str | None = None) -> Tensor:
        """Make room for ``length`` new tokens, then return their positions.

        Evicts the oldest non-sink keys until ``length`` more fit, then returns
        ``len(self) .. len(self) + length - 1`` (``reindex=True``) or one past the
        largest position onwards (``reindex=False``). Calling it again for the same
        tokens evicts nothing more.

        Raises:
            ValueError: ``length`` is more than ``window``.
        """
        check_int("length", length)
        if length > self.window:
            raise ValueError(
                f"length={length}: a SinkCache with window={self.window} takes at most "
                f"{self.window} new tokens per call"
            )
        self._evict(len(self) + length - self.capacity)
        if not self.reindex:
            return super().next_positions(length, device)
        return torch.arange(len(self), len(self) + length, device=device)

    def _evict(self, count: int) -> None:
        """Drop the ``count`` oldest keys after the sinks; re-index the recent ones."""
        if count <= 0 or self._arrived is None:
            return
        sinks, rest = torch.arange(self.num_sinks), torch.arange(self.num_sinks + count, len(self))
        keep = torch.cat((sinks, rest)).to(self._arrived.device)
        self.values = self.values.index_select(2, keep)
        self._arrived = self._arrived.index_select(2, keep)
        self._moved = self._moved.index_select(0, keep)
        self.positions = self.positions.index_select(0, keep.to(self.positions.device))
        self.keys = self._arrived
        if self.reindex:
            self._moved[self.num_sinks :] += count
            self.positions[self.num_sinks :] -= count
            self._next = self._next - count
            if self._rotary is not None:
                self.keys = self._rotated_back()

    def _rotated_back(self) -> Tensor:
        """Each arrived key rotated by minus its move: RoPE's ``R(-e)``, without the
        attention factor that the layer's tables carry. The tables keep their dtype
        (float32 or float64), so bf16 keys are rotated in it and rounded once."""
        rotary, arrived, moved = self._rotary, self._arrived, self._moved
        cos, sin = rotary.cos_sin(moved.to(rotary.cos_cached.device))
        cos, sin = (cos / self._factor).to(arrived.device), (-sin / self._factor).to(arrived.device)
        return apply_partial_rope(arrived, cos, sin, rotary.layout)

    def append(self, k: Tensor, v: Tensor, positions: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Add the new keys (already given room by :meth:`next_positions`); return all.

        Raises:
            ValueError: the positions are not ``[L]``; the keys do not fit, or (with
                ``reindex``) the positions are not the cache's next indices: positions
                were passed to the layer instead of taken from :meth:`next_positions`;
                or, as :meth:`~pecode.attention.KVCache.append`, the keys do not match
                the cached ones.
        """
        if positions.dim() != 1:
            raise ValueError(
                f"positions: a SinkCache keeps one position per token, shared by the batch "
                f"([L]), got shape {tuple(positions.shape)}"
            )
        length = k.shape[-2]
        expected = torch.arange(len(self), len(self) + length, device=positions.device)
        if len(self) + length > self.capacity or (
            self.reindex and not torch.equal(positions, expected)
        ):
            raise ValueError(
                f"positions {positions.tolist()} for {length} new keys in a SinkCache "
                f"holding {len(self)} of {self.capacity}: call the layer with "
                "positions=None, so that the cache makes room and gives the positions "
                "(next_positions)"
            )
        keys = super().append(k, v, positions)  # checks the shapes; after the kept keys
        moved = torch.zeros(length, dtype=torch.long, device=k.device)
        if self._arrived is None:
            self._arrived, self._moved = k, moved
        else:
            self._arrived = torch.cat((self._arrived, k), dim=-2)
            self._moved = torch.cat((self._moved, moved))
        return keys

    def store_context(
        self, k: Tensor, v: Tensor, positions: Tensor, context: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Refused: a SinkCache is for self-attention over a stream.

        Raises:
            ValueError: always.
        """
        raise ValueError("a SinkCache is for self-attention; use a KVCache for cross-attention")
