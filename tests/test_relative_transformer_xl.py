"""pecode.relative.transformer_xl: the relative shift and Transformer-XL's position terms
against the paper's loop and the authors' pad-and-reshape, causal shortcut included."""

from __future__ import annotations

import math

import pytest
import torch
from relative_helpers import heads
from torch.utils.flop_counter import FlopCounterMode

from pecode.attention import MultiHeadAttention, forward_in_chunks
from pecode.reference import multi_head_attention_loop
from pecode.reference.relative import (
    transformer_xl_scores_loop,
)
from pecode.relative import (
    TransformerXLRelativePosition,
    relative_distances,
    relative_shift,
    sinusoidal_relative_encoding,
    transformer_xl_position_terms,
)


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


# --------------------------------------------------------------------------- scheme


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


def test_transformer_xl_errors_name_the_callers_arguments():
    # the scheme builds rel_keys, u and v itself: a query of another head count or head
    # dimension is reported as such, not as rel_keys of the wrong shape
    scheme = TransformerXLRelativePosition(16, 2, 8)
    positions = torch.arange(4)
    for shape, match in (
        ((1, 3, 4, 8), "q has 3 heads, TransformerXLRelativePosition was built for num_heads=2"),
        ((1, 2, 4, 16), "q has head dimension 16, .* built for head_dim=8"),
    ):
        q = torch.randn(shape)
        with pytest.raises(ValueError, match=match):
            scheme.score_bias(q, q, positions, positions)
    q = torch.randn(1, 2, 4, 8)
    with pytest.raises(ValueError, match="shared by the batch"):
        scheme.score_bias(q, q, torch.arange(8).view(2, 4), torch.arange(8).view(2, 4))
    rel_keys, u = torch.randn(2, 7, 8), torch.zeros(2, 8)
    with pytest.raises(ValueError, match=r"q and k must agree in batch, heads and head dim"):
        transformer_xl_position_terms(q, torch.randn(3, 2, 4, 8), rel_keys, u, u)
    with pytest.raises(TypeError, match=r"u must be a torch\.Tensor, got list"):
        transformer_xl_position_terms(q, q, rel_keys, [[0.0] * 8] * 2, u)
    with pytest.raises(TypeError, match=r"rel_keys must be a torch\.Tensor, got list"):
        transformer_xl_position_terms(q, q, rel_keys.tolist(), u, u)
    with pytest.raises(TypeError, match="base must be a real number"):
        sinusoidal_relative_encoding(torch.arange(3), 4, "10000")
    with pytest.raises(ValueError, match="base must be greater than 1"):
        sinusoidal_relative_encoding(torch.arange(3), 4, -1.0)  # silently NaN before


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
