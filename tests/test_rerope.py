"""ReRoPE and Leaky ReRoPE (pecode.rerope) against independent references.

* ``ReRoPE.score_bias`` against :func:`pecode.reference.rope.rerope_logits_loop`, a float64
  loop written from Su's reference code (github.com/bojone/rerope), both layouts;
* :func:`clipped_distance` against a plain Python loop of the rule;
* within the window, against plain RoPE's ``q·k / sqrt(d)`` after
  :meth:`RotaryEmbedding.transform_qk`; one far pair of Leaky ReRoPE against the paper's
  rotation matrix (:func:`pecode.reference.rope.rope_matrix_loop`) at the fractional
  distance ``w + (d - w) / leak``;
* in :class:`~pecode.attention.MultiHeadAttention`: against the plain-RoPE layer with the
  same weights (window >= L), one causal pass against token-by-token decoding with a
  :class:`~pecode.attention.KVCache`, grouped-query attention against the multi-head layer
  whose key/value weights are the groups' repeated;
* float32 against float64; bad input; the repr.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from pecode.alibi import ALiBi
from pecode.attention import KVCache, MultiHeadAttention, PositionScheme
from pecode.reference.rope import rerope_logits_loop, rope_matrix_loop
from pecode.rerope import ReRoPE, clipped_distance
from pecode.rope import RotaryEmbedding

HEAD_DIM = 8


def _qk(shape: tuple[int, ...], seed: int, dtype: torch.dtype = torch.float64):
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)
    k = torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype)
    return q, k


def _rotary(layout: str = "half", dtype: torch.dtype = torch.float64) -> RotaryEmbedding:
    return RotaryEmbedding(HEAD_DIM, layout=layout, dtype=dtype)


def _plain_rope_logits(q, k, positions, layout="half"):
    """Plain RoPE's scaled logits: ``q·k / sqrt(d)`` after RotaryEmbedding.transform_qk."""
    rq, rk = _rotary(layout).transform_qk(q, k, positions, positions)
    return rq @ rk.transpose(-2, -1) / math.sqrt(q.shape[-1])


# --- the logits against the reference code's loop --------------------------------------


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize(("window", "leak"), [(3, None), (5, None), (3, 2.0), (4, 3.5)])
def test_logits_equal_a_loop_written_from_the_reference_code(layout, window, leak):
    length = 9
    q, k = _qk((2, 2, length, HEAD_DIM), seed=window)
    scheme = ReRoPE(_rotary(layout), window, leak=leak)
    positions = torch.arange(length)
    got = scheme.score_bias(q, k, positions, positions)
    expected = rerope_logits_loop(q, k, window, 10000.0, leak=leak, layout=layout)
    assert got.shape == (2, 2, length, length)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-12)
    # per-row positions [B, L], shifted: only distances count, so the loop at 0..L-1 holds
    shifted = torch.stack((positions, positions + 7))
    torch.testing.assert_close(
        scheme.score_bias(q, k, shifted, shifted), expected, rtol=0, atol=1e-12
    )
    # neighbours: another window, another leak, the other layout give other logits
    other_window = rerope_logits_loop(q, k, window + 1, leak=leak, layout=layout)
    assert (got - other_window).abs().max() > 1e-3
    other_leak = rerope_logits_loop(q, k, window, leak=None if leak else 2.0, layout=layout)
    assert (got - other_leak).abs().max() > 1e-3
    other = "half" if layout == "interleaved" else "interleaved"
    assert (got - rerope_logits_loop(q, k, window, leak=leak, layout=other)).abs().max() > 1e-3


def test_the_scheme_leaves_q_and_k_alone_and_scales_the_plain_product_by_zero():
    q, k = _qk((1, 2, 4, HEAD_DIM), seed=1)
    scheme = ReRoPE(_rotary(), 2)
    positions = torch.arange(4)
    tq, tk = scheme.transform_qk(q, k, positions, positions)
    assert torch.equal(tq, q)
    assert torch.equal(tk, k)
    assert scheme.logit_scale(HEAD_DIM) == 0.0
    assert PositionScheme().logit_scale(HEAD_DIM) != 0.0  # neighbour: the usual scale


# --- the clipped distance ------------------------------------------------------------


def _clipped_loop(distances: list[int], window: int, leak: float | None) -> list[float]:
    out = []
    for d in distances:
        if abs(d) < window:
            out.append(float(d))
        elif leak is None:
            out.append(math.copysign(window, d))
        else:
            out.append(math.copysign(window + (abs(d) - window) / leak, d))
    return out


@pytest.mark.parametrize("window", [1, 3, 5])
@pytest.mark.parametrize("leak", [None, 2, 3.5])
def test_clipped_distance_equals_a_python_loop(window, leak):
    distances = list(range(-12, 13))
    got = clipped_distance(torch.tensor(distances), window, leak)
    assert got.dtype == torch.float64
    expected = torch.tensor(_clipped_loop(distances, window, leak), dtype=torch.float64)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-15)
    # neighbour: past the window the distance is no longer the true one
    assert not torch.equal(got, torch.tensor(distances, dtype=torch.float64))
    # any shape, any integer dtype
    grid = torch.arange(-6, 6, dtype=torch.int32).reshape(3, 4)
    flat = _clipped_loop(grid.flatten().tolist(), window, leak)
    torch.testing.assert_close(
        clipped_distance(grid, window, leak), torch.tensor(flat, dtype=torch.float64).reshape(3, 4)
    )


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("leak", [None, 2.0])
def test_logits_equal_plain_ropes_within_the_window_and_differ_beyond(layout, leak):
    length, window = 10, 4
    q, k = _qk((2, 2, length, HEAD_DIM), seed=3)
    positions = torch.arange(length)
    got = ReRoPE(_rotary(layout), window, leak=leak).score_bias(q, k, positions, positions)
    plain = _plain_rope_logits(q, k, positions, layout)
    distance = (positions[:, None] - positions[None, :]).abs()
    # |d| = w is clipped to w itself, so equal there too; from w + 1 on they differ
    inside, beyond = distance <= window, distance > window
    torch.testing.assert_close(got[..., inside], plain[..., inside], rtol=0, atol=1e-12)
    assert bool(((got - plain)[..., beyond].abs() > 1e-9).all())


def test_a_far_leaky_logit_is_ropes_at_the_slowed_distance():
    """One query 35 positions after its key, window 8, leak 3: RoPE at 8 + 27 / 3 = 17,
    the rotation matrix of the paper (interleaved pairs) at that fractional distance."""
    i, j, window, leak = 37, 2, 8, 3.0
    q, k = _qk((1, 1, 1, HEAD_DIM), seed=4)
    qi, kj = torch.tensor([i]), torch.tensor([j])

    def by_matrix(distance: float) -> float:
        # R(i)q · R(j)k = (R(i - j) q) · k
        rotated = rope_matrix_loop(distance, HEAD_DIM) @ q[0, 0, 0].double()
        return float(rotated @ k[0, 0, 0].double()) / math.sqrt(HEAD_DIM)

    leaky = ReRoPE(_rotary("interleaved"), window, leak=leak).score_bias(q, k, qi, kj)
    assert math.isclose(float(leaky), by_matrix(17.0), rel_tol=0, abs_tol=1e-12)
    rerope = ReRoPE(_rotary("interleaved"), window).score_bias(q, k, qi, kj)
    assert math.isclose(float(rerope), by_matrix(8.0), rel_tol=0, abs_tol=1e-12)
    # the key after the query: the mirrored distance, -17
    backwards = ReRoPE(_rotary("interleaved"), window, leak=leak).score_bias(q, k, kj, qi)
    assert math.isclose(float(backwards), by_matrix(-17.0), rel_tol=0, abs_tol=1e-12)
    # neighbours: RoPE at the true distance 35, and at the other candidates
    for wrong in (35.0, 8.0, 8.0 + 35.0 / 3.0):
        assert abs(float(leaky) - by_matrix(wrong)) > 1e-6, wrong


def test_float32_is_within_1e_5_of_float64():
    length = 16
    q, k = _qk((2, 2, length, HEAD_DIM), seed=5, dtype=torch.float32)
    positions = torch.arange(length)
    for leak in (None, 2.5):
        got = ReRoPE(_rotary(dtype=torch.float32), 5, leak=leak).score_bias(
            q, k, positions, positions
        )
        assert got.dtype == torch.float32
        exact = ReRoPE(_rotary(), 5, leak=leak).score_bias(
            q.double(), k.double(), positions, positions
        )
        assert float((got.double() - exact).abs().max()) < 1e-5


# --- in an attention layer --------------------------------------------------------------


def _layer(num_heads: int = 2, num_kv_heads: int | None = None, seed: int = 0):
    torch.manual_seed(seed)
    position = _rotary()
    return MultiHeadAttention(
        num_heads * HEAD_DIM, num_heads, num_kv_heads=num_kv_heads, position=position
    ).double()


def _with_rerope(layer: MultiHeadAttention, window: int, leak: float | None = None):
    swapped = copy.deepcopy(layer)
    swapped.position = ReRoPE(layer.position, window, leak=leak)
    return swapped


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("leak", [None, 2.0])
def test_a_layer_equals_the_plain_rope_layer_while_the_window_covers_the_input(causal, leak):
    length = 8
    layer = _layer()
    x = torch.randn(2, length, layer.embed_dim, dtype=torch.float64)
    plain = layer(x, causal=causal)
    # the longest distance is L - 1; a window of L - 1 clips it to itself
    for window in (length + 3, length, length - 1):
        got = _with_rerope(layer, window, leak)(x, causal=causal)
        torch.testing.assert_close(got, plain, rtol=0, atol=1e-12)
    # neighbour: one step shorter, the distance L - 1 is clipped
    shorter = _with_rerope(layer, length - 2, leak)(x, causal=causal)
    assert (shorter - plain).abs().max() > 1e-6


@pytest.mark.parametrize("leak", [None, 3.0])
def test_decoding_with_a_cache_equals_one_causal_pass(leak):
    length, window = 10, 3
    layer = _with_rerope(_layer(), window, leak)
    x = torch.randn(2, length, layer.embed_dim, dtype=torch.float64)
    whole = layer(x, causal=True)
    cache = KVCache()
    steps = [layer(x[:, t : t + 1], causal=True, cache=cache) for t in range(length)]
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, rtol=0, atol=1e-12)
    # the cache keeps the keys as projected, unrotated
    projected = layer.k_proj(x).view(2, length, layer.num_kv_heads, HEAD_DIM).transpose(1, 2)
    torch.testing.assert_close(cache.keys, projected, rtol=0, atol=1e-12)
    rotated, _ = _rotary().transform_qk(projected, projected, *(torch.arange(length),) * 2)
    assert (cache.keys - rotated).abs().max() > 1e-3  # neighbour: RoPE's cache, rotated
    assert cache.positions.tolist() == list(range(length))
    # neighbour: the plain RoPE layer's causal pass differs (distances past the window)
    plain = _layer()(x, causal=True)
    assert (whole - plain).abs().max() > 1e-6
    # neighbour: a prefill of 4, then one token at a time, still agrees
    cache = KVCache()
    parts = [layer(x[:, :4], causal=True, cache=cache)]
    parts += [layer(x[:, t : t + 1], causal=True, cache=cache) for t in range(4, length)]
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, rtol=0, atol=1e-12)


@pytest.mark.parametrize("leak", [None, 2.0])
def test_grouped_query_attention_equals_mha_with_the_kv_weights_repeated(leak):
    heads, kv_heads, length, window = 4, 2, 9, 3
    grouped = _with_rerope(_layer(heads, kv_heads, seed=1), window, leak)
    full = _with_rerope(_layer(heads, None, seed=2), window, leak)
    group = heads // kv_heads
    with torch.no_grad():
        full.q_proj.load_state_dict(grouped.q_proj.state_dict())
        full.out_proj.load_state_dict(grouped.out_proj.state_dict())
        for name in ("k_proj", "v_proj"):
            source, target = getattr(grouped, name), getattr(full, name)
            weight = source.weight.view(kv_heads, HEAD_DIM, -1).repeat_interleave(group, dim=0)
            target.weight.copy_(weight.reshape(heads * HEAD_DIM, -1))
            bias = source.bias.view(kv_heads, HEAD_DIM).repeat_interleave(group, dim=0)
            target.bias.copy_(bias.reshape(-1))
    x = torch.randn(2, length, grouped.embed_dim, dtype=torch.float64)
    torch.testing.assert_close(grouped(x, causal=True), full(x, causal=True), rtol=0, atol=1e-12)
    # neighbour: the groups taken the other way round (head h reads kv head h % Hkv)
    with torch.no_grad():
        for name in ("k_proj", "v_proj"):
            source, target = getattr(grouped, name), getattr(full, name)
            weight = source.weight.view(kv_heads, HEAD_DIM, -1).repeat(group, 1, 1)
            target.weight.copy_(weight.reshape(heads * HEAD_DIM, -1))
            target.bias.copy_(source.bias.view(kv_heads, HEAD_DIM).repeat(group, 1).reshape(-1))
    assert (grouped(x, causal=True) - full(x, causal=True)).abs().max() > 1e-6


# --- bad input, repr ---------------------------------------------------------------------


def test_bad_input_raises_naming_the_argument():
    rotary = _rotary()
    with pytest.raises(TypeError, match="rotary"):
        ReRoPE(ALiBi(2), 4)
    with pytest.raises(TypeError, match="rotary"):
        ReRoPE(None, 4)
    scaled = RotaryEmbedding(HEAD_DIM, scaling="linear", scaling_params={"factor": 2.0})
    with pytest.raises(ValueError, match="rotary"):
        ReRoPE(scaled, 4)
    with pytest.raises(ValueError, match="rotary"):
        ReRoPE(RotaryEmbedding(HEAD_DIM, rotary_dim=4), 4)
    with pytest.raises(ValueError, match="window"):
        ReRoPE(rotary, 0)
    with pytest.raises(ValueError, match="window"):
        ReRoPE(rotary, -2)
    for window in ("x", 2.0, True):
        with pytest.raises(TypeError, match="window"):
            ReRoPE(rotary, window)
    for leak in (1.0, 1, 0.5, -3.0, math.inf, math.nan):
        with pytest.raises(ValueError, match="leak"):
            ReRoPE(rotary, 4, leak=leak)
    for leak in ("x", True, [2.0]):
        with pytest.raises(TypeError, match="leak"):
            ReRoPE(rotary, 4, leak=leak)
    with pytest.raises(TypeError, match="distance"):
        clipped_distance(torch.tensor([1.0, 2.0]), 4)
    with pytest.raises(TypeError, match="distance"):
        clipped_distance([1, 2], 4)
    with pytest.raises(ValueError, match="window"):
        clipped_distance(torch.tensor([1, 2]), 0)
    with pytest.raises(ValueError, match="leak"):
        clipped_distance(torch.tensor([1, 2]), 2, 1.0)
    # neighbour: the same calls with good arguments pass
    ReRoPE(rotary, 1, leak=1.5)
    clipped_distance(torch.tensor([1, 2]), 1, 1.5)


def test_repr_shows_window_and_leak():
    assert "window=5" in repr(ReRoPE(_rotary(), 5))
    assert "leak" not in repr(ReRoPE(_rotary(), 5))
    text = repr(ReRoPE(_rotary(), 6, leak=2.5))
    assert "window=6" in text
    assert "leak=2.5" in text


@pytest.mark.parametrize("option", [{"logit_scale": 0.5}, {"softcap": 30.0}])
def test_a_layer_with_its_own_logit_scale_or_softcap_refuses_rerope(option):
    """Either would act on q·k alone, which ReRoPE zeroes, and leave its logit (the bias)
    untouched: a silent wrong answer, so the layer raises, naming the option."""
    layer = MultiHeadAttention(16, 2, **option)
    layer.position = ReRoPE(RotaryEmbedding(8), 4)
    with pytest.raises(ValueError, match=next(iter(option))):
        layer(torch.randn(1, 6, 16), causal=True)
    # the neighbour: without the option the same layer runs, and sinks are fine
    plain = MultiHeadAttention(16, 2, position=ReRoPE(RotaryEmbedding(8), 4), sinks=True)
    assert plain(torch.randn(1, 6, 16), causal=True).shape == (1, 6, 16)


def test_a_layer_built_with_logit_scale_and_rerope_refuses_at_once():
    """The check runs at construction too, once logit_scale and softcap are set."""
    with pytest.raises(ValueError, match="logit_scale"):
        MultiHeadAttention(16, 2, position=ReRoPE(RotaryEmbedding(8), 4), logit_scale=0.5)
    with pytest.raises(ValueError, match="softcap"):
        MultiHeadAttention(16, 2, position=ReRoPE(RotaryEmbedding(8), 4), softcap=30.0)
