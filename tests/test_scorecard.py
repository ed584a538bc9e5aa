"""Evidence for the scorecard (book/scorecard.md) that no chapter decides exactly.

Each test checks one property of chapter 1 (``ch01-properties``) uniformly across the
encodings of the book, parametrized by scheme and through pecode's public API: a
``MultiHeadAttention`` with the scheme's ``PositionScheme``, or the absolute encoding
added to its input. References are independent of the code under test: the same layer
at shifted positions or at another length (metamorphic checks), the parameter formulas
of the papers, hand-derived bucket and clipping boundaries, float64 loops written from
the definitions, and asymptotic memory formulas. No test measures a time.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode

from pecode.absolute import (
    LearnedPositionalEncoding,
    SinusoidalPositionalEncoding,
    sinusoidal_encoding,
    sinusoidal_frequencies,
)
from pecode.alibi import ALiBi, alibi_bias_from_positions, alibi_slopes
from pecode.attention import MultiHeadAttention
from pecode.bench import peak_tensor_memory
from pecode.reference.relative import t5_bucket_loop
from pecode.reference.rope import rope_loop
from pecode.relative import (
    DebertaRelativePosition,
    ShawRelativePosition,
    T5RelativePositionBias,
    TransformerXLRelativePosition,
    deberta_position_terms,
    shaw_key_logits,
    sinusoidal_relative_encoding,
)
from pecode.rope import RotaryEmbedding, apply_rope, rope_cos_sin
from pecode.scaling import rope_frequencies

DIM, HEADS = 32, 4
HEAD_DIM = DIM // HEADS
TRAIN_LENGTH = 16  # L0: the "training length" of learned tables and RoPE scaling
CLIP = 4  # Shaw's and DeBERTa's k
FACTOR = 4.0  # RoPE context-extension factor s
SCALED = {"rope-linear": "linear", "rope-ntk": "ntk", "rope-yarn": "yarn"}


def _scaling_params(kind: str) -> dict:
    """Factor s = 4 over L0; dynamic NTK's frequencies are those it uses at length 4 L0."""
    params: dict = {"factor": FACTOR}
    if kind in ("yarn", "dynamic"):
        params["original_max_position_embeddings"] = TRAIN_LENGTH
    if kind == "dynamic":
        params["seq_len"] = 4 * TRAIN_LENGTH
    return params


def position_scheme(
    name: str, dim: int = DIM, heads: int = HEADS, *, table_dtype: torch.dtype = torch.float64
):
    """The ``PositionScheme`` of ``name`` (``None`` for NoPE and absolute encodings).

    RoPE's cos/sin tables are float64 for the float64 checks; the memory test asks for
    float32 tables, as a float32 model uses.
    """
    head_dim = dim // heads
    if name == "shaw":
        return ShawRelativePosition(head_dim, CLIP)
    if name == "transformer-xl":
        return TransformerXLRelativePosition(dim, heads, head_dim)
    if name == "t5":
        return T5RelativePositionBias(heads)  # encoder buckets: 32, max_distance 128
    if name == "deberta":
        return DebertaRelativePosition(dim, heads, head_dim, CLIP)
    if name == "alibi":
        return ALiBi(heads)
    if name == "rope":
        return RotaryEmbedding(head_dim, dtype=table_dtype)
    if name in SCALED or name == "rope-dynamic":
        kind = SCALED.get(name, "dynamic")
        params = _scaling_params(kind)
        params.pop("seq_len", None)  # the module takes the length from the positions
        return RotaryEmbedding(head_dim, dtype=table_dtype, scaling=kind, scaling_params=params)
    return None


class Layer(nn.Module):
    """One attention layer with an encoding: added to the input, or inside attention."""

    def __init__(
        self,
        name: str,
        *,
        dim: int = DIM,
        heads: int = HEADS,
        max_len: int = 64,
        table_dtype: torch.dtype = torch.float64,
    ):
        super().__init__()
        self.absolute: nn.Module | None = None
        if name == "sinusoidal":
            self.absolute = SinusoidalPositionalEncoding(dim, max_len=max_len)
        elif name == "learned":
            # unit variance (not BERT's 0.02), so that its effect is far above rounding
            self.absolute = LearnedPositionalEncoding(max_len, dim, init_std=1.0)
        scheme = position_scheme(name, dim, heads, table_dtype=table_dtype)
        self.attention = MultiHeadAttention(dim, heads, position=scheme)

    def _input(self, x: Tensor, positions: Tensor) -> Tensor:
        return x if self.absolute is None else self.absolute(x, positions)

    def forward(self, x: Tensor, positions: Tensor | None = None, causal: bool = False) -> Tensor:
        positions = torch.arange(x.shape[1]) if positions is None else positions
        return self.attention(self._input(x, positions), positions=positions, causal=causal)

    def weights(self, x: Tensor, positions: Tensor) -> Tensor:
        return self.attention.attention_weights(self._input(x, positions), positions=positions)


ALL = [
    "nope",
    "sinusoidal",
    "learned",
    "shaw",
    "transformer-xl",
    "t5",
    "deberta",
    "alibi",
    "rope",
    "rope-linear",
    "rope-ntk",
    "rope-yarn",
    "rope-dynamic",
]


def make_layer(name: str, **kwargs) -> Layer:
    torch.manual_seed(0)
    return Layer(name, **kwargs).double().eval()


def tokens(*shape: int, seed: int = 1) -> Tensor:
    return torch.randn(*shape, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------- relative-aware

SHIFT_CHANGES = {"sinusoidal", "learned", "rope-dynamic"}


@pytest.mark.parametrize("name", ALL)
def test_relative_aware(name):
    """prop-relative: moving every position by 20 leaves attention unchanged, in float64.

    It must, to rounding, for a scheme whose logits depend on positions only through
    m - n, and must not for an encoding added to the input (its logits contain
    p_i W p_j, a function of i and j separately). Dynamic NTK recomputes its
    frequencies from the largest position, so a shift past L0 changes it too.
    """
    layer = make_layer(name)
    x = tokens(2, 8, DIM)
    base, shifted = torch.arange(8), torch.arange(8) + 20
    with torch.no_grad():
        weight_change = (layer.weights(x, base) - layer.weights(x, shifted)).abs().max()
        output_change = (layer(x, base) - layer(x, shifted)).abs().max()
    if name in SHIFT_CHANGES:
        assert weight_change > 1e-3
        assert output_change > 1e-3
    else:
        assert weight_change < 1e-12
        assert output_change < 1e-12


def absolute_rows(name: str, positions: Tensor) -> Tensor:
    """p(m) as rows, float64: the sinusoidal formula, or the learned table of L0 rows."""
    if name == "sinusoidal":
        return sinusoidal_encoding(positions, DIM, dtype=torch.float64)
    table = make_layer(name, max_len=TRAIN_LENGTH).absolute
    with torch.no_grad():
        return table(torch.zeros(1, len(positions), DIM, dtype=torch.float64), positions)[0]


def relative_residual(before: Tensor, after: Tensor, matrix: Tensor) -> float:
    return float(torch.linalg.norm(before @ matrix - after) / torch.linalg.norm(after))


def best_orthogonal_map(before: Tensor, after: Tensor) -> Tensor:
    """The orthogonal Q that minimizes ||before @ Q - after|| (orthogonal Procrustes: U V^T)."""
    u, _, vh = torch.linalg.svd(before.mT @ after)
    return u @ vh


def sinusoidal_shift_loop(k: int, dim: int) -> Tensor:
    """M_k of thm-shift-rotation, entry by entry from Vaswani et al.'s formula, float64."""
    matrix = torch.zeros(dim, dim, dtype=torch.float64)
    for i in range(dim // 2):
        angle = k * 10000.0 ** (-2 * i / dim)
        matrix[2 * i, 2 * i] = matrix[2 * i + 1, 2 * i + 1] = math.cos(angle)
        matrix[2 * i, 2 * i + 1] = math.sin(angle)
        matrix[2 * i + 1, 2 * i] = -math.sin(angle)
    return matrix


@pytest.mark.parametrize("name", ["sinusoidal", "learned"])
def test_weak_form_of_relative_awareness(name):
    """prop-relative, weak form: p(m + k) = M_k p(m) with M_k orthogonal, for every m >= 0.

    A table of L0 = 16 rows of width 32 (fewer rows than columns, as BERT-base's 512 x
    768). The learned table's rows are linearly independent, so a linear map takes each
    to the next with a round-off residual (the old definition, which it met). An
    orthogonal one exists only if the rows' dot products depend on offsets alone; the
    closed-form best one (Procrustes) must leave a round-off residual for the sinusoid
    and most of the norm for the learned table. The sinusoid's M_k, written from the
    formula, must be orthogonal and hold at positions far past any table; the learned
    table has no row there.
    """
    rows = absolute_rows(name, torch.arange(TRAIN_LENGTH))
    before, after = rows[:-1], rows[1:]
    orthogonal = relative_residual(before, after, best_orthogonal_map(before, after))
    if name == "learned":
        linear = torch.linalg.lstsq(before, after, driver="gelsd").solution
        assert relative_residual(before, after, linear) < 1e-12  # the old weak form holds
        assert orthogonal > 0.2
        with pytest.raises(ValueError, match="max_len=16"):
            absolute_rows(name, torch.arange(TRAIN_LENGTH + 1))
        return
    assert orthogonal < 1e-6  # round-off, amplified by the slow, nearly constant pairs
    for k in (1, 7, 1000):
        shift = sinusoidal_shift_loop(k, DIM)
        assert (shift.mT @ shift - torch.eye(DIM, dtype=torch.float64)).abs().max() < 1e-14
        for start in (0, 10**6):
            m = torch.arange(start, start + 4 * TRAIN_LENGTH)
            moved = absolute_rows(name, m) @ shift.mT
            assert (moved - absolute_rows(name, m + k)).abs().max() < 1e-8


# --------------------------------------------------------------------------- deterministic


@pytest.mark.parametrize("name", ALL)
def test_same_position_same_encoding_at_any_length(name):
    """prop-deterministic: position m is encoded the same in every sequence, batch, length.

    Under a causal mask, output i depends only on the tokens at positions <= i; if each
    position is encoded the same whatever the length and the batch, the first L0 outputs
    of a 4 L0 sequence equal those of its first L0 tokens alone, also inside a batch.
    """
    layer = make_layer(name)
    x = tokens(1, 4 * TRAIN_LENGTH, DIM)
    other = tokens(1, 4 * TRAIN_LENGTH, DIM, seed=2)
    with torch.no_grad():
        short = layer(x[:, :TRAIN_LENGTH], causal=True)
        long = layer(x, causal=True)[:, :TRAIN_LENGTH]
        batched = layer(torch.cat((other, x)), causal=True)[1:, :TRAIN_LENGTH]
    if name == "rope-dynamic":  # its frequencies follow the sequence length past L0
        assert (long - short).abs().max() > 1e-3
    else:
        assert (long - short).abs().max() < 1e-12
        assert (batched - short).abs().max() < 1e-12


# --------------------------------------------------------------------------- extrapolates


@pytest.mark.parametrize("name", ALL)
def test_defined_past_training_length(name):
    """First half of prop-extrapolates: is the encoding defined at 4 L0?

    The tables are built for L0 (the learned table has L0 rows, the sinusoidal module
    starts with L0 rows, the RoPE scalings have L0 as their original length).
    """
    layer = make_layer(name, max_len=TRAIN_LENGTH)
    x = tokens(1, 4 * TRAIN_LENGTH, DIM)
    if name == "learned":
        with pytest.raises(ValueError, match="max_len=16"):
            layer(x)
        return
    with torch.no_grad():
        out = layer(x, causal=True)
    assert out.shape == x.shape
    assert torch.isfinite(out).all()


# --------------------------------------------------------------------------- unique


def position_logits(scheme, q: Tensor, k: Tensor, q_pos: Tensor, k_pos: Tensor) -> Tensor:
    """The scaled logits plus bias that MultiHeadAttention hands to its softmax."""
    if scheme is None:
        return q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    q, k = scheme.transform_qk(q, k, q_pos, k_pos)
    logits = q @ k.transpose(-2, -1) * scheme.logit_scale(q.shape[-1])
    bias = scheme.score_bias(q, k, q_pos, k_pos)
    return logits if bias is None else logits + bias


def offset_classes(values: Tensor) -> list[list[int]]:
    """Group offsets (indices of ``values``) whose logits are equal, in float64."""
    scale = float(values.abs().max()) or 1.0
    order = values.argsort()
    groups, last = [], None
    for index in order.tolist():
        value = float(values[index])
        if last is None or value - last > 1e-9 * scale:
            groups.append([])
        groups[-1].append(index)
        last = value
    return groups


# (number of distinguishable offsets 0..200, first offset from which all look the same)
# from the definitions: Shaw clips at k = 4 (offsets 0..4 distinct), DeBERTa's released
# code at k - 1 = 3 (c2p and p2c both read row δ(i, j): offsets 0..3 distinct); T5's
# encoder buckets give keys before the query 16 buckets, the last from distance
# ceil(8 * 16**(7/8)) = 91 (ch05-check-t5-saturation); the others never saturate.
OFFSETS_TOLD_APART = {
    "nope": (1, 0),
    "shaw": (CLIP + 1, CLIP),
    "transformer-xl": (201, None),
    "t5": (16, 91),
    "deberta": (CLIP, CLIP - 1),
    "alibi": (201, None),
    "rope": (201, None),
    "rope-linear": (201, None),
    "rope-ntk": (201, None),
    "rope-yarn": (201, None),
    "rope-dynamic": (201, None),
}


@pytest.mark.parametrize("name", list(OFFSETS_TOLD_APART))
def test_offsets_the_logit_tells_apart(name):
    """prop-unique for schemes that encode offsets: which offsets get distinct logits.

    One query at position 300 and 201 copies of one key at positions 100..300, so the
    logits differ only through the offset 0..200 (keys at or before the query).
    """
    torch.manual_seed(0)
    scheme = position_scheme(name)
    if scheme is not None:
        scheme = scheme.double()
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, HEADS, 1, HEAD_DIM, dtype=torch.float64, generator=gen)
    k = torch.randn(1, HEADS, 1, HEAD_DIM, dtype=torch.float64, generator=gen).expand(
        -1, -1, 201, -1
    )
    with torch.no_grad():
        logits = position_logits(scheme, q, k, torch.tensor([300]), torch.arange(100, 301))
    by_offset = logits[0, 0, 0].flip(0)  # index = offset 300 - key position
    groups = offset_classes(by_offset)
    count, saturation = OFFSETS_TOLD_APART[name]
    assert len(groups) == count
    if saturation is not None:
        last = max(groups, key=len)
        assert sorted(last) == list(range(saturation, 201))


def test_learned_rows_are_distinct():
    """prop-unique for a learned table: at initialization its rows are independent draws."""
    table = LearnedPositionalEncoding(64, DIM).weight.detach().double()
    distances = torch.cdist(table, table) + torch.eye(64) * 1e9
    typical = table.norm(dim=1).mean()
    assert distances.min() > 0.3 * typical


# --------------------------------------------------------------------------- parameters


def expected_parameters(name: str, dim: int, heads: int, max_len: int) -> int:
    """Position parameters per layer, as the papers define them."""
    head_dim = dim // heads
    formulas = {
        "learned": max_len * dim,  # L_max rows of width d (Devlin et al.)
        "shaw": 2 * (2 * CLIP + 1) * head_dim,  # w^K, w^V: 2k+1 rows of d_z each
        "transformer-xl": dim * heads * head_dim + 2 * heads * head_dim,  # W_{k,R}, u, v
        "t5": 32 * heads,  # one scalar per bucket and head
        "deberta": 2 * CLIP * dim + 2 * dim * heads * head_dim,  # P, W_{q,r}, W_{k,r}
    }
    return formulas.get(name, 0)


@pytest.mark.parametrize("name", ALL)
def test_parameter_count_matches_paper_formula(name):
    for dim, heads, max_len in ((32, 4, 64), (48, 2, 20)):
        layer = Layer(name, dim=dim, heads=heads, max_len=max_len)
        plain = Layer("nope", dim=dim, heads=heads)
        added = sum(p.numel() for p in layer.parameters()) - sum(
            p.numel() for p in plain.parameters()
        )
        assert added == expected_parameters(name, dim, heads, max_len)


# --------------------------------------------------------------------------- extra memory

# Leading term of the extra memory over attention without positions, in elements, for
# batch 1 and float32 (itemsize 4): the added table rows (absolute), one [L, d] tensor
# (RoPE with float32 tables: half the size of the rotated q and k together), or one
# [H, L, L] tensor per layer (every scheme with a pairwise term).
QUADRATIC = {"shaw", "transformer-xl", "t5", "deberta", "alibi"}


def memory_formula(name: str, length: int) -> int:
    if name in QUADRATIC:
        return HEADS * length * length
    return length * DIM


def extra_bytes(name: str, length: int) -> int:
    torch.manual_seed(0)
    layer = Layer(name, max_len=length, table_dtype=torch.float32).eval()
    plain = Layer("nope").eval()
    x = torch.randn(1, length, DIM)
    with torch.no_grad():
        layer(x)  # build lazily cached tables first
        return peak_tensor_memory(lambda: layer(x)) - peak_tensor_memory(lambda: plain(x))


@pytest.mark.parametrize("name", [n for n in ALL if n != "nope"])
def test_extra_memory_matches_asymptotic_formula(name):
    """Extra peak memory is Θ(formula): within a small constant of it, at two lengths."""
    short, long = 64, 256
    ratios = [extra_bytes(name, n) / (4 * memory_formula(name, n)) for n in (short, long)]
    assert all(1.0 <= r <= 6.0 for r in ratios), ratios
    assert ratios[1] / ratios[0] == pytest.approx(1.0, abs=0.2)


# --------------------------------------------------------------------------- time


class _OperatorLog(TorchDispatchMode):
    """Records the name of every ATen operator called inside the block."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def operators(name: str, lengths: tuple[int, ...] = (32, 32)) -> list[str]:
    """ATen operators of the last of forward calls at ``lengths`` (the first ones warm up)."""
    layer = make_layer(name)
    with torch.no_grad():
        for length in lengths[:-1]:
            layer(tokens(1, length, DIM))  # tables built here
        x = tokens(1, lengths[-1], DIM)
        with _OperatorLog() as log:
            layer(x)
    return log.names


@pytest.mark.parametrize("name", list(SCALED))
def test_scaled_rope_runs_the_same_operators_as_rope(name):
    """PI, NTK and YaRN change only the table values: per call, the same work as RoPE."""
    assert operators(name) == operators("rope")
    grown = (64, 32, 48)
    assert operators(name, grown) == operators("rope", grown)


def test_dynamic_ntk_runs_ropes_operators_unless_its_frequencies_change():
    """Dynamic NTK: RoPE's work, plus new frequencies or rows on a call that changes them.

    Its frequencies are those of the longest length seen since the last call below L0
    (Hugging Face's rule), so a call of the same length, or a shorter one past L0, runs
    exactly RoPE's operators. A call that needs more positions than any before computes
    new frequencies (``pow``), and one that falls below L0 after a longer one computes
    its rows again with the trained frequencies (``cos``, ``sin``), where RoPE looks them
    up: RoPE's operators, and these on top.
    """
    for lengths in [
        (2 * TRAIN_LENGTH,) * 2,
        (4 * TRAIN_LENGTH, 2 * TRAIN_LENGTH, 3 * TRAIN_LENGTH),
    ]:
        assert operators("rope-dynamic", lengths) == operators("rope", lengths)
    for lengths, extra in [
        ((3 * TRAIN_LENGTH, 4 * TRAIN_LENGTH), "aten.pow.Scalar"),
        ((4 * TRAIN_LENGTH, TRAIN_LENGTH // 2), "aten.cos.default"),
    ]:
        dynamic = Counter(operators("rope-dynamic", lengths))
        rope = Counter(operators("rope", lengths))
        assert not rope - dynamic  # every operator of RoPE's call
        assert extra in dynamic - rope


# --------------------------------------------------------------------------- decay


def _negate_position_parameters(scheme) -> None:
    with torch.no_grad():
        if isinstance(scheme, ShawRelativePosition):
            tensors = [scheme.key_table, scheme.value_table]
        elif isinstance(scheme, TransformerXLRelativePosition):
            tensors = [scheme.rel_proj.weight, scheme.u]
        elif isinstance(scheme, T5RelativePositionBias):
            tensors = [scheme.bias.weight]
        else:
            tensors = [scheme.rel_embeddings]
        for tensor in tensors:
            tensor.neg_()


@pytest.mark.parametrize("name", ["shaw", "transformer-xl", "t5", "deberta"])
def test_learned_distance_profile_flips_with_its_parameters(name):
    """Decay is not built into the learned schemes.

    Their position term is linear in the learned position parameters: negating them
    negates the term at every offset. The term is not constant in the offset, so
    whatever way it changes with distance for one setting, it changes the other way for
    the negated one; no decay (or growth) is imposed by the scheme itself.
    """
    torch.manual_seed(0)
    scheme = position_scheme(name).double()
    gen = torch.Generator().manual_seed(4)
    q = torch.randn(1, HEADS, 1, HEAD_DIM, dtype=torch.float64, generator=gen)
    k = torch.randn(1, HEADS, 1, HEAD_DIM, dtype=torch.float64, generator=gen).expand(
        -1, -1, 41, -1
    )
    q_pos, k_pos = torch.tensor([40]), torch.arange(41)
    with torch.no_grad():
        term = scheme.score_bias(q, k, q_pos, k_pos)
        _negate_position_parameters(scheme)
        negated = scheme.score_bias(q, k, q_pos, k_pos)
    assert torch.allclose(negated, -term, atol=1e-12)
    assert (term.amax(-1) - term.amin(-1)).min() > 1e-3


@pytest.mark.parametrize("kind", ["default", "linear", "ntk", "yarn", "dynamic"])
def test_rope_decay_is_of_an_upper_bound(kind):
    """RoFormer's bound decays for plain and scaled frequencies; random scores do not.

    The bound max_i |h_{i+1} - h_i| * sum_j |S_j| (ch08, eq-rope-decay) is checked to
    bound the scores of apply_rope; its distance factor falls with distance, while the
    mean absolute score of independent random q and k stays flat.
    """
    dim = 64
    params = {} if kind == "default" else _scaling_params(kind)
    inv_freq, _ = rope_frequencies(kind, dim, dtype=torch.float64, **params)
    distance = torch.arange(0, 2049)
    gen = torch.Generator().manual_seed(5)
    q = torch.randn(100, 1, dim, dtype=torch.float64, generator=gen)
    k = torch.randn(100, 1, dim, dtype=torch.float64, generator=gen)
    cos, sin = rope_cos_sin(distance, inv_freq)
    scores = (q * apply_rope(k.expand(-1, len(distance), -1), cos, sin, "interleaved")).sum(-1)
    partial = torch.polar(torch.ones_like(cos), distance[:, None] * inv_freq).cumsum(-1)
    factor = partial.abs().sum(-1)  # sum_j |S_j|, a function of the distance only
    h = (
        torch.complex(q[:, 0, 0::2], q[:, 0, 1::2])
        * torch.complex(k[:, 0, 0::2], k[:, 0, 1::2]).conj()
    )
    steps = (torch.cat((h[:, 1:], torch.zeros_like(h[:, :1])), 1) - h).abs().amax(-1)
    assert (scores.abs() <= steps[:, None] * factor[None, :] + 1e-9).all()

    def window(values, lo, hi):
        return float(values[..., lo:hi].mean())

    bound = [window(factor, lo, hi) for lo, hi in ((0, 1), (16, 32), (256, 512), (1024, 2049))]
    assert bound == sorted(bound, reverse=True)
    assert bound[-1] < 0.5 * bound[0]
    flat = [window(scores.abs().mean(0), lo, hi) for lo, hi in ((0, 64), (1024, 2049))]
    assert flat[1] > 0.7 * flat[0]


# --------------------------------------------------------------------------- multi-dim

ROWS, COLS = 3, 4


def grid(shift_row: int = 0, shift_col: int = 0) -> tuple[Tensor, Tensor]:
    patch = torch.arange(ROWS * COLS)
    return patch // COLS + shift_row, patch % COLS + shift_col


def _dot(a, b) -> float:
    return math.fsum(x * y for x, y in zip(a, b, strict=True))


def _rope_2d(kind: str):
    """Half the features rotated by the row, half by the column, as 1-D RoPE."""
    per_axis = HEAD_DIM  # 8 features per axis, head of 16
    params = {} if kind == "default" else _scaling_params(kind)
    inv_freq, factor = rope_frequencies(kind, per_axis, dtype=torch.float64, **params)
    gen = torch.Generator().manual_seed(6)
    q, k = torch.randn(2, ROWS * COLS, 2 * per_axis, dtype=torch.float64, generator=gen)

    def scores(rows, cols):
        def rotate(x):
            parts = []
            for axis, pos in ((0, rows), (1, cols)):
                cos, sin = rope_cos_sin(pos, inv_freq)
                part = x[:, axis * per_axis : (axis + 1) * per_axis]
                parts.append(apply_rope(part, cos * factor, sin * factor))
            return torch.cat(parts, -1)

        # unique: one key content rotated to every patch gives distinct vectors
        same_key = rotate(k[:1].expand(ROWS * COLS, -1))
        assert torch.cdist(same_key, same_key).add(torch.eye(ROWS * COLS)).min() > 1e-2
        return rotate(q) @ rotate(k).T

    def loop(rows, cols):
        freqs = inv_freq.tolist()
        out = torch.empty(ROWS * COLS, ROWS * COLS, dtype=torch.float64)
        for i in range(ROWS * COLS):
            for j in range(ROWS * COLS):
                total = 0.0
                for axis, pos in ((0, rows), (1, cols)):
                    cut = slice(axis * per_axis, (axis + 1) * per_axis)
                    qi = rope_loop(q[i : i + 1, cut], pos[i : i + 1], layout="half", inv_freq=freqs)
                    kj = rope_loop(k[j : j + 1, cut], pos[j : j + 1], layout="half", inv_freq=freqs)
                    total += factor**2 * _dot(qi[0].tolist(), kj[0].tolist())
                out[i, j] = total
        return out

    return scores, loop


def _alibi_2d():
    slopes = alibi_slopes(HEADS, dtype=torch.float64)

    def scores(rows, cols):
        return alibi_bias_from_positions(
            slopes, rows, rows, symmetric=True
        ) + alibi_bias_from_positions(slopes, cols, cols, symmetric=True)

    def loop(rows, cols):
        out = torch.empty(HEADS, ROWS * COLS, ROWS * COLS, dtype=torch.float64)
        for h, m in enumerate(slopes.tolist()):
            for i in range(ROWS * COLS):
                for j in range(ROWS * COLS):
                    distance = abs(int(rows[i] - rows[j])) + abs(int(cols[i] - cols[j]))
                    out[h, i, j] = -m * distance
        return out

    return scores, loop


def _t5_2d():
    torch.manual_seed(7)
    per_row, per_col = (
        T5RelativePositionBias(HEADS).double(),
        T5RelativePositionBias(HEADS).double(),
    )

    def scores(rows, cols):
        return per_row.position_bias(rows, rows) + per_col.position_bias(cols, cols)

    def loop(rows, cols):
        out = torch.empty(HEADS, ROWS * COLS, ROWS * COLS, dtype=torch.float64)
        for i in range(ROWS * COLS):
            for j in range(ROWS * COLS):
                row_bucket = t5_bucket_loop(int(rows[j] - rows[i]))
                col_bucket = t5_bucket_loop(int(cols[j] - cols[i]))
                out[:, i, j] = per_row.bias.weight[row_bucket] + per_col.bias.weight[col_bucket]
        return out

    return scores, loop


def _shaw_2d():
    gen = torch.Generator().manual_seed(8)
    q = torch.randn(1, 1, ROWS * COLS, HEAD_DIM, dtype=torch.float64, generator=gen)
    row_table, col_table = torch.randn(2, 2 * 1 + 1, HEAD_DIM, dtype=torch.float64, generator=gen)

    def scores(rows, cols):
        return shaw_key_logits(q, row_table, rows, rows, 1) + shaw_key_logits(
            q, col_table, cols, cols, 1
        )

    def loop(rows, cols):
        out = torch.empty(1, 1, ROWS * COLS, ROWS * COLS, dtype=torch.float64)
        for i in range(ROWS * COLS):
            for j in range(ROWS * COLS):
                total = 0.0
                for table, pos in ((row_table, rows), (col_table, cols)):
                    offset = max(-1, min(1, int(pos[j] - pos[i])))  # clip(j - i, k = 1)
                    total += _dot(q[0, 0, i].tolist(), table[offset + 1].tolist())
                out[0, 0, i, j] = total
        return out

    return scores, loop


def _deberta_2d():
    gen = torch.Generator().manual_seed(9)
    q, k = torch.randn(2, 1, 1, ROWS * COLS, HEAD_DIM, dtype=torch.float64, generator=gen)
    rel = torch.randn(2, 2, 1, 2 * 2, HEAD_DIM, dtype=torch.float64, generator=gen)  # k = 2

    def scores(rows, cols):
        total = 0
        for axis, pos in ((0, rows), (1, cols)):
            c2p, p2c = deberta_position_terms(q, k, rel[axis, 0], rel[axis, 1], pos, pos, 2)
            total = total + c2p + p2c
        return total

    def delta(i, j):  # He et al., eq. 3, with k = 2
        return 0 if i - j <= -2 else 3 if i - j >= 2 else i - j + 2

    def loop(rows, cols):
        out = torch.zeros(1, 1, ROWS * COLS, ROWS * COLS, dtype=torch.float64)
        for i in range(ROWS * COLS):
            for j in range(ROWS * COLS):
                for axis, pos in ((0, rows), (1, cols)):
                    q_rel, k_rel = rel[axis, 0, 0], rel[axis, 1, 0]
                    a, b = int(pos[i]), int(pos[j])
                    out[0, 0, i, j] += _dot(q[0, 0, i].tolist(), k_rel[delta(a, b)].tolist())
                    # p2c reads δ(i, j) too, as the released code does (chapter 5)
                    out[0, 0, i, j] += _dot(k[0, 0, j].tolist(), q_rel[delta(a, b)].tolist())
        return out

    return scores, loop


def _xl_2d():
    """Transformer-XL's position term (q_i + v) W R with R the sinusoids of (Δrow, Δcol)."""
    gen = torch.Generator().manual_seed(10)
    width = 8  # per axis
    q = torch.randn(ROWS * COLS, HEAD_DIM, dtype=torch.float64, generator=gen)
    v = torch.randn(HEAD_DIM, dtype=torch.float64, generator=gen)
    weight = torch.randn(HEAD_DIM, 2 * width, dtype=torch.float64, generator=gen)

    def scores(rows, cols):
        d_row = (rows[:, None] - rows[None, :]).reshape(-1)
        d_col = (cols[:, None] - cols[None, :]).reshape(-1)
        encoding = torch.cat(
            (
                sinusoidal_relative_encoding(d_row, width),
                sinusoidal_relative_encoding(d_col, width),
            ),
            -1,
        ).double()
        keys = (encoding @ weight.T).view(ROWS * COLS, ROWS * COLS, HEAD_DIM)
        return ((q + v)[:, None, :] * keys).sum(-1)

    def loop(rows, cols):
        freqs = [10000.0 ** (-2 * m / width) for m in range(width // 2)]
        out = torch.empty(ROWS * COLS, ROWS * COLS, dtype=torch.float64)
        for i in range(ROWS * COLS):
            for j in range(ROWS * COLS):
                r = []
                for d in (int(rows[i] - rows[j]), int(cols[i] - cols[j])):
                    r += [math.sin(d * f) for f in freqs] + [math.cos(d * f) for f in freqs]
                key = [_dot(row, r) for row in weight.tolist()]
                out[i, j] = _dot((q[i] + v).tolist(), key)
        return out

    return scores, loop


def _sinusoidal_2d():
    """ViT-style 2-D table: half the width encodes the row, half the column."""

    def encode(rows, cols):
        half = DIM // 2
        return torch.cat(
            (
                sinusoidal_encoding(rows, half, dtype=torch.float64),
                sinusoidal_encoding(cols, half, dtype=torch.float64),
            ),
            -1,
        )

    def scores(rows, cols):
        table = encode(rows, cols)
        assert torch.cdist(table, table).add(torch.eye(ROWS * COLS)).min() > 0.1  # unique
        return table @ table.T

    def loop(rows, cols):
        freqs = sinusoidal_frequencies(DIM // 2).tolist()
        out = torch.empty(ROWS * COLS, ROWS * COLS, dtype=torch.float64)
        for i in range(ROWS * COLS):
            for j in range(ROWS * COLS):
                d_row, d_col = int(rows[j] - rows[i]), int(cols[j] - cols[i])
                out[i, j] = math.fsum(math.cos(d_row * f) + math.cos(d_col * f) for f in freqs)
        return out

    return scores, loop


TWO_D = {
    "sinusoidal": _sinusoidal_2d,
    "shaw": _shaw_2d,
    "transformer-xl": _xl_2d,
    "t5": _t5_2d,
    "deberta": _deberta_2d,
    "alibi": _alibi_2d,
    "rope": lambda: _rope_2d("default"),
    "rope-linear": lambda: _rope_2d("linear"),
    "rope-ntk": lambda: _rope_2d("ntk"),
    "rope-yarn": lambda: _rope_2d("yarn"),
    "rope-dynamic": lambda: _rope_2d("dynamic"),
}


@pytest.mark.parametrize("name", list(TWO_D))
def test_two_dimensional_variant_depends_only_on_offsets(name):
    """prop-multidim: a 2-D variant built from pecode's 1-D functions, one per axis.

    Its scores on a 3 x 4 grid of patches equal a float64 loop written from the
    definitions, and shifting every patch by (7 rows, 11 columns) changes nothing: the
    positions enter only through (Δrow, Δcol).
    """
    scores, loop = TWO_D[name]()
    rows, cols = grid()
    with torch.no_grad():
        ours = scores(rows, cols)
        shifted = scores(*grid(7, 11))
    assert torch.allclose(ours, loop(rows, cols), atol=1e-10)
    assert torch.allclose(shifted, ours, atol=1e-10)
