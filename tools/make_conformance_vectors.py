"""Write ``pecode/conformance/vectors_v1.json``: float64 RoPE reference values per published config.

Usage: python tools/make_conformance_vectors.py [--check]

For every config of ``pecode/conformance/published_configs.json`` and every layer type it
gives a rope block for, the frequencies, attention factor, ``cos``/``sin`` tables and a
rotated query are computed in float64 with pecode
(:func:`pecode.scaling.frequencies_from_hf_config`, :func:`pecode.rope.rope_cos_sin`,
:func:`pecode.rope.apply_partial_rope`) and checked,
before anything is written, against the independent scalar loop
:func:`pecode.reference.rope.rope_loop` and :func:`math.cos`/:func:`math.sin`: a
difference above 1e-12 stops the generation. The output is deterministic (sorted keys,
floats as their shortest round-trip ``repr``). Each case also records, per position, how
many pairs are beyond float32 (``float32_beyond``: their float32 cos/sin tolerance would
exceed ``pecode.conformance.FLOAT32_TABLE_CAP``, so check_rope_engine does not compare
them). ``--check`` writes nothing and exits 1 if
the file differs from what would be written.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path
from typing import Any

import torch

import pecode
from pecode.conformance import FLOAT32_TABLE_CAP, float32_beyond, published_configs
from pecode.reference.rope import rope_loop
from pecode.rope import apply_partial_rope, rope_cos_sin
from pecode.scaling import (
    frequencies_from_hf_config,
    hf_layer_types,
    hf_query_temperature,
    hf_rope_arguments,
    log_length_query_scale,
)

ROOT = Path(__file__).resolve().parents[1]
OUTPUT = ROOT / "pecode" / "conformance" / "vectors_v1.json"
F64 = torch.float64
CROSS_CHECK_ATOL = 1e-12
# float32 cos/sin tolerance: 1e-6 + (1e-6 + 4 * 2^-24) * (1 + |angle|); the angle where it
# reaches the cap
BEYOND_ANGLE = (FLOAT32_TABLE_CAP - 1e-6) / (1e-6 + 4 * 2.0**-24) - 1

DESCRIPTION = (
    "Float64 reference values of rotary position embedding (RoPE) for published model "
    "configs: for each config and layer type, the frequencies, the attention factor, the "
    "cos/sin tables at a few positions on both sides of the trained length, and a fixed "
    "query vector rotated there. An engine (in any language) reads each case's hf_config, "
    "computes the same quantities and compares them with check_rope_engine's tolerances "
    "(pecode.conformance) or its own."
)

CONVENTIONS = {
    "pairs": (
        "Half layout (GPT-NeoX, Hugging Face rotate_half): for a rotary width d, pair i "
        "(i = 0 .. d/2 - 1) is the features (i, i + d/2). Engines with interleaved pairs "
        "(2i, 2i + 1) (GPT-J, Meta's Llama, DeepSeek's checkpoints, Llama 4 in transformers) "
        "have the same frequencies, cos and sin per pair; to compare q_rotated they permute "
        "their features into the half layout first."
    ),
    "rotation": (
        "Pair (a, b) at position p becomes (a cos(p theta_i) - b sin(p theta_i), "
        "a sin(p theta_i) + b cos(p theta_i)), where theta_i = inv_freq[i]."
    ),
    "inv_freq": (
        "The rotary_dim / 2 frequencies theta_i (radians per position) that the config "
        "gives at the case's seq_len, after its scaling rule (rope_type). Zero frequencies "
        "(Gemma 4's proportional type) are pairs that do not rotate."
    ),
    "cos_sin": (
        "cos[k][i] = cos(positions[k] * inv_freq[i]) and sin[k][i] = sin(positions[k] * "
        "inv_freq[i]), unscaled: the attention factor is not in them."
    ),
    "attention_factor": (
        "The factor a scaling rule applies to cos and sin (hence to q and k; YaRN's "
        "0.1 ln(s) + 1, LongRoPE's sqrt(1 + ln(s) / ln(L0)), 1 for most types). Hugging "
        "Face stores it as attention_scaling and multiplies its cos and sin tables by it."
    ),
    "q": (
        "The input query of head_dim features, q[j] = cos(0.7 * j + 0.3) for j = 0 .. "
        "head_dim - 1 (also stored, as q)."
    ),
    "q_rotated": (
        "q rotated at each position, multiplied by attention_factor: the first rotary_dim "
        "features rotate in the half layout over rotary_dim; the remaining head_dim - "
        "rotary_dim features (partial rotary) pass through unchanged and unscaled. The "
        "query temperature is not applied."
    ),
    "positions": (
        "Token positions (integers): 0, 1, L0 - 1, L0, 2 L0 + 3 and, when larger, "
        "max_position_embeddings - 1, where L0 = original_length; for the LongRoPE case at "
        "the trained length, 0, 1, L0 / 2, L0 - 2, L0 - 1."
    ),
    "seq_len": (
        "The current sequence length the values are for, max(positions) + 1. Only the "
        "length-dependent rope types read it: longrope uses its long factors once seq_len "
        "exceeds original_length (one case at L0, one past it)."
    ),
    "original_length": (
        "The trained length L0: the rope block's (or config's) "
        "original_max_position_embeddings, else max_position_embeddings."
    ),
    "multi_axis": (
        "Multi-axis RoPE (mrope_section, Qwen3.5) is read with text-only positions: every "
        "axis holds the same position, which is plain RoPE over rotary_dim. The multi-axis "
        "behaviour is not covered."
    ),
    "query_temperature": (
        "null, or the log-length query scale the config asks for: scale[k] = 1 + beta * "
        "ln(1 + floor((positions[k] + offset) / length)); by says what is counted (index: "
        "the query's index in the sequence, position: its position id; equal here), "
        "layers which layers multiply their queries by it (nope: only the layers without "
        "RoPE, all: every layer, after RoPE)."
    ),
    "tolerances": (
        "check_rope_engine compares, for float32 engines (float32=True): inv_freq, "
        "attention_factor and query_scale with relative error r = 1e-6, and each cos and "
        "sin entry with absolute error 1e-6 + (r + 4 * 2^-24) * (1 + |p theta_i|): the "
        "angle p theta_i computed in float32 is off by about 2^-24 |p theta_i| (its "
        "rounding) plus r |p theta_i| when the frequency is off by the r it is allowed "
        "(its own rounding), so the error grows with the angle. A q_rotated entry of the "
        "pair (a, b) gets the angle term times attention_factor * (|a| + |b|) and the "
        "floor times max(1, attention_factor). Entries beyond float32 (see "
        "float32_beyond) are not compared with these tolerances. A case passes only if "
        "the engine returned something for it (an empty result is a skip, not a pass) "
        "and it compared inv_freq, or cos and sin, or q_rotated. For float64 engines "
        "(float32=False): 1e-12 in place of 1e-6 and 2^-53 in place of 2^-24, and every "
        "entry is compared."
    ),
    "float32_beyond": (
        "Per position, the number of pairs i whose float32 cos/sin tolerance would exceed "
        f"{FLOAT32_TABLE_CAP} (an angle |p theta_i| above {BEYOND_ANGLE:.0f} radians). "
        "The tolerance grows by about 1.24e-6 per radian (0.16 at an angle of 131071, "
        "0.33 at 262147, 0.65 at 524291, 13 at 10485759) and a float32 engine cannot get "
        "such angles right to better than that, so a tolerance there would let a wrong "
        "cos or sin (even its negation) pass: with the float32 tolerances these cos and "
        "sin entries, and both q_rotated features of the pair, are not compared, and "
        "check_rope_engine reports them as beyond float32. They are the low pairs "
        "(large theta_i) at the long positions: 2 L0 + 3 and max_position_embeddings - "
        "1, and L0 - 1 and L0 where theta_0 L0 is above that angle. Positions 0 and 1 "
        "are always compared. Float64 engines are compared everywhere."
    ),
    "values": "float64, written with the shortest decimal that reads back to the same double.",
}


def query(head_dim: int) -> list[float]:
    """The input vector ``q[j] = cos(0.7 j + 0.3)``."""
    return [math.cos(0.7 * j + 0.3) for j in range(head_dim)]


def _positions(original: int, max_positions: int, *, within: bool) -> list[int]:
    if within:  # all below the trained length: LongRoPE keeps its short factors
        return sorted({0, 1, original // 2, original - 2, original - 1})
    positions = {0, 1, original - 1, original, 2 * original + 3}
    if max_positions - 1 > 2 * original + 3:
        positions.add(max_positions - 1)
    return sorted(positions)


def _text(config: dict[str, Any]) -> dict[str, Any]:
    return config.get("text_config", config)


def _cross_check(case: dict[str, Any], what: str, ours: Any, loop: Any) -> None:
    ours, loop = torch.as_tensor(ours, dtype=F64), torch.as_tensor(loop, dtype=F64)
    if ours.shape != loop.shape or not torch.allclose(ours, loop, rtol=0, atol=CROSS_CHECK_ATOL):
        diff = (ours - loop).abs().max().item() if ours.shape == loop.shape else "shape"
        raise RuntimeError(
            f"{case['id']}: pecode's {what} differs from the float64 loop by {diff} "
            f"(> {CROSS_CHECK_ATOL}); no vectors written"
        )


def make_case(
    name: str, entry: dict[str, Any], layer_type: str, *, within: bool = False
) -> dict[str, Any]:
    """One case: the values for ``name``'s ``layer_type`` block, cross-checked.

    Raises:
        RuntimeError: pecode and the float64 loop disagree by more than 1e-12.
    """
    config = entry["config"]
    text = _text(config)
    arguments = hf_rope_arguments(config, layer_type=layer_type)
    rope_type = arguments["scaling"]
    params = arguments["scaling_params"]
    head_dim, rotary_dim = arguments["head_dim"], arguments["rotary_dim"]
    max_positions = text["max_position_embeddings"]
    original = params.get("original_max_position_embeddings") or max_positions
    positions = _positions(original, max_positions, within=within)
    seq_len = positions[-1] + 1
    inv_freq, factor = frequencies_from_hf_config(
        config, layer_type=layer_type, seq_len=seq_len, dtype=F64
    )
    where = torch.tensor(positions, dtype=torch.int64)
    cos, sin = rope_cos_sin(where, inv_freq)
    q = torch.tensor(query(head_dim), dtype=F64)
    rotated = apply_partial_rope(q.expand(len(positions), head_dim), cos, sin, "half") * factor
    rotated[:, rotary_dim:] = q[rotary_dim:]  # pass-through features: unscaled
    notes = []
    if arguments.get("sections"):
        notes.append(
            f"multi-axis RoPE (mrope_section {arguments['sections']}, "
            f"{arguments['section_layout']}) read with text-only positions: plain RoPE"
        )
    if rope_type == "ntk":
        notes.append("HunYuan's dynamic block with alpha: a fixed NTK base (rope_type ntk)")
    case_id = f"{name}/{layer_type}" + (f"@{seq_len}" if rope_type == "longrope" else "")
    case: dict[str, Any] = {
        "id": case_id,
        "config": name,
        "model": entry["model"],
        "source": entry["source"],
        "hf_config": config,
        "layer_type": layer_type,
        "rope_type": rope_type,
        "head_dim": head_dim,
        "rotary_dim": rotary_dim,
        "base": float(arguments["base"]),
        "original_length": original,
        "max_position_embeddings": max_positions,
        "seq_len": seq_len,
        "positions": positions,
        "inv_freq": inv_freq.tolist(),
        "attention_factor": float(factor),
        "cos": cos.tolist(),
        "sin": sin.tolist(),
        "q": q.tolist(),
        "q_rotated": rotated.tolist(),
        "query_temperature": None,
        "float32_beyond": float32_beyond(where, inv_freq).sum(dim=-1).tolist(),
        "note": "; ".join(notes),
    }
    # the independent float64 loop: math.cos/sin pair by pair, and rope_loop's rotation
    thetas = case["inv_freq"]
    _cross_check(case, "cos", cos, [[math.cos(p * t) for t in thetas] for p in positions])
    _cross_check(case, "sin", sin, [[math.sin(p * t) for t in thetas] for p in positions])
    loop = q.expand(len(positions), head_dim).clone()
    loop[:, :rotary_dim] = (
        rope_loop(loop[:, :rotary_dim], where, layout="half", inv_freq=thetas) * factor
    )
    _cross_check(case, "q_rotated", rotated, loop)
    temperature = hf_query_temperature(config)
    if temperature is not None:
        scale = log_length_query_scale(
            where, temperature["beta"], temperature["length"], offset=temperature["offset"]
        )
        loop_scale = [
            1
            + temperature["beta"]
            * math.log(1 + (p + temperature["offset"]) // temperature["length"])
            for p in positions
        ]
        _cross_check(case, "query temperature", scale, loop_scale)
        case["query_temperature"] = {
            "beta": float(temperature["beta"]),
            "length": temperature["length"],
            "offset": temperature["offset"],
            "by": temperature["by"],
            "layers": temperature["layers"],
            "positions": positions,
            "scale": scale.tolist(),
        }
    return case


def build_vectors() -> dict[str, Any]:
    """The whole data set, as the dict that :func:`render` writes.

    Raises:
        RuntimeError: a case's values disagree with the float64 loop.
    """
    cases = []
    for name, entry in published_configs().items():
        for layer_type in hf_layer_types(entry["config"]):
            arguments = hf_rope_arguments(entry["config"], layer_type=layer_type)
            if arguments["scaling"] == "longrope":
                cases.append(make_case(name, entry, layer_type, within=True))
            cases.append(make_case(name, entry, layer_type))
    return {
        "format": "pecode-rope-conformance",
        "version": 1,
        "generated_by": "tools/make_conformance_vectors.py",
        "pecode_version": pecode.__version__,
        "description": DESCRIPTION,
        "conventions": CONVENTIONS,
        "cases": cases,
    }


def render(vectors: dict[str, Any]) -> str:
    """The JSON text: sorted keys, one-space indent, lists of numbers on one line."""
    text = json.dumps(vectors, sort_keys=True, indent=1, ensure_ascii=False, allow_nan=False)

    def inline(match: re.Match[str]) -> str:
        return "[" + ", ".join(item.strip() for item in match.group(1).split(",")) + "]"

    return re.sub(r"\[\s*([-+0-9.eE,\s]+?)\s*\]", inline, text) + "\n"


def main(argv: list[str]) -> int:
    text = render(build_vectors())
    if "--check" in argv:
        same = OUTPUT.exists() and OUTPUT.read_text(encoding="utf-8") == text
        print(f"{OUTPUT.relative_to(ROOT)}: {'up to date' if same else 'differs'}")
        return 0 if same else 1
    OUTPUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUTPUT.relative_to(ROOT)}: {len(text.encode())} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
