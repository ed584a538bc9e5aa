"""Gemma 4's RoPE against transformers' ``Gemma4TextRotaryEmbedding``.

Gemma 4 gives its two layer types different rotations and different head widths: the
sliding layers default RoPE on ``head_dim`` features, the full-attention layers the
``proportional`` type (a quarter of the pairs across the whole head turned, exponent
``2i / width``, frequency zero past them) on ``global_head_dim`` features. transformers
reads the global width from the config's ``per_layer_config`` (a config object's
``to_dict()``) or ``global_head_dim`` (a published ``config.json``). The reference is
transformers' own rotary embedding and apply function on a tiny config; the neighbour
reads the global layers with the sliding width, as pecode did before.
"""

from __future__ import annotations

import pytest
import torch

from pecode.rope import RotaryEmbedding, RotaryEmbeddingPerLayerType

transformers = pytest.importorskip("transformers")

from transformers.models.gemma4 import modeling_gemma4 as gemma4  # noqa: E402

TYPES = ["sliding_attention", "full_attention", "sliding_attention", "full_attention"]


def tiny_config(global_head_dim: int = 64):
    return transformers.Gemma4TextConfig(
        hidden_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        global_head_dim=global_head_dim,
        num_hidden_layers=len(TYPES),
        layer_types=TYPES,
        max_position_embeddings=256,
    )


def position_ids() -> torch.Tensor:
    return torch.stack((torch.arange(64), torch.arange(64) + 100))  # [B=2, L=64]


@pytest.mark.parametrize("layer_type", ["sliding_attention", "full_attention"])
def test_tables_equal_gemma4_rotary_embedding_per_layer_type(layer_type):
    config = tiny_config()
    x = torch.zeros(1)
    theirs = gemma4.Gemma4TextRotaryEmbedding(config)(x, position_ids(), layer_type)
    ours = RotaryEmbeddingPerLayerType.from_hf_config(config)(x, position_ids(), layer_type)
    width = 64 if layer_type == "full_attention" else 32
    for mine, their in zip(ours, theirs, strict=True):
        assert mine.shape == their.shape == (2, 64, width)
        assert (mine - their).abs().max() < 1e-5


def test_a_published_config_json_with_global_head_dim_reads_the_same():
    # the published form: head_dim for the sliding layers, global_head_dim beside it
    published = {
        "model_type": "gemma4_text",
        "head_dim": 32,
        "global_head_dim": 64,
        "layer_types": TYPES,
        "max_position_embeddings": 256,
        "rope_parameters": tiny_config().rope_parameters,
    }
    config = tiny_config()
    x = torch.zeros(1)
    theirs = gemma4.Gemma4TextRotaryEmbedding(config)(x, position_ids(), "full_attention")
    rope = RotaryEmbedding.from_hf_config(published, layer_type="full_attention")
    ours = rope(x, position_ids())
    assert rope.head_dim == 64
    assert (ours[0] - theirs[0]).abs().max() < 1e-5
    assert (ours[1] - theirs[1]).abs().max() < 1e-5
    with pytest.raises(ValueError, match="global_head_dim"):
        RotaryEmbedding.from_hf_config(
            {k: v for k, v in published.items() if k != "global_head_dim"},
            layer_type="full_attention",
        )


def test_rotated_queries_equal_gemma4_apply_and_the_sliding_width_neighbour_differs():
    config = tiny_config()
    q = torch.randn(2, 2, 64, 64, generator=torch.Generator().manual_seed(0))
    cos, sin = gemma4.Gemma4TextRotaryEmbedding(config)(q, position_ids(), "full_attention")
    theirs = gemma4.apply_rotary_pos_emb(q, cos, sin)  # one tensor at a time in Gemma 4
    rotary = RotaryEmbeddingPerLayerType.from_hf_config(config)
    ours = rotary["full_attention"].rotate(q, position_ids())
    # transformers' float32 angles up to 163 radians: a float32 step there is 1.5e-5
    assert (ours - theirs).abs().max() < 3e-5
    # the neighbour: the proportional quarter of a 32-wide head, as if the global layers
    # had the sliding width (4 frequencies of exponent 2i/32 instead of 8 of 2i/64)
    narrow = RotaryEmbedding(
        32, base=1e6, scaling="proportional", scaling_params={"partial_rotary_factor": 0.25}
    )
    wrong = torch.cat((narrow.rotate(q[..., :32], position_ids()), q[..., 32:]), dim=-1)
    assert (wrong - theirs).abs().max() > 0.1
