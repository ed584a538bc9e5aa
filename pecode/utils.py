"""Small helpers the notebooks share: the device, seeding, a fixed CPU thread count, and
showing pecode's source."""

from __future__ import annotations

import ast
import inspect
import os
import random
import re
import textwrap
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from pecode._checks import check_bool, check_int

__all__ = ["SourceListing", "Table", "cpu_threads", "device", "set_seed", "show_source"]

_DEVICE_ENV = "PECODE_DEVICE"


def device() -> torch.device:
    """Return the device the notebooks compute on.

    CUDA when a GPU is available, otherwise the CPU. The environment variable
    ``PECODE_DEVICE`` (for example ``cpu``) overrides the choice, which lets a GPU
    machine reproduce the CPU run.

    Returns:
        The chosen ``torch.device``.

    Raises:
        ValueError: ``PECODE_DEVICE`` names a device torch does not know, or CUDA
            is asked for on a machine without it.
    """
    override = os.environ.get(_DEVICE_ENV, "").strip()
    if override:
        try:
            chosen = torch.device(override)
        except RuntimeError as err:
            raise ValueError(f"{_DEVICE_ENV}={override!r} is not a torch device: {err}") from err
        if chosen.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"{_DEVICE_ENV}={override!r} asks for CUDA, which is not available")
        return chosen
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def set_seed(seed: int) -> torch.Generator:
    """Seed Python's, NumPy's and torch's random number generators (all devices).

    Args:
        seed: a non-negative integer.

    Returns:
        A CPU ``torch.Generator`` seeded with ``seed``, for code that prefers an
        explicit generator to the global one.

    Raises:
        TypeError: ``seed`` is not an integer (a bool is refused too).
        ValueError: ``seed`` is negative.
    """
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    seed = int(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 -- seeding the legacy global RNG is the point
    torch.manual_seed(seed)  # seeds every CUDA device as well
    return torch.Generator().manual_seed(seed)


@contextmanager
def cpu_threads(num_threads: int) -> Iterator[None]:
    """Run the body with ``torch.set_num_threads(num_threads)``, then restore the old value.

    A fixed thread count makes CPU reductions, hence training runs, repeatable.

    Raises:
        TypeError, ValueError: ``num_threads`` is not a positive int.
    """
    check_int("num_threads", num_threads, 1)
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


class SourceListing:
    """The source code of a pecode object, displayed as a highlighted listing.

    Jupyter shows it as a Markdown code block, followed, when the listing leaves
    something out, by the full source in a collapsed dropdown. Its plain-text form is
    the code shown, so nbval compares the listing the book shows with the package's code.
    """

    def __init__(self, qualified_name: str, source: str, full_source: str | None = None) -> None:
        self.qualified_name = qualified_name
        self.source = source
        self.full_source = source if full_source is None else full_source

    def __repr__(self) -> str:
        return f"# {self.qualified_name}\n{self.source}"

    def _repr_markdown_(self) -> str:
        # a fence longer than any run of backticks in the code (a docstring may quote code)
        fence = "`" * max(3, 1 + max(map(len, re.findall("`+", self.full_source)), default=0))
        shown = f"`{self.qualified_name}`\n\n{fence}python\n{self.source}\n{fence}\n"
        if self.full_source == self.source:
            return shown
        return (
            f"{shown}\n:::{{dropdown}} Full source of `{self.qualified_name}`, with docstrings\n"
            f"{fence}python\n{self.full_source}\n{fence}\n:::\n"
        )


def show_source(
    obj: Any, *, members: Sequence[str] | None = None, docstrings: bool = False
) -> SourceListing:
    """Show the source of a pecode function, class or method in a notebook.

    The book never copies code into its pages: it shows the package's own source,
    so the two cannot drift apart. A listing shows the code that carries the idea:
    docstrings are left out unless asked for, a class may be shown by a few of its
    methods, and the full source is one click away (a collapsed dropdown).

    Args:
        obj: a function, class, method or module defined in pecode.
        members: for a class, the names of the methods to show, in this order,
            under the class statement; ``None`` shows the whole class.
        docstrings: keep the docstrings in the listing.

    Returns:
        A :class:`SourceListing` that Jupyter renders as a Python code block.

    Raises:
        TypeError: ``obj`` has no Python source (a builtin, an instance) or is not
            part of pecode, or ``members`` is given for something other than a class.
        ValueError: ``members`` is empty, repeats a name or names no method defined in
            the class body; or a docstring to leave out shares its line with code.
    """
    module = inspect.getmodule(obj)
    if module is None or not (module.__name__ == "pecode" or module.__name__.startswith("pecode.")):
        raise TypeError(f"obj must be defined in pecode, got {obj!r}")
    try:
        full = textwrap.dedent(inspect.getsource(obj)).rstrip("\n")
    except (TypeError, OSError) as err:
        raise TypeError(f"obj has no source code to show: {obj!r}") from err
    name = getattr(obj, "__qualname__", getattr(obj, "__name__", repr(obj)))
    qualified = name if inspect.ismodule(obj) else f"{module.__name__}.{name}"
    shown = full
    if members is not None:
        if not inspect.isclass(obj):
            raise TypeError(f"members is for a class, got {qualified}")
        shown = _class_with_members(full, members, qualified)
    if not check_bool("docstrings", docstrings):
        shown = _without_docstrings(shown)
    return SourceListing(qualified, shown, full)


def _class_with_members(source: str, members: Sequence[str], qualified: str) -> str:
    """The class statement of ``source`` and the methods named in ``members``.

    A name defined more than once (a property's getter and setter) shows every
    definition, in source order; decorators stay with their method.
    """
    if isinstance(members, str) or not members:
        raise ValueError(f"members must be a non-empty list of method names, got {members!r}")
    if len(set(members)) != len(members):
        raise ValueError(f"members must name each method once, got {list(members)}")
    lines = source.splitlines()
    cls = ast.parse(source).body[0]
    assert isinstance(cls, ast.ClassDef)  # getsource of a class starts with it
    methods: dict[str, list[ast.FunctionDef | ast.AsyncFunctionDef]] = {}
    for node in cls.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            methods.setdefault(node.name, []).append(node)
    missing = [member for member in members if member not in methods]
    if missing:
        raise ValueError(f"members {missing} are not methods defined in {qualified}")
    first = cls.body[0]
    header = lines[: _first_line(first) - 1]
    if _docstring(cls) is not None:  # the class docstring stays with the class statement
        header = lines[: first.end_lineno]
    indent = " " * first.col_offset
    parts = ["\n".join([*header, f"{indent}# ... (other members: see the full source)"])]
    for member in members:
        for node in methods[member]:
            parts.append("\n".join(lines[_first_line(node) - 1 : node.end_lineno]))
    return "\n\n".join(parts)


def _first_line(node: ast.stmt) -> int:
    """The first line of a statement, its decorators included."""
    decorators = getattr(node, "decorator_list", [])
    return min([node.lineno] + [decorator.lineno for decorator in decorators])


def _docstring(node: ast.AST) -> ast.Expr | None:
    """The docstring statement of a module, class or function node, if it has one."""
    if not isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        return None
    body = node.body
    if not body or not isinstance(body[0], ast.Expr):
        return None
    value = body[0].value
    return body[0] if isinstance(value, ast.Constant) and isinstance(value.value, str) else None


def _without_docstrings(source: str) -> str:
    """``source`` with the lines of every docstring removed (``...`` where one was a body)."""
    lines = source.splitlines()
    replace: dict[int, str | None] = {}  # 0-based line -> None (drop) or a new line
    for node in ast.walk(ast.parse(source)):
        doc = _docstring(node)
        if doc is None:
            continue
        before = lines[doc.lineno - 1][: doc.col_offset]
        after = lines[doc.end_lineno - 1][doc.end_col_offset :]
        if before.strip() or after.strip():  # `def f(): """doc"""`, `"""doc"""; x = 1`
            raise ValueError(
                f"a docstring shares its line with code (line {doc.lineno}): "
                "show this object with docstrings=True"
            )
        for line in range(doc.lineno - 1, doc.end_lineno):
            replace[line] = None
        if doc.end_lineno < len(lines) and not lines[doc.end_lineno].strip():
            replace[doc.end_lineno] = None  # the blank line that set the docstring apart
        if len(node.body) == 1:  # the docstring was the whole body: keep it valid Python
            replace[doc.lineno - 1] = " " * doc.col_offset + "..."
    kept = [replace.get(i, line) for i, line in enumerate(lines)]
    return "\n".join(line for line in kept if line is not None)


class Table:
    """Rows of results, shown by Jupyter as a rendered table instead of printed text.

    Cells are shown as ``str(cell)`` (format numbers before); in the book each cell is
    Markdown, so ``$...$`` is math and ``*...*`` emphasis, and ``|`` is escaped. The
    plain-text form, what a terminal and nbval's comparison see, is the same table with
    aligned columns: the first left-aligned, the others right-aligned, as numbers are.

    Args:
        header: the column names.
        rows: one sequence of cells per row, each as long as ``header``.

    Raises:
        TypeError: ``header`` or a row is a string (a sequence of cells is needed).
        ValueError: ``header`` is empty, a row has another number of cells, or a cell
            holds a line break.
    """

    def __init__(self, header: Sequence[object], rows: Iterable[Sequence[object]]) -> None:
        if isinstance(header, str):
            raise TypeError(f"header must be a sequence of column names, got {header!r}")
        self.header = [str(cell) for cell in header]
        self.rows = []
        for row in rows:
            if isinstance(row, str):
                raise TypeError(f"rows must be sequences of cells, got the string {row!r}")
            self.rows.append([str(cell) for cell in row])
        if not self.header:
            raise ValueError("header must name at least one column")
        for row in self.rows:
            if len(row) != len(self.header):
                raise ValueError(
                    f"rows must have {len(self.header)} cells (the header's), got {row}"
                )
        for cell in [*self.header, *(cell for row in self.rows for cell in row)]:
            if "\n" in cell:
                raise ValueError(f"a cell must hold one line, got {cell!r}")

    def __repr__(self) -> str:
        lines = [self.header, *self.rows]
        widths = [max(len(line[i]) for line in lines) for i in range(len(self.header))]
        return "\n".join(
            "  ".join(
                cell.ljust(width) if i == 0 else cell.rjust(width)
                for i, (cell, width) in enumerate(zip(line, widths, strict=True))
            ).rstrip()
            for line in lines
        )

    def _repr_markdown_(self) -> str:
        def row(cells: list[str]) -> str:
            return "| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |"

        rule = "|" + "|".join([" --- "] + [" ---: "] * (len(self.header) - 1)) + "|"
        return "\n".join([row(self.header), rule, *map(row, self.rows)]) + "\n"
