"""2-D RoPE on a grid (RoPE-Axial, RoPE-Mixed) against transformers and a float64 loop.

The independent references:

- transformers 5.23's Qwen2-VL vision tower: ``Qwen2VLVisionRotaryEmbedding`` (rope type
  ``"axial"``), ``apply_rotary_pos_emb_vision`` and the position ids of
  ``transformers.vision_utils.get_vision_position_ids``, which lists the patches of
  each ``m × m`` spatial-merge block together instead of in raster order;
- :func:`pecode.reference.grid_rope.grid_rope_loop`, the definition one scalar at a time
  in float64, itself checked against values worked out by hand;
- the property RoPE is for: scores that depend only on ``(Δrow, Δcol)``, where 1-D RoPE
  over the raster index fails.
"""

from __future__ import annotations

import math

import pytest
import torch

from pecode.attention import MultiHeadAttention
from pecode.grid_rope import AxialRotaryEmbedding, MixedRotaryEmbedding, grid_positions
from pecode.reference.grid_rope import axial_frequencies_loop, grid_rope_loop
from pecode.rope import RotaryEmbedding

# float32 angles on both sides, positions below 8
TOLERANCE = 1e-5
LAYOUTS = ("half", "interleaved")


def _randn(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def _scores(scheme, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    q, k = scheme.transform_qk(q, k, positions, positions)
    return q @ k.transpose(-1, -2)


def test_grid_positions_are_row_and_column_in_raster_order():
    positions = grid_positions(2, 3)
    assert positions.dtype == torch.int64
    assert positions.tolist() == [[0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [1, 2]]


# -- transformers' Qwen2-VL vision tower ---------------------------------------------------


def _merge_order(height: int, width: int, merge: int) -> torch.Tensor:
    """The raster indices of a grid listed block by block (``m × m`` blocks, each in
    raster order), the order in which Qwen2-VL's vision tower holds its patches."""
    index = torch.arange(height * width).reshape(height // merge, merge, width // merge, merge)
    return index.transpose(1, 2).flatten()


@pytest.mark.parametrize("theta", [10000.0, 100.0])
def test_axial_equals_transformers_qwen2_vl_vision_rotary(theta):
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen2_vl import modeling_qwen2_vl as qwen2_vl
    from transformers.vision_utils import get_vision_position_ids

    config = transformers.Qwen2VLVisionConfig(
        embed_dim=64,
        num_heads=2,
        depth=1,
        hidden_size=32,
        rope_parameters={"rope_type": "axial", "rope_theta": theta},
    )
    head_dim, merge = 32, 2
    grids = [(1, 4, 6), (2, 2, 4)]  # an image and a two-frame video, before merging
    ids = get_vision_position_ids(torch.tensor(grids), merge)  # [N, 2] (row, column)
    # their order is raster order within each 2 × 2 merge block, frame after frame
    ours_ids = torch.cat(
        [grid_positions(h, w)[_merge_order(h, w, merge)].repeat(t, 1) for t, h, w in grids]
    )
    assert torch.equal(ids, ours_ids)
    rotary = qwen2_vl.Qwen2VLVisionRotaryEmbedding(config)
    ours = AxialRotaryEmbedding(head_dim, base=theta)
    assert (ours.inv_freq - rotary.inv_freq.double()).abs().max() < 1e-7
    q, k = _randn(len(ids), 2, head_dim, seed=1), _randn(len(ids), 2, head_dim, seed=2)
    cos, sin = rotary(q, ids)  # [N, head_dim]: cat(row, column) angles, twice
    their_q, their_k = qwen2_vl.apply_rotary_pos_emb_vision(q, k, cos, sin)  # [N, H, Dh]
    q_ours, k_ours = ours.transform_qk(q.transpose(0, 1), k.transpose(0, 1), ids, ids)
    assert (q_ours.transpose(0, 1) - their_q).abs().max() < TOLERANCE
    assert (k_ours.transpose(0, 1) - their_k).abs().max() < TOLERANCE
    # neighbours: column first (Heo et al.'s (x, y) order), and M-RoPE's two chunked
    # sections, which split one ladder of head_dim / 2 frequencies between the axes
    x = q.transpose(0, 1)[None]  # [1, H, N, Dh]
    assert (ours.rotate(x, ids.flip(-1))[0].transpose(0, 1) - their_q).abs().max() > 0.1
    mrope = RotaryEmbedding(head_dim, base=theta, sections=[head_dim // 4, head_dim // 4])
    assert (mrope.rotate(x, ids[None])[0].transpose(0, 1) - their_q).abs().max() > 0.1


# -- the float64 loop ------------------------------------------------------------------------


def test_the_loop_turns_row_and_column_pairs_by_hand_worked_angles():
    # head_dim 4: pair 0 = features (0, 2) reads the row, pair 1 = (1, 3) the column, both
    # with θ = base^0 = 1; at (row, col) = (1, 2), x = (1, 1, 0, 0) becomes
    # (cos 1, cos 2, sin 1, sin 2)
    x = torch.tensor([[[1.0, 1.0, 0.0, 0.0]]], dtype=torch.float64)  # [H=1, L=1, 4]
    out = grid_rope_loop(x, torch.tensor([[1, 2]]), [axial_frequencies_loop(4)])
    want = [math.cos(1), math.cos(2), math.sin(1), math.sin(2)]
    assert out.flatten().tolist() == pytest.approx(want, abs=1e-15)
    assert axial_frequencies_loop(8, 100.0) == [(1.0, 0.0), (0.1, 0.0), (0.0, 1.0), (0.0, 0.1)]


@pytest.mark.parametrize("layout", LAYOUTS)
def test_axial_equals_the_float64_loop(layout):
    heads, head_dim = 3, 16
    positions = grid_positions(3, 4) + torch.tensor([5, 2])
    x = _randn(2, heads, 12, head_dim, dtype=torch.float64)
    ours = AxialRotaryEmbedding(head_dim, base=100.0, layout=layout)
    want = grid_rope_loop(x, positions, [axial_frequencies_loop(head_dim, 100.0)] * heads, layout)
    assert (ours.rotate(x, positions) - want).abs().max() < 1e-12
    # float32: the same rotation with float32 tables
    assert (ours.rotate(x.float(), positions) - want).abs().max() < TOLERANCE
    # batched positions [B, L, 2]: each row its own grid
    batched = torch.stack((positions, positions.flip(0)))
    second = grid_rope_loop(
        x[1], batched[1], [axial_frequencies_loop(head_dim, 100.0)] * heads, layout
    )
    assert (ours.rotate(x, batched)[1] - second).abs().max() < 1e-12


@pytest.mark.parametrize("layout", LAYOUTS)
def test_mixed_equals_the_float64_loop(layout):
    heads, head_dim = 2, 8
    mixed = MixedRotaryEmbedding(head_dim, heads, layout=layout).double()
    with torch.no_grad():  # any frequencies, not only the initial ones
        mixed.frequencies.copy_(_randn(heads, head_dim // 2, 2, seed=3, dtype=torch.float64))
    positions = grid_positions(3, 3)
    x = _randn(2, heads, 9, head_dim, seed=4, dtype=torch.float64)
    want = grid_rope_loop(x, positions, mixed.frequencies.tolist(), layout)
    assert (mixed.rotate(x, positions) - want).abs().max() < 1e-12


# -- scores depend on (Δrow, Δcol) only --------------------------------------------------------


def _mixed(seed: int = 0) -> MixedRotaryEmbedding:
    return MixedRotaryEmbedding(16, 2, generator=torch.Generator().manual_seed(seed)).double()


@pytest.mark.parametrize("scheme", ["axial", "mixed"])
@pytest.mark.parametrize("shift", [(3, 7), (-2, 5)])
def test_scores_are_unchanged_when_both_tokens_move_by_the_same_2d_shift(scheme, shift):
    rope = AxialRotaryEmbedding(16, base=100.0) if scheme == "axial" else _mixed()
    q, k = _randn(1, 2, 20, 16, seed=5, dtype=torch.float64), _randn(1, 2, 20, 16, seed=6)
    k = k.double()
    positions = grid_positions(4, 5)
    before = _scores(rope, q, k, positions)
    after = _scores(rope, q, k, positions + torch.tensor(shift))
    assert (after - before).abs().max() < 1e-10
    # the neighbour: moving only the keys changes the scores
    moved, _ = rope.transform_qk(k, k, positions + torch.tensor(shift), positions)
    assert (rope.transform_qk(q, k, positions, positions)[0] @ moved.mT - before).abs().max() > 0.1


def test_raster_order_rope_depends_on_the_width_and_aliases_offsets():
    """1-D RoPE over ``r · W + c`` is shift invariant within one width (a 2-D shift is one
    index shift), but the patch one row below is ``W`` away, so its score changes with the
    image's width, and the offsets ``(0, W - 1)`` and ``(1, -1)`` get the same score."""
    q, k = _randn(1, 1, 1, 16, seed=7, dtype=torch.float64), _randn(1, 1, 1, 16, seed=8).double()
    raster, axial = RotaryEmbedding(16, dtype=torch.float64), AxialRotaryEmbedding(16)

    def score_1d(query: int, key: int) -> float:
        qr, kr = raster.transform_qk(q, k, torch.tensor([query]), torch.tensor([key]))
        return float(qr @ kr.mT)

    def score_2d(query: tuple[int, int], key: tuple[int, int]) -> float:
        qr, kr = axial.transform_qk(q, k, torch.tensor([query]), torch.tensor([key]))
        return float(qr @ kr.mT)

    # the key one row below the query at (1, 1), in an image 4 and 6 patches wide
    below = {width: score_1d(width + 1, 2 * width + 1) for width in (4, 6)}
    assert abs(below[4] - below[6]) > 1e-3  # raster: depends on the width
    assert score_2d((1, 1), (2, 1)) == pytest.approx(score_2d((3, 2), (4, 2)), abs=1e-12)
    # width 4: (0, 3) to the right and (1, -1) below-left are both 3 indices away
    width, query = 4, (1, 1)
    right, below_left = (1, 1 + width - 1), (2, 0)

    def index(p):
        return p[0] * width + p[1]

    assert score_1d(index(query), index(right)) == score_1d(index(query), index(below_left))
    assert abs(score_2d(query, right) - score_2d(query, below_left)) > 1e-3


# -- RoPE-Mixed ----------------------------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_mixed_without_random_directions_is_axial(layout):
    mixed = MixedRotaryEmbedding(32, 4, base=100.0, layout=layout, random_directions=False)
    axial = AxialRotaryEmbedding(32, base=100.0, layout=layout)
    x, positions = _randn(2, 4, 12, 32, seed=9), grid_positions(3, 4) + 2
    with torch.no_grad():
        assert (mixed.rotate(x, positions) - axial.rotate(x, positions)).abs().max() < 1e-6


def test_mixed_initial_frequencies_are_a_rotated_axial_ladder_per_head():
    mixed = _mixed(seed=1).float()
    frequencies = mixed.frequencies.detach()  # [H, 8, 2]
    ladder = torch.tensor([10 ** (-4 * i / 16) for i in range(4)] * 2)  # base 10, head_dim 16
    assert torch.allclose(frequencies.norm(dim=-1), ladder.expand(2, 8), atol=1e-6)
    first, second = frequencies[:, :4], frequencies[:, 4:]  # perpendicular directions
    assert (first * second).sum(-1).abs().max() < 1e-7
    direction = frequencies[:, 0] / frequencies[:, 0].norm(dim=-1, keepdim=True)
    assert (direction[0] - direction[1]).abs().max() > 1e-3  # one random direction per head
    again = MixedRotaryEmbedding(16, 2, generator=torch.Generator().manual_seed(1))
    assert torch.equal(again.frequencies, mixed.frequencies)


def test_gradients_reach_the_mixed_frequencies_and_match_finite_differences():
    mixed = _mixed(seed=2)
    q, k = _randn(1, 2, 6, 16, seed=10, dtype=torch.float64), _randn(1, 2, 6, 16, seed=11)
    k, positions = k.double(), grid_positions(2, 3)

    def loss() -> torch.Tensor:
        return _scores(mixed, q, k, positions).square().sum()

    loss().backward()
    grad = mixed.frequencies.grad
    assert grad is not None
    assert grad.abs().max() > 0
    assert torch.isfinite(grad).all()
    eps = 1e-6
    for index in [(0, 0, 0), (1, 5, 1), (0, 7, 1)]:
        with torch.no_grad():
            mixed.frequencies[index] += eps
            up = float(loss())
            mixed.frequencies[index] -= 2 * eps
            down = float(loss())
            mixed.frequencies[index] += eps
        assert (up - down) / (2 * eps) == pytest.approx(float(grad[index]), rel=1e-5, abs=1e-7)


def test_grid_schemes_inside_multi_head_attention_train_and_refuse_grouped_keys():
    x, positions = _randn(2, 6, 32, seed=12), grid_positions(2, 3)[None]  # [1, L, 2]
    mixed = MixedRotaryEmbedding(8, 4, generator=torch.Generator().manual_seed(0))
    attention = MultiHeadAttention(32, 4, position=mixed)
    attention(x, positions=positions).square().sum().backward()
    assert mixed.frequencies.grad is not None
    assert mixed.frequencies.grad.abs().max() > 0
    grouped = MultiHeadAttention(32, 4, num_kv_heads=2, position=AxialRotaryEmbedding(8))
    assert grouped(x, positions=positions).shape == x.shape
    with pytest.raises(ValueError, match="grouped-query"):
        MultiHeadAttention(32, 4, num_kv_heads=2, position=mixed)(x, positions=positions)
    with pytest.raises(ValueError, match=r"\[L, 2\] or \[B, L, 2\]"):
        attention(x)  # 1-D positions 0 .. L-1: no grid


# -- bad input -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: AxialRotaryEmbedding(30), ValueError, "head_dim must be a multiple of 4"),
        (lambda: AxialRotaryEmbedding(31), ValueError, "head_dim must be a positive even"),
        (lambda: AxialRotaryEmbedding(32.0), TypeError, "head_dim must be an int"),
        (lambda: AxialRotaryEmbedding(32, base=1.0), ValueError, "base must be greater than 1"),
        (lambda: AxialRotaryEmbedding(32, layout="zigzag"), ValueError, "layout must be"),
        (lambda: MixedRotaryEmbedding(30, 2), ValueError, "head_dim must be a multiple of 4"),
        (lambda: MixedRotaryEmbedding(32, 0), ValueError, "num_heads must be positive"),
        (lambda: MixedRotaryEmbedding(32, 2, random_directions=1), TypeError, "must be a bool"),
        (lambda: grid_positions(0, 3), ValueError, "height must be positive"),
        (
            lambda: MixedRotaryEmbedding(8, 2).cos_sin(torch.zeros(4, 2)),
            TypeError,
            "positions must be an integer tensor",
        ),
        (
            lambda: AxialRotaryEmbedding(8).cos_sin(torch.zeros(4, 3).long()),
            ValueError,
            r"positions must have shape \[L, 2\]",
        ),
        (lambda: grid_positions(3, 2.5), TypeError, "width must be an int"),
        (
            lambda: AxialRotaryEmbedding(8).rotate(torch.zeros(1, 1, 4, 8), torch.zeros(4, 2)),
            TypeError,
            "positions must be an integer tensor",
        ),
        (
            lambda: AxialRotaryEmbedding(8).rotate(
                torch.zeros(1, 1, 4, 8), torch.zeros(4, 3).long()
            ),
            ValueError,
            r"positions must have shape \[L, 2\] or \[B, L, 2\]",
        ),
        (
            lambda: AxialRotaryEmbedding(8).rotate(torch.zeros(1, 1, 4, 8), torch.zeros(4).long()),
            ValueError,
            r"positions must have shape \[L, 2\]",
        ),
        (
            lambda: AxialRotaryEmbedding(8).rotate(
                torch.zeros(1, 1, 4, 8), torch.zeros(5, 2).long()
            ),
            ValueError,
            r"does not fit x of shape \(1, 1, 4, 8\)",
        ),
        (
            lambda: AxialRotaryEmbedding(8).rotate(torch.zeros(1, 4, 6), torch.zeros(4, 2).long()),
            ValueError,
            "does not end in head_dim=8",
        ),
        (
            lambda: AxialRotaryEmbedding(8).rotate(torch.zeros(4, 8).long(), torch.zeros(4, 2)),
            TypeError,
            "x must be a floating",
        ),
        (
            lambda: MixedRotaryEmbedding(8, 2).transform_qk(
                torch.zeros(1, 2, 4, 8),
                torch.zeros(1, 2, 4, 8),
                torch.zeros(4, 2).long(),
                torch.zeros(3, 2, 4, 2).long(),
            ),
            ValueError,
            "k_positions must have shape",
        ),
        (
            lambda: MixedRotaryEmbedding(8, 2).rotate(torch.zeros(4, 8), torch.zeros(4, 2).long()),
            ValueError,
            r"x must have shape \[B, H, L, Dh\]",
        ),
    ],
)
def test_bad_input_raises_naming_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()
