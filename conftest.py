"""Repository-wide pytest configuration.

nbval compares a cell's outputs with the committed ones, exactly or within the cell's
stated tolerance (``tests/nbval_tolerance.py``), but not in the cells tagged
``nbval-ignore-output`` (timings, environment printouts). So that a warning cannot slip
in unnoticed there either, every executed notebook cell fails if it wrote to stderr.
Progress bars must therefore write to stdout (pecode's do).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
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


@dataclass(frozen=True)
class BookBuild:
    """One build of the whole book: its exit status, its last output, its HTML folder."""

    returncode: int
    output: str
    html: Path


@pytest.fixture(scope="session")
def book_build(tmp_path_factory) -> BookBuild:
    """The whole book, built once per session as `make book` builds it (-W -n --keep-going).

    Into a fresh folder, so that every page is read again and every warning counts.
    tests/test_book.py checks that it succeeds; tests/test_browser_math.py opens its pages.
    """
    out = tmp_path_factory.mktemp("book")
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    command = str(jupyter_book if jupyter_book.exists() else shutil.which("jupyter-book"))
    root = Path(__file__).resolve().parent
    result = subprocess.run(
        [command, "build", str(root), "-W", "-n", "--keep-going", "--path-output", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    output = result.stdout[-6000:] + result.stderr[-6000:]
    return BookBuild(result.returncode, output, out / "_build" / "html")


@pytest.fixture(scope="session")
def chromium() -> str:
    """Headless Chromium for the browser tests (tests/browser.py), or a skip that says why."""
    from browser import find_chromium

    found = find_chromium()
    if not found:
        pytest.skip(
            "no Chromium on PATH (nor $CHROMIUM): the browser tests need one; "
            "`make browser` installs Debian's chromium when run as root with apt-get"
        )
    return found


@pytest.fixture(scope="session")
def book_html(chromium, request) -> Path:
    """The built book's HTML folder for the browser tests (chromium first: no build only to
    skip): ``_build/html`` when it is newer than every file of the checkout (after
    ``make book``), else the session's :func:`book_build`."""
    from browser import fresh_existing_build

    existing = fresh_existing_build()
    if existing is not None:
        return existing
    build = request.getfixturevalue("book_build")
    # A warning fails tests/test_book.py; with --keep-going the pages are written all the same.
    if not (build.html / "index.html").exists():
        pytest.fail("no built pages (tests/test_book.py shows why)\n" + build.output)
    return build.html


# Where the time goes: seconds per file (setup, call and teardown of its tests or cells),
# printed at the end of every run, notebooks first, so that the suite's time budget can be
# watched as chapters are added.
_SECONDS_PER_FILE: dict[str, float] = {}


def pytest_runtest_logreport(report):
    file = report.nodeid.split("::", 1)[0]
    _SECONDS_PER_FILE[file] = _SECONDS_PER_FILE.get(file, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter):
    if not _SECONDS_PER_FILE:
        return
    notebooks = {f: s for f, s in _SECONDS_PER_FILE.items() if f.endswith(".ipynb")}
    others = {f: s for f, s in _SECONDS_PER_FILE.items() if f not in notebooks}
    terminalreporter.section("seconds per file")
    for title, files in (("notebooks", notebooks), ("slowest test files", others)):
        if not files:
            continue
        terminalreporter.write_line(f"{title} (total {sum(files.values()):.0f} s):")
        ranked = sorted(files.items(), key=lambda item: -item[1])
        for file, seconds in ranked[: len(ranked) if title == "notebooks" else 10]:
            terminalreporter.write_line(f"  {seconds:8.1f} s  {file}")
