"""pecode.inspect_config against independent readings of the published configs.

* Frequencies: each layer type's ``inv_freq`` equals
  :func:`pecode.scaling.frequencies_from_hf_config` at the target context, which
  tests/test_published_configs.py checks against transformers' own rotary embeddings.
* Critical dimension: the report counts turning pairs from the frequencies;
  :func:`pecode.rope_base.critical_dimension` uses Liu et al.'s log formula.
* Unseen pairs: a Python loop over the rule "pair i is unseen when L0·θ_i < 2π and
  reach·θ'_i > L0·θ_i" with θ_i = b^(-2i/d) (math.pow) and θ' the scaled frequencies.
* Layer counts and NoPE layers: transformers' configuration classes (Gemma 3, gpt-oss,
  Llama 4), where transformers is installed.
* Pitfalls: hand-written expectations for specific configs, with neighbours that remove
  the cause; transformers 5.23's yarn code for the per-layer ``truncate`` pitfall.
* The command line, in process and as ``python -m pecode.inspect_config``.
"""

from __future__ import annotations

import copy
import json
import math
import subprocess
import sys

import pytest
import torch

from pecode.conformance import published_configs
from pecode.inspect_config import REPORT_WIDTH, ConfigReport, inspect_config, main
from pecode.rope_base import critical_dimension
from pecode.scaling import frequencies_from_hf_config

F64 = torch.float64
CONFIGS = published_configs()


def _config(name: str) -> dict:
    return copy.deepcopy(CONFIGS[name]["config"])


def _text(config: dict) -> dict:
    return config.get("text_config", config)


def _layer_type_argument(config: dict, layer_type: str, types: int) -> str | None:
    # as tests/test_published_configs.py: configs whose keys name no layer types are read
    # with layer_type=None
    text = _text(config)
    listed = "layer_types" in text or types > 1
    per_type = (
        isinstance(text.get("rope_parameters"), dict) and layer_type in (text["rope_parameters"])
    )
    return layer_type if listed or per_type else None


def _unseen_loop(
    base: float,
    rotary_dim: int,
    scaled: list[float],
    trained: int,
    reach: int,
    trained_freqs: list[float] | None = None,
):
    """Pairs with L0·θ_i < 2π and reach·θ'_i > L0·θ_i (beyond 1e-9 relative, so that an
    exact interpolation counts as seen), θ_i = b^(-2i/d) (or ``trained_freqs``); pairs with
    θ'_i = 0 do not rotate."""
    count = 0
    for i, theta_scaled in enumerate(scaled):
        theta = trained_freqs[i] if trained_freqs else math.pow(base, -2 * i / rotary_dim)
        seen = trained * theta
        if theta_scaled > 0 and seen < 2 * math.pi and reach * theta_scaled > seen * (1 + 1e-9):
            count += 1
    return count


def _reach(config: dict, layer_type: str, context: int) -> int:
    """How far back a layer type's RoPE layers look, from transformers' configuration
    classes' rules: Gemma's and gpt-oss's sliding layers, every layer of Mistral 7B (its
    mask), Llama 4's chunked-attention layers (its RoPE layers)."""
    text = _text(config)
    if text.get("model_type") == "llama4_text":
        return min(context, text["attention_chunk_size"])
    window = text.get("sliding_window")
    everywhere = text.get("model_type") == "mistral"
    if window and (layer_type == "sliding_attention" or everywhere):
        return min(context, window)
    return context


def _released(config: dict) -> int:
    """max_position_embeddings, or a YaRN block's factor times its original length."""
    text = _text(config)
    longest = text["max_position_embeddings"]
    block = text.get("rope_parameters") or text.get("rope_scaling") or {}
    kind = block.get("rope_type", block.get("type"))
    if kind == "yarn" and block.get("original_max_position_embeddings"):
        longest = max(longest, round(block["factor"] * block["original_max_position_embeddings"]))
    return longest


def _margin_brute_force(freqs: list[float], reach: int) -> int | None:
    """The first distance up to ``reach`` with Σ cos(m θ) < 0, by one float64 tensor of
    every distance (no chunks), independent of pecode.rope_base's scan."""
    m = torch.arange(reach + 1, dtype=F64).unsqueeze(1)
    total = torch.cos(m * torch.tensor(freqs, dtype=F64)).sum(1)
    negative = (total < 0).nonzero()
    return int(negative[0]) if len(negative) else None


# ------------------------------------------------------------------ every published config


@pytest.mark.parametrize("name", list(CONFIGS))
def test_every_published_config_against_independent_readings(name):
    config = _config(name)
    report = inspect_config(config)
    assert isinstance(report, ConfigReport)
    context = report.context
    assert context == _released(config)
    text = str(report)
    for r in report.layer_types:
        assert f"[{r.layer_type}]" in text
        # the frequencies transformers computes (tests/test_published_configs.py)
        theirs, factor = frequencies_from_hf_config(
            config,
            layer_type=_layer_type_argument(config, r.layer_type, len(report.layer_types)),
            seq_len=context,
            dtype=F64,
        )
        assert torch.equal(r.inv_freq, theirs), r.layer_type
        assert r.attention_factor[context] == factor
        reach = _reach(config, r.layer_type, context)
        assert r.reach == reach, r.layer_type
        span = min(r.trained_length, reach)
        # Liu et al.'s log formula against the report's count of turning pairs (HunYuan's
        # fixed base change: the model trains with the changed frequencies)
        if r.rope_type not in ("proportional", "ntk"):
            expected = critical_dimension(r.rotary_dim, r.base, span)
            assert r.critical_dimension == expected, r.layer_type
        # the unseen-angle rule, as a loop
        scaled = r.inv_freq.tolist()
        trained = scaled if r.rope_type == "ntk" else None
        assert r.unseen_pairs == _unseen_loop(r.base, r.rotary_dim, scaled, span, reach, trained)
        unscaled = trained or [
            math.pow(r.base, -2 * i / r.rotary_dim) for i in range(r.rotary_dim // 2)
        ]
        assert r.unseen_pairs_unscaled == _unseen_loop(
            r.base, r.rotary_dim, unscaled, span, reach, trained
        )
        # Men et al.'s sum over every pair of the product: a pair that never rotates adds 1
        still = (r.head_dim - r.rotary_dim) // 2 + (_text(config).get("qk_nope_head_dim") or 0) // 2
        freqs = scaled + [0.0] * still
        if reach <= 1 << 16:
            assert r.first_negative_margin == _margin_brute_force(freqs, reach), r.layer_type
        if r.first_negative_margin is not None:  # the reported distance, by a math.cos loop
            m = r.first_negative_margin
            assert sum(math.cos(m * f) for f in freqs) < 0
            assert sum(math.cos((m - 1) * f) for f in freqs) >= 0


def test_what_review_found_reads_as_the_models_do():
    """The readings an adversarial review asked for, each against what it replaced."""
    # Llama 4 Scout's RoPE layers attend within chunks of 8192 (transformers'
    # "chunked_attention"), so no pair meets an unseen angle at 10M tokens; the
    # temperature is reported for its NoPE layers only
    (r,) = inspect_config(_config("llama4-scout")).layer_types
    assert (r.window, r.reach, r.unseen_pairs_unscaled) == (8192, 8192, 0)
    assert r.temperature_layers == "nope"
    assert "on the NoPE layers" in str(inspect_config(_config("llama4-scout")))
    # DeepSeek-V3: 64 pairs of qk_nope_head_dim never rotate, so Men et al.'s sum stays
    # positive; over the rotary pairs alone it turns negative (the neighbour)
    (r,) = inspect_config(_config("deepseek-v3")).layer_types
    assert r.first_negative_margin is None
    assert _margin_brute_force(r.inv_freq.tolist(), 8192) is not None
    # HunYuan trains with its alpha base: the critical dimension is that base's, not 1e4's
    (r,) = inspect_config(_config("hunyuan-7b")).layer_types
    assert r.rope_type == "ntk"
    assert r.critical_dimension < critical_dimension(r.rotary_dim, r.base, r.trained_length)
    # Qwen's YaRN block promises factor x original: the target context is 131072
    assert inspect_config(_config("qwen3-0.6b-yarn")).context == 4 * 32768
    assert inspect_config(_config("qwen3-0.6b")).context == 40960
    # Mistral 7B v0.1 masks every layer to 4096 tokens; v0.3 has no window
    (r,) = inspect_config(_config("mistral-7b-v0.1")).layer_types
    assert r.reach == 4096
    (r,) = inspect_config(_config("mistral-7b-v0.3")).layer_types
    assert r.reach == r.context == 32768
    # Qwen2.5 at base 1e6: the sum turns negative before its 32768 tokens (Men et al.'s
    # criterion), though the base is above the smallest base that passes (6.3e5)
    (r,) = inspect_config(_config("qwen2.5-7b-instruct")).layer_types
    assert r.first_negative_margin == 27115


def test_neighbour_unseen_pairs_and_frequencies_can_differ():
    # Llama 3.1 8B (llama3 scaling x8 of 8192): at 64k no pair meets unseen angles with
    # the scaling, 29 without; at 128k, 16 times the trained length, 29 either way
    (r,) = inspect_config(_config("llama3.1-8b"), context=65536).layer_types
    assert (r.unseen_pairs, r.unseen_pairs_unscaled) == (0, 29)
    (r,) = inspect_config(_config("llama3.1-8b")).layer_types
    assert (r.unseen_pairs, r.unseen_pairs_unscaled) == (29, 29)
    # Phi-4-mini: the report's frequencies are the long ones, not those at the trained length
    config = _config("phi-4-mini-instruct")
    (r,) = inspect_config(config).layer_types
    short, _ = frequencies_from_hf_config(config, seq_len=r.trained_length, dtype=F64)
    assert not torch.allclose(r.inv_freq, short, rtol=1e-3)
    # (its attention factor depends on the ratio of the lengths, not on seq_len)
    assert r.attention_factor[r.trained_length] == r.attention_factor[r.context]


def test_neighbour_critical_dimension_differs_for_a_proportional_layer():
    # Gemma 4's proportional full-attention layers rotate 64 of 256 pairs: the report
    # counts those, the formula at rotary_dim=512 counts more
    report = inspect_config(_config("gemma4-defaults"))
    full = next(r for r in report.layer_types if r.layer_type == "full_attention")
    assert full.rope_type == "proportional"
    assert full.critical_dimension != critical_dimension(
        full.rotary_dim, full.base, full.trained_length
    )


# ------------------------------------------------------------------ transformers' layer counts


def _transformers_config(config: dict):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoConfig.for_model(**copy.deepcopy(config)).get_text_config()


def _layers(report: ConfigReport) -> dict[str, int]:
    return {r.layer_type: r.layers for r in report.layer_types}


@pytest.mark.parametrize("name", ["gemma3-4b-it", "gemma3-1b-it", "gpt-oss-20b"])
def test_layer_counts_equal_transformers_layer_types(name):
    config = _config(name)
    hf = _transformers_config(config)
    expected = {kind: hf.layer_types.count(kind) for kind in set(hf.layer_types)}
    ours = _layers(inspect_config(config))
    assert ours == expected
    assert sum(ours.values()) == hf.num_hidden_layers


def test_gemma3_layer_counts_neighbour():
    # neighbour: every sixth layer is global, so the two counts are far apart
    ours = _layers(inspect_config(_config("gemma3-4b-it")))
    assert ours == {"full_attention": 5, "sliding_attention": 29}


def test_llama4_nope_layers_equal_transformers_no_rope_layers():
    config = _config("llama4-scout")
    hf = _transformers_config(config)
    (r,) = inspect_config(config).layer_types
    # transformers: no_rope_layers[i] == 0 means layer i has no rotary embedding
    assert r.nope_layers == list(hf.no_rope_layers).count(0) == 12
    assert r.layers == hf.num_hidden_layers
    # neighbour: Llama 3.1 has no NoPE layers
    (plain,) = inspect_config(_config("llama3.1-8b")).layer_types
    assert plain.nope_layers == 0


# ------------------------------------------------------------------ pitfalls


def _keys(config: dict, **kwargs) -> dict[str, str]:
    return {p.key: p.text for p in inspect_config(config, **kwargs).pitfalls}


def test_pitfalls_of_ministral3():
    keys = _keys(_config("ministral3-3b"))
    # yarn factor 16: the default attention factor 0.1 ln 16 + 1 = 1.277
    assert f"{0.1 * math.log(16) + 1:.4g}" == "1.277"
    assert "1.277" in keys["yarn-attention-factor"]
    assert "nested-temperature" in keys


def test_pitfalls_of_deepseek_v3():
    keys = _keys(_config("deepseek-v3"))
    scale = (0.1 * math.log(40) + 1) ** 2  # yarn_get_mscale(40, 1.0)^2
    assert f"{scale:.4g}" == "1.874"
    assert "1.874" in keys["softmax-mscale"]


def test_pitfalls_per_layer_type_and_top_level_original_and_none():
    assert "per-layer-type" in _keys(_config("gemma3-4b-it"))
    assert "top-level-original" in _keys(_config("phi-4-mini-instruct"))
    assert _keys(_config("llama3.1-8b")) == {}


def test_neighbour_phi4_mini_with_original_inside_the_block():
    config = _config("phi-4-mini-instruct")
    config["rope_scaling"]["original_max_position_embeddings"] = config.pop(
        "original_max_position_embeddings"
    )
    assert "top-level-original" not in _keys(config)
    (r,) = inspect_config(config).layer_types
    assert r.trained_length == 4096  # still read, now from the block


def _gemma3_v5(sliding: dict) -> dict:
    """Gemma 3 4B in transformers 5's per-layer-type form."""
    config = _config("gemma3-4b-it")
    for key in ("rope_theta", "rope_local_base_freq", "rope_scaling"):
        config.pop(key)
    config["rope_parameters"] = {
        "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
        "sliding_attention": sliding,
    }
    return config


def test_neighbour_gemma3_with_identical_blocks_has_no_per_layer_type_pitfall():
    different = _gemma3_v5({"rope_type": "default", "rope_theta": 10000.0})
    assert "per-layer-type" in _keys(different)
    same = _gemma3_v5({"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6})
    assert "per-layer-type" not in _keys(same)
    bases = {r.base for r in inspect_config(same).layer_types}
    assert bases == {1e6}


def _yarn_per_layer(truncate: bool | None) -> dict:
    full = {
        "rope_type": "yarn",
        "rope_theta": 1e6,
        "factor": 8.0,
        "original_max_position_embeddings": 8192,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
    }
    if truncate is not None:
        full["truncate"] = truncate
    return {
        "model_type": "gemma3_text",
        "hidden_size": 2560,
        "num_attention_heads": 8,
        "head_dim": 256,
        "num_hidden_layers": 12,
        "max_position_embeddings": 65536,
        "sliding_window": 1024,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 2,
        "rope_parameters": {
            "full_attention": full,
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    }


def test_per_layer_truncate_pitfall_and_its_neighbours():
    assert "per-layer-truncate" in _keys(_yarn_per_layer(False))
    assert "per-layer-truncate" not in _keys(_yarn_per_layer(True))
    assert "per-layer-truncate" not in _keys(_yarn_per_layer(None))
    # gpt-oss sets truncate: false in its one block, which transformers reads
    assert "per-layer-truncate" not in _keys(_config("gpt-oss-20b"))


def test_transformers_ignores_a_per_layer_truncate():
    # what the pitfall says: transformers 5.23 reads truncate from the top level of
    # rope_parameters, so a per-layer-type truncate: false gives the rounded ramp
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = _yarn_per_layer(False)
    hf = transformers.AutoConfig.for_model(**copy.deepcopy(config))
    theirs, _ = ROPE_INIT_FUNCTIONS["yarn"](hf, "cpu", layer_type="full_attention")
    theirs = theirs.to(F64)
    untruncated, _ = frequencies_from_hf_config(config, layer_type="full_attention", dtype=F64)
    truncated, _ = frequencies_from_hf_config(
        _yarn_per_layer(True), layer_type="full_attention", dtype=F64
    )
    assert torch.allclose(theirs, truncated, rtol=1e-6, atol=0.0)
    assert not torch.allclose(theirs, untruncated, rtol=1e-3, atol=0.0)  # neighbour


# ------------------------------------------------------------------ the context argument


def _llama_unscaled() -> dict:
    config = _config("llama3.1-8b")
    config.pop("rope_scaling")
    return config


def test_a_longer_context_raises_unseen_pairs_of_an_unscaled_config():
    config = _llama_unscaled()
    (at_trained,) = inspect_config(config).layer_types
    (longer,) = inspect_config(config, context=4 * 131072).layer_types
    assert at_trained.trained_length == 131072
    assert at_trained.unseen_pairs == at_trained.unseen_pairs_unscaled == 0  # neighbour
    assert longer.unseen_pairs == longer.unseen_pairs_unscaled > 0
    scaled = longer.inv_freq.tolist()
    assert longer.unseen_pairs == _unseen_loop(500000.0, 128, scaled, 131072, 4 * 131072)


@pytest.mark.parametrize(
    ("context", "error"), [(0, ValueError), (-5, ValueError), ("x", TypeError)]
)
def test_bad_context_raises_naming_it(context, error):
    with pytest.raises(error, match="context"):
        inspect_config(_llama_unscaled(), context=context)


def test_no_max_position_embeddings_and_no_context_raises_naming_it():
    config = _llama_unscaled()
    config.pop("max_position_embeddings")
    with pytest.raises(ValueError, match="max_position_embeddings"):
        inspect_config(config)
    # neighbour: with a trained length in the rope block, a context given is enough
    scaled = _config("llama3.1-8b")
    scaled.pop("max_position_embeddings")
    with pytest.raises(ValueError, match="max_position_embeddings"):
        inspect_config(scaled)
    assert inspect_config(scaled, context=4096).context == 4096


# ------------------------------------------------------------------ command line and plot


def _write(tmp_path, config: dict):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def test_main_prints_the_report(tmp_path, capsys):
    path = _write(tmp_path, _config("gemma3-4b-it"))
    assert main([str(path), "--context", "32768"]) == 0
    out = capsys.readouterr().out
    assert "[full_attention]" in out
    assert "[sliding_attention]" in out
    assert "target context 32,768 tokens" in out
    assert out.strip() == str(inspect_config(_config("gemma3-4b-it"), context=32768))


def test_report_lines_fit_the_width(capsys):
    """Every line of a report fits REPORT_WIDTH (the book's column, a terminal); the
    neighbour: without wrapping, some line of Ministral 3's report is longer."""
    config = _config("ministral3-3b")
    text = str(inspect_config(config))
    assert max(len(line) for line in text.splitlines()) <= REPORT_WIDTH
    pitfalls = inspect_config(config).pitfalls
    assert max(len(f"  - [{p.key}] {p.text} ({p.reference})") for p in pitfalls) > REPORT_WIDTH


def test_main_returns_2_on_a_bad_config(tmp_path, capsys):
    config = _llama_unscaled()
    config.pop("max_position_embeddings")
    assert main([str(_write(tmp_path, config))]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith("error:")
    assert "max_position_embeddings" in captured.err
    assert captured.out == ""


def test_python_dash_m(tmp_path):
    path = _write(tmp_path, _config("deepseek-v3"))
    done = subprocess.run(
        [sys.executable, "-m", "pecode.inspect_config", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "[softmax-mscale]" in done.stdout
    assert "model_type deepseek_v3" in done.stdout
