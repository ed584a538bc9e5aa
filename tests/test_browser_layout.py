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


# -- tables and code fit the text column ------------------------------------------------------

# One page (served from memory) opens every page of the book's text in a 1280-px-wide frame,
# waits for its math, opens every collapsed block (hidden cells, solutions, full sources),
# and measures how far each table and each code or output block sticks out of its box:
# pydata wraps tables in a container that scrolls sideways, and a <pre> scrolls too, so a
# wider one hides its end.
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
  for (const details of doc.querySelectorAll("details")) { details.open = true; }
  for (const hidden of doc.querySelectorAll(".toggle-hidden, .toggle-details__container")) {
    hidden.classList.remove("toggle-hidden");
  }
  const column = doc.querySelector("article.bd-article");
  const tables = [], pres = [];
  for (const table of column.querySelectorAll("table")) {
    const box = table.parentElement.clientWidth;
    const over = Math.round(table.getBoundingClientRect().width - box);
    if (over > 1) { tables.push({over: over, box: box, starts: table.innerText.slice(0, 80)}); }
  }
  let shown = 0;
  for (const pre of column.querySelectorAll("pre")) {
    if (pre.clientWidth === 0) { continue; }  // still not displayed
    shown += 1;
    const over = pre.scrollWidth - pre.clientWidth;
    if (over > 1) {
      pres.push({over: over, box: pre.clientWidth, starts: pre.innerText.slice(0, 80)});
    }
  }
  // printed output wraps (book.css): its lines as printed, unwrapped, must fit too
  const outputs = [];
  for (const pre of column.querySelectorAll("div.cell_output div.output.stream pre")) {
    pre.style.whiteSpace = "pre";
    const over = pre.scrollWidth - pre.clientWidth;
    pre.style.whiteSpace = "";
    if (over > 1) { outputs.push({over: over, starts: pre.innerText.slice(0, 40)}); }
  }
  const width = column.getBoundingClientRect().width;
  const all = column.querySelectorAll("pre").length;
  frame.remove();
  return {page: page, column: width, tables: tables, pres: pres, outputs: outputs, shown: shown,
          all: all};
}
window.addEventListener("load", async () => {
  const results = [];
  for (const page of PAGES) { results.push(await measure(page)); }
  document.body.setAttribute("data-measured", JSON.stringify(results));
});
</script></body></html>"""
PAGE = "/measure-layout.html"


def text_pages(html: Path) -> list[str]:
    """Every page of the book's text: chapters, verdicts, source tables (not the test pages)."""
    found = []
    for file in sorted(html.glob("*/*.html")):
        page = file.relative_to(html).as_posix()
        if page.startswith(("notebooks/", "book/")) and not page.startswith("book/checks/"):
            found.append(page)
    return found


def measure_layout(chromium, html: Path, pages: list[str], profile, css_refused=False):
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


@pytest.fixture(scope="module")
def measured(chromium, book_html, tmp_path_factory):
    pages = text_pages(book_html)
    results = measure_layout(chromium, book_html, pages, tmp_path_factory.mktemp("profile"))
    assert [m["page"] for m in results] == ["/" + page for page in pages]
    return results


@pytest.mark.book
def test_every_table_fits_the_text_column(measured):
    pages = [m["page"] for m in measured]
    assert "/book/source_tables.html" in pages, pages
    assert "/book/which_encoding.html" in pages, pages
    assert all(m["column"] > 500 for m in measured), measured  # the wide layout, not the narrow
    assert not [m for m in measured if m["tables"]]


@pytest.mark.book
def test_every_code_and_output_block_fits_the_text_column(measured):
    """Listings (up to 100 columns), notebook code (80) and printed output, all opened."""
    assert sum(m["shown"] for m in measured) > 500
    assert all(m["shown"] == m["all"] for m in measured), "a block stayed collapsed"
    wide = [(m["page"], pre) for m in measured for pre in m["pres"]]
    assert not wide, "\n".join(f"{page}: {pre}" for page, pre in wide)


# Printed outputs whose lines are longer than the column holds: book.css wraps them, which
# reads well for prose and dicts of checks but breaks a column-aligned table. Each is
# listed with its page and how it starts; a new one fails the test below. Chapter 12's
# benchmark tables become figures and rendered tables when chapter 12 is re-run.
WIDE_OUTPUTS_ALLOWED = {
    # column-aligned tables, which wrap badly: to become pecode.Table or figures
    ("11_costs", "                                   media"),
    ("11_costs", "float32  half        L = 32768:"),
    # prose lines, dicts of checks and configurations: wrapping reads well
    ("01_why_positions", "learned:"),
    ("02_sinusoidal", "d = 64: longest wavelength"),
    ("03_learned_positions", "at initialization, 512 -> 1024"),
    ("03_learned_positions", "plain loss: rows more than ten times"),
    ("04_four_terms_and_shaw", "{'naive peak holds one"),
    ("05_xl_t5_deberta", "{'logits (a)+(b)+(c)+(d)'"),
    ("05_xl_t5_deberta", "{'released: c2c + c2p + p2c'"),
    ("05_xl_t5_deberta", "pad-and-reshape: right at and below"),
    ("06_alibi", "weight on itself, 4096 keys:"),
    ("06_alibi", "log2 m for 24 heads:"),
    ("09_rope_in_practice", "{'half, causal=False'"),
    ("09b_pecode_in_hf_models", "scaling: llama3 {'factor'"),
    ("10_long_context", "{'kind': 'llama3'"),
    ("10_long_context", "straight lines (second difference"),
    ("11_costs", "every method within 1e-5 of the float64 "),
    ("11_costs", "q,k [1, 32, 2048, 128] float32, 32 MiB e"),
    ("12_train_short_test_long", "ExperimentConfig(train_length=256"),
    ("12_train_short_test_long", "learned table at 2L: position 511"),
    ("13_real_text", "TextConfig(train_length=256"),
}


@pytest.mark.book
def test_printed_output_wider_than_the_column_is_known(measured):
    """Wrapping hides a wide output from the check above; this one sees it unwrapped."""
    wide = {
        (m["page"].rsplit("/", 1)[-1].removesuffix(".html"), out["starts"])
        for m in measured
        for out in m["outputs"]
    }
    known = {
        (page, starts)
        for page, starts in wide
        if any(page == p and starts.startswith(s) for p, s in WIDE_OUTPUTS_ALLOWED)
    }
    assert wide == known, "\n".join(sorted(f"{p}: {s!r}" for p, s in wide - known))


@pytest.mark.book
def test_without_the_books_css_tables_and_code_are_too_wide(chromium, book_html, tmp_path):
    """The checks above can fail: without book.css, long test names, code and output do not fit."""
    pages = ["book/source_tables.html", "notebooks/09_rope_in_practice.html"]
    measured = measure_layout(chromium, book_html, pages, tmp_path / "profile", css_refused=True)
    assert all(m["tables"] for m in measured), measured
    assert measured[1]["pres"], measured
