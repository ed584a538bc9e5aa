"""The whole book builds with warnings as errors, and its front page links what it should."""

from __future__ import annotations

import pytest


@pytest.mark.book
def test_book_builds_without_warnings(book_build):
    # book_build (conftest.py): one build per session, shared with tests/test_browser_math.py
    assert book_build.returncode == 0, book_build.output
    html = book_build.html
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
