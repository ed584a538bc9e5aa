"""pecode.relative.deberta: DeBERTa's indices, log buckets and position terms against
float64 loops, the paper's form against the released one, and their errors."""

from __future__ import annotations

import copy
import math

import pytest
import torch
from relative_helpers import heads

from pecode.attention import MultiHeadAttention
from pecode.reference import multi_head_attention_loop
from pecode.reference.relative import (
    deberta_log_bucket_loop,
    deberta_scores_loop,
)
from pecode.relative import (
    DebertaRelativePosition,
    deberta_attention,
    deberta_log_bucket,
    deberta_position_terms,
    deberta_relative_index,
    deberta_table_rows,
)


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


def test_deberta_errors_name_the_callers_arguments():
    # the scheme projects Q^r and K^r itself: a query of another head count or head
    # dimension is reported as such, not as q_rel of the wrong shape
    scheme = DebertaRelativePosition(16, 2, 8, 4)
    positions = torch.arange(4)
    for shape, match in (
        ((1, 3, 4, 8), "q has 3 heads, DebertaRelativePosition was built for num_heads=2"),
        ((1, 2, 4, 16), "q has head dimension 16, .* built for head_dim=8"),
    ):
        q = torch.randn(shape)
        with pytest.raises(ValueError, match=match):
            scheme.score_bias(q, q, positions, positions)
    q = torch.randn(2, 2, 4, 8)
    batched = torch.arange(12).view(3, 4)
    with pytest.raises(ValueError, match="k_positions have batch 3, q has batch 2"):
        scheme.score_bias(q, q, batched, batched)
    rel = torch.randn(2, 8, 8)
    with pytest.raises(TypeError, match=r"q_rel must be a torch\.Tensor, got list"):
        deberta_position_terms(q, q, rel.tolist(), rel, positions, positions, 4)
    with pytest.raises(ValueError, match="layer_norm_eps must be finite"):
        DebertaRelativePosition(16, 2, 8, 4, layer_norm_eps=float("inf"))


def test_deberta_refuses_keys_of_another_batch():
    # the position-to-content term gathers rows of k with an index of q's batch; keys of
    # a larger batch were silently cut to q's batch instead of refused
    q, k = torch.randn(2, 2, 4, 8), torch.randn(3, 2, 4, 8)
    rel, positions = torch.randn(2, 8, 8), torch.arange(4)
    with pytest.raises(ValueError, match=r"q and k must agree in batch, heads and head dim"):
        deberta_position_terms(q, k, rel, rel, positions, positions, 4)
    with pytest.raises(ValueError, match=r"q and k must agree"):
        DebertaRelativePosition(16, 2, 8, 4).score_bias(q, k, positions, positions)


def test_deberta_shared_projections_refuse_grouped_keys():
    # with share_att_key, P goes through the layer's k_proj for every query head: a layer
    # with fewer key heads cannot provide it (it failed inside a view before)
    scheme = DebertaRelativePosition(16, 4, 4, 8, share_att_key=True)
    layer = MultiHeadAttention(16, 4, num_kv_heads=2, position=scheme)
    with pytest.raises(ValueError, match="num_kv_heads=2"):
        scheme.bind_content_projections(layer)
