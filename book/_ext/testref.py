"""Evidence a reader can open: the ``{test}`` role and the book's pages of tests.

**The role.** Write ``{test}`tests/test_rope.py::test_relative_identity``` (a class method
as ``tests/file.py::TestClass::test_name``, a parametrized case as ``...::test_name[rope]``),
or ``{test}`title <tests/...>``` to show a short title instead of the id (in a table cell,
say). The role renders the id (or the title) as code, linked to the test's section on the
book's page for its file, and the build warns (an error under ``-W``) when the file or the
test does not exist, so a page cannot cite evidence that is not there.

**The pages.** When the builder starts, this extension (re)writes one page per Python file
directly in ``tests/``: ``book/checks/tests/<name>.md`` for a test file, and
``book/checks/helpers/<name>.md`` for a helper module the tests import. Both folders are
generated at every build and git-ignored; ``_toc.yml`` takes them in by globs under the
committed index ``book/checks/index.md``, and pages of files that no longer exist are
deleted. A page holds only headings, labels and directives: the ``test-source`` directive
reads the code from the test file while the page is read, and the role records the test
file as a dependency of the page that cites it, so neither the pages nor the links can
drift from the tests.

A page shows every line of its file exactly once, with the file's own line numbers: first
each test (its decorators, parametrize lists included, its body, and the comments just
above it), then the module code (docstring, imports, helpers, constants, fixtures). Each
test's section has the label ``tests/<file>.py::<test>`` (the test id without its
parameters, as Sphinx stores labels: lowercase), lists the module code it uses, directly or
through other helpers, with links, and links the lines on GitHub as a secondary pointer.
"""

from __future__ import annotations

import ast
import os
import re
import tempfile
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

from docutils import nodes
from docutils.parsers.rst import directives
from sphinx import addnodes
from sphinx.util import logging
from sphinx.util.docutils import SphinxDirective, SphinxRole
from sphinx.util.nodes import make_refnode

logger = logging.getLogger(__name__)

TESTS_DIR = "tests"
TITLED = re.compile(r"^(?P<title>.*?)\s*<(?P<target>[^<>]+)>$")
TEST_ID = re.compile(r"^(?P<file>tests/\w+\.py)::(?P<names>\w+(?:::\w+)?)(?P<param>\[[^\]]*\])?$")
# pending_xref type resolved by _resolve_reference (no domain: only this extension handles it)
XREF_TYPE = "testref"
GENERATED = "% Generated from {file} by book/_ext/testref.py at every build: do not edit."


def is_test_file(file: str) -> bool:
    """Whether pytest collects ``file`` (``test_*.py``); other files are helper modules."""
    return Path(file).name.startswith("test_")


def label(file: str, key: str = "") -> str:
    """The label of a file's page, or of the section of ``key`` (a test or a helper) on it."""
    return (f"{file}::{key}" if key else file).lower()


@dataclass(frozen=True)
class Segment:
    """A run of lines of a test file shown as one block: a test, or a piece of module code."""

    key: str  # test name, ``Class::test_name``, helper name, or ``L<line>``
    title: str
    is_test: bool
    start: int  # first and last line shown, 1-based
    end: int
    def_line: int  # the ``def`` line (what locate_test returns for a test)
    names: tuple[str, ...]  # module-level names it binds (each gets a label)
    uses: tuple[str, ...]  # labels of the module code it refers to directly
    pecode: tuple[str, ...]  # pecode objects it refers to by imported name, full names


@dataclass(frozen=True)
class TestFile:
    file: str  # "tests/test_x.py"
    summary: str  # first paragraph of the module docstring
    lines: tuple[str, ...]
    segments: tuple[Segment, ...]

    @property
    def tests(self) -> list[Segment]:
        return [s for s in self.segments if s.is_test]

    def segment(self, key: str) -> Segment | None:
        return next((s for s in self.segments if s.key == key), None)

    def closure(self, segment: Segment) -> tuple[list[str], list[str]]:
        """Labels of the module code ``segment`` uses, directly or not, and its pecode names."""
        own = {label(self.file, n): s for s in self.segments for n in (s.key, *s.names)}
        seen: list[str] = []
        pecode: set[str] = set(segment.pecode)
        todo = list(segment.uses)
        while todo:
            target = todo.pop(0)
            if target in seen:
                continue
            seen.append(target)
            helper = own.get(target)
            if helper is not None and helper is not segment:
                todo.extend(helper.uses)
                pecode.update(helper.pecode)
        order = {label(self.file, s.key): i for i, s in enumerate(self.segments)}
        # one label per segment (the first name that reached it), in file order
        unique: dict[int, str] = {}
        external: list[str] = []
        for target in seen:
            helper = own.get(target)
            if helper is None:
                external.append(target)
            elif helper is not segment:
                unique.setdefault(order[label(self.file, helper.key)], target)
        return [unique[i] for i in sorted(unique)] + external, sorted(pecode)


def _is_test_class(node: ast.stmt) -> bool:
    return isinstance(node, ast.ClassDef) and node.name.startswith("Test")


def _is_function(node: ast.AST) -> bool:
    return isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)


def _bound_names(node: ast.stmt) -> list[str]:
    """Module-level names a statement binds (imports excluded)."""
    if _is_function(node) or isinstance(node, ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.Import | ast.ImportFrom):
        return []
    # a comprehension's variables are its own, not the module's
    local = {
        sub.id
        for comprehension in ast.walk(node)
        if isinstance(comprehension, ast.comprehension)
        for sub in ast.walk(comprehension.target)
        if isinstance(sub, ast.Name)
    }
    names = []
    for sub in ast.walk(node):
        if (
            isinstance(sub, ast.Name)
            and isinstance(sub.ctx, ast.Store)
            and sub.id not in names
            and sub.id not in local
        ):
            names.append(sub.id)
    return names


def _references(node: ast.stmt) -> tuple[set[str], set[str]]:
    """Free names a statement reads (its own locals excluded) and the ``self.x`` it reads."""
    loads, stores, attributes = set(), set(), set()
    for sub in ast.walk(node):
        if isinstance(sub, ast.Name):
            (loads if isinstance(sub.ctx, ast.Load) else stores).add(sub.id)
        elif isinstance(sub, ast.arg):
            stores.add(sub.arg)
        elif (
            isinstance(sub, ast.Attribute)
            and isinstance(sub.value, ast.Name)
            and sub.value.id in {"self", "cls"}
        ):
            attributes.add(sub.attr)
    if _is_function(node) or isinstance(node, ast.ClassDef):
        stores.discard(node.name)
    return loads - stores, attributes


@lru_cache(maxsize=256)
def _analyse(file: str, text: str, siblings: frozenset[str]) -> TestFile:
    """The segments of ``file``; ``siblings`` holds ``module.name`` for what the other
    modules of ``tests/`` define (an import of one of those links to its section)."""
    try:
        tree = ast.parse(text, filename=file)
    except SyntaxError as error:
        raise ValueError(f"{file} does not parse: {error}") from error
    lines = tuple(text.splitlines())
    docstring = ast.get_docstring(tree) or ""
    summary = " ".join(docstring.split("\n\n", 1)[0].split())

    # The leaves: top-level statements, with test classes opened into their members.
    leaves: list[tuple[ast.stmt, str | None]] = []
    for node in tree.body:
        if _is_test_class(node):
            leaves.extend((item, node.name) for item in node.body)
        else:
            leaves.append((node, None))
    # The docstring and the imports at the top form one leaf group.
    header = 0
    while header < len(leaves) and leaves[header][1] is None:
        node = leaves[header][0]
        is_docstring = header == 0 and isinstance(node, ast.Expr) and docstring
        if not (is_docstring or isinstance(node, ast.Import | ast.ImportFrom)):
            break
        header += 1
    groups = [leaves[:header]] if header else []
    groups += [[leaf] for leaf in leaves[header:]]

    # What module-level names mean: helpers of this file, helpers of a sibling module,
    # pecode objects; fixtures are functions decorated with a fixture decorator.
    binders: dict[str, str] = {}
    pecode_names: dict[str, str] = {}
    fixtures: set[str] = set()
    class_members: dict[str, dict[str, str]] = {}
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                name = alias.asname or alias.name
                if f"{node.module}.{alias.name}" in siblings:
                    binders[name] = label(f"{TESTS_DIR}/{node.module}.py", alias.name)
                elif node.module.split(".")[0] == "pecode":
                    pecode_names[name] = f"{node.module}.{alias.name}"
        if _is_function(node) and any("fixture" in ast.unparse(d) for d in node.decorator_list):
            fixtures.add(node.name)

    segments: list[Segment] = []
    taken: set[str] = set()  # labels given out; Sphinx compares them in lowercase
    previous_end = 0
    for index, group in enumerate(groups):
        first, cls = group[0]
        last = group[-1][0]
        start = previous_end + 1
        end = len(lines) if index == len(groups) - 1 else last.end_lineno
        previous_end = last.end_lineno
        while start < end and not lines[start - 1].strip():
            start += 1
        while end > start and not lines[end - 1].strip():
            end -= 1
        bound: list[str] = []  # the module-level names it binds
        is_test = _is_function(first) and first.name.startswith("test") and len(group) == 1
        if index == 0 and header:
            parts = ["Docstring"] * bool(docstring) + ["imports"] * (len(group) > bool(docstring))
            key, title = "header", " and ".join(parts).capitalize()
        elif _is_function(first) or isinstance(first, ast.ClassDef):
            key = title = f"{cls}::{first.name}" if cls else first.name
            bound = [] if cls else [first.name]
        elif cls is None and (bound := _bound_names(first)):
            key, title = bound[0], ", ".join(bound)
        else:
            key = f"{cls}::L{start}" if cls else f"L{start}"
            title = f"{cls}, lines {start}–{end}" if cls else f"Lines {start}–{end}"
        if label(file, key) in taken:  # a name bound again, or two names equal but for case
            key = f"{key}-L{start}"
        taken.add(label(file, key))
        # the other names it binds get a label here unless an earlier segment has it
        names = [n for n in bound if label(file, n) not in taken]
        taken.update(label(file, n) for n in names)
        for name in bound:  # a use of a name links to its first binding
            binders.setdefault(name, label(file, key))
        if cls and not is_test and _is_function(first):
            class_members.setdefault(cls, {})[first.name] = key
        segments.append(
            Segment(key, title, is_test, start, end, first.lineno, tuple(names), (), ())
        )

    # Second pass: what each segment refers to (needs every binder).
    resolved: list[Segment] = []
    for segment, group in zip(segments, groups, strict=True):
        if segment.key == "header":
            resolved.append(segment)
            continue
        node, cls = group[0]
        free, attributes = _references(node)
        if _is_function(node):
            free |= {a.arg for a in node.args.args if a.arg in fixtures}
        own = {label(file, n) for n in (segment.key, *segment.names)}
        uses = {binders[n] for n in free if n in binders} - own
        if cls:
            members = class_members.get(cls, {})
            uses |= {label(file, members[a]) for a in attributes if a in members} - own
        pecode = tuple(sorted(pecode_names[n] for n in free if n in pecode_names))
        resolved.append(replace(segment, uses=tuple(sorted(uses)), pecode=pecode))
    return TestFile(file, summary, lines, tuple(resolved))


def analyse(root: Path, file: str) -> TestFile:
    """Parse ``root/file`` into the segments its page shows; ValueError if it does not parse."""
    path = root / file
    text = path.read_text(encoding="utf-8")
    siblings: set[str] = set()  # "module.name" for what the other files of tests/ define
    for module in re.findall(r"(?m)^from (\w+) import", text):
        sibling = path.parent / f"{module}.py"
        if sibling.is_file() and sibling != path:
            try:
                info = _analyse(
                    f"{TESTS_DIR}/{sibling.name}", sibling.read_text("utf-8"), frozenset()
                )
            except ValueError:
                continue
            siblings.update(f"{module}.{n}" for s in info.segments for n in (s.key, *s.names))
    return _analyse(file, text, frozenset(siblings))


def locate_test(root: Path, test_id: str) -> tuple[str, int]:
    """Return (file, line of the ``def``) of ``test_id`` under ``root``; ValueError if absent."""
    match = TEST_ID.match(test_id)
    if match is None:
        raise ValueError(f"not a test id of the form tests/<file>.py::<name>: {test_id!r}")
    path = root / match["file"]
    if not path.is_file():
        raise ValueError(f"no such test file: {match['file']}")
    info = analyse(root, match["file"])
    segment = info.segment(match["names"])
    if segment is None or not segment.is_test:
        what = "no test" if segment is None else "a helper, not a test"
        raise ValueError(f"{match['file']} defines {what} {match['names']!r}")
    return match["file"], segment.def_line


def page_path(pages_dir: Path, file: str) -> Path:
    """Where the page of ``file`` goes: ``tests/`` for test files, ``helpers/`` for the rest."""
    return pages_dir / ("tests" if is_test_file(file) else "helpers") / f"{Path(file).stem}.md"


def _fence(directive: str, argument: str) -> list[str]:
    return [f"```{{{directive}}} {argument}", "```", ""]


def page_text(info: TestFile) -> str:
    """The MyST source of the page of one test file: headings, labels and directives."""
    out = [GENERATED.format(file=info.file), "", f"({label(info.file)})=", f"# `{info.file}`", ""]
    out += _fence("test-file", info.file)

    def section(segment: Segment) -> list[str]:
        targets = [label(info.file, segment.key)]
        targets += [label(info.file, n) for n in segment.names if n != segment.key]
        return [
            *(f"({t})=" for t in targets),
            f"### `{segment.title}`",
            "",
            *_fence("test-source", f"{info.file}::{segment.key}"),
        ]

    if info.tests:
        out += ["## Tests", ""]
        for segment in info.tests:
            out += section(segment)
    code = [s for s in info.segments if not s.is_test]
    if code:
        out += ["## Module code" if info.tests else "## Code", ""]
        for segment in code:
            out += section(segment)
    return "\n".join(out).rstrip() + "\n"


def _write(path: Path, text: str) -> None:
    """Write atomically, and only if the text changed (an unchanged page is not re-read)."""
    if path.is_file() and path.read_text(encoding="utf-8") == text:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
    with os.fdopen(handle, "w", encoding="utf-8") as stream:
        stream.write(text)
    os.replace(temporary, path)


def source_files(root: Path) -> list[str]:
    """The Python files directly in ``tests/``, as ``tests/<name>.py``."""
    return [
        f"{TESTS_DIR}/{p.name}"
        for p in sorted((root / TESTS_DIR).glob("*.py"))
        if p.name != "__init__.py"
    ]


def write_pages(root: Path, pages_dir: Path) -> list[Path]:
    """(Re)write the page of every file in ``tests/``, delete stale pages; return the pages."""
    wanted: dict[Path, str] = {}
    for file in source_files(root):
        try:
            wanted[page_path(pages_dir, file)] = page_text(analyse(root, file))
        except ValueError as error:
            logger.warning("{test} pages: %s", error)
    for folder in ("tests", "helpers"):
        for stale in (pages_dir / folder).glob("*.md"):
            if stale not in wanted:
                stale.unlink(missing_ok=True)
    for path, text in wanted.items():
        _write(path, text)
    return list(wanted)


def _repository(config) -> tuple[str, str]:
    base = config.testref_repository_url or config.html_theme_options.get("repository_url", "")
    branch = config.html_theme_options.get("repository_branch") or "main"
    return base.rstrip("/"), branch


def _xref(target: str, content: nodes.Node, **attributes) -> addnodes.pending_xref:
    """A link to a label, resolved by _resolve_reference with ``content`` kept as it is."""
    return addnodes.pending_xref(
        "", content, refdomain="", reftype=XREF_TYPE, reftarget=target, **attributes
    )


def _inline(text: str) -> list[nodes.Node]:
    """Docstring text as nodes: ````code```` and ```code``` become literals, the rest text."""
    out: list[nodes.Node] = []
    position = 0
    for match in re.finditer(r"``(.+?)``|`([^`]+)`", text):
        out.append(nodes.Text(text[position : match.start()]))
        code = match[1] or match[2]
        out.append(nodes.literal(code, code))
        position = match.end()
    out.append(nodes.Text(text[position:]))
    return out


class TestRole(SphinxRole):
    def run(self) -> tuple[list[nodes.Node], list[nodes.system_message]]:
        text = self.text.strip()
        titled = TITLED.match(text)
        test_id = titled["target"].strip() if titled else text
        title = titled["title"] if titled and titled["title"] else test_id
        literal = nodes.literal(title, title)
        root = Path(self.env.srcdir)
        try:
            file, _ = locate_test(root, test_id)
        except ValueError as error:
            logger.warning("{test} role: %s", error, location=self.get_location())
            return [literal], []
        # The page that cites a test is read again when the test file changes.
        self.env.note_dependency(str(root / file))
        self.env.note_dependency(__file__)  # and when this extension changes
        names = TEST_ID.match(test_id)["names"]
        return [_xref(label(file, names), literal, reftitle=test_id)], []


class _TestFileDirective(SphinxDirective):
    required_arguments = 1

    def info(self) -> TestFile | None:
        file = self.arguments[0].split("::")[0]
        root = Path(self.env.srcdir)
        if not (root / file).is_file():
            logger.warning("no such test file: %s", file, location=self.get_location())
            return None
        self.env.note_dependency(str(root / file))
        self.env.note_dependency(__file__)
        try:
            return analyse(root, file)
        except ValueError as error:
            logger.warning("%s", error, location=self.get_location())
            return None

    def github(self, file: str, start: int = 0, end: int = 0) -> nodes.Node | None:
        base, branch = _repository(self.config)
        if not base:
            return None
        anchor = f"#L{start}-L{end}" if start else ""
        return nodes.reference(
            "", "view on GitHub", refuri=f"{base}/blob/{branch}/{file}{anchor}", internal=False
        )


class TestFileDirective(_TestFileDirective):
    """The head of a file's page: what the file checks, its counts, how to run it."""

    def run(self) -> list[nodes.Node]:
        info = self.info()
        if info is None:
            return []
        paragraph = nodes.paragraph()
        count = len(info.tests)
        if is_test_file(info.file):
            run = f"pytest {info.file}"
            paragraph += nodes.Text(f"{count} test function{'s' * (count != 1)}, run with ")
            paragraph += nodes.literal(run, run)
            paragraph += nodes.Text(". ")
        else:
            paragraph += nodes.Text("A helper module the tests import. ")
        paragraph += nodes.Text(
            f"Every line of the file, {len(info.lines)} lines, as it was when the book was built"
        )
        github = self.github(info.file)
        if github is not None:
            paragraph += [nodes.Text(" ("), github, nodes.Text(")")]
        paragraph += nodes.Text(".")
        return [nodes.paragraph("", "", *_inline(info.summary)), paragraph]


class TestSourceDirective(_TestFileDirective):
    """One test (or piece of module code) of a file: where it is, what it uses, its code."""

    def run(self) -> list[nodes.Node]:
        info = self.info()
        if info is None:
            return []
        key = self.arguments[0].split("::", 1)[1]
        segment = info.segment(key)
        if segment is None:
            logger.warning("%s has no %r", info.file, key, location=self.get_location())
            return []
        where = nodes.paragraph()
        span = f"lines {segment.start}–{segment.end}"
        if segment.end == segment.start:
            span = f"line {segment.start}"
        where += nodes.Text(f"{info.file}, {span}")
        github = self.github(info.file, segment.start, segment.end)
        if github is not None:
            where += [nodes.Text(" ("), github, nodes.Text(")")]
        where += nodes.Text(".")
        result: list[nodes.Node] = [where]
        if segment.is_test:
            uses, pecode = info.closure(segment)
        else:
            uses, pecode = list(segment.uses), list(segment.pecode)
        if uses or pecode:
            used = nodes.paragraph()
            if uses:
                # a test lists the helpers it reaches through other helpers too
                used += nodes.Text("Uses " + ("the module code " if segment.is_test else ""))
                for index, target in enumerate(uses):
                    shown = self._title(info, target)
                    literal = nodes.literal(shown, shown)
                    link = _xref(target, literal, reftitle=shown)
                    used += [nodes.Text(", " if index else ""), link]
                used += nodes.Text(". ")
            if pecode:
                used += nodes.Text("Uses from pecode: ")
                for index, full in enumerate(pecode):
                    short = full.rsplit(".", 1)[1]
                    literal = nodes.literal(short, short)
                    used += [nodes.Text(", " if index else ""), _xref(full, literal, pecode=True)]
                used += nodes.Text(".")
            result.append(used)
        code = "\n".join(info.lines[segment.start - 1 : segment.end])
        block = nodes.literal_block(code, code, language="python", linenos=True)
        block["highlight_args"] = {"linenostart": segment.start}
        self.set_source_info(block)
        result.append(block)
        return result

    @staticmethod
    def _title(info: TestFile, target: str) -> str:
        """How a used label is shown: the helper's name, with its file if it is elsewhere."""
        file, _, key = target.partition("::")
        if file == label(info.file):
            for segment in info.segments:
                if target in {label(info.file, n) for n in (segment.key, *segment.names)}:
                    return segment.title
            return key
        return f"{key} ({file})"


class TestFilesDirective(SphinxDirective):
    """The index: every test file (or, with ``:helpers:``, helper module) with its summary."""

    option_spec = {"helpers": directives.flag}  # noqa: RUF012 (docutils' own interface)

    def run(self) -> list[nodes.Node]:
        root = Path(self.env.srcdir)
        helpers = "helpers" in self.options
        items = nodes.bullet_list()
        self.env.note_dependency(__file__)
        for file in source_files(root):
            if is_test_file(file) == helpers:
                continue
            self.env.note_dependency(str(root / file))
            try:
                info = analyse(root, file)
            except ValueError:
                continue  # write_pages has warned
            paragraph = nodes.paragraph()
            paragraph += _xref(label(file), nodes.literal(file, file))
            if not helpers:
                count = len(info.tests)
                paragraph += nodes.Text(f" ({count} test function{'s' * (count != 1)})")
            paragraph += [nodes.Text(": "), *_inline(info.summary)]
            items += nodes.list_item("", paragraph)
        return [items]


def _resolve_reference(app, env, node, contnode):
    """Resolve this extension's links: labels of the test pages, and pecode's API entries."""
    if node.get("reftype") != XREF_TYPE:
        return None
    target = node["reftarget"]
    if node.get("pecode"):
        # A pecode object the API reference documents, under its full or its public name.
        module, _, name = target.rpartition(".")
        objects = env.get_domain("py").objects
        found = [
            n
            for n in objects
            if n == target or (n.startswith(f"{module}.") and n.endswith(f".{name}"))
        ]
        if len(found) != 1:
            return contnode  # not documented (a reference loop, say): shown, not linked
        entry = objects[found[0]]
        return make_refnode(app.builder, node["refdoc"], entry.docname, entry.node_id, contnode)
    docname, labelid = env.get_domain("std").anonlabels.get(target, ("", ""))
    if not docname:
        logger.warning(
            "{test} role: no page section for %s (is book/checks in _toc.yml?)",
            target,
            location=node,
        )
        return contnode
    title = node.get("reftitle", target)
    return make_refnode(app.builder, node["refdoc"], docname, labelid, contnode, title)


def _generate_pages(app) -> None:
    root = Path(app.srcdir)
    write_pages(root, root / app.config.testref_pages_dir)


def setup(app):
    app.add_config_value("testref_pages_dir", "book/checks", "env")
    app.add_config_value("testref_repository_url", "", "env")
    app.add_role("test", TestRole())
    app.add_directive("test-file", TestFileDirective)
    app.add_directive("test-source", TestSourceDirective)
    app.add_directive("test-files", TestFilesDirective)
    app.connect("builder-inited", _generate_pages)
    app.connect("missing-reference", _resolve_reference)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
