"""Chapter 11's long-context proofs: each holds, its false neighbour fails for the stated
reason, and the rule each proof is about is the rule pecode.scaling computes."""

from __future__ import annotations

import math

import pytest
import sympy as sp
import torch

from pecode.proofs import scaling as proofs
from pecode.rope import apply_rope, rope_cos_sin, rope_inv_freq
from pecode.scaling import rope_frequencies, yarn_correction_range

F64 = torch.float64
CASES = {case.name.removeprefix("scaling."): case for case in proofs.CASES}


def value(expr: sp.Expr, subs=None, **numbers: float) -> float:
    """``expr`` (after the step's ``subs``) at the numbers given by symbol name."""
    if subs:
        expr = expr.subs(dict(subs))
    return float(expr.subs({symbol: numbers[symbol.name] for symbol in expr.free_symbols}))


@pytest.mark.parametrize("name", list(CASES))
def test_proof_holds_and_renders(name):
    proof = CASES[name].build()
    assert proof.holds(), proof.failing_steps()
    assert "Holds" in proof._repr_markdown_()
    # every step is derived but linear scaling's first, m(θ/s) = (m/s)θ, one sympy object
    definitions = [k for k, step in enumerate(proof.steps, start=1) if step.by_definition]
    assert definitions == ([1] if name == "linear_is_position_interpolation" else [])


@pytest.mark.parametrize("name", list(CASES))
def test_false_neighbour_renders_its_failure(name):
    shown = CASES[name].mutant()._repr_markdown_()
    assert "**Does not hold:**" in shown
    assert "not zero" in shown


def test_linear_proof_is_the_logit_pecode_computes():
    # step 2's right side, the trained logit at offset (n - m)/s, against apply_rope with
    # the frequencies divided by s; the false neighbour (times s) is far off
    torch.manual_seed(0)
    q, k = torch.randn(2, dtype=F64), torch.randn(2, dtype=F64)
    theta, factor, m, n = 0.3, 4.0, 7.0, 29.0
    inv = torch.tensor([theta / factor], dtype=F64)
    cos, sin = rope_cos_sin(torch.tensor([m, n], dtype=F64), inv)
    rotated_q = apply_rope(q.view(1, 2), cos[:1], sin[:1], "interleaved")
    rotated_k = apply_rope(k.view(1, 2), cos[1:], sin[1:], "interleaved")
    logit = (rotated_q * rotated_k).sum().item()
    numbers = dict(theta_i=theta, s=factor, m=m, n=n, q_1=q[0].item(), q_2=q[1].item())
    numbers |= dict(k_1=k[0].item(), k_2=k[1].item())
    step = proofs.linear_is_position_interpolation().steps[1]
    assert math.isclose(value(step.rhs, **numbers), logit, abs_tol=1e-12)
    wrong = proofs.linear_is_position_interpolation(frequency_factor=proofs.s).steps[1]
    numbers["theta_i'"] = theta * factor
    assert abs(value(wrong.lhs, **numbers) - logit) > 1e-3


@pytest.mark.parametrize("dim", [64, 128])
def test_ntk_proof_is_the_rule_pecode_computes(dim):
    # step 3's left side, the lowest scaled frequency, against rope_frequencies("ntk")
    numbers = dict(d=dim, b=10000.0, s=8.0)
    inv_freq, _ = rope_frequencies("ntk", dim, 10000.0, dtype=F64, factor=8.0)
    step = proofs.ntk_endpoints().steps[2]
    assert math.isclose(value(step.lhs, step.subs, **numbers), inv_freq[-1].item(), rel_tol=1e-12)
    assert inv_freq[0].item() == 1.0  # step 1
    # the false neighbour's lowest frequency is divided by s^((d-2)/(d-1)), not by s
    wrong = proofs.ntk_endpoints(exponent=proofs.d / (proofs.d - 1)).steps[2]
    default_last = rope_inv_freq(dim, 10000.0, dtype=F64)[-1].item()
    expected = default_last / 8.0 ** ((dim - 2) / (dim - 1))
    assert math.isclose(value(wrong.lhs, wrong.subs, **numbers), expected, rel_tol=1e-12)
    assert not math.isclose(expected, default_last / 8.0, rel_tol=1e-3)


def _dynamic_inv_freq(seq_len: int):
    inv_freq, _ = rope_frequencies(
        "dynamic",
        128,
        10000.0,
        dtype=F64,
        factor=4.0,
        original_max_position_embeddings=4096,
        seq_len=seq_len,
    )
    return inv_freq


@pytest.mark.parametrize("seq_len", [4096, 6000, 16384])
def test_dynamic_proof_is_the_base_pecode_computes(seq_len):
    numbers = dict(d=128, b=10000.0, s=4.0, L=seq_len, L_0=4096)
    step = proofs.dynamic_equals_default().steps[1]  # b * bracket^(d/(d-2)), before L = L0
    new_base = value(step.lhs, **numbers)
    assert math.isclose(new_base ** (-2 / 128), _dynamic_inv_freq(seq_len)[1].item(), rel_tol=1e-12)
    if seq_len > 4096:
        # step 5's derivative of the base against a central difference of pecode's base
        def base(length: int) -> float:
            return _dynamic_inv_freq(length)[1].item() ** (-128 / 2)

        slope = proofs.dynamic_equals_default().steps[4].rhs
        difference = (base(seq_len + 1) - base(seq_len - 1)) / 2
        assert math.isclose(value(slope, **numbers), difference, rel_tol=1e-6)
        assert difference > 0
    # the false neighbour's bracket s(L/L0 - 1) is 0 at L0: base 0, no rotation at all
    wrong = proofs.dynamic_equals_default(offset=proofs.s).steps[0]
    assert value(wrong.lhs, wrong.subs, **numbers) == 0.0


def test_llama3_proof_is_the_middle_band_pecode_computes():
    # Llama 3.1: L0 = 8192, f_low = 1, f_high = 4, s = 8, b = 500000, d = 128
    inv_freq, _ = rope_frequencies(
        "llama3",
        128,
        500000.0,
        dtype=F64,
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )
    plain = rope_inv_freq(128, 500000.0, dtype=F64)
    wavelength = 2 * math.pi / plain
    middle = torch.nonzero((wavelength > 8192 / 4) & (wavelength < 8192 / 1)).flatten()
    assert len(middle) > 0
    step = proofs.llama3_continuity().steps[1]  # the middle band, before λ = L0/f_low
    swapped = proofs.llama3_continuity(swap_factors=True).steps[1]
    for pair in middle.tolist():
        numbers = dict(theta=plain[pair].item(), s=8.0, L_0=8192.0, f_low=1.0, f_high=4.0)
        numbers["lambda"] = wavelength[pair].item()
        assert math.isclose(value(step.lhs, **numbers), inv_freq[pair].item(), rel_tol=1e-12)
        assert not math.isclose(value(swapped.lhs, **numbers), inv_freq[pair].item(), rel_tol=1e-3)


def test_yarn_proof_index_is_the_range_pecode_computes():
    # LLaMA: d = 128, b = 10000, L0 = 4096, beta_fast = 32, beta_slow = 1
    step = proofs.yarn_boundary().steps[0]
    (index,) = step.subs.values()
    numbers = dict(d=128, b=10000.0, L_0=4096.0)
    low, high = yarn_correction_range(128, 10000.0, 4096, 32.0, 1.0)
    assert math.floor(value(index, beta=32.0, **numbers)) == low
    assert math.ceil(value(index, beta=1.0, **numbers)) == high
    # step 2: r_i is exponential in i, so its derivative is r_i ln(r_{i+1}/r_i), with r_i
    # from pecode's frequencies
    slope = proofs.yarn_boundary().steps[1]
    plain = rope_inv_freq(128, 10000.0, dtype=F64)
    turns = 4096.0 * plain[3].item() / (2 * math.pi)
    want = turns * math.log(plain[4].item() / plain[3].item())
    for side in (slope.lhs.doit(), slope.rhs):
        assert math.isclose(value(side, i=3.0, **numbers), want, rel_tol=1e-12)
    # with π for 2π the index marks the pair that turns β/2 times, not β
    wrong = proofs.yarn_boundary(angle_per_turn=sp.pi).steps[0]
    assert math.isclose(value(wrong.lhs, wrong.subs, beta=32.0, **numbers), 16.0, rel_tol=1e-12)


@pytest.mark.parametrize("c", [0.5, 1.1386, 3.0])
def test_attention_factor_scales_pecode_logits_by_its_square(c):
    # the proven c^2 on rope_cos_sin tables and apply_rope, 8 pairs at once
    torch.manual_seed(1)
    q, k = torch.randn(5, 16, dtype=F64), torch.randn(5, 16, dtype=F64)
    cos, sin = rope_cos_sin(torch.arange(5, dtype=F64), rope_inv_freq(16, dtype=F64))
    plain = apply_rope(q, cos, sin) @ apply_rope(k, cos, sin).T
    scaled = apply_rope(q, c * cos, c * sin) @ apply_rope(k, c * cos, c * sin).T
    assert torch.allclose(scaled, c**2 * plain, rtol=1e-12, atol=1e-12)
    assert not torch.allclose(scaled, c * plain, rtol=1e-3)  # the false neighbour's claim
    # step 3's sum over n = 8 pairs (j, features 2j and 2j + 1), at query position 3 and
    # key position 1, is that logit in the interleaved layout
    scaled = (
        apply_rope(q, c * cos, c * sin, "interleaved")
        @ apply_rope(k, c * cos, c * sin, "interleaved").T
    )
    step = proofs.attention_factor_squares().steps[2]
    wrong = proofs.attention_factor_squares(power=1).steps[2]
    numbers = {"c": c, "n": 8}
    for j in range(8):
        numbers[f"varphi[{j}]"] = 3 * rope_inv_freq(16, dtype=F64)[j].item()
        numbers[f"psi[{j}]"] = 1 * rope_inv_freq(16, dtype=F64)[j].item()
    for j in range(16):
        numbers[f"q[{j}]"], numbers[f"k[{j}]"] = q[3, j].item(), k[1, j].item()
    for side in (step.lhs, step.rhs):
        assert math.isclose(indexed_value(side, numbers), scaled[3, 1].item(), abs_tol=1e-12)
    assert not math.isclose(indexed_value(wrong.rhs, numbers), scaled[3, 1].item(), rel_tol=1e-3)


def indexed_value(expr: sp.Expr, numbers: dict) -> float:
    """``expr`` with its symbolic sum expanded, then indexed symbols set by their names."""
    expr = expr.subs({s: numbers[s.name] for s in expr.free_symbols if s.name in numbers})
    expr = expr.doit()
    return float(expr.subs({s: numbers[str(s)] for s in expr.atoms(sp.Indexed)}))
