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
