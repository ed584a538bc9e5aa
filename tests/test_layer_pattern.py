"""NoPE layer patterns, against transformers' configs and what its attention does per layer.

The independent references: the defaults of ``Llama4TextConfig``, ``SmolLM3Config`` and
``Cohere2Config`` (transformers 5.23), the attribute each model's attention reads to
decide whether it rotates (``use_rope``; Cohere2's ``sliding_window``), and, apart from
any attribute, whether a layer's output changes when its rotary tables do. Each
comparison has a neighbour (the interval off by one, the group's first layer for its
last) that fails. The transformers tests are skipped without transformers.
"""

from __future__ import annotations

import pytest
import torch

from pecode.layer_pattern import NOPE_MODEL_TYPES, nope_layers, nope_layers_from_hf

F, T = False, True


def test_nope_layers_by_hand():
    assert nope_layers(8, every=4) == (F, F, F, T, F, F, F, T)
    assert nope_layers(8, every=4, last_in_group=False) == (T, F, F, F, T, F, F, F)
    assert nope_layers(2, every=2) == (F, T)
    assert nope_layers(3, every=1) == (T, T, T)
    assert nope_layers(3, every=4) == (F, F, F)  # shorter than a group: no NoPE layer


@pytest.mark.parametrize("every", [1, 2, 3, 4, 5])
def test_nope_layers_matches_the_modulo_rule(every):
    got = nope_layers(13, every=every)
    assert got == tuple((i + 1) % every == 0 for i in range(13))
    assert sum(got) == 13 // every


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_layers": 0, "every": 4}, ValueError, "num_layers"),
        ({"num_layers": 4.0, "every": 4}, TypeError, "num_layers"),
        ({"num_layers": 4, "every": 0}, ValueError, "every"),
        ({"num_layers": 4, "every": True}, TypeError, "every"),
        ({"num_layers": 4, "every": 2, "last_in_group": 1}, TypeError, "last_in_group"),
    ],
)
def test_nope_layers_rejects_bad_input(kwargs, error, match):
    with pytest.raises(error, match=match):
        nope_layers(**kwargs)


def test_from_hf_reads_dicts_as_config_json_spells_them():
    # SmolLM3-3B's published config: 36 layers, 1 = RoPE, every fourth layer NoPE
    smollm3 = {
        "model_type": "smollm3",
        "num_hidden_layers": 36,
        "no_rope_layers": [int((i + 1) % 4 != 0) for i in range(36)],
    }
    assert nope_layers_from_hf(smollm3) == nope_layers(36, every=4)
    # a list longer than the stack is allowed (transformers: "at least the same length")
    longer = {**smollm3, "num_hidden_layers": 6}
    assert nope_layers_from_hf(longer) == (F, F, F, T, F, F)
    # Llama 4 multimodal: the text_config's
    llama4 = {"model_type": "llama4", "text_config": {**smollm3, "model_type": "llama4_text"}}
    assert nope_layers_from_hf(llama4) == nope_layers(36, every=4)
    cohere2 = {
        "model_type": "cohere2",
        "num_hidden_layers": 4,
        "sliding_window": 4096,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
    }
    assert nope_layers_from_hf(cohere2) == (F, F, F, T)


def test_from_hf_fills_in_the_defaults_as_transformers_does():
    assert nope_layers_from_hf({"model_type": "smollm3", "num_hidden_layers": 8}) == (
        nope_layers(8, every=4)
    )
    interval = {"model_type": "llama4_text", "num_hidden_layers": 6, "no_rope_layer_interval": 3}
    assert nope_layers_from_hf(interval) == (F, F, T, F, F, T)
    # Llama 4 replaces an empty list by the default, SmolLM3 does not
    assert nope_layers_from_hf({**interval, "no_rope_layers": []}) == (F, F, T, F, F, T)
    with pytest.raises(ValueError, match="no_rope_layers has 0 entries"):
        nope_layers_from_hf({**interval, "model_type": "smollm3", "no_rope_layers": []})
    old_cohere2 = {"model_type": "cohere2", "num_hidden_layers": 8, "sliding_window": 4096}
    assert nope_layers_from_hf(old_cohere2) == nope_layers(8, every=4)
    assert nope_layers_from_hf({**old_cohere2, "sliding_window_pattern": 2}) == (
        nope_layers(8, every=2)
    )
    # no window anywhere: Cohere2's attention rotates on no layer
    assert nope_layers_from_hf({**old_cohere2, "sliding_window": None}) == (T,) * 8


@pytest.mark.parametrize(
    ("config", "error", "match"),
    [
        ({"model_type": "llama", "num_hidden_layers": 4}, ValueError, "'llama'"),
        ({"num_hidden_layers": 4}, ValueError, "None"),
        ({"model_type": "smollm3", "num_hidden_layers": "4"}, TypeError, "num_hidden_layers"),
        (
            {"model_type": "smollm3", "num_hidden_layers": 4, "no_rope_layers": [1, 1, 0]},
            ValueError,
            "no_rope_layers has 3 entries",
        ),
        (
            {"model_type": "smollm3", "num_hidden_layers": 2, "no_rope_layers": [1, 2]},
            ValueError,
            "0 \\(NoPE\\) or 1",
        ),
        (
            {"model_type": "smollm3", "num_hidden_layers": 2, "no_rope_layers": "10"},
            TypeError,
            "no_rope_layers",
        ),
        (
            {"model_type": "smollm3", "num_hidden_layers": 4, "no_rope_layer_interval": 0},
            ValueError,
            "no_rope_layer_interval",
        ),
        (
            {
                "model_type": "cohere2",
                "num_hidden_layers": 4,
                "sliding_window": 8,
                "layer_types": ["full_attention"],
            },
            ValueError,
            "layer_types has 1 entries",
        ),
        ({"model_type": "llama4"}, ValueError, "text_config"),
    ],
)
def test_from_hf_rejects_bad_configs(config, error, match):
    with pytest.raises(error, match=match):
        nope_layers_from_hf(config)


# --- against transformers ---------------------------------------------------------------

TINY = {
    "hidden_size": 16,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "vocab_size": 32,
    **dict.fromkeys(("pad_token_id", "bos_token_id", "eos_token_id")),  # in the vocabulary
}


def _hf_config(model_type: str, num_layers: int, every: int):
    """A tiny config of transformers with its own default pattern at interval ``every``."""
    transformers = pytest.importorskip("transformers")
    if model_type == "llama4_text":
        return transformers.Llama4TextConfig(
            **TINY,
            num_hidden_layers=num_layers,
            no_rope_layer_interval=every,
            intermediate_size=16,
            intermediate_size_mlp=16,
            num_local_experts=2,
            head_dim=8,
        )
    if model_type == "smollm3":
        return transformers.SmolLM3Config(
            **TINY, num_hidden_layers=num_layers, no_rope_layer_interval=every, intermediate_size=16
        )
    return transformers.Cohere2Config(
        **TINY,
        num_hidden_layers=num_layers,
        sliding_window_pattern=every,
        sliding_window=4,
        intermediate_size=16,
    )


def _hf_attentions(config):
    """Each decoder layer's attention, as transformers' own model builds it."""
    transformers = pytest.importorskip("transformers")
    model_class = {
        "llama4_text": transformers.Llama4TextModel,
        "smollm3": transformers.SmolLM3Model,
        "cohere2": transformers.Cohere2Model,
    }[config.model_type]
    torch.manual_seed(0)
    return [layer.self_attn for layer in model_class(config).layers]


def _rotates(attention, config) -> bool:
    """Whether the attention's output depends on its rotary tables at all."""
    length = 6
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    x = torch.randn(1, length, config.hidden_size, generator=torch.Generator().manual_seed(1))
    angles = torch.rand(1, length, head_dim // 2, generator=torch.Generator().manual_seed(2)) * 6
    if config.model_type == "llama4_text":  # complex tables, one per pair
        one = torch.ones_like(angles)
        tables = [torch.polar(one, torch.zeros_like(angles)), torch.polar(one, angles)]
    else:  # cos, sin over the whole head
        full = torch.cat((angles, angles), -1)
        tables = [(torch.ones_like(full), torch.zeros_like(full)), (full.cos(), full.sin())]
    with torch.no_grad():
        plain, rotated = (
            attention(x, position_embeddings=table, attention_mask=None)[0] for table in tables
        )
    return not torch.equal(plain, rotated)


def _decides_rope(attention, model_type: str) -> bool:
    """The attribute transformers' attention reads to decide whether it rotates."""
    if model_type == "cohere2":
        return attention.sliding_window is not None
    return bool(attention.use_rope)


@pytest.mark.parametrize("model_type", ["llama4_text", "smollm3", "cohere2"])
@pytest.mark.parametrize(("num_layers", "every"), [(8, 4), (7, 3), (6, 2)])
def test_from_hf_matches_the_config_and_each_layers_attention(model_type, num_layers, every):
    config = _hf_config(model_type, num_layers, every)
    expected = nope_layers_from_hf(config)
    assert expected == nope_layers(num_layers, every=every)
    # the neighbours: the interval off by one each way, the first of each group
    for neighbour in (
        nope_layers(num_layers, every=every + 1),
        nope_layers(num_layers, every=every - 1) if every > 1 else None,
        nope_layers(num_layers, every=every, last_in_group=False),
    ):
        if neighbour is not None:
            assert neighbour != expected
    attentions = _hf_attentions(config)
    assert tuple(not _decides_rope(a, model_type) for a in attentions) == expected
    assert tuple(not _rotates(a, config) for a in attentions) == expected


@pytest.mark.parametrize("model_type", ["llama4_text", "smollm3"])
def test_from_hf_reads_an_explicit_no_rope_list_as_the_model_does(model_type):
    config = _hf_config(model_type, 5, 4)
    config.no_rope_layers = [0, 1, 1, 0, 1]  # 1: RoPE; layers 0 and 3 NoPE
    assert nope_layers_from_hf(config) == (T, F, F, T, F)
    attentions = _hf_attentions(config)
    assert tuple(not a.use_rope for a in attentions) == (T, F, F, T, F)
    assert tuple(not _rotates(a, config) for a in attentions) == (T, F, F, T, F)


def test_cohere2_without_a_window_rotates_no_layer():
    config = _hf_config("cohere2", 4, 2)
    config.sliding_window = None
    assert nope_layers_from_hf(config) == (T, T, T, T)
    attentions = _hf_attentions(config)
    assert not any(_rotates(a, config) for a in attentions)


def test_from_hf_names_a_model_type_without_nope_layers():
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(**TINY, num_hidden_layers=2)
    with pytest.raises(ValueError, match="model_type 'llama'"):
        nope_layers_from_hf(config)
    assert "llama" not in NOPE_MODEL_TYPES
