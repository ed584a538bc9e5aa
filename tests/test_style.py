"""The code, notebooks included, is ruff-clean (lint and format)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("command", [["check"], ["format", "--check"]], ids=["lint", "format"])
def test_ruff(command):
    result = subprocess.run(
        [sys.executable, "-m", "ruff", *command, "."],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


MARKER = re.compile(r"^\s*#\s*(NBVAL|PYTEST_VALIDATE)_[A-Z_]+\s*$", re.M)


@pytest.mark.parametrize("notebook", sorted(ROOT.glob("notebooks/*.ipynb")), ids=lambda p: p.stem)
def test_nbval_markers_are_cell_tags_not_visible_comments(notebook):
    """nbval reads its markers from cell tags too; a comment would show in the book."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    sources = ["".join(cell["source"]) for cell in cells if cell["cell_type"] == "code"]
    assert not [s.splitlines()[0] for s in sources if MARKER.search(s)]


def test_the_marker_check_finds_a_comment_marker():
    assert MARKER.search("x = 1\n# NBVAL_IGNORE_OUTPUT\nprint(x)")
    assert not MARKER.search("print('NBVAL_IGNORE_OUTPUT is a tag now')")


CHECK_LABEL = re.compile(r"\(ch\w+-check-[\w-]+\)=")
FOLDED = {"hide-input", "hide-cell", "remove-input", "remove-cell"}


def unfolded_checks(cells: list[dict]) -> list[str]:
    """First lines of the code cells right after a check's label that the book shows open."""
    found = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "markdown" or not CHECK_LABEL.match("".join(cell["source"])):
            continue
        for code in cells[i + 1 :]:
            if code["cell_type"] != "code":
                break
            source = "".join(code["source"])
            # a listing is the package's own code: the chapter shows it on purpose
            if "show_source(" not in source and not FOLDED & set(code["metadata"].get("tags", [])):
                found.append(source.splitlines()[0])
    return found


@pytest.mark.parametrize("notebook", sorted(ROOT.glob("notebooks/*.ipynb")), ids=lambda p: p.stem)
def test_checks_are_folded_so_a_chapter_reads_as_prose(notebook):
    """A check's code is one click away in the book; its output (the verdict) stays visible."""
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    assert not unfolded_checks(cells)


def test_the_fold_check_finds_an_open_check_cell():
    def cell(kind: str, source: str, *tags: str) -> dict:
        return {"cell_type": kind, "source": [source], "metadata": {"tags": list(tags)}}

    cells = [
        cell("markdown", "(ch02-check-scale)=\n## A check"),
        cell("code", "d = 512\nassert d"),
        cell("code", "pecode.show_source(f)"),
        cell("markdown", "(ch02-check-unique)=\n## Another"),
        cell("code", "ok = True", "hide-input"),
    ]
    assert unfolded_checks(cells) == ["d = 512"]
