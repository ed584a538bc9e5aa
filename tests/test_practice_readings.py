"""The 2023-26 practice readings of a trained RoPE model (chapter 11.1) against references.

* :func:`pecode.scaling.logn_query_scale` against Qwen-7B's own list comprehension
  (``modeling_qwen.py``: ``math.log(i, seq_length) if i > seq_length else 1``);
* ``with_rope_scaling(model, "logn" | "log_length", ...)``: the read layer's queries and
  attention weights against the plain model's rotated queries times factors computed with
  :mod:`math` (Qwen's rule; Ministral 3's ``1 + β ln(1 + ⌊p / L⌋)``), and its logits
  against the plain model's where the factors are 1;
* ``"rerope"``/``"leaky_rerope"``: the scheme of every layer, the leak against
  :func:`~pecode.rerope.clipped_distance` of the longest distance, the logits against the
  plain model's where nothing is clipped;
* every reading's state dict against the original's;
* :func:`attention_entropy` against ``-Σ p ln p`` of the weights computed layer by layer
  by hand, and against ``ln(i + 1)`` for uniform attention;
* :func:`run_experiment` with the practice readings: the names, and the readings' scores
  at the training length against plain RoPE's.
"""

from __future__ import annotations

import copy
import functools
import math

import pytest
import torch

from pecode.experiments import (
    PRACTICE_READINGS,
    REROPE_WINDOW_SHARE,
    ExperimentConfig,
    ScaledQueries,
    TinyDecoder,
    attention_entropy,
    run_experiment,
    with_rope_scaling,
)
from pecode.rerope import ReRoPE, clipped_distance
from pecode.rope import RotaryEmbedding
from pecode.scaling import logn_query_scale

TRAIN = 8
HEAD_DIM = 8


def _model(scheme: str = "rope", num_layers: int = 1, seed: int = 0) -> TinyDecoder:
    torch.manual_seed(seed)
    model = TinyDecoder(
        scheme, vocab_size=6, max_len=TRAIN, dim=16, num_heads=2, num_layers=num_layers
    )
    if scheme == "rope":  # float64 tables, so that float64 comparisons can be tight
        for block in model.blocks:
            block.attention.position = RotaryEmbedding(HEAD_DIM, dtype=torch.float64)
    return model.double().eval()


def _tokens(batch: int, length: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 6, (batch, length), generator=torch.Generator().manual_seed(seed))


# --- Qwen's logn ---------------------------------------------------------------------------


@pytest.mark.parametrize("seq_length", [2, 8, 13])
def test_logn_query_scale_equals_qwens_list(seq_length):
    n = 5 * seq_length
    # Qwen-7B modeling_qwen.py, QWenAttention.__init__, 1-based i; query p reads logn_list[p]
    logn_list = [math.log(i, seq_length) if i > seq_length else 1 for i in range(1, n)]
    got = logn_query_scale(torch.arange(n - 1), seq_length)
    assert got.dtype == torch.float64
    torch.testing.assert_close(
        got, torch.tensor(logn_list, dtype=torch.float64), rtol=1e-15, atol=0
    )
    # any shape, any integer dtype
    grid = torch.arange(n - 1, dtype=torch.int32).reshape(1, -1).expand(3, -1)
    torch.testing.assert_close(logn_query_scale(grid, seq_length)[2], got)
    # neighbour: counted from 0 (i = p), the list is another one
    zero_based = [math.log(p, seq_length) if p > seq_length else 1 for p in range(n - 1)]
    assert not torch.allclose(got, torch.tensor(zero_based, dtype=torch.float64))


def test_logn_query_scale_rejects_bad_input():
    with pytest.raises(TypeError, match="positions"):
        logn_query_scale(torch.tensor([0.0, 1.0]), 8)
    with pytest.raises(TypeError, match="positions"):
        logn_query_scale([0, 1], 8)
    with pytest.raises(ValueError, match="length"):
        logn_query_scale(torch.arange(3), 1)
    with pytest.raises(TypeError, match="length"):
        logn_query_scale(torch.arange(3), 8.0)
    with pytest.raises(ValueError, match="positions"):
        logn_query_scale(torch.tensor([0, -1]), 8)
    assert logn_query_scale(torch.arange(3), 2).shape == (3,)  # neighbour: good input passes


# --- query temperatures: logn and log_length ----------------------------------------------


def _qwen_logn(p: int) -> float:
    return max(1.0, math.log(p + 1) / math.log(TRAIN))


def _ministral(p: int) -> float:
    # get_llama_4_attn_scale: 1 + beta * log(1 + floor(p / original_max_position_embeddings))
    return 1.0 + 0.1 * math.log(1 + math.floor(p / TRAIN))


@pytest.mark.parametrize(("kind", "rule"), [("logn", _qwen_logn), ("log_length", _ministral)])
def test_the_read_queries_are_the_rotated_queries_times_the_factor(kind, rule):
    model = _model()
    read = with_rope_scaling(model, kind, 4.0)
    length = 4 * TRAIN
    positions = torch.arange(length)
    factors = torch.tensor([rule(p) for p in range(length)], dtype=torch.float64)
    assert factors.max() > 1.0  # the rule does something at these lengths
    generator = torch.Generator().manual_seed(1)
    q = torch.randn(2, 2, length, HEAD_DIM, generator=generator, dtype=torch.float64)
    k = torch.randn(2, 2, length, HEAD_DIM, generator=generator, dtype=torch.float64)
    scheme = read.blocks[0].attention.position
    assert isinstance(scheme, ScaledQueries)
    got_q, got_k = scheme.transform_qk(q, k, positions, positions)
    plain_q, plain_k = RotaryEmbedding(HEAD_DIM, dtype=torch.float64).transform_qk(
        q, k, positions, positions
    )
    torch.testing.assert_close(got_q, plain_q * factors[:, None], rtol=0, atol=1e-12)
    torch.testing.assert_close(got_k, plain_k, rtol=0, atol=1e-12)
    # per-row positions [B, L]
    rows = torch.stack((positions, positions.flip(0)))
    got_rows, _ = scheme.transform_qk(q, k, rows, rows)
    flipped, _ = RotaryEmbedding(HEAD_DIM, dtype=torch.float64).transform_qk(q, k, rows, rows)
    expected_rows = flipped * torch.stack((factors, factors.flip(0)))[:, None, :, None]
    torch.testing.assert_close(got_rows, expected_rows, rtol=0, atol=1e-12)
    # neighbour: the plain queries differ where the factor is not 1
    assert (got_q - plain_q).abs().max() > 1e-3

    # the layer's attention weights against softmax(factor_i q_i·k_j / sqrt(d)), causal
    x = torch.randn(1, length, 16, generator=generator, dtype=torch.float64)
    layer = read.blocks[0].attention
    weights = layer.attention_weights(x, causal=True)
    split = lambda t: t.view(1, length, 2, HEAD_DIM).transpose(1, 2)  # noqa: E731
    rq, rk = RotaryEmbedding(HEAD_DIM, dtype=torch.float64).transform_qk(
        split(layer.q_proj(x)), split(layer.k_proj(x)), positions, positions
    )
    logits = (rq * factors[:, None]) @ rk.transpose(-2, -1) / math.sqrt(HEAD_DIM)
    future = torch.ones(length, length, dtype=torch.bool).triu(1)
    expected = logits.masked_fill(future, -math.inf).softmax(-1)
    torch.testing.assert_close(weights, expected, rtol=0, atol=1e-12)
    plain_weights = model.blocks[0].attention.attention_weights(x, causal=True)
    assert (weights - plain_weights).abs().max() > 1e-4  # neighbour: the unread layer


@pytest.mark.parametrize("kind", ["logn", "log_length"])
def test_query_temperatures_change_nothing_within_the_training_length(kind):
    model = _model(num_layers=2)
    read = with_rope_scaling(model, kind, 1.0)
    short = _tokens(2, TRAIN)
    torch.testing.assert_close(read(short), model(short), rtol=0, atol=1e-12)
    # neighbour: past the training length the factors exceed 1
    longer = _tokens(2, 3 * TRAIN)
    assert (read(longer) - model(longer)).abs().max() > 1e-6


# --- ReRoPE readings ---------------------------------------------------------------------


def test_rerope_reading_puts_a_rerope_with_half_the_training_length_in_every_layer():
    model = _model(num_layers=2)
    read = with_rope_scaling(model, "rerope", 3.0)
    window = int(REROPE_WINDOW_SHARE * model.max_len)
    assert window == TRAIN // 2
    for block in read.blocks:
        scheme = block.attention.position
        assert isinstance(scheme, ReRoPE)
        assert scheme.window == window
        assert scheme.leak is None
    # inputs of window + 1 tokens: the longest distance, w, is clipped to itself
    short = _tokens(2, window + 1)
    torch.testing.assert_close(read(short), model(short), rtol=0, atol=1e-12)
    # neighbour: one token more and distance w + 1 is clipped to w
    longer = _tokens(2, window + 2)
    assert (read(longer) - model(longer)).abs().max() > 1e-6


def test_leaky_rerope_reading_is_plain_rope_at_factor_1():
    model = _model(num_layers=2)
    read = with_rope_scaling(model, "leaky_rerope", 1.0)
    for block in read.blocks:
        assert isinstance(block.attention.position, RotaryEmbedding)
    tokens = _tokens(2, 3 * TRAIN)
    torch.testing.assert_close(read(tokens), model(tokens), rtol=0, atol=1e-12)


@pytest.mark.parametrize("factor", [4, 2, 1.5])
def test_leaky_rerope_maps_the_longest_distance_to_the_training_lengths(factor):
    model = _model(num_layers=2)
    read = with_rope_scaling(model, "leaky_rerope", factor)
    longest = round(factor * TRAIN) - 1
    for block in read.blocks:
        scheme = block.attention.position
        assert isinstance(scheme, ReRoPE)
        assert scheme.window == TRAIN // 2
        assert scheme.leak > 1
        far = clipped_distance(torch.tensor([longest, -longest]), scheme.window, scheme.leak)
        torch.testing.assert_close(
            far, torch.tensor([TRAIN - 1.0, 1.0 - TRAIN], dtype=torch.float64), rtol=0, atol=1e-12
        )
        # neighbour: one distance shorter lands below the training length's longest
        nearer = clipped_distance(torch.tensor([longest - 1]), scheme.window, scheme.leak)
        assert float(nearer) < TRAIN - 1 - 1e-6


@pytest.mark.parametrize("kind", PRACTICE_READINGS)
def test_a_reading_keeps_the_weights_and_leaves_the_original_alone(kind):
    model = _model(num_layers=2)
    before = copy.deepcopy(model.state_dict())
    tokens = _tokens(2, 3 * TRAIN)
    logits_before = model(tokens)
    read = with_rope_scaling(model, kind, 3.0)
    state, original = read.state_dict(), model.state_dict()
    assert list(state) == list(before)
    for name, value in before.items():
        assert torch.equal(state[name], value), name
        assert torch.equal(original[name], value), name
        assert state[name].data_ptr() != original[name].data_ptr(), name  # a copy
    for block in model.blocks:
        assert type(block.attention.position) is RotaryEmbedding
    torch.testing.assert_close(model(tokens), logits_before, rtol=0, atol=0)
    assert (read(tokens) - logits_before).abs().max() > 1e-6  # neighbour: the read copy


def test_with_rope_scaling_rejects_unknown_readings():
    with pytest.raises(ValueError, match="leaky_rerope") as raised:
        with_rope_scaling(_model(), "rerope_x", 2.0)
    for kind in PRACTICE_READINGS:
        assert repr(kind) in str(raised.value)


# --- attention entropy ---------------------------------------------------------------------


def _entropy_by_hand(model: TinyDecoder, tokens: torch.Tensor, last: int) -> list[float]:
    """Run the blocks one by one, weights of each layer's input, entropy in a loop."""
    x = model.embedding(tokens)
    out = []
    for block in model.blocks:
        weights = block.attention.attention_weights(block.norm1(x), causal=True)
        batch, heads, length, _ = weights.shape
        total, count = 0.0, 0
        for b in range(batch):
            for h in range(heads):
                for i in range(length - last, length):
                    row = weights[b, h, i].tolist()
                    total += -sum(p * math.log(p) for p in row if p > 0)
                    count += 1
        out.append(total / count)
        x = block(x)
    return out


def test_attention_entropy_equals_a_computation_by_hand():
    model = _model(num_layers=2)
    tokens = _tokens(5, 12)
    with torch.no_grad():
        expected = _entropy_by_hand(model, tokens, last=4)
    got = attention_entropy(model, tokens, last=4, batch_size=2)
    assert got.dtype == torch.float64
    assert got.shape == (2,)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0)
    # neighbours: other queries give other numbers; the batch size does not matter
    assert (attention_entropy(model, tokens, last=7) - got).abs().max() > 1e-6
    torch.testing.assert_close(attention_entropy(model, tokens, last=4, batch_size=5), got)


def test_uniform_attention_has_entropy_log_of_the_keys_seen():
    model = _model("none", num_layers=2)
    with torch.no_grad():
        for block in model.blocks:
            block.attention.q_proj.weight.zero_()
            block.attention.q_proj.bias.zero_()
    length, last = 12, 5
    tokens = _tokens(3, length)
    got = attention_entropy(model, tokens, last=last)
    expected = sum(math.log(i + 1) for i in range(length - last, length)) / last
    torch.testing.assert_close(got, torch.full((2,), expected, dtype=torch.float64))
    # neighbour: a trained-looking (random) model attends unevenly: lower entropy
    assert bool((attention_entropy(_model("none", num_layers=2), tokens, last=last) < got).all())


def test_attention_entropy_rejects_bad_last():
    model, tokens = _model(), _tokens(2, 6)
    with pytest.raises(ValueError, match="last"):
        attention_entropy(model, tokens, last=0)
    with pytest.raises(ValueError, match="last"):
        attention_entropy(model, tokens, last=7)
    with pytest.raises(TypeError, match="last"):
        attention_entropy(model, tokens, last=2.0)
    assert attention_entropy(model, tokens, last=6).shape == (1,)  # neighbour: last = seq


# --- the sweep -------------------------------------------------------------------------------


def test_run_experiment_names_the_practice_readings_and_rejects_unknown_ones():
    config = ExperimentConfig(
        train_length=TRAIN,
        eval_factors=(1, 2),
        offset=2,
        vocab_size=6,
        needle_values=0,
        dim=16,
        num_heads=2,
        num_layers=1,
        steps=2,
        batch_size=4,
        eval_sequences=4,
    )
    result = run_experiment(config, seeds=(0,), schemes=("rope",), rope_scalings=("logn",))
    assert result.names == ["rope", "rope+logn"]
    # at the training length every query's logn factor is 1: plain RoPE's scores
    assert result.accuracy["rope+logn"][TRAIN] == result.accuracy["rope"][TRAIN]
    every = run_experiment(config, seeds=(0,), schemes=("rope",), rope_scalings=PRACTICE_READINGS)
    assert every.names == ["rope", *(f"rope+{kind}" for kind in PRACTICE_READINGS)]
    with pytest.raises(ValueError, match="rope scaling") as raised:
        run_experiment(config, seeds=(0,), schemes=("rope",), rope_scalings=("logn2",))
    for kind in PRACTICE_READINGS:
        assert repr(kind) in str(raised.value)


@pytest.mark.parametrize("kind", ["rerope", "leaky_rerope"])
def test_rerope_readings_refuse_a_model_too_short_for_a_window(kind):
    """A model trained on 2 tokens has no room for a window and a distance past it."""
    model = TinyDecoder("rope", vocab_size=6, max_len=2, dim=16, num_heads=2, num_layers=1)
    with pytest.raises(ValueError, match="at least 3 tokens"):
        with_rope_scaling(model, kind, 2.0)
    # the neighbour: three tokens are enough
    model = TinyDecoder("rope", vocab_size=6, max_len=3, dim=16, num_heads=2, num_layers=1)
    assert with_rope_scaling(model, kind, 2.0) is not model


def test_scaled_queries_refuses_a_scheme_whose_bias_it_would_drop():
    """It passes on transform_qk only: wrapping ReRoPE (whose logit is its bias) or ALiBi
    would silently give content-only attention, so it raises; RoPE is accepted."""
    from pecode.alibi import ALiBi
    from pecode.experiments import ScaledQueries

    scale = functools.partial(logn_query_scale, length=8)
    for scheme in (ReRoPE(RotaryEmbedding(8), 4), ALiBi(2)):
        with pytest.raises(ValueError, match="would drop"):
            ScaledQueries(scheme, scale)
    assert ScaledQueries(RotaryEmbedding(8), scale).rotary is not None
