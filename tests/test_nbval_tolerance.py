"""The rules of ``tests/nbval_tolerance.py``, and nbval still failing on a real change.

The unit tests pin the comparison rules (what may move, by how much). The nbval runs
execute notebooks in a fresh pytest process with the plugin, as ``make test`` does:
one made-up notebook whose committed outputs are edited cell by cell, and a chapter
of the book with a committed number pushed past its tolerance, and with a change to
``pecode`` that moves its results.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat
import pytest
from nbval_tolerance import (
    NUMBER,
    PRINTED_ROUNDING,
    Tolerance,
    declared_tolerance,
    last_digit_unit,
    snap,
    within,
)

ROOT = Path(__file__).resolve().parents[1]


def tol(rtol=0.0, atol=0.0):
    return Tolerance(rtol=rtol, atol=atol, why="test")


@pytest.mark.parametrize(
    ("token", "unit"),
    [("0.55", 0.01), ("12.5", 0.1), ("5.5e-08", 1e-9), ("1.00e+03", 10.0)],
)
def test_last_digit_unit(token, unit):
    assert last_digit_unit(token) == pytest.approx(unit)


def test_one_digit_scientific_numbers_and_exact_zeros_have_no_slack():
    for token in ("0.0e+00", "1e6", "2e-06"):
        assert last_digit_unit(token) == 0
    assert not within("0.0e+00", "1.0e-12", PRINTED_ROUNDING)
    assert not within("2e-06", "1e-06", PRINTED_ROUNDING)  # a factor of two
    assert within("2e-06", "1e-06", tol(atol=1e-6))  # unless stated
    assert within("0.00", "0.01", PRINTED_ROUNDING)  # fixed notation: a rounded 0.004


@pytest.mark.parametrize(
    ("committed", "fresh", "allowed"),
    [
        ("0.55", "0.55", True),
        ("0.55", "0.56", True),  # the printout's rounding
        ("0.55", "0.54", True),
        ("0.55", "0.57", False),
        ("9.9e-08", "1.0e-07", True),  # across a decade
        ("5.5e-08", "5.7e-08", False),
        ("-0.001", "+0.000", True),
        ("-0.001", "0.001", False),
        ("24", "25", False),  # integers are exact
        ("24", "24.0", False),
        ("0.50", "0.5", False),  # spelt otherwise: a changed format, not a rounding
        ("0.5", "5.0e-01", False),
    ],
)
def test_printed_rounding(committed, fresh, allowed):
    assert within(committed, fresh, PRINTED_ROUNDING) is allowed


def test_stated_tolerance_adds_to_the_printed_rounding():
    wide = tol(atol=0.05)
    assert within("0.55", "0.61", wide)  # 0.05 + 0.01
    assert not within("0.55", "0.62", wide)
    relative = tol(rtol=0.1)
    assert within("5.0e-08", "5.5e-08", relative)  # 0.1 * 5e-8 + 1e-9
    assert within("5.0e-08", "5.6e-08", relative)
    assert not within("5.0e-08", "5.7e-08", relative)
    assert not within("24", "25", tol(atol=10))


def test_numbers_are_found_where_they_stand_alone():
    text = "d = 64: 1.4718 x1 fp16 10^(1-2/d) v2.13.0 393,216 -0.271 +0.972 (< 6e-8) 0.09. 24."
    assert NUMBER.findall(text) == [
        "64", "1.4718", "10", "1", "2", "393", "216", "-0.271", "+0.972", "6e-8", "0.09", "24",
    ]  # fmt: skip


def test_snap_respells_only_numbers_within_tolerance():
    committed = "acc 0.55 ± 0.01 at 24 positions"
    assert snap(committed, "acc 0.56 ± 0.02 at 24 positions", PRINTED_ROUNDING) == committed
    assert (
        snap(committed, "acc 0.58 ± 0.02 at 24 positions", PRINTED_ROUNDING)
        == "acc 0.58 ± 0.01 at 24 positions"
    )  # only the number that moved too far is left to fail
    assert snap(committed, "acc 0.55 ± 0.01 at 25 positions", tol(atol=1)).endswith("25 positions")


def test_snap_leaves_changed_text_alone():
    assert snap("check: True 0.55", "check: False 0.55", tol(atol=1)) == "check: False 0.55"
    assert snap("0.55 0.56", "0.55", tol(atol=1)) == "0.55"
    assert snap("there are 24.", "there are 25.", tol(atol=5)) == "there are 25."
    # a sign that widens a right-aligned column moves its padding, not its text
    assert snap("x    0.000|", "x   -0.001|", PRINTED_ROUNDING) == "x    0.000|"
    # but spaces that change the length of the line are a change of text
    assert snap("a 0.55", "a  0.56", PRINTED_ROUNDING) == "a  0.56"
    assert snap("col 1   col 2", "col 1 col 2", PRINTED_ROUNDING) == "col 1 col 2"


def test_declared_tolerance_cell_over_notebook_over_default():
    notebook = {"tolerance": {"rtol": 0.1, "why": "notebook"}}
    cell = {"metadata": {"tolerance": {"atol": 0.5, "why": "cell"}}}
    assert declared_tolerance({"metadata": {}}, {}, "x") is PRINTED_ROUNDING
    assert declared_tolerance({"metadata": {}}, notebook, "x") == Tolerance(0.1, 0.0, "notebook")
    assert declared_tolerance(cell, notebook, "x") == Tolerance(0.0, 0.5, "cell")


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"rtol": 0.1}, "why"),
        ({"rtol": 0.1, "why": "  "}, "why"),
        ({"why": "no bound"}, "rtol or atol"),
        ({"rtol": -0.1, "why": "x"}, "rtol"),
        ({"atol": float("nan"), "why": "x"}, "atol"),
        ({"atol": True, "why": "x"}, "atol"),
        ({"atol": 0.1, "why": "x", "rel": 0.1}, "keys"),
        (0.1, "dict"),
    ],
)
def test_malformed_tolerances_are_refused(entry, message):
    with pytest.raises(ValueError, match=message):
        Tolerance.from_metadata(entry, "nb.ipynb Cell 3")


# --- nbval runs ---------------------------------------------------------------------


def notebook_with(cells: list[tuple[str, str, dict | None]], metadata: dict | None = None):
    """A notebook whose cells print fixed text but have other committed outputs."""
    nb = nbformat.v4.new_notebook(metadata=metadata or {})
    for count, (source, committed, tolerance) in enumerate(cells, start=1):
        cell = nbformat.v4.new_code_cell(source, execution_count=count)
        cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=committed)]
        if tolerance is not None:
            cell.metadata["tolerance"] = tolerance
        nb.cells.append(cell)
    return nb


def run_nbval(pytester, monkeypatch, *paths: Path) -> dict[tuple[str, int], str]:
    """Run nbval with the plugin in a fresh process; the outcome of every cell."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT / "tests"))
    result = pytester.runpytest_subprocess(
        "-p", "nbval_tolerance", "-p", "no:cacheprovider", "--nbval", "--nbval-current-env",
        f"--nbval-sanitize-with={ROOT / 'tests' / 'nbval_sanitize.cfg'}",  # one token
        "-v", *map(str, paths),
    )  # fmt: skip
    # verbose lines: "made_up::ipynb::Cell 0 PASSED" (nbval's node ids under pytest 9)
    lines = re.findall(
        r"([\w-]+)(?:\.|::)ipynb::Cell (\d+) (PASSED|FAILED|ERROR)", result.stdout.str()
    )
    outcomes = {(f"{name}.ipynb", int(cell)): outcome for name, cell, outcome in lines}
    assert outcomes, result.stdout.str()
    return outcomes


def test_nbval_passes_in_tolerance_and_fails_beyond(pytester, monkeypatch):
    wide = {"atol": 0.05, "why": "test"}
    cells = [
        ("print('0.56')", "0.55\n", None),  # 0: last digit
        ("print('0.57')", "0.55\n", None),  # 1: two units
        ("print('0.59')", "0.55\n", wide),  # 2
        ("print('0.62')", "0.55\n", wide),  # 3
        ("print('25 of 0.55')", "24 of 0.55\n", wide),  # 4: an integer
        ("print('holds: False 0.55')", "holds: True 0.55\n", wide),  # 5: a verdict
        ("print('5.4e-08')", "5.5e-08\n", None),  # 6
        ("print('1.0e-12')", "0.0e+00\n", None),  # 7: an exact zero
        ("print('0.55'); print('0.55')", "0.55\n", wide),  # 8: a line more
        ("print('there are 25.')", "there are 24.\n", wide),  # 9: an integer at a full stop
        ("print('0.5')", "0.50\n", wide),  # 10: another spelling
    ]
    pytester.path.joinpath("made_up.ipynb").write_text(nbformat.writes(notebook_with(cells)))
    defaults = [
        ("print('0.59')", "0.55\n", None),  # 0: the notebook's tolerance
        ("print('0.59')", "0.55\n", {"atol": 0.0, "why": "exact here"}),  # 1: the cell's
    ]
    notebook = notebook_with(defaults, metadata={"tolerance": wide})
    pytester.path.joinpath("default.ipynb").write_text(nbformat.writes(notebook))
    outcomes = run_nbval(
        pytester, monkeypatch, pytester.path / "made_up.ipynb", pytester.path / "default.ipynb"
    )
    passed = {key for key, outcome in outcomes.items() if outcome == "PASSED"}
    assert passed == {
        ("made_up.ipynb", 0),
        ("made_up.ipynb", 2),
        ("made_up.ipynb", 6),
        ("default.ipynb", 0),
    }
    assert len(outcomes) == len(cells) + len(defaults)


def respelt(token: str, value: float) -> str:
    """``value`` printed like ``token`` (same notation and number of decimals)."""
    mantissa, _, exponent = token.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return f"{value:.{decimals}{'e' if exponent else 'f'}}"


def text_fields(cell) -> list[tuple[dict, str]]:
    """(container, key) of every text output of a cell: a stream's text, a display's text."""
    fields = []
    for output in cell.outputs:
        if output.output_type == "stream":
            fields.append((output, "text"))
        for mime in output.get("data", {}):
            if mime.startswith("text/"):
                fields.append((output["data"], mime))
    return fields


def decimals_of(cell) -> list[str]:
    text = "\n".join(container[key] for container, key in text_fields(cell))
    return [n for n in NUMBER.findall(text) if not n.lstrip("+-").isdigit()]


def moved_past(token: str, tolerance: Tolerance) -> str:
    """A committed spelling from which the fresh ``token`` lies beyond ``tolerance``.

    The bound grows with the committed value, so the number is moved down, by a
    factor of ten until it is far enough (a tenth of it is always far enough).
    """
    for shrink in (10, 100, 1000):
        moved = respelt(token, float(token) / shrink)
        if not within(moved, token, tolerance):
            return moved
    raise AssertionError(f"no spelling of {token} is beyond {tolerance}")


CHAPTER = ROOT / "notebooks" / "02_sinusoidal.ipynb"


def test_a_chapter_fails_nbval_when_a_number_moves_past_its_tolerance(pytester, monkeypatch):
    """Edit the committed outputs of a real chapter: its first measured number in a cell
    with a stated tolerance moves past it (the cell must fail); in a cell without one, a
    number moves by one unit in its last digit (the cell must pass)."""
    nb = nbformat.read(CHAPTER, as_version=4)
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    checked = [c for c in code if "nbval-ignore-output" not in c.metadata.get("tags", [])]
    stated = [code.index(c) for c in checked if "tolerance" in c.metadata and decimals_of(c)]
    plain = [code.index(c) for c in checked if "tolerance" not in c.metadata and decimals_of(c)]
    assert stated, "the chapter needs a cell with a stated tolerance"
    assert plain, "the chapter needs a cell with a decimal and no stated tolerance"
    moves = {stated[0]: "FAILED", plain[0]: "PASSED"}
    for index, expected in moves.items():
        cell = code[index]
        tolerance = declared_tolerance(cell, nb.metadata, CHAPTER.name)
        token = decimals_of(cell)[0]
        if expected == "FAILED":
            committed = moved_past(token, tolerance)
        else:
            committed = respelt(token, float(token) + last_digit_unit(token))
            assert within(committed, token, tolerance)
        for container, key in text_fields(cell):
            container[key] = container[key].replace(token, committed, 1)
    nbformat.write(nb, pytester.path / CHAPTER.name)
    outcomes = run_nbval(pytester, monkeypatch, pytester.path / CHAPTER.name)
    assert {index: outcomes[CHAPTER.name, index] for index in moves} == moves
    failed = [key for key, outcome in outcomes.items() if outcome != "PASSED"]
    assert failed == [(CHAPTER.name, stated[0])]


def test_a_chapter_fails_nbval_when_pecode_changes_its_results(pytester, monkeypatch):
    """A plausible bug, frequencies 0.1% off ``base ** (-2i / d)``, fails the chapter in
    cells that print numbers; the same chapter without it, in the same run, passes."""
    shutil.copy(CHAPTER, pytester.path / "unchanged.ipynb")
    nb = nbformat.read(CHAPTER, as_version=4)
    setup = next(cell for cell in nb.cells if cell.cell_type == "code")
    setup.source += (
        "\nimport pecode.absolute as _absolute\n"
        "_exact = _absolute.sinusoidal_frequencies\n"
        "_absolute.sinusoidal_frequencies = lambda *a, **k: _exact(*a, **k) * 1.001\n"
    )
    nbformat.write(nb, pytester.path / "changed.ipynb")
    outcomes = run_nbval(
        pytester, monkeypatch, pytester.path / "unchanged.ipynb", pytester.path / "changed.ipynb"
    )
    code = [cell for cell in nb.cells if cell.cell_type == "code"]
    assert {o for (name, _), o in outcomes.items() if name == "unchanged.ipynb"} == {"PASSED"}
    failed = [i for (name, i), o in outcomes.items() if name == "changed.ipynb" and o != "PASSED"]
    assert failed, "the changed frequencies went unnoticed"
    assert any(decimals_of(code[i]) for i in failed)  # numbers moved, not only verdicts
