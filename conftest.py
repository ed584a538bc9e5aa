"""Repository-wide pytest configuration.

nbval compares a cell's outputs with the committed ones, exactly or within the cell's
stated tolerance (``tests/nbval_tolerance.py``), but not in the cells tagged
``nbval-ignore-output`` (timings, environment printouts). So that a warning cannot slip
in unnoticed there either, every executed notebook cell fails if it wrote to stderr.
Progress bars must therefore write to stdout (pecode's do).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from filelock import FileLock
from hypothesis import HealthCheck, settings

from pecode.experiments.trained_cache import CACHE_VARIABLE

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


# `make test` spreads the files over the cores (pytest-xdist, --dist loadfile), handing
# them out in collection order (--no-loadscope-reorder). The longest go first, so that
# no core is left alone with one of them at the end; the rest keep their order.
LONGEST_FIRST = (
    "notebooks/13_real_text.ipynb",
    "notebooks/12_train_short_test_long.ipynb",
    "notebooks/11_costs.ipynb",
    "tests/test_book.py",
)


def pytest_collection_modifyitems(items):
    def rank(item) -> int:
        file = item.nodeid.split("::", 1)[0]
        return LONGEST_FIRST.index(file) if file in LONGEST_FIRST else len(LONGEST_FIRST)

    items.sort(key=rank)  # stable


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item):
    outcome = yield
    test_outputs = getattr(item, "test_outputs", None)  # set by nbval's IPyNbCell
    if outcome.excinfo is None and test_outputs is not None:
        stderr = _stderr_of(test_outputs)
        if stderr:
            raise AssertionError(f"notebook cell wrote to stderr:\n{stderr}")


@pytest.fixture(autouse=True)
def _train_for_real(monkeypatch):
    """Unit tests always train: a model from the opt-in cache of CI's notebook runs
    (pecode/experiments/trained_cache.py) would make a test that trains twice and
    compares vacuous. The notebooks' kernels, started by nbval, still see the variable."""
    monkeypatch.delenv(CACHE_VARIABLE, raising=False)


@dataclass(frozen=True)
class BookBuild:
    """One build of the whole book: its exit status, its last output, its HTML folder."""

    returncode: int
    output: str
    html: Path


def _build_book(out: Path) -> dict:
    """Run `jupyter-book build` as `make book` does, into ``out``; its status and output."""
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    command = str(jupyter_book if jupyter_book.exists() else shutil.which("jupyter-book"))
    root = Path(__file__).resolve().parent
    result = subprocess.run(
        [command, "build", str(root), "-W", "-n", "--keep-going", "--path-output", str(out)],
        capture_output=True,
        text=True,
        check=False,
    )
    return {
        "returncode": result.returncode,
        "output": result.stdout[-6000:] + result.stderr[-6000:],
    }


@pytest.fixture(scope="session")
def book_build(tmp_path_factory) -> BookBuild:
    """The whole book, built once per run as `make book` builds it (-W -n --keep-going).

    Into a fresh folder, so that every page is read again and every warning counts.
    tests/test_book.py checks that it succeeds; tests/test_browser_math.py opens its pages.
    Under pytest-xdist (`make test`) the workers share one build: the first to need it
    builds it under a lock, the others wait and read its record.
    """
    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's folder, above every worker's own
    out, record = base / "book", base / "book-build.json"
    with FileLock(base / "book-build.lock"):
        if not record.exists():
            record.write_text(json.dumps(_build_book(out)))
        built = json.loads(record.read_text())
    return BookBuild(built["returncode"], built["output"], out / "_build" / "html")


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
