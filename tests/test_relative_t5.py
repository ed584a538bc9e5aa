"""pecode.relative.t5: T5's buckets against hand-worked values, a float64 rule loop and exact
integer arithmetic, and the bias as a table lookup."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pecode.attention import MultiHeadAttention
from pecode.reference import multi_head_attention_loop
from pecode.reference.relative import (
    t5_bucket_loop,
)
from pecode.relative import (
    T5RelativePositionBias,
    t5_relative_position_bucket,
)

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
    with pytest.raises(TypeError, match="bidirectional must be a bool"):
        t5_relative_position_bucket(torch.tensor([1]), "no")  # was taken as True
    with pytest.raises(TypeError, match="scale_logits must be a bool"):
        T5RelativePositionBias(2, scale_logits="no")


# ------------------------------------------------------------- the logarithm at bucket edges


def exact_bucket(offset: int, bidirectional: bool, num_buckets: int, max_distance: int) -> int:
    """T5's bucket of ``offset = key - query`` in exact integer arithmetic, no logarithm.

    In a half of ``n`` buckets with ``e = n // 2`` exact ones, a distance ``d >= e`` gets
    ``e + floor(s)`` with ``s = (n - e) ln(d / e) / ln(max_distance / e)``, capped at
    ``n - 1``. ``floor(s) >= t`` exactly when ``(d / e)^(n - e) >= (max_distance / e)^t``,
    that is ``d^(n-e) e^t >= max_distance^t e^(n-e)``: integers, compared exactly, so an
    offset whose ``s`` is an integer (a bucket edge) cannot round to either side.
    """
    half = num_buckets // 2 if bidirectional else num_buckets
    base = half if bidirectional and offset > 0 else 0
    distance = abs(offset) if bidirectional else max(-offset, 0)
    exact = half // 2
    if distance < exact:
        return base + distance
    steps, power = 0, half - exact
    while (
        exact + steps + 1 < half
        and distance**power * exact ** (steps + 1) >= max_distance ** (steps + 1) * exact**power
    ):
        steps += 1
    return base + exact + steps


def test_exact_bucket_by_hand():
    # 32 buckets, 128: s = 8 log2(d / 8) / 4 on each side, an integer at d = 16, 32, 64
    for offset, bucket in BIDIRECTIONAL.items():
        assert exact_bucket(offset, True, 32, 128) == bucket, offset
    for offset, bucket in CAUSAL.items():
        assert exact_bucket(offset, False, 32, 128) == bucket, offset


T5_SETTINGS = [(True, 32, 128), (False, 32, 128), (True, 64, 256), (False, 16, 64), (True, 8, 20)]


@pytest.mark.parametrize(("bidirectional", "num_buckets", "max_distance"), T5_SETTINGS)
def test_t5_buckets_equal_exact_arithmetic_edges_included(bidirectional, num_buckets, max_distance):
    # T5 takes the logarithm in float32 (Mesh TensorFlow's mtf.log of mtf.to_float, as
    # Hugging Face's torch.log of .float()); at a bucket edge (d = 16, 32, 64 for 32
    # buckets and 128) float32 could round s = 2, 4, 6 down and give the bucket below.
    # It does not here: every offset up to 2000 gets the exact bucket.
    offsets = torch.arange(-2000, 2001)
    ours = t5_relative_position_bucket(offsets, bidirectional, num_buckets, max_distance)
    exact = [exact_bucket(int(n), bidirectional, num_buckets, max_distance) for n in offsets]
    assert ours.tolist() == exact


@pytest.mark.parametrize(
    ("num_buckets", "max_distance", "offset", "exact", "float32"),
    [(83, 1000, -796, 79, 80), (99, 784, -426, 87, 88)],
)
def test_t5_logarithm_is_float32_as_in_t5(num_buckets, max_distance, offset, exact, float32):
    # Where float32 and exact arithmetic part. Searched once (not in the suite): 3290
    # settings, both directions, every count up to 128 with up to 14 maximum distances
    # each, offsets up to 2000; only these two causal ones part, at s = 38.999998 and
    # 38.999997, which float32 rounds to 39 (the same on AVX-512, AVX2 and scalar CPU
    # kernels). pecode keeps T5's float32, so it gives the bucket Hugging Face gives (T5's
    # Mesh TensorFlow code has the same float32 steps; read, not run); a float64
    # logarithm would give the exact one, as the float64 loop does.
    relative = torch.tensor([offset])
    assert exact_bucket(offset, False, num_buckets, max_distance) == exact
    assert t5_bucket_loop(offset, False, num_buckets, max_distance) == exact  # float64
    ours = t5_relative_position_bucket(relative, False, num_buckets, max_distance)
    assert ours.item() == float32
    transformers = pytest.importorskip("transformers")
    theirs = transformers.models.t5.modeling_t5.T5Attention._relative_position_bucket(
        relative, bidirectional=False, num_buckets=num_buckets, max_distance=max_distance
    )
    assert theirs.item() == float32


def test_t5_bias_is_heads_first_and_contiguous():
    # given as a float mask, a strided [Lq, Lk, H] view makes CUDA's fused attention copy
    # the whole mask at every call (chapter 12, measured once on an H100: 66 MiB of new
    # tensors instead of 2 at L = 1024); the values are the table's rows by bucket
    t5 = T5RelativePositionBias(4)
    positions = torch.arange(12)
    bias = t5.position_bias(positions, positions)
    assert bias.is_contiguous()
    buckets = t5_relative_position_bucket(positions[None, :] - positions[:, None])
    for h in range(4):
        assert torch.equal(bias[h], t5.bias.weight[buckets, h])
