"""pecode.sandwich against float64 loops written from the paper's construction, from
attention-gym's score_mod and from NeMo's variant, and against the sinusoidal table."""

from __future__ import annotations

import math

import pytest
import torch

from pecode.absolute import sinusoidal_table
from pecode.attention import MultiHeadAttention, forward_in_chunks
from pecode.sandwich import Sandwich, sandwich_bias, sandwich_inner_product, sandwich_ratios


def _paper_loop(num_heads, d_bar, base, q_positions, k_positions):
    """The paper's construction, one entry at a time: the sinusoidal embeddings p_m, p_n of
    width d̄ (sines of m·ω_i, then cosines, ω_i = base^(-2i/d̄), i = 0 .. d̄/2-1), their dot
    product, divided in head n = 1 .. H by the compression ratio 8n/H."""
    freqs = [base ** (-2 * i / d_bar) for i in range(d_bar // 2)]

    def embedding(pos):
        return [math.sin(pos * w) for w in freqs] + [math.cos(pos * w) for w in freqs]

    out = []
    for n in range(1, num_heads + 1):
        ratio = n * 8 / num_heads
        rows = []
        for m in q_positions:
            p_m = embedding(m)
            rows.append(
                [
                    sum(a * b for a, b in zip(p_m, embedding(j), strict=True)) / ratio
                    for j in k_positions
                ]
            )
        out.append(rows)
    return torch.tensor(out, dtype=torch.float64)


def _attention_gym_loop(num_heads, d_bar, q_positions, k_positions):
    """attention-gym's Sandwich score_mod (attn_gym/mods/sandwich.py, meta-pytorch/attention-gym
    commit 70ab2d6fe07ed04c635cbb766b590022caac9b97), one entry at a time:
    rel_bias[d] = sum_i cos(|d| · w_i), w_i = 1 / 10000^(2i/d_bar), i = 0 .. d_bar/2 - 1,
    added to the score times head_scale[h] = H / (8 (h + 1)), h = 0 .. H-1."""
    freqs = [1.0 / 10000 ** (2 * i / d_bar) for i in range(d_bar // 2)]
    out = []
    for h in range(num_heads):
        head_scale = num_heads / (8.0 * (h + 1))
        rows = []
        for m in q_positions:
            rows.append(
                [sum(math.cos(abs(m - n) * w) for w in freqs) * head_scale for n in k_positions]
            )
        out.append(rows)
    return torch.tensor(out, dtype=torch.float64)


def _nemo_loop(num_heads, d_bar, q_positions, k_positions):
    """NeMo's SandwichRelativePositionEmbedding (sandwich_relative_position_embedding.py),
    one entry at a time: inv_freq_i = 1 / 10000^(2i/d_bar) for i = 1 .. d_bar/2, bias
    (sum_i cos(d · inv_freq_i) - d_bar/2) / (8h/H) for h = 1 .. H."""
    freqs = [1.0 / 10000 ** (2 * i / d_bar) for i in range(1, d_bar // 2 + 1)]
    return torch.tensor(
        [
            [
                [
                    (sum(math.cos((n - m) * w) for w in freqs) - d_bar / 2) / (h * 8 / num_heads)
                    for n in k_positions
                ]
                for m in q_positions
            ]
            for h in range(1, num_heads + 1)
        ],
        dtype=torch.float64,
    )


def _bias(scheme, q_positions, k_positions, dtype=torch.float64):
    q = torch.zeros(1, scheme.num_heads, q_positions.shape[-1], 4, dtype=dtype)
    return scheme.score_bias(q, None, q_positions, k_positions)


@pytest.mark.parametrize(
    ("num_heads", "d_bar", "q_positions", "k_positions"),
    [
        (3, 16, list(range(4, 11)), list(range(11))),
        (8, 128, [0, 7, 900, 4097], [0, 1, 5, 899, 4000, 4097]),
    ],
)
def test_bias_equals_the_loop_written_from_the_papers_construction(
    num_heads, d_bar, q_positions, k_positions
):
    scheme = Sandwich(num_heads, d_bar=d_bar)
    got = _bias(scheme, torch.tensor(q_positions), torch.tensor(k_positions))
    want = _paper_loop(num_heads, d_bar, 10000.0, q_positions, k_positions)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_float32_bias_far_out_is_the_float64_loop_rounded_once():
    """Angles are formed in float64: at positions near 10^6 a float32 angle would be off
    by up to 0.03 rad per frequency."""
    qp, kp = [10**6 + 3], [0, 17, 10**6 - 5, 10**6 + 3]
    got = _bias(Sandwich(4, d_bar=64), torch.tensor(qp), torch.tensor(kp), torch.float32)
    want = _paper_loop(4, 64, 10000.0, qp, kp)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got.double(), want, rtol=2e-7, atol=1e-6)


def test_inner_product_is_the_gram_matrix_of_the_sinusoidal_table():
    """pecode.absolute's table of width d̄: T Tᵀ is p_m · p_n; the bias is its entries, read
    through m - n. The false neighbour, a sum over i = 1 .. d̄/2 (NeMo's frequencies), is not."""
    d_bar, length = 16, 40
    table = sinusoidal_table(length, d_bar, dtype=torch.float64)
    gram = table @ table.T
    positions = torch.arange(length)
    distance = positions.unsqueeze(-1) - positions.unsqueeze(-2)
    got = sandwich_inner_product(distance, d_bar)
    torch.testing.assert_close(got, gram, rtol=0, atol=1e-12)
    shifted = [
        sum(math.cos(d * 10000 ** (-2 * i / d_bar)) for i in range(1, d_bar // 2 + 1))
        for d in range(length)
    ]
    assert max(abs(s - float(gram[d, 0])) for d, s in enumerate(shifted)) > 0.1


def test_bias_depends_only_on_the_offset():
    scheme = Sandwich(4, d_bar=32)
    qp, kp = torch.arange(3, 9), torch.arange(0, 9)
    torch.testing.assert_close(_bias(scheme, qp + 12345, kp + 12345), _bias(scheme, qp, kp))


def test_bias_equals_attention_gyms_score_mod_formula():
    """attention-gym and the paper's construction agree: same frequencies (i from 0), no
    offset, the same ratio 8(h+1)/H."""
    qp, kp = list(range(20, 40)), list(range(40))
    got = sandwich_bias(torch.tensor(qp)[:, None] - torch.tensor(kp), 8, dtype=torch.float64)
    torch.testing.assert_close(got, _attention_gym_loop(8, 128, qp, kp), rtol=1e-12, atol=1e-12)


def test_nemos_offset_changes_no_attention_weight_but_its_frequencies_do():
    """NeMo's variant differs from the paper in two ways. Its offset, -d̄/2 divided by the
    head's ratio, is the same in every entry of a head: exactly a constant, invisible to the
    softmax. Its frequencies (i = 1 .. d̄/2) change the weights."""
    num_heads, d_bar, length = 4, 32, 24
    positions = list(range(length))
    ours = sandwich_bias(
        torch.arange(length)[:, None] - torch.arange(length), num_heads, d_bar, dtype=torch.float64
    )
    offset = d_bar / 2 / sandwich_ratios(num_heads)
    shifted_ours = ours - offset.view(-1, 1, 1)  # NeMo's offset on the paper's frequencies
    torch.testing.assert_close(ours - shifted_ours, offset.view(-1, 1, 1).expand_as(ours))
    logits = torch.randn(num_heads, length, length, dtype=torch.float64)
    causal = torch.ones(length, length, dtype=torch.bool).tril()

    def weights(bias):
        return (logits + bias).masked_fill(~causal, float("-inf")).softmax(-1)

    torch.testing.assert_close(weights(shifted_ours), weights(ours), rtol=1e-12, atol=1e-14)
    nemo = _nemo_loop(num_heads, d_bar, positions, positions)
    assert (weights(nemo) - weights(ours)).abs().max() > 1e-3


@pytest.mark.parametrize("num_kv_heads", [4, 2])
def test_decoding_with_a_cache_equals_one_causal_pass(num_kv_heads):
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 4, num_kv_heads=num_kv_heads, position=Sandwich(4, d_bar=32))
    x = torch.randn(2, 7, 16)
    chunked, _ = forward_in_chunks(layer, x, [3, 1, 1, 1, 1])
    torch.testing.assert_close(chunked, layer(x, causal=True), rtol=1e-5, atol=1e-6)


def test_batched_positions_give_each_sequence_its_own_bias():
    scheme = Sandwich(2, d_bar=16)
    qp = torch.tensor([[4, 5, 6], [10, 11, 12]])
    kp = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [6, 7, 8, 9, 10, 11, 12]])
    got = _bias(scheme, qp, kp)
    assert got.shape == (2, 2, 3, 7)
    for b in range(2):
        torch.testing.assert_close(got[b], _bias(scheme, qp[b], kp[b]))


def test_nothing_is_learned():
    scheme = Sandwich(4)
    assert list(scheme.parameters()) == []
    assert scheme.state_dict() == {}


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="d_bar"):
        Sandwich(2, d_bar=15)
    with pytest.raises(TypeError, match="d_bar"):
        Sandwich(2, d_bar=16.0)
    with pytest.raises(ValueError, match="base"):
        Sandwich(2, base=1.0)
    with pytest.raises(ValueError, match="num_heads"):
        Sandwich(0)
    with pytest.raises(TypeError, match="distance"):
        sandwich_inner_product(torch.zeros(2, 2))
    with pytest.raises(ValueError, match="distance"):
        sandwich_bias(torch.arange(3), 2)
    with pytest.raises(ValueError, match="heads"):
        Sandwich(3).score_bias(torch.zeros(1, 2, 4, 8), None, torch.arange(4), torch.arange(4))
    with pytest.raises(TypeError, match="q_positions"):
        Sandwich(2).score_bias(torch.zeros(1, 2, 4, 8), None, torch.zeros(4), torch.arange(4))
    assert repr(Sandwich(2, d_bar=64)) == "Sandwich(num_heads=2, d_bar=64, base=10000.0)"
