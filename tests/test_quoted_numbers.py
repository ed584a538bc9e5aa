"""The verdict pages quote the measurement chapters' numbers exactly.

``book/which_encoding.md`` reprints two tables: chapter 12's accuracies (outputs that
nbval re-executes and compares) and chapter 11's per-layer costs (one recorded run);
``book/scorecard.md`` quotes the same costs in its cost table. Each quoted number must
equal the one the notebook printed, so the pages cannot drift from the measurements they
are grounded in: re-executing chapter 11 makes these tests say which numbers to update.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from markdown_tables import table_by_header

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "book" / "which_encoding.md"
SCORECARD = ROOT / "book" / "scorecard.md"


def notebook_output(name: str, header: str) -> list[str]:
    """Lines of the first code-cell output of ``name`` that starts with ``header``."""
    cells = json.loads((ROOT / "notebooks" / name).read_text(encoding="utf-8"))["cells"]
    for cell in cells:
        for output in cell.get("outputs", []):
            text = "".join(output.get("text", ""))
            if text.lstrip().startswith(header):
                return text.strip("\n").splitlines()
    raise AssertionError(f"{name} prints no output starting with {header!r}")


def page_table(page: Path, *header: str) -> dict[str, list[str]]:
    """{first cell: other cells} of the table on ``page`` whose header starts with ``header``."""
    return table_by_header(page.read_text(encoding="utf-8"), *header)


def test_accuracy_table_equals_chapter_12_output():
    printed = notebook_output("12_train_short_test_long.ipynb", "model")
    expected = {}
    for line in printed[1:]:
        name, rest = line[:12].strip(), line[12:]
        # four columns of "mean ± std" or "n/a", then an optional training loss
        expected[name] = re.findall(r"\d\.\d\d ± \d\.\d\d|n/a", rest)
    quoted = page_table(PAGE, "model")
    assert set(quoted) == set(expected)
    for name, cells in quoted.items():
        assert cells == expected[name], name


def chapter_11_costs_at_512() -> dict[str, list[str]]:
    """Chapter 11's printed parameters, extra MiB and time ratio per encoding at L = 512."""
    printed = notebook_output("11_costs.ipynb", "encoding")
    expected = {}
    for line in printed[1:]:
        name, length, params, memory, _, ratio = line.split()
        if length == "512":
            expected[name] = [params, memory, ratio]
    return expected


def test_cost_table_equals_chapter_11_output_at_512():
    expected = chapter_11_costs_at_512()
    quoted = page_table(PAGE, "encoding")
    assert set(quoted) == set(expected)
    for name, cells in quoted.items():
        assert cells == expected[name], name


def test_page_table_reads_rows():
    rows = page_table(PAGE, "model")
    assert rows["learned"][1:] == ["n/a", "n/a", "n/a"]
    with pytest.raises(LookupError):
        page_table(PAGE, "no such header")


SCORECARD_NAMES = {
    "sinusoidal": "sinusoidal",
    "learned": "learned",
    "Shaw": "shaw",
    "Transformer-XL": "transformer-xl",
    "T5": "t5",
    "DeBERTa": "deberta",
    "ALiBi": "alibi",
    "RoPE": "rope",
}


def test_scorecard_costs_equal_chapter_11_output_at_512():
    expected = chapter_11_costs_at_512()
    quoted = page_table(SCORECARD, "encoding", "parameters")
    for row, name in SCORECARD_NAMES.items():
        _, memory, ratio = expected[name]
        memory_cell, time_cell = quoted[row][1], quoted[row][2]
        assert re.search(r"([\d.]+) MiB", memory_cell)[1] == memory, row
        # the scorecard rounds the time ratio to one decimal
        assert abs(float(re.match(r"[\d.]+", time_cell)[0]) - float(ratio)) <= 0.051, row
