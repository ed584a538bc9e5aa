"""pecode.cope against a float64 loop of Golovneva et al. (2024), Shaw's key term, and
x-transformers' CoPE (an independent implementation of the paper's code listing)."""

from __future__ import annotations

import math

import pytest
import torch

from pecode.attention import MultiHeadAttention, forward_in_chunks
from pecode.cope import CoPE, cope_bias, cope_position_logits, cope_positions
from pecode.relative.shaw import shaw_key_logits


def _loop(q, k, table, scale, npos_max, per_head):
    """The paper's equations one entry at a time: g_it = sigmoid(scale q_i·k_t),
    p_ij = sum_{t=j}^{i} g_it clamped to P - 1, e[p] interpolated between e[floor p] and
    e[ceil p], the term q_i·e[p]. Entries j > i are None (the paper defines j <= i)."""
    q, k, table = q.tolist(), k.tolist(), table.tolist()
    k_len = len(k[0][0])
    out = []
    for b, heads in enumerate(q):
        per_b = []
        for h, queries in enumerate(heads):
            e = table[h] if per_head else table
            rows = []
            for i, qi in enumerate(queries):
                me = k_len - len(queries) + i  # the query's index among the keys
                gates = [
                    1.0 / (1.0 + math.exp(-scale * sum(a * c for a, c in zip(qi, kt, strict=True))))
                    for kt in k[b][h]
                ]
                row = []
                for j in range(k_len):
                    if j > me:
                        row.append(None)
                        continue
                    p = min(sum(gates[j : me + 1]), npos_max - 1)
                    lo, hi = math.floor(p), math.ceil(p)
                    vec = [
                        (p - lo) * eh + (1 - p + lo) * el
                        for eh, el in zip(e[hi], e[lo], strict=True)
                    ]
                    row.append(sum(a * c for a, c in zip(qi, vec, strict=True)))
                rows.append(row)
            per_b.append(rows)
        out.append(per_b)
    return out


def _inputs(q_len=4, k_len=7, heads=3, dh=4, npos_max=4, per_head=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, heads, q_len, dh, generator=g, dtype=torch.float64) * 2
    k = torch.randn(2, heads, k_len, dh, generator=g, dtype=torch.float64) * 2
    shape = (heads, npos_max, dh) if per_head else (npos_max, dh)
    return q, k, torch.randn(shape, generator=g, dtype=torch.float64)


def _assert_matches_loop(got, want):
    for index, value in _entries(want):
        if value is not None:
            assert abs(float(got[index]) - value) < 1e-12, index


def _entries(nested, prefix=()):
    if isinstance(nested, list):
        for n, item in enumerate(nested):
            yield from _entries(item, (*prefix, n))
    else:
        yield prefix, nested


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("q_len", [7, 3])
def test_bias_equals_the_loop_of_the_papers_equations(per_head, q_len):
    """P = 4 < Lk: the far keys' positions exceed P - 1 and are clamped."""
    q, k, table = _inputs(q_len=q_len, per_head=per_head)
    got = cope_bias(q, k, table)
    _assert_matches_loop(got, _loop(q, k, table, 1 / math.sqrt(4), 4, per_head))
    positions = cope_positions(torch.sigmoid(q @ k.transpose(-1, -2) / 2))
    assert float(positions.max()) > 3.5  # the clamp is exercised
    # the keys after a query: p = 0, so q·e[0] (the authors' code; the causal mask hides it)
    after = torch.ones(q_len, 7, dtype=torch.bool).triu(7 - q_len + 1)
    first = table[:, 0] if per_head else table[0].expand(3, 4)  # e[0] of each head
    at_zero = torch.einsum("bhid,hd->bhi", q, first).unsqueeze(-1)
    torch.testing.assert_close(got[..., after], at_zero.expand_as(got)[..., after])


def test_the_gates_read_the_scaled_logits_not_the_raw_ones():
    """The authors' code gates q·k/sqrt(Dh); the equations written literally gate q·k."""
    q, k, table = _inputs()
    literal = cope_bias(q, k, table, scale=1.0)
    _assert_matches_loop(literal, _loop(q, k, table, 1.0, 4, False))
    seen = torch.ones(4, 7, dtype=torch.bool).tril(3)
    assert (literal - cope_bias(q, k, table))[..., seen].abs().max() > 1e-3


def test_gates_all_one_count_tokens_and_make_shaws_key_term():
    """g = 1: p_ij = i - j + 1 (not i - j), and q_i·e[p_ij] is Shaw's key term with
    a_{-d} = e[min(d + 1, P - 1)], clipped at k = P - 2; a_{+d} = e[0] (hidden)."""
    q_len, k_len, npos_max = 4, 9, 5
    ones = torch.ones(2, 3, q_len, k_len, dtype=torch.float64)
    i = torch.arange(k_len - q_len, k_len).view(-1, 1)
    j = torch.arange(k_len)
    counted = (i - j + 1).clamp(min=0).to(torch.float64)
    torch.testing.assert_close(cope_positions(ones), counted.expand_as(ones))
    # saturated gates: q and k share a large component, so q·k/sqrt(Dh) > 40 and sigmoid = 1
    g = torch.Generator().manual_seed(0)
    u = torch.ones(4, dtype=torch.float64)
    q = torch.randn(2, 3, q_len, 4, generator=g, dtype=torch.float64) + 10 * u
    k = torch.randn(2, 3, k_len, 4, generator=g, dtype=torch.float64) * 0.1 + 10 * u
    table = torch.randn(npos_max, 4, generator=g, dtype=torch.float64)
    assert float(torch.sigmoid((q @ k.transpose(-1, -2)) / 2).min()) == 1.0
    got = cope_bias(q, k, table)
    clip = npos_max - 2
    rows = [table[min(clip - r + 1, npos_max - 1)] for r in range(clip + 1)] + [table[0]] * clip
    want = shaw_key_logits(q, torch.stack(rows), i.view(-1), j, clip)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)
    # the false neighbour p = i - j (the key itself not counted) is another bias
    shifted = [table[min(clip - r, npos_max - 1)] for r in range(clip + 1)] + [table[0]] * clip
    wrong = shaw_key_logits(q, torch.stack(shifted), i.view(-1), j, clip)
    seen = j <= i
    assert (got - wrong)[..., seen].abs().max() > 1e-2


def _x_transformers_mask(logits, q_len, k_len):
    """x-transformers' causal mask: the queries are the last q_len keys."""
    hidden = torch.ones(q_len, k_len, dtype=torch.bool).triu(k_len - q_len + 1)
    return logits.masked_fill(hidden, -torch.finfo(logits.dtype).max)


@pytest.mark.parametrize("per_head", [False, True])
@pytest.mark.parametrize("q_len", [7, 2])
def test_bias_equals_x_transformers_cope(per_head, q_len):
    """x-transformers' CoPE takes the masked, scaled logits and one [P, Dh] table; with one
    table per head, each head is compared alone."""
    xt = pytest.importorskip("x_transformers.x_transformers")
    q, k, table = _inputs(q_len=q_len, per_head=per_head, npos_max=5)
    logits = _x_transformers_mask((q @ k.transpose(-1, -2)) / 2, q_len, 7)
    got = cope_bias(q, k, table)
    reference = xt.CoPE(dim=4, heads=3, max_pos=5).double()
    with torch.no_grad():
        for h in range(3) if per_head else [None]:
            reference.pos_emb.copy_(table[h] if per_head else table)
            heads = slice(h, h + 1) if per_head else slice(None)
            want = reference(q[:, heads], logits[:, heads])
            torch.testing.assert_close(got[:, heads], want, rtol=0, atol=1e-12)


def test_layer_equals_x_transformers_attention():
    """The whole causal layer: x-transformers' Attention(use_cope=True) with its weights."""
    xt = pytest.importorskip("x_transformers.x_transformers")
    torch.manual_seed(0)
    reference = xt.Attention(
        dim=16, heads=4, dim_head=4, causal=True, use_cope=True, cope_max_pos=5
    ).double()
    scheme = CoPE(4, 5)
    layer = MultiHeadAttention(16, 4, bias=False, position=scheme).double()
    with torch.no_grad():
        reference.attend.cope.pos_emb.normal_()
        for ours, theirs in (("q", "q"), ("k", "k"), ("v", "v"), ("out", "out")):
            getattr(layer, f"{ours}_proj").weight.copy_(getattr(reference, f"to_{theirs}").weight)
        scheme.embeddings.copy_(reference.attend.cope.pos_emb)
        x = torch.randn(2, 7, 16, dtype=torch.float64)
        # x-transformers takes its softmax in float32
        torch.testing.assert_close(layer(x, causal=True), reference(x), rtol=1e-6, atol=1e-6)
        scheme.embeddings.zero_()  # the false neighbour: no position term
        assert (layer(x, causal=True) - reference(x)).abs().max() > 1e-3


def _trained(per_head):
    scheme = CoPE(4, 5, num_heads=4 if per_head else None)
    with torch.no_grad():
        scheme.embeddings.normal_(generator=torch.manual_seed(3))
    return scheme


@pytest.mark.parametrize("num_kv_heads", [4, 2, 1])
@pytest.mark.parametrize("per_head", [False, True])
def test_token_by_token_with_a_cache_equals_one_causal_pass(num_kv_heads, per_head):
    torch.manual_seed(0)
    layer = MultiHeadAttention(
        16, 4, num_kv_heads=num_kv_heads, position=_trained(per_head)
    ).double()
    x = torch.randn(2, 8, 16, dtype=torch.float64)
    chunked, _ = forward_in_chunks(layer, x, [3, 1, 2, 1, 1])
    torch.testing.assert_close(chunked, layer(x, causal=True), rtol=1e-10, atol=1e-10)


def test_grouped_query_heads_gate_with_their_groups_keys():
    """GQA: query head h counts with key head h // 2; the bias equals the loop on the
    keys repeated by hand."""
    torch.manual_seed(0)
    scheme = _trained(True)
    layer = MultiHeadAttention(16, 4, num_kv_heads=2, position=scheme).double()
    x = torch.randn(1, 6, 16, dtype=torch.float64)
    q = layer.q_proj(x).view(1, 6, 4, 4).transpose(1, 2)
    k = layer.k_proj(x).view(1, 6, 2, 4).transpose(1, 2)
    seen = {}
    original = scheme.score_bias

    def spy(q_, k_, qp, kp):
        seen["bias"] = original(q_, k_, qp, kp)
        return seen["bias"]

    scheme.score_bias = spy
    with torch.no_grad():
        layer(x, causal=True)
        want = _loop(q, k[:, [0, 0, 1, 1]], scheme.embeddings, 0.5, 5, True)
    _assert_matches_loop(seen["bias"].detach(), want)


def test_embeddings_learn_and_start_at_zero():
    scheme = CoPE(4, 5)
    assert float(scheme.embeddings.detach().abs().max()) == 0.0
    layer = MultiHeadAttention(8, 2, position=scheme)
    layer(torch.randn(1, 5, 8), causal=True).pow(2).sum().backward()
    assert scheme.embeddings.grad.abs().sum() > 0


def test_errors_name_the_argument():
    q, k, table = _inputs()
    with pytest.raises(TypeError, match="gates"):
        cope_positions(torch.ones(3, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match="gates"):
        cope_positions(torch.ones(4, 3))
    with pytest.raises(ValueError, match="embeddings"):
        cope_bias(q, k, torch.zeros(4, 5, dtype=torch.float64))
    with pytest.raises(ValueError, match="embeddings"):
        cope_bias(q, k, torch.zeros(2, 4, 4, dtype=torch.float64))
    with pytest.raises(ValueError, match="Lq <= Lk"):
        cope_bias(k, q, table)
    with pytest.raises(ValueError, match="scale"):
        cope_bias(q, k, table, scale=0.0)
    with pytest.raises(ValueError, match="positions"):
        cope_position_logits(q, table, -torch.ones(2, 3, 4, 7, dtype=torch.float64))
    with pytest.raises(ValueError, match="positions"):
        cope_position_logits(q, table, torch.ones(2, 3, 5, 7, dtype=torch.float64))
    with pytest.raises(ValueError, match="npos_max"):
        CoPE(4, 0)
    with pytest.raises(TypeError, match="head_dim"):
        CoPE(4.0, 5)
    with pytest.raises(ValueError, match="gate_scale"):
        CoPE(4, 5, gate_scale=-1.0)
    with pytest.raises(ValueError, match="num_heads=2"):
        MultiHeadAttention(16, 4, position=CoPE(4, 5, num_heads=2))
    with pytest.raises(ValueError, match="head_dim"):
        MultiHeadAttention(16, 4, position=CoPE(8, 5))
    assert repr(CoPE(4, 5)) == "CoPE(head_dim=4, npos_max=5, num_heads=None, gate_scale=None)"
