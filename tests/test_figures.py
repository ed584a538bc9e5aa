"""The book's figures are numbered, referenceable and described.

Each plotting cell of a chapter carries myst-nb figure metadata (a caption and a name
``fig-chNN-...``) and alt text; the prose refers to a figure with ``{numref}``, never by
a hand-written number that a new figure would make wrong. The built pages show what
Sphinx numbered: "Figure 9.1" for the first figure of chapter 9.
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest
from chapters import CHAPTER_NUMBERS

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
HAND_NUMBER = re.compile(r"\bFigures? \d+b?\.\d+")


def chapter_of(path: Path) -> str:
    return path.name.split("_", 1)[0]  # "09", "09b"


def plotting_cells(path: Path):
    nb = nbformat.read(path, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and any(
            "image/png" in o.get("data", {}) or "image/svg+xml" in o.get("data", {})
            for o in cell.outputs
        ):
            yield cell


def is_solution(cell) -> bool:
    return cell.source.startswith("# Solution to exercise")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_figure_has_a_caption_a_name_and_alt_text(path):
    for cell in plotting_cells(path):
        meta = cell.metadata.get("mystnb", {})
        alt = meta.get("image", {}).get("alt", "")
        assert len(alt) >= 40, f"{path.name}: a figure without real alt text: {cell.source[:60]!r}"
        assert not re.search(r"\.(png|svg)\b", alt), alt
        assert "$" not in alt, f"alt text is read aloud, not typeset: {alt!r}"
        if is_solution(cell):  # a solution's figure is not numbered
            continue
        figure = meta.get("figure", {})
        assert figure.get("caption"), f"{path.name}: a figure without a caption"
        assert figure.get("name", "").startswith(f"fig-ch{chapter_of(path)}-"), figure


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_prose_refers_to_figures_by_numref(path):
    nb = nbformat.read(path, as_version=4)
    texts = [cell.source for cell in nb.cells if cell.cell_type == "markdown"]
    texts += [
        cell.metadata.get("mystnb", {}).get("figure", {}).get("caption", "") for cell in nb.cells
    ]
    for text in texts:
        assert not HAND_NUMBER.search(text), f"{path.name}: {HAND_NUMBER.search(text)[0]}"
        assert not text.startswith("*Figure"), f"{path.name}: a hand-made caption"


def test_figure_names_are_unique_and_every_reference_resolves():
    names = [
        cell.metadata["mystnb"]["figure"]["name"]
        for path in NOTEBOOKS
        for cell in plotting_cells(path)
        if "figure" in cell.metadata.get("mystnb", {})
    ]
    assert len(names) == len(set(names)) > 20
    sources = [p.read_text(encoding="utf-8") for p in NOTEBOOKS]
    sources += [p.read_text(encoding="utf-8") for p in (ROOT / "book").glob("*.md")]
    referenced = {
        name for text in sources for name in re.findall(r"\{numref\}`(fig-[\w-]+)`", text)
    }
    assert referenced, "no figure is referenced"
    assert referenced <= set(names), referenced - set(names)


@pytest.mark.book
def test_built_figures_are_numbered_by_chapter(book_build):
    """What a reader sees: "Figure 9.1" under chapter 9's first figure, in order, and a
    chapter's pages numbering on from it."""
    bs4 = pytest.importorskip("bs4")
    assert book_build.returncode == 0, book_build.output
    shown: dict[int, int] = {}  # figures numbered so far in each chapter
    for path in NOTEBOOKS:  # in the book's order: a chapter, then its pages (10, 10b)
        html = book_build.html / "notebooks" / f"{path.stem}.html"
        soup = bs4.BeautifulSoup(html.read_text(encoding="utf-8"), "html.parser")
        numbers = [span.get_text(strip=True) for span in soup.select("figure span.caption-number")]
        chapter = CHAPTER_NUMBERS[path.stem]  # 09c is chapter 10
        # a chapter's pages (10b is page 11.1) continue its numbering
        first = shown.get(chapter, 0) + 1
        expected = [f"Figure {chapter}.{k}" for k in range(first, first + len(numbers))]
        assert numbers == expected, path.name
        shown[chapter] = first - 1 + len(numbers)
        for img in soup.select("article img"):
            assert not img.get("alt", "").startswith("../_images"), (path.name, img.get("src"))


RETINA = '%config InlineBackend.figure_formats = ["retina"]'
DRAWN = re.compile(r"<Figure size (\d+)x(\d+)")
FIGSIZE = re.compile(r"figsize=\(\s*([\d.]+)\s*,\s*([\d.]+)\s*\)")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_figures_are_sharp_and_no_wider_than_the_column_allows(path):
    """Twice the pixels (a sharp figure on a high-density screen), and at most 8.5 inches
    wide: the column is about 8.7 inches at 1280 px, and a wider figure would be shrunk
    to it, its 10-point labels with it."""
    nb = nbformat.read(path, as_version=4)
    code = [cell.source for cell in nb.cells if cell.cell_type == "code"]
    if any(True for _ in plotting_cells(path)):
        assert RETINA in code[0], f"{path.name}: the first code cell should set {RETINA}"
    for source in code:
        for width, _ in FIGSIZE.findall(source):
            assert float(width) <= 8.5, f"{path.name}: a figure {width} inches wide"
    # what was drawn, sizes computed at run time included: "<Figure size 900x340 ...>" in
    # pixels at matplotlib's 100 dpi
    for cell in plotting_cells(path):
        for output in cell.outputs:
            for width, _ in DRAWN.findall(output.get("data", {}).get("text/plain", "")):
                assert int(width) <= 850, f"{path.name}: a figure drawn {width} px wide"
