"""pecode.fire against a float64 loop written from the paper's equations and the listing,
and against ALiBi and T5's relative bias, which FIRE represents on queries up to L."""

from __future__ import annotations

import math

import pytest
import torch

from pecode.alibi import ALiBi, alibi_bias_from_positions, alibi_slopes
from pecode.attention import MultiHeadAttention, forward_in_chunks
from pecode.fire import (
    FIRE,
    fire_bias,
    fire_inputs,
    fire_mlp,
    fire_mlp_for_offsets,
    fire_representing_alibi,
    fire_representing_t5,
)
from pecode.relative import T5RelativePositionBias, t5_relative_position_bucket


def _loop(c, multiplier, init_l, eps, log_transform, weights, q_positions, k_positions):
    """FIRE one entry at a time: b_h(i, j) = f(psi(i - j) / psi(max(L, i))), psi(x) =
    log(c x + 1) (the paper, §3), with the details of the PyTorch listing of FIRE carried in
    mcleish7/arithmetic (cramming/architectures/embeddings.py, commit 55af9d5e): psi(x) =
    log(|c x| + 1), L = |L_multiplier · init_L|, eps added to the normaliser, the mirror
    |i - j| for keys after the query, f = Linear(1, hidden) -> ReLU -> Linear(hidden, H)."""
    w1, b1, w2, b2 = (w.detach().double().tolist() for w in weights)
    threshold = abs(multiplier * init_l)

    def psi(x):
        return math.log(abs(c * x) + 1) if log_transform else x

    out = []
    for h in range(len(b2)):
        rows = []
        for i in q_positions:
            row = []
            for j in k_positions:
                u = psi(abs(i - j)) / (psi(max(i, threshold)) + eps)
                hidden = [max(0.0, w1[k][0] * u + b1[k]) for k in range(len(b1))]
                row.append(sum(w2[h][k] * hidden[k] for k in range(len(b1))) + b2[h])
            rows.append(row)
        out.append(rows)
    return torch.tensor(out, dtype=torch.float64)


def _causal(length_q, length_k=None):
    length_k = length_q if length_k is None else length_k
    return torch.ones(length_q, length_k, dtype=torch.bool).tril()


def _load(scheme, weights):
    with torch.no_grad():
        scheme.mlp[0].weight.copy_(weights.w1)
        scheme.mlp[0].bias.copy_(weights.b1)
        scheme.mlp[2].weight.copy_(weights.w2)
        scheme.mlp[2].bias.copy_(weights.b2)
    return scheme


@pytest.mark.parametrize("log_transform", [True, False])
def test_bias_equals_the_loop_written_from_the_papers_equations(log_transform):
    """Queries on both sides of the threshold L = |-1.5 · 6| = 9, keys on both sides of
    each query."""
    torch.manual_seed(0)
    scheme = FIRE(3, hidden=8, init_L=6.0, log_transform=log_transform).double()
    with torch.no_grad():
        scheme.c.fill_(0.3)
        scheme.L_multiplier.fill_(-1.5)  # the absolute value keeps L positive
    qp, kp = torch.arange(0, 14), torch.arange(0, 14)
    got = scheme.position_bias(qp, kp)
    want = _loop(0.3, -1.5, 6.0, 1e-6, log_transform, scheme.weights, qp.tolist(), kp.tolist())
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_causal_inputs_lie_in_the_unit_interval():
    """Progressive interpolation: psi(i - j) <= psi(i) <= psi(max(L, i)) for 0 <= j <= i,
    so every input a causal query sees is in [0, 1], at any length."""
    qp = torch.arange(0, 3000, 7)
    x = fire_inputs(qp, qp, 0.1, 512.0, dtype=torch.float64)
    causal = x[_causal(len(qp))]
    assert float(causal.min()) == 0.0
    assert float(causal.max()) <= 1.0


def test_initialization_and_state_dict_names_follow_the_listing():
    scheme = FIRE(4)
    assert scheme.hidden == 32
    assert scheme.mlp[0].out_features == 32
    assert float(scheme.c.detach()) == pytest.approx(0.1)
    assert float(scheme.threshold.detach()) == 512.0
    assert set(scheme.state_dict()) == {
        "mlp.0.weight",
        "mlp.0.bias",
        "mlp.2.weight",
        "mlp.2.bias",
        "c",
        "init_L",
        "L_multiplier",
    }
    assert {name for name, _ in scheme.named_parameters()} == {
        "mlp.0.weight",
        "mlp.0.bias",
        "mlp.2.weight",
        "mlp.2.bias",
        "c",
        "L_multiplier",
    }


def test_with_psi_the_identity_one_hidden_unit_is_alibi_up_to_the_threshold():
    """ψ the identity, queries at i <= L: the input is (i - j) / (L + eps), and
    f(u) = -m (L + eps) relu(u) gives -m (i - j) exactly. Past L the normaliser is i and
    the same weights are not ALiBi (the false neighbour)."""
    slopes, length = alibi_slopes(4, dtype=torch.float64), 20
    weights = fire_representing_alibi(slopes, length, log_transform=False)
    assert weights.w1.shape == (1, 1)
    qp = torch.arange(31)
    got = fire_bias(qp, qp, 0.1, float(length), weights, log_transform=False)
    want = alibi_bias_from_positions(slopes, qp, qp)
    inside = _causal(31) & (qp <= length).unsqueeze(-1)
    outside = _causal(31) & (qp > length).unsqueeze(-1) & (qp.unsqueeze(-1) > qp)
    torch.testing.assert_close(got[:, inside], want[:, inside], rtol=1e-12, atol=1e-12)
    # there the bias is -m (i - j) L / i: off by the factor L / i <= 20 / 21
    assert ((got[:, outside] - want[:, outside]) / want[:, outside]).abs().min() > 0.03


def test_under_the_log_alibi_needs_a_unit_per_offset():
    """With psi(x) = log(c x + 1) the knots are not evenly spaced, ALiBi is not linear in
    the input, and the interpolant needs one unit per offset; it is exact at the offsets.
    The one-unit weights of the identity case are not ALiBi under the log."""
    slopes, length = alibi_slopes(4, dtype=torch.float64), 20
    weights = fire_representing_alibi(slopes, length, c=0.1, log_transform=True)
    assert weights.w1.shape == (length, 1)
    qp = torch.arange(length + 1)
    got = fire_bias(qp, qp, 0.1, float(length), weights, log_transform=True)
    want = alibi_bias_from_positions(slopes, qp, qp)
    causal = _causal(length + 1)
    torch.testing.assert_close(got[:, causal], want[:, causal], rtol=1e-11, atol=1e-11)
    linear = fire_representing_alibi(slopes, length, log_transform=False)
    wrong = fire_bias(qp, qp, 0.1, float(length), linear, log_transform=True)
    assert (wrong[:, causal] - want[:, causal]).abs().max() > 0.5


def test_alibi_weights_in_attention_equal_alibi():
    torch.manual_seed(0)
    slopes = alibi_slopes(4, dtype=torch.float64)
    fire = FIRE(4, hidden=1, init_L=16.0, log_transform=False)
    _load(fire, fire_representing_alibi(slopes, 16, log_transform=False))
    x = torch.randn(2, 12, 16, generator=torch.manual_seed(1))
    torch.manual_seed(2)
    a = MultiHeadAttention(16, 4, position=fire)
    torch.manual_seed(2)
    b = MultiHeadAttention(16, 4, position=ALiBi(4))
    torch.testing.assert_close(a(x, causal=True), b(x, causal=True), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("log_transform", [True, False])
def test_t5_weights_give_t5s_causal_bias_up_to_the_threshold(log_transform):
    """T5's decoder bias is a step function of i - j; two units per bucket boundary
    reproduce it at every offset up to L, with the log transform or without."""
    torch.manual_seed(0)
    t5 = T5RelativePositionBias(4, bidirectional=False, num_buckets=8, max_distance=20)
    length = 40
    weights = fire_representing_t5(
        t5.bias.weight, length, num_buckets=8, max_distance=20, log_transform=log_transform
    )
    assert weights.w1.shape[0] <= 2 * (8 - 1)
    qp = torch.arange(length + 1)
    got = fire_bias(qp, qp, 0.1, float(length), weights, log_transform=log_transform)
    want = t5.position_bias(qp, qp).double()
    causal = _causal(length + 1)
    torch.testing.assert_close(got[:, causal], want[:, causal], rtol=1e-12, atol=1e-12)


def test_a_step_one_offset_off_misses_exactly_the_bucket_boundaries():
    """The false neighbour: the interpolant through table[bucket(-(k + 1))] instead of
    table[bucket(-k)] puts every step one offset early, and differs from T5 at the offsets
    where the bucket changes, and only there."""
    torch.manual_seed(0)
    t5 = T5RelativePositionBias(4, bidirectional=False, num_buckets=8, max_distance=20)
    length = 40
    offsets = torch.arange(length + 2)
    buckets = t5_relative_position_bucket(-offsets, False, 8, 20)
    early = t5.bias.weight.detach().double()[buckets[1:]].t()  # [H, length + 1]
    weights = fire_mlp_for_offsets(early, 0.1, float(length))
    qp = torch.arange(length + 1)
    got = fire_bias(qp, qp, 0.1, float(length), weights)
    want = t5.position_bias(qp, qp).double()
    offset = qp.unsqueeze(-1) - qp
    causal = _causal(length + 1)
    differs = (got - want).abs().amax(0) > 1e-6
    missed = set(offset[differs & causal].tolist())
    boundaries = {k for k in range(length + 1) if buckets[k] != buckets[k + 1]}
    assert boundaries
    assert missed == boundaries


def test_t5_weights_in_attention_equal_t5():
    torch.manual_seed(0)
    t5 = T5RelativePositionBias(
        4, bidirectional=False, num_buckets=8, max_distance=20, scale_logits=True
    )
    weights = fire_representing_t5(t5.bias.weight, 16, num_buckets=8, max_distance=20)
    fire = _load(FIRE(4, hidden=weights.w1.shape[0], init_L=16.0), weights)
    x = torch.randn(2, 12, 16, generator=torch.manual_seed(1))
    torch.manual_seed(2)
    a = MultiHeadAttention(16, 4, position=fire)
    torch.manual_seed(2)
    b = MultiHeadAttention(16, 4, position=t5)
    torch.testing.assert_close(a(x, causal=True), b(x, causal=True), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("num_kv_heads", [4, 2])
def test_decoding_with_a_cache_equals_one_causal_pass(num_kv_heads):
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 4, num_kv_heads=num_kv_heads, position=FIRE(4, init_L=4.0))
    x = torch.randn(2, 8, 16)
    chunked, _ = forward_in_chunks(layer, x, [3, 1, 1, 1, 1, 1])
    torch.testing.assert_close(chunked, layer(x, causal=True), rtol=1e-5, atol=1e-6)


def test_every_parameter_learns():
    torch.manual_seed(0)
    scheme = FIRE(2)  # L = 512 > every position: the threshold is the normaliser
    layer = MultiHeadAttention(8, 2, position=scheme)
    layer(torch.randn(1, 5, 8), causal=True).sum().backward()
    for name, p in scheme.named_parameters():
        assert p.grad is not None, name
        assert p.grad.abs().sum() > 0, name


def test_batched_positions_give_each_sequence_its_own_bias():
    torch.manual_seed(0)
    scheme = FIRE(2, hidden=4, init_L=3.0).double()
    qp = torch.tensor([[4, 5, 6], [10, 11, 12]])
    kp = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [6, 7, 8, 9, 10, 11, 12]])
    got = scheme.position_bias(qp, kp)
    assert got.shape == (2, 2, 3, 7)
    for b in range(2):
        torch.testing.assert_close(got[b], scheme.position_bias(qp[b], kp[b]))


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="num_heads"):
        FIRE(0)
    with pytest.raises(ValueError, match="hidden"):
        FIRE(2, hidden=0)
    with pytest.raises(ValueError, match="eps"):
        FIRE(2, eps=-1.0)
    with pytest.raises(TypeError, match="log_transform"):
        FIRE(2, log_transform=1)
    with pytest.raises(TypeError, match="q_positions"):
        fire_inputs(torch.zeros(3), torch.arange(3), 0.1, 4.0)
    w = FIRE(2, hidden=4).weights
    with pytest.raises(ValueError, match="w2"):
        fire_mlp(torch.zeros(3, 3), w.w1, w.b1, w.w2[:, :3], w.b2)
    with pytest.raises(ValueError, match="values"):
        fire_mlp_for_offsets(torch.zeros(5, dtype=torch.float64), 0.1, 4.0)
    with pytest.raises(ValueError, match="c must be nonzero"):
        fire_mlp_for_offsets(torch.zeros(2, 5, dtype=torch.float64), 0.0, 4.0)
    with pytest.raises(ValueError, match="table"):
        fire_representing_t5(torch.zeros(7, 2), 4, num_buckets=8, max_distance=20)
    with pytest.raises(ValueError, match="heads"):
        FIRE(3).score_bias(torch.zeros(1, 2, 4, 8), None, torch.arange(4), torch.arange(4))
    assert repr(FIRE(2)).startswith(
        "FIRE(\n  num_heads=2, hidden=32, eps=1e-06, log_transform=True"
    )
