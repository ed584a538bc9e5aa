"""Every verdict the book states links to evidence that exists.

The errata, the scorecard and the redone comparison tables are the pages a reader comes
for; each of their claims must point at a notebook cell label (``{ref}``), a proof or
definition (``{prf:ref}``) or a test (``{test}``). This module checks that every errata
entry has a reproduction link, that every scorecard cell and every comparison-table row
carries a link, and that every link resolves: labels must be defined in a notebook or a
page, tests must be defined in ``tests/``, and every cited test must have its section, with
its source, on the book's page of its file (``book/_ext/testref.py`` writes those pages at
build time; the role links there, inside the book).
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from pathlib import Path

import pytest
from markdown_tables import table_rows

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"

# Pages whose tables are scored cell by cell (every cell after the first column needs a
# link), and pages whose tables are checked row by row (every row needs a link).
CELL_PAGES = ["scorecard.md"]
ROW_PAGES = ["source_tables.md"]
LINKED_PAGES = ["errata.md", *CELL_PAGES, *ROW_PAGES, "which_encoding.md"]

LINK = re.compile(r"\{(ref|prf:ref|test|numref|doc)\}`([^`]+)`")
EVIDENCE_ROLES = {"ref", "prf:ref", "test", "numref"}
# Errata about a bibliographic fact (a paper's title) are decided by the cited paper.
CITATION_ONLY = {"errata-001-paper-title"}


def _load_testref():
    spec = importlib.util.spec_from_file_location("testref", BOOK / "_ext" / "testref.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


testref = _load_testref()
locate_test = testref.locate_test


def _markdown_sources() -> dict[str, str]:
    """Text of every markdown page and every notebook's markdown cells and captions."""
    texts = {str(p.relative_to(ROOT)): p.read_text(encoding="utf-8") for p in BOOK.glob("*.md")}
    for nb in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(nb.read_text(encoding="utf-8"))["cells"]
        texts[str(nb.relative_to(ROOT))] = "\n\n".join(
            "".join(c["source"]) for c in cells if c["cell_type"] == "markdown"
        ) + "".join(f"\n\n{figure['caption']}" for figure in _figures(cells))
    return texts


def _figures(cells: list[dict]) -> list[dict]:
    """The myst-nb figure metadata of a notebook's plotting cells (a caption and a name)."""
    return [
        c["metadata"]["mystnb"]["figure"]
        for c in cells
        if "figure" in c["metadata"].get("mystnb", {})
    ]


SOURCES = _markdown_sources()
TARGETS = {m for text in SOURCES.values() for m in re.findall(r"(?m)^\(([\w-]+)\)=\s*$", text)}
TARGETS |= {m for text in SOURCES.values() for m in re.findall(r"(?m)^:label:\s*(\S+)", text)}
TARGETS |= {
    figure["name"]
    for nb in (ROOT / "notebooks").glob("*.ipynb")
    for figure in _figures(json.loads(nb.read_text(encoding="utf-8"))["cells"])
}
DOCS = {str(Path(path).with_suffix("")) for path in SOURCES}


def _target(text: str) -> str:
    """The target of a role's text: ``title <target>`` or ``target``."""
    match = re.search(r"<([^>]+)>\s*$", text)
    return (match[1] if match else text).strip()


def _broken(role: str, text: str, page: str) -> str | None:
    target = _target(text)
    if role == "test":
        try:
            locate_test(ROOT, target)
        except ValueError as error:
            return str(error)
        return None
    if role == "doc":
        resolved = (
            (BOOK / page).parent / target if not target.startswith("/") else ROOT / target[1:]
        )
        resolved = resolved.resolve().relative_to(ROOT)
        return None if str(resolved) in DOCS else f"no page {target}"
    return None if target in TARGETS else f"no label {target}"


def _read(page: str) -> str:
    return (BOOK / page).read_text(encoding="utf-8")


def _has_evidence(text: str) -> bool:
    return any(role in EVIDENCE_ROLES for role, _ in LINK.findall(text))


@pytest.mark.parametrize("page", LINKED_PAGES)
def test_every_link_on_the_page_resolves(page):
    text = _read(page)
    links = LINK.findall(text)
    assert links, f"{page} links to no evidence"
    broken = [
        f"{{{role}}}`{text}`: {why}" for role, text in links if (why := _broken(role, text, page))
    ]
    assert not broken, f"{page}: broken links:\n" + "\n".join(broken)


def _errata_entries() -> list[tuple[str, str]]:
    text = (BOOK / "errata.md").read_text(encoding="utf-8")
    parts = re.split(r"(?m)^\((errata-[\w-]+)\)=\s*$", text)
    return list(zip(parts[1::2], parts[2::2], strict=True))


def test_errata_has_entries_with_unique_labels():
    labels = [label for label, _ in _errata_entries()]
    assert len(labels) >= 50
    assert len(labels) == len(set(labels))


@pytest.mark.parametrize(
    ("label", "entry"), _errata_entries(), ids=[label for label, _ in _errata_entries()]
)
def test_errata_entry_has_the_fields_and_a_reproduction_link(label, entry):
    for field in ("Source", "Says", "Verdict", "Reproduction"):
        assert f"- **{field}**:" in entry, f"{label} lacks the field {field}"
    verdict = entry.split("- **Verdict**:", 1)[1].strip()
    assert re.match(r"(wrong|imprecise)\b", verdict), f"{label}: verdict {verdict[:30]!r}"
    reproduction = entry.split("- **Reproduction**:", 1)[1]
    if label in CITATION_ONLY:
        assert "{cite}`" in reproduction, f"{label}: cite the paper that decides it"
        return
    assert _has_evidence(reproduction), (
        f"{label}: the reproduction links to no notebook cell, proof or test"
    )


def test_split_row_and_table_rows():
    table = "| a | b |\n|---|---|\n| x \\| y | {ref}`z` |\n\n| c |\n|:-:|\n| w |\n"
    assert table_rows(table) == [(3, ["x \\| y", "{ref}`z`"]), (7, ["w"])]


def _rows(page: str) -> list[tuple[int, list[str]]]:
    rows = table_rows(_read(page))
    assert len(rows) >= 8, f"{page} has {len(rows)} table rows"
    return rows


@pytest.mark.parametrize("page", CELL_PAGES)
def test_every_scorecard_cell_links_to_evidence(page):
    bare = [
        f"line {line}, column {col + 2}: {cell[:50]!r}"
        for line, cells in _rows(page)
        for col, cell in enumerate(cells[1:])
        if not _has_evidence(cell)
    ]
    assert not bare, f"{page}: cells without evidence:\n" + "\n".join(bare)


@pytest.mark.parametrize("page", ROW_PAGES)
def test_every_comparison_row_links_to_evidence(page):
    bare = [
        f"line {line}: {' | '.join(cells)[:60]!r}"
        for line, cells in _rows(page)
        if not _has_evidence(" ".join(cells))
    ]
    assert not bare, f"{page}: rows without evidence:\n" + "\n".join(bare)


def _cited_tests() -> list[tuple[str, str]]:
    """(page, test id) of every ``{test}`` link of every page and notebook."""
    return sorted(
        {
            (page, _target(text))
            for page, source in SOURCES.items()
            for role, text in LINK.findall(source)
            if role == "test"
        }
    )


def test_every_cited_test_has_a_section_with_its_source_in_the_book(tmp_path):
    """The page the generator writes for a cited test's file has the section the role
    links to (its label is the test id without parameters) and shows the test's code."""
    cited = _cited_tests()
    assert len(cited) >= 100, f"only {len(cited)} test links found"
    pages = {p.name: p.read_text(encoding="utf-8") for p in testref.write_pages(ROOT, tmp_path)}
    missing = []
    for page, test_id in cited:
        try:
            file, line = locate_test(ROOT, test_id)
        except ValueError as error:
            missing.append(f"{page}: {test_id}: {error}")
            continue
        names = testref.TEST_ID.match(test_id)["names"]
        target = testref.label(file, names)
        text = pages.get(f"{Path(file).stem}.md", "")
        if f"({target})=" not in text or f"```{{test-source}} {file}::{names}" not in text:
            missing.append(f"{page}: {test_id}: no section {target} on the page of {file}")
            continue
        segment = testref.analyse(ROOT, file).segment(names)
        assert segment.start <= line <= segment.end, test_id
    assert not missing, "cited tests without a section in the book:\n" + "\n".join(missing)


def test_locate_test_finds_functions_and_methods_and_rejects_the_rest(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_x.py").write_text(
        "def test_a():\n    pass\n\n\nclass TestB:\n    def test_c(self):\n        pass\n"
    )
    assert locate_test(tmp_path, "tests/test_x.py::test_a") == ("tests/test_x.py", 1)
    assert locate_test(tmp_path, "tests/test_x.py::test_a[case-1]") == ("tests/test_x.py", 1)
    assert locate_test(tmp_path, "tests/test_x.py::TestB::test_c") == ("tests/test_x.py", 6)
    for bad, why in [
        ("tests/test_x.py::test_missing", "defines no test"),
        ("tests/test_y.py::test_a", "no such test file"),
        ("test_x.py::test_a", "not a test id"),
        ("tests/test_x.py", "not a test id"),
    ]:
        with pytest.raises(ValueError, match=why):
            locate_test(tmp_path, bad)
