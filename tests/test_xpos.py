"""pecode.xpos against a float64 loop written from the paper's equation, against
rotary-embedding-torch (lucidrains) with ``use_xpos=True``, and inside attention with a
KV cache."""

from __future__ import annotations

import math

import pytest
import torch

from pecode.attention import MultiHeadAttention, forward_in_chunks
from pecode.rope import RotaryEmbedding, layout_permutation
from pecode.xpos import (
    XPOS_SCALE_BASE,
    XPos,
    apply_xpos,
    xpos_position_limit,
    xpos_scale,
    xpos_zeta,
)

F64 = torch.float64


def _loop(x, positions, *, inverse, layout, centre=0, base=10000.0, gamma=0.4, scale_base=512.0):
    """The paper's map, one entry at a time in Python floats: pair i of x at position p,
    (a, b) -> ζ_i^(±(p - centre)/B) (a cos pθ_i - b sin pθ_i, a sin pθ_i + b cos pθ_i), with
    θ_i = base^(-2i/d) and ζ_i = (i/(d/2) + γ)/(1 + γ). ``positions[b][l]`` per row."""
    batch, heads, length, dim = x.shape
    half = dim // 2
    out = torch.empty_like(x, dtype=F64)
    for b in range(batch):
        for h in range(heads):
            for j in range(length):
                p = positions[b][j]
                for i in range(half):
                    first, second = (i, i + half) if layout == "half" else (2 * i, 2 * i + 1)
                    theta = base ** (-2 * i / dim)
                    zeta = (i / half + gamma) / (1 + gamma)
                    s = zeta ** ((-1 if inverse else 1) * (p - centre) / scale_base)
                    a, c = float(x[b, h, j, first]), float(x[b, h, j, second])
                    cos, sin = math.cos(p * theta), math.sin(p * theta)
                    out[b, h, j, first] = s * (a * cos - c * sin)
                    out[b, h, j, second] = s * (a * sin + c * cos)
    return out


def test_zeta_equals_the_authors_formula():
    """torchscale's XPOS: (arange(0, d, 2) + 0.4 d) / (1.4 d), one entry at a time."""
    for dim in (2, 8, 64):
        want = [(2 * i + 0.4 * dim) / (1.4 * dim) for i in range(dim // 2)]
        got = xpos_zeta(dim, dtype=F64).tolist()
        assert got == pytest.approx(want, rel=1e-15)
        assert pytest.approx(got[0]) == 0.4 / 1.4
        assert max(got) < 1


@pytest.mark.parametrize("layout", ["half", "interleaved"])
@pytest.mark.parametrize("centre", [0, 3])
def test_scheme_equals_the_float64_loop_from_the_paper(layout, centre):
    torch.manual_seed(0)
    scheme = XPos(8, layout=layout, centre=centre, scale_base=16.0, dtype=F64)
    q, k = torch.randn(2, 2, 5, 8, dtype=F64), torch.randn(2, 2, 5, 8, dtype=F64)
    shared = torch.arange(3, 8)  # [L]
    per_row = torch.tensor([[0, 2, 5, 9, 40], [1, 3, 4, 6, 7]])  # [B, L]
    for positions in (shared, per_row):
        rows = positions.expand(2, 5).tolist()
        got_q, got_k = scheme.transform_qk(q, k, positions, positions)
        options = {"layout": layout, "centre": centre, "scale_base": 16.0}
        want_q = _loop(q, rows, inverse=False, **options)
        want_k = _loop(k, rows, inverse=True, **options)
        torch.testing.assert_close(got_q, want_q, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(got_k, want_k, rtol=1e-12, atol=1e-12)


def test_pair_scores_are_ropes_times_zeta_power_and_shift_invariant():
    """One pair at a time (the other features zero): xPos's score is RoPE's times
    ζ_i^((n-m)/B). For whole vectors the score is unchanged when both positions shift;
    the false neighbour that scales the key like the query is not."""
    torch.manual_seed(1)
    dim, scale_base = 8, 64.0
    xpos = XPos(dim, scale_base=scale_base, dtype=F64)
    rope = RotaryEmbedding(dim, dtype=F64)
    zeta = xpos_zeta(dim, dtype=F64).tolist()

    def score(scheme, q, k, n, m):
        q2, k2 = scheme.transform_qk(q, k, torch.tensor([n]), torch.tensor([m]))
        return float((q2 * k2).sum())

    for i in range(dim // 2):
        q, k = torch.zeros(1, 1, 1, dim, dtype=F64), torch.zeros(1, 1, 1, dim, dtype=F64)
        q[..., [i, i + dim // 2]], k[..., [i, i + dim // 2]] = torch.randn(2, dtype=F64), 1.0
        for n, m in ((10, 3), (40, 40), (7, 90)):
            ratio = zeta[i] ** ((n - m) / scale_base)
            assert score(xpos, q, k, n, m) == pytest.approx(ratio * score(rope, q, k, n, m))
    q, k = torch.randn(1, 1, 1, dim, dtype=F64), torch.randn(1, 1, 1, dim, dtype=F64)
    assert score(xpos, q, k, 30, 12) == pytest.approx(score(xpos, q, k, 530, 512), rel=1e-12)

    def same_sign(q, k, n, m):  # the false neighbour: the key's factor ζ^(+m/B)
        z = xpos.zeta
        qs = xpos_scale(torch.tensor([n]), z, scale_base).repeat(1, 2)
        ks = xpos_scale(torch.tensor([m]), z, scale_base).repeat(1, 2)
        q2, k2 = rope.transform_qk(q, k, torch.tensor([n]), torch.tensor([m]))
        return float((q2 * qs * k2 * ks).sum())

    assert same_sign(q, k, 30, 12) != pytest.approx(same_sign(q, k, 530, 512), rel=1e-3)


def test_the_largest_score_of_unit_vectors_decays_as_the_largest_zeta():
    """Over unit q and k, the largest xPos score at offset Δ = n - m is the spectral norm of
    [xpos(e_a, n)·xpos(e_b, m)], which is max_i ζ_i^(Δ/B): the slowest pair's decay for a
    key behind the query, and a growth ζ_0^(Δ/B) for a key ahead of it (xPos is causal)."""
    dim = 16
    scheme = XPos(dim, dtype=F64)
    zeta = xpos_zeta(dim, dtype=F64).tolist()
    eye = torch.eye(dim, dtype=F64).view(1, 1, dim, dim)
    largest = []
    for delta in (0, 64, 512, 2048, 8192, -512):
        n, m = 9000, 9000 - delta
        q2, k2 = scheme.transform_qk(eye, eye, torch.full((dim,), n), torch.full((dim,), m))
        norm = float(torch.linalg.matrix_norm(q2[0, 0] @ k2[0, 0].T, ord=2))
        want = max(z ** (delta / XPOS_SCALE_BASE) for z in zeta)
        assert norm == pytest.approx(want, rel=1e-10)
        largest.append(norm)
    assert largest[:5] == sorted(largest[:5], reverse=True)
    assert largest[0] == pytest.approx(1)
    assert largest[5] == pytest.approx(zeta[0] ** (-512 / XPOS_SCALE_BASE))
    assert largest[5] > 3


def test_rotary_embedding_torch_rotate_queries_and_keys():
    """lucidrains' RotaryEmbedding(dim, use_xpos=True) pairs 2i with 2i+1 and centres the
    positions of the call on L // 2: it equals XPos(layout="interleaved", centre=L // 2),
    and pecode's default half layout after layout_permutation. Its scores equal those of
    the uncentred XPos (the centre cancels in q·k), though q and k themselves differ."""
    lucidrains = pytest.importorskip("rotary_embedding_torch")
    torch.manual_seed(2)
    dim, length = 16, 11
    theirs = lucidrains.RotaryEmbedding(dim, use_xpos=True, cache_if_possible=False)
    q, k = torch.randn(2, 3, length, dim), torch.randn(2, 3, length, dim)
    their_q, their_k = theirs.rotate_queries_and_keys(q, k)
    positions = torch.arange(length)
    ours = XPos(dim, layout="interleaved", centre=length // 2)
    our_q, our_k = ours.transform_qk(q, k, positions, positions)
    torch.testing.assert_close(our_q, their_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(our_k, their_k, rtol=1e-5, atol=1e-5)
    perm = layout_permutation(dim)
    inverse = torch.argsort(perm)
    half_q, half_k = XPos(dim, centre=length // 2).transform_qk(
        q[..., inverse], k[..., inverse], positions, positions
    )
    torch.testing.assert_close(half_q[..., perm], their_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(half_k[..., perm], their_k, rtol=1e-5, atol=1e-5)
    uncentred_q, uncentred_k = XPos(dim, layout="interleaved").transform_qk(
        q, k, positions, positions
    )
    assert (uncentred_q - their_q).abs().max() > 1e-3  # another origin, other q and k
    torch.testing.assert_close(
        uncentred_q @ uncentred_k.mT, their_q @ their_k.mT, rtol=1e-4, atol=1e-4
    )


def test_rotary_embedding_torch_cached_keys_use_two_centres():
    """rotary-embedding-torch 0.9.1's rotate_queries_with_cached_keys centres the query
    chunk on its own length (q_len // 2) and the keys on theirs (k_len // 2): its last
    query row is XPos with centre 0 at position L - 1 (q_len = 1), its keys XPos with
    centre L // 2, so its scores carry an extra factor ζ_i^((L//2)/B) per pair and differ
    from the last row of rotate_queries_and_keys. pecode keeps one fixed centre."""
    lucidrains = pytest.importorskip("rotary_embedding_torch")
    torch.manual_seed(3)
    dim, length = 8, 40
    theirs = lucidrains.RotaryEmbedding(dim, use_xpos=True, cache_if_possible=False)
    q, k = torch.randn(1, 1, length, dim), torch.randn(1, 1, length, dim)
    cached_q, cached_k = theirs.rotate_queries_with_cached_keys(q[..., -1:, :], k)
    positions = torch.arange(length)
    our_q, _ = XPos(dim, layout="interleaved").transform_qk(
        q[..., -1:, :], k[..., -1:, :], positions[-1:], positions[-1:]
    )
    _, our_k = XPos(dim, layout="interleaved", centre=length // 2).transform_qk(
        q, k, positions, positions
    )
    torch.testing.assert_close(cached_q, our_q, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(cached_k, our_k, rtol=1e-5, atol=1e-5)
    full_q, full_k = theirs.rotate_queries_and_keys(q, k)
    full = full_q[..., -1:, :] @ full_k.mT
    assert (cached_q @ cached_k.mT - full).abs().max() > 1e-2


def _layer(scheme, num_kv_heads=None):
    torch.manual_seed(4)
    return MultiHeadAttention(32, 4, num_kv_heads=num_kv_heads, position=scheme)


@pytest.mark.parametrize("num_kv_heads", [None, 2])
@pytest.mark.parametrize("centre", [0, 5])
def test_decoding_token_by_token_equals_one_causal_pass(num_kv_heads, centre):
    layer = _layer(XPos(8, centre=centre, scale_base=16.0), num_kv_heads)
    x = torch.randn(2, 10, 32, generator=torch.manual_seed(5))
    with torch.no_grad():
        full = layer(x, causal=True)
        chunked, cache = forward_in_chunks(layer, x, [6, 1, 1, 1, 1])
    torch.testing.assert_close(chunked, full, rtol=1e-5, atol=1e-5)
    assert len(cache) == 10


class _CentredPerCall(XPos):
    """The false neighbour: the origin moved to the middle of each call's keys, L // 2
    (rotary-embedding-torch's rule), with keys cached after scaling."""

    def transform_qk(self, q, k, q_positions, k_positions):
        self.centre = k_positions.shape[-1] // 2
        return super().transform_qk(q, k, q_positions, k_positions)


def test_a_per_call_centre_is_exact_in_one_pass_and_breaks_the_cache():
    x = torch.randn(2, 10, 32, generator=torch.manual_seed(6))
    fixed, moving = _layer(XPos(8, scale_base=16.0)), _layer(_CentredPerCall(8, scale_base=16.0))
    with torch.no_grad():
        full = fixed(x, causal=True)
        torch.testing.assert_close(moving(x, causal=True), full, rtol=1e-5, atol=1e-5)
        chunked, _ = forward_in_chunks(moving, x, [6, 1, 1, 1, 1])
    assert (chunked[:, 6:] - full[:, 6:]).abs().max() > 1e-2
    torch.testing.assert_close(chunked[:, :6], full[:, :6], rtol=1e-5, atol=1e-5)


def test_the_position_limit_keeps_the_factors_inside_half_the_range():
    """At the limit ζ_0^(-limit/B) is at most 1/sqrt(tiny); one position more exceeds it.
    Past it float32 overflows for real (positions 40 000 from the centre), which XPos
    refuses, and a centre in the middle of the positions makes them acceptable."""
    zeta0 = 0.4 / 1.4
    for dtype in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        limit, bound = xpos_position_limit(dtype=dtype), torch.finfo(dtype).tiny ** -0.5
        assert zeta0 ** (-limit / 512) <= bound < zeta0 ** (-(limit + 1) / 512)
    assert xpos_position_limit(dtype=torch.float32) == 17847
    zeta = xpos_zeta(8)
    far = torch.tensor([40000])
    assert torch.isinf(xpos_scale(far, zeta, inverse=True)).any()  # float32
    assert torch.isfinite(xpos_scale(far, zeta.double(), inverse=True)).all()
    scheme, q = XPos(8), torch.randn(1, 1, 2, 8)
    positions = torch.tensor([17847, 17848])
    with pytest.raises(ValueError, match="k_positions"):
        scheme.transform_qk(q, q, positions - 1, positions)
    with pytest.raises(ValueError, match="float16"):
        scheme.transform_qk(q.half(), q.half(), torch.tensor([0, 1984]), torch.tensor([0, 1]))
    q2, k2 = XPos(8, centre=10000).transform_qk(q, q, positions, positions)
    assert torch.isfinite(q2).all()
    assert torch.isfinite(k2).all()
    assert XPos(8, dtype=F64).position_limit(F64) == xpos_position_limit(dtype=F64)
    assert XPos(8).position_limit(F64) == 17847  # the float32 tables decide


def test_module_to_bfloat16_keeps_the_bases_in_float64():
    scheme = XPos(8).to(torch.bfloat16)
    assert scheme.zeta.dtype == F64
    assert scheme.zeta.tolist() == xpos_zeta(8, dtype=F64).tolist()


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="dim"):
        xpos_zeta(7)
    with pytest.raises(ValueError, match="smoothing"):
        xpos_zeta(8, 0.0)
    with pytest.raises(TypeError, match="dtype"):
        xpos_zeta(8, dtype=torch.float16)
    with pytest.raises(TypeError, match="zeta"):
        xpos_scale(torch.arange(3), torch.arange(4))
    with pytest.raises(ValueError, match="scale_base"):
        xpos_scale(torch.arange(3), xpos_zeta(8), 0.0)
    with pytest.raises(ValueError, match="centre"):
        xpos_scale(torch.arange(3), xpos_zeta(8), centre=-1)
    with pytest.raises(TypeError, match="inverse"):
        xpos_scale(torch.arange(3), xpos_zeta(8), inverse=1)
    cos = torch.ones(3, 4)
    with pytest.raises(ValueError, match="scale"):
        apply_xpos(torch.zeros(3, 8), cos, cos, torch.ones(3, 2))
    with pytest.raises(TypeError, match="scale"):
        apply_xpos(torch.zeros(3, 8), cos, cos, torch.ones(3, 4, dtype=torch.long))
    with pytest.raises(ValueError, match="centre"):
        XPos(8, centre=-2)
    with pytest.raises(ValueError, match="head_dim"):
        XPos(7)
    scheme, q = XPos(8), torch.zeros(1, 2, 3, 8)
    with pytest.raises(ValueError, match="q must have shape"):
        scheme.transform_qk(torch.zeros(1, 2, 3, 6), q, torch.arange(3), torch.arange(3))
    with pytest.raises(TypeError, match="q_positions"):
        scheme.transform_qk(q, q, torch.arange(3.0), torch.arange(3))
    with pytest.raises(ValueError, match="k_positions"):
        scheme.transform_qk(q, q, torch.arange(3), torch.arange(4))
    assert repr(XPos(8)) == (
        "XPos(\n  head_dim=8, base=10000.0, smoothing=0.4, scale_base=512.0, centre=0, "
        "layout='half', dtype=torch.float32\n  (rotary): RotaryEmbedding(head_dim=8, "
        "rotary_dim=8, base=10000.0, layout='half', dtype=torch.float32, scaling=None, "
        "scaling_params={})\n)"
    )
