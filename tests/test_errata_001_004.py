"""Reproductions for errata entries of sources 001-004 that no notebook cell decides.

One test per entry of ``book/errata.md``, named after the entry's label. Each rebuilds
the source's claim in a few lines of our own with ``pecode`` and compares it with an
independent reference: a float64 loop, a closed form, or the numbers the article prints.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pecode.reference.rope import rope_inv_freq_loop, rope_loop
from pecode.rope import apply_rope, rope_cos_sin, rope_inv_freq, rope_rotation_matrix


def _rotate(x: torch.Tensor, position: int) -> torch.Tensor:
    """RoPE of one float64 vector at one position, interleaved pairs (RoFormer's layout)."""
    inv_freq = rope_inv_freq(x.shape[-1], dtype=torch.float64)
    cos, sin = rope_cos_sin(torch.tensor([position]), inv_freq)
    return apply_rope(x[None], cos, sin, layout="interleaved")[0]


def test_errata_001_head_dim():
    """errata-001-head-dim: RoPE acts on each head's projected q and k, with d = head dim.

    Two readings of source 001's "d is the word-vector dimension" both fail. (1) Rotating
    the word vectors before the projections: the score then depends on both positions,
    not only on their difference (the float64 loop `rope_loop` is the reference for the
    rotation). (2) Rotating the full model width and then splitting into heads: later
    heads get only slow frequencies. The LLaMA-7B sizes (width 4096, 32 heads of 128) are
    from the LLaMA paper, Table 2.
    """
    gen = torch.Generator().manual_seed(0)
    width, head_dim = 16, 8
    x, y = torch.randn(2, width, generator=gen, dtype=torch.float64)
    w_q, w_k = torch.randn(2, width, head_dim, generator=gen, dtype=torch.float64)

    def after_projection(m: int, n: int) -> float:
        q = rope_loop((x @ w_q)[None], torch.tensor([m]))[0]
        k = rope_loop((y @ w_k)[None], torch.tensor([n]))[0]
        return float(q @ k)

    def before_projection(m: int, n: int) -> float:
        return float((_rotate(x, m) @ w_q) @ (_rotate(y, n) @ w_k))

    # the same offset m - n = 3 at two different absolute positions
    assert after_projection(5, 2) == pytest.approx(after_projection(13, 10), abs=1e-12)
    assert abs(before_projection(5, 2) - before_projection(13, 10)) > 0.1

    # d = 4096 split into 32 heads of 64 pairs: head h gets 10000^(-2(64h + i)/4096)
    whole_width = rope_inv_freq(4096, dtype=torch.float64).view(32, 64)
    last_head_fastest = float(whole_width[-1].max())
    assert last_head_fastest == pytest.approx(math.pow(10000.0, -2 * 64 * 31 / 4096), rel=1e-12)
    assert last_head_fastest < 1.4e-4
    assert 4095 * last_head_fastest < 0.55  # largest angle over 4096 tokens, in radians
    # d = 128 per head (LLaMA): every head gets the full range, from 1 rad per token down
    per_head = rope_inv_freq(128, dtype=torch.float64)
    assert per_head.tolist() == pytest.approx(rope_inv_freq_loop(128), rel=1e-12)
    assert float(per_head.max()) == 1.0


# Source 002's relativity table: (m, n, printed <RoPE(q, m), RoPE(k, n)>, printed right side).
SOURCE_002_TABLE = [
    (0, 0, -4.081900, -4.081900),
    (4, 4, -4.081900, -4.081900),
    (10, 0, -2.769302, -3.336345),
    (15, 5, -2.769302, -3.336345),
    (18, 8, -2.769302, -3.336345),
    (6, 16, -3.336345, -2.769302),
    (16, 26, -3.336345, -2.769302),
    (3, 13, -3.336345, -2.769302),
]


def test_errata_002_relativity_sign():
    """errata-002-relativity-sign: the article's own table, rebuilt to six decimals.

    With q and k the first 16 standard normals of NumPy's legacy generator seeded with 42
    (d = 8; the same vector as the article's step-by-step demo, whose printed norm
    2.48947373 it reproduces), the printed left column is <RoPE(q, m), RoPE(k, n)> and
    the printed right column is exactly <q, RoPE(k, m - n)>: the article computed the
    formula it states, and the formula is wrong. <q, RoPE(k, n - m)> equals the left side.
    """
    q_np, k_np = np.random.RandomState(42).randn(2, 8)
    q, k = torch.from_numpy(q_np), torch.from_numpy(k_np)
    assert float(q.norm()) == pytest.approx(2.48947373, abs=5e-9)
    for m, n, printed_left, printed_right in SOURCE_002_TABLE:
        left = float(_rotate(q, m) @ _rotate(k, n))
        stated = float(q @ _rotate(k, m - n))
        correct = float(q @ _rotate(k, n - m))
        assert left == pytest.approx(printed_left, abs=5e-7)
        assert stated == pytest.approx(printed_right, abs=5e-7)
        assert correct == pytest.approx(left, abs=1e-12)
        if m != n:
            assert abs(stated - left) > 0.5


def test_errata_003_matrix_listing():
    """errata-003-matrix-listing: the listing does not compile, and the matrices are big.

    A keyword argument inside a list display is a syntax error, so the listing fails
    before anything runs. Fixed, the [L, d, d] matrices (built here with pecode's
    `rope_rotation_matrix`) hold d times the numbers of the two [L, d/2] tables, and
    are what the listing rebuilds on every call: 256 MiB in float32 at L = 4096, d = 128.
    """
    with pytest.raises(SyntaxError):
        compile("torch.stack([first, second, dim=-1])", "<listing>", "eval")
    length, dim = 16, 128
    inv_freq = rope_inv_freq(dim)
    matrices = rope_rotation_matrix(torch.arange(length), inv_freq)
    cos, sin = rope_cos_sin(torch.arange(length), inv_freq)
    assert matrices.dtype == torch.float32
    assert matrices.nbytes == dim * (cos.nbytes + sin.nbytes)
    assert matrices.nbytes // length * 4096 == 256 * 2**20
