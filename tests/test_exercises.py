"""Every chapter's exercises have solutions, in the book's one format.

After a chapter's numbered "## Exercises" list comes "## Solutions": for exercise k a
dropdown titled "Solution to exercise k" (a derivation), optionally followed by one code
cell that starts ``# Solution to exercise k``, hidden in the HTML (tag ``hide-cell``) and
run by nbval like every other cell.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(ROOT.glob("notebooks/*.ipynb"))
HEADING = re.compile(r"^## Exercises\s*$", re.M)
ITEM = re.compile(r"^(\d+)\. ", re.M)
DROPDOWN = re.compile(r"^:::\{dropdown\} Solution to exercise (\d+)\s*$", re.M)
CODE = re.compile(r"\A# Solution to exercise (\d+)\s*$", re.M)


def solutions_problems(cells: list[dict]) -> list[str]:
    """What is wrong with a chapter's exercises and solutions (empty: nothing)."""
    sources = ["".join(cell["source"]) for cell in cells]
    at = [i for i, source in enumerate(sources) if cells[i]["cell_type"] == "markdown"]
    exercises_cell = next((i for i in at if HEADING.search(sources[i])), None)
    if exercises_cell is None:
        return ["no '## Exercises' heading"]
    listed = sources[exercises_cell][HEADING.search(sources[exercises_cell]).end() :]
    numbers = [int(n) for n in ITEM.findall(listed)]
    if numbers != list(range(1, len(numbers) + 1)) or not numbers:
        return [f"exercises are not numbered 1..n: {numbers}"]
    problems, solved, last = [], [], None
    for i in range(exercises_cell + 1, len(cells)):
        if cells[i]["cell_type"] == "markdown":
            for k in map(int, DROPDOWN.findall(sources[i])):
                solved.append(k)
                last = k
        elif cells[i]["cell_type"] == "code":
            match = CODE.match(sources[i])
            if not match:
                problems.append(f"cell {i}: code after the exercises that is not a solution")
                continue
            if int(match[1]) != last:
                problems.append(f"cell {i}: solution code {match[1]} not after its dropdown")
            if "hide-cell" not in cells[i]["metadata"].get("tags", []):
                problems.append(f"cell {i}: solution code not tagged hide-cell")
    if solved != numbers:
        problems.append(f"solutions {solved} for exercises {numbers}")
    return problems


@pytest.mark.parametrize("notebook", NOTEBOOKS, ids=lambda p: p.stem)
def test_every_exercise_has_a_solution(notebook):
    cells = json.loads(notebook.read_text(encoding="utf-8"))["cells"]
    assert not solutions_problems(cells)


def _cell(kind: str, source: str, tags: tuple[str, ...] = ()) -> dict:
    return {"cell_type": kind, "source": source, "metadata": {"tags": list(tags)}}


def test_the_check_finds_a_missing_solution_and_a_visible_solution_cell():
    exercises = _cell("markdown", "## Exercises\n\n1. One.\n2. Two.\n")
    one = _cell("markdown", "## Solutions\n\n:::{dropdown} Solution to exercise 1\nA.\n:::\n")
    two = _cell("markdown", ":::{dropdown} Solution to exercise 2\nB.\n:::\n")
    code = _cell("code", "# Solution to exercise 2\nassert True\n", ("hide-cell",))
    assert solutions_problems([exercises, one, two, code]) == []
    assert solutions_problems([exercises, one])  # exercise 2 unsolved
    shown = _cell("code", "# Solution to exercise 2\nassert True\n")
    assert solutions_problems([exercises, one, two, shown])  # its answer in plain sight
    assert solutions_problems([exercises, one, code, two])  # code before its dropdown
