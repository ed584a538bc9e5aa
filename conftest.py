"""Repository-wide pytest configuration.

nbval compares a cell's outputs with the committed ones, exactly or within the cell's
stated tolerance (``tests/nbval_tolerance.py``), but not in cells marked
``# NBVAL_IGNORE_OUTPUT`` (timings, progress bars). So that a warning cannot slip in
unnoticed there either, every executed notebook cell fails if it wrote to stderr.
Progress bars must therefore write to stdout (pecode's do).
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

sys.path.insert(0, str(Path(__file__).parent / "tests"))  # the test helpers, as tests import them
pytest_plugins = ["pytester"]  # for tests/test_nbval_tolerance.py
if importlib.util.find_spec("nbval"):  # absent where only pecode's unit tests run (test-oldest)
    pytest_plugins.append("nbval_tolerance")

# Property tests: reproducible in CI, exploratory on a developer's machine.
settings.register_profile(
    "ci", derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile("dev", deadline=None)
settings.load_profile("ci" if os.environ.get("CI") else "dev")


def _stderr_of(outputs) -> str:
    return "".join(
        output.get("text", "")
        for output in outputs or []
        if output.get("output_type") == "stream" and output.get("name") == "stderr"
    )


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    outcome = yield
    test_outputs = getattr(item, "test_outputs", None)  # set by nbval's IPyNbCell
    if outcome.excinfo is None and test_outputs is not None:
        stderr = _stderr_of(test_outputs)
        if stderr:
            raise AssertionError(f"notebook cell wrote to stderr:\n{stderr}")
