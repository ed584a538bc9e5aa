"""The ``{test}`` role and the pages of tests (``book/_ext/testref.py``), on a tiny book.

The generator must give every test a labelled section showing its source (decorators and
parametrize lists included) and the module code it uses, and every line of the file once;
the role must link inside the book (an internal link to that section, usable offline), and
the build must warn when a cited test does not exist. A small Sphinx project with MyST,
built in a subprocess with ``-W -n``, checks the rendered HTML.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

# Book tests: they need the book's packages, which make test-oldest does not install.
pytest.importorskip("sphinx")
pytest.importorskip("myst_parser")

ROOT = Path(__file__).resolve().parents[1]
EXT = ROOT / "book" / "_ext"


def _load_testref():
    spec = importlib.util.spec_from_file_location("testref", EXT / "testref.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


testref = _load_testref()

TEST_FILE = '''\
"""Checks of the ``widget``: a tiny test file."""

import pytest

from helpers_x import shared

SIZES = [1, 2, 3]


def _double(x):
    return 2 * x


@pytest.mark.parametrize("n", SIZES)
def test_double(n):
    assert _double(n) == n + n


def test_shared():
    assert shared() == 1


class TestGroup:
    def _three(self):
        return 3

    # a comment that belongs to the method below
    def test_method(self):
        assert self._three() == 3
'''

HELPER_FILE = '''\
"""A helper module the tests import."""


def shared():
    return 1
'''


def _project(tmp_path: Path, cite: str) -> Path:
    src = tmp_path / "src"
    (src / "tests").mkdir(parents=True)
    (src / "tests" / "test_x.py").write_text(TEST_FILE)
    (src / "tests" / "helpers_x.py").write_text(HELPER_FILE)
    (src / "conf.py").write_text(
        textwrap.dedent(f"""\
        import sys
        sys.path.insert(0, {str(EXT)!r})
        extensions = ["myst_parser", "testref"]
        exclude_patterns = ["_build", "tests"]
        testref_pages_dir = "checks"
        testref_repository_url = "https://github.com/owner/repo"
        """)
    )
    (src / "index.md").write_text(
        textwrap.dedent("""\
        # Book

        ```{toctree}
        :glob:
        verdicts
        checks/tests/*
        checks/helpers/*
        ```
        """)
    )
    (src / "verdicts.md").write_text(f"# Verdicts\n\nDecided by {cite}.\n")
    return src


def _build(src: Path) -> subprocess.CompletedProcess:
    out = src.parent / "html"
    options = ["-W", "-n", "--keep-going", "-q", "-b", "html"]
    return subprocess.run(
        [sys.executable, "-m", "sphinx", *options, str(src), str(out)],
        capture_output=True,
        text=True,
        check=False,
    )


def test_pages_give_each_test_a_label_and_every_line_once(tmp_path):
    src = _project(tmp_path, "nothing")
    pages = testref.write_pages(src, src / "checks")
    assert sorted(p.relative_to(src / "checks").as_posix() for p in pages) == [
        "helpers/helpers_x.md",
        "tests/test_x.md",
    ]
    page = (src / "checks" / "tests" / "test_x.md").read_text()
    for test in ("test_double", "test_shared", "TestGroup::test_method"):
        assert f"(tests/test_x.py::{test.lower()})=\n### `{test}`" in page
    info = testref.analyse(src, "tests/test_x.py")
    assert [s.key for s in info.tests] == ["test_double", "test_shared", "TestGroup::test_method"]
    shown = sorted(n for s in info.segments for n in range(s.start, s.end + 1))
    nonblank = [n for n, line in enumerate(info.lines, 1) if line.strip()]
    assert set(nonblank) <= set(shown)
    assert len(shown) == len(set(shown)), "a line is shown twice"
    double = info.segment("test_double")
    assert info.lines[double.start - 1].startswith("@pytest.mark.parametrize")
    uses, _ = info.closure(double)
    assert uses == ["tests/test_x.py::sizes", "tests/test_x.py::_double"]
    assert info.closure(info.segment("test_shared"))[0] == ["tests/helpers_x.py::shared"]
    method = info.segment("TestGroup::test_method")
    assert info.closure(method)[0] == ["tests/test_x.py::testgroup::_three"]
    assert "# a comment that belongs" in info.lines[method.start - 1]


def test_pages_follow_the_test_files(tmp_path):
    src = _project(tmp_path, "nothing")
    testref.write_pages(src, src / "checks")
    (src / "tests" / "test_x.py").write_text(TEST_FILE.replace("test_shared", "test_renamed"))
    (src / "tests" / "helpers_x.py").unlink()
    testref.write_pages(src, src / "checks")
    page = (src / "checks" / "tests" / "test_x.md").read_text()
    assert "test_renamed" in page
    assert "test_shared" not in page
    assert not (src / "checks" / "helpers" / "helpers_x.md").exists()


@pytest.mark.parametrize(
    ("test_id", "why"),
    [
        ("tests/test_x.py::test_missing", "defines no test"),
        ("tests/test_x.py::_double", "a helper, not a test"),
        ("tests/test_y.py::test_double", "no such test file"),
        ("tests/test_x.py", "not a test id"),
    ],
)
def test_locate_test_rejects_what_is_not_a_test(tmp_path, test_id, why):
    src = _project(tmp_path, "nothing")
    with pytest.raises(ValueError, match=why):
        testref.locate_test(src, test_id)


def test_the_role_links_inside_the_book_to_the_test_source(tmp_path):
    src = _project(
        tmp_path,
        "{test}`tests/test_x.py::test_double[2]` and {test}`a method "
        "<tests/test_x.py::TestGroup::test_method>`",
    )
    result = _build(src)
    assert result.returncode == 0, result.stdout + result.stderr
    html = tmp_path / "html"
    verdicts = (html / "verdicts.html").read_text()
    links = re.findall(r'<a class="reference internal" href="([^"]+)"[^>]*>(.*?)</a>', verdicts)
    targets = {href: text for href, text in links if "checks/" in href and "#" in href}
    assert len(targets) == 2, links
    assert "github.com" not in verdicts, "the role must not link outside the book"
    for href, text in targets.items():
        assert "<code" in text, "the id stays shown as code"
        page, anchor = href.split("#")
        assert page == "checks/tests/test_x.html"
        source = (html / page).read_text()
        assert f'id="{anchor}"' in source, href
    page = (html / "checks" / "tests" / "test_x.html").read_text()
    section = page.split('id="tests-test-x-py-test-double"', 1)[1].split("</section>", 1)[0]
    text = re.sub(r"<[^>]+>", "", section)
    assert "@pytest.mark.parametrize" in text
    assert "assert _double(n) == n + n" in text
    assert "https://github.com/owner/repo/blob/main/tests/test_x.py#L14-L16" in section
    # its helpers are linked inside the page
    assert re.search(r'href="#tests-test-x-py-double"', section), section
    helper = (html / "checks" / "helpers" / "helpers_x.html").read_text()
    assert "def shared" in re.sub(r"<[^>]+>", "", helper)


def test_the_build_fails_when_a_cited_test_does_not_exist(tmp_path):
    src = _project(tmp_path, "{test}`tests/test_x.py::test_gone`")
    result = _build(src)
    assert result.returncode != 0
    assert "tests/test_x.py defines no test 'test_gone'" in result.stderr


def test_an_incremental_build_notices_a_cited_test_that_went_away(tmp_path):
    """The citing page depends on the test file: renaming the test fails the next build,
    even one that reuses the previous build's environment."""
    src = _project(tmp_path, "{test}`tests/test_x.py::test_shared`")
    first = _build(src)
    assert first.returncode == 0, first.stdout + first.stderr
    test_file = src / "tests" / "test_x.py"
    test_file.write_text(TEST_FILE.replace("def test_shared", "def test_renamed"))
    second = _build(src)
    assert second.returncode != 0
    assert "tests/test_x.py defines no test 'test_shared'" in second.stderr
