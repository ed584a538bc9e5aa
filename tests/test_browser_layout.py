"""The built book as a reader meets it: search finds chapters first, and tables fit.

Both are checked in headless Chromium at 1280 px, offline (``tests/browser.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("sphinx")  # book tests: make test-oldest does not install the book
pytest.importorskip("bs4")

from browser import open_page

# -- search ----------------------------------------------------------------------------------

# Terms that both a chapter and the generated pages of tests/ contain.
QUERIES = ("YaRN", "ALiBi", "sinusoidal")
CHECKS = "book/checks/"  # the generated pages of tests/ (book/_ext/testref.py)
NO_SCORER = "delete Scorer.score;"  # runs before the search starts (on DOMContentLoaded)


def _results(chromium, html, query, profile, inject=None) -> list[str]:
    soup, _ = open_page(chromium, html, f"search.html?q={query}", profile, inject=inject)
    links = [a["href"] for a in soup.select("ul.search li a[href]")]
    assert links, f"no search results for {query!r}: did the search run?"
    return links


def _first_check(links: list[str]) -> int:
    return next(i for i, link in enumerate(links) if link.startswith(CHECKS))


@pytest.mark.book
@pytest.mark.parametrize("query", QUERIES)
def test_search_lists_every_chapter_before_the_test_pages(chromium, book_html, query, tmp_path):
    links = _results(chromium, book_html, query, tmp_path / "profile")
    first = _first_check(links)
    assert first > 0, f"a test page comes first: {links[:5]}"
    assert all(link.startswith(CHECKS) for link in links[first:]), links


@pytest.mark.book
def test_without_the_books_scorer_a_test_page_outranks_a_chapter(chromium, book_html, tmp_path):
    """The check above can fail: Sphinx's own ranking puts test pages among the chapters."""
    links = _results(chromium, book_html, "YaRN", tmp_path / "profile", inject=NO_SCORER)
    first = _first_check(links)
    assert not all(link.startswith(CHECKS) for link in links[first:]), links


# -- tables fit the text column --------------------------------------------------------------

# One page (served from memory) opens every page with a table in a 1280-px-wide frame, waits
# for its math, and measures how far each table sticks out of its box: pydata wraps tables
# in a container that scrolls sideways, so a wider table hides its last columns.
MEASURE_ALL = """<!DOCTYPE html><html><body><script>
async function measure(page) {
  const frame = document.createElement("iframe");
  frame.width = "1280"; frame.height = "2000";
  const loaded = new Promise((resolve) => { frame.onload = resolve; });
  frame.src = page;
  document.body.appendChild(frame);
  await loaded;
  const win = frame.contentWindow, doc = frame.contentDocument;
  if (win.MathJax && win.MathJax.startup) { await win.MathJax.startup.promise; }
  const column = doc.querySelector("article.bd-article");
  const tables = [];
  for (const table of column.querySelectorAll("table")) {
    const box = table.parentElement.clientWidth;
    const over = Math.round(table.getBoundingClientRect().width - box);
    if (over > 1) { tables.push({over: over, box: box, starts: table.innerText.slice(0, 80)}); }
  }
  const width = column.getBoundingClientRect().width;
  frame.remove();
  return {page: page, column: width, tables: tables};
}
window.addEventListener("load", async () => {
  const results = [];
  for (const page of PAGES) { results.push(await measure(page)); }
  document.body.setAttribute("data-measured", JSON.stringify(results));
});
</script></body></html>"""
PAGE = "/measure-tables.html"


def pages_with_tables(html: Path) -> list[str]:
    """Every page of the book's text with a table (the generated test pages aside)."""
    found = []
    for file in sorted(html.glob("*/*.html")):
        page = file.relative_to(html).as_posix()
        if page.startswith(("notebooks/", "book/")) and '<table class="table"' in file.read_text(
            encoding="utf-8"
        ):
            found.append(page)
    return found


def measure_tables(chromium, html: Path, pages: list[str], profile, css_refused=False):
    source = MEASURE_ALL.replace("PAGES", json.dumps(["/" + page for page in pages]))
    soup, _ = open_page(
        chromium,
        html,
        PAGE.lstrip("/"),
        profile,
        refused_prefix="/_static/book.css" if css_refused else None,
        extra={PAGE: source},
    )
    measured = soup.body.get("data-measured")
    assert measured, "the measuring page did not finish"
    return json.loads(measured)


@pytest.mark.book
def test_every_table_fits_the_text_column(chromium, book_html, tmp_path):
    pages = pages_with_tables(book_html)
    assert "book/source_tables.html" in pages, pages
    assert len(pages) > 10, pages
    measured = measure_tables(chromium, book_html, pages, tmp_path / "profile")
    assert [m["page"] for m in measured] == ["/" + page for page in pages]
    assert all(m["column"] > 500 for m in measured), measured  # the wide layout, not the narrow
    assert not [m for m in measured if m["tables"]]


@pytest.mark.book
def test_without_the_books_css_tables_are_too_wide(chromium, book_html, tmp_path):
    """The check above can fail: without book.css, long test names and code do not break."""
    pages = ["book/source_tables.html", "notebooks/09_rope_in_practice.html"]
    measured = measure_tables(chromium, book_html, pages, tmp_path / "profile", css_refused=True)
    assert all(m["tables"] for m in measured), measured
