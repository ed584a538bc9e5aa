"""2025–26 model configs read as transformers reads them, against transformers' own code.

Published ``config.json`` forms that pecode used to misread or refuse (issue 26):
Gemma 3 and OLMo 3 in transformers 4's flat form (one base or one scaling per layer
type), configs with one block for every layer type (Gemma 2, Cohere 2, gpt-oss), a
multimodal ``text_config``, a transformers config object, Llama 4 Scout's ``llama3``
block with equal band factors, HunYuan's ``dynamic`` block with a fixed ``alpha``, and
Ministral 3's block carrying ``llama_4_scaling_beta``, its query temperature. The
independent reference is each model's own rotary embedding (or transformers'
``ROPE_INIT_FUNCTIONS``, or its query-scale function) built from the same dict; each
test has a neighbour that shows the comparison can fail. Skipped without transformers.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

from pecode.rope import RotaryEmbedding, RotaryEmbeddingPerLayerType  # noqa: E402
from pecode.scaling import (  # noqa: E402
    frequencies_from_hf_config,
    hf_layer_types,
    hf_query_temperature,
    hf_rope_arguments,
    log_length_query_scale,
)

F64 = torch.float64
# transformers computes its tables in float32: frequencies agree to its rounding
FREQ_RTOL = 1e-6

# Gemma 3 4B's text config as published (transformers 4 form), fewer layers
GEMMA3 = {
    "model_type": "gemma3_text",
    "hidden_size": 2560,
    "num_attention_heads": 8,
    "head_dim": 256,
    "num_hidden_layers": 12,
    "max_position_embeddings": 131072,
    "rope_theta": 1000000.0,
    "rope_local_base_freq": 10000.0,
    "rope_scaling": {"factor": 8.0, "rope_type": "linear"},
    "sliding_window_pattern": 6,
}
# OLMo 3 7B's RoPE keys as published: YaRN on the full-attention layers only
OLMO3 = {
    "model_type": "olmo3",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_hidden_layers": 8,
    "max_position_embeddings": 65536,
    "rope_theta": 500000.0,
    "rope_scaling": {
        "rope_type": "yarn",
        "factor": 8.0,
        "original_max_position_embeddings": 8192,
        "attention_factor": 1.2079441541679836,
        "beta_fast": 32,
        "beta_slow": 1,
    },
}


def _hf_config(config: dict):
    return transformers.AutoConfig.for_model(**copy.deepcopy(config))


def _rotary(config: dict, module: str, name: str):
    models = __import__(f"transformers.models.{module}.modeling_{module}", fromlist=["_"])
    return getattr(models, name)(_hf_config(config))


def _per_layer_tables(rotary, layer_type: str) -> tuple[torch.Tensor, float]:
    inv_freq = getattr(rotary, f"{layer_type}_inv_freq").to(F64)
    return inv_freq, float(getattr(rotary, f"{layer_type}_attention_scaling"))


@pytest.mark.parametrize(
    ("config", "module", "name"),
    [(GEMMA3, "gemma3", "Gemma3RotaryEmbedding"), (OLMO3, "olmo3", "Olmo3RotaryEmbedding")],
    ids=["gemma3", "olmo3"],
)
def test_flat_configs_are_read_per_layer_type_as_transformers_reads_them(config, module, name):
    rotary = _rotary(config, module, name)
    assert hf_layer_types(config) == ["full_attention", "sliding_attention"]
    tables = {}
    for layer_type in ("full_attention", "sliding_attention"):
        theirs, their_factor = _per_layer_tables(rotary, layer_type)
        ours, factor = frequencies_from_hf_config(config, layer_type=layer_type, dtype=F64)
        assert torch.allclose(ours, theirs, rtol=FREQ_RTOL, atol=0.0), layer_type
        assert math.isclose(factor, their_factor, rel_tol=1e-12), layer_type
        tables[layer_type] = ours
    # the neighbour: the two layer types differ (what reading one table for all drops)
    assert not torch.allclose(tables["full_attention"], tables["sliding_attention"], rtol=1e-3)
    with pytest.raises(ValueError, match=r"one block per layer type.*layer_type="):
        frequencies_from_hf_config(config)


def test_per_layer_type_module_stands_in_for_gemma3_rotary_emb():
    # Gemma 3's decoder calls rotary_emb(x, position_ids, layer_type)
    rotary = _rotary(GEMMA3, "gemma3", "Gemma3RotaryEmbedding")
    ours = RotaryEmbeddingPerLayerType.from_hf_config(GEMMA3)
    x, position_ids = torch.zeros(2, dtype=torch.float32), torch.arange(40).view(2, 20)
    for layer_type in ("full_attention", "sliding_attention"):
        their_cos, their_sin = rotary(x, position_ids, layer_type)
        cos, sin = ours(x, position_ids, layer_type)
        assert cos.shape == their_cos.shape == (2, 20, 256)
        # float32 angles up to 40 rad in transformers: within 4e-6
        assert (cos - their_cos).abs().max() < 4e-6
        assert (sin - their_sin).abs().max() < 4e-6
    full, sliding = ours["full_attention"], ours["sliding_attention"]
    assert not torch.equal(full(x, position_ids)[0], sliding(x, position_ids)[0])  # neighbour
    assert full(x, position_ids, "full_attention")[0].equal(full(x, position_ids)[0])
    with pytest.raises(ValueError, match="holds the tables of 'full_attention'"):
        full(x, position_ids, "sliding_attention")
    with pytest.raises(KeyError, match="chunked_attention"):
        ours(x, position_ids, "chunked_attention")


def test_a_multimodal_config_and_a_config_object_read_the_same():
    multimodal = {"model_type": "gemma3", "text_config": GEMMA3, "vision_config": {}}
    hf_object = _hf_config(GEMMA3)  # a transformers config, as model.config
    for layer_type in ("full_attention", "sliding_attention"):
        expected = frequencies_from_hf_config(GEMMA3, layer_type=layer_type, dtype=F64)
        for config in (multimodal, hf_object):
            got = frequencies_from_hf_config(config, layer_type=layer_type, dtype=F64)
            assert torch.equal(got[0], expected[0])
            assert got[1] == expected[1]
    rope = RotaryEmbedding.from_hf_config(hf_object, layer_type="sliding_attention")
    assert (rope.base, rope.scaling, rope.layer_type) == (10000.0, "default", "sliding_attention")
    with pytest.raises(TypeError, match=r"config must be a dict .* or a transformers config"):
        frequencies_from_hf_config(42)


def test_what_pecode_refuses_in_flat_per_layer_type_configs():
    # transformers 5.23 gives a flat OLMo 3 config's sliding layers its default base
    # 500000 whatever rope_theta says: such a config cannot mean what it seems to
    ten_thousand = {**OLMO3, "rope_theta": 10000.0}
    rotary = _rotary(ten_thousand, "olmo3", "Olmo3RotaryEmbedding")
    theirs, _ = _per_layer_tables(rotary, "sliding_attention")
    assert math.isclose(float(theirs[1]), 500000.0 ** (-2 / 128), rel_tol=1e-6)
    with pytest.raises(ValueError, match="whatever rope_theta says"):
        frequencies_from_hf_config(ten_thousand, layer_type="sliding_attention")
    no_local = {key: value for key, value in GEMMA3.items() if key != "rope_local_base_freq"}
    with pytest.raises(ValueError, match="rope_local_base_freq: the gemma3_text config gives none"):
        frequencies_from_hf_config(no_local, layer_type="sliding_attention")


@pytest.mark.parametrize(
    ("model_type", "extra"),
    [
        ("gemma2", {"head_dim": 256, "rope_theta": 10000.0}),
        ("cohere2", {"rope_theta": 50000.0}),
        ("gpt_oss", {"head_dim": 64}),  # its class's default yarn block, written out below
    ],
)
def test_one_block_serves_every_listed_layer_type(model_type, extra):
    fields = {"hidden_size": 2048, "num_attention_heads": 16, "num_hidden_layers": 4, **extra}
    written = _hf_config({"model_type": model_type, **fields}).to_dict()
    assert set(written["layer_types"]) == {"full_attention", "sliding_attention"}
    assert hf_layer_types(written) == ["full_attention", "sliding_attention"]
    hf_config = _hf_config(written)
    rope_type = hf_config.rope_parameters["rope_type"]
    if rope_type == "default":
        theirs = 1.0 / hf_config.rope_parameters["rope_theta"] ** (
            torch.arange(0, hf_config.head_dim, 2, dtype=F64) / hf_config.head_dim
        )
    else:
        theirs = ROPE_INIT_FUNCTIONS[rope_type](hf_config, "cpu")[0].to(F64)
    for layer_type in ("full_attention", "sliding_attention"):
        ours, _ = frequencies_from_hf_config(written, layer_type=layer_type, dtype=F64)
        assert torch.allclose(ours, theirs, rtol=FREQ_RTOL, atol=0.0)
    with pytest.raises(ValueError, match="not among the config's layer_types"):
        frequencies_from_hf_config(written, layer_type="chunked_attention")


def test_llama4_scout_block_with_equal_band_factors_is_a_step():
    config = {
        "model_type": "llama",
        "hidden_size": 5120,
        "num_attention_heads": 40,
        "head_dim": 128,
        "max_position_embeddings": 10485760,
        "rope_theta": 500000.0,
        "rope_scaling": {
            "factor": 16.0,
            "high_freq_factor": 1.0,
            "low_freq_factor": 1.0,
            "original_max_position_embeddings": 8192,
            "rope_type": "llama3",
        },
    }
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](_hf_config(config), "cpu")
    ours, factor = frequencies_from_hf_config(config, dtype=F64)
    assert torch.allclose(ours, theirs.to(F64), rtol=FREQ_RTOL, atol=0.0)
    assert factor == 1.0
    # a step: each pair kept or divided by 16, nothing between (the neighbour: Llama 3.1's
    # band factors 1 and 4 put pairs between)
    base = 500000.0 ** (-torch.arange(0, 128, 2, dtype=F64) / 128)
    ratio = base / ours
    assert torch.all(
        torch.isclose(ratio, torch.ones_like(ratio))
        | torch.isclose(ratio, torch.full_like(ratio, 16.0))
    )
    banded = copy.deepcopy(config)
    banded["rope_scaling"]["high_freq_factor"] = 4.0
    between = base / frequencies_from_hf_config(banded, dtype=F64)[0]
    assert ((between > 1.01) & (between < 15.9)).any()


def test_hunyuan_dynamic_block_with_alpha_is_a_fixed_ntk_base():
    config = {
        "model_type": "hunyuan_v1_dense",
        "hidden_size": 4096,
        "num_attention_heads": 32,
        "head_dim": 128,
        "max_position_embeddings": 32768,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "alpha": 1000.0,
            "beta_fast": 32,
            "beta_slow": 1,
            "factor": 1.0,
            "mscale": 1.0,
            "mscale_all_dim": 1.0,
            "type": "dynamic",
        },
    }
    rotary = _rotary(config, "hunyuan_v1_dense", "HunYuanDenseV1RotaryEmbedding")
    ours, factor = frequencies_from_hf_config(config, dtype=F64)
    assert torch.allclose(ours, rotary.inv_freq.to(F64), rtol=FREQ_RTOL, atol=0.0)
    assert factor == rotary.attention_scaling == 1.0
    for seq_len in (100, 100000):  # fixed: the neighbour, plain dynamic, changes with length
        assert torch.equal(frequencies_from_hf_config(config, seq_len=seq_len, dtype=F64)[0], ours)
    assert hf_rope_arguments(config)["scaling"] == "ntk"
    with pytest.raises(ValueError, match="only HunYuan's model classes read it"):
        frequencies_from_hf_config({**config, "model_type": "llama"})
    bad = copy.deepcopy(config)
    bad["rope_scaling"]["factor"] = 2.0
    with pytest.raises(ValueError, match="set factor to 1"):
        frequencies_from_hf_config(bad)


MINISTRAL3 = {
    "model_type": "ministral3",
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "head_dim": 128,
    "max_position_embeddings": 262144,
    "rope_parameters": {
        "type": "yarn",
        "rope_type": "yarn",
        "rope_theta": 1000000.0,
        "factor": 16.0,
        "original_max_position_embeddings": 16384,
        "max_position_embeddings": 262144,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "mscale_all_dim": 1.0,
        "mscale": 1.0,
        "llama_4_scaling_beta": 0.1,
    },
}


def test_ministral3_block_with_its_query_temperature():
    from transformers.models.ministral3.modeling_ministral3 import get_llama_4_attn_scale

    rotary = _rotary(MINISTRAL3, "ministral3", "Ministral3RotaryEmbedding")
    ours, factor = frequencies_from_hf_config(MINISTRAL3, dtype=F64)
    assert torch.allclose(ours, rotary.inv_freq.to(F64), rtol=FREQ_RTOL, atol=0.0)
    assert math.isclose(factor, rotary.attention_scaling, rel_tol=1e-12)
    temperature = hf_query_temperature(MINISTRAL3)
    assert temperature == {
        "beta": 0.1,
        "length": 16384,
        "offset": 0,
        "by": "position",
        "layers": "all",
    }
    positions = torch.tensor([[0, 16383, 16384, 50000, 200000]])
    theirs = get_llama_4_attn_scale(positions, 0.1, 16384)[:, 0, :, 0]
    mine = log_length_query_scale(positions, temperature["beta"], temperature["length"])
    assert torch.allclose(mine, theirs.to(F64), rtol=1e-6)
    assert mine[0, 1] == 1.0
    assert mine[0, 2] > 1.0
    conflicting = copy.deepcopy(MINISTRAL3)
    conflicting["rope_parameters"]["max_position_embeddings"] = 131072
    with pytest.raises(ValueError, match="max_position_embeddings is given twice"):
        frequencies_from_hf_config(conflicting)
    assert hf_query_temperature(GEMMA3) is None


def test_llama4_nope_layers_temperature_against_a_loop():
    # Llama4TextAttention: q * (log1p(floor((p + 1) / floor_scale)) * attn_scale + 1)
    config = {
        "model_type": "llama4_text",
        "attn_temperature_tuning": True,
        "attn_scale": 0.1,
        "floor_scale": 8192,
        "rope_theta": 500000.0,
    }
    temperature = hf_query_temperature(config)
    assert temperature == {
        "beta": 0.1,
        "length": 8192,
        "offset": 1,
        "by": "index",
        "layers": "nope",
    }
    positions = torch.tensor([0, 8190, 8191, 16383, 10**6])
    loop = [1 + 0.1 * math.log(1 + (p + 1) // 8192) for p in positions.tolist()]
    scale = log_length_query_scale(positions, 0.1, 8192, offset=1)
    assert scale.tolist() == pytest.approx(loop, rel=1e-15)
    assert scale[1] == 1.0
    assert scale[2] > 1.0
    with pytest.raises(ValueError, match="positions must be non-negative"):
        log_length_query_scale(torch.tensor([-1]), 0.1, 8192)
    with pytest.raises(TypeError, match="positions must be an integer"):
        log_length_query_scale(torch.tensor([1.0]), 0.1, 8192)


def test_llama4_config_with_a_partial_rotary_factor_is_refused():
    # Llama4TextRotaryEmbedding turns the whole head whatever partial_rotary_factor says;
    # read as other models read it, half the head would turn (logits 0.4 off)
    config = {
        "model_type": "llama4_text",
        "head_dim": 8,
        "rope_theta": 500000.0,
        "partial_rotary_factor": 0.5,
    }
    with pytest.raises(ValueError, match="ignores it and rotates the whole head"):
        hf_rope_arguments(config)
    del config["partial_rotary_factor"]
    assert hf_rope_arguments(config)["rotary_dim"] == 8
