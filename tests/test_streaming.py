"""pecode.streaming.SinkCache (StreamingLLM) against the authors' recomputation, in float64."""

from __future__ import annotations

import pytest
import torch

from pecode.alibi import ALiBi
from pecode.attention import KVCache, MultiHeadAttention
from pecode.experiments import TinyDecoder
from pecode.experiments.text import position_losses, streaming_losses
from pecode.reference.attention import attention_layer_loop
from pecode.rope import RotaryEmbedding, apply_rope, rope_cos_sin, rope_inv_freq
from pecode.streaming import SinkCache


def _layer(position=None, dtype=torch.float32, **options) -> MultiHeadAttention:
    torch.manual_seed(0)
    return MultiHeadAttention(16, 2, position=position, **options).to(dtype)


def _stream(layer, x, cache, step):
    """The layer's outputs for ``x``, fed ``step`` tokens at a time through ``cache``."""
    return torch.cat(
        [layer(x[:, t : t + step], causal=True, cache=cache) for t in range(0, x.shape[1], step)],
        1,
    )


def _kept(start: int, new: int, num_sinks: int, window: int) -> list[int]:
    """The authors' cache when tokens ``start .. start+new-1`` come in: the first
    ``num_sinks`` tokens and the latest ``window``, the new ones included."""
    recent = range(max(num_sinks, start + new - window), start + new)
    return sorted(set(range(min(num_sinks, start + new))) | set(recent))


def _recomputed(layer, x, num_sinks, window, step, reindex):
    """StreamingLLM's own algorithm: at each call, the kept tokens' keys recomputed and
    rotated at their index in the cache (or their position in the text), in float64."""
    out = []
    for start in range(0, x.shape[1], step):
        new = min(step, x.shape[1] - start)
        kept = _kept(start, new, num_sinks, window)
        positions = list(range(len(kept))) if reindex else kept
        out.append(attention_layer_loop(layer, x[:, kept], positions, causal=True)[:, -new:])
    return torch.cat(out, 1)


@pytest.mark.parametrize("reindex", [True, False])
@pytest.mark.parametrize("step", [1, 2, 3])
def test_decoding_equals_the_authors_recomputation_in_a_float64_loop(reindex, step):
    layer, x = _layer(RotaryEmbedding(8)), torch.randn(2, 17, 16, generator=torch.manual_seed(1))
    cache = SinkCache(2, 4, reindex=reindex)
    got = _stream(layer, x, cache, step)
    want = _recomputed(layer, x, 2, 4, step, reindex)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)
    assert len(cache) == 6
    if reindex:
        assert cache.positions.tolist() == [0, 1, 2, 3, 4, 5]
    else:
        assert cache.positions.tolist()[:2] == [0, 1]
        assert cache.positions.tolist()[-1] == 16


def test_reindexing_changes_what_a_query_sees_of_its_sinks():
    """The false neighbour: positions in the text give other outputs once tokens left."""
    layer, x = _layer(RotaryEmbedding(8)), torch.randn(1, 12, 16, generator=torch.manual_seed(2))
    cached = _stream(layer, x, SinkCache(2, 4), 1)
    in_text = _stream(layer, x, SinkCache(2, 4, reindex=False), 1)
    torch.testing.assert_close(cached[:, :6], in_text[:, :6])  # nothing evicted yet
    assert (cached[:, 6:] - in_text[:, 6:]).abs().amax() > 1e-3


def _exact_keys(layer, x, kept):
    """The kept tokens' keys, as the layer projects them, rotated at their cache index
    in float64 (the authors' way)."""
    k = layer.k_proj(x[:, kept]).unflatten(-1, (layer.num_kv_heads, -1)).transpose(1, 2)
    rope = layer.position
    inv_freq = rope_inv_freq(rope.head_dim, rope.base, dtype=torch.float64)
    cos, sin = rope_cos_sin(torch.arange(len(kept)), inv_freq)
    return apply_rope(k.double(), cos, sin)  # [B, Hkv, n, Dh]


def test_a_key_is_rotated_back_once_however_often_it_moved():
    """Float32, a window of 300, 600 steps: each kept key has moved up to 300 times. One
    rotation from the key as it came in stays within 2e-6 of the exact key at its cache
    index; rotating by one step at each move (transformers' former SinkCache) drifts to
    about 2e-5."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 2, position=RotaryEmbedding(8))
    x = torch.randn(1, 600, 16, generator=torch.manual_seed(3))
    cache = SinkCache(1, 300)
    with torch.no_grad():
        _stream(layer, x, cache, 1)
        kept = _kept(599, 1, 1, 300)
        exact = _exact_keys(layer, x, kept)
    assert cache.positions.tolist() == list(range(301))
    assert (cache.keys.double() - exact).abs().max() < 2e-6


def test_bf16_keys_are_rotated_back_in_the_tables_dtype():
    """bf16 keys, float32 tables: each moved key is rotated in float32 and rounded once,
    within one bf16 unit (eps·|x|) of the float64 rotation of the key as it came in
    (read from the cache's own record of it). Rotating with tables rounded to bf16 was
    off by up to 128 units on small entries."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(64, 1, position=RotaryEmbedding(64)).to(torch.bfloat16)
    x = torch.randn(1, 300, 64, generator=torch.manual_seed(4)).to(torch.bfloat16)
    cache = SinkCache(4, 60)
    with torch.no_grad():
        _stream(layer, x, cache, 1)
    arrived, moved = cache._arrived, cache._moved  # the keys as they came, and their moves
    cos, sin = rope_cos_sin(-moved, rope_inv_freq(64, dtype=torch.float64))
    exact = apply_rope(arrived.double(), cos, sin)
    unit = torch.finfo(torch.bfloat16).eps * exact.abs().clamp(min=1e-3)
    assert ((cache.keys.double() - exact).abs() / unit).max() < 1


def test_no_sinks_is_a_sliding_window_in_one_pass():
    """RoPE is relative, so re-indexed keys give the outputs of the layer's own window."""
    x = torch.randn(2, 15, 16, generator=torch.manual_seed(4))
    layer = _layer(RotaryEmbedding(8))
    windowed = _layer(RotaryEmbedding(8), window=5)
    torch.testing.assert_close(
        _stream(layer, x, SinkCache(0, 5), 1), windowed(x, causal=True), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("reindex", [True, False])
def test_a_bias_scheme_reads_the_reindexed_positions(reindex):
    """ALiBi leaves keys as they are: only the cached positions move. Against the layer
    itself run on the kept tokens at those positions (the recomputation)."""
    layer = _layer(ALiBi(2))
    x = torch.randn(1, 11, 16, generator=torch.manual_seed(5))
    got = _stream(layer, x, SinkCache(2, 3, reindex=reindex), 1)
    for t in range(11):
        kept = _kept(t, 1, 2, 3)
        positions = torch.arange(len(kept)) if reindex else torch.tensor(kept)
        want = layer(x[:, kept], positions=positions, causal=True)[:, -1]
        torch.testing.assert_close(got[:, t], want, atol=1e-6, rtol=1e-6)


def test_scaled_rope_rotates_back_without_its_attention_factor():
    """YaRN's tables carry an attention factor; moving a key must rotate it, not scale it."""
    params = {"factor": 4.0, "original_max_position_embeddings": 8}
    rope = RotaryEmbedding(8, scaling="yarn", scaling_params=params)
    x = torch.randn(1, 12, 16, generator=torch.manual_seed(6))
    layer = _layer(rope)
    got = _stream(layer, x, SinkCache(1, 4), 1)
    for t in (4, 8, 11):
        kept = _kept(t, 1, 1, 4)
        want = layer(x[:, kept], causal=True)[:, -1]  # recomputed at indices 0 .. 4
        torch.testing.assert_close(got[:, t], want, atol=1e-5, rtol=1e-5)


def test_a_model_streams_through_one_cache_per_block():
    """TinyDecoder with num_sinks=0 equals its own sliding-window reading (the mask)."""
    torch.manual_seed(0)
    model = TinyDecoder("rope", vocab_size=11, max_len=8, dim=16, num_heads=2).eval()
    windows = torch.randint(0, 11, (3, 21), generator=torch.manual_seed(7))
    streamed = streaming_losses(model, windows, num_sinks=0, window=6)
    masked = position_losses(model, windows, window=6)
    torch.testing.assert_close(streamed, masked, atol=1e-5, rtol=1e-5)
    with_sinks = streaming_losses(model, windows, num_sinks=2, window=4)
    assert (with_sinks[:, 6:] - masked[:, 6:]).abs().amax() > 1e-4  # another reading


def test_positions_given_by_hand_are_refused_with_reindexing():
    """With reindex, a position other than the cache's next index would leave the cache
    with positions that are not its indices: refused before the cache is full, too."""
    layer, x = _layer(RotaryEmbedding(8)), torch.randn(1, 4, 16)
    cache = SinkCache(2, 4)
    layer(x[:, :2], causal=True, cache=cache)
    with pytest.raises(ValueError, match="positions=None"):
        layer(x[:, 2:3], positions=torch.tensor([100]), causal=True, cache=cache)
    layer(x[:, 2:3], positions=torch.tensor([2]), causal=True, cache=cache)  # its own
    with pytest.raises(ValueError, match="do not fit the cache"):  # the base class's check
        cache.append(torch.randn(1, 4, 1, 4), torch.randn(1, 4, 1, 4), torch.tensor([3]))


def test_query_temperature_by_index_counts_the_index_in_the_cache():
    """Llama 4's temperature by index reads the cache's length after eviction: the same
    as the layer run on the kept tokens alone."""
    temperature = {"beta": 0.5, "length": 2, "offset": 1, "by": "index"}
    layer = _layer(RotaryEmbedding(8), query_temperature=temperature)
    x = torch.randn(1, 9, 16, generator=torch.manual_seed(8))
    got = _stream(layer, x, SinkCache(1, 2), 1)
    for t in range(9):
        kept = _kept(t, 1, 1, 2)
        want = layer(x[:, kept], causal=True)[:, -1]
        torch.testing.assert_close(got[:, t], want, atol=1e-6, rtol=1e-6)


def test_errors_name_the_argument():
    with pytest.raises(TypeError, match="num_sinks"):
        SinkCache(1.5, 4)
    with pytest.raises(ValueError, match="num_sinks"):
        SinkCache(-1, 4)
    with pytest.raises(ValueError, match="window"):
        SinkCache(1, 0)
    with pytest.raises(TypeError, match="reindex"):
        SinkCache(1, 4, reindex=1)
    x = torch.randn(1, 5, 16)
    with pytest.raises(ValueError, match="length=5"):
        _layer(RotaryEmbedding(8))(x, causal=True, cache=SinkCache(1, 4))
    layer, cache = _layer(RotaryEmbedding(8)), SinkCache(1, 2)
    layer(x[:, :2], causal=True, cache=cache)
    layer(x[:, 2:3], causal=True, cache=cache)  # full: 3 of 3
    with pytest.raises(ValueError, match="positions=None"):
        layer(x[:, :1], positions=torch.tensor([3]), causal=True, cache=cache)
    with pytest.raises(ValueError, match=r"\[L\]"):
        _layer(RotaryEmbedding(8))(
            x[:, :2], positions=torch.tensor([[0, 1]]), causal=True, cache=SinkCache(1, 4)
        )
    dyn = {"factor": 2.0, "original_max_position_embeddings": 4}
    dynamic = RotaryEmbedding(8, scaling="dynamic", scaling_params=dyn)
    with pytest.raises(TypeError, match="dynamic"):
        _layer(dynamic)(x[:, :2], causal=True, cache=SinkCache(1, 4))
    _layer(dynamic)(x[:, :2], causal=True, cache=SinkCache(1, 4, reindex=False))  # keys stay
    with pytest.raises(ValueError, match="cross-attention"):
        SinkCache(4, 8).store_context(x, x, torch.arange(5), x)
    model = TinyDecoder("sinusoidal", vocab_size=5, max_len=4, dim=8, num_heads=2)
    with pytest.raises(ValueError, match="caches"):
        model(torch.zeros(1, 2, dtype=torch.long), caches=[KVCache(), KVCache()])
    model = TinyDecoder("rope", vocab_size=5, max_len=4, dim=8, num_heads=2)
    with pytest.raises(ValueError, match="one per block"):
        model(torch.zeros(1, 2, dtype=torch.long), caches=[KVCache()])
    with pytest.raises(TypeError, match="caches"):
        model(torch.zeros(1, 2, dtype=torch.long), caches=KVCache())
    with pytest.raises(TypeError, match="model"):
        streaming_losses(object(), torch.zeros(1, 3, dtype=torch.long), num_sinks=1, window=2)


def test_repr_and_capacity():
    cache = SinkCache(4, 252)
    assert cache.capacity == 256
    assert repr(cache) == "SinkCache(num_sinks=4, window=252, reindex=True, cached=0)"
