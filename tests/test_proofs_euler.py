"""Chapter 7's proofs hold, their false neighbours fail where the cases say, and the
statements agree with independent references (sympy's Taylor series, Python's complex
arithmetic)."""

from __future__ import annotations

import cmath
import math
import random
from dataclasses import replace

import pytest
import sympy as sp
from sympy.core.cache import clear_cache
from sympy.functions.elementary.exponential import exp

from pecode.proofs.core import residual
from pecode.proofs.euler import (
    CASES,
    cis,
    de_moivre,
    euler_formula,
    multiplication_by_i,
    rotation_preserves_length,
    trig_residual,
)

CASE_IDS = [case.name for case in CASES]


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_proof_holds_and_renders(case):
    proof = case.build()
    assert proof.holds(), proof.failing_steps()
    assert proof.unmarked_restatements() == []
    assert "**Holds:**" in proof._repr_markdown_()


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_false_neighbour_fails_where_named(case):
    mutant = case.mutant()
    assert mutant.failing_steps() == list(case.fails_at)
    assert "**Does not hold:**" in mutant._repr_markdown_()


def test_every_proof_function_has_a_case():
    names = {"multiplication_by_i", "euler_formula", "angle_addition", "de_moivre"}
    names |= {"rotation_preserves_length", "relative_phase"}
    assert {case.name.removeprefix("euler.") for case in CASES} == names


def test_euler_formula_does_not_use_exp_cos_or_sin():
    # the circular version summed the series with sympy, which returns exp(I*theta)
    for step in euler_formula().steps:
        for side in (step.lhs, step.rhs):
            assert not side.has(sp.exp, sp.cos, sp.sin), step.text


@pytest.mark.parametrize("terms", [0, 1, 2, 5])
def test_cosine_and_sine_sums_are_the_taylor_polynomials(terms):
    # independent reference: sympy's Taylor expansion of cos and sin from derivatives
    theta = sp.Symbol("theta", real=True)
    j = sp.Symbol("j", integer=True, nonnegative=True)
    cos_sum = sp.Sum((-1) ** j * theta ** (2 * j) / sp.factorial(2 * j), (j, 0, terms))
    sin_sum = sp.Sum((-1) ** j * theta ** (2 * j + 1) / sp.factorial(2 * j + 1), (j, 0, terms))
    order = 2 * terms + 2
    assert sp.expand(cos_sum.doit() - sp.cos(theta).series(theta, 0, order).removeO()) == 0
    assert sp.expand(sin_sum.doit() - sp.sin(theta).series(theta, 0, order).removeO()) == 0


def test_partial_sum_split_numerically():
    # S_{2N+1} = C_N + i O_N with Python's complex arithmetic, term by term
    rng = random.Random(0)
    for _ in range(20):
        theta = rng.uniform(-4, 4)
        big_n = rng.randint(0, 12)
        partial = sum((1j * theta) ** n / math.factorial(n) for n in range(2 * big_n + 2))
        cos_part = sum(
            (-1) ** j * theta ** (2 * j) / math.factorial(2 * j) for j in range(big_n + 1)
        )
        sin_part = sum(
            (-1) ** j * theta ** (2 * j + 1) / math.factorial(2 * j + 1) for j in range(big_n + 1)
        )
        assert abs(partial - (cos_part + 1j * sin_part)) < 1e-9


def test_de_moivre_numerically_for_negative_and_positive_m():
    rng = random.Random(1)
    for _ in range(50):
        theta = rng.uniform(-3, 3)
        m = rng.randint(-20, 20)
        lhs = complex(math.cos(theta), math.sin(theta)) ** m
        assert abs(lhs - complex(math.cos(m * theta), math.sin(m * theta))) < 1e-9


def test_multiplication_by_i_matches_python_and_not_the_clockwise_turn():
    z = complex(0.3, -1.7)
    assert 1j * z == complex(-z.imag, z.real)
    assert not multiplication_by_i(turn=-sp.pi / 2).holds()
    assert multiplication_by_i(turn=sp.pi / 2 + 2 * sp.pi).holds()  # same rotation


def test_derivative_step_compares_evaluated_derivatives():
    # step 4 holds because sympy differentiates; the unturned position is not the velocity
    step = rotation_preserves_length().steps[3]
    theta = sp.Symbol("theta", real=True)
    assert step.holds
    assert not replace(step, rhs=sp.Matrix([sp.cos(theta), sp.sin(theta)])).holds


def test_splitting_off_last_terms_fails_with_a_skipped_term():
    step = euler_formula().steps[3]
    n, big_n = sp.symbols("n N", integer=True, nonnegative=True)
    g = sp.Function("g")

    def split(upper: sp.Expr, tail: tuple) -> sp.Matrix:
        return sp.Matrix([sp.Sum(g(n), (n, 0, upper)) + sp.Sum(g(n), (n, *tail)), step.rhs[1]])

    assert step.holds
    assert replace(step, rhs=split(2 * big_n + 2, (2 * big_n + 3, 2 * big_n + 3))).holds
    assert not replace(step, rhs=split(2 * big_n + 1, (2 * big_n + 3, 2 * big_n + 3))).holds


def test_relative_phase_numerically_with_python_complex():
    rng = random.Random(0)
    for _ in range(50):
        q = complex(rng.gauss(0, 1), rng.gauss(0, 1))
        k = complex(rng.gauss(0, 1), rng.gauss(0, 1))
        m, n, shift = rng.randint(0, 500), rng.randint(0, 500), rng.randint(-100, 100)
        theta = rng.uniform(0, 3)
        turned_q = q * cmath.exp(1j * m * theta)
        turned_k = k * cmath.exp(1j * n * theta)
        dot = turned_q.real * turned_k.real + turned_q.imag * turned_k.imag
        relative = (q * k.conjugate() * cmath.exp(1j * (m - n) * theta)).real
        moved = (
            q
            * cmath.exp(1j * (m + shift) * theta)
            * (k * cmath.exp(1j * (n + shift) * theta)).conjugate()
        ).real
        assert abs(dot - relative) < 1e-9
        assert abs(moved - relative) < 1e-9


def test_de_moivre_in_one_line_is_beyond_the_trig_residual():
    # simplify proves the whole theorem through exp; the residual the steps use cannot
    theta = sp.Symbol("theta", real=True)
    m = sp.Symbol("m", integer=True, nonnegative=True)
    assert residual(cis(theta) ** m, cis(m * theta)) == 0
    for pythagoras in (False, True):
        assert trig_residual(cis(theta) ** m, cis(m * theta), pythagoras=pythagoras) != 0


@pytest.mark.parametrize("number", [2, 4])
def test_de_moivre_induction_fails_without_its_hypothesis(number):
    step = de_moivre().steps[number - 1]
    assert step.holds
    assert not replace(step, subs=None).holds


def test_de_moivre_base_case_is_an_evaluation_that_can_fail():
    step = de_moivre().steps[0]
    theta = sp.Symbol("theta", real=True)
    m = sp.Symbol("m", integer=True, nonnegative=True)
    assert step.by_substitution
    assert not replace(step, subs=None).holds  # m stays symbolic: nothing to evaluate
    assert not replace(step, rhs=cis((m + 1) * theta)).holds  # exponent off by one


@pytest.mark.parametrize("turn", [0, sp.pi / 4, sp.pi])
def test_multiplication_by_i_substituted_steps_fail_for_other_angles(turn):
    # step 4 is an evaluation at φ, step 2 also multiplies out Re and Im; a wrong angle
    # fails both (-π/2 fails step 2 only)
    assert [i for i, s in enumerate(multiplication_by_i().steps, 1) if s.by_substitution] == [4]
    assert multiplication_by_i(turn=turn).failing_steps() == [2, 4]


def test_pythagoras_is_marked_only_where_needed():
    # steps marked pythagoras fail without it; the others hold with algebra and
    # the angle-addition formulas alone
    for case in CASES:
        for step in case.build().steps:
            if getattr(step, "pythagoras", False):
                assert not replace(step, pythagoras=False).holds, (case.name, step.text)


def test_checking_a_step_never_builds_exp(monkeypatch):
    # "no step leans on sympy's rules for the exponential": record every exp that sympy
    # builds (with the cache cleared) while a residual is computed
    built = []
    original = exp.eval.__func__

    def spy(cls, arg):
        built.append(arg)
        return original(cls, arg)

    monkeypatch.setattr(exp, "eval", classmethod(spy))
    theta = sp.Symbol("theta", real=True)
    m = sp.Symbol("m", integer=True, nonnegative=True)
    clear_cache()
    assert residual(cis(theta) ** m, cis(m * theta)) == 0
    assert built, "the spy must see simplify's detour through exp"
    for case in CASES:
        for proof in (case.build(), case.mutant()):
            for number, step in enumerate(proof.steps, 1):
                built.clear()
                clear_cache()
                _ = step.residual
                assert built == [], (case.name, number)
