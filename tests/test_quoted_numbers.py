"""The verdict pages quote the measurement chapters' numbers exactly.

``book/which_encoding.md`` reprints two tables: chapter 13's accuracies (outputs that
nbval re-executes and compares) and chapter 12's per-layer costs (one recorded run);
``book/scorecard.md`` quotes the same costs in its cost table. The pages (and chapter
12's own prose) quote RoPE's measured ratios as chapter 12 prints them, ``median [q1,
q3]`` of per-round ratios, and its decode-step times in µs: each quoted spread must be
one that chapter 12 printed, in a sentence that names what was measured (the layout,
``out=``, forward + backward, the yardstick), and no page may quote a ratio to a
``clone``, which also pays for fresh memory pages and is no bandwidth bound. So the
pages cannot drift from the measurements they are grounded in: re-executing chapter 12
makes these tests say which numbers to update.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from markdown_tables import table_by_header

ROOT = Path(__file__).resolve().parents[1]
BOOK = ROOT / "book"
PAGE = BOOK / "which_encoding.md"
SCORECARD = BOOK / "scorecard.md"
CHAPTER_11 = "11_costs.ipynb"
# the pages that quote RoPE's cost; each must quote at least one of chapter 12's ratios
ROPE_PAGES = ["which_encoding.md", "scorecard.md", "source_tables.md", "errata.md"]

NUMBER = r"\d+(?:\.\d+)?"
SPREAD = re.compile(rf"{NUMBER} \[{NUMBER}, {NUMBER}\]")
# a time quoted in µs or ms; its number must be one chapter 12 printed
TIME = re.compile(rf"(?<![\w.])({NUMBER}) (?:µs|ms)\b")
PRINTED_NUMBER = re.compile(rf"(?<![\w.]){NUMBER}(?![\w])")
# a number followed by "times a clone", "× a `clone`", "x clone": a ratio to a clone
CLONE_RATIO = re.compile(rf"{NUMBER}\]?\s*(?:times|×|x)\s+(?:an?\s+|the\s+)?`?clone", re.IGNORECASE)


def _cells(name: str) -> list[dict]:
    return json.loads((ROOT / "notebooks" / name).read_text(encoding="utf-8"))["cells"]


def notebook_output(name: str, header: str) -> list[str]:
    """Lines of the first code-cell output of ``name`` that starts with ``header``.

    A printed output, or the plain-text form of a displayed one (a ``pecode.Table``).
    """
    for cell in _cells(name):
        for output in cell.get("outputs", []):
            text = "".join(output.get("text", "")) or "".join(
                output.get("data", {}).get("text/plain", "")
            )
            if text.lstrip().startswith(header):
                return text.strip("\n").splitlines()
    raise AssertionError(f"{name} prints no output starting with {header!r}")


def printed_lines(name: str) -> list[str]:
    """Every line that the code cells of ``name`` printed or showed as a table.

    Committed stream outputs, and the plain-text form of displayed ones (a
    ``pecode.Table``, such as chapter 12's collapsed table of every measurement).
    """
    lines = []
    for cell in _cells(name):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "stream":
                text = "".join(output.get("text", ""))
            else:
                text = "".join(output.get("data", {}).get("text/plain", ""))
            lines += text.splitlines()
    return lines


def markdown(name: str) -> str:
    return "\n\n".join("".join(c["source"]) for c in _cells(name) if c["cell_type"] == "markdown")


def page_table(page: Path, *header: str) -> dict[str, list[str]]:
    """{first cell: other cells} of the table on ``page`` whose header starts with ``header``."""
    return table_by_header(page.read_text(encoding="utf-8"), *header)


def test_accuracy_table_equals_chapter_12_output():
    printed = notebook_output("12_train_short_test_long.ipynb", "model")
    expected = {}
    for line in printed[1:]:
        # the name is the first word: a reading's name may be longer than its column
        name, rest = line.split(maxsplit=1)
        # six columns of "mean ± std" or "n/a": copy at L, 2L, 4L; needle near, far, far
        expected[name] = re.findall(r"\d\.\d\d ± \d\.\d\d|n/a", rest)
        assert len(expected[name]) == 6, line
    quoted = page_table(PAGE, "model")
    assert set(quoted) == set(expected)
    for name, cells in quoted.items():
        assert cells == expected[name], name


def chapter_11_costs_at_512() -> dict[str, list[str]]:
    """Chapter 12's printed parameters, extra MiB and time ratio per encoding at L = 512.

    The time ratio is the per-round ratio's ``median [q1, q3]``, as printed.
    """
    printed = notebook_output(CHAPTER_11, "encoding")
    expected = {}
    for line in printed[1:]:
        name, length, params, memory, _, *ratio = line.split()
        if length == "512":
            expected[name] = [params, memory, " ".join(ratio)]
    return expected


def test_cost_table_equals_chapter_11_output_at_512():
    expected = chapter_11_costs_at_512()
    quoted = page_table(PAGE, "encoding")
    assert set(quoted) == set(expected)
    for name, cells in quoted.items():
        assert cells == expected[name], name


def test_page_table_reads_rows():
    rows = page_table(PAGE, "model")
    assert rows["rope"][0] == "1.00 ± 0.00"  # the first column after the name
    assert all(len(cells) == 6 for cells in rows.values())
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
        # the scorecard rounds the median time ratio to one decimal
        median = float(ratio.split()[0])
        assert abs(float(re.match(r"[\d.]+", time_cell)[0]) - median) <= 0.051, row


# --- RoPE's ratios and decode times, quoted from chapter 12 -------------------------------

LABELLED = re.compile(
    rf"(?P<method>\S.*?) / (?P<yardstick>\S.*?)\s{{2,}}(?P<spread>{SPREAD.pattern})"
)


def chapter_11_ratios() -> dict[str, list[tuple[str, str]]]:
    """{'m [q1, q3]': [(method, yardstick), ...]} of chapter 12's lines of labelled ratios.

    A labelled ratio is printed ``method / yardstick   m [q1, q3]`` (two spaces or more
    before the spread).
    """
    ratios: dict[str, list[tuple[str, str]]] = {}
    for line in printed_lines(CHAPTER_11):
        match = LABELLED.fullmatch(line.strip())
        if match:
            ratios.setdefault(match["spread"], []).append((match["method"], match["yardstick"]))
    return ratios


def _names(name: str) -> list[tuple[str, ...]]:
    """Words a sentence quoting ``name``'s time must contain: one of each tuple."""
    words: list[tuple[str, ...]] = []
    for key, alternatives in (
        ("half", ("half",)),
        ("interleaved", ("interleaved",)),
        ("out=", ("out=",)),
        ("compiled", ("compiled", "compiler", "fused")),
        ("textbook", ("textbook",)),
        ("identity", ("identity",)),
        ("hf ", ("Hugging Face", "HF")),
    ):
        if key in name:
            words.append(alternatives)
    if "fwd+bwd" in name and not name.startswith("identity"):
        words.append(("backward", "fwd+bwd", "training"))
    if name in ("copy_", "clone"):
        words.append((name,))
    return words


def sentence_around(text: str, start: int, end: int) -> str:
    """The sentence (or table cell) of ``text`` that holds ``text[start:end]``."""
    stops = re.compile(r"\.\s|\|")
    left = max((m.end() for m in stops.finditer(text, 0, start)), default=0)
    right = stops.search(text, end)
    return text[left : right.start() if right else len(text)]


def names_what_it_quotes(sentence: str, method: str, yardstick: str) -> bool:
    return all(
        any(word in sentence for word in alternatives)
        for alternatives in _names(method) + _names(yardstick)
    )


def quotes_that_differ(text: str, notebook: str = CHAPTER_11) -> list[str]:
    """The spreads and times in ``text`` that ``notebook`` did not print as they are used.

    A spread ``m [q1, q3]`` must be printed by the notebook, and if chapter 12 printed it
    as a labelled ratio, the sentence must name that ratio's method and yardstick. A time
    in µs or ms must be a number the notebook printed.
    """
    text = " ".join(text.split())  # a line break is a space
    printed = printed_lines(notebook)
    every_spread = {s for line in printed for s in SPREAD.findall(line)}
    every_number = {n for line in printed for n in PRINTED_NUMBER.findall(line)}
    ratios = chapter_11_ratios() if notebook == CHAPTER_11 else {}
    wrong = []
    for match in SPREAD.finditer(text):
        sentence = sentence_around(text, match.start(), match.end())
        if match[0] not in every_spread:
            wrong.append(f"{match[0]} is not printed by chapter 12: {sentence!r}")
        elif match[0] in ratios and not any(
            names_what_it_quotes(sentence, *label) for label in ratios[match[0]]
        ):
            wrong.append(f"{match[0]} ({ratios[match[0]]}) quoted without naming it: {sentence!r}")
    for match in TIME.finditer(text):
        if match[1] not in every_number:
            wrong.append(f"{match[0]} is not printed by {notebook}")
    return wrong


def test_chapter_11_prints_the_ratios_it_quotes():
    """The quoted block exists and holds the ratios the issue asks for, with spreads."""
    labels = {label for found in chapter_11_ratios().values() for label in found}
    for layout in ("half", "interleaved"):
        assert (f"apply_rope {layout} out=", "copy_") in labels
        assert (f"apply_rope {layout}", "copy_") in labels
        assert (f"apply_rope {layout} fwd+bwd", "copy_") in labels
        assert (f"apply_rope {layout} fwd+bwd", "identity fwd+bwd") in labels
    assert ("clone", "copy_") in labels


@pytest.mark.parametrize("notebook", [CHAPTER_11, "09_rope_in_practice.ipynb"])
def test_chapter_prose_quotes_what_it_printed(notebook):
    """A measured number in a chapter's text is one its cells printed in the same run."""
    assert not quotes_that_differ(markdown(notebook), notebook)


@pytest.mark.parametrize("page", ROPE_PAGES)
def test_page_quotes_rope_ratios_as_chapter_11_printed_them(page):
    """Every ``m [q1, q3]`` and time on the page is chapter 12's, next to what it measures."""
    text = (BOOK / page).read_text(encoding="utf-8")
    assert not quotes_that_differ(text)
    ratios = chapter_11_ratios()
    assert any(m[0] in ratios for m in SPREAD.finditer(text)), f"{page} quotes no RoPE ratio"


@pytest.mark.parametrize("page", ROPE_PAGES)
def test_no_ratio_to_a_clone_is_quoted(page):
    """A clone of a large CPU tensor pays for fresh pages: no bound, so no yardstick."""
    text = (BOOK / page).read_text(encoding="utf-8")
    found = [m[0] for m in CLONE_RATIO.finditer(" ".join(text.split()))]
    assert not found, found


def test_sentence_check_tells_apart_what_is_quoted():
    """The check fails on a quote that names the wrong layout or yardstick."""
    method, yardstick = "apply_rope half out=", "copy_"
    assert names_what_it_quotes(
        "`apply_rope` with `out=`, half layout: 2 times `copy_`", method, yardstick
    )
    assert not names_what_it_quotes(
        "`apply_rope`, interleaved layout, with `out=`: 2 times `copy_`", method, yardstick
    )
    assert not names_what_it_quotes(
        "`apply_rope` with `out=`, half layout: 2 times a clone", method, yardstick
    )
    text = "First. It took 1.00 [1.00, 1.00] there | next cell"
    start = text.index("1.00")
    assert sentence_around(text, start, start + 4) == "It took 1.00 [1.00, 1.00] there "
    assert CLONE_RATIO.search("took 1.22 to 1.28 times a clone of them")
    assert CLONE_RATIO.search("(1.28 × a `clone`)")
    assert not CLONE_RATIO.search("2.64 [2.57, 2.67] times `copy_`")
