"""The whole book builds with warnings as errors, and its front page links what it should."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.book
def test_book_builds_without_warnings(tmp_path):
    jupyter_book = Path(sys.executable).with_name("jupyter-book")
    command = [str(jupyter_book if jupyter_book.exists() else shutil.which("jupyter-book"))]
    result = subprocess.run(
        [*command, "build", str(ROOT), "-W", "-n", "--keep-going", "--path-output", str(tmp_path)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-6000:]
    html = tmp_path / "_build" / "html"
    assert (html / "index.html").exists()
    intro = (html / "book" / "intro.html").read_text(encoding="utf-8")
    for target in ("notebooks/01_why_positions.html", "api.html", "errata.html"):
        assert target in intro, target
    api = (html / "book" / "api.html").read_text(encoding="utf-8")
    for documented in (
        "MultiHeadAttention",
        "PositionScheme",
        "attention_permutation_equivariance",
    ):
        assert documented in api, documented
