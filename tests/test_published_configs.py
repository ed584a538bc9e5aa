"""Published configs (``pecode/conformance/published_configs.json``) against transformers.

Each entry holds the position keys of a published model's ``config.json`` (Llama 3.x and
4, Qwen2.5, Qwen3, Qwen3.5, Gemma 2, 3 and 4, DeepSeek-V2/V3, gpt-oss, Phi-3.5/Phi-4-mini,
SmolLM3, OLMo 3, Ministral 3, Pythia, Mistral, Code Llama, HunYuan) and where they were
read. For every entry and every layer type it gives, pecode's
:func:`~pecode.scaling.frequencies_from_hf_config` is compared with transformers'
own reading of the same dict: the model's rotary embedding built by
``AutoConfig.for_model`` (its ``inv_freq`` and ``attention_scaling``, or the per layer
type tables), and for the length-dependent rope types ``ROPE_INIT_FUNCTIONS`` at a
length past the trained one. Frequencies agree to transformers' float32 rounding,
attention factors to 1e-12. The neighbours show the comparison can fail: another layer
type's block, or Phi-4-mini without its top-level trained length, gives other numbers.
Skipped without transformers.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

transformers = pytest.importorskip("transformers")

from hf_rotary import model_rotary_embedding  # noqa: E402
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS  # noqa: E402

from pecode.conformance import published_configs  # noqa: E402
from pecode.scaling import frequencies_from_hf_config, hf_layer_types  # noqa: E402

F64 = torch.float64
# transformers computes its tables in float32: frequencies agree to its rounding
FREQ_RTOL = 1e-6
CONFIGS = published_configs()
CASES = [(name, lt) for name, entry in CONFIGS.items() for lt in hf_layer_types(entry["config"])]


def _text_config(config: dict):
    """transformers' configuration object for the dict (a copy: it edits what it gets),
    its text part for a multimodal config."""
    return transformers.AutoConfig.for_model(**copy.deepcopy(config)).get_text_config()


_rotary = model_rotary_embedding


def _theirs(rotary, layer_type: str) -> tuple[torch.Tensor, float]:
    if hasattr(rotary, f"{layer_type}_inv_freq"):  # one table per layer type
        inv_freq = getattr(rotary, f"{layer_type}_inv_freq")
        return inv_freq.to(F64), float(getattr(rotary, f"{layer_type}_attention_scaling"))
    return rotary.inv_freq.to(F64), float(rotary.attention_scaling)


def _block(hf_config, layer_type: str) -> dict:
    parameters = hf_config.rope_parameters
    return parameters.get(layer_type, parameters)


def _layer_type_argument(config: dict, layer_type: str) -> str | None:
    # a config whose keys give no layer types is read with layer_type=None
    text = config.get("text_config", config)
    listed = "layer_types" in text or text.get("model_type") in ("gemma3_text", "olmo3")
    per_type = (
        isinstance(text.get("rope_parameters"), dict) and layer_type in (text["rope_parameters"])
    )
    return layer_type if listed or per_type else None


# pecode and transformers disagree here; each is marked, not hidden
DISAGREE: dict[tuple[str, str], str] = {}


def _params(cases):
    return [
        pytest.param(
            name,
            lt,
            marks=[pytest.mark.xfail(strict=True, reason=DISAGREE[(name, lt)])]
            if (name, lt) in DISAGREE
            else [],
            id=f"{name}-{lt}",
        )
        for name, lt in cases
    ]


@pytest.mark.parametrize(("name", "layer_type"), _params(CASES))
def test_frequencies_equal_the_models_rotary_embedding(name, layer_type):
    config = CONFIGS[name]["config"]
    hf_config = _text_config(config)
    theirs, their_factor = _theirs(_rotary(hf_config), layer_type)
    ours, factor = frequencies_from_hf_config(
        config, layer_type=_layer_type_argument(config, layer_type), dtype=F64
    )
    assert ours.shape == theirs.shape
    assert torch.allclose(ours, theirs, rtol=FREQ_RTOL, atol=0.0)
    assert math.isclose(factor, their_factor, rel_tol=1e-12)


def _length_dependent(name: str, layer_type: str) -> bool:
    block = _block(_text_config(CONFIGS[name]["config"]), layer_type)
    # HunYuan's dynamic block with alpha: its rotary embedding fixes the base (compared
    # above), ROPE_INIT_FUNCTIONS["dynamic"] is not what the model runs
    return block["rope_type"] in ("longrope", "dynamic") and not block.get("alpha")


LENGTH_DEPENDENT = [(name, lt) for name, lt in CASES if _length_dependent(name, lt)]


@pytest.mark.parametrize(("name", "layer_type"), _params(LENGTH_DEPENDENT))
def test_length_dependent_types_past_the_trained_length(name, layer_type):
    config = CONFIGS[name]["config"]
    hf_config = _text_config(config)
    block = _block(hf_config, layer_type)
    trained = block.get("original_max_position_embeddings") or hf_config.max_position_embeddings
    for seq_len in (trained, trained + 1, 4 * trained):
        theirs, their_factor = ROPE_INIT_FUNCTIONS[block["rope_type"]](
            hf_config, "cpu", seq_len=seq_len
        )
        ours, factor = frequencies_from_hf_config(
            config,
            seq_len=seq_len,
            layer_type=_layer_type_argument(config, layer_type),
            dtype=F64,
        )
        assert torch.allclose(ours, theirs.to(F64), rtol=FREQ_RTOL, atol=0.0), seq_len
        assert math.isclose(factor, float(their_factor), rel_tol=1e-12), seq_len


def _rope_type(entry: dict) -> set[str]:
    text = entry["config"].get("text_config", entry["config"])
    block = text.get("rope_parameters") or text.get("rope_scaling") or {}
    blocks = (
        block.values() if block and all(isinstance(b, dict) for b in block.values()) else [block]
    )
    return {b.get("rope_type", b.get("type", "default")) for b in blocks}


def test_the_file_covers_every_rope_type_with_provenance():
    assert len(CONFIGS) >= 15
    for name, entry in CONFIGS.items():
        for key in ("model", "source", "note"):
            assert isinstance(entry[key], str), (name, key)
            assert entry[key].strip(), (name, key)
        assert isinstance(entry["config"], dict), name
        assert entry["config"], name
    seen = set().union(*(_rope_type(entry) for entry in CONFIGS.values()))
    # "dynamic" only through HunYuan's block, which its model reads as a fixed NTK base
    wanted = {"default", "linear", "dynamic", "yarn", "longrope", "llama3", "proportional"}
    assert wanted <= seen, wanted - seen
    assert published_configs() is not published_configs()  # a fresh copy each time


def test_neighbour_another_layer_types_block_differs():
    # Gemma 3 4B: its sliding layers read with the global block (linear x8, base 1e6)
    config = CONFIGS["gemma3-4b-it"]["config"]
    rotary = _rotary(_text_config(config))
    theirs, _ = _theirs(rotary, "sliding_attention")
    wrong, _ = frequencies_from_hf_config(config, layer_type="full_attention", dtype=F64)
    assert not torch.allclose(wrong, theirs, rtol=1e-3)


def test_neighbour_phi4_mini_without_its_top_level_trained_length():
    # without original_max_position_embeddings the trained length is read as 131072:
    # factor 1, attention factor 1 instead of sqrt(1 + ln 32 / ln 4096)
    config = CONFIGS["phi-4-mini-instruct"]["config"]
    _, factor = frequencies_from_hf_config(config, dtype=F64)
    assert math.isclose(factor, math.sqrt(1 + math.log(32) / math.log(4096)), rel_tol=1e-12)
    dropped = {k: v for k, v in config.items() if k != "original_max_position_embeddings"}
    _, other = frequencies_from_hf_config(dropped, dtype=F64)
    assert other == 1.0
    rotary = _rotary(_text_config(config))
    assert not math.isclose(other, float(rotary.attention_scaling), rel_tol=1e-3)
