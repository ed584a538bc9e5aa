"""The bias-family proofs hold, their false neighbours fail where named, and the proofs'
formulas agree with pecode's KERPLE and ALiBi, with float64 loops written from the
papers and the reference code, and with the numerical CPD check."""

from __future__ import annotations

import inspect
import math
import random

import pytest
import sympy as sp
import torch

from pecode.absolute import sinusoidal_table
from pecode.alibi import alibi_bias
from pecode.kerple import kerple_bias
from pecode.proofs import Proof
from pecode.proofs import bias_family as bf
from pecode.proofs.bias_family import (
    CASES,
    EVIDENCE,
    alibi_kernel_cpd,
    cpd_min_eigenvalue,
    cpd_power_two,
    forgetting_gate_constant_is_alibi,
    forgetting_gate_is_relative,
    kerple_log_is_curved,
    kerple_log_limit_is_alibi,
    kerple_power_is_alibi,
    sandwich_bias_is_never_above_the_diagonal,
)


def _symbol(expr, name):
    return next(s for s in expr.free_symbols if getattr(s, "name", None) == name)


# --- the catalogue's checks, on this module (it joins pecode.proofs.MODULES) -----------


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_the_proof_holds_and_every_step_could_fail(case):
    proof = case.build()
    assert proof.holds(), f"fails at {proof.failing_steps()}"
    assert proof.unmarked_restatements() == []
    assert proof.derived_steps()


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_the_false_neighbour_fails_at_the_named_steps(case):
    assert case.mutant().failing_steps() == list(case.fails_at)


def test_every_proof_function_has_a_case_and_an_evidence_word():
    proofs = {
        name
        for name, function in vars(bf).items()
        if inspect.isfunction(function)
        and function.__module__ == bf.__name__
        and not name.startswith("_")
        and inspect.signature(function).return_annotation in ("Proof", Proof)
    }
    assert proofs == {case.name.removeprefix("bias_family.") for case in CASES}
    public = {name for name in bf.__all__ if name not in ("CASES", "EVIDENCE")}
    assert set(EVIDENCE) == public
    assert set(EVIDENCE.values()) == {"proven", "checked"}


# --- 1. KERPLE and ALiBi ---------------------------------------------------------------


def test_the_log_kernel_fails_every_step_of_the_alibi_proof_at_any_rate():
    proof = kerple_power_is_alibi("log")
    assert proof.failing_steps() == [1, 2, 3, 4]
    residual = proof.steps[2].residual  # -m log(1 + r2 |i-j|) + m |i-j|
    r2, i, j = (_symbol(residual, name) for name in ("r_2", "i", "j"))
    for rate in (0.01, 1.0, 7.5):
        assert abs(float(residual.subs({r2: rate, i: 5, j: 1, bf.SLOPE: 0.5}))) > 1e-4


def test_the_square_power_misses_alibi_by_the_curvature():
    proof = kerple_power_is_alibi(exponent=2)
    assert sp.simplify(proof.steps[1].residual + 2 * bf.SLOPE) == 0  # second difference -2m


@pytest.mark.parametrize("symmetric", [True, False])
def test_the_proofs_kernel_is_pecodes_kerple_and_alibi(symmetric):
    """Step 3's (symmetric) or step 4's (causal) left side, evaluated by sympy, against
    pecode.kerple's power bias and pecode.alibi's bias, entry by entry."""
    step = kerple_power_is_alibi().steps[2 if symmetric else 3]
    slopes = [0.5, 0.25, 0.0625]
    n = 7
    kerple = kerple_bias(
        "power",
        torch.arange(n).unsqueeze(-1) - torch.arange(n).unsqueeze(-2),
        torch.tensor(slopes, dtype=torch.float64),
        torch.ones(3, dtype=torch.float64),
    )
    alibi = alibi_bias(torch.tensor(slopes, dtype=torch.float64), n, symmetric=symmetric)
    alibi = alibi.to(torch.float64)
    for h, m in enumerate(slopes):
        for i in range(n):
            for j in range(n if symmetric else i + 1):
                at = {bf.SLOPE: m, bf.I_: i, bf.J_: j, bf.T: i - j}
                value = float(step.lhs.subs(step.subs).subs(at))
                assert value == pytest.approx(float(kerple[h, i, j]), abs=1e-12)
                assert value == pytest.approx(float(alibi[h, i, j]), abs=1e-12)
    if not symmetric:  # above the diagonal causal ALiBi is -inf, KERPLE finite
        assert torch.isinf(alibi[:, 0, 1:]).all()
        assert torch.isfinite(kerple).all()


def test_the_log_kernel_is_curved_for_pecodes_parameters():
    """Step 2's second derivative against a float64 second difference of pecode's log bias."""
    curvature = kerple_log_is_curved().steps[1].rhs
    distance = torch.arange(0, 40).unsqueeze(-1) - torch.zeros(1, 1, dtype=torch.long)
    for r1, r2 in [(0.3, 0.05), (1.7, 0.8)]:
        bias = kerple_bias(
            "log",
            distance,
            torch.tensor([r1], dtype=torch.float64),
            torch.tensor([r2], dtype=torch.float64),
        )[0, :, 0]
        second = bias[2:] - 2 * bias[1:-1] + bias[:-2]
        assert bool((second > 0).all())
        at = {bf.R1: r1, bf.R2: r2}
        for d in (3, 20):
            exact = float(curvature.subs({**at, bf.DIST: d + 1}))  # centre of the stencil
            assert float(second[d]) == pytest.approx(exact, rel=0.05)


def test_the_log_kernel_approaches_alibi_at_the_proven_rate():
    """pecode's log bias with r1 = m / r2 (r2 at the authors' clamp 0.01 and above):
    the gap to -m d over r2 tends to m d^2 / 2 (step 3); holding r1 = m instead (the
    false neighbour), the bias is nowhere near -m d."""
    m, distance = 0.5, torch.arange(1, 6).view(-1, 1)
    alibi = -m * distance[:, 0].to(torch.float64)
    errors = []
    for r2 in (0.1, 0.01):
        bias = kerple_bias(
            "log",
            distance,
            torch.tensor([m / r2], dtype=torch.float64),
            torch.tensor([r2], dtype=torch.float64),
        )[0, :, 0]
        gap = (bias - alibi) / r2
        limit = m * distance[:, 0].to(torch.float64) ** 2 / 2
        errors.append((gap - limit).abs())
        for d, value in zip(range(1, 6), gap.tolist(), strict=True):
            assert value == pytest.approx(m * d**2 / 2, rel=r2 * d)
    assert bool((errors[1] < errors[0] / 5).all())  # the gap closes as r2 shrinks
    held = kerple_bias(
        "log", distance, torch.tensor([m], dtype=torch.float64), torch.tensor([0.01])
    )[0, :, 0]
    assert bool(((held - alibi).abs() > 0.4 * m * distance[:, 0]).all())


# --- 2. Conditional positive definiteness ----------------------------------------------


@pytest.mark.parametrize("n", [2, 3, 5])
def test_the_square_kernel_is_cpd_for_each_size(n):
    assert cpd_power_two(n).holds()


def test_without_the_constraint_the_square_kernel_goes_negative():
    """Step 3's form at c = (1, 1), x = (0, 1): -2, so -(x-y)^2 is not positive definite."""
    form = cpd_power_two(2, constrained=False).steps[2].lhs
    values = {
        _symbol(form, name): v
        for name, v in zip(["c_0", "c_1", "x_0", "x_1"], [1, 1, 0, 1], strict=True)
    }
    assert form.subs(values) == -2


@pytest.mark.parametrize("n", [2, 3, 6])
def test_alibis_kernel_is_cpd_for_each_size(n):
    assert alibi_kernel_cpd(n).holds()


def test_the_sum_of_squares_has_the_eigenvalue_of_the_numerical_check():
    """The proof's sum of squares, restricted to sum-zero c (sympy's Hessian on a basis),
    has the least eigenvalue that cpd_min_eigenvalue finds from the Gram matrix."""
    n = 5
    squares = alibi_kernel_cpd(n).steps[1].rhs
    cs = sp.symbols(f"c_0:{n}", real=True)
    hessian = torch.tensor(sp.hessian(squares, cs).tolist(), dtype=torch.float64) / 2
    basis = torch.tensor(bf._sum_zero_basis(n))
    least = torch.linalg.eigvalsh(basis.T @ hessian @ basis).min().item()
    assert least == pytest.approx(cpd_min_eigenvalue("power", n, 1.0), rel=1e-12)


def _least_quadratic_form(kernel, n, trials, seed):
    """A float64 loop: the least c^T K c / c^T c over random c with sum 0, one entry of
    K and one product at a time (KERPLE's kernels written from the paper, §4)."""
    rng = random.Random(seed)
    least = math.inf
    for _ in range(trials):
        c = [rng.gauss(0.0, 1.0) for _ in range(n)]
        mean = sum(c) / n
        c = [v - mean for v in c]
        form = sum(c[p] * c[q] * kernel(abs(p - q)) for p in range(n) for q in range(n))
        least = min(least, form / sum(v * v for v in c))
    return least


@pytest.mark.parametrize(
    ("kernel", "shape", "name"),
    [(lambda d: -(d**0.5), 0.5, "power"), (lambda d: -math.log1p(2.0 * d), 2.0, "log")],
)
def test_the_eigenvalue_bounds_every_quadratic_form_of_the_loop(kernel, shape, name):
    least = _least_quadratic_form(kernel, 6, 400, seed=0)
    assert least >= cpd_min_eigenvalue(name, 6, shape) - 1e-12


@pytest.mark.parametrize(("name", "shape"), [("power", 0.5), ("power", 2.5), ("log", 2.0)])
def test_the_eigenvalue_is_the_projected_matrix_s(name, shape):
    """Another route (torch): the eigenvalues of P K P, P = I - 11^T / n, whose
    eigenvectors sum to 0, are those of K on the sum-zero vectors."""
    n = 9
    d = (torch.arange(n).unsqueeze(-1) - torch.arange(n).unsqueeze(-2)).abs().double()
    gram = -(d**shape) if name == "power" else -torch.log1p(shape * d)
    projection = torch.eye(n, dtype=torch.float64) - 1.0 / n
    values, vectors = torch.linalg.eigh(projection @ gram @ projection)
    on_sum_zero = values[vectors.sum(0).abs() < 1e-6]
    assert len(on_sum_zero) == n - 1
    assert on_sum_zero.min().item() == pytest.approx(cpd_min_eigenvalue(name, n, shape), abs=1e-12)


def test_the_loop_finds_a_negative_form_for_the_power_two_and_a_half():
    least = _least_quadratic_form(lambda d: -(d**2.5), 6, 400, seed=1)
    assert least < 0
    assert least >= cpd_min_eigenvalue("power", 6, 2.5) - 1e-12


@pytest.mark.parametrize("n", [2, 3, 8, 17, 64])
def test_the_paper_kernels_pass_the_numerical_check(n):
    """Checked, not proven: the power kernel for 0 < p <= 2 and the log kernel."""
    for p in (0.1, 0.5, 1.0, 1.5, 1.9, 2.0):
        assert cpd_min_eigenvalue("power", n, p, scale=0.7) >= -1e-9, p
    for r in (0.01, 0.3, 1.0, 10.0):
        assert cpd_min_eigenvalue("log", n, r, scale=1.3) >= -1e-9, r


@pytest.mark.parametrize("n", [3, 8, 64])
def test_past_two_the_power_kernel_is_not_cpd(n):
    assert cpd_min_eigenvalue("power", n, 2.5) < -0.5
    assert cpd_min_eigenvalue("power", n, 2.1) < -1e-3


def test_the_kernels_are_conditionally_not_plainly_positive_definite():
    """The whole Gram matrix (every c, not only those summing to 0) is indefinite: its
    diagonal, hence its trace, is 0."""
    assert cpd_min_eigenvalue("power", 8, 1.0, sum_zero=False) < -1.0
    assert cpd_min_eigenvalue("log", 8, 1.0, sum_zero=False) < -1.0


# --- 3. The forget gate ----------------------------------------------------------------


def _gate_bias_loop(log_gates, start_at_key):
    """D_ij = Σ_{l=j+1}^{i} log f_l (Lin et al. 2025, "Forgetting Attention"), one term
    at a time, for j <= i; ``start_at_key`` starts at l = j (the false neighbour)."""
    n = len(log_gates)
    out = [[-math.inf] * n for _ in range(n)]
    for i in range(n):
        for j in range(i + 1):
            out[i][j] = sum(log_gates[t] for t in range(j if start_at_key else j + 1, i + 1))
    return torch.tensor(out, dtype=torch.float64)


def test_a_constant_gate_is_pecodes_causal_alibi():
    m, n = 0.375, 7
    loop = _gate_bias_loop([-m] * n, start_at_key=False)
    torch.testing.assert_close(loop, alibi_bias(torch.tensor([m]), n, dtype=torch.float64)[0])
    # the proof's step 1, evaluated at every i, j, gives the same numbers
    step = forgetting_gate_constant_is_alibi().steps[0]
    for i, j in [(0, 0), (4, 1), (6, 6)]:
        assert float(step.lhs.subs({bf.SLOPE: m, bf.I_: i, bf.J_: j}).doit()) == pytest.approx(
            float(loop[i, j])
        )
    shifted = _gate_bias_loop([-m] * n, start_at_key=True)
    below = torch.ones(n, n, dtype=torch.bool).tril()
    torch.testing.assert_close((shifted - loop)[below], torch.full((n, n), -m)[below].double())


def test_any_gates_are_a_difference_of_cumulative_sums():
    """The loop against c_i - c_j from a cumulative sum (the authors' kernel's route)."""
    torch.manual_seed(0)
    log_gates = torch.nn.functional.logsigmoid(torch.randn(9, dtype=torch.float64) + 2)
    loop = _gate_bias_loop(log_gates.tolist(), start_at_key=False)
    c = torch.cumsum(log_gates, 0)
    relative = (c.unsqueeze(-1) - c.unsqueeze(-2)).masked_fill(
        torch.ones(9, 9, dtype=torch.bool).triu(1), -math.inf
    )
    torch.testing.assert_close(loop, relative)
    absolute = (c.unsqueeze(-1) + c.unsqueeze(-2)).tril()
    assert not torch.allclose(loop.tril(), absolute)


def test_the_forget_gate_neighbours_fail_for_the_stated_reason():
    step = forgetting_gate_constant_is_alibi("j").steps[0]
    assert sp.simplify(step.residual + bf.SLOPE) == 0  # one gate too many: -m
    assert not forgetting_gate_is_relative("sum").holds()


# --- 4. Sandwich -----------------------------------------------------------------------


def _sandwich_loop(distance, dim, heads, head, compensation):
    """NeMo's Sandwich bias (sandwich_relative_position_embedding.py, read there): the
    sum over i = 1 .. dim/2 of cos(k / 10000^(2i/dim)), minus dim/2, over 8 h / H."""
    total = sum(math.cos(distance / 10000 ** (2 * i / dim)) for i in range(1, dim // 2 + 1))
    return (total - compensation) / (head * 8 / heads)


@pytest.mark.parametrize("dim", [2, 8, 16])
def test_the_closed_form_is_nemos_sandwich_bias(dim):
    """Step 5's right side, -(2/ρ) Σ sin^2(k ω_i / 2) at b = 10000, against the loop."""
    proof = sandwich_bias_is_never_above_the_diagonal(dim=dim)
    closed = proof.steps[4].rhs
    k, b, rho = (_symbol(closed, name) for name in ("k", "b", "rho"))
    heads = 8
    for head in (1, 5):
        for distance in (0, 1, 7, 300, -7):
            value = float(closed.subs({k: distance, b: 10000, rho: head * 8 / heads}))
            want = _sandwich_loop(distance, dim, heads, head, dim / 2)
            assert value == pytest.approx(want, abs=1e-12)
            assert value <= 0.0
    wrong = sandwich_bias_is_never_above_the_diagonal("full", dim=dim).steps[4]
    assert float(wrong.residual.subs(_symbol(wrong.residual, "rho"), 1)) == -dim / 2


def test_pecodes_sinusoidal_table_gives_the_dot_product_and_the_closed_form():
    """With attention-gym's frequencies (i = 0 .. d'/2 - 1, pecode's sinusoidal table),
    p_m · p_n - d'/2 is -2 Σ sin^2((m - n) ω_i / 2): steps 1 and 4 hold for any first
    index; and the uncompensated bias gives the same softmax rows as the compensated."""
    dim, n = 16, 40
    table = sinusoidal_table(n, dim, dtype=torch.float64)
    dots = table @ table.T
    distance = torch.arange(n).unsqueeze(-1) - torch.arange(n).unsqueeze(-2)
    omegas = 10000.0 ** (-torch.arange(dim // 2, dtype=torch.float64) * 2 / dim)
    closed = -2 * torch.sin(distance.unsqueeze(-1) * omegas / 2).pow(2).sum(-1)
    torch.testing.assert_close(dots - dim / 2, closed, atol=1e-12, rtol=0)
    torch.testing.assert_close(
        torch.diagonal(dots), torch.full((n,), dim / 2.0, dtype=torch.float64)
    )
    torch.testing.assert_close(torch.softmax(dots / 3, -1), torch.softmax((dots - dim / 2) / 3, -1))


# --- bad input -------------------------------------------------------------------------


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="kernel"):
        kerple_power_is_alibi("cosine")
    with pytest.raises(TypeError, match="exponent"):
        kerple_power_is_alibi(exponent=1.0)
    with pytest.raises(ValueError, match="kernel"):
        kerple_log_is_curved("power")
    with pytest.raises(ValueError, match="hold"):
        kerple_log_limit_is_alibi("both")
    with pytest.raises(ValueError, match="n must be"):
        cpd_power_two(1)
    with pytest.raises(TypeError, match="n must be"):
        alibi_kernel_cpd(4.0)
    with pytest.raises(ValueError, match="start"):
        forgetting_gate_constant_is_alibi("j-1")
    with pytest.raises(ValueError, match="combine"):
        forgetting_gate_is_relative("product")
    with pytest.raises(ValueError, match="compensation"):
        sandwich_bias_is_never_above_the_diagonal("none")
    with pytest.raises(ValueError, match="dim"):
        sandwich_bias_is_never_above_the_diagonal(dim=7)
    with pytest.raises(ValueError, match="kernel"):
        cpd_min_eigenvalue("gauss", 4, 1.0)
    with pytest.raises(ValueError, match="n must be"):
        cpd_min_eigenvalue("power", 1, 1.0)
    with pytest.raises(ValueError, match="shape"):
        cpd_min_eigenvalue("power", 4, -1.0)
    with pytest.raises(TypeError, match="scale"):
        cpd_min_eigenvalue("log", 4, 1.0, scale=True)
