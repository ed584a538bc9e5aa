"""Every pecode module that holds settings shows them in its repr (``extra_repr``).

Each case builds a module with settings other than the defaults and checks that the
repr names each of them with the value the constructor was given, so a setting that is
missing, misnamed or shows a default instead of the given value fails.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import inspect
import pkgutil

import pytest
import torch
from torch import nn

import pecode
from pecode.absolute import LearnedPositionalEncoding, SinusoidalPositionalEncoding
from pecode.alibi import ALiBi
from pecode.attention import ContentOnly, MultiHeadAttention
from pecode.cope import CoPE
from pecode.experiments.models import FrequencyRotary, ScaledQueries, SilencedPairs, TinyDecoder
from pecode.fire import FIRE
from pecode.forgetting import ForgettingGate
from pecode.grid_rope import AxialRotaryEmbedding, MixedRotaryEmbedding
from pecode.hf import HFLlamaAttention
from pecode.kerple import Kerple
from pecode.mla import MultiHeadLatentAttention
from pecode.relative import (
    DebertaRelativePosition,
    ShawRelativePosition,
    T5RelativePositionBias,
    TransformerXLRelativePosition,
)
from pecode.rerope import ReRoPE
from pecode.rope import RotaryEmbedding
from pecode.sandwich import Sandwich
from pecode.scaling import logn_query_scale
from pecode.xpos import XPos

# modules whose settings all live in their submodules, or that have none
NO_SETTINGS_OF_THEIR_OWN = {"PositionScheme", "_Block", "RotaryEmbeddingPerLayerType"}


def _cases() -> list[tuple[nn.Module, dict[str, object]]]:
    """(module, the settings its repr must show as ``name=value``)."""
    rope_settings = {
        "head_dim": 16,
        "base": 500.0,
        "layout": "interleaved",
        "rotary_dim": 8,
        "dtype": torch.float64,
        "scaling": "linear",
        "scaling_params": {"factor": 2.0},
    }
    mha_settings = {
        "num_kv_heads": 2,
        "context_dim": 24,
        "bias": False,
        "dropout": 0.25,
        "kernel": "dense",
    }
    options_2026 = {
        "head_dim": 6,
        "qkv_bias": True,
        "out_bias": False,
        "qk_norm": "head",
        "logit_scale": 0.5,
        "softcap": 30.0,
        "sinks": True,
        "window": 8,
        "chunk": 16,
        "query_temperature": {"beta": 0.1, "length": 64, "offset": 1, "by": "index"},
    }
    t5_settings = {
        "bidirectional": False,
        "num_buckets": 16,
        "max_distance": 64,
        "scale_logits": True,
    }
    deberta_settings = {
        "max_distance": 32,
        "position_buckets": 16,
        "share_att_key": True,
        "p2c_index": "paper",
    }
    decoder_settings = {
        "vocab_size": 11,
        "max_len": 20,
        "dim": 32,
        "num_heads": 2,
        "num_layers": 3,
        "output_size": 5,
    }
    hf_layer = MultiHeadAttention(16, 2, position=RotaryEmbedding(8))
    mla_settings = {
        "num_heads": 2,
        "kv_rank": 5,
        "rope_dim": 4,
        "nope_dim": 6,
        "v_dim": 3,
        "q_rank": 7,
        "logit_scale": 0.5,
    }
    return [
        (
            SinusoidalPositionalEncoding(8, base=500.0, max_len=16, input_scale=2.0),
            {"dim": 8, "base": 500.0, "rows": 16, "input_scale": 2.0},
        ),
        (LearnedPositionalEncoding(12, 8), {"max_len": 12, "dim": 8}),
        (ALiBi(6, symmetric=True), {"num_heads": 6, "symmetric": True}),
        (ContentOnly(logit_scale=0.5), {"logit_scale": 0.5}),
        (
            MultiHeadAttention(32, 8, **mha_settings),
            {"embed_dim": 32, "num_heads": 8, "head_dim": 4, **mha_settings},
        ),
        (
            MultiHeadAttention(32, 8, **options_2026),
            {"embed_dim": 32, "num_heads": 8, **options_2026},
        ),
        (RotaryEmbedding(**rope_settings), rope_settings),
        (T5RelativePositionBias(3, **t5_settings), {"num_heads": 3, **t5_settings}),
        (
            ShawRelativePosition(8, 5, memory_efficient=False),
            {"head_dim": 8, "max_distance": 5, "memory_efficient": False},
        ),
        (
            TransformerXLRelativePosition(16, 2, 8, causal=True),
            {"model_dim": 16, "num_heads": 2, "head_dim": 8, "causal": True},
        ),
        (
            DebertaRelativePosition(16, 2, 8, **deberta_settings),
            {"model_dim": 16, "num_heads": 2, "head_dim": 8, **deberta_settings},
        ),
        (HFLlamaAttention(hf_layer, 3), {"layer_idx": 3}),
        (MultiHeadLatentAttention(16, **mla_settings), {"embed_dim": 16, **mla_settings}),
        (TinyDecoder("alibi", **decoder_settings), {"scheme": "alibi", **decoder_settings}),
        (FrequencyRotary(torch.ones(6), 1.5), {"head_dim": 12, "attention_factor": 1.5}),
        (SilencedPairs(RotaryEmbedding(8), [3, 1]), {"pairs": [3, 1]}),
        (
            ScaledQueries(RotaryEmbedding(8), functools.partial(logn_query_scale, length=16)),
            {"scale": "logn_query_scale(length=16)"},
        ),
        (ReRoPE(RotaryEmbedding(8), 4, leak=2.0), {"head_dim": 8, "window": 4, "leak": 2.0}),
        (Kerple(3, "power"), {"num_heads": 3, "kind": "power"}),
        (Sandwich(3, d_bar=64, base=500.0), {"num_heads": 3, "d_bar": 64, "base": 500.0}),
        (
            FIRE(3, 16, eps=1e-5, log_transform=False),
            {"num_heads": 3, "hidden": 16, "eps": 1e-5, "log_transform": False},
        ),
        (ForgettingGate(3, 8), {"num_heads": 3, "head_dim": 8}),
        (
            XPos(
                8,
                base=500.0,
                smoothing=0.5,
                scale_base=256.0,
                centre=4,
                layout="interleaved",
                dtype=torch.float64,
            ),
            {
                "head_dim": 8,
                "base": 500.0,
                "smoothing": 0.5,
                "scale_base": 256.0,
                "centre": 4,
                "layout": "interleaved",
                "dtype": torch.float64,
            },
        ),
        (
            CoPE(8, 16, num_heads=2, gate_scale=0.5),
            {"head_dim": 8, "npos_max": 16, "num_heads": 2, "gate_scale": 0.5},
        ),
        (
            TinyDecoder("rope_nope", **decoder_settings, nope_every=2),
            {"scheme": "rope_nope", "nope_every": 2, **decoder_settings},
        ),
        (
            AxialRotaryEmbedding(8, base=100.0, layout="interleaved"),
            {"head_dim": 8, "base": 100.0, "layout": "interleaved"},
        ),
        (
            MixedRotaryEmbedding(8, 3, base=10.0, layout="interleaved"),
            {"head_dim": 8, "num_heads": 3, "base": 10.0, "layout": "interleaved"},
        ),
    ]


CASES = _cases()


@pytest.mark.parametrize(("module", "settings"), CASES, ids=lambda c: type(c).__name__)
def test_repr_shows_the_settings_given(module, settings):
    shown = module.extra_repr()
    for name, value in settings.items():
        assert f"{name}={value!r}" in shown, f"{name}={value!r} not in {shown!r}"
    assert shown in repr(module)  # what print(module) shows
    assert "tensor(" not in shown  # settings, not weights or buffers


def _pecode_modules() -> set[type[nn.Module]]:
    """Every nn.Module subclass defined in pecode."""
    found: set[type[nn.Module]] = set()
    for info in pkgutil.walk_packages(pecode.__path__, "pecode."):
        if info.name == "pecode.rope_triton" and importlib.util.find_spec("triton") is None:
            continue  # the CUDA kernel's module needs Triton (not in make test-oldest)
        module = importlib.import_module(info.name)
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, nn.Module) and cls.__module__.startswith("pecode"):
                found.add(cls)
    return found


def test_every_pecode_module_with_settings_has_a_case():
    tested = {type(module) for module, _ in CASES}
    found = _pecode_modules()
    assert tested <= found
    for cls in found:
        if cls.__name__ in NO_SETTINGS_OF_THEIR_OWN:
            continue
        assert "extra_repr" in vars(cls), f"{cls.__qualname__} has no extra_repr"
        assert cls in tested, f"{cls.__qualname__} has no case in tests/test_reprs.py"
