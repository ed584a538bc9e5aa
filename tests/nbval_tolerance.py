"""nbval with tolerances: a pytest plugin, loaded by the root ``conftest.py``.

nbval (strict mode) compares every code cell's fresh outputs with the committed ones,
string for string after ``tests/nbval_sanitize.cfg``. That is right for text, integers,
booleans and verdicts; it is too strict for a printed float, whose last digit can round
the other way when the float kernels (AVX-512, AVX2, no SIMD, CUDA), the BLAS, the thread
count or the device change the computation's last bits. This plugin keeps nbval's
comparison and relaxes only the numbers:

* text, the count of numbers, and integers (``24``, ``-3``, the ``24`` of ``24.``) must
  be identical, up to the spaces that pad a column whose number changed its width;
* a decimal number (``0.55``, ``5.5e-08``) of the fresh output, spelt alike (the same
  notation and number of decimals), may differ from the committed one in the same
  place by one unit in the committed number's last printed digit ``u`` (``0.55``:
  ``u = 0.01``; ``5.5e-08``: ``u = 1e-09``): the printout's own rounding. A number in
  scientific notation with a one-digit mantissa (``1e-07``, an exact ``0.0e+00``) has
  ``u = 0``: a unit there would be a change by a factor of two or more;
* a cell whose numbers can move further states how far, with a reason, in its metadata::

      "tolerance": {"rtol": 0.05, "atol": 0.0, "why": "float32 matmul: BLAS-dependent"}

  and then ``|fresh - committed| <= atol + rtol * |committed| + u``. A notebook may state
  one for all its cells in the notebook's metadata; a cell's own entry replaces it.

How it hooks in: nbval's collector of a notebook is swapped for a subclass whose cells
spell every in-tolerance number of the fresh output as committed before nbval's own
comparison runs, so a failure reads like any nbval failure and shows only the numbers
that moved too far.
"""

from __future__ import annotations

import copy
import math
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import nbformat
import pytest
from nbval.plugin import IPyNbCell, IPyNbFile

METADATA_KEY = "tolerance"

# A number not glued to a word or to another number: "0.55", "-0.271", "5.5e-08", "1e6",
# "24". Not the 1 of "x1", "fp16" or "10^(1-2/d)"'s "(1", nor the parts of "2.13.0"; the
# "24" of "there are 24." is an integer followed by a full stop.
NUMBER = re.compile(
    r"(?<![\w.])[-+]?(?:\d+\.\d+(?:[eE][-+]?\d+)?|\.\d+(?:[eE][-+]?\d+)?|\d+[eE][-+]?\d+|\d+)"
    r"(?!\w|\.\d)"
)


@dataclass(frozen=True)
class Tolerance:
    """How far a printed decimal may move: ``atol + rtol * |committed|`` plus its last digit."""

    rtol: float
    atol: float
    why: str

    @classmethod
    def from_metadata(cls, value: Any, where: str) -> Tolerance:
        """Read ``{"rtol": ..., "atol": ..., "why": ...}``; a reason is required.

        Raises:
            ValueError: the entry is not such a dict, a bound is negative, not finite or
                missing (give at least one of the two), or the reason is empty.
        """
        if not isinstance(value, dict) or set(value) - {"rtol", "atol", "why"}:
            raise ValueError(
                f"{where}: {METADATA_KEY!r} must be a dict with keys rtol, atol, why; got {value!r}"
            )
        if not ({"rtol", "atol"} & set(value)):
            raise ValueError(f"{where}: {METADATA_KEY!r} needs rtol or atol")
        bounds = {}
        for name in ("rtol", "atol"):
            bound = value.get(name, 0.0)
            if (
                isinstance(bound, bool)
                or not isinstance(bound, int | float)
                or not math.isfinite(bound)
                or bound < 0
            ):
                raise ValueError(
                    f"{where}: {METADATA_KEY}.{name} must be a number >= 0, got {bound!r}"
                )
            bounds[name] = float(bound)
        why = value.get("why")
        if not isinstance(why, str) or not why.strip():
            raise ValueError(f"{where}: {METADATA_KEY}.why must say why the numbers may move")
        return cls(rtol=bounds["rtol"], atol=bounds["atol"], why=why)


def is_integer_literal(token: str) -> bool:
    """``"24"`` or ``"-3"``: compared exactly, even where a tolerance is stated."""
    return token.lstrip("+-").isdigit()


def _spelling(token: str) -> tuple[bool, int]:
    """(scientific notation?, digits after the decimal point of the mantissa)."""
    mantissa, e, _ = token.lower().partition("e")
    return bool(e), len(mantissa.partition(".")[2])


def last_digit_unit(token: str) -> float:
    """One unit in the last printed digit: ``0.55`` -> 0.01, ``5.5e-08`` -> 1e-09.

    Scientific notation with a one-digit mantissa (``1e-07``, ``0.0e+00`` is an exact
    zero) gets 0: such a number is a constant of a label, or its last digit is its only
    one, and a unit there would be a change by a factor of two or ten.
    """
    scientific, decimals = _spelling(token)
    mantissa, _, exponent = token.lower().partition("e")
    if scientific and (decimals == 0 or float(mantissa) == 0):
        return 0.0
    return 10.0 ** (int(exponent or 0) - decimals)


def within(committed: str, fresh: str, tolerance: Tolerance) -> bool:
    """Whether the fresh number token may stand for the committed one.

    Both must be spelt alike (the same notation and number of decimals) and decimal;
    an integer must be equal.
    """
    if committed == fresh:
        return True
    if is_integer_literal(committed) or is_integer_literal(fresh):
        return False
    if _spelling(committed) != _spelling(fresh):
        return False
    r, t = float(committed), float(fresh)
    bound = tolerance.atol + tolerance.rtol * abs(r) + last_digit_unit(committed)
    return abs(t - r) <= bound * (1 + 1e-9)  # the slack absorbs the decimal-to-binary step


def _same_layout(committed: str, fresh: str) -> bool:
    """The text between the numbers is the same, or it differs only in the spaces that
    pad a column: a number that gains a character (``0.000`` -> ``-0.001``) shifts its
    padding, but the line keeps its length."""
    committed_parts, fresh_parts = NUMBER.split(committed), NUMBER.split(fresh)
    if committed_parts == fresh_parts:
        return True
    return len(committed) == len(fresh) and [p.strip(" ") for p in committed_parts] == [
        p.strip(" ") for p in fresh_parts
    ]


def snap(committed: str, fresh: str, tolerance: Tolerance) -> str:
    """``fresh`` with every number within ``tolerance`` of the committed one spelt as committed.

    If every number is within tolerance and the text around them is the same (up to
    a column's padding), the committed string comes back. If only some numbers are,
    those are respelt. If the text or the count of numbers differs, ``fresh`` comes back
    unchanged, and the exact comparison after this one reports the change.
    """
    if not _same_layout(committed, fresh):
        return fresh
    pairs = list(zip(NUMBER.findall(committed), NUMBER.findall(fresh), strict=True))
    if all(within(r, t, tolerance) for r, t in pairs):
        return committed
    out = [NUMBER.split(fresh)[0]]
    for (r, t), part in zip(pairs, NUMBER.split(fresh)[1:], strict=True):
        out += [r if within(r, t, tolerance) else t, part]
    return "".join(out)


PRINTED_ROUNDING = Tolerance(rtol=0.0, atol=0.0, why="the last printed digit may round either way")
"""What every decimal number is allowed when nothing wider is stated."""


def declared_tolerance(cell: dict, notebook_metadata: dict, where: str) -> Tolerance:
    """The cell's own stated tolerance, else the notebook's, else :data:`PRINTED_ROUNDING`."""
    for metadata in (cell.get("metadata", {}), notebook_metadata):
        if METADATA_KEY in metadata:
            return Tolerance.from_metadata(metadata[METADATA_KEY], where)
    return PRINTED_ROUNDING


def _text_fields(output: dict) -> list[tuple[tuple[str, str], tuple[str, ...]]]:
    """(pairing key, path) of each text nbval compares in one output: a stream's text
    under its name, a display's value under its MIME type."""
    if output.get("output_type") == "stream":
        return [(("stream", output.get("name", "")), ("text",))]
    return [(("data", mime), ("data", mime)) for mime in output.get("data", {})]


def _get(output: dict, path: tuple[str, ...]) -> Any:
    for key in path:
        output = output[key]
    return output


def _set(output: dict, path: tuple[str, ...], value: Any) -> None:
    for key in path[:-1]:
        output = output[key]
    output[path[-1]] = value


def snap_outputs(fresh: list, committed: list, tolerance: Tolerance, sanitize) -> tuple[list, list]:
    """Sanitized copies of both output lists, the fresh one snapped to the committed one.

    Texts are paired the way nbval pairs them: the k-th text under a key (a stream's
    name, or a MIME type) of one list with the k-th text under that key of the other.
    """

    def sanitized(outputs: list) -> list:
        copies = []
        for output in outputs:
            duplicate = nbformat.from_dict(copy.deepcopy(dict(output)))
            for _, path in _text_fields(duplicate):
                _set(duplicate, path, sanitize(_get(duplicate, path)))
            copies.append(duplicate)
        return copies

    fresh, committed = sanitized(fresh), sanitized(committed)
    references = defaultdict(list)
    for output in committed:
        for key, path in _text_fields(output):
            references[key].append(_get(output, path))
    seen: dict[tuple[str, str], int] = defaultdict(int)
    for output in fresh:
        for key, path in _text_fields(output):
            index = seen[key]
            seen[key] += 1
            value = _get(output, path)
            if index < len(references[key]):
                reference = references[key][index]
                if isinstance(value, str) and isinstance(reference, str):
                    _set(output, path, snap(reference, value, tolerance))
    return fresh, committed


class ToleranceCell(IPyNbCell):
    """An nbval cell whose decimal numbers may move within the cell's tolerance."""

    def compare_outputs(self, test, ref, skip_compare=None):
        tolerance = self.parent.tolerance_of(self.cell, self.cell_num)
        test, ref = snap_outputs(test, ref, tolerance, self.sanitize)
        return super().compare_outputs(test, ref, skip_compare)


class ToleranceNotebook(IPyNbFile):
    """nbval's notebook collector, yielding :class:`ToleranceCell` items."""

    def tolerance_of(self, cell: dict, cell_num: int) -> Tolerance:
        return declared_tolerance(cell, self.nb.metadata, f"{self.path.name} Cell {cell_num}")

    def collect(self):
        for item in super().collect():
            # read the declaration now, so that a malformed one is a collection error
            self.tolerance_of(item.cell, item.cell_num)
            yield ToleranceCell.from_parent(
                self, name=item.name, cell_num=item.cell_num, cell=item.cell, options=item.options
            )


@pytest.hookimpl(wrapper=True)
def pytest_collect_file(file_path, parent):
    collected = yield
    return [
        ToleranceNotebook.from_parent(parent, path=file_path) if type(node) is IPyNbFile else node
        for node in collected or []
    ]
