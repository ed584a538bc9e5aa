"""pecode.relative against float64 loops, hand-worked values and each other."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st
from torch.utils.flop_counter import FlopCounterMode

from pecode.attention import MultiHeadAttention, forward_in_chunks
from pecode.reference import multi_head_attention_loop
from pecode.reference.relative import (
    deberta_log_bucket_loop,
    deberta_scores_loop,
    shaw_attention_loop,
    t5_bucket_loop,
    transformer_xl_scores_loop,
)
from pecode.relative import (
    DebertaRelativePosition,
    ShawRelativePosition,
    T5RelativePositionBias,
    TransformerXLRelativePosition,
    deberta_attention,
    deberta_log_bucket,
    deberta_position_terms,
    deberta_relative_index,
    deberta_table_rows,
    peak_tensor_memory,
    relative_distances,
    relative_shift,
    shaw_key_logits,
    shaw_key_logits_naive,
    shaw_relative_index,
    shaw_value_term,
    shaw_value_term_naive,
    sinusoidal_relative_encoding,
    t5_relative_position_bucket,
    transformer_xl_position_terms,
)


def heads(x: torch.Tensor, layer: MultiHeadAttention, which: str) -> torch.Tensor:
    """Per-head projections of ``x`` with the layer's own weights."""
    projection = getattr(layer, f"{which}_proj")
    batch, length, _ = x.shape
    out = projection(x).view(batch, length, layer.num_heads, layer.head_dim)
    return out.transpose(1, 2)


# --------------------------------------------------------------------------- Shaw


def test_shaw_index_by_hand():
    index = shaw_relative_index(torch.arange(4), torch.arange(4), 2)
    # row i, column j holds clip(j - i, 2) + 2
    expected = torch.tensor([[2, 3, 4, 4], [1, 2, 3, 4], [0, 1, 2, 3], [0, 0, 1, 2]])
    assert torch.equal(index, expected)
    assert torch.equal(shaw_relative_index(torch.arange(3), torch.arange(3), 0), torch.zeros(3, 3))


@pytest.mark.parametrize(
    ("q_positions", "k_positions"),
    [
        (torch.arange(9), torch.arange(9)),
        (torch.arange(5, 9), torch.arange(9)),  # queries at the end, as with a cache
        (torch.tensor([[0, 3, 4, 9], [2, 2, 5, 1]]), torch.tensor([[1, 2, 3], [7, 0, 4]])),
    ],
)
def test_shaw_naive_and_efficient_agree_forward_and_backward(q_positions, k_positions):
    gen = torch.Generator().manual_seed(0)
    batch, heads_, dh, k = 2, 3, 8, 3
    lq, lk = q_positions.shape[-1], k_positions.shape[-1]
    q = torch.randn(batch, heads_, lq, dh, generator=gen, requires_grad=True)
    weights = torch.rand(batch, heads_, lq, lk, generator=gen, requires_grad=True)
    key_table = torch.randn(2 * k + 1, dh, generator=gen, requires_grad=True)
    value_table = torch.randn(2 * k + 1, dh, generator=gen, requires_grad=True)
    grad_logits = torch.randn(batch, heads_, lq, lk, generator=gen)
    grad_out = torch.randn(batch, heads_, lq, dh, generator=gen)

    results = []
    for key_fn, value_fn in (
        (shaw_key_logits_naive, shaw_value_term_naive),
        (shaw_key_logits, shaw_value_term),
    ):
        logits = key_fn(q, key_table, q_positions, k_positions, k)
        term = value_fn(weights, value_table, q_positions, k_positions, k)
        grads = torch.autograd.grad(
            (logits * grad_logits).sum() + (term * grad_out).sum(),
            (q, weights, key_table, value_table),
        )
        results.append((logits, term, *grads))
    for naive, fast in zip(*results, strict=True):
        # to 1e-5 relative to the largest entry (table gradients sum many terms)
        scale = max(1.0, fast.abs().max().item())
        assert (naive - fast).abs().max().item() <= 1e-5 * scale


def test_shaw_key_logits_by_loop():
    gen = torch.Generator().manual_seed(1)
    q = torch.randn(1, 2, 5, 3, generator=gen, dtype=torch.float64)
    table = torch.randn(5, 3, generator=gen, dtype=torch.float64)
    got = shaw_key_logits(q, table, torch.arange(5), torch.arange(5), 2)
    for h in range(2):
        for i in range(5):
            for j in range(5):
                row = max(-2, min(2, j - i)) + 2
                expected = sum(float(q[0, h, i, c]) * float(table[row, c]) for c in range(3))
                assert got[0, h, i, j].item() == pytest.approx(expected, abs=1e-12)


@pytest.mark.parametrize("memory_efficient", [True, False])
@pytest.mark.parametrize("causal", [False, True])
def test_shaw_module_matches_the_paper_loop(memory_efficient, causal):
    torch.manual_seed(2)
    scheme = ShawRelativePosition(4, 2, memory_efficient=memory_efficient)
    layer = MultiHeadAttention(8, 2, position=scheme).double()
    x = torch.randn(2, 6, 8, dtype=torch.float64)
    with torch.no_grad():
        got = layer(x, causal=causal)
        z = shaw_attention_loop(
            heads(x, layer, "q"),
            heads(x, layer, "k"),
            heads(x, layer, "v"),
            scheme.key_table,
            scheme.value_table,
            2,
            causal=causal,
        )
        expected = layer.out_proj(z.transpose(1, 2).reshape(2, 6, 8))
    assert torch.allclose(got, expected, atol=1e-12)


def test_shaw_logits_depend_only_on_the_offset():
    # shift every position by 100: the same logits
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, 1, 6, 4, generator=gen)
    table = torch.randn(7, 4, generator=gen)
    base = shaw_key_logits(q, table, torch.arange(6), torch.arange(6), 3)
    shifted = shaw_key_logits(q, table, torch.arange(100, 106), torch.arange(100, 106), 3)
    assert torch.equal(base, shifted)


def test_shaw_bad_input():
    q = torch.randn(1, 1, 3, 4)
    with pytest.raises(ValueError, match="max_distance"):
        shaw_relative_index(torch.arange(3), torch.arange(3), -1)
    with pytest.raises(TypeError, match="max_distance"):
        shaw_relative_index(torch.arange(3), torch.arange(3), 1.5)
    with pytest.raises(TypeError, match="q_positions"):
        shaw_relative_index(torch.arange(3.0), torch.arange(3), 1)
    with pytest.raises(ValueError, match="key_table"):
        shaw_key_logits(q, torch.randn(4, 4), torch.arange(3), torch.arange(3), 2)
    with pytest.raises(ValueError, match="key_table"):
        shaw_key_logits_naive(q, torch.randn(5, 3), torch.arange(3), torch.arange(3), 2)
    with pytest.raises(ValueError, match=r"q must have shape"):
        shaw_key_logits(q[0], torch.randn(5, 4), torch.arange(3), torch.arange(3), 2)
    with pytest.raises(ValueError, match="lengths"):
        shaw_key_logits(q, torch.randn(5, 4), torch.arange(2), torch.arange(3), 2)
    with pytest.raises(ValueError, match="lengths"):
        shaw_value_term(
            torch.rand(1, 1, 3, 3), torch.randn(5, 4), torch.arange(3), torch.arange(4), 2
        )
    with pytest.raises(ValueError, match="batch"):
        shaw_relative_index(torch.zeros(2, 3, dtype=torch.long), torch.zeros(3, 3).long(), 1)
    with pytest.raises(ValueError, match="head_dim"):
        ShawRelativePosition(0, 2)
    with pytest.raises(ValueError, match="max_distance"):
        ShawRelativePosition(4, -2)


# --------------------------------------------------------------------------- relative shift


@pytest.mark.parametrize(("q_len", "k_len"), [(1, 1), (4, 4), (3, 7), (6, 2)])
def test_relative_shift_picks_the_distance_column(q_len, k_len):
    offset = 5
    distances = relative_distances(q_len, k_len, offset)
    scores = torch.randn(2, 3, q_len, q_len + k_len - 1)
    shifted = relative_shift(scores)
    assert shifted.shape == (2, 3, q_len, k_len)
    for i in range(q_len):
        for j in range(k_len):
            column = (distances == offset + i - j).nonzero().item()
            assert torch.equal(shifted[..., i, j], scores[..., i, column])


def test_relative_shift_gradient():
    scores = torch.randn(1, 2, 3, 6, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(relative_shift, (scores,))
    # non-contiguous input is handled
    wide = torch.randn(6, 3, 2).permute(2, 1, 0)  # [2, 3, 6], not contiguous
    assert torch.equal(relative_shift(wide), relative_shift(wide.contiguous()))


def test_relative_shift_bad_input():
    with pytest.raises(ValueError, match="columns"):
        relative_shift(torch.randn(5, 3))
    with pytest.raises(ValueError, match="dimensions"):
        relative_shift(torch.randn(5))
    with pytest.raises(ValueError, match="k_len >= q_len"):
        relative_shift(torch.randn(5, 4), causal=True)
    with pytest.raises(TypeError, match="causal"):
        relative_shift(torch.randn(3, 5), causal=1)
    with pytest.raises(ValueError, match="k_len >= q_len"):
        relative_distances(5, 4, causal=True)


def txl_pad_and_reshape(scores: torch.Tensor) -> torch.Tensor:
    """Transformer-XL's ``_rel_shift`` (Dai et al. 2019, App. B and their code), in words:
    prepend a zero column to the ``[Lq, Lk]`` scores, read the ``Lq (Lk + 1)`` numbers as
    ``Lk + 1`` rows of ``Lq``, drop the first row, read the rest as ``[Lq, Lk]``."""
    q_len, k_len = scores.shape[-2:]
    padded = torch.cat([scores.new_zeros(*scores.shape[:-1], 1), scores], dim=-1)
    padded = padded.reshape(*scores.shape[:-2], k_len + 1, q_len)
    return padded[..., 1:, :].reshape(scores.shape)


@pytest.mark.parametrize(("q_len", "k_len"), [(1, 1), (4, 4), (3, 7), (5, 6)])
def test_causal_shift_is_right_at_and_below_the_diagonal_only(q_len, k_len):
    """Each column filled with its own distance: the shifted entry (i, j) must read the
    distance of that pair, offset + i - j, wherever j <= i + (Lk - Lq)."""
    offset = 3
    distances = relative_distances(q_len, k_len, offset, causal=True)
    assert distances.tolist() == list(range(offset + q_len - 1, offset + q_len - 1 - k_len, -1))
    scores = distances.double().expand(2, q_len, -1)
    fast, txl = relative_shift(scores, causal=True), txl_pad_and_reshape(scores)
    for i in range(q_len):
        for j in range(k_len):
            if j <= i + k_len - q_len:
                assert fast[0, i, j].item() == offset + i - j
                assert txl[0, i, j].item() == offset + i - j
            else:  # another pair's number: the next row's, Lk columns on (or TXL's 0 pad)
                assert fast[0, i, j].item() != offset + i - j
                assert txl[0, i, j].item() != offset + i - j
    dense = scores.contiguous()  # a view of its input: nothing is copied
    view = relative_shift(dense, causal=True)
    assert view.untyped_storage().data_ptr() == dense.untyped_storage().data_ptr()


@pytest.mark.parametrize(("q_len", "k_len"), [(5, 5), (3, 8)])
def test_causal_terms_match_the_paper_loop_below_the_diagonal_and_txl_fails_above(q_len, k_len):
    """(b) + (c) + (d) from Lk distances against the float64 loop of all four terms."""
    torch.manual_seed(11)
    dim, heads_, dh = 8, 2, 4
    scheme = TransformerXLRelativePosition(dim, heads_, dh).double()
    with torch.no_grad():
        scheme.u.normal_()
        scheme.v.normal_()
        q = torch.randn(2, heads_, q_len, dh, dtype=torch.float64)
        k = torch.randn(2, heads_, k_len, dh, dtype=torch.float64)
        loop = transformer_xl_scores_loop(q, k, scheme.rel_proj.weight, scheme.u, scheme.v, dim)
        loop = loop - q @ k.transpose(-2, -1)  # (b) + (c) + (d)
        offset = k_len - q_len  # the queries are the last q_len of the keys
        full = transformer_xl_position_terms(
            q, k, scheme.rel_keys(q_len, k_len, offset), scheme.u, scheme.v
        )
        causal_scheme = TransformerXLRelativePosition(dim, heads_, dh, causal=True).double()
        causal_scheme.load_state_dict(scheme.state_dict())
        rel = causal_scheme.rel_keys(q_len, k_len, offset)
        assert rel.shape == (heads_, k_len, dh)  # Lk distances, not Lq + Lk - 1
        causal = transformer_xl_position_terms(q, k, rel, scheme.u, scheme.v, causal=True)
        # TXL's way: (b) + (d) against the Lk distances, pad and reshape, then (c)
        by_distance = (q + scheme.v.unsqueeze(1)) @ rel.transpose(-2, -1)
        txl = txl_pad_and_reshape(by_distance) + (k @ scheme.u.unsqueeze(-1)).transpose(-2, -1)
    below = torch.ones(q_len, k_len, dtype=torch.bool).tril(k_len - q_len)
    assert torch.allclose(full, loop, atol=1e-5)  # every entry (float32 sinusoid)
    assert torch.allclose(causal[..., below], loop[..., below], atol=1e-5)
    assert torch.allclose(txl[..., below], loop[..., below], atol=1e-5)
    if q_len > 1:  # above the diagonal neither is the score
        assert ((causal[..., ~below] - loop[..., ~below]).abs() > 1e-3).all()
        assert ((txl[..., ~below] - loop[..., ~below]).abs() > 1e-3).any()


def test_causal_shortcut_does_about_half_the_position_work():
    """Counted with PyTorch's flop counter: (b) + (d) multiplies by Lq + Lk - 1 distances,
    or by Lk; (c) is the same in both."""
    batch, heads_, length, dh = 2, 3, 64, 8
    q, k = torch.randn(batch, heads_, length, dh), torch.randn(batch, heads_, length, dh)
    u = v = torch.zeros(heads_, dh)
    counts = {}
    for causal, width in ((False, 2 * length - 1), (True, length)):
        rel = torch.randn(heads_, width, dh)
        with FlopCounterMode(display=False) as counter:
            transformer_xl_position_terms(q, k, rel, u, v, causal=causal)
        counts[causal] = counter.get_total_flops()
    content = 2 * batch * heads_ * length * dh  # (c): k @ u
    assert counts[False] == 2 * batch * heads_ * length * dh * (2 * length - 1) + content
    assert counts[True] == 2 * batch * heads_ * length * dh * length + content
    assert 1.9 < counts[False] / counts[True] < 2.0


# --------------------------------------------------------------------------- Transformer-XL


def test_sinusoidal_relative_encoding_by_hand():
    enc = sinusoidal_relative_encoding(torch.tensor([-2, 0, 3]), 4)
    # frequencies 1 and 1/100; sines first, then cosines
    for row, d in enumerate((-2, 0, 3)):
        expected = [math.sin(d), math.sin(d / 100), math.cos(d), math.cos(d / 100)]
        assert enc[row].tolist() == pytest.approx(expected, abs=1e-6)
    with pytest.raises(ValueError, match="even"):
        sinusoidal_relative_encoding(torch.arange(3), 5)


def test_transformer_xl_matches_the_paper_loop():
    torch.manual_seed(4)
    scheme = TransformerXLRelativePosition(8, 2, 4).double()
    with torch.no_grad():
        scheme.u.normal_()
        scheme.v.normal_()
    layer = MultiHeadAttention(8, 2, position=scheme).double()
    x = torch.randn(1, 5, 8, dtype=torch.float64)
    q, k = heads(x, layer, "q").detach(), heads(x, layer, "k").detach()
    loop = transformer_xl_scores_loop(q, k, scheme.rel_proj.weight, scheme.u, scheme.v, 8)
    positions = torch.arange(5)
    with torch.no_grad():
        bias = scheme.score_bias(q, k, positions, positions)
        total = q @ k.transpose(-2, -1) / 2 + bias  # sqrt(Dh) = 2
        assert torch.allclose(total, loop / 2, atol=1e-10)
        # the module end to end, against the chapter-1 loop fed the loop's bias
        expected = multi_head_attention_loop(
            layer, x, bias=(loop / 2 - q @ k.transpose(-2, -1) / 2)[0]
        )
        assert torch.allclose(layer(x), expected, atol=1e-10)


def _xl_scheme_with_random_u_v(seed: int) -> TransformerXLRelativePosition:
    """A Transformer-XL scheme (width 8, 2 heads of 4) whose u and v are not zero."""
    torch.manual_seed(seed)
    scheme = TransformerXLRelativePosition(8, 2, 4)
    with torch.no_grad():
        scheme.u.normal_()
        scheme.v.normal_()
    return scheme


def test_transformer_xl_shift_invariance_and_offsets():
    scheme = _xl_scheme_with_random_u_v(5)
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 7, 4)
    near = scheme.score_bias(q, k, torch.arange(4, 7), torch.arange(7))
    far = scheme.score_bias(q, k, torch.arange(104, 107), torch.arange(100, 107))
    assert torch.allclose(near, far, atol=1e-5)
    with pytest.raises(ValueError, match="do not match"):
        scheme.score_bias(q, k, torch.arange(4), torch.arange(7))
    with pytest.raises(ValueError, match="consecutive"):
        scheme.score_bias(q, k, torch.tensor([0, 2, 3]), torch.arange(7))


def test_transformer_xl_bad_shapes():
    q, k = torch.randn(1, 2, 3, 4), torch.randn(1, 2, 5, 4)
    u = v = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="rel_keys"):
        transformer_xl_position_terms(q, k, torch.randn(2, 6, 4), u, v)
    with pytest.raises(ValueError, match="u must"):
        transformer_xl_position_terms(q, k, torch.randn(2, 7, 4), torch.zeros(4), v)
    with pytest.raises(ValueError, match="num_heads"):
        TransformerXLRelativePosition(8, 0, 4)
    with pytest.raises(ValueError, match="rel_keys"):  # causal: Lk = 5 distances
        transformer_xl_position_terms(q, k, torch.randn(2, 7, 4), u, v, causal=True)
    with pytest.raises(TypeError, match="causal"):
        TransformerXLRelativePosition(8, 2, 4, causal="yes")


def test_transformer_xl_causal_scheme_equals_the_full_one_under_a_causal_mask():
    full = _xl_scheme_with_random_u_v(12)
    causal = TransformerXLRelativePosition(8, 2, 4, causal=True)
    causal.load_state_dict(full.state_dict())
    layer_full = MultiHeadAttention(8, 2, position=full).double()
    layer_causal = MultiHeadAttention(8, 2, position=causal).double()
    layer_causal.load_state_dict(layer_full.state_dict())
    x = torch.randn(2, 7, 8, dtype=torch.float64)
    with torch.no_grad():
        expected = layer_full(x, causal=True)
        assert torch.allclose(layer_causal(x, causal=True), expected, atol=1e-12)
        # the scheme is causal by itself: keys after the query get -inf
        assert torch.allclose(layer_causal(x), expected, atol=1e-12)
        # and with a cache, a prompt of 3 then one token at a time
        chunked, _ = forward_in_chunks(layer_causal, x, [3, 1, 1, 1, 1])
        assert torch.allclose(chunked, expected, atol=1e-12)
        q, k = heads(x, layer_causal, "q"), heads(x, layer_causal, "k")
        bias = causal.score_bias(q, k, torch.arange(7), torch.arange(7))
    above = torch.ones(7, 7, dtype=torch.bool).triu(1)
    assert torch.isneginf(bias[..., above]).all()
    assert torch.isfinite(bias[..., ~above]).all()
    with pytest.raises(ValueError, match="k_len >= q_len"):
        causal.score_bias(q, k[:, :, :3], torch.arange(7), torch.arange(3))


# --------------------------------------------------------------------------- T5

# Worked by hand from the rule (32 buckets, max_distance 128). Bidirectional: 16 per
# side, exact below 8, then 8 + floor(8 * ln(n/8) / ln(16)). Causal: 32 buckets, exact
# below 16, then 16 + floor(16 * ln(n/16) / ln(8)).
BIDIRECTIONAL = {
    0: 0, -1: 1, -7: 7, -8: 8, -11: 8, -12: 9, -16: 10, -32: 12, -64: 14, -90: 14,
    -91: 15, -127: 15, -128: 15, -10_000: 15,
    1: 17, 7: 23, 8: 24, 16: 26, 128: 31, 10_000: 31,
}  # fmt: skip
CAUSAL = {
    5: 0, 1: 0, 0: 0, -1: 1, -15: 15, -16: 16, -20: 17, -32: 21, -64: 26, -127: 31,
    -128: 31, -1000: 31,
}  # fmt: skip


def test_t5_buckets_worked_by_hand():
    for table, bidirectional in ((BIDIRECTIONAL, True), (CAUSAL, False)):
        offsets = torch.tensor(list(table))
        got = t5_relative_position_bucket(offsets, bidirectional=bidirectional)
        assert got.tolist() == list(table.values()), bidirectional


@pytest.mark.parametrize("bidirectional", [True, False])
@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (16, 64), (8, 20), (64, 512)])
def test_t5_buckets_match_the_rule_loop(bidirectional, num_buckets, max_distance):
    offsets = torch.arange(-700, 701)
    got = t5_relative_position_bucket(offsets, bidirectional, num_buckets, max_distance)
    expected = [t5_bucket_loop(int(n), bidirectional, num_buckets, max_distance) for n in offsets]
    mismatches = [
        (int(n), g, e) for n, g, e in zip(offsets, got.tolist(), expected, strict=True) if g != e
    ]
    assert not mismatches


@pytest.mark.parametrize(("num_buckets", "max_distance"), [(32, 128), (16, 64)])
def test_t5_bidirectional_bucket_half_never_occurs(num_buckets, max_distance):
    # Figure 5.2's caption: keys after the query start at bucket num_buckets/2 + 1, so the
    # bucket num_buckets/2 (distance 0 on the "after" side) is never produced
    offsets = torch.arange(-(10**4), 10**4 + 1)
    used = set(t5_relative_position_bucket(offsets, True, num_buckets, max_distance).tolist())
    assert used == set(range(num_buckets)) - {num_buckets // 2}


@given(st.integers(-5000, 5000), st.integers(0, 5000), st.booleans())
def test_t5_buckets_grow_with_distance(offset, extra, bidirectional):
    # moving a key farther from the query on the same side never lowers the bucket
    # within that side, and buckets stay in range
    farther = offset - extra if offset <= 0 else offset + extra
    a, b = t5_relative_position_bucket(torch.tensor([offset, farther]), bidirectional).tolist()
    assert 0 <= a < 32
    assert 0 <= b < 32
    if bidirectional or offset <= 0:
        assert b >= a


def test_t5_module_bias_is_a_table_lookup():
    torch.manual_seed(6)
    scheme = T5RelativePositionBias(3, bidirectional=False, num_buckets=8, max_distance=16)
    bias = scheme.position_bias(torch.arange(20), torch.arange(20))
    assert bias.shape == (3, 20, 20)
    for i in range(20):
        for j in range(20):
            bucket = t5_bucket_loop(j - i, False, 8, 16)
            assert torch.equal(bias[:, i, j], scheme.bias.weight[bucket])
    layer = MultiHeadAttention(6, 3, position=scheme).double()
    x = torch.randn(1, 20, 6, dtype=torch.float64)
    with torch.no_grad():
        expected = multi_head_attention_loop(layer, x, bias=bias.double(), scale=1.0)
        assert torch.allclose(layer(x), expected, atol=1e-10)


def test_t5_bad_input():
    with pytest.raises(TypeError, match="relative_position"):
        t5_relative_position_bucket(torch.tensor([1.0]))
    with pytest.raises(ValueError, match="num_buckets"):
        t5_relative_position_bucket(torch.tensor([1]), num_buckets=2)
    with pytest.raises(ValueError, match="max_distance"):
        t5_relative_position_bucket(torch.tensor([1]), num_buckets=32, max_distance=8)
    with pytest.raises(ValueError, match="num_heads"):
        T5RelativePositionBias(0)
    with pytest.raises(ValueError, match="num_heads"):
        T5RelativePositionBias(-3)


# --------------------------------------------------------------------------- DeBERTa


def test_deberta_delta_by_hand():
    # k = 2: δ(i, j) = clamp(i - j + 2, 0, 3)
    index = deberta_relative_index(torch.arange(4), torch.arange(4), 2)
    expected = torch.tensor([[2, 1, 0, 0], [3, 2, 1, 0], [3, 3, 2, 1], [3, 3, 3, 2]])
    assert torch.equal(index, expected)


@pytest.mark.parametrize(("buckets", "max_distance"), [(8, 32), (256, 512), (16, 40), (6, 11)])
def test_deberta_log_buckets_match_the_rule_loop(buckets, max_distance):
    offsets = torch.arange(-3000, 3001)
    got = deberta_log_bucket(offsets, buckets, max_distance)
    expected = [deberta_log_bucket_loop(int(n), buckets, max_distance) for n in offsets]
    assert got.tolist() == expected
    # the index: exact rows inside +-b/2, then the log buckets, clamped to 0 .. 2b - 1
    index = deberta_relative_index(
        torch.tensor([3000]), 3000 - offsets, max_distance, position_buckets=buckets
    )[0]
    assert index.tolist() == [min(max(e + buckets, 0), 2 * buckets - 1) for e in expected]
    assert deberta_table_rows(max_distance, buckets) == 2 * buckets


def test_deberta_p2c_rows_paper_and_released():
    """Released: p2c reads the row of δ(i, j), like c2p; paper: δ(j, i). Inside the window
    that is the reversed row 2k - δ(i, j); the offsets each tells apart differ at the edges."""
    k = 3
    positions = torch.arange(12)
    q = torch.zeros(1, 1, 12, 1)
    keys = torch.ones(1, 1, 12, 1)
    rows = torch.arange(2.0 * k).view(1, 2 * k, 1)  # Q^r row r holds r, so p2c = row read
    zero = torch.zeros(1, 2 * k, 1)
    _, released = deberta_position_terms(q, keys, rows, zero, positions, positions, k)
    _, paper = deberta_position_terms(q, keys, rows, zero, positions, positions, k, "paper")
    delta = deberta_relative_index(positions, positions, k)
    assert torch.equal(released[0, 0], delta.float())
    assert torch.equal(paper[0, 0], delta.T.float())
    seen = {"released": set(), "paper": set()}
    for i in range(12):
        for j in range(12):
            if abs(i - j) < k:
                assert paper[0, 0, i, j] == 2 * k - released[0, 0, i, j]
            for name, term in (("released", released), ("paper", paper)):
                if (term[0, 0, i, j] != term[0, 0, 11, 0]) and (
                    term[0, 0, i, j] != term[0, 0, 0, 11]
                ):
                    seen[name].add(i - j)  # an offset with its own row (not a clamped end)
    assert seen["released"] == set(range(-k + 1, k - 1))  # ends -k, k - 1 are the clamps
    assert seen["paper"] == set(range(-k + 2, k))


@pytest.mark.parametrize("p2c_index", ["released", "paper"])
@pytest.mark.parametrize("buckets", [None, 4])
def test_deberta_matches_the_loop(p2c_index, buckets):
    torch.manual_seed(7)
    max_distance = 3 if buckets is None else 6
    scheme = DebertaRelativePosition(
        8, 2, 4, max_distance, position_buckets=buckets, p2c_index=p2c_index
    ).double()
    with torch.no_grad():
        scheme.rel_embeddings.normal_()
    layer = MultiHeadAttention(8, 2, position=scheme).double()
    length = 7 if buckets is None else 12
    x = torch.randn(2, length, 8, dtype=torch.float64)
    q, k = heads(x, layer, "q").detach(), heads(x, layer, "k").detach()
    q_rel, k_rel = (t.detach() for t in scheme.projected())
    loop = deberta_scores_loop(
        q, k, q_rel, k_rel, max_distance, p2c_index=p2c_index, position_buckets=buckets
    )
    positions = torch.arange(length)
    c2p, p2c = deberta_position_terms(
        q, k, q_rel, k_rel, positions, positions, max_distance, p2c_index,
        position_buckets=buckets,
    )  # fmt: skip
    assert torch.allclose(q @ k.transpose(-2, -1) + c2p + p2c, loop, atol=1e-10)
    scale = 1 / math.sqrt(3 * 4)
    with torch.no_grad():
        for b in range(2):
            bias = (loop[b] - q[b] @ k[b].transpose(-2, -1)) * scale
            expected = multi_head_attention_loop(layer, x[b : b + 1], bias=bias, scale=scale)
            assert torch.allclose(layer(x[b : b + 1]), expected, atol=1e-10)


def test_deberta_released_and_paper_forms_differ():
    torch.manual_seed(8)
    released = DebertaRelativePosition(8, 2, 4, 3).double()
    with torch.no_grad():
        released.rel_embeddings.normal_()
    paper = DebertaRelativePosition(8, 2, 4, 3, p2c_index="paper").double()
    paper.load_state_dict(released.state_dict())
    q, k = (
        torch.randn(1, 2, 6, 4, dtype=torch.float64),
        torch.randn(1, 2, 6, 4, dtype=torch.float64),
    )
    positions = torch.arange(6)
    with torch.no_grad():
        gap = released.score_bias(q, k, positions, positions) - paper.score_bias(
            q, k, positions, positions
        )
    assert gap.abs().max() > 0.1


def test_deberta_shared_projections_and_layer_norm_by_hand():
    """share_att_key: P is projected by the layer's own W_Q, W_K with their biases;
    norm_rel_ebd: P goes through a LayerNorm first. Both written out here in float64."""
    torch.manual_seed(9)
    layer = deberta_attention(
        8, 2, 6, position_buckets=4, share_att_key=True, norm_rel_ebd=True
    ).double()
    scheme = layer.position
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.normal_()
    table = scheme.rel_embeddings.detach()
    mean = table.mean(-1, keepdim=True)
    var = ((table - mean) ** 2).mean(-1, keepdim=True)
    norm = scheme.rel_norm
    normed = (table - mean) / torch.sqrt(var + 1e-7) * norm.weight.detach() + norm.bias.detach()

    def by_hand(proj):
        out = normed @ proj.weight.detach().T + proj.bias.detach()  # P W + b
        return out.view(8, 2, 4).transpose(0, 1)

    q_rel, k_rel = scheme.projected()
    assert torch.allclose(q_rel, by_hand(layer.q_proj), atol=1e-10)
    assert torch.allclose(k_rel, by_hand(layer.k_proj), atol=1e-10)
    x = torch.randn(1, 12, 8, dtype=torch.float64)
    q, k = heads(x, layer, "q").detach(), heads(x, layer, "k").detach()
    loop = deberta_scores_loop(
        q, k, by_hand(layer.q_proj), by_hand(layer.k_proj), 6, position_buckets=4
    )
    scale = 1 / math.sqrt(12)
    with torch.no_grad():
        bias = (loop[0] - q[0] @ k[0].transpose(-2, -1)) * scale
        expected = multi_head_attention_loop(layer, x, bias=bias, scale=scale)
        assert torch.allclose(layer(x), expected, atol=1e-10)
    # W_Q, W_K are not registered twice, and a deep copy uses its own projections
    assert not any(name.startswith("position.") and "proj" in name for name in layer.state_dict())
    twin = copy.deepcopy(layer)
    with torch.no_grad():
        twin.q_proj.weight.zero_()
        twin.q_proj.bias.zero_()
        assert torch.equal(twin.position.projected()[0], torch.zeros_like(q_rel))
        assert not torch.equal(scheme.projected()[0], torch.zeros_like(q_rel))


def test_deberta_parameter_counts():
    d, heads_, dh = 16, 2, 8

    def count(**options):
        return sum(
            p.numel() for p in DebertaRelativePosition(d, heads_, dh, 4, **options).parameters()
        )

    assert count() == 2 * 4 * d + 2 * d * heads_ * dh  # P, W_{q,r}, W_{k,r}
    assert count(pos_proj_bias=True) == count() + 2 * heads_ * dh
    assert count(norm_rel_ebd=True) == count() + 2 * d
    assert count(position_buckets=2) == 2 * 2 * d + 2 * d * heads_ * dh
    assert count(share_att_key=True) == 2 * 4 * d  # only P: W_Q, W_K belong to the layer
    v3_shape = DebertaRelativePosition(
        d, heads_, dh, 512, position_buckets=256, share_att_key=True, norm_rel_ebd=True
    )
    assert sum(p.numel() for p in v3_shape.parameters()) == 2 * 256 * d + 2 * d


def test_deberta_bad_input():
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="max_distance"):
        deberta_relative_index(torch.arange(3), torch.arange(3), 0)
    with pytest.raises(ValueError, match="k_rel"):
        deberta_position_terms(
            q, q, torch.randn(2, 4, 4), torch.randn(2, 5, 4), torch.arange(3), torch.arange(3), 2
        )
    with pytest.raises(ValueError, match="lengths"):
        deberta_position_terms(
            q, q, torch.randn(2, 4, 4), torch.randn(2, 4, 4), torch.arange(4), torch.arange(3), 2
        )
    with pytest.raises(ValueError, match="p2c_index"):
        deberta_position_terms(
            q, q, torch.randn(2, 4, 4), torch.randn(2, 4, 4), torch.arange(3), torch.arange(3),
            2, "code",
        )  # fmt: skip
    with pytest.raises(ValueError, match="position_buckets"):
        deberta_relative_index(torch.arange(3), torch.arange(3), 8, position_buckets=1)
    with pytest.raises(TypeError, match="position_buckets"):
        deberta_relative_index(torch.arange(3), torch.arange(3), 8, position_buckets=4.0)
    with pytest.raises(ValueError, match="max_distance"):
        deberta_log_bucket(torch.arange(3), 8, 5)
    with pytest.raises(TypeError, match="relative_position"):
        deberta_log_bucket(torch.arange(3.0), 8, 32)
    with pytest.raises(ValueError, match="num_heads"):
        DebertaRelativePosition(8, 0, 4, 2)
    with pytest.raises(ValueError, match="max_distance"):
        DebertaRelativePosition(8, 2, 4, -1)
    with pytest.raises(TypeError, match="share_att_key"):
        DebertaRelativePosition(8, 2, 4, 2, share_att_key="yes")
    with pytest.raises(TypeError, match="norm_rel_ebd"):
        DebertaRelativePosition(8, 2, 4, 2, norm_rel_ebd="layer_norm")
    with pytest.raises(ValueError, match="pos_proj_bias"):
        DebertaRelativePosition(8, 2, 4, 2, share_att_key=True, pos_proj_bias=True)
    with pytest.raises(ValueError, match="layer_norm_eps"):
        DebertaRelativePosition(8, 2, 4, 2, layer_norm_eps=0.0)
    with pytest.raises(TypeError, match="layer_norm_eps"):
        DebertaRelativePosition(8, 2, 4, 2, layer_norm_eps="1e-7")
    with pytest.raises(ValueError, match="p2c_index"):
        DebertaRelativePosition(8, 2, 4, 2, p2c_index="both")
    shared = DebertaRelativePosition(8, 2, 4, 2, share_att_key=True)
    with pytest.raises(RuntimeError, match="bind_content_projections"):
        shared.projected()
    with pytest.raises(TypeError, match="layer"):
        shared.bind_content_projections(torch.nn.Linear(8, 8))
    with pytest.raises(ValueError, match="layer must hold"):
        shared.bind_content_projections(MultiHeadAttention(8, 2))
    with pytest.raises(ValueError, match="share_att_key"):
        DebertaRelativePosition(8, 2, 4, 2).bind_content_projections(MultiHeadAttention(8, 2))
    with pytest.raises(ValueError, match="embed_dim"):
        deberta_attention(9, 2, 4)


# --------------------------------------------------------------------------- memory


def test_peak_tensor_memory_by_hand():
    def two_buffers():
        a = torch.empty(1000)  # 4000 bytes
        b = torch.empty(500, dtype=torch.float64)  # 4000 bytes, both alive
        del a
        c = torch.empty(100)  # a was freed: live 4400 < 8000
        return b, c

    assert peak_tensor_memory(two_buffers) == 8000
    x = torch.randn(64)
    assert peak_tensor_memory(lambda: x.view(8, 8).t()) == 0  # views allocate nothing
    assert peak_tensor_memory(lambda: x.view(8, 8).t().contiguous()) == 256
    with pytest.raises(TypeError, match="fn"):
        peak_tensor_memory(3)


def test_naive_shaw_holds_the_big_tensor_and_the_efficient_one_does_not():
    length, dh, k = 128, 32, 8
    q = torch.randn(1, 1, length, dh)
    table = torch.randn(2 * k + 1, dh)
    positions = torch.arange(length)
    big = length * length * dh * 4  # [L, L, Dh] float32
    naive = peak_tensor_memory(lambda: shaw_key_logits_naive(q, table, positions, positions, k))
    fast = peak_tensor_memory(lambda: shaw_key_logits(q, table, positions, positions, k))
    assert naive >= big
    assert fast < big / 4


# --------------------------------------------------------------------------- batched positions


@pytest.mark.parametrize(
    "make_scheme",
    [
        lambda: ShawRelativePosition(4, 2),
        lambda: T5RelativePositionBias(2, num_buckets=8, max_distance=16),
        lambda: DebertaRelativePosition(8, 2, 4, 3),
    ],
    ids=["shaw", "t5", "deberta"],
)
def test_batched_positions_equal_one_sequence_at_a_time(make_scheme):
    torch.manual_seed(8)
    layer = MultiHeadAttention(8, 2, position=make_scheme()).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 3, 9, 1, 20]])
    with torch.no_grad():
        together = layer(x, positions=positions)
        apart = [layer(x[b : b + 1], positions=positions[b]) for b in range(2)]
    assert torch.allclose(together, torch.cat(apart), atol=1e-12)


@given(
    st.integers(1, 9),
    st.integers(1, 9),
    st.integers(0, 12),
    st.integers(1, 6),
    st.integers(-20, 20),
)
def test_shaw_forms_agree_for_any_sizes(q_len, k_len, max_distance, head_dim, start):
    gen = torch.Generator().manual_seed(q_len * 1000 + k_len * 100 + max_distance)
    q = torch.randn(1, 2, q_len, head_dim, generator=gen, dtype=torch.float64)
    weights = torch.rand(1, 2, q_len, k_len, generator=gen, dtype=torch.float64)
    table = torch.randn(2 * max_distance + 1, head_dim, generator=gen, dtype=torch.float64)
    qp, kp = torch.arange(start, start + q_len), torch.arange(k_len)
    assert torch.allclose(
        shaw_key_logits(q, table, qp, kp, max_distance),
        shaw_key_logits_naive(q, table, qp, kp, max_distance),
        atol=1e-12,
    )
    assert torch.allclose(
        shaw_value_term(weights, table, qp, kp, max_distance),
        shaw_value_term_naive(weights, table, qp, kp, max_distance),
        atol=1e-12,
    )
