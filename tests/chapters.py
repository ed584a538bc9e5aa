"""Each chapter notebook's number as the book shows it, read from ``_toc.yml``.

A notebook's file name is a stable address, not its number: the chapters are numbered
by their place among the numbered parts' chapters, and a chapter's pages (9b) share its
number. So ``09c_rope_beyond_one_axis`` is chapter 10 and ``10_long_context`` chapter 11.
"""

from __future__ import annotations

from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def chapter_numbers() -> dict[str, int]:
    """``{notebook or page stem: chapter number}`` for every numbered chapter and its pages."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
    chapters = [
        chapter for part in toc["parts"] if part.get("numbered") for chapter in part["chapters"]
    ]
    numbers = {}
    for number, chapter in enumerate(chapters, start=1):
        for page in [chapter, *chapter.get("sections", [])]:
            numbers[Path(page["file"]).stem] = number
    return numbers


CHAPTER_NUMBERS = chapter_numbers()
