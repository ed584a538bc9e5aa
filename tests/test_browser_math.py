"""Math renders offline: built pages in headless Chromium, with no network but 127.0.0.1.

The book serves MathJax itself (``book/_ext/mathjax_offline.py`` vendors it at build time
from a pinned, hash-checked npm tarball). Here a local HTTP server on 127.0.0.1 serves the
built HTML and logs every request; Chromium can reach nothing else (a dead proxy, and a
host resolver that maps every other name to nothing, so a CDN cannot be reached). After
MathJax has run (``--virtual-time-budget``), ``--dump-dom`` gives the typeset DOM, and the
tests check that every formula became MathJax's CommonHTML output (``mjx-container``),
the proofs' rendered outputs on chapter 8 included, with no raw TeX left.

That check can fail: the same page with the server refusing ``_static/mathjax/`` (as if the
vendored copy were removed) keeps its raw TeX, and a test says so. Where no Chromium is
installed (``make browser`` installs Debian's, as root), the browser tests skip, saying why.

The book is the session's build (``book_build`` in ``conftest.py``, shared with
``tests/test_book.py``), or ``_build/html`` when it is newer than every file of the
checkout (after ``make book``), which saves building it again.
"""

from __future__ import annotations

import re
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

# Book tests: they need the book's packages, which make test-oldest does not install.
pytest.importorskip("sphinx")
bs4 = pytest.importorskip("bs4")  # pinned in requirements.txt (the book theme needs it)
from sphinx.errors import ExtensionError  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import mathjax_offline  # noqa: E402  (the extension under test, from book/_ext)
from browser import open_page  # noqa: E402

CHAPTER_8 = "notebooks/08_rope_derived.html"  # sympy proofs rendered as Markdown outputs
PAGES = [CHAPTER_8, "notebooks/07_complex_numbers.html", "book/errata.html"]
MATHJAX_DIR = f"/_static/{mathjax_offline.STATIC_NAME}/"
MATHJAX_ENTRY = MATHJAX_DIR + mathjax_offline.ENTRY
RAW_TEX = ("\\(", "\\)", "\\[", "\\]", "$$", "\\begin{")


# -- the vendoring itself: no browser, no network ------------------------------------------


class _FakeResponse:
    def __init__(self, body: bytes):
        self.body = body

    def read(self) -> bytes:
        return self.body

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def test_vendoring_fails_clearly_when_the_download_fails(tmp_path, monkeypatch):
    def offline(url, timeout):
        raise urllib.error.URLError("network is unreachable")

    monkeypatch.setattr(urllib.request, "urlopen", offline)
    with pytest.raises(ExtensionError, match="could not download MathJax") as error:
        mathjax_offline.ensure_mathjax(tmp_path)
    message = str(error.value)
    assert mathjax_offline.MATHJAX_URL in message  # what it tried
    assert str(tmp_path / "_vendor" / f"mathjax-{mathjax_offline.MATHJAX_VERSION}.tgz") in message
    assert not list((tmp_path / "_vendor").iterdir())  # no partial file left behind


def test_vendoring_rejects_a_tarball_with_another_hash(tmp_path, monkeypatch):
    monkeypatch.setattr(
        urllib.request, "urlopen", lambda url, timeout: _FakeResponse(b"not mathjax")
    )
    with pytest.raises(ExtensionError, match="not the pinned sha512-") as error:
        mathjax_offline.ensure_mathjax(tmp_path)
    assert mathjax_offline.MATHJAX_URL in str(error.value)
    assert not list((tmp_path / "_vendor").iterdir())  # nothing extracted, nothing kept


# -- the built book in a browser -----------------------------------------------------------


def _open(chromium, html: Path, page: str, tmp_path, refused_prefix=None):
    return open_page(chromium, html, page, tmp_path / "profile", refused_prefix)


def _proof_outputs(soup) -> list:
    """Cell outputs holding math: chapter 8's proofs, printed as Markdown by pecode.proofs."""
    return [out for out in soup.select("div.cell_output") if out.select(".math")]


def _raw_tex(text: str) -> list[str]:
    return [delimiter for delimiter in RAW_TEX if delimiter in text]


@pytest.mark.book
@pytest.mark.parametrize("page", PAGES)
def test_math_is_typeset_offline(chromium, book_html, page, tmp_path):
    source = (book_html / page).read_text(encoding="utf-8")
    assert "cdn.jsdelivr.net" not in source
    scripts = re.findall(r'<script[^>]*src="([^"]*tex-mml-chtml\.js[^"]*)"', source)
    assert len(scripts) == 1, scripts
    assert "://" not in scripts[0], scripts  # served by the book, not a CDN

    soup, requests = _open(chromium, book_html, page, tmp_path)

    # (Chromium asks every site for /favicon.ico; the book has none)
    failed = [(path, code) for path, code in requests if code >= 400 and path != "/favicon.ico"]
    assert not failed, f"requests the vendored book could not answer: {failed}"
    fetched = {path for path, _ in requests}
    assert MATHJAX_ENTRY in fetched
    assert any(path.endswith(".woff") for path in fetched), "no MathJax font was loaded"

    math = soup.select(".math")
    assert len(math) > 10, "the page has no math to check: wrong page?"
    untypeset = [element.get_text()[:80] for element in math if not element.find("mjx-container")]
    assert not untypeset, f"{len(untypeset)} of {len(math)} formulas not typeset: {untypeset[:5]}"
    raw = [(element.get_text()[:80], _raw_tex(element.get_text())) for element in math]
    assert not [entry for entry in raw if entry[1]]
    errors = [error.get("data-mjx-error") for error in soup.find_all("mjx-merror")]
    assert not errors, f"TeX errors: {errors}"

    if page == CHAPTER_8:
        proofs = _proof_outputs(soup)
        assert len(proofs) >= 5, len(proofs)
        for proof in proofs:
            assert proof.find("mjx-container"), proof.get_text()[:200]
            assert not _raw_tex(proof.get_text()), proof.get_text()[:200]


@pytest.mark.book
def test_without_the_vendored_mathjax_the_math_stays_raw_tex(chromium, book_html, tmp_path):
    """The check above can fail: the server refuses _static/mathjax/ and no CDN is reachable."""
    soup, requests = _open(chromium, book_html, CHAPTER_8, tmp_path, refused_prefix=MATHJAX_DIR)

    assert (MATHJAX_ENTRY, 404) in requests  # the page did ask for the vendored MathJax
    assert not soup.find("mjx-container")
    proofs = _proof_outputs(soup)
    assert proofs
    assert all("\\(" in proof.get_text() for proof in proofs)
