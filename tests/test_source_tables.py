"""Evidence for the cells of the sources' comparison tables that no chapter decides exactly.

``book/source_tables.md`` redoes two tables cell by cell: source 000's comparison of
absolute, relative and rotary encodings (§5.1) and source 001's comparison of the
sinusoidal table with RoPE (§3). Most cells are decided by notebook cells; the tests here
decide the rest, each against an independent reference: memory counted by hand from the
shapes, scores computed one scalar at a time in float64, frequencies from ``math.pow``.
"""

from __future__ import annotations

import math

import pytest
import torch

from pecode.absolute import (
    LearnedPositionalEncoding,
    SinusoidalPositionalEncoding,
    sinusoidal_encoding,
    sinusoidal_frequencies,
)
from pecode.alibi import ALiBi
from pecode.attention import MultiHeadAttention
from pecode.bench import peak_tensor_memory
from pecode.reference.relative import t5_bucket_loop
from pecode.reference.rope import rope_loop
from pecode.relative import ShawRelativePosition, T5RelativePositionBias
from pecode.rope import RotaryEmbedding, rope_inv_freq
from pecode.scaling import unseen_angle_pairs

# --- "relative encodings have high computational complexity" (000, §5.1) ----------------

BATCH, HEADS, HEAD_DIM, CLIP = 1, 4, 32, 16
WIDTH = HEADS * HEAD_DIM
FLOAT, INDEX = 4, 8  # bytes of a float32 and of an int64


def _inputs(length: int):
    g = torch.Generator().manual_seed(length)
    q = torch.randn(BATCH, HEADS, length, HEAD_DIM, generator=g)
    k = torch.randn(BATCH, HEADS, length, HEAD_DIM, generator=g)
    x = torch.randn(BATCH, length, WIDTH, generator=g)
    return q, k, x, torch.arange(length)


def _work(scheme: str, length: int):
    """The call that builds what ``scheme`` adds to one attention layer, at ``length``."""
    q, k, x, pos = _inputs(length)
    modules = {
        "sinusoidal": SinusoidalPositionalEncoding(WIDTH, max_len=1024),
        "learned": LearnedPositionalEncoding(1024, WIDTH),
        "rope": RotaryEmbedding(HEAD_DIM, initial_positions=1024),
        "alibi": ALiBi(HEADS),
        "t5": T5RelativePositionBias(HEADS),
        "shaw-direct": ShawRelativePosition(HEAD_DIM, CLIP, memory_efficient=False),
        "shaw-gather": ShawRelativePosition(HEAD_DIM, CLIP),
    }
    module = modules[scheme]
    if scheme in ("sinusoidal", "learned"):
        return lambda: module(x)
    if scheme == "rope":
        return lambda: module.transform_qk(q, k, pos, pos)
    return lambda: module.score_bias(q, k, pos, pos)


def _tensors_it_must_create(scheme: str, n: int) -> int:
    """Bytes of the tensors each scheme cannot do without, counted from the shapes.

    Absolute: the rows of the table it looks up and the sum ``x + PE`` (``[L, D]`` and
    ``[B, L, D]``). RoPE: the rotated ``q`` and ``k`` and the cos/sin rows it uses.
    ALiBi and T5: one bias per head and (query, key) pair, ``[H, L, L]``, built from
    an ``[L, L]`` integer tensor of offsets (T5: buckets). Shaw et al. directly: the
    ``[L, L]`` table-row index, the relation vector of every pair, ``[L, L, Dh]``, and
    the key term ``[B, H, L, L]``; by gathering: the index, the products with the
    ``2k + 1`` table rows and the key term.
    """
    return {
        "sinusoidal": (n * WIDTH + BATCH * n * WIDTH) * FLOAT,
        "learned": (n * WIDTH + BATCH * n * WIDTH) * FLOAT,
        "rope": (2 * BATCH * HEADS * n * HEAD_DIM + 2 * n * HEAD_DIM // 2) * FLOAT,
        "alibi": HEADS * n * n * FLOAT + n * n * INDEX,
        "t5": HEADS * n * n * FLOAT + n * n * INDEX,
        "shaw-direct": (n * n * HEAD_DIM + BATCH * HEADS * n * n) * FLOAT + n * n * INDEX,
        "shaw-gather": (BATCH * HEADS * n * (2 * CLIP + 1) + BATCH * HEADS * n * n) * FLOAT
        + n * n * INDEX,
    }[scheme]


GROWTH = {  # the power of L in the formula above, for large L
    "sinusoidal": 1,
    "learned": 1,
    "rope": 1,
    "alibi": 2,
    "t5": 2,
    "shaw-direct": 2,
    "shaw-gather": 2,
}


@pytest.mark.parametrize("scheme", list(GROWTH))
def test_extra_memory_matches_the_count_from_the_shapes(scheme):
    """What each scheme materializes: linear in L for absolute tables and RoPE, quadratic
    for pairwise terms, as the hand count says.

    ``peak_tensor_memory`` counts every tensor the call creates, exactly. The measured
    peak must hold at least the tensors of the formula and at most a small multiple of
    them (index tensors and temporaries), and doubling L must multiply it by 2 or 4.
    """
    with torch.no_grad():
        peaks = {n: peak_tensor_memory(_work(scheme, n)) for n in (128, 256)}
    for n, peak in peaks.items():
        needed = _tensors_it_must_create(scheme, n)
        assert needed <= peak <= 4 * needed, (scheme, n, peak, needed)
    growth = math.log2(peaks[256] / peaks[128])
    assert abs(growth - GROWTH[scheme]) < 0.15, (scheme, growth)


# --- "RoPE needs no extra bias" against "sinusoidal needs T5's bias" (001, §3) ----------

LENGTH, D_MODEL, N_HEADS = 6, 8, 2
D_HEAD = D_MODEL // N_HEADS


def _project(x_row: list[float], linear: torch.nn.Linear) -> list[float]:
    weight = linear.weight.detach().double().tolist()
    bias = linear.bias.detach().double().tolist()
    return [
        sum(w * v for w, v in zip(row, x_row, strict=True)) + b
        for row, b in zip(weight, bias, strict=True)
    ]


def _rotate_loop(vector: list[float], position: int) -> list[float]:
    row = torch.tensor([vector], dtype=torch.float64)
    return rope_loop(row, torch.tensor([position]), layout="half")[0].tolist()


def _weights_loop(layer, x, positions, scheme) -> torch.Tensor:
    """Attention weights one scalar at a time, float64: the independent reference."""
    rows = x[0].tolist()
    if scheme == "sinusoidal":  # Vaswani et al.: PE(pos, 2i) = sin, PE(pos, 2i+1) = cos
        rows = [
            [
                value
                + (math.sin if c % 2 == 0 else math.cos)(
                    p / math.pow(10000.0, 2 * (c // 2) / D_MODEL)
                )
                for c, value in enumerate(row)
            ]
            for row, p in zip(rows, positions.tolist(), strict=True)
        ]
    qs = [_project(r, layer.q_proj) for r in rows]
    ks = [_project(r, layer.k_proj) for r in rows]
    out = torch.zeros(N_HEADS, LENGTH, LENGTH, dtype=torch.float64)
    for h in range(N_HEADS):
        part = slice(h * D_HEAD, (h + 1) * D_HEAD)
        for i, p_i in enumerate(positions.tolist()):
            logits = []
            for j, p_j in enumerate(positions.tolist()):
                q, k = qs[i][part], ks[j][part]
                if scheme == "rope":
                    q, k = _rotate_loop(q, p_i), _rotate_loop(k, p_j)
                logit = sum(a * b for a, b in zip(q, k, strict=True))
                if scheme == "t5":  # T5: no 1/sqrt(d) and a learned scalar per bucket
                    bucket = t5_bucket_loop(p_j - p_i)
                    logit += float(layer.position.bias.weight[bucket, h])
                else:
                    logit /= math.sqrt(D_HEAD)
                logits.append(logit)
            top = max(logits)
            exps = [math.exp(v - top) for v in logits]
            out[h, i] = torch.tensor([e / sum(exps) for e in exps], dtype=torch.float64)
    return out


def _weights(layer, x, positions, scheme) -> torch.Tensor:
    if scheme == "sinusoidal":
        x = x + sinusoidal_encoding(positions, D_MODEL, dtype=torch.float64)
    return layer.attention_weights(x, positions=positions)[0]


SCHEMES_IN_ATTENTION = {
    "sinusoidal": lambda: None,  # added to the input, attention untouched
    "rope": lambda: RotaryEmbedding(D_HEAD, dtype=torch.float64),
    "t5": lambda: T5RelativePositionBias(N_HEADS),  # T5 alone, no absolute table
}


@pytest.mark.parametrize("scheme", list(SCHEMES_IN_ATTENTION))
def test_attention_under_a_shift_of_all_positions(scheme):
    """Shift every position by the same amount: RoPE's and T5's weights do not change, the
    weights over an added sinusoidal table do. pecode agrees with the float64 loop at
    both sets of positions, so the verdict does not rest on pecode alone."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(D_MODEL, N_HEADS, position=SCHEMES_IN_ATTENTION[scheme]()).double()
    x = torch.randn(1, LENGTH, D_MODEL, dtype=torch.float64)
    base, shifted = torch.arange(LENGTH), torch.arange(LENGTH) + 37
    with torch.no_grad():
        at_base, at_shift = _weights(layer, x, base, scheme), _weights(layer, x, shifted, scheme)
        assert torch.allclose(at_base, _weights_loop(layer, x, base, scheme), atol=1e-12)
        assert torch.allclose(at_shift, _weights_loop(layer, x, shifted, scheme), atol=1e-12)
    change = float((at_base - at_shift).abs().max())
    if scheme == "sinusoidal":
        assert change > 1e-2  # the weights see absolute positions
    else:
        assert change < 1e-12  # only offsets matter


def test_what_each_scheme_adds_to_attention():
    """Counted by hand: RoPE adds no parameters and no logit bias (it turns q and k); the
    sinusoidal table adds nothing to attention; T5's bias is H * 32 learned scalars and a
    [H, L, L] tensor on the logits, in place of absolute positions, not on top of them."""
    q = k = torch.zeros(1, N_HEADS, LENGTH, D_HEAD)
    pos = torch.arange(LENGTH)
    rope = RotaryEmbedding(D_HEAD)
    t5 = T5RelativePositionBias(N_HEADS)
    sinusoidal = SinusoidalPositionalEncoding(D_MODEL)
    assert sum(p.numel() for p in rope.parameters()) == 0
    assert rope.score_bias(q, k, pos, pos) is None
    assert sum(p.numel() for p in sinusoidal.parameters()) == 0
    assert sum(p.numel() for p in t5.parameters()) == 32 * N_HEADS
    assert tuple(t5.score_bias(q, k, pos, pos).shape) == (N_HEADS, LENGTH, LENGTH)


# --- "sinusoidal: performance decays because the high frequencies fluctuate" (001, §3) -


def test_positions_past_training_bring_new_angles_only_to_the_slow_pairs():
    """Chapter 13's sinusoidal model (width 64, trained at L = 32, tested to 8L).

    A float64 loop over every test position and every training position finds, for
    each pair, how far the test angle is from the nearest angle seen in training (on the
    circle). The fast pairs, which wrap around within the training length, never get an
    angle more than half a step (``ω_i / 2``) from a seen one; the new angles are all in
    the slow pairs.
    The loop agrees with ``pecode.scaling.unseen_angle_pairs``.
    """
    width, trained, longest = 64, 32, 256
    frequencies = [math.pow(10000.0, -2 * i / width) for i in range(width // 2)]
    gap = []
    for w in frequencies:
        seen = [(t * w) % (2 * math.pi) for t in range(trained)]
        farthest = 0.0
        for p in range(trained, longest):
            angle = (p * w) % (2 * math.pi)
            nearest = min(min(abs(angle - s), 2 * math.pi - abs(angle - s)) for s in seen)
            farthest = max(farthest, nearest)
        gap.append(farthest)
    wraps = [trained * w >= 2 * math.pi for w in frequencies]
    new = [g > w / 2 + 1e-12 for g, w in zip(gap, frequencies, strict=True)]
    assert sum(wraps) == 6  # the six fastest pairs see the whole circle in 32 positions
    assert new == [not wrapped for wrapped in wraps]  # every other pair gets new angles
    inv = sinusoidal_frequencies(width)
    assert unseen_angle_pairs(inv, inv, trained, longest).tolist() == new


# --- "dimension extensibility" (001, §3) ------------------------------------------------


@pytest.mark.parametrize("width", [2, 8, 64, 512, 4096, 16384])
def test_sinusoidal_and_rope_use_one_frequency_formula_at_every_width(width):
    """The sinusoidal table's frequencies and RoPE's are the same numbers base^(-2i/d), for
    any even width: nothing about the sinusoidal design gets harder as d grows."""
    expected = torch.tensor(
        [math.pow(10000.0, -2 * i / width) for i in range(width // 2)], dtype=torch.float64
    )
    assert torch.allclose(sinusoidal_frequencies(width), expected, rtol=1e-14, atol=0)
    assert torch.allclose(rope_inv_freq(width, dtype=torch.float64), expected, rtol=1e-14, atol=0)


# --- "absolute: fixed-length sequences; relative: variable-length" (000, §5.1) ---------

VARIABLE = {
    "sinusoidal": (lambda: SinusoidalPositionalEncoding(D_MODEL), None),
    "learned": (lambda: LearnedPositionalEncoding(16, D_MODEL), None),
    "shaw": (None, lambda: ShawRelativePosition(D_HEAD, 3)),
    "t5": (None, lambda: T5RelativePositionBias(N_HEADS)),
    "alibi": (None, lambda: ALiBi(N_HEADS, symmetric=True)),
    "rope": (None, lambda: RotaryEmbedding(D_HEAD, dtype=torch.float64)),
}


@pytest.mark.parametrize("scheme", list(VARIABLE))
def test_every_scheme_takes_sequences_of_different_lengths_in_one_batch(scheme):
    """Lengths 3, 5 and 8 right-padded into one batch, with a key-padding mask, give each
    sequence exactly the outputs it gets alone: variable lengths up to the trained length
    are no problem for any scheme, absolute ones included."""
    torch.manual_seed(0)
    make_absolute, make_scheme = VARIABLE[scheme]
    absolute = make_absolute().double() if make_absolute else None
    position = make_scheme() if make_scheme else None
    layer = MultiHeadAttention(D_MODEL, N_HEADS, position=position).double().eval()
    lengths = [3, 5, 8]
    longest = max(lengths)
    x = torch.randn(len(lengths), longest, D_MODEL, dtype=torch.float64)
    keep = torch.arange(longest) < torch.tensor(lengths).unsqueeze(1)  # [B, L]
    with torch.no_grad():
        inputs = absolute(x) if absolute else x
        batch = layer(inputs, attn_mask=keep[:, None, None, :])
        for row, n in enumerate(lengths):
            alone_in = x[row : row + 1, :n]
            alone = layer(absolute(alone_in) if absolute else alone_in)
            assert torch.allclose(batch[row, :n], alone[0], atol=1e-12), (scheme, n)
