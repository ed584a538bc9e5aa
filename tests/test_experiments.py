"""The small training runs of chapter 13: data, model, window, readings, training, sweep."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from pecode.attention import PositionScheme
from pecode.experiments import (
    BIAS_FAMILY_SCHEMES,
    HYBRID_SCHEMES,
    IGNORE_INDEX,
    LOCAL_WINDOW_SHARE,
    NOPE_EVERY,
    P_ROPE_FRACTION,
    ROPE_READINGS,
    ROPE_SCALINGS,
    SCHEMES,
    ExperimentConfig,
    FrequencyRotary,
    NeedleCopyBatch,
    SilencedPairs,
    TinyDecoder,
    attention_beyond,
    attention_on_first_keys,
    attention_to_sinks,
    cpu_threads,
    delayed_copy_batch,
    evaluate,
    evaluate_probes,
    map_jobs,
    needle_copy_batch,
    paired_differences,
    run_experiment,
    seed_test_sets,
    sliding_window_mask,
    train,
    with_pairs_silenced,
    with_rope_scaling,
    yarn_paper_frequencies,
)
from pecode.fire import FIRE
from pecode.forgetting import ForgettingGate
from pecode.kerple import Kerple
from pecode.layer_pattern import nope_layers
from pecode.reference.rope import rope_loop
from pecode.reference.scaling import yarn_inv_freq_code_loop, yarn_inv_freq_paper_loop
from pecode.rope import RotaryEmbedding
from pecode.scaling import rope_frequencies, yarn_correction_range

TINY = ExperimentConfig(
    train_length=8,
    eval_factors=(1, 2),
    offset=2,
    vocab_size=6,
    needle_values=0,
    dim=16,
    num_heads=2,
    num_layers=1,
    steps=80,
    batch_size=16,
    lr=1e-2,
    eval_sequences=8,
)
# both tasks, small enough to learn in a few seconds
TINY_NEEDLE = ExperimentConfig(
    train_length=16,
    eval_factors=(1, 2),
    offset=2,
    vocab_size=6,
    needle_values=3,
    dim=32,
    num_heads=2,
    num_layers=2,
    steps=150,
    batch_size=16,
    lr=1e-2,
    eval_sequences=16,
)


# --- data ------------------------------------------------------------------------------


def test_delayed_copy_targets_match_a_loop():
    tokens, targets = delayed_copy_batch(
        3, 10, offset=3, vocab_size=5, generator=torch.Generator().manual_seed(0)
    )
    assert tokens.shape == targets.shape == (3, 10)
    assert tokens.dtype == torch.int64
    assert int(tokens.min()) >= 0
    assert int(tokens.max()) < 5
    for b in range(3):
        for t in range(10):
            expected = tokens[b, t - 3] if t >= 3 else IGNORE_INDEX
            assert int(targets[b, t]) == int(expected)


def test_needle_copy_batch_matches_a_loop():
    batch = needle_copy_batch(
        6,
        20,
        offset=3,
        vocab_size=5,
        needle_values=4,
        needle_span=5,
        generator=torch.Generator().manual_seed(1),
    )
    for name in ("tokens", "copy_targets", "needle_targets"):
        assert getattr(batch, name).shape == (6, 20), name
    assert batch.needle_positions.shape == (6,)
    for b in range(6):
        row = batch.tokens[b].tolist()
        needles = [t for t, token in enumerate(row) if token >= 5]
        assert needles == [int(batch.needle_positions[b])]  # exactly one, in the span
        p = needles[0]
        assert p < 5
        value = row[p] - 5
        assert 0 <= value < 4
        for t in range(20):
            copy = row[t - 3] if t >= 3 else IGNORE_INDEX
            assert int(batch.copy_targets[b, t]) == copy
            assert int(batch.needle_targets[b, t]) == (value if t > p else IGNORE_INDEX)
            assert int(batch.needle_distance()[b, t]) == t - p


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"offset": 10}, ValueError),
        ({"offset": 0}, ValueError),
        ({"vocab_size": 1}, ValueError),
        ({"batch_size": 2.0}, TypeError),
        ({"generator": 0}, TypeError),
    ],
)
def test_delayed_copy_rejects_bad_input(kwargs, error):
    args = {"offset": 2, "vocab_size": 4, "generator": torch.Generator(), "batch_size": 2}
    args.update(kwargs)
    batch_size = args.pop("batch_size")
    with pytest.raises(error):
        delayed_copy_batch(batch_size, 10, **args)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [({"needle_values": 1}, "needle_values"), ({"needle_span": 10}, "needle_span")],
)
def test_needle_batch_rejects_bad_input(kwargs, match):
    args = {"offset": 2, "vocab_size": 4, "needle_values": 3, "needle_span": 3}
    args.update(kwargs)
    with pytest.raises(ValueError, match=match):
        needle_copy_batch(2, 10, generator=torch.Generator(), **args)


# --- model -----------------------------------------------------------------------------


@pytest.mark.parametrize("scheme", SCHEMES + HYBRID_SCHEMES + BIAS_FAMILY_SCHEMES)
def test_model_shapes_and_causality(scheme):
    torch.manual_seed(0)
    model = TinyDecoder(scheme, vocab_size=7, max_len=12, dim=16, num_heads=2).eval()
    tokens = torch.randint(7, (2, 12))
    changed = tokens.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 7  # change only the future of position 7
    with torch.no_grad():
        logits, logits_changed = model(tokens), model(changed)
    assert logits.shape == (2, 12, 7)
    assert torch.equal(logits[:, :8], logits_changed[:, :8])
    assert not torch.allclose(logits[:, 8:], logits_changed[:, 8:])


def test_output_size_sets_the_readout():
    model = TinyDecoder("rope", vocab_size=7, max_len=12, dim=16, num_heads=2, output_size=10)
    assert model(torch.zeros(2, 5, dtype=torch.long)).shape == (2, 5, 10)
    assert TINY_NEEDLE.output_size == 6 + 3 + 3
    with pytest.raises(ValueError, match="output_size"):
        TinyDecoder("rope", vocab_size=7, max_len=12, dim=16, num_heads=2, output_size=1)


def test_learned_table_is_not_defined_past_max_len():
    model = TinyDecoder("learned", vocab_size=5, max_len=8, dim=16, num_heads=2)
    with pytest.raises(ValueError, match="max_len"):
        model(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("alibi2",), ValueError),
        (("rope",), ValueError),  # dim 12 over 4 heads: odd head size
    ],
)
def test_model_rejects_bad_configuration(args, error):
    with pytest.raises(error):
        TinyDecoder(*args, vocab_size=5, max_len=8, dim=12, num_heads=4)


def test_model_rejects_bad_tokens():
    model = TinyDecoder("none", vocab_size=5, max_len=8, dim=16, num_heads=2)
    with pytest.raises(TypeError, match="tokens"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="tokens"):
        model(torch.full((1, 4), 5))
    with pytest.raises(ValueError, match="tokens"):
        model(torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match="window"):
        model(torch.zeros(1, 4, dtype=torch.long), window=0)


# --- the hybrid stack: RoPE layers with NoPE layers --------------------------------------


def _decoder(scheme, **kwargs):
    settings = {"vocab_size": 7, "max_len": 12, "dim": 16, "num_heads": 2, **kwargs}
    return TinyDecoder(scheme, **settings).eval()


@pytest.mark.parametrize(
    ("scheme", "kind"), [("kerple", Kerple), ("fire", FIRE), ("forgetting", ForgettingGate)]
)
def test_bias_family_schemes_put_pecodes_module_in_every_layer(scheme, kind):
    """Each layer carries its own instance of the page 6.1 module, built for its heads;
    FIRE's threshold starts at the training length; the sweep's default is unchanged."""
    model = _decoder(scheme)
    schemes = [block.attention.position for block in model.blocks]
    assert all(type(position) is kind for position in schemes)
    assert schemes[0] is not schemes[1]
    assert all(position.num_heads == 2 for position in schemes)
    if scheme == "kerple":
        assert all(position.kind == "log" for position in schemes)
    if scheme == "fire":
        assert all(position.threshold.detach().item() == 12.0 for position in schemes)
    assert not set(BIAS_FAMILY_SCHEMES) & set(SCHEMES + HYBRID_SCHEMES)


def test_bias_family_model_equals_its_layers_run_by_hand():
    """A "kerple" TinyDecoder's logits are the blocks' arithmetic written out with the
    layer's own score_bias added to q·kᵀ/√Dh under the causal mask (float64)."""
    torch.manual_seed(1)
    model = _decoder("kerple").double()
    tokens = torch.randint(7, (2, 9))
    x = model.embedding(tokens)
    for block in model.blocks:
        attention = block.attention
        h = block.norm1(x)
        q, k, v = (
            proj(h).view(2, 9, 2, 8).transpose(1, 2)
            for proj in (attention.q_proj, attention.k_proj, attention.v_proj)
        )
        positions = torch.arange(9)
        logits = q @ k.transpose(-1, -2) / math.sqrt(8)
        logits = logits + attention.position.score_bias(q, k, positions, positions)
        logits = logits.masked_fill(torch.ones(9, 9, dtype=torch.bool).triu(1), -math.inf)
        out = (logits.softmax(-1) @ v).transpose(1, 2).reshape(2, 9, 16)
        x = x + attention.out_proj(out)
        x = x + block.mlp(block.norm2(x))
    expected = model.readout(model.norm(x))
    torch.testing.assert_close(model(tokens), expected, rtol=1e-12, atol=1e-12)


def test_rope_nope_is_a_hybrid_not_a_default_scheme():
    assert HYBRID_SCHEMES == ("rope_nope", "p_rope", "rope_sinks", "rope_local_global")
    assert not set(HYBRID_SCHEMES) & set(SCHEMES)  # the default sweep stays chapter 13's
    assert NOPE_EVERY == 4  # Llama 4's and SmolLM3's no_rope_layer_interval


def test_rope_sinks_is_rope_with_a_sink_logit_per_head_and_layer():
    """Zero sinks at first: RoPE's parameters plus H per layer, the others initialized as
    RoPE's; with a large sink logit the layer's output shrinks towards zero (the softmax
    gives the dropped column nearly everything), which RoPE's layer cannot do."""
    torch.manual_seed(0)
    rope = _decoder("rope")
    torch.manual_seed(0)
    sinks = _decoder("rope_sinks")
    named = dict(rope.named_parameters())
    extra = {n for n, _ in sinks.named_parameters()} - set(named)
    assert extra == {"blocks.0.attention.sinks", "blocks.1.attention.sinks"}
    for name, value in sinks.named_parameters():
        if name in named:
            assert torch.equal(value, named[name]), name
        else:
            assert torch.equal(value, torch.zeros(2)), name
    x = torch.randn(1, 5, 16)
    layer = sinks.blocks[0].attention
    with torch.no_grad():
        layer.sinks.fill_(30.0)
        assert layer(x, causal=True).sub(layer.out_proj.bias).abs().max() < 1e-6


def _uniform(model):
    """Zero queries: every logit 0, so each query spreads evenly over its keys."""
    with torch.no_grad():
        for block in model.blocks:
            block.attention.q_proj.weight.zero_()
            block.attention.q_proj.bias.zero_()
    return model


def test_first_key_share_of_an_even_spread_is_the_closed_form():
    model = _uniform(_decoder("rope"))
    tokens = torch.randint(0, 7, (3, 10), generator=torch.manual_seed(2))
    share, even = attention_on_first_keys(model, tokens, keys=2, start=4)
    closed = sum(2 / (i + 1) for i in range(4, 10)) / 6
    torch.testing.assert_close(even, torch.tensor(closed, dtype=torch.float64))
    torch.testing.assert_close(share, torch.full((2, 2), closed, dtype=torch.float64))
    with pytest.raises(ValueError, match="start"):
        attention_on_first_keys(model, tokens, keys=4, start=2)


def test_sink_share_with_zero_logits_is_the_closed_form():
    """Query i with i + 1 keys at logit 0 and a sink at s: the sink takes
    e^s / (e^s + i + 1)."""
    model = _uniform(_decoder("rope_sinks"))
    with torch.no_grad():
        model.blocks[0].attention.sinks.copy_(torch.tensor([0.0, 2.0]))
        model.blocks[1].attention.sinks.copy_(torch.tensor([-1.0, 1.0]))
    tokens = torch.randint(0, 7, (2, 8), generator=torch.manual_seed(3))
    got = attention_to_sinks(model, tokens, start=3)
    expected = torch.tensor(
        [
            [sum(math.exp(s) / (math.exp(s) + i + 1) for i in range(3, 8)) / 5 for s in pair]
            for pair in ((0.0, 2.0), (-1.0, 1.0))
        ],
        dtype=torch.float64,
    )
    torch.testing.assert_close(got, expected)
    with pytest.raises(ValueError, match="no learned sinks"):
        attention_to_sinks(_decoder("rope"), tokens, start=3)
    with pytest.raises(ValueError, match=r"\[batch, seq\]"):
        attention_to_sinks(model, tokens[0], start=3)
    with pytest.raises(ValueError, match="no row"):
        attention_to_sinks(model, tokens[:0], start=3)
    with pytest.raises(ValueError, match="batch_size"):
        attention_to_sinks(model, tokens, start=3, batch_size=0)


def test_rope_local_global_windows_the_even_layers():
    """Layer 0 sees the LOCAL_WINDOW_SHARE * max_len latest keys, layer 1 everything;
    the same parameters as RoPE's. Against the model read with a test-time window on
    layer 0 only, built from the RoPE model's blocks."""
    torch.manual_seed(0)
    split = _decoder("rope_local_global", max_len=16)
    windows = [block.attention.window for block in split.blocks]
    assert windows == [int(LOCAL_WINDOW_SHARE * 16), None] == [2, None]
    torch.manual_seed(0)
    rope = _decoder("rope", max_len=16)
    assert {n: p.shape for n, p in rope.named_parameters()} == {
        n: p.shape for n, p in split.named_parameters()
    }
    rope.load_state_dict(split.state_dict())
    tokens = torch.randint(0, 7, (2, 9), generator=torch.manual_seed(1))
    x = rope.embedding(tokens)
    x = rope.blocks[0](x, sliding_window_mask(9, 2))
    x = rope.blocks[1](x)
    expected = rope.readout(rope.norm(x))
    torch.testing.assert_close(split(tokens), expected)
    assert (split(tokens) - rope(tokens)).abs().max() > 1e-4  # the window changes it


def test_rope_nope_with_two_layers_is_rope_then_nope():
    model = _decoder("rope_nope")
    assert model.nope_layers == (False, True) == nope_layers(2, every=2)
    first, second = (block.attention.position for block in model.blocks)
    assert isinstance(first, RotaryEmbedding)
    assert type(second) is PositionScheme  # the base scheme: no position information
    assert "nope_every=2, nope_layers=(1,)" in model.extra_repr()
    assert "nope_layers" not in _decoder("rope").extra_repr()


@pytest.mark.parametrize(
    ("num_layers", "nope_every", "expected"),
    [(8, None, (3, 7)), (3, None, (2,)), (1, None, (0,)), (6, 2, (1, 3, 5)), (5, 4, (3,))],
)
def test_rope_nope_follows_the_layer_pattern(num_layers, nope_every, expected):
    model = _decoder("rope_nope", num_layers=num_layers, nope_every=nope_every)
    every = min(NOPE_EVERY, num_layers) if nope_every is None else nope_every
    assert model.nope_layers == nope_layers(num_layers, every=every)
    found = tuple(i for i, nope in enumerate(model.nope_layers) if nope)
    assert found == expected
    for i, block in enumerate(model.blocks):
        rotary = isinstance(block.attention.position, RotaryEmbedding)
        assert rotary != (i in expected), i


def test_rope_nope_has_rope_parameters_and_initialization():
    torch.manual_seed(0)
    rope = _decoder("rope")
    torch.manual_seed(0)
    hybrid = _decoder("rope_nope")
    assert sum(p.numel() for p in hybrid.parameters()) == sum(p.numel() for p in rope.parameters())
    named = dict(rope.named_parameters())
    for name, value in hybrid.named_parameters():
        assert torch.equal(value, named[name]), name


def test_rope_nope_is_rope_with_one_layers_rotation_removed():
    """With the same weights: rotating layer 1 too gives the rope model, removing layer
    0's rotation gives NoPE; neither changes nothing, so both layers count."""
    torch.manual_seed(0)
    hybrid = _decoder("rope_nope")
    rope, nope = _decoder("rope"), _decoder("none")
    rope.load_state_dict(hybrid.state_dict())
    nope.load_state_dict(hybrid.state_dict())
    tokens = torch.randint(7, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out_hybrid, out_rope, out_nope = hybrid(tokens), rope(tokens), nope(tokens)
        assert not torch.allclose(out_hybrid, out_rope)
        assert not torch.allclose(out_hybrid, out_nope)
        as_rope = copy.deepcopy(hybrid)
        as_rope.blocks[1].attention.position = RotaryEmbedding(8)
        assert torch.equal(as_rope(tokens), out_rope)
        as_nope = copy.deepcopy(hybrid)
        as_nope.blocks[0].attention.position = PositionScheme()
        assert torch.equal(as_nope(tokens), out_nope)


# --- p-RoPE: the fastest quarter of each head's pairs rotates, the rest never ----------


def test_p_rope_rotates_the_fastest_quarter_at_the_whole_heads_frequencies():
    """Against rope_loop (float64) with the frequencies written out: pairs 0 and 1 of a
    16-wide head at base^(-2i/16), the 6 others at frequency 0; with a rotated share of
    its own width (exponent 2i/4, the other convention) the test would fail."""
    assert P_ROPE_FRACTION == 0.25
    position = _decoder("p_rope", dim=64, num_heads=4).blocks[0].attention.position
    x = torch.randn(1, 3, 5, 16)
    positions = torch.tensor([0, 1, 7, 50, 100])
    theta = [10000.0 ** (-2 * i / 16) if i < 2 else 0.0 for i in range(8)]
    expected = rope_loop(x.double(), positions, layout="half", inv_freq=theta)
    got = position.rotate(x, positions)  # as the attention layer calls it
    torch.testing.assert_close(got.double(), expected, rtol=0, atol=1e-5)
    unrotated = [i for i in range(16) if i % 8 >= 2]  # pairs 2..7: features i and i + 8
    assert torch.equal(got[..., unrotated], x[..., unrotated])


def test_p_rope_has_rope_parameters_and_initialization():
    torch.manual_seed(0)
    rope = _decoder("rope")
    torch.manual_seed(0)
    partial = _decoder("p_rope")
    named = dict(rope.named_parameters())
    assert len(named) == len(dict(partial.named_parameters()))
    for name, value in partial.named_parameters():
        assert torch.equal(value, named[name]), name
    tokens = torch.randint(7, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert not torch.allclose(partial(tokens), rope(tokens))  # the rotation differs


def test_silenced_pairs_rotate_then_drop_those_query_features():
    """Against rope_loop (float64): the query rotated, then pairs 1 and 3 of an 8-wide
    head (features 1, 5, 3, 7) zeroed; the keys rotated and kept whole."""
    rotary = RotaryEmbedding(8)
    silenced = SilencedPairs(rotary, [3, 1])
    q, k = torch.randn(2, 2, 5, 8), torch.randn(2, 2, 5, 8)
    positions = torch.tensor([0, 3, 4, 9, 30])
    got_q, got_k = silenced.transform_qk(q, k, positions, positions)
    expected_q = rope_loop(q.double(), positions, layout="half")
    expected_q[..., [1, 5, 3, 7]] = 0.0
    torch.testing.assert_close(got_q.double(), expected_q, rtol=0, atol=1e-6)
    torch.testing.assert_close(
        got_k.double(), rope_loop(k.double(), positions, layout="half"), rtol=0, atol=1e-6
    )
    assert silenced.extra_repr() == "pairs=[3, 1]"


def test_with_pairs_silenced_copies_the_model_and_changes_its_scores():
    torch.manual_seed(0)
    model = _decoder("p_rope", dim=64, num_heads=4)
    before = {name: value.clone() for name, value in model.state_dict().items()}
    tokens = torch.randint(7, (2, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        out = model(tokens)
        for pairs in ([0, 1], [2, 3, 4, 5, 6, 7]):
            silenced = with_pairs_silenced(model, pairs)
            assert silenced.state_dict().keys() == before.keys()
            assert not torch.allclose(silenced(tokens), out)
        assert torch.equal(model(tokens), out)  # the original is untouched
    for name, value in model.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_silencing_rejects_what_it_cannot_probe():
    with pytest.raises(TypeError, match="TinyDecoder"):
        with_pairs_silenced(object(), [0])
    with pytest.raises(ValueError, match="scheme 'rope' or 'p_rope'"):
        with_pairs_silenced(_decoder("t5"), [0])
    with pytest.raises(TypeError, match="RotaryEmbedding"):
        SilencedPairs(PositionScheme(), [0])
    with pytest.raises(ValueError, match="half layout"):
        SilencedPairs(RotaryEmbedding(8, layout="interleaved"), [0])
    for bad in ([], [0, 0], [4]):
        with pytest.raises(ValueError, match="pairs"):
            SilencedPairs(RotaryEmbedding(8), bad)
    with pytest.raises(TypeError, match="pairs"):
        SilencedPairs(RotaryEmbedding(8), [1.0])


def test_seed_test_sets_are_the_sets_run_experiment_read():
    config = ExperimentConfig(**{**TINY_NEEDLE.__dict__, "steps": 2})
    result = run_experiment(config, seeds=(0, 3), schemes=("p_rope",), rope_scalings=())
    for seed, model in zip((0, 3), result.models["p_rope"], strict=True):
        for length, batch in seed_test_sets(config, seed).items():
            probes = evaluate_probes(model, batch, config)
            index = (0, 3).index(seed)
            assert float(probes.copy.nanmean()) == result.values("p_rope", length)[index]
    with pytest.raises(ValueError, match="seed"):
        seed_test_sets(config, -1)


def test_rope_nope_rejects_bad_intervals():
    with pytest.raises(ValueError, match="every"):
        _decoder("rope_nope", nope_every=0)
    with pytest.raises(TypeError, match="every"):
        _decoder("rope_nope", nope_every=2.0)
    with pytest.raises(ValueError, match="nope_every is for scheme 'rope_nope'"):
        _decoder("rope", nope_every=2)


def test_rope_nope_trains_runs_and_tabulates_paired_differences():
    config = ExperimentConfig(**{**TINY_NEEDLE.__dict__, "steps": 2})
    result = run_experiment(
        config, seeds=(0, 1), schemes=("rope", "rope_nope"), rope_scalings=(), window=16
    )
    assert result.names == ["rope", "rope_nope", "rope+window", "rope_nope+window"]
    assert result.models["rope_nope"][0].nope_layers == (False, True)
    table = paired_differences(result, "rope_nope", "rope")
    assert table.header == ["probe", "rope_nope", "rope", "difference [95% interval]"]
    # far has no position at L: rows copy 1L 2L, near 1L 2L, far 2L
    assert [row[0] for row in table.rows] == ["copy 1L", "copy 2L", "near 1L", "near 2L", "far 2L"]
    interval = result.paired("rope_nope", "rope", 32, "far")
    assert table.rows[-1][3] == str(interval)
    a, b = result.values("rope_nope", 16), result.values("rope", 16)
    assert table.rows[0][1:3] == [f"{sum(a) / 2:.2f}", f"{sum(b) / 2:.2f}"]
    with_signs = paired_differences(result, "rope_nope", "rope", signs=True)
    assert with_signs.header[-1] == "seeds"
    assert with_signs.rows[-1][-1] == f"{interval.positive}+ {interval.negative}-"
    with pytest.raises(TypeError, match="signs"):
        paired_differences(result, "rope_nope", "rope", signs="yes")
    with pytest.raises(KeyError, match="none"):
        paired_differences(result, "none", "rope")
    with pytest.raises(KeyError, match="probe"):
        paired_differences(result, "rope_nope", "rope", probes=("needle",))
    with pytest.raises(ValueError, match="confidence"):
        paired_differences(result, "rope_nope", "rope", confidence=95)
    with pytest.raises(ValueError, match="scheme"):
        train("rope_nope2", config, seed=0)


# --- the window ablation ----------------------------------------------------------------


def test_sliding_window_mask_matches_a_loop():
    mask = sliding_window_mask(7, 3)
    assert mask.shape == (7, 7)
    assert mask.dtype == torch.bool
    for t in range(7):
        for u in range(7):
            assert bool(mask[t, u]) == (0 <= t - u < 3)


@pytest.mark.parametrize("scheme", ["rope", "t5", "sinusoidal", "none"])
def test_window_hides_exactly_the_keys_window_or_more_back(scheme):
    torch.manual_seed(0)
    model = TinyDecoder(scheme, vocab_size=7, max_len=24, dim=16, num_heads=2, num_layers=2)
    model.eval()
    tokens = torch.randint(7, (2, 24))
    changed = tokens.clone()
    changed[:, 3] = (changed[:, 3] + 1) % 7  # a key 3 back from position 6
    with torch.no_grad():
        full, windowed = model(tokens), model(tokens, window=4)
        full_changed, windowed_changed = model(changed), model(changed, window=4)
        # a window of the whole length masks nothing (the fused kernel may round differently)
        assert torch.allclose(model(tokens, window=24), full, atol=1e-5)
    # two layers with window 4 see 3 + 3 = 6 positions back at most: from position 10 on,
    # the change at position 3 is invisible with the window, visible without it
    assert torch.equal(windowed[:, 10:], windowed_changed[:, 10:])
    assert not torch.allclose(full[:, 10:], full_changed[:, 10:])
    # nearer positions still see it
    assert not torch.allclose(windowed[:, 3:10], windowed_changed[:, 3:10])


def test_window_cuts_the_needle_off():
    """A trained model finds the needle; with a window shorter than the distance it cannot."""
    model, _ = train("rope", TINY_NEEDLE, seed=0)
    batch = TINY_NEEDLE.batch(64, 32, torch.Generator().manual_seed(5))
    with cpu_threads(1):
        full = evaluate_probes(model, batch, TINY_NEEDLE)
        windowed = evaluate_probes(model, batch, TINY_NEEDLE, window=4)
    chance = 1 / TINY_NEEDLE.needle_values
    assert full.near > 0.9
    # positions 4 or more after the needle: two layers with window 4 still reach 6 back,
    # so look at distances >= 7, where no path from the needle is left
    far = windowed.needle[7:][~torch.isnan(windowed.needle[7:])]
    assert float(far.mean()) < chance + 0.2
    assert float(full.needle[7:16].nanmean()) > 0.9


# --- reading a RoPE model at longer lengths ---------------------------------------------


@pytest.mark.parametrize(("head_dim", "length"), [(16, 256), (64, 4096), (128, 4096)])
@pytest.mark.parametrize("factor", [2.0, 4.0, 16.0])
def test_yarn_paper_frequencies_match_the_papers_loop(head_dim, length, factor):
    ours = yarn_paper_frequencies(head_dim, 10000.0, factor, length)
    loop = yarn_inv_freq_paper_loop(head_dim, 10000.0, factor, length)
    assert ours.dtype == torch.float64
    assert torch.allclose(ours, loop, rtol=1e-12, atol=0)


def test_paper_and_code_ramps_agree_outside_the_ramp_only():
    """Chapter 13's setting (d = 16, L0 = 256): pair 0 turns 40.7 > 32 times, pairs 4..7
    less than once; the ramps agree there and differ on pairs 1..3."""
    paper = yarn_paper_frequencies(16, 10000.0, 4.0, 256)
    code, _ = rope_frequencies(
        "yarn", 16, 10000.0, dtype=torch.float64, factor=4.0, original_max_position_embeddings=256
    )
    assert torch.allclose(code, yarn_inv_freq_code_loop(16, 10000.0, 4.0, 256), rtol=1e-12)
    same = torch.isclose(paper, code, rtol=1e-12, atol=0)
    assert same.tolist() == [True, False, False, False, True, True, True, True]
    assert bool((code[1:4] > paper[1:4]).all())  # the code keeps more of the middle pairs


def test_ramps_disagree_outside_the_ramp_when_the_code_clips_its_low_end():
    """L0 = 32 < 2π·32: even pair 0 turns fewer than beta_fast times (5.1). The code's low
    end, floor of a negative index, is clipped to 0, so the code keeps pair 0 whole; the
    paper's γ(5.1) = 0.13 divides most of it by s. Pair 0 lies outside the code's ramp,
    and the two differ there (the old docstrings said they agree outside the ramp)."""
    assert yarn_correction_range(16, 10000.0, 32, 32, 1)[0] == 0
    paper = yarn_paper_frequencies(16, 10000.0, 4.0, 32)
    code, _ = rope_frequencies(
        "yarn", 16, 10000.0, dtype=torch.float64, factor=4.0, original_max_position_embeddings=32
    )
    assert float(code[0]) == 1.0  # kept whole
    turns = 32 / (2 * math.pi)
    gamma = (turns - 1) / 31
    assert float(paper[0]) == pytest.approx((1 - gamma) / 4 + gamma, rel=1e-12)
    assert float(paper[0]) < 0.4


def test_yarn_parts_apart_recombine_to_yarn():
    """YaRN's frequencies alone and its temperature alone: each changes one of the two
    things the full reading changes, checked against rotations built by hand."""
    torch.manual_seed(0)
    model = TinyDecoder("rope", vocab_size=5, max_len=8, dim=16, num_heads=2).eval()
    factor = 4.0
    full = with_rope_scaling(model, "yarn", factor).blocks[0].attention.position
    freqs = with_rope_scaling(model, "yarn_frequencies", factor).blocks[0].attention.position
    temp = with_rope_scaling(model, "yarn_temperature", factor).blocks[0].attention.position
    q, k = torch.randn(1, 2, 32, 8), torch.randn(1, 2, 32, 8)
    positions = torch.arange(32)
    mscale = 0.1 * math.log(factor) + 1.0
    yarn_freq, _ = rope_frequencies(
        "yarn", 8, 10000.0, dtype=torch.float64, factor=factor, original_max_position_embeddings=8
    )
    plain_freq = 10000.0 ** (-torch.arange(0, 8, 2, dtype=torch.float64) / 8)

    def rotate(x, inv_freq, scale):  # a float64 rotation by hand, half layout
        angle = positions[:, None].double() * inv_freq
        a, b = x.double()[..., :4], x.double()[..., 4:]
        cos, sin = angle.cos() * scale, angle.sin() * scale
        return torch.cat([a * cos - b * sin, a * sin + b * cos], -1)

    for scheme, inv_freq, scale in (
        (full, yarn_freq, mscale),
        (freqs, yarn_freq, 1.0),
        (temp, plain_freq, mscale),
    ):
        q_out, k_out = scheme.transform_qk(q, k, positions, positions)
        assert torch.allclose(q_out.double(), rotate(q, inv_freq, scale), atol=1e-5)
        assert torch.allclose(k_out.double(), rotate(k, inv_freq, scale), atol=1e-5)


def test_attention_beyond_matches_weights_summed_by_hand():
    torch.manual_seed(0)
    model = TinyDecoder("alibi", vocab_size=7, max_len=8, dim=16, num_heads=4).eval()
    tokens = torch.randint(7, (3, 20))
    shares = attention_beyond(model, tokens, 8, batch_size=2)
    assert shares.shape == (2, 4)
    # by hand: layer 0 sees the embeddings, layer 1 the first block's output
    with torch.no_grad():
        x = model.embedding(tokens)
        for layer, block in enumerate(model.blocks):
            weights = block.attention.attention_weights(block.norm1(x), causal=True)
            expected = torch.zeros(4, dtype=torch.float64)
            for i in range(8, 20):
                expected += weights[:, :, i, : i - 8 + 1].double().sum(-1).mean(0)
            assert torch.allclose(shares[layer], expected / 12, atol=1e-6)
            x = block(x)
    # with the queries zeroed, attention is softmax of ALiBi's bias alone: the share 8 or
    # more back is a geometric sum, per head slope m (1/4, 1/16, 1/64, 1/256 here)
    for block in model.blocks:
        torch.nn.init.zeros_(block.attention.q_proj.weight)
        torch.nn.init.zeros_(block.attention.q_proj.bias)
    shares = attention_beyond(model, tokens, 8)
    for head, slope in enumerate((1 / 4, 1 / 16, 1 / 64, 1 / 256)):
        expected = 0.0
        for i in range(8, 20):
            weights = [math.exp(-slope * (i - j)) for j in range(i + 1)]
            expected += sum(weights[: i - 8 + 1]) / sum(weights) / 12
        assert float(shares[0, head]) == pytest.approx(expected, abs=1e-6)
    # a window of 8 hides exactly those keys
    assert float(attention_beyond(model, tokens, 8, window=8).abs().max()) < 1e-7
    with pytest.raises(ValueError, match="distance"):
        attention_beyond(model, tokens, 20)


def _square(x):
    return x * x


def test_map_jobs_keeps_the_order_in_processes():
    assert map_jobs(_square, [(3,), (1,), (2,)], workers=2) == [9, 1, 4]
    assert map_jobs(_square, [(3,)], workers=1) == [9]
    with pytest.raises(ValueError, match="workers"):
        map_jobs(_square, [(3,)], workers=0)


def test_yarn_paper_frequencies_reject_bad_input():
    with pytest.raises(ValueError, match="factor"):
        yarn_paper_frequencies(16, 10000.0, 0.5, 256)
    with pytest.raises(ValueError, match="beta"):
        yarn_paper_frequencies(16, 10000.0, 2.0, 256, alpha=2.0, beta=1.0)
    with pytest.raises(TypeError, match="original_length"):
        yarn_paper_frequencies(16, 10000.0, 2.0, 256.0)


def test_frequency_rotary_equals_rotary_embedding_with_the_same_frequencies():
    torch.manual_seed(0)
    q, k = torch.randn(2, 3, 40, 16), torch.randn(2, 3, 40, 16)
    positions = torch.arange(40)
    params = {"factor": 4.0, "original_max_position_embeddings": 8}
    inv_freq, factor = rope_frequencies("yarn", 16, 10000.0, dtype=torch.float64, **params)
    ours = FrequencyRotary(inv_freq, factor).transform_qk(q, k, positions, positions)
    theirs = RotaryEmbedding(16, scaling="yarn", scaling_params=params).transform_qk(
        q, k, positions, positions
    )
    for a, b in zip(ours, theirs, strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    with pytest.raises(TypeError, match="inv_freq"):
        FrequencyRotary(torch.arange(8))
    with pytest.raises(ValueError, match="attention_factor"):
        FrequencyRotary(inv_freq, 0.0)


def test_rope_scaling_keeps_weights_and_is_identity_at_factor_one():
    torch.manual_seed(0)
    model = TinyDecoder("rope", vocab_size=5, max_len=8, dim=16, num_heads=2).eval()
    tokens = torch.randint(5, (2, 8))
    for kind in ROPE_READINGS:
        scaled = with_rope_scaling(model, kind, 1.0)
        state, scaled_state = model.state_dict(), scaled.state_dict()
        assert state.keys() == scaled_state.keys()
        assert all(torch.equal(state[k], scaled_state[k]) for k in state)
        with torch.no_grad():
            assert torch.allclose(scaled(tokens), model(tokens), atol=1e-5)
        with torch.no_grad():  # factor 4 changes the rotations, hence the logits
            assert not torch.allclose(
                with_rope_scaling(model, kind, 4.0)(tokens), model(tokens), atol=1e-3
            )


def test_rope_scaling_rejects_bad_input():
    rope = TinyDecoder("rope", vocab_size=5, max_len=8, dim=16, num_heads=2)
    alibi = TinyDecoder("alibi", vocab_size=5, max_len=8, dim=16, num_heads=2)
    with pytest.raises(ValueError, match="scheme"):
        with_rope_scaling(alibi, "linear", 2.0)
    with pytest.raises(ValueError, match="kind"):
        with_rope_scaling(rope, "llama4", 2.0)
    with pytest.raises(ValueError, match="factor"):
        with_rope_scaling(rope, "ntk", 0.5)
    with pytest.raises(TypeError, match="model"):
        with_rope_scaling(torch.nn.Linear(2, 2), "ntk", 2.0)


# --- training and evaluation ------------------------------------------------------------


def test_a_tiny_run_learns():
    model, losses = train("rope", TINY, seed=0)
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < 0.5 * first
    tokens, targets = delayed_copy_batch(
        32, 8, offset=2, vocab_size=6, generator=torch.Generator().manual_seed(1)
    )
    accuracy, loss = evaluate(model, tokens, targets)
    assert accuracy.shape == (8,)
    assert torch.isnan(accuracy[:2]).all()  # no targets before the offset
    assert float(accuracy[2:].mean()) > 1 / 6 + 0.3  # well above chance
    assert loss < first


def test_a_tiny_run_learns_both_tasks():
    model, losses = train("rope", TINY_NEEDLE, seed=0)
    assert sum(losses[-10:]) / 10 < 0.3 * sum(losses[:10]) / 10
    batch = TINY_NEEDLE.batch(32, 16, torch.Generator().manual_seed(2))
    with cpu_threads(1):
        probes = evaluate_probes(model, batch, TINY_NEEDLE)
    assert probes.copy.shape == probes.needle.shape == (16,)
    assert float(probes.copy.nanmean()) > 0.9
    assert probes.near > 0.9
    assert math.isnan(probes.far)  # no position is 16 or more after a needle at < 4


def test_evaluate_probes_counts_by_hand():
    """A model that always answers copy class 0 and needle value 1."""

    class Constant(torch.nn.Module):
        def forward(self, tokens, *, window=None):
            logits = torch.zeros(*tokens.shape, TINY_NEEDLE.output_size)
            logits[..., 0] = 1.0  # copy: token 0
            logits[..., TINY_NEEDLE.input_size + 1] = 1.0  # needle: value 1
            return logits

    tokens = torch.tensor([[0, 7, 0, 1, 0, 0, 2, 0], [6, 0, 0, 0, 0, 0, 0, 0]])
    copy = torch.full_like(tokens, IGNORE_INDEX)
    copy[:, 2:] = tokens[:, :-2]
    needle = torch.full_like(tokens, IGNORE_INDEX)
    needle[0, 2:], needle[1, 1:] = 1, 0  # row 0: needle 7 (value 1) at 1; row 1: 6 at 0
    batch = NeedleCopyBatch(tokens, copy, needle, torch.tensor([1, 0]))
    config = ExperimentConfig(**{**TINY_NEEDLE.__dict__, "train_length": 4})
    probes = evaluate_probes(Constant(), batch, config)
    # copy targets at t = 2..7: row 0 [0, 7, 0, 1, 0, 0], row 1 [6, 0, 0, 0, 0, 0]
    assert probes.copy.tolist()[2:] == [0.5, 0.5, 1.0, 0.5, 1.0, 1.0]
    # needle: row 0 right everywhere (value 1), row 1 wrong everywhere (value 0);
    # distance d holds row 0's position 1 + d and row 1's position d
    expected = [float("nan"), 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.0]
    expected = torch.tensor(expected, dtype=torch.float64)
    assert torch.allclose(probes.needle, expected, equal_nan=True)
    # near: distance < 4: row 0 has 3 (t = 2..4), row 1 has 3 (t = 1..3): 3 / 6
    assert probes.near == 0.5
    # far: row 0 t = 5..7 (3 right), row 1 t = 4..7 (4 wrong): 3 / 7
    assert probes.far == pytest.approx(3 / 7, abs=1e-15)


def test_training_is_deterministic_under_a_seed():
    short = ExperimentConfig(**{**TINY_NEEDLE.__dict__, "steps": 15})
    model_a, losses_a = train("t5", short, seed=3)
    model_b, losses_b = train("t5", short, seed=3)
    _, losses_c = train("t5", short, seed=4)
    assert losses_a == losses_b
    for (name, a), (_, b) in zip(
        model_a.state_dict().items(), model_b.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    assert losses_a != losses_c


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="offset"):
        ExperimentConfig(train_length=4, offset=4)
    with pytest.raises(ValueError, match="eval_factors"):
        ExperimentConfig(eval_factors=(1, 0))
    with pytest.raises(ValueError, match="lr"):
        ExperimentConfig(lr=-1.0)
    with pytest.raises(TypeError, match="steps"):
        ExperimentConfig(steps=1.5)
    with pytest.raises(ValueError, match="needle_values"):
        ExperimentConfig(needle_values=1)


def test_run_experiment_marks_the_learned_table_undefined_past_its_length():
    config = ExperimentConfig(**{**TINY_NEEDLE.__dict__, "steps": 2})
    sweep = {
        "seeds": (0, 1),
        "schemes": ("learned", "rope"),
        "rope_scalings": ROPE_READINGS,
        "window": 16,
    }
    result = run_experiment(config, **sweep)
    assert [len(result.models[name]) for name in ("learned", "rope")] == [2, 2]
    assert result.names == [
        "learned",
        "rope",
        *(f"rope+{kind}" for kind in ROPE_READINGS),
        "learned+window",
        "rope+window",
    ]
    assert result.accuracy["learned"][32] is None
    assert result.summary("learned", 32) is None
    assert result.per_position["learned"] is None
    assert len(result.accuracy["learned"][16]) == 2
    mean, spread = result.summary("rope", 32)
    assert 0.0 <= mean <= 1.0
    assert spread >= 0.0
    assert result.per_position["rope+yarn_paper"].shape == (32,)
    assert result.needle_by_distance["rope"].shape == (32,)
    assert all(math.isnan(v) for v in result.values("rope", 16, "far"))  # none that far
    assert not any(math.isnan(v) for v in result.values("rope", 32, "far"))
    # at the training length every scaling is plain RoPE (factor 1), and so is the window
    for name in [f"rope+{kind}" for kind in ROPE_READINGS] + ["rope+window"]:
        assert result.accuracy[name][16] == result.accuracy["rope"][16], name
    assert result.paired("rope", "rope", 32).mean == 0.0
    # the same run on two worker processes gives the same numbers
    spread = run_experiment(config, **sweep, workers=2)
    assert repr(spread.scores) == repr(result.scores)  # NaN where no far needle: by text
    with pytest.raises(ValueError, match="not defined"):
        result.paired("learned", "rope", 32)
    with pytest.raises(ValueError, match="seeds"):
        run_experiment(config, seeds=(0, 0))
    with pytest.raises(ValueError, match="scheme"):
        run_experiment(config, seeds=(0,), schemes=("sine",))
    with pytest.raises(ValueError, match="rope scaling"):
        run_experiment(config, seeds=(0,), schemes=("rope",), rope_scalings=("dynamic",))


def test_scalings_are_a_subset_of_the_readings():
    assert set(ROPE_SCALINGS) < set(ROPE_READINGS)


def test_cpu_threads_restores_the_thread_count():
    before = torch.get_num_threads()
    with cpu_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="num_threads"), cpu_threads(0):
        pass


def test_learning_rate_warms_up_linearly_then_decays_to_zero_by_hand():
    from pecode.experiments.training import learning_rate

    # 100 steps: warm-up over the first 10, then half a cosine over the other 90
    assert [learning_rate(s, 100, 2.0) for s in (0, 4, 9)] == pytest.approx([0.2, 1.0, 2.0])
    assert learning_rate(10, 100, 2.0) == pytest.approx(2.0)
    assert learning_rate(55, 100, 2.0) == pytest.approx(1.0)  # halfway through the decay
    assert learning_rate(99, 100, 2.0) == pytest.approx(1.0 - math.cos(math.pi / 90), abs=1e-12)


def test_fit_trains_calls_back_once_per_step_and_leaves_eval_mode():
    from pecode.experiments.training import fit

    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    x = torch.randn(64, 3)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]])
    calls = []
    losses = fit(
        model,
        lambda: torch.nn.functional.mse_loss(model(x), y),
        steps=200,
        lr=0.1,
        on_step=lambda: calls.append(model.training),
    )
    assert len(losses) == 200
    assert calls == [True] * 200
    assert losses[-1] < losses[0] / 100
    assert not model.training
