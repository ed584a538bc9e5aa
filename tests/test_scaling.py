"""pecode.scaling against float64 loops, hand-derived published numbers, and its errors."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pecode.reference.scaling import (
    default_inv_freq_loop,
    dynamic_inv_freq_loop,
    llama3_inv_freq_loop,
    ntk_inv_freq_loop,
    pi_angles_loop,
    yarn_boundaries_scan,
    yarn_inv_freq_code_loop,
    yarn_inv_freq_paper_loop,
)
from pecode.rope import rope_cos_sin, rope_inv_freq
from pecode.scaling import (
    PUBLISHED_CONFIGS,
    SCALING_KINDS,
    rope_frequencies,
    unseen_angle_pairs,
    yarn_attention_factor,
    yarn_correction_range,
    yarn_get_mscale,
)

F64 = torch.float64


def freqs(kind, dim=128, base=10000.0, **params):
    return rope_frequencies(kind, dim, base, dtype=F64, **params)


def test_default_is_rope_inv_freq():
    inv_freq, factor = rope_frequencies("default", 64)
    assert torch.equal(inv_freq, rope_inv_freq(64))
    assert factor == 1.0
    assert torch.allclose(freqs("default", 64)[0], default_inv_freq_loop(64, 10000.0), rtol=1e-15)


def test_float32_by_default():
    assert rope_frequencies("yarn", 64, factor=4.0, original_max_position_embeddings=512)[
        0
    ].dtype == (torch.float32)


@given(
    factor=st.floats(1.0, 64.0),
    dim=st.sampled_from([4, 16, 64, 128]),
    positions=st.lists(st.integers(0, 100_000), min_size=1, max_size=5),
)
@settings(max_examples=40, deadline=None)
def test_linear_scaling_equals_dividing_positions(factor, dim, positions):
    inv_freq, attention_factor = freqs("linear", dim, factor=factor)
    cos, sin = rope_cos_sin(torch.tensor(positions), inv_freq)
    angles = pi_angles_loop([float(p) for p in positions], dim, 10000.0, factor)
    assert attention_factor == 1.0
    assert torch.allclose(cos, angles.cos(), atol=1e-9)
    assert torch.allclose(sin, angles.sin(), atol=1e-9)


@given(factor=st.floats(1.0, 128.0), dim=st.sampled_from([4, 8, 64, 128, 256]))
@settings(max_examples=40, deadline=None)
def test_ntk_keeps_highest_and_divides_lowest_by_factor(factor, dim):
    inv_freq, _ = freqs("ntk", dim, factor=factor)
    plain = default_inv_freq_loop(dim, 10000.0)
    assert math.isclose(inv_freq[0].item(), 1.0, rel_tol=1e-15)
    assert math.isclose(inv_freq[-1].item(), plain[-1].item() / factor, rel_tol=1e-12)
    assert torch.allclose(inv_freq, ntk_inv_freq_loop(dim, 10000.0, factor), rtol=1e-12)
    # every pair in between is divided by less than the factor
    ratio = plain / inv_freq
    assert bool(((ratio >= 1 - 1e-12) & (ratio <= factor * (1 + 1e-12))).all())


@pytest.mark.parametrize("seq_len", [1, 100, 2047, 2048])
def test_dynamic_equals_default_at_and_below_trained_length(seq_len):
    inv_freq, _ = freqs(
        "dynamic", factor=4.0, original_max_position_embeddings=2048, seq_len=seq_len
    )
    assert torch.equal(inv_freq, freqs("default")[0])


@pytest.mark.parametrize("seq_len", [2049, 4096, 8192, 100_000])
def test_dynamic_past_trained_length_matches_loop_and_grows(seq_len):
    inv_freq, _ = freqs(
        "dynamic", factor=4.0, original_max_position_embeddings=2048, seq_len=seq_len
    )
    reference = dynamic_inv_freq_loop(128, 10000.0, 4.0, 2048, seq_len)
    assert torch.allclose(inv_freq, reference, rtol=1e-12)
    assert inv_freq[-1] < freqs("default")[0][-1]


def test_dynamic_default_seq_len_is_the_original():
    a = freqs("dynamic", factor=4.0, original_max_position_embeddings=2048)[0]
    assert torch.equal(a, freqs("default")[0])


def test_yarn_boundaries_for_llama_4096():
    # Peng et al. 2023: L = 4096, b = 10000, |D| = 128, alpha = 1, beta = 32. By hand:
    # r_i = 4096 / (2π 10000^(i/64)); r_20 = 36.7 >= 32 > r_21 = 31.7 and
    # r_45 = 1.005 > 1 >= r_46 = 0.87, so the ramp runs from pair 20 to pair 46.
    turns = [4096 / (2 * math.pi * 10000 ** (i / 64)) for i in (20, 21, 45, 46)]
    assert turns[0] > 32 > turns[1]
    assert turns[2] > 1 > turns[3]
    assert yarn_correction_range(128, 10000.0, 4096, 32, 1) == (20, 46)
    assert yarn_boundaries_scan(128, 10000.0, 4096) == (20, 46)


@pytest.mark.parametrize(
    ("dim", "base", "original"),
    [(128, 10000.0, 4096), (64, 10000.0, 2048), (128, 1_000_000.0, 32768), (128, 500000.0, 8192)],
)
def test_yarn_closed_form_range_equals_scan(dim, base, original):
    assert yarn_correction_range(dim, base, original, 32, 1) == yarn_boundaries_scan(
        dim, base, original
    )


@pytest.mark.parametrize("factor", [2.0, 4.0, 16.0, 32.0])
def test_yarn_matches_code_loop_and_paper_outside_ramp(factor):
    inv_freq, attention_factor = freqs("yarn", factor=factor, original_max_position_embeddings=4096)
    assert torch.allclose(inv_freq, yarn_inv_freq_code_loop(128, 10000.0, factor, 4096), rtol=1e-12)
    paper = yarn_inv_freq_paper_loop(128, 10000.0, factor, 4096)
    outside = torch.cat((torch.arange(0, 21), torch.arange(46, 64)))
    assert torch.allclose(inv_freq[outside], paper[outside], rtol=1e-12)
    # inside the ramp the code (linear in the index) and the paper (linear in r) differ
    assert not torch.allclose(inv_freq[21:46], paper[21:46], rtol=1e-3)
    assert math.isclose(attention_factor, 0.1 * math.log(factor) + 1, rel_tol=1e-15)


def test_yarn_temperature_published_values():
    # sqrt(1/t) = 0.1 ln s + 1: s = 4 -> 1.1386, s = 16 -> 1.2773, s = 32 -> 1.3466
    assert round(yarn_get_mscale(4.0), 4) == 1.1386
    assert round(yarn_get_mscale(16.0), 4) == 1.2773
    assert round(yarn_get_mscale(32.0), 4) == 1.3466
    assert yarn_get_mscale(1.0) == 1.0


def test_yarn_mscale_ratio_and_explicit_factor():
    # DeepSeek-V2 style: both given -> ratio; equal values -> exactly 1
    ratio = yarn_attention_factor(40.0, 0.707, 0.707)
    assert ratio == 1.0
    expected = (0.1 * 1.0 * math.log(40) + 1) / (0.1 * 0.5 * math.log(40) + 1)
    assert math.isclose(yarn_attention_factor(40.0, 1.0, 0.5), expected)
    _, factor = freqs(
        "yarn", factor=4.0, original_max_position_embeddings=4096, attention_factor=1.5
    )
    assert factor == 1.5


def test_llama3_matches_loop_and_published_bands():
    config = dict(PUBLISHED_CONFIGS["llama3.1"])
    config.pop("kind")
    base = config.pop("base")
    inv_freq, attention_factor = freqs("llama3", base=base, **config)
    assert attention_factor == 1.0
    reference = llama3_inv_freq_loop(128, 500000.0, 8.0, 1.0, 4.0, 8192)
    assert torch.allclose(inv_freq, reference, rtol=1e-12)
    plain = freqs("default", base=500000.0)[0]
    wavelength = 2 * math.pi / plain
    high = wavelength < 8192 / 4  # kept
    low = wavelength > 8192 / 1  # divided by 8
    assert torch.equal(inv_freq[high], plain[high])
    assert torch.allclose(inv_freq[low], plain[low] / 8, rtol=1e-15)
    middle = ~(high | low)
    ratio = plain[middle] / inv_freq[middle]
    assert bool(((ratio > 1) & (ratio < 8)).all())


def test_llama3_has_no_jump_across_band_edges():
    # dense sweep of wavelengths through the public function: the scaled frequency,
    # as a function of the trained wavelength, has no jump larger than its neighbours'
    dim, base = 4096, 500000.0
    inv_freq, _ = freqs(
        "llama3",
        dim=dim,
        base=base,
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )
    plain = freqs("default", dim=dim, base=base)[0]
    log_ratio = torch.log(plain / inv_freq)  # 0 in the high band, ln 8 in the low band
    steps = log_ratio.diff().abs()
    assert steps.max().item() < 0.02  # ln 8 spread over many pairs, never one jump


def test_base_change_published_bases():
    for name, base in [("llama2_long", 500000.0), ("code_llama", 1_000_000.0)]:
        config = dict(PUBLISHED_CONFIGS[name])
        kind = config.pop("kind")
        trained = config.pop("base")
        assert trained == 10000.0
        inv_freq, factor = freqs(kind, base=trained, **config)
        assert torch.allclose(inv_freq, default_inv_freq_loop(128, base), rtol=1e-15)
        assert factor == 1.0


def test_qwen3_published_yarn_config():
    config = dict(PUBLISHED_CONFIGS["qwen3_yarn"])
    kind = config.pop("kind")
    base = config.pop("base")
    inv_freq, factor = freqs(kind, base=base, **config)
    assert round(factor, 4) == 1.1386
    assert torch.allclose(
        inv_freq, yarn_inv_freq_code_loop(128, 1_000_000.0, 4.0, 32768), rtol=1e-12
    )


def test_registry_lists_the_contract_kinds():
    assert {"default", "linear", "ntk", "dynamic", "yarn", "llama3"} <= set(SCALING_KINDS)


@pytest.mark.parametrize(
    ("kind", "params", "message"),
    [
        ("nope", {}, "accepted kinds"),
        ("linear", {}, "missing \\['factor'\\]"),
        ("linear", {"factor": 2.0, "beta_fast": 3}, "accepts \\['factor'\\]"),
        ("default", {"factor": 2.0}, "no parameters"),
        ("yarn", {"factor": 2.0}, "original_max_position_embeddings"),
        ("linear", {"factor": 0.5}, "factor must be >= 1"),
        ("ntk", {"factor": float("nan")}, "factor must be finite"),
        (
            "yarn",
            {
                "factor": 2.0,
                "original_max_position_embeddings": 4096,
                "beta_fast": 1,
                "beta_slow": 2,
            },
            "beta_fast > beta_slow",
        ),
        (
            "yarn",
            {"factor": 2.0, "original_max_position_embeddings": 4096, "mscale": 1.0},
            "both mscale and mscale_all_dim",
        ),
        (
            "yarn",
            {"factor": 2.0, "original_max_position_embeddings": 4096, "attention_factor": -1.0},
            "attention_factor must be positive",
        ),
        (
            "llama3",
            {
                "factor": 8.0,
                "low_freq_factor": 4.0,
                "high_freq_factor": 1.0,
                "original_max_position_embeddings": 8192,
            },
            "high_freq_factor > low_freq_factor",
        ),
        ("dynamic", {"factor": 2.0, "original_max_position_embeddings": 0}, "must be positive"),
        ("base_change", {"rope_theta": 0.5}, "base must be greater than 1"),
    ],
)
def test_bad_input_raises_value_error(kind, params, message):
    with pytest.raises(ValueError, match=message):
        freqs(kind, **params)


def test_ntk_needs_four_dims_and_types_are_checked():
    with pytest.raises(ValueError, match="at least 4"):
        freqs("ntk", dim=2, factor=2.0)
    with pytest.raises(TypeError, match="factor must be a number"):
        freqs("linear", factor="2")
    with pytest.raises(TypeError, match="original_max_position_embeddings must be an int"):
        freqs("dynamic", factor=2.0, original_max_position_embeddings=2048.0)
    with pytest.raises(TypeError, match="dtype"):
        rope_frequencies("default", 8, dtype=torch.float16)
    with pytest.raises(ValueError, match="dim must be a positive even"):
        rope_frequencies("default", 7)


def test_unseen_angle_pairs_by_hand():
    trained = torch.tensor([1.0, 0.01, 0.001], dtype=F64)
    # L0 = 100: pair 0 turned 100 rad (> 2π, all seen); pair 1 reached 1 rad; pair 2, 0.1
    assert unseen_angle_pairs(trained, trained, 100, 400).tolist() == [False, True, True]
    assert unseen_angle_pairs(trained, trained / 4, 100, 400).tolist() == [False, False, False]
    halfway = torch.tensor([1.0, 0.01 / 4, 0.001 / 2], dtype=F64)
    assert unseen_angle_pairs(trained, halfway, 100, 400).tolist() == [False, False, True]
    with pytest.raises(ValueError, match="same shape"):
        unseen_angle_pairs(trained, trained[:2], 100, 400)
    with pytest.raises(ValueError, match="length must be positive"):
        unseen_angle_pairs(trained, trained, 100, 0)
