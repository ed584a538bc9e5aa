"""pecode.scaling against float64 loops, Hugging Face transformers' rope functions fed
Hugging Face-shaped ``rope_scaling`` blocks, values derived by hand, and its errors."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pecode.reference.scaling import (
    default_inv_freq_loop,
    dynamic_inv_freq_loop,
    dynamic_ntk_paper_inv_freq_loop,
    llama3_inv_freq_loop,
    ntk_inv_freq_loop,
    pi_angles_loop,
    yarn_boundaries_scan,
    yarn_inv_freq_code_loop,
    yarn_inv_freq_paper_loop,
)
from pecode.rope import rope_cos_sin, rope_inv_freq
from pecode.scaling import (
    HF_ROPE_TYPES,
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


def _hugging_face_rope(max_position_embeddings, rope_scaling, seq_len=None):
    """HF transformers' own frequency function for a Llama config with head_dim 128."""
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(
        hidden_size=256,
        num_attention_heads=2,
        max_position_embeddings=max_position_embeddings,
        rope_theta=10000.0,
        rope_scaling=rope_scaling,
    )
    kind = rope_scaling["rope_type"]
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[kind](config, "cpu", seq_len=seq_len)
    return inv_freq.to(F64), float(attention_factor)


@pytest.mark.parametrize("seq_len", [6144, 8192, 16384, 50_000])
def test_dynamic_is_hugging_faces_form_not_the_yarn_papers(seq_len):
    # pecode's "dynamic" is the bracket s L/L0 - (s - 1) of emozilla's post and HF; the
    # YaRN paper (§3.3) uses the NTK rule with max(1, L/L0), which differs past L0 for
    # s > 1 and is pecode's rule with factor 1.
    ours = freqs("dynamic", factor=4.0, original_max_position_embeddings=4096, seq_len=seq_len)[0]
    paper = dynamic_ntk_paper_inv_freq_loop(128, 10000.0, 4096, seq_len)
    assert not torch.allclose(ours, paper, rtol=1e-3)
    assert ours[-1] < paper[-1]  # the HF form interpolates more strongly
    factor_one = freqs(
        "dynamic", factor=1.0, original_max_position_embeddings=4096, seq_len=seq_len
    )
    assert torch.allclose(factor_one[0], paper, rtol=1e-12)


@pytest.mark.parametrize("seq_len", [None, 4096, 8192, 16384])
def test_dynamic_matches_hugging_face(seq_len):
    hf, hf_factor = _hugging_face_rope(4096, {"rope_type": "dynamic", "factor": 4.0}, seq_len)
    ours = freqs("dynamic", factor=4.0, original_max_position_embeddings=4096, seq_len=seq_len)
    assert torch.allclose(hf, ours[0], rtol=1e-6)  # HF computes in float32
    assert hf_factor == ours[1] == 1.0
    if seq_len is not None and seq_len > 4096:
        paper = dynamic_ntk_paper_inv_freq_loop(128, 10000.0, 4096, seq_len)
        assert not torch.allclose(hf, paper, rtol=1e-3)


def test_dynamic_at_four_times_the_trained_length_is_static_ntk_with_factor_13():
    # s L/L0 - (s - 1) = 4 * 4 - 3 = 13: the HF form at 4 L0 is the NTK rule with factor
    # 13, which leaves no pair at an unseen angle; the paper's form there is the NTK rule
    # with factor 4, which does (chapter 11, Figure 11.3).
    length = 4 * 4096
    plain = freqs("default")[0]
    ours = freqs("dynamic", factor=4.0, original_max_position_embeddings=4096, seq_len=length)[0]
    assert torch.allclose(ours, ntk_inv_freq_loop(128, 10000.0, 13.0), rtol=1e-12)
    assert int(unseen_angle_pairs(plain, ours, 4096, length).sum()) == 0
    paper = dynamic_ntk_paper_inv_freq_loop(128, 10000.0, 4096, length)
    assert torch.allclose(paper, ntk_inv_freq_loop(128, 10000.0, 4.0), rtol=1e-12)
    assert int(unseen_angle_pairs(plain, paper, 4096, length).sum()) > 0


def test_yarn_boundaries_for_llama_4096():
    # Peng et al. 2023: L = 4096, b = 10000, |D| = 128, alpha = 1, beta = 32. By hand:
    # r_i = 4096 / (2π 10000^(i/64)); r_20 = 36.7 >= 32 > r_21 = 31.7 and
    # r_45 = 1.0039 > 1 >= r_46 = 0.869, so the ramp runs from pair 20 to pair 46.
    turns = [4096 / (2 * math.pi * 10000 ** (i / 64)) for i in (20, 21, 45, 46)]
    assert turns[0] > 32 > turns[1]
    assert turns[2] > 1 > turns[3]
    assert [round(r, 4) for r in (turns[2], turns[3])] == [1.0039, 0.8693]
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


def test_yarn_uses_factor_as_given():
    # A config block {"factor": 4, "original_max_position_embeddings": 4096} in a model
    # whose max_position_embeddings is 32768 = 8 x 4096. pecode uses factor 4 with the ramp
    # from 4096 (as transformers >= 4.56); not factor 32768/4096 = 8 (transformers 4.51 to
    # 4.55), nor factor 4 with the ramp from 32768 (transformers 4.43 to 4.50).
    ours, attention_factor = freqs("yarn", factor=4.0, original_max_position_embeddings=4096)
    assert torch.allclose(ours, yarn_inv_freq_code_loop(128, 10000.0, 4.0, 4096), rtol=1e-12)
    assert not torch.allclose(ours, yarn_inv_freq_code_loop(128, 10000.0, 8.0, 4096), rtol=1e-3)
    assert not torch.allclose(ours, yarn_inv_freq_code_loop(128, 10000.0, 4.0, 32768), rtol=1e-3)
    assert math.isclose(attention_factor, 0.1 * math.log(4.0) + 1, rel_tol=1e-15)
    with pytest.raises(ValueError, match=r"does not take \['max_position_embeddings'\]"):
        freqs(
            "yarn", factor=4.0, original_max_position_embeddings=4096, max_position_embeddings=32768
        )


def test_yarn_block_meant_three_things_across_hugging_face_releases():
    # The same block, read by the installed transformers. What each release range does was
    # read in src/transformers/modeling_rope_utils.py of the released wheels (issue #38224,
    # PR #40320); this test checks the installed one against the YaRN loop.
    transformers = pytest.importorskip("transformers")
    from packaging.version import Version

    block = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
    hf, hf_attention = _hugging_face_rope(32768, block)
    version = Version(transformers.__version__)
    if version < Version("4.51"):
        factor, ramp_from = 4.0, 32768  # original_max_position_embeddings ignored
    elif version < Version("4.56"):
        factor, ramp_from = 8.0, 4096  # factor replaced by 32768 / 4096
    else:
        factor, ramp_from = 4.0, 4096  # factor as given: pecode's reading
    expected = yarn_inv_freq_code_loop(128, 10000.0, factor, ramp_from)
    assert torch.allclose(hf, expected, rtol=1e-6)  # HF computes in float32
    assert math.isclose(hf_attention, 0.1 * math.log(factor) + 1, rel_tol=1e-12)
    ours, _ = freqs("yarn", factor=4.0, original_max_position_embeddings=4096)
    assert torch.allclose(hf, ours, rtol=1e-6) == (version >= Version("4.56"))


def _hugging_face_block(block, max_position_embeddings, rope_theta=10000.0, seq_len=None):
    """transformers' frequencies and attention factor for a Llama config (head_dim 128) whose
    ``rope_scaling`` is ``block``, read by ``ROPE_INIT_FUNCTIONS[block["rope_type"]]``."""
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = LlamaConfig(
        hidden_size=256,
        num_attention_heads=2,
        max_position_embeddings=max_position_embeddings,
        rope_theta=rope_theta,
        rope_scaling=dict(block),
    )
    inv_freq, attention_factor = ROPE_INIT_FUNCTIONS[block["rope_type"]](
        config, "cpu", seq_len=seq_len
    )
    return inv_freq.to(F64), float(attention_factor)


def _pecode_arguments(block, max_position_embeddings):
    """The translation pecode.scaling's docstring gives: the block's ``rope_type`` is the
    kind, its other entries are the parameters, and for ``dynamic`` the trained length,
    which transformers reads from the top-level ``max_position_embeddings``, is passed as
    ``original_max_position_embeddings``."""
    params = {key: value for key, value in block.items() if key != "rope_type"}
    if block["rope_type"] == "dynamic":
        params["original_max_position_embeddings"] = max_position_embeddings
    return block["rope_type"], params


# (rope_scaling block, top-level max_position_embeddings, rope_theta, current length)
HUGGING_FACE_BLOCKS = {
    "linear": ({"rope_type": "linear", "factor": 4.0}, 4096, 10000.0, None),
    "dynamic, at init": ({"rope_type": "dynamic", "factor": 4.0}, 4096, 10000.0, None),
    "dynamic, 4 L0": ({"rope_type": "dynamic", "factor": 4.0}, 4096, 10000.0, 16384),
    "dynamic, 2.5 L0": ({"rope_type": "dynamic", "factor": 2.0}, 2048, 500000.0, 5120),
    "yarn, Qwen3 card": (
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768},
        131072,
        1_000_000.0,
        None,
    ),
    "yarn, betas": (
        {
            "rope_type": "yarn",
            "factor": 8.0,
            "original_max_position_embeddings": 4096,
            "beta_fast": 16.0,
            "beta_slow": 2.0,
        },
        32768,
        10000.0,
        None,
    ),
    "yarn, DeepSeek-V2 mscales": (
        {
            "rope_type": "yarn",
            "factor": 40.0,
            "original_max_position_embeddings": 4096,
            "mscale": 0.707,
            "mscale_all_dim": 0.707,
        },
        163840,
        10000.0,
        None,
    ),
    "yarn, unequal mscales": (
        {
            "rope_type": "yarn",
            "factor": 40.0,
            "original_max_position_embeddings": 4096,
            "mscale": 1.0,
            "mscale_all_dim": 0.5,
        },
        163840,
        10000.0,
        None,
    ),
    "yarn, attention_factor": (
        {
            "rope_type": "yarn",
            "factor": 4.0,
            "original_max_position_embeddings": 4096,
            "attention_factor": 1.5,
        },
        16384,
        10000.0,
        None,
    ),
    "llama3, Llama 3.1": (
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        131072,
        500000.0,
        None,
    ),
}


@pytest.mark.parametrize("name", list(HUGGING_FACE_BLOCKS))
def test_hugging_face_shaped_blocks_give_hugging_faces_frequencies(name):
    # transformers (an independent implementation) reads the block; pecode gets the same
    # block through the documented translation. Frequencies agree to transformers' float32
    # rounding, attention factors (Python floats in both) to 1e-12.
    block, max_positions, theta, seq_len = HUGGING_FACE_BLOCKS[name]
    hf, hf_factor = _hugging_face_block(block, max_positions, theta, seq_len)
    kind, params = _pecode_arguments(block, max_positions)
    if seq_len is not None:
        params["seq_len"] = seq_len
    ours, factor = freqs(kind, base=theta, **params)
    assert torch.allclose(hf, ours, rtol=1e-6, atol=0.0)
    assert math.isclose(hf_factor, factor, rel_tol=1e-12)


def test_kinds_shared_with_hugging_face():
    # The module docstring's list: every rope type of transformers (its functions, plus
    # "default", which each model's rotary embedding computes) is a kind of pecode and an
    # entry of HF_ROPE_TYPES; pecode's ntk and base_change are not rope types there.
    pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    hf_types = set(ROPE_INIT_FUNCTIONS) | {"default"}
    assert hf_types == set(HF_ROPE_TYPES)
    assert hf_types <= set(SCALING_KINDS)
    assert set(SCALING_KINDS) - hf_types == {"ntk", "base_change"}


def test_hugging_face_blocks_that_pecode_reads_differently():
    # Each departure the module docstring lists, shown on transformers' own reading.
    s, l0 = 4.0, 4096
    # dynamic: transformers takes L0 from max_position_embeddings; pecode needs it named
    block = {"rope_type": "dynamic", "factor": s}
    with pytest.raises(ValueError, match="missing \\['original_max_position_embeddings'\\]"):
        freqs("dynamic", factor=s)
    hf, _ = _hugging_face_block(block, l0, seq_len=4 * l0)
    assert torch.allclose(hf, dynamic_inv_freq_loop(128, 10000.0, s, l0, 4 * l0), rtol=1e-6)
    # yarn, mscale alone: transformers ignores mscale (0.1 ln s + 1); DeepSeek-V2's code,
    # whose default mscale_all_dim is 0, would give 0.1 * mscale * ln s + 1; pecode raises
    block = {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": l0}
    _, hf_factor = _hugging_face_block({**block, "mscale": 0.707}, 4 * l0)
    assert math.isclose(hf_factor, 0.1 * math.log(s) + 1, rel_tol=1e-12)
    assert not math.isclose(hf_factor, 0.1 * 0.707 * math.log(s) + 1, rel_tol=1e-3)
    with pytest.raises(ValueError, match="both mscale and mscale_all_dim"):
        freqs("yarn", factor=s, original_max_position_embeddings=l0, mscale=0.707)
    # yarn and llama3 without original_max_position_embeddings: transformers fills it in
    # from max_position_embeddings; pecode raises
    hf, _ = _hugging_face_block({"rope_type": "yarn", "factor": s}, l0)
    assert torch.allclose(hf, yarn_inv_freq_code_loop(128, 10000.0, s, l0), rtol=1e-6)
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        freqs("yarn", factor=s)
    llama3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    hf, _ = _hugging_face_block(llama3, 8192, rope_theta=500000.0)
    assert torch.allclose(hf, llama3_inv_freq_loop(128, 500000.0, 8.0, 1.0, 4.0, 8192), rtol=1e-6)
    with pytest.raises(ValueError, match="original_max_position_embeddings"):
        freqs("llama3", base=500000.0, factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0)
    # yarn with truncate=False (gpt-oss): transformers keeps the ramp's real-valued ends,
    # which changes the ramp's pairs; pecode takes truncate as transformers reads it
    hf_untruncated, _ = _hugging_face_block({**block, "truncate": False}, 4 * l0)
    params = _pecode_arguments(block, 0)[1]
    assert not torch.allclose(hf_untruncated, freqs("yarn", **params)[0], rtol=1e-3)
    untruncated = freqs("yarn", **params, truncate=False)[0]
    assert torch.allclose(hf_untruncated, untruncated, rtol=1e-6, atol=0.0)
    # a beta of 0 means the default in transformers; pecode raises (None is the default)
    hf_zero, _ = _hugging_face_block({**block, "beta_fast": 0}, 4 * l0)
    assert torch.allclose(hf_zero, freqs("yarn", **params)[0], rtol=1e-6, atol=0.0)
    assert torch.equal(freqs("yarn", **params, beta_fast=None)[0], freqs("yarn", **params)[0])
    with pytest.raises(ValueError, match="beta_fast > beta_slow > 0"):
        freqs("yarn", **params, beta_fast=0)


def test_yarn_temperature_formula_values():
    # The YaRN paper prints the formula sqrt(1/t) = 0.1 ln s + 1, not these values: they are
    # the formula evaluated by hand (ln 4 = 1.3863, ln 16 = 2.7726, ln 32 = 3.4657).
    # test_hugging_face_shaped_blocks_give_hugging_faces_frequencies compares the factor
    # with transformers' own implementation.
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


def test_llama3_1_entry_matches_band_loop_and_band_edges():
    # pecode's llama3 rule on the Llama 3.1 entry against the project's own band loop
    # (pecode.reference.scaling) and the band conditions; the entry's constants are
    # checked against their source in test_published_entries_are_the_sources_settings.
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


def test_base_change_config_constants():
    # The bases typed again from the sources (no machine-readable copy is installed):
    # 500000: the Llama 3 paper, §3.2, gives it as the value Xiong et al. (2023) showed
    # effective up to 32,768 tokens; 1e6: the Code Llama paper (Rozière et al. 2023).
    # What this checks is that each entry is a base change from 10000 whose frequencies
    # are the default loop's at the new base.
    for name, base in [("llama2_long", 500000.0), ("code_llama", 1_000_000.0)]:
        config = dict(PUBLISHED_CONFIGS[name])
        kind = config.pop("kind")
        trained = config.pop("base")
        assert trained == 10000.0
        inv_freq, factor = freqs(kind, base=trained, **config)
        assert torch.allclose(inv_freq, default_inv_freq_loop(128, base), rtol=1e-15)
        assert factor == 1.0


def test_qwen3_yarn_entry_matches_authors_code_loop():
    # pecode's yarn rule on the Qwen3 entry against the loop written from the YaRN
    # authors' code (pecode.reference.scaling) and the paper's 0.1 ln s + 1; the entry's
    # values are checked against Qwen's documentation in
    # test_published_entries_are_the_sources_settings.
    config = dict(PUBLISHED_CONFIGS["qwen3_yarn"])
    kind = config.pop("kind")
    base = config.pop("base")
    inv_freq, factor = freqs(kind, base=base, **config)
    assert round(factor, 4) == 1.1386
    assert torch.allclose(
        inv_freq, yarn_inv_freq_code_loop(128, 1_000_000.0, 4.0, 32768), rtol=1e-12
    )


# Numbers published by an independent implementation: the snapshots in Hugging Face
# transformers' tests/utils/test_modeling_rope_utils.py (huggingface/transformers, commit
# e42e4a43c16b458045aa7b0f721cfe4015680880: test_dynamic_rope_numerically,
# test_yarn_rope_numerically, test_llama3_rope_numerically),
# computed by transformers' own rope functions for LlamaConfig() (head_dim 128, base 10000,
# max_position_embeddings 2048) and printed to five significant digits. Typed here from
# that file; pecode shares no code with it.
# fmt: off
HF_SNAPSHOT_COMMON = [
    1.0000e00, 8.6596e-01, 7.4989e-01, 6.4938e-01, 5.6234e-01, 4.8697e-01,
    4.2170e-01, 3.6517e-01, 3.1623e-01, 2.7384e-01, 2.3714e-01, 2.0535e-01,
    1.7783e-01, 1.5399e-01, 1.3335e-01, 1.1548e-01, 1.0000e-01,
]  # pairs 0-16: kept by both the llama3 and the yarn snapshot
HF_SNAPSHOT_SLOW = [
    2.7384e-04, 2.3714e-04, 2.0535e-04, 1.7783e-04, 1.5399e-04, 1.3335e-04, 1.1548e-04,
    1.0000e-04, 8.6596e-05, 7.4989e-05, 6.4938e-05, 5.6234e-05, 4.8697e-05,
    4.2170e-05, 3.6517e-05, 3.1623e-05, 2.7384e-05, 2.3714e-05, 2.0535e-05,
    1.7783e-05, 1.5399e-05, 1.3335e-05, 1.1548e-05,
]  # pairs 41-63: divided by 10 in both
HF_SNAPSHOTS = {
    "llama3": (
        {
            "factor": 10.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 2048,
        },
        [
            *HF_SNAPSHOT_COMMON,
            8.6596e-02, 7.4989e-02, 6.4938e-02, 5.6234e-02, 4.8697e-02, 4.2170e-02,
            3.6517e-02, 3.1623e-02, 2.7384e-02, 2.3714e-02, 2.0535e-02, 1.7783e-02,
            1.5399e-02, 1.3335e-02, 1.0730e-02, 7.7785e-03, 5.6009e-03, 3.9991e-03,
            2.8248e-03, 1.9675e-03, 1.3449e-03, 8.9549e-04, 5.7363e-04, 3.4539e-04,
            *HF_SNAPSHOT_SLOW,
        ],
    ),
    "yarn": (
        {"factor": 10.0, "original_max_position_embeddings": 2048, "beta_fast": 32, "beta_slow": 1},
        [
            *HF_SNAPSHOT_COMMON,
            8.3479e-02, 6.9590e-02, 5.7925e-02, 4.8136e-02, 3.9931e-02, 3.3061e-02,
            2.7315e-02, 2.2515e-02, 1.8512e-02, 1.5177e-02, 1.2403e-02, 1.0101e-02,
            8.1924e-03, 6.6143e-03, 5.3120e-03, 4.2400e-03, 3.3599e-03, 2.6396e-03,
            2.0520e-03, 1.5746e-03, 1.1882e-03, 8.7713e-04, 6.2810e-04, 4.3007e-04,
            *HF_SNAPSHOT_SLOW,
        ],
    ),
    "dynamic": (
        {"factor": 10.0, "original_max_position_embeddings": 2048, "seq_len": 16384},
        [
            1.0000e00, 8.0931e-01, 6.5498e-01, 5.3008e-01, 4.2900e-01, 3.4720e-01,
            2.8099e-01, 2.2741e-01, 1.8404e-01, 1.4895e-01, 1.2055e-01, 9.7558e-02,
            7.8955e-02, 6.3899e-02, 5.1714e-02, 4.1853e-02, 3.3872e-02, 2.7413e-02,
            2.2185e-02, 1.7955e-02, 1.4531e-02, 1.1760e-02, 9.5176e-03, 7.7027e-03,
            6.2339e-03, 5.0451e-03, 4.0831e-03, 3.3045e-03, 2.6744e-03, 2.1644e-03,
            1.7517e-03, 1.4176e-03, 1.1473e-03, 9.2852e-04, 7.5146e-04, 6.0817e-04,
            4.9220e-04, 3.9834e-04, 3.2238e-04, 2.6091e-04, 2.1115e-04, 1.7089e-04,
            1.3830e-04, 1.1193e-04, 9.0585e-05, 7.3312e-05, 5.9332e-05, 4.8018e-05,
            3.8861e-05, 3.1451e-05, 2.5453e-05, 2.0600e-05, 1.6672e-05, 1.3492e-05,
            1.0920e-05, 8.8374e-06, 7.1522e-06, 5.7883e-06, 4.6845e-06, 3.7912e-06,
            3.0683e-06, 2.4832e-06, 2.0097e-06, 1.6265e-06,
        ],
    ),
}
# fmt: on


def _agrees_to_printed_digits(ours: torch.Tensor, printed: list[float]) -> bool:
    """Each value equals the printed one to half a unit of its fifth significant digit."""
    assert len(printed) == ours.numel()
    return all(
        abs(float(value) - number) <= 0.5 * 10.0 ** (math.floor(math.log10(number)) - 4)
        for value, number in zip(ours.tolist(), printed, strict=True)
    )


@pytest.mark.parametrize("kind", sorted(HF_SNAPSHOTS))
def test_rules_reproduce_transformers_published_snapshots(kind):
    params, printed = HF_SNAPSHOTS[kind]
    inv_freq, _ = freqs(kind, **params)
    assert _agrees_to_printed_digits(inv_freq, printed)
    # the comparison can fail: the same rule with the trained length doubled does not agree
    wrong = {**params, "original_max_position_embeddings": 4096}
    assert not _agrees_to_printed_digits(freqs(kind, **wrong)[0], printed)


def test_published_entries_are_the_sources_settings():
    # Each entry of PUBLISHED_CONFIGS against the values as its source prints them, typed
    # from that source (no machine-readable copy is installed):
    # - llama3.1: Meta's reference code, meta-llama/llama-models, models/llama3/model.py,
    #   apply_scaling (commit a9c89c471f793423afd4cc3ca8671d6e56fe64cb): scale_factor = 8,
    #   low_freq_factor = 1, high_freq_factor = 4, old_context_len = 8192; its
    #   models/llama3/args.py: rope_theta = 500000;
    # - qwen3_yarn: Qwen's documentation, QwenLM/Qwen3, docs/source/inference/transformers.md
    #   (commit 7a2f61ffc7a20d47efcd2bf97f6f2bf52729042e), "Enabling Long Context": the
    #   block {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    #   for 131,072 tokens; the base 1,000,000 is the Qwen3 technical report's (arXiv
    #   2505.09388, the long-context pre-training stage: ABF from 10,000 to 1,000,000);
    # - llama2_long, code_llama: test_base_change_config_constants.
    sources = {
        "llama3.1": {
            "kind": "llama3",
            "base": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
        "qwen3_yarn": {
            "kind": "yarn",
            "base": 1_000_000.0,
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
        },
    }
    for name, expected in sources.items():
        assert PUBLISHED_CONFIGS[name] == expected, name
    # Qwen's block extends 32,768 tokens to 131,072: its factor is that ratio
    qwen = PUBLISHED_CONFIGS["qwen3_yarn"]
    assert qwen["factor"] * qwen["original_max_position_embeddings"] == 131072


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
            "high_freq_factor >= low_freq_factor",
        ),
        ("dynamic", {"factor": 2.0, "original_max_position_embeddings": 0}, "must be positive"),
        ("base_change", {"rope_theta": 0.5}, "rope_theta must be greater than 1"),
        ("base_change", {"rope_theta": float("inf")}, "rope_theta must be finite"),
        (
            "yarn",
            {"factor": 2.0, "orig_max_position_embeddings": 4096},
            "does not take \\['orig_max_position_embeddings'\\] "
            "\\(did you mean 'original_max_position_embeddings'\\?\\)",
        ),
        ("yran", {}, "unknown scaling kind 'yran' \\(did you mean 'yarn'\\?\\)"),
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
    # a bad new base is reported under its own name, not as the trained base
    with pytest.raises(TypeError, match="rope_theta must be a real number, got str"):
        freqs("base_change", rope_theta="abc")
    with pytest.raises(TypeError, match="base must be a real number, got str"):
        freqs("base_change", base="abc", rope_theta=500000.0)


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


def test_every_pair_turns_once_below_a_largest_base_and_no_smallest():
    # Chapter 11, exercise 1. Over L0 = 4096 positions pair i turns L0 b^(-2i/d) / (2π)
    # times; a smaller base speeds every pair up, so the bases for which every pair turns
    # at least once form an interval (1, b*] with no smallest element, and the slowest pair
    # (i = 63) sets b* = (L0 / 2π)^(d / (d - 2)) = 722.52. The fastest pair, θ_0 = 1, is
    # the same for every base.
    dim, length = 128, 4096
    largest = (length / (2 * math.pi)) ** (dim / (dim - 2))
    assert round(largest, 2) == 722.52

    def turns(base):
        return length * default_inv_freq_loop(dim, base) / (2 * math.pi)

    for base in (1.5, 2.0, 100.0, 700.0, largest * (1 - 1e-9)):
        assert bool((turns(base) >= 1).all()), base
    assert math.isclose(turns(largest)[-1].item(), 1.0, rel_tol=1e-12)
    assert turns(largest * (1 + 1e-9))[-1] < 1
    assert int((turns(10000.0) < 1).sum()) == 18  # chapter 11's base: 18 pairs short of a turn
    for base in (2.0, largest, 10000.0, 1e6):
        assert default_inv_freq_loop(dim, base)[0].item() == 1.0
