"""Hugging Face configs read verbatim: every rope type against transformers' own code.

Each config below is a dict shaped like a model's ``config.json`` (the RoPE keys and
values of Llama 3.1, Qwen2.5 with YaRN, DeepSeek-V3, gpt-oss, Phi-3 and Phi-4-mini,
GPT-NeoX, Phi-1.5/Phi-2, a linear and a dynamic Llama, Gemma 3 in transformers 5's
form; the Phi-3 factor lists are made up, of the right length). The same dict goes to
transformers' configuration class and to :func:`pecode.scaling.frequencies_from_hf_config`;
transformers (the model's rotary embedding, and ``ROPE_INIT_FUNCTIONS`` for a given
length) is the independent reference. Frequencies agree to transformers' float32
rounding and attention factors to 1e-12. Then each bad config is refused with a message
that names the key. The whole module is skipped where transformers is not installed.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

from pecode.scaling import frequencies_from_hf_config, hf_rope_arguments  # noqa: E402

F64 = torch.float64


def _phi3_lists(pairs: int) -> tuple[list[float], list[float]]:
    # made up, increasing like the published ones: short near 1, long from 1 to about 40
    short = [round(1.0 + 0.05 * i / (pairs - 1), 4) for i in range(pairs)]
    long = [round(40.0 ** (i / (pairs - 1)), 4) for i in range(pairs)]
    return short, long


PHI3_SHORT, PHI3_LONG = _phi3_lists(48)

CONFIGS = {
    "Llama 3.1, llama3": {
        "model_type": "llama",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "head_dim": 128,
        "max_position_embeddings": 131072,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
    },
    "Qwen2.5, yarn, legacy 'type'": {
        "model_type": "qwen2",
        "hidden_size": 3584,
        "num_attention_heads": 28,
        "max_position_embeddings": 32768,
        "rope_theta": 1000000.0,
        "rope_scaling": {
            "factor": 4.0,
            "original_max_position_embeddings": 32768,
            "type": "yarn",
        },
    },
    "DeepSeek-V3, yarn, mscale = mscale_all_dim": {
        "model_type": "deepseek_v3",
        "hidden_size": 7168,
        "num_attention_heads": 128,
        "qk_rope_head_dim": 64,
        "qk_nope_head_dim": 128,
        "v_head_dim": 128,
        "max_position_embeddings": 163840,
        "rope_theta": 10000,
        "rope_scaling": {
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 40,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "original_max_position_embeddings": 4096,
            "type": "yarn",
        },
    },
    "DeepSeek-V2-like, yarn, unequal mscales": {
        "model_type": "deepseek_v3",
        "hidden_size": 5120,
        "num_attention_heads": 128,
        "qk_rope_head_dim": 64,
        "max_position_embeddings": 163840,
        "rope_theta": 10000,
        "rope_scaling": {
            "factor": 40,
            "mscale": 1.0,
            "mscale_all_dim": 0.707,
            "original_max_position_embeddings": 4096,
            "type": "yarn",
        },
    },
    "yarn, mscale without mscale_all_dim, beta_fast None": {
        "model_type": "llama",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "max_position_embeddings": 65536,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "rope_type": "yarn",
            "factor": 16.0,
            "original_max_position_embeddings": 4096,
            "mscale": 0.707,
            "beta_fast": None,
        },
    },
    "gpt-oss, yarn, truncate false": {
        "model_type": "gpt_oss",
        "hidden_size": 2880,
        "num_attention_heads": 64,
        "head_dim": 64,
        "max_position_embeddings": 131072,
        "rope_theta": 150000,
        "rope_scaling": {
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "factor": 32.0,
            "original_max_position_embeddings": 4096,
            "rope_type": "yarn",
            "truncate": False,
        },
    },
    "yarn, attention_factor, no original (from max_position_embeddings)": {
        "model_type": "llama",
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "max_position_embeddings": 8192,
        "rope_theta": 10000.0,
        "rope_scaling": {"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.25},
    },
    "Phi-3 128k, longrope": {
        "model_type": "phi3",
        "hidden_size": 3072,
        "num_attention_heads": 32,
        "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "longrope", "short_factor": PHI3_SHORT, "long_factor": PHI3_LONG},
    },
    "Phi-4-mini-like, longrope with partial_rotary_factor 0.75": {
        "model_type": "phi3",
        "hidden_size": 3072,
        "num_attention_heads": 24,
        "partial_rotary_factor": 0.75,
        "max_position_embeddings": 131072,
        "original_max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "longrope", "short_factor": PHI3_SHORT, "long_factor": PHI3_LONG},
    },
    "Vicuna-16k-like, linear": {
        "model_type": "llama",
        "hidden_size": 5120,
        "num_attention_heads": 40,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_scaling": {"factor": 4.0, "type": "linear"},
    },
    "Llama, dynamic": {
        "model_type": "llama",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_scaling": {"type": "dynamic", "factor": 2.0},
    },
    "GPT-NeoX (Pythia-like), rotary_pct 0.25": {
        "model_type": "gpt_neox",
        "hidden_size": 512,
        "num_attention_heads": 8,
        "rotary_pct": 0.25,
        "rotary_emb_base": 10000,
        "max_position_embeddings": 2048,
    },
    "GPT-NeoX, rotary_pct 0.25, dynamic": {
        "model_type": "gpt_neox",
        "hidden_size": 512,
        "num_attention_heads": 8,
        "rotary_pct": 0.25,
        "rotary_emb_base": 10000,
        "max_position_embeddings": 2048,
        "rope_scaling": {"type": "dynamic", "factor": 4.0},
    },
    "Phi-1.5-like, partial_rotary_factor 0.5": {
        "model_type": "phi",
        "hidden_size": 2048,
        "num_attention_heads": 32,
        "partial_rotary_factor": 0.5,
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
    },
    "Phi-2-like, partial_rotary_factor 0.4, head_dim 80": {
        "model_type": "phi",
        "hidden_size": 2560,
        "num_attention_heads": 32,
        "partial_rotary_factor": 0.4,
        "rope_theta": 10000.0,
        "max_position_embeddings": 2048,
    },
    "transformers 5 form, yarn with rope_theta and partial_rotary_factor in the block": {
        "model_type": "llama",
        "hidden_size": 2048,
        "num_attention_heads": 16,
        "max_position_embeddings": 32768,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 1000000.0,
            "partial_rotary_factor": 0.5,
            "factor": 4.0,
            "original_max_position_embeddings": 8192,
        },
    },
    "proportional (Gemma 4 style)": {
        "model_type": "llama",
        "hidden_size": 2048,
        "num_attention_heads": 8,
        "head_dim": 256,
        "max_position_embeddings": 131072,
        "rope_parameters": {
            "rope_type": "proportional",
            "rope_theta": 1000000.0,
            "partial_rotary_factor": 0.25,
            "factor": 8.0,
        },
    },
    "Llama 2, no rope block": {
        "model_type": "llama",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "rope_scaling": None,
    },
}


def _hf_config(config: dict):
    """transformers' configuration object for the same dict (it mutates what it is
    given, so it gets a copy)."""
    return transformers.AutoConfig.for_model(**copy.deepcopy(config))


def _hf_rotary(config: dict):
    """The model's own rotary embedding, built by transformers from the config."""
    hf_config = _hf_config(config)
    model_type = config["model_type"]
    module = __import__(f"transformers.models.{model_type}.modeling_{model_type}", fromlist=["_"])
    name = {"gpt_neox": "GPTNeoX", "gpt_oss": "GptOss", "deepseek_v3": "DeepseekV3"}.get(
        model_type, model_type.capitalize()
    )
    return getattr(module, f"{name}RotaryEmbedding")(hf_config), hf_config


@pytest.mark.parametrize("name", list(CONFIGS))
def test_frequencies_equal_the_models_rotary_embedding(name):
    # What the model computes at initialisation: its rotary embedding's inv_freq and
    # attention_scaling, against pecode at seq_len=None (the same moment).
    config = CONFIGS[name]
    rotary, _ = _hf_rotary(config)
    ours, factor = frequencies_from_hf_config(config, dtype=F64)
    theirs = rotary.inv_freq.to(F64)
    assert ours.shape == theirs.shape
    assert torch.allclose(ours, theirs, rtol=1e-6, atol=0.0)
    assert math.isclose(factor, float(rotary.attention_scaling), rel_tol=1e-12)


# (config, current lengths): the rope types whose frequencies depend on the length
LENGTHS = {
    "Llama, dynamic": [1, 4096, 4097, 8192, 20000],
    "GPT-NeoX, rotary_pct 0.25, dynamic": [2048, 3000, 8192],
    "Phi-3 128k, longrope": [1, 4096, 4097, 131072],
    "Phi-4-mini-like, longrope with partial_rotary_factor 0.75": [4096, 4097],
}


@pytest.mark.parametrize(
    ("name", "seq_len"), [(name, n) for name, lengths in LENGTHS.items() for n in lengths]
)
def test_length_dependent_types_equal_rope_init_functions(name, seq_len):
    config = CONFIGS[name]
    hf_config = _hf_config(config)
    rope_type = hf_config.rope_parameters["rope_type"]
    theirs, their_factor = ROPE_INIT_FUNCTIONS[rope_type](hf_config, "cpu", seq_len=seq_len)
    ours, factor = frequencies_from_hf_config(config, seq_len=seq_len, dtype=F64)
    assert torch.allclose(ours, theirs.to(F64), rtol=1e-6, atol=0.0)
    assert math.isclose(factor, float(their_factor), rel_tol=1e-12)


def test_longrope_switches_lists_past_the_trained_length():
    # The test above agrees with transformers on either side of 4096; this one shows the
    # two sides differ, by the ratio of the lists (so the comparison could fail).
    config = CONFIGS["Phi-3 128k, longrope"]
    short, factor_short = frequencies_from_hf_config(config, seq_len=4096, dtype=F64)
    long, factor_long = frequencies_from_hf_config(config, seq_len=4097, dtype=F64)
    ratio = torch.tensor(PHI3_LONG, dtype=F64) / torch.tensor(PHI3_SHORT, dtype=F64)
    assert torch.allclose(short / long, ratio, rtol=1e-12)
    # one attention factor for both: sqrt(1 + ln 32 / ln 4096), 32 = 131072 / 4096
    assert factor_short == factor_long
    assert math.isclose(factor_short, math.sqrt(1 + math.log(32) / math.log(4096)), rel_tol=1e-12)
    assert round(factor_short, 4) == 1.1902


@pytest.mark.parametrize("older_name", ["su", "yarn"])
def test_phi3_older_names_are_longrope(older_name):
    # Phi-3's configuration class renames "su" and "yarn" to "longrope", but in
    # transformers 5.23 only after it has filled in the block's
    # original_max_position_embeddings (which it does for longrope, yarn and llama3 only),
    # so for "su" its validation then raises. pecode reads both as the longrope config.
    config = copy.deepcopy(CONFIGS["Phi-3 128k, longrope"])
    config["rope_scaling"]["type"] = older_name
    if older_name == "su":
        with pytest.raises(KeyError, match="original_max_position_embeddings"):
            _hf_config(config)
    else:
        rotary, _ = _hf_rotary(config)
        ours, factor = frequencies_from_hf_config(config, dtype=F64)
        assert torch.allclose(ours, rotary.inv_freq.to(F64), rtol=1e-6, atol=0.0)
        assert math.isclose(factor, rotary.attention_scaling, rel_tol=1e-12)
    for seq_len in (None, 4097):
        ours = frequencies_from_hf_config(config, seq_len=seq_len, dtype=F64)
        longrope = frequencies_from_hf_config(
            CONFIGS["Phi-3 128k, longrope"], seq_len=seq_len, dtype=F64
        )
        assert torch.equal(ours[0], longrope[0])
        assert ours[1] == longrope[1]


def test_truncate_null_is_false_as_in_transformers():
    config = copy.deepcopy(CONFIGS["gpt-oss, yarn, truncate false"])
    config["rope_scaling"]["truncate"] = None
    hf_config = _hf_config(config)
    theirs, _ = ROPE_INIT_FUNCTIONS["yarn"](hf_config, "cpu")
    ours, _ = frequencies_from_hf_config(config, dtype=F64)
    assert torch.allclose(ours, theirs.to(F64), rtol=1e-6, atol=0.0)
    config["rope_scaling"]["truncate"] = True
    assert not torch.allclose(frequencies_from_hf_config(config, dtype=F64)[0], ours, rtol=1e-3)


@pytest.mark.parametrize(
    ("name", "positions"), [("Llama, dynamic", 9000), ("Phi-3 128k, longrope", 6000)]
)
def test_the_models_forward_uses_the_length_pecode_is_given(name, positions):
    # transformers' forward(x, position_ids) updates dynamic and longrope frequencies
    # from max(position_ids) + 1; frequencies_from_hf_config(seq_len=that) gives its
    # cos/sin (float32 angles up to 9000 rad: within 2e-3).
    config = CONFIGS[name]
    rotary, _ = _hf_rotary(config)
    position_ids = torch.arange(positions)[None]
    cos, sin = rotary(torch.zeros(1, dtype=torch.float32), position_ids)
    inv_freq, factor = frequencies_from_hf_config(config, seq_len=positions, dtype=F64)
    angles = position_ids[0, :, None].to(F64) * inv_freq
    angles = torch.cat((angles, angles), dim=-1)
    assert torch.allclose(cos[0].to(F64), angles.cos() * factor, atol=2e-3)
    assert torch.allclose(sin[0].to(F64), angles.sin() * factor, atol=2e-3)
    at_init, _ = frequencies_from_hf_config(config, dtype=F64)
    assert not torch.allclose(inv_freq, at_init, rtol=1e-3)  # the length mattered


def test_a_config_written_by_transformers_reads_the_same():
    # transformers 5 writes the block it read into rope_parameters, with rope_theta in it
    # (and both 'type' and 'rope_type'); pecode reads that form to the same numbers.
    for name in (
        "DeepSeek-V3, yarn, mscale = mscale_all_dim",
        "Phi-3 128k, longrope",
        "Llama, dynamic",
    ):
        written = _hf_config(CONFIGS[name]).to_dict()
        assert "rope_theta" in written["rope_parameters"]
        for seq_len in (None, 5000):
            ours = frequencies_from_hf_config(CONFIGS[name], seq_len=seq_len, dtype=F64)
            again = frequencies_from_hf_config(written, seq_len=seq_len, dtype=F64)
            assert torch.equal(ours[0], again[0]), name
            assert ours[1] == again[1], name


def test_one_block_per_layer_type():
    # transformers 5 form of Gemma 3: linear scaling on full-attention layers only
    config = {
        "model_type": "gemma3_text",
        "head_dim": 256,
        "hidden_size": 2560,
        "num_attention_heads": 8,
        "max_position_embeddings": 131072,
        "rope_parameters": {
            "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    }
    hf_config = _hf_config(config)
    for layer_type in ("full_attention", "sliding_attention"):
        ours, factor = frequencies_from_hf_config(config, layer_type=layer_type, dtype=F64)
        rope_type = config["rope_parameters"][layer_type]["rope_type"]
        if rope_type == "default":
            from transformers.models.gemma3.modeling_gemma3 import Gemma3RotaryEmbedding

            theirs, their_factor = Gemma3RotaryEmbedding.compute_default_rope_parameters(
                hf_config, layer_type=layer_type
            )
        else:
            theirs, their_factor = ROPE_INIT_FUNCTIONS[rope_type](
                hf_config, "cpu", layer_type=layer_type
            )
        assert torch.allclose(ours, theirs.to(F64), rtol=1e-6, atol=0.0), layer_type
        assert factor == their_factor
    with pytest.raises(ValueError, match=r"one block per layer type.*layer_type="):
        frequencies_from_hf_config(config)


def test_arguments_for_rotary_embedding_and_no_mutation():
    config = CONFIGS["GPT-NeoX, rotary_pct 0.25, dynamic"]
    before = copy.deepcopy(config)
    arguments = hf_rope_arguments(config)
    assert arguments == {
        "head_dim": 64,
        "rotary_dim": 16,
        "base": 10000.0,
        "scaling": "dynamic",
        "scaling_params": {"factor": 4.0, "original_max_position_embeddings": 2048},
    }
    assert config == before  # transformers' config classes edit the dict they get; pecode not
    deepseek = hf_rope_arguments(CONFIGS["DeepSeek-V3, yarn, mscale = mscale_all_dim"])
    assert deepseek["head_dim"] == deepseek["rotary_dim"] == 64  # qk_rope_head_dim, not 7168/128


# ------------------------------------------------------------------- bad configs


def _with(name, **changes):
    config = copy.deepcopy(CONFIGS[name])
    block_changes = changes.pop("block", {})
    config.update(changes)
    block_key = "rope_parameters" if "rope_parameters" in config else "rope_scaling"
    for key, value in block_changes.items():
        if value is _DROP:
            config[block_key].pop(key)
        else:
            config[block_key][key] = value
    return config


_DROP = object()
LLAMA3 = "Llama 3.1, llama3"
YARN = "Qwen2.5, yarn, legacy 'type'"
PHI3 = "Phi-3 128k, longrope"
DYNAMIC = "Llama, dynamic"


@pytest.mark.parametrize(
    ("config", "error", "message"),
    [
        (
            _with(
                YARN,
                block={
                    "original_max_position_embeddings": _DROP,
                    "orig_max_position_embeddings": 4096,
                },
            ),
            ValueError,
            r"the key 'orig_max_position_embeddings' "
            r"\(did you mean 'original_max_position_embeddings'\?\)",
        ),
        (
            _with(LLAMA3, block={"low_freq_factor": _DROP, "low_freq_facter": 1.0}),
            ValueError,
            r"the key 'low_freq_facter' \(did you mean 'low_freq_factor'\?\)",
        ),
        (
            _with(YARN, block={"type": _DROP, "rope_typ": "yarn"}),
            ValueError,
            r"the key 'rope_typ' \(did you mean 'rope_type'\?\)",
        ),
        (
            _with(YARN, block={"type": "yarm"}),
            ValueError,
            r"unknown rope_type 'yarm' in rope_scaling \(did you mean 'yarn'\?\)",
        ),
        (_with(YARN, block={"rope_type": "linear"}), ValueError, r"rope_type is given twice"),
        (
            _with(LLAMA3, block={"high_freq_factor": _DROP}),
            ValueError,
            r"missing \['high_freq_factor'\]",
        ),
        (_with(LLAMA3, block={"factor": 0.5}), ValueError, "factor must be >= 1"),
        (_with(LLAMA3, block={"factor": "8"}), TypeError, "factor must be a number"),
        (_with(LLAMA3, rope_theta="500000"), TypeError, "rope_theta must be a real number"),
        (_with(LLAMA3, rope_theta=True), TypeError, "rope_theta must be a real number"),
        (_with(LLAMA3, rope_theta=float("inf")), ValueError, "rope_theta must be finite"),
        (_with(LLAMA3, rope_theta=1.0), ValueError, "rope_theta must be greater than 1"),
        (_with(LLAMA3, rope_theta=None), ValueError, "rope_theta: the config gives none"),
        (
            _with(LLAMA3, block={"rope_theta": 10000.0}),
            ValueError,
            r"rope_theta is given twice with different values: "
            r"rope_scaling\['rope_theta'\]=10000.0, rope_theta=500000.0",
        ),
        (
            _with(PHI3, block={"original_max_position_embeddings": 8192}),
            ValueError,
            "original_max_position_embeddings is given twice",
        ),
        (
            _with(PHI3, block={"short_factor": PHI3_SHORT[:-1]}),
            ValueError,
            "short_factor must have one factor per rotated pair, 48, got 47",
        ),
        (
            _with(PHI3, block={"long_factor": [*PHI3_LONG[:3], "x", *PHI3_LONG[4:]]}),
            TypeError,
            r"long_factor\[3\] must be a number",
        ),
        (_with(PHI3, block={"long_factor": 2.0}), TypeError, "long_factor must be a list"),
        (
            _with(DYNAMIC, block={"original_max_position_embeddings": 2048}),
            ValueError,
            "differs from max_position_embeddings=4096: transformers' dynamic",
        ),
        (
            _with(DYNAMIC, max_position_embeddings=None),
            ValueError,
            "max_position_embeddings: the config has none",
        ),
        (
            _with(DYNAMIC, max_position_embeddings=0),
            ValueError,
            "max_position_embeddings must be positive",
        ),
        (_with(YARN, block={"mrope_section": [16, 24, 24]}), ValueError, "mrope_section"),
        (
            _with("gpt-oss, yarn, truncate false", block={"truncate": "false"}),
            TypeError,
            "truncate must be a bool",
        ),
        (_with(YARN, block={"beta_fast": 1, "beta_slow": 2}), ValueError, "beta_fast > beta_slow"),
        (_with(YARN, block={"mscale": "1.0"}), TypeError, "mscale must be a number"),
        (
            _with("Phi-1.5-like, partial_rotary_factor 0.5", partial_rotary_factor=0.3),
            ValueError,
            r"partial_rotary_factor=0.3 with head_dim=64 rotates int\(64 \* 0.3\) = 19 features",
        ),
        (
            _with("Phi-1.5-like, partial_rotary_factor 0.5", partial_rotary_factor=1.5),
            ValueError,
            r"partial_rotary_factor must be in \(0, 1\]",
        ),
        (
            _with("GPT-NeoX (Pythia-like), rotary_pct 0.25", partial_rotary_factor=0.5),
            ValueError,
            "partial_rotary_factor is given twice",
        ),
        (_with(LLAMA3, head_dim=None, hidden_size=None), ValueError, "head_dim: the config has no"),
        (CONFIGS[YARN]["rope_scaling"], ValueError, "looks like a rope block alone"),
        ([("rope_theta", 10000.0)], TypeError, "config must be a dict"),
        (_with(LLAMA3, rope_scaling=[1, 2]), TypeError, "rope_scaling must be a dict"),
    ],
)
def test_bad_config_raises_naming_the_key(config, error, message):
    with pytest.raises(error, match=message):
        frequencies_from_hf_config(config)


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="seq_len must be positive"):
        frequencies_from_hf_config(CONFIGS[DYNAMIC], seq_len=0)
    with pytest.raises(ValueError, match="head_dim is given twice"):
        frequencies_from_hf_config(CONFIGS[LLAMA3], head_dim=64)
    listed = {**CONFIGS[LLAMA3], "layer_types": ["full_attention", "full_attention"]}
    with pytest.raises(ValueError, match=r"layer_type='sliding_attention' is not among"):
        frequencies_from_hf_config(listed, layer_type="sliding_attention")
    with pytest.raises(TypeError, match="layer_type must be a str"):
        frequencies_from_hf_config(listed, layer_type=0)
    no_factor = _with(YARN, block={"factor": None}, max_position_embeddings=None)
    with pytest.raises(ValueError, match="max_position_embeddings: the config has none"):
        frequencies_from_hf_config(no_factor)


def test_what_transformers_accepts_silently_differs():
    # Why the misspelt key must raise: transformers only warns about it and falls back to
    # max_position_embeddings for the trained length, a different YaRN ramp.
    config = _with(
        YARN,
        max_position_embeddings=131072,
        block={"original_max_position_embeddings": _DROP, "orig_max_position_embeddings": 32768},
    )
    hf_config = _hf_config(config)
    theirs, _ = ROPE_INIT_FUNCTIONS["yarn"](hf_config, "cpu")
    intended = frequencies_from_hf_config(_with(YARN, max_position_embeddings=131072), dtype=F64)[0]
    assert not torch.allclose(theirs.to(F64), intended, rtol=1e-3)
