"""The conformance vectors (``pecode/conformance/vectors_v1.json``) and their checker.

The committed file is compared with what ``tools/make_conformance_vectors.py`` computes
now (pecode's float64 values, cross-checked there against the scalar loop), so a change
in pecode that moves a value fails here. :func:`~pecode.conformance.check_rope_engine`
is run on pecode's own engine (float64 with the float64 tolerances, float32 with the
float32 ones) and on transformers 5.23's rotary embeddings read from the same configs.
The neighbours show that the check can fail: an engine that drops the attention factor,
one that reads Gemma 3's sliding layers with the full-attention block, float32 angles
under the float64 tolerances and bfloat16 angles under the float32 ones; and that it
cannot be passed by saying little: an engine that skips cases (returns ``{}``) or
returns only the attention factor does not pass, and a wrong cos/sin can no longer hide
where the float32 tolerance grows past what cos and sin can be off by (such entries are
not compared, and counted as beyond float32).
"""

from __future__ import annotations

import copy
import dataclasses
import importlib.util
import inspect
import json
import math
import sys
from functools import partial
from pathlib import Path

import pytest
import torch
from hf_rotary import model_rotary_embedding

from pecode.conformance import (
    FLOAT32_TABLE_CAP,
    ConformanceReport,
    check_rope_engine,
    conformance_vectors,
    float32_beyond,
    pecode_engine,
    published_configs,
)
from pecode.rope import rope_cos_sin
from pecode.scaling import frequencies_from_hf_config

ROOT = Path(__file__).resolve().parents[1]
VECTORS = ROOT / "pecode" / "conformance" / "vectors_v1.json"
F32 = partial(pecode_engine, dtype=torch.float32)


def _generator():
    """``tools/make_conformance_vectors.py`` as a module (tools/ is not a package)."""
    spec = importlib.util.spec_from_file_location(
        "make_conformance_vectors", ROOT / "tools" / "make_conformance_vectors.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _same(committed, generated, where="$"):
    """Equal structure, keys, strings and ints; floats within 1e-15 (a last-bit
    difference of another platform's libm passes, any real change does not)."""
    assert type(committed) is type(generated), where
    if isinstance(committed, dict):
        assert sorted(committed) == sorted(generated), where
        for key in committed:
            _same(committed[key], generated[key], f"{where}.{key}")
    elif isinstance(committed, list):
        assert len(committed) == len(generated), where
        for i, (a, b) in enumerate(zip(committed, generated, strict=True)):
            _same(a, b, f"{where}[{i}]")
    elif isinstance(committed, float):
        assert math.isclose(committed, generated, rel_tol=1e-15, abs_tol=1e-15), where
    else:
        assert committed == generated, where


# ------------------------------------------------------------------------ the data set


def test_committed_vectors_equal_what_the_generator_computes_now():
    generator = _generator()
    generated = generator.build_vectors()
    text = VECTORS.read_text(encoding="utf-8")
    _same(json.loads(text), json.loads(generator.render(generated)))
    # the file is written deterministically: rendering its own contents gives it back
    assert generator.render(json.loads(text)) == text


def test_vectors_are_small_versioned_and_carry_their_provenance():
    assert VECTORS.stat().st_size < 1.5e6
    vectors = conformance_vectors()
    assert vectors["format"] == "pecode-rope-conformance"
    assert vectors["version"] == 1
    assert vectors["generated_by"] == "tools/make_conformance_vectors.py"
    for key in ("pairs", "cos_sin", "attention_factor", "q", "q_rotated", "tolerances"):
        assert vectors["conventions"][key].strip(), key
    configs = published_configs()
    assert {case["config"] for case in vectors["cases"]} == set(configs)
    ids = [case["id"] for case in vectors["cases"]]
    assert len(ids) == len(set(ids))
    for case in vectors["cases"]:
        entry = configs[case["config"]]
        assert (case["model"], case["source"], case["hf_config"]) == (
            entry["model"],
            entry["source"],
            entry["config"],
        )
        assert case["q"] == [math.cos(0.7 * j + 0.3) for j in range(case["head_dim"])]
        assert case["seq_len"] == max(case["positions"]) + 1
        assert len(case["cos"]) == len(case["positions"]) <= 6
        assert len(case["inv_freq"]) == case["rotary_dim"] // 2
    longrope = [c["seq_len"] for c in vectors["cases"] if c["rope_type"] == "longrope"]
    assert longrope.count(4096) == 2  # at L0 and past it, per config
    assert len(longrope) == 4
    assert conformance_vectors() is not conformance_vectors()  # a fresh copy


# ------------------------------------------------------------------------ pecode


def test_pecode_float64_engine_passes_the_float64_tolerances():
    report = check_rope_engine(pecode_engine, float32=False)
    assert report.passed, str(report)
    assert set(report.worst) == {
        "inv_freq",
        "attention_factor",
        "cos",
        "sin",
        "q_rotated",
        "query_scale",
    }


def _beyond_in_file():
    """The cos (and sin) entries the vectors mark as beyond float32, over all cases."""
    return sum(sum(case["float32_beyond"]) for case in conformance_vectors()["cases"])


def test_pecode_float32_engine_passes_the_float32_tolerances():
    report = check_rope_engine(F32)
    assert report.passed, str(report)
    # float32 angles of some 40000 radians (the largest compared) are that far off
    assert report.worst["cos"] > 1e-3
    # the entries beyond float32 are counted, per key and per case, as the file says
    n = _beyond_in_file()
    assert n == 347  # of 12052 cos entries, with the configs of this version
    assert report.beyond == {"cos": n, "sin": n, "q_rotated": 2 * n}
    assert f"beyond float32 (tolerance above {FLOAT32_TABLE_CAP}, not compared): {4 * n}" in (
        str(report)
    )
    for result, case in zip(report.results, conformance_vectors()["cases"], strict=True):
        pairs = len(case["inv_freq"]) * len(case["positions"])
        assert result.beyond.get("cos", 0) == sum(case["float32_beyond"])
        assert result.entries["cos"] + result.beyond.get("cos", 0) == pairs
        # positions 0 and 1 (at least) are compared in every case
        assert result.entries["cos"] >= 2 * len(case["inv_freq"])
        assert case["float32_beyond"][:2] == [0, 0]
    # float64: every entry compared, nothing beyond
    report64 = check_rope_engine(pecode_engine, float32=False)
    assert report64.beyond == {}
    assert all(not r.beyond for r in report64.results)


def test_report_is_frozen_and_reads_as_a_table():
    report = check_rope_engine(pecode_engine, float32=False)
    assert isinstance(report, ConformanceReport)
    with pytest.raises(dataclasses.FrozenInstanceError):
        report.float32 = True
    text = str(report)
    assert "PASSED" in text
    assert "float64 tolerances" in text
    n = len(conformance_vectors()["cases"])
    assert f"{n}/{n} cases pass" in text
    assert f"{n} given, {n} checked, 0 skipped" in text
    assert "beyond float32" not in text  # float64 compares every entry
    assert all(case["id"] in text for case in conformance_vectors()["cases"])


# ------------------------------------------------------------------------ neighbours


def _without_attention_factor(case):
    values = F32(case)
    factor = values["attention_factor"]
    return {**values, "attention_factor": 1.0, "q_rotated": values["q_rotated"] / factor}


def test_neighbour_an_engine_without_the_attention_factor_fails_where_it_is_not_one():
    report = check_rope_engine(_without_attention_factor)
    scaled = {c["id"] for c in conformance_vectors()["cases"] if c["attention_factor"] != 1.0}
    # YaRN (Qwen2.5/Qwen3 with yarn, gpt-oss, OLMo 3 full) and LongRoPE (Phi-3.5, Phi-4-mini)
    assert {"gpt-oss-20b/full_attention", "olmo3-7b/full_attention"} <= scaled
    assert {r.case for r in report.failures} == scaled
    assert all(set(r.failed_keys) == {"attention_factor", "q_rotated"} for r in report.failures)


def _gemma3_sliding_read_as_full(case):
    if case["config"].startswith("gemma3") and case["layer_type"] == "sliding_attention":
        case = {**case, "layer_type": "full_attention"}
    return F32(case)


def test_neighbour_gemma3_sliding_layers_read_with_the_full_block_fail():
    report = check_rope_engine(_gemma3_sliding_read_as_full)
    assert {r.case for r in report.failures} == {
        "gemma3-1b-it/sliding_attention",
        "gemma3-4b-it/sliding_attention",
    }


def test_neighbour_float32_angles_fail_the_float64_tolerances():
    # the same engine that passes the float32 tolerances above
    report = check_rope_engine(F32, float32=False)
    assert not report.passed
    assert len(report.failures) == len(report.results)


def _bfloat16_angles(case):
    inv_freq, _ = frequencies_from_hf_config(
        case["hf_config"], layer_type=case["layer_type"], seq_len=case["seq_len"]
    )
    positions = torch.tensor(case["positions"])
    cos, sin = rope_cos_sin(positions, inv_freq, compute_dtype=torch.bfloat16)
    return {"cos": cos, "sin": sin}


def test_neighbour_bfloat16_angles_fail_the_float32_tolerances():
    report = check_rope_engine(_bfloat16_angles)
    assert not report.passed
    assert report.worst_ratio["cos"] > 10


# ------------------------------------------------------------------------ bad inputs


def test_bad_inputs_raise_errors_that_name_the_argument():
    with pytest.raises(TypeError, match="engine must be callable"):
        check_rope_engine("pecode")
    with pytest.raises(TypeError, match="float32 must be a bool"):
        check_rope_engine(pecode_engine, float32=1)
    with pytest.raises(TypeError, match="vectors must be a dict"):
        check_rope_engine(pecode_engine, vectors=[])
    with pytest.raises(ValueError, match="vectors must be the pecode-rope-conformance format"):
        check_rope_engine(pecode_engine, vectors={"format": "other", "version": 1})
    with pytest.raises(ValueError, match=r"vectors\['cases'\]"):
        check_rope_engine(pecode_engine, vectors={**conformance_vectors(), "cases": []})
    with pytest.raises(TypeError, match="must return a dict"):
        check_rope_engine(lambda case: [1.0])
    with pytest.raises(ValueError, match="'phase'"):
        check_rope_engine(lambda case: {"phase": 0.0})
    with pytest.raises(ValueError, match=r"'cos' must have shape"):
        check_rope_engine(lambda case: {"cos": [[1.0]]})
    with pytest.raises(TypeError, match="'inv_freq' must be numbers"):
        check_rope_engine(lambda case: {"inv_freq": "fast"})
    with pytest.raises(TypeError, match="'attention_factor' must be a number"):
        check_rope_engine(lambda case: {"attention_factor": "one"})
    with pytest.raises(ValueError, match="asks for no query temperature"):
        check_rope_engine(lambda case: {"query_scale": [1.0] * len(case["positions"])})
    case = conformance_vectors()["cases"][0]
    with pytest.raises(TypeError, match="dtype must be"):
        pecode_engine(case, dtype=torch.float16)
    with pytest.raises(TypeError, match="case must be a dict"):
        pecode_engine([case])
    with pytest.raises(ValueError, match="hf_config"):
        pecode_engine({k: v for k, v in case.items() if k != "hf_config"})


def test_an_engine_that_returns_nothing_does_not_pass():
    report = check_rope_engine(lambda case: {})
    assert not report.passed
    n = len(report.results)
    assert len(report.skipped) == n
    assert not report.checked
    assert not report.failures
    assert all(r.status == "skip" and not r.passed for r in report.results)
    text = str(report)
    assert "nothing compared" in text
    assert f"0/{n} cases pass" in text
    assert f"{n} given, 0 checked, {n} skipped" in text


def test_neighbour_an_engine_that_skips_all_cases_but_one_does_not_pass():
    # before, a skipped case counted as passed: this engine read "PASSED, 32/32 cases pass"
    first = conformance_vectors()["cases"][0]["id"]
    report = check_rope_engine(lambda case: F32(case) if case["id"] == first else {})
    n = len(report.results)
    assert not report.passed
    assert [r.case for r in report.checked] == [first]
    assert len(report.skipped) == n - 1
    assert not report.failures
    text = str(report)
    assert "FAILED" in text
    assert f"1/{n} cases pass" in text
    assert f"{n} given, 1 checked, {n - 1} skipped" in text
    # checking a subset: "every case" is every case of the subset
    vectors = conformance_vectors()
    vectors["cases"] = vectors["cases"][:1]
    assert check_rope_engine(lambda case: F32(case), vectors=vectors).passed


def test_neighbour_an_engine_that_returns_only_the_attention_factor_does_not_pass():
    report = check_rope_engine(lambda case: {"attention_factor": case["attention_factor"]})
    n = len(report.results)
    assert not report.passed
    assert len(report.incomplete) == len(report.checked) == n
    assert not report.failures
    assert not report.skipped
    assert all(r.status == "part" and r.compared == ("attention_factor",) for r in report.results)
    assert f"{n} incomplete" in str(report)
    # cos without sin is not the tables either; cos and sin, inv_freq, or q_rotated are
    for keys in (("inv_freq",), ("cos", "sin"), ("q_rotated",)):
        report = check_rope_engine(lambda case, keys=keys: {k: F32(case)[k] for k in keys})
        assert report.passed, (keys, str(report))
    assert not check_rope_engine(lambda case: {"cos": F32(case)["cos"]}).passed


def _old_float32_tolerance(case):
    """[positions, pairs]: the float32 cos/sin tolerance, uncapped (as before the cap)."""
    positions = torch.tensor(case["positions"], dtype=torch.float64)
    angle = (positions[:, None] * torch.tensor(case["inv_freq"], dtype=torch.float64)).abs()
    return 1e-6 + (1e-6 + 4 * 2.0**-24) * (1 + angle)


def _negated_where(case, where):
    values = F32(case)
    sign = torch.where(where, -1.0, 1.0).to(values["cos"].dtype)
    return {
        "inv_freq": values["inv_freq"],
        "cos": values["cos"] * sign,
        "sin": values["sin"] * sign,
    }


def test_neighbour_negated_cos_and_sin_cannot_hide_where_the_tolerance_is_large():
    # without the cap, the tolerance at Llama 4's position 10485759 reached 13 (above 2, so
    # negating cos and sin passed) and 0.33-0.65 for Gemma and Qwen3.5. Now those entries
    # are not compared, and the report counts them: the engine that negates them is not
    # *checked* there (and says so), rather than passed there.
    vectors = conformance_vectors()
    hidden = {c["id"]: _old_float32_tolerance(c) > 2 for c in vectors["cases"]}
    assert {k for k, v in hidden.items() if v.any()} == {"llama4-scout/full_attention"}
    report = check_rope_engine(lambda case: _negated_where(case, hidden[case["id"]]))
    assert report.passed  # what remains compared is right: inv_freq, and cos/sin elsewhere
    for result, case in zip(report.results, vectors["cases"], strict=True):
        beyond = float32_beyond(case["positions"], case["inv_freq"])
        assert not (hidden[case["id"]] & ~beyond).any()  # every negated entry is beyond
        assert result.beyond.get("cos", 0) == int(beyond.sum()) == sum(case["float32_beyond"])
    llama4 = next(r for r in report.results if r.case == "llama4-scout/full_attention")
    assert int(hidden[llama4.case].sum()) == 10
    assert llama4.beyond == {"cos": 28, "sin": 28}
    assert "beyond float32" in str(report)

    # every entry that is compared has a tolerance of at most the cap, and cos and sin
    # cannot both be that small: a negation at any compared entry fails. Here, at the
    # largest angle compared in each case (where the tolerance is largest), every case fails.
    def at_largest_checked_angle(case):
        tol = _old_float32_tolerance(case)
        tol = tol.where(tol <= FLOAT32_TABLE_CAP, 0.0)
        return _negated_where(case, tol == tol.max())

    report = check_rope_engine(at_largest_checked_angle)
    assert not report.passed
    assert len(report.failures) == len(report.results)
    assert all({"cos", "sin"} & set(r.failed_keys) for r in report.failures)


# ------------------------------------------------------------------------ transformers 5.23


_rotary = model_rotary_embedding


def _half_to_interleaved(x):
    half = x.shape[-1] // 2
    return torch.stack((x[..., :half], x[..., half:]), dim=-1).flatten(-2)


def _interleaved_to_half(x):
    return torch.cat((x[..., 0::2], x[..., 1::2]), dim=-1)


def transformers_engine(case):
    """transformers 5.23 as an engine: the model's rotary embedding built from the case's
    config, its forward at the case's positions (float32, as the model runs it: cos and sin
    come out multiplied by attention_scaling, which is divided out here), its frequency
    buffer after that forward (LongRoPE switches to its long factors there), and the
    model's own apply_rotary_pos_emb on q (Llama 4 and DeepSeek-V2: apply_rotary_emb on
    interleaved pairs, q permuted into that layout and back)."""
    import transformers

    hf_config = transformers.AutoConfig.for_model(
        **copy.deepcopy(case["hf_config"])
    ).get_text_config()
    rotary = _rotary(hf_config)
    models = sys.modules[type(rotary).__module__]
    layer_type = case["layer_type"]
    positions = torch.tensor([case["positions"]])
    x = torch.zeros(1, dtype=torch.float32)
    per_type = "layer_type" in inspect.signature(rotary.forward).parameters
    with torch.no_grad():
        out = rotary(x, positions, **({"layer_type": layer_type} if per_type else {}))
    prefix = f"{layer_type}_" if hasattr(rotary, f"{layer_type}_inv_freq") else ""
    inv_freq = getattr(rotary, f"{prefix}inv_freq")
    factor = float(getattr(rotary, f"{prefix}attention_scaling"))
    half = inv_freq.shape[0]
    q = torch.tensor(case["q"], dtype=torch.float32).expand(1, 1, len(case["positions"]), -1)
    if torch.is_tensor(out) and out.is_complex():  # cos + i sin, on interleaved pairs
        cos, sin = out.real[0] / factor, out.imag[0] / factor
        rotary_dim = 2 * half
        head = _half_to_interleaved(q[..., :rotary_dim])
        # Llama 4 takes q as [B, L, H, D], DeepSeek-V2 as [B, H, L, D]
        by_position = hf_config.model_type != "deepseek_v2"
        head = head.transpose(1, 2) if by_position else head
        rotated, _ = models.apply_rotary_emb(head, head, out)
        rotated = rotated.transpose(1, 2) if by_position else rotated
        rotated = torch.cat((_interleaved_to_half(rotated), q[..., rotary_dim:]), -1)
    else:
        full_cos, full_sin = out
        cos, sin = full_cos[0, :, :half] / factor, full_sin[0, :, :half] / factor
        apply = models.apply_rotary_pos_emb
        if "k" in inspect.signature(apply).parameters:
            rotated, _ = apply(q, q, full_cos, full_sin)
        else:  # Gemma 4: one tensor at a time
            rotated = apply(q, full_cos, full_sin)
    return {
        "inv_freq": inv_freq,
        "attention_factor": factor,
        "cos": cos,
        "sin": sin,
        "q_rotated": rotated[0, 0],
    }


# transformers and the vectors disagree here; each is marked, not hidden
DISAGREE: dict[str, str] = {}


def _case_params():
    return [
        pytest.param(
            case["id"],
            marks=[pytest.mark.xfail(strict=True, reason=DISAGREE[case["id"]])]
            if case["id"] in DISAGREE
            else [],
            id=case["id"],
        )
        for case in conformance_vectors()["cases"]
    ]


@pytest.mark.parametrize("case_id", _case_params())
def test_transformers_rotary_embedding_passes_the_float32_tolerances(case_id):
    pytest.importorskip("transformers")
    vectors = conformance_vectors()
    vectors["cases"] = [case for case in vectors["cases"] if case["id"] == case_id]
    report = check_rope_engine(transformers_engine, vectors=vectors)
    assert report.passed, str(report)
    # every entry is compared except those beyond float32, which are counted
    (case,) = vectors["cases"]
    assert report.beyond.get("cos", 0) == sum(case["float32_beyond"])
    assert report.results[0].entries["cos"] == len(case["inv_freq"]) * len(case["positions"]) - sum(
        case["float32_beyond"]
    )


def test_transformers_engine_fails_the_float64_tolerances():
    # transformers computes in float32: the float64 tolerances are not met, the check can fail
    pytest.importorskip("transformers")
    vectors = conformance_vectors()
    vectors["cases"] = [c for c in vectors["cases"] if c["id"] == "gpt-oss-20b/full_attention"]
    assert not check_rope_engine(transformers_engine, vectors=vectors, float32=False).passed
