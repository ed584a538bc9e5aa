"""Hugging Face's own rotary embedding for a config: the independent reference of the
config tests (tests/test_published_configs.py, tests/test_conformance.py)."""

from __future__ import annotations


def model_rotary_embedding(hf_config):
    """The model's own rotary embedding class, built from its configuration (the text
    model's for a multimodal one; never a vision tower's)."""
    from transformers.models.auto.configuration_auto import model_type_to_module_name

    module = model_type_to_module_name(hf_config.model_type)
    models = __import__(f"transformers.models.{module}.modeling_{module}", fromlist=["_"])
    names = [
        name
        for name in vars(models)
        if name.endswith("RotaryEmbedding") and "Vision" not in name and name[0] != "_"
    ]
    text = [name for name in names if name.endswith("TextRotaryEmbedding")]
    return getattr(models, (text or names)[0])(hf_config)
