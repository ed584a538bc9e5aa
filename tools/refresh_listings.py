"""Rewrite the outputs of the notebooks' ``pecode.show_source(...)`` cells, and only those.

Usage: python tools/refresh_listings.py [notebooks/NN_topic.ipynb ...]   (default: all)

A listing's output is the package's source as ``show_source`` renders it: after an edit to
pecode, or to a listing's arguments, this brings the listings up to date without
re-running a notebook (chapters 13 and 14 train for minutes). nbval then checks the result
like any other output. In a listing cell (``listing_calls``), each call's ``obj`` is a name
the notebook imports or a dotted path from ``pecode``, and its keyword arguments are
literals. The cell's execution count is kept.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import nbformat

import pecode

ROOT = Path(__file__).resolve().parents[1]


def without_magics(source: str) -> str:
    """A cell's Python: IPython's line magics (``%config ...``, ``!pip ...``) left out."""
    return "\n".join(
        "" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()
    )


def imports_of(nb: nbformat.NotebookNode) -> dict[str, object]:
    """The names a notebook's code cells import (their import statements alone, run here)."""
    namespace: dict[str, object] = {}
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        tree = ast.parse(without_magics(cell.source))
        statements = [node for node in tree.body if isinstance(node, ast.Import | ast.ImportFrom)]
        if statements:
            code = compile(ast.Module(body=statements, type_ignores=[]), "<imports>", "exec")
            exec(code, namespace)  # the notebook's own import statements
    return namespace


def listing_calls(source: str) -> list[tuple[ast.Call, str]] | None:
    """The ``pecode.show_source(...)`` calls a listing cell consists of, or None.

    A listing cell holds import statements, then ``display(pecode.show_source(...))``
    lines, each a ``display_data`` output, and may end with a bare
    ``pecode.show_source(...)``, the cell's ``execute_result``.
    """
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    calls = []
    body = [node for node in tree.body if not isinstance(node, ast.Import | ast.ImportFrom)]
    for index, node in enumerate(body):
        value = node.value if isinstance(node, ast.Expr) else None
        kind = "execute_result"
        if isinstance(value, ast.Call) and ast.unparse(value.func) == "display":
            value, kind = (value.args[0] if len(value.args) == 1 else None), "display_data"
        last = index == len(body) - 1
        if not (isinstance(value, ast.Call) and ast.unparse(value.func) == "pecode.show_source"):
            return None
        if kind == "execute_result" and not last:
            return None
        calls.append((value, kind))
    return calls or None


def render(
    call: ast.Call, namespace: dict[str, object], **override: object
) -> pecode.SourceListing:
    """The listing a cell shows (``override``: keyword arguments to use instead)."""
    if len(call.args) != 1:
        raise SystemExit(f"a listing takes one object: {ast.unparse(call)}")
    obj = eval(ast.unparse(call.args[0]), dict(namespace, pecode=pecode))
    keywords = {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    return pecode.show_source(obj, **{**keywords, **override})


def refresh(path: Path) -> int:
    nb = nbformat.read(path, as_version=4)
    namespace = imports_of(nb)
    changed = 0
    for cell in nb.cells:
        calls = listing_calls(cell.source) if cell.cell_type == "code" else None
        if calls is None:
            if cell.cell_type == "code" and "show_source" in cell.source:
                raise SystemExit(
                    f"{path}: a cell calls show_source in a form not understood "
                    f"here (see listing_calls):\n{cell.source}"
                )
            continue
        outputs = []
        for call, kind in calls:
            listing = render(call, namespace)
            data = {"text/markdown": listing._repr_markdown_(), "text/plain": repr(listing)}
            if kind == "execute_result" and cell.execution_count is not None:
                outputs.append(
                    nbformat.v4.new_output(kind, data=data, execution_count=cell.execution_count)
                )
            else:
                outputs.append(nbformat.v4.new_output("display_data", data=data))
        if cell.outputs != outputs:
            cell.outputs = outputs
            changed += 1
    if changed:
        nbformat.write(nb, path)
    return changed


def main(argv: list[str]) -> None:
    paths = [Path(a) for a in argv] or sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))
    for path in paths:
        print(f"{path}: {refresh(path)} listing(s) rewritten")


if __name__ == "__main__":
    main(sys.argv[1:])
