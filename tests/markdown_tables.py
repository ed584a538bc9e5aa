"""Pipe tables of the book's markdown pages, read for the tests of the verdict pages."""

from __future__ import annotations

import re

SEPARATOR = re.compile(r"\s*\|[\s:|-]+\|\s*")


def split_row(line: str) -> list[str]:
    """Cells of a markdown pipe-table row (``\\|`` is a literal bar)."""
    cells = re.split(r"(?<!\\)\|", line.strip())
    return [cell.strip() for cell in cells[1:-1]]


def tables(text: str) -> list[tuple[list[str], list[tuple[int, list[str]]]]]:
    """Every pipe table in ``text``: its header cells and its body rows (line number, cells)."""
    found, lines = [], text.splitlines()
    for i, line in enumerate(lines):
        if not line.lstrip().startswith("|") or SEPARATOR.fullmatch(line):
            continue
        if i + 1 < len(lines) and SEPARATOR.fullmatch(lines[i + 1]):
            found.append((split_row(line), []))  # a header row starts a table
        elif found and i and lines[i - 1].lstrip().startswith("|"):
            found[-1][1].append((i + 1, split_row(line)))
    return found


def table_rows(text: str) -> list[tuple[int, list[str]]]:
    """(line number, cells) of every body row of every pipe table in ``text``."""
    return [row for _, rows in tables(text) for row in rows]


def table_by_header(text: str, *header: str) -> dict[str, list[str]]:
    """The first table whose header starts with ``header``, as {first cell: other cells}.

    Raises:
        LookupError: no table has such a header.
    """
    for cells, rows in tables(text):
        if tuple(cells[: len(header)]) == header:
            return {row[0]: row[1:] for _, row in rows}
    raise LookupError(f"no table with a header starting {header}")
