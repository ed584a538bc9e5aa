"""pecode.forgetting against float64 loops written from Lin et al. (2025) and ALiBi."""

from __future__ import annotations

import math

import pytest
import torch

from pecode.alibi import ALiBi, alibi_bias, alibi_slopes
from pecode.attention import MultiHeadAttention, forward_in_chunks
from pecode.forgetting import (
    ForgettingGate,
    constant_gate_logits,
    forgetting_bias,
    log_forget_gates,
)


def _bias_loop(log_f, q_len):
    """D_ij = sum_{l=j+1}^{i} log f_l for j <= i, -inf for j > i (the paper's causal form),
    one entry at a time; query i is key k_len - q_len + i."""
    k_len = len(log_f)
    rows = []
    for i in range(k_len - q_len, k_len):
        row = []
        for j in range(k_len):
            row.append(sum(log_f[j + 1 : i + 1]) if j <= i else -math.inf)
        rows.append(row)
    return rows


def _gate_loop(key, w, b):
    """log sigmoid(<w, k> + b) for one key, from plain floats."""
    z = sum(wd * kd for wd, kd in zip(w, key, strict=True)) + b
    return math.log(1.0 / (1.0 + math.exp(-z)))


@pytest.mark.parametrize("q_len", [7, 3, 1])
def test_bias_equals_the_loop_of_the_papers_sum(q_len):
    torch.manual_seed(0)
    log_f = torch.nn.functional.logsigmoid(torch.randn(2, 3, 7, dtype=torch.float64))
    got = forgetting_bias(log_f, q_len)
    want = [[_bias_loop(row, q_len) for row in head] for head in log_f.tolist()]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-12)


def test_log_gates_equal_the_loop_of_the_sigmoid():
    torch.manual_seed(0)
    k = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    w, b = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    got = log_forget_gates(k, w, b)
    want = [
        [
            [_gate_loop(key, w[h].tolist(), float(b[h])) for key in head]
            for h, head in enumerate(row)
        ]
        for row in k.tolist()
    ]
    torch.testing.assert_close(got, torch.tensor(want, dtype=torch.float64), rtol=0, atol=1e-12)


def test_a_constant_gate_is_alibi_and_summing_from_j_is_one_slope_off():
    """f = exp(-m_h): D_ij = -m_h (i - j), pecode.alibi's causal bias, -inf included.
    The false neighbour sum_{l=j}^{i} (the key's own gate counted) is -m_h (i - j + 1)."""
    slopes = alibi_slopes(4, dtype=torch.float64)
    gates = log_forget_gates(
        torch.randn(1, 4, 9, 8, dtype=torch.float64),
        torch.zeros(4, 8, dtype=torch.float64),
        constant_gate_logits(slopes),
    )
    torch.testing.assert_close(gates, (-slopes).view(1, 4, 1).expand(1, 4, 9), rtol=0, atol=1e-14)
    for q_len in (9, 4):
        got = forgetting_bias(gates, q_len)[0]
        want = alibi_bias(slopes, q_len, 9, dtype=torch.float64)
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
        from_j = got + gates[0].unsqueeze(-2)  # sum_{l=j}^{i}: adds log f_j
        seen = torch.isfinite(want)
        off = (from_j - want)[seen.expand_as(want)].view(4, -1)
        torch.testing.assert_close(off, (-slopes).view(4, 1).expand_as(off), rtol=0, atol=1e-12)


def _weights(bias, v):
    return torch.softmax(bias + v, dim=-1)


def test_the_false_neighbour_changes_attention_only_when_the_gate_depends_on_the_token():
    """A constant offset per row is invisible to the softmax; log f_j per key is not."""
    torch.manual_seed(0)
    logits = torch.randn(1, 2, 6, 6, dtype=torch.float64)
    constant = (-alibi_slopes(2, dtype=torch.float64)).view(1, 2, 1).expand(1, 2, 6)
    varying = torch.nn.functional.logsigmoid(torch.randn(1, 2, 6, dtype=torch.float64))
    for log_f, differs in ((constant, False), (varying, True)):
        bias = forgetting_bias(log_f)
        from_j = bias + log_f.unsqueeze(-2)
        gap = (_weights(bias, logits) - _weights(from_j, logits)).abs().max()
        assert (gap > 1e-3) if differs else (gap < 1e-12)


def test_a_constant_gate_layer_is_the_alibi_layer():
    slopes = [0.5, 0.25, 0.125, 0.0625]
    gate = ForgettingGate(4, 4)
    with torch.no_grad():
        gate.weight.zero_()
        gate.bias.copy_(constant_gate_logits(torch.tensor(slopes, dtype=torch.float64)))
    x = torch.randn(2, 7, 16, generator=torch.manual_seed(1))
    torch.manual_seed(2)
    a = MultiHeadAttention(16, 4, position=gate)
    torch.manual_seed(2)
    b = MultiHeadAttention(16, 4, position=ALiBi(4, slopes=slopes))
    for causal in (True, False):  # both biases hold the causal mask
        torch.testing.assert_close(a(x, causal=causal), b(x, causal=causal), atol=1e-6, rtol=1e-6)
    with torch.no_grad():
        gate.weight.normal_(0.0, 0.5)  # a data-dependent gate is no longer ALiBi
    assert (a(x, causal=True) - b(x, causal=True)).abs().max() > 1e-3


def _trained_gate(num_heads, head_dim, seed=0):
    gate = ForgettingGate(num_heads, head_dim)
    with torch.no_grad():  # gates far from the initial 1/2, different per token
        gate.weight.normal_(0.0, 0.7, generator=torch.manual_seed(seed))
        gate.bias.uniform_(0.0, 3.0, generator=torch.manual_seed(seed + 1))
    return gate


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
def test_token_by_token_with_a_cache_equals_one_causal_pass(num_kv_heads):
    torch.manual_seed(0)
    layer = MultiHeadAttention(
        16, 4, num_kv_heads=num_kv_heads, position=_trained_gate(4, 4)
    ).double()
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    chunked, cache = forward_in_chunks(layer, x, [3, 1, 2, 1, 1])
    torch.testing.assert_close(chunked, layer(x, causal=True), rtol=1e-10, atol=1e-10)
    assert len(cache) == 8


def _attention_loop(layer, x):
    """The whole layer, one entry at a time from the projections: query head h reads key
    head h // (H / Hkv), its gate from that head's keys, and D from the paper's sum."""
    heads, kv_heads, dh = layer.num_heads, layer.num_kv_heads, layer.head_dim
    q = layer.q_proj(x).view(x.shape[0], x.shape[1], heads, dh).tolist()
    k = layer.k_proj(x).view(x.shape[0], x.shape[1], kv_heads, dh).tolist()
    v = layer.v_proj(x).view(x.shape[0], x.shape[1], kv_heads, dh).tolist()
    w, b = layer.position.weight.tolist(), layer.position.bias.tolist()
    length, out = x.shape[1], []
    for n in range(x.shape[0]):
        rows = []
        for i in range(length):
            concat = []
            for h in range(heads):
                g = h // (heads // kv_heads)
                log_f = [_gate_loop(k[n][t][g], w[h], b[h]) for t in range(length)]
                logits = [
                    sum(a * c for a, c in zip(q[n][i][h], k[n][j][g], strict=True)) / math.sqrt(dh)
                    + sum(log_f[j + 1 : i + 1])
                    for j in range(i + 1)
                ]
                top = max(logits)
                e = [math.exp(s - top) for s in logits]
                p = [ej / sum(e) for ej in e]
                concat += [sum(p[j] * v[n][j][g][d] for j in range(i + 1)) for d in range(dh)]
            rows.append(concat)
        out.append(rows)
    return layer.out_proj(torch.tensor(out, dtype=torch.float64))


@pytest.mark.parametrize("num_kv_heads", [4, 2])
def test_the_layer_equals_the_loop_with_grouped_query_attention(num_kv_heads):
    torch.manual_seed(0)
    layer = MultiHeadAttention(
        16, 4, num_kv_heads=num_kv_heads, position=_trained_gate(4, 4)
    ).double()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(layer(x, causal=True), _attention_loop(layer, x))


def test_positions_are_not_read_only_the_order_of_the_keys():
    torch.manual_seed(0)
    layer = MultiHeadAttention(16, 4, position=_trained_gate(4, 4)).double()
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    shifted = layer(x, causal=True, positions=torch.arange(6) * 3 + 100)
    torch.testing.assert_close(shifted, layer(x, causal=True))


def test_gate_weights_and_biases_learn():
    gate = ForgettingGate(2, 4)
    layer = MultiHeadAttention(8, 2, position=gate)
    layer(torch.randn(1, 5, 8), causal=True).pow(2).sum().backward()
    assert gate.weight.grad.abs().sum() > 0
    assert gate.bias.grad.abs().sum() > 0


def test_initialization_follows_the_authors():
    gate = ForgettingGate(64, 64)
    assert float(gate.bias.detach().abs().max()) == 0.0
    assert 0.015 < float(gate.weight.detach().std()) < 0.025


def test_errors_name_the_argument():
    with pytest.raises(TypeError, match="log_f"):
        forgetting_bias(torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="log_f"):
        forgetting_bias(torch.full((3,), 0.5))  # a gate, not its log
    with pytest.raises(ValueError, match="log_f"):
        forgetting_bias(torch.zeros(2, 0))
    with pytest.raises(ValueError, match="q_len"):
        forgetting_bias(torch.zeros(3), 4)
    with pytest.raises(TypeError, match="q_len"):
        forgetting_bias(torch.zeros(3), 2.0)
    with pytest.raises(ValueError, match="weight"):
        log_forget_gates(torch.zeros(1, 2, 3, 4), torch.zeros(2, 5), torch.zeros(2))
    with pytest.raises(ValueError, match="bias"):
        log_forget_gates(torch.zeros(1, 2, 3, 4), torch.zeros(2, 4), torch.zeros(3))
    with pytest.raises(ValueError, match="slopes"):
        constant_gate_logits(torch.tensor([0.5, 0.0]))
    with pytest.raises(TypeError, match="slopes"):
        constant_gate_logits(torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="num_heads"):
        ForgettingGate(0, 4)
    with pytest.raises(TypeError, match="head_dim"):
        ForgettingGate(2, 4.0)
    with pytest.raises(ValueError, match="num_heads=3"):
        ForgettingGate(3, 4).score_bias(
            torch.zeros(1, 2, 4, 4), torch.zeros(1, 2, 4, 4), torch.arange(4), torch.arange(4)
        )
    with pytest.raises(ValueError, match="head_dim"):
        MultiHeadAttention(16, 4, position=ForgettingGate(4, 8))
    assert repr(ForgettingGate(2, 4)) == "ForgettingGate(num_heads=2, head_dim=4)"
