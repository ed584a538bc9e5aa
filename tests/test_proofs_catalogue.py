"""Every proof in pecode.proofs can fail: no step is a restatement in disguise, and each
proof's false neighbour fails at the step its case names."""

from __future__ import annotations

import importlib
import inspect

import pytest

from pecode.proofs import MODULES, Proof, catalogue

CASES = catalogue()


def proof_functions() -> list[str]:
    """``module.function`` for every public function of a proof module that returns a Proof."""
    names = []
    for module_name in MODULES:
        module = importlib.import_module(f"pecode.proofs.{module_name}")
        for name, function in vars(module).items():
            if (
                inspect.isfunction(function)
                and function.__module__ == module.__name__
                and not name.startswith("_")
                and inspect.signature(function).return_annotation in ("Proof", Proof)
            ):
                names.append(f"{module_name}.{name}")
    return names


@pytest.mark.parametrize("name", proof_functions())
def test_every_proof_function_is_in_the_catalogue(name):
    assert any(case.name == name or case.name.startswith(f"{name}(") for case in CASES.values())


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_the_proof_holds_and_every_step_could_fail(case):
    proof = case.build()
    assert proof.holds(), f"fails at {proof.failing_steps()}"
    assert proof.unmarked_restatements() == [], "sides equal as built: mark by_definition"
    assert proof.derived_steps(), "a proof of definitions alone proves nothing"


@pytest.mark.parametrize("case", CASES.values(), ids=list(CASES))
def test_the_false_neighbour_fails_at_the_named_step(case):
    assert case.fails_at, "name the steps at which the false neighbour fails"
    assert case.mutant().failing_steps() == list(case.fails_at)
