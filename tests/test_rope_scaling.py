"""RotaryEmbedding with a long-context scaling kind: tables, attention factor, dynamic length."""

from __future__ import annotations

import pytest
import torch

from pecode.attention import MultiHeadAttention
from pecode.reference.rope import rope_loop
from pecode.reference.scaling import dynamic_inv_freq_loop, yarn_inv_freq_code_loop
from pecode.rope import RotaryEmbedding, apply_rope, rope_cos_sin

F64 = torch.float64
DYNAMIC = {"factor": 2.0, "original_max_position_embeddings": 8}


def test_no_scaling_is_unchanged():
    plain = RotaryEmbedding(16, dtype=F64)
    default = RotaryEmbedding(16, dtype=F64, scaling="default")
    positions = torch.arange(50)
    for a, b in zip(plain.cos_sin(positions), default.cos_sin(positions), strict=True):
        assert torch.equal(a, b)


def test_linear_scaling_rotates_like_divided_positions():
    rope = RotaryEmbedding(8, dtype=F64, scaling="linear", scaling_params={"factor": 4.0})
    x = torch.randn(1, 2, 12, 8, dtype=F64)
    positions = torch.arange(12)
    # the loop reference at positions m / 4 with the default frequencies
    expected = rope_loop(x, positions.to(F64) / 4, layout="half")
    assert torch.allclose(rope.rotate(x, positions), expected, atol=1e-12)


def test_yarn_tables_carry_the_attention_factor_and_logits_scale_by_its_square():
    params = {"factor": 4.0, "original_max_position_embeddings": 64}
    rope = RotaryEmbedding(32, dtype=F64, scaling="yarn", scaling_params=params)
    inv_freq = yarn_inv_freq_code_loop(32, 10000.0, 4.0, 64)
    cos, sin = rope_cos_sin(torch.arange(100), inv_freq)
    factor = 0.1 * torch.log(torch.tensor(4.0, dtype=F64)) + 1
    got_cos, got_sin = rope.cos_sin(torch.arange(100))
    assert torch.allclose(got_cos, cos * factor, atol=1e-12)
    assert torch.allclose(got_sin, sin * factor, atol=1e-12)
    q, k = torch.randn(2, 1, 1, 10, 32, dtype=F64)
    positions = torch.arange(10)
    scaled = rope.rotate(q, positions) @ rope.rotate(k, positions).transpose(-1, -2)
    unit = apply_rope(q, cos[:10], sin[:10]) @ apply_rope(k, cos[:10], sin[:10]).transpose(-1, -2)
    assert torch.allclose(scaled, unit * factor**2, atol=1e-10)


def test_dynamic_rebuilds_past_the_trained_length_and_goes_back():
    params = {"factor": 2.0, "original_max_position_embeddings": 32}
    rope = RotaryEmbedding(16, dtype=F64, scaling="dynamic", scaling_params=params)
    plain = RotaryEmbedding(16, dtype=F64)
    short = torch.arange(20)
    assert torch.equal(rope.cos_sin(short)[0], plain.cos_sin(short)[0])
    long = torch.arange(100)
    cos, _ = rope.cos_sin(long)
    expected, _ = rope_cos_sin(long, dynamic_inv_freq_loop(16, 10000.0, 2.0, 32, 100))
    assert torch.allclose(cos, expected, atol=1e-12)
    assert torch.equal(rope.cos_sin(short)[0], plain.cos_sin(short)[0])  # back to default


def test_scaled_rope_inside_attention_runs():
    rope = RotaryEmbedding(8, scaling="ntk", scaling_params={"factor": 8.0})
    layer = MultiHeadAttention(embed_dim=16, num_heads=2, position=rope)
    out = layer(torch.randn(2, 7, 16), causal=True)
    assert out.shape == (2, 7, 16)
    assert bool(torch.isfinite(out).all())


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"scaling": "bogus"}, ValueError, "accepted kinds"),
        ({"scaling": "linear"}, ValueError, "missing \\['factor'\\]"),
        ({"scaling_params": {"factor": 2.0}}, ValueError, "without a scaling kind"),
        ({"scaling": "linear", "scaling_params": {"factor": 2.0, "x": 1}}, ValueError, "accepts"),
    ],
)
def test_bad_scaling_raises(kwargs, error, message):
    with pytest.raises(error, match=message):
        RotaryEmbedding(8, **kwargs)


HF_CONFIGS_FOR_TABLES = [
    "Llama 3.1, llama3",
    "DeepSeek-V3, yarn, mscale = mscale_all_dim",
    "gpt-oss, yarn, truncate false",
    "Vicuna-16k-like, linear",
    "GPT-NeoX (Pythia-like), rotary_pct 0.25",
    "Phi-2-like, partial_rotary_factor 0.4, head_dim 80",
    "proportional (Gemma 4 style)",
]


@pytest.mark.parametrize("name", HF_CONFIGS_FOR_TABLES)
def test_rotary_embedding_from_a_hugging_face_config_gives_the_models_tables(name):
    # RotaryEmbedding(**hf_rope_arguments(config)) against the model's own rotary
    # embedding in transformers, built from the same config.json dict: cos/sin (times the
    # attention factor) at positions up to 5000, float32 angles there: within 1e-3.
    pytest.importorskip("transformers")
    from test_hf_rope_configs import CONFIGS, _hf_rotary

    from pecode.scaling import hf_rope_arguments

    config = CONFIGS[name]
    rope = RotaryEmbedding(**hf_rope_arguments(config), dtype=F64)
    hf_rotary, _ = _hf_rotary(config)
    positions = torch.arange(0, 5000, 7)
    cos, sin = hf_rotary(torch.zeros(1), positions[None])
    ours_cos, ours_sin = rope.cos_sin(positions)
    half = ours_cos.shape[-1]
    assert cos.shape[-1] in (half, 2 * half)  # gpt-oss's tables are half width, as pecode's
    assert torch.allclose(ours_cos, cos[0, :, :half].to(F64), atol=1e-3)
    assert torch.allclose(ours_sin, sin[0, :, :half].to(F64), atol=1e-3)


# --- RotaryEmbedding.from_hf_config and longrope, against transformers' forward ----------

# transformers forms the angles in float32: at positions up to 5000 its tables are off by
# up to about 5000 * 2^-23 * attention factor ~ 7e-4 (measured: 4e-4); a wrong frequency
# (the other longrope list, another rope type) moves them by far more (checked below).
HF_FORWARD_ATOL = 1e-3


def _hf(name):
    """The config dict of tests/test_hf_rope_configs.py and the model's own rotary
    embedding that transformers builds from it."""
    pytest.importorskip("transformers")
    from test_hf_rope_configs import CONFIGS, _hf_rotary

    return CONFIGS[name], _hf_rotary(CONFIGS[name])[0]


def _forward_gap(ours, hf, position_ids):
    """The largest difference between pecode's and transformers' forward(x, position_ids)."""
    x = torch.zeros(1)
    got, want = ours(x, position_ids), hf(x, position_ids)
    assert got[0].shape == want[0].shape
    return max(float((g - w).abs().max()) for g, w in zip(got, want, strict=True))


@pytest.mark.parametrize(
    "name",
    [
        "Llama 3.1, llama3",
        "Qwen2.5, yarn, legacy 'type'",
        "GPT-NeoX, rotary_pct 0.25, dynamic",
    ],
)
def test_from_hf_config_gives_the_models_forward(name):
    # Two rows of positions up to 5000 (past GPT-NeoX's 2048, so its dynamic NTK scales),
    # the call transformers' attention layers make, against the model's own module.
    config, hf = _hf(name)
    ours = RotaryEmbedding.from_hf_config(config)
    position_ids = torch.stack((torch.arange(0, 5000, 7), torch.arange(1, 5001, 7).flip(0)))
    assert _forward_gap(ours, hf, position_ids) <= HF_FORWARD_ATOL
    plain = RotaryEmbedding(ours.head_dim, rotary_dim=ours.rotary_dim)
    assert _forward_gap(plain, hf, position_ids) > 0.1  # the config's scaling mattered


def test_from_hf_config_passes_the_other_arguments_and_refuses_the_configs():
    pytest.importorskip("transformers")
    from test_hf_rope_configs import CONFIGS

    config = CONFIGS["GPT-NeoX, rotary_pct 0.25, dynamic"]
    ours = RotaryEmbedding.from_hf_config(config, layout="interleaved", dtype=F64)
    assert (ours.head_dim, ours.rotary_dim, ours.base) == (64, 16, 10000.0)
    assert (ours.layout, ours.table_dtype, ours.scaling) == ("interleaved", F64, "dynamic")
    with pytest.raises(TypeError, match=r"takes \['base'\] from the config"):
        RotaryEmbedding.from_hf_config(config, base=500000.0)
    with pytest.raises(ValueError, match="rope_theta must be greater than 1"):
        RotaryEmbedding.from_hf_config({**config, "rotary_emb_base": 0.5})


PHI3 = [
    "Phi-3 128k, longrope",
    "Phi-4-mini-like, longrope with partial_rotary_factor 0.75",
]


@pytest.mark.parametrize("name", PHI3)
def test_longrope_forward_equals_phi3s_short_and_long_calls(name):
    # transformers' Phi-3 (dynamic_rope_update): a call whose largest position + 1 exceeds
    # original_max_position_embeddings (4096) uses long_factor for all its positions,
    # any other call short_factor; the attention factor sqrt(1 + ln 32 / ln 4096) is
    # computed once and used for both.
    config, hf = _hf(name)
    ours = RotaryEmbedding.from_hf_config(config)
    calls = [
        torch.arange(0, 4096, 3)[None],  # short: largest position 4095
        torch.arange(4097)[None],  # long: largest position 4096, the first past
        torch.stack((torch.arange(100), torch.arange(4900, 5000))),  # long for both rows
        torch.arange(100)[None],  # short again: no history, unlike dynamic NTK
    ]
    for position_ids in calls:
        assert _forward_gap(ours, hf, position_ids) <= HF_FORWARD_ATOL, position_ids.max()
    # the two lists give different tables (so the comparisons above could fail)
    short = RotaryEmbedding.from_hf_config(config)(torch.zeros(1), torch.arange(4096)[None])
    long = ours(torch.zeros(1), torch.arange(4097)[None])
    assert float((short[0][0] - long[0][0, :4096]).abs().max()) > 0.5


def test_longrope_decoding_across_the_original_length(monkeypatch):
    # A prefill of 4090 tokens, then one token per step through position 4110, each call
    # compared with transformers' Phi-3 module given the same position_ids: the steps up
    # to position 4095 use the short list, the later ones the long list (the keys cached
    # before keep their short rotation, in transformers as here). Past the switch each
    # step computes only its own row (no table of long-list rows is built).
    from test_rope_dropin import _RowCounter

    config, hf = _hf("Phi-3 128k, longrope")
    ours = RotaryEmbedding.from_hf_config(config)
    assert _forward_gap(ours, hf, torch.arange(4090)[None]) <= HF_FORWARD_ATOL
    counter = _RowCounter(monkeypatch)
    for position in range(4090, 4111):
        before = counter.rows
        assert _forward_gap(ours, hf, torch.tensor([[position]])) <= HF_FORWARD_ATOL, position
        if position >= 4096:  # before: the short table grows by doubling, as plain RoPE's
            assert counter.rows - before == 1
    assert ours.cached_positions == 2 * 4090  # the short table, grown once at step 4090


def test_longrope_and_dynamic_refuse_seq_len_and_the_compiler(monkeypatch):
    pytest.importorskip("transformers")
    from test_hf_rope_configs import CONFIGS

    from pecode.scaling import hf_rope_arguments

    arguments = hf_rope_arguments(CONFIGS["Phi-3 128k, longrope"])
    arguments["scaling_params"]["seq_len"] = 5000
    with pytest.raises(ValueError, match=r"scaling_params\['seq_len'\]"):
        RotaryEmbedding(**arguments)
    for rotary in (
        RotaryEmbedding.from_hf_config(CONFIGS["Phi-3 128k, longrope"], initial_positions=8),
        RotaryEmbedding(8, initial_positions=8, scaling="dynamic", scaling_params=DYNAMIC),
    ):
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
        with pytest.raises(RuntimeError, match="largest position of each call"):
            rotary.cos_sin(torch.arange(4))
        monkeypatch.undo()
