"""Sphinx role ``{test}`` that links a page to a test in ``tests/``.

Write ``{test}`tests/test_rope.py::test_relative_identity``` (a class method as
``tests/file.py::TestClass::test_name``, a parametrized case as ``...::test_name[rope]``),
or ``{test}`title <tests/...>``` to show a short title instead of the id (in a table
cell, say). The role renders the id (or the title) as code, linked to the test's line in
the repository, and the build warns (an error under ``-W``) when the file or the function
does not exist, so a page cannot cite evidence that is not there.
"""

from __future__ import annotations

import ast
import re
from functools import cache
from pathlib import Path

from docutils import nodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxRole

logger = logging.getLogger(__name__)

TITLED = re.compile(r"^(?P<title>.*?)\s*<(?P<target>[^<>]+)>$")
TEST_ID = re.compile(r"^(?P<file>tests/[\w/]+\.py)::(?P<names>[\w:]+?)(?P<param>\[[^\]]*\])?$")


@cache
def _definitions(path: Path) -> dict[str, int]:
    """Map ``name`` and ``Class::name`` of every test in ``path`` to its line number."""
    found: dict[str, int] = {}
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found[node.name] = node.lineno
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    found[f"{node.name}::{item.name}"] = item.lineno
    return found


def locate_test(root: Path, test_id: str) -> tuple[str, int]:
    """Return (file, line) of ``test_id`` under ``root``; raise ValueError if absent."""
    match = TEST_ID.match(test_id)
    if match is None:
        raise ValueError(f"not a test id of the form tests/<file>.py::<name>: {test_id!r}")
    path = root / match["file"]
    if not path.is_file():
        raise ValueError(f"no such test file: {match['file']}")
    line = _definitions(path).get(match["names"])
    if line is None:
        raise ValueError(f"{match['file']} defines no test {match['names']!r}")
    return match["file"], line


class TestRole(SphinxRole):
    def run(self) -> tuple[list[nodes.Node], list[nodes.system_message]]:
        text = self.text.strip()
        titled = TITLED.match(text)
        test_id = titled["target"].strip() if titled else text
        title = titled["title"] if titled and titled["title"] else test_id
        literal = nodes.literal(title, title)
        try:
            file, line = locate_test(Path(self.env.srcdir), test_id)
        except ValueError as error:
            logger.warning("{test} role: %s", error, location=self.get_location())
            return [literal], []
        options = self.config.html_theme_options
        base = options.get("repository_url", "").rstrip("/")
        branch = options.get("repository_branch") or "main"
        if not base:
            return [literal], []
        uri = f"{base}/blob/{branch}/{file}#L{line}"
        return [nodes.reference("", "", literal, refuri=uri, internal=False)], []


def setup(app):
    app.add_role("test", TestRole())
    return {"parallel_read_safe": True, "parallel_write_safe": True}
