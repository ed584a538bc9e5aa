"""pecode's helpers: device choice, seeding, showing source."""

from __future__ import annotations

import ast
import importlib.util
import inspect
import random
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import pecode
from pecode import attention

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location(
    "refresh_listings", ROOT / "tools" / "refresh_listings.py"
)
refresh_listings = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(refresh_listings)


def listings_in_notebooks():
    """(notebook, call, listing, listing with docstrings) of every `show_source` cell."""
    found = []
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = refresh_listings.nbformat.read(path, as_version=4)
        namespace = None
        for cell in nb.cells:
            calls = (
                refresh_listings.listing_calls(cell.source) if cell.cell_type == "code" else None
            )
            for call, _ in calls or ():
                namespace = namespace or refresh_listings.imports_of(nb)
                listing = refresh_listings.render(call, namespace)
                with_docs = refresh_listings.render(call, namespace, docstrings=True)
                found.append((path.stem, ast.unparse(call), listing, with_docs))
    return found


def test_device_is_cuda_exactly_when_available(monkeypatch):
    monkeypatch.delenv("PECODE_DEVICE", raising=False)
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert pecode.device().type == expected


def test_device_override_and_bad_override(monkeypatch):
    monkeypatch.setenv("PECODE_DEVICE", "cpu")
    assert pecode.device() == torch.device("cpu")
    monkeypatch.setenv("PECODE_DEVICE", "not-a-device")
    with pytest.raises(ValueError, match="PECODE_DEVICE"):
        pecode.device()
    if not torch.cuda.is_available():
        monkeypatch.setenv("PECODE_DEVICE", "cuda")
        with pytest.raises(ValueError, match="not available"):
            pecode.device()


def test_set_seed_makes_every_generator_repeat():
    def draw():
        return random.random(), np.random.rand(), torch.rand(3)  # noqa: NPY002

    generator = pecode.set_seed(123)
    first, first_gen = draw(), torch.rand(2, generator=generator)
    generator = pecode.set_seed(123)
    second, second_gen = draw(), torch.rand(2, generator=generator)
    assert first[:2] == second[:2]
    assert torch.equal(first[2], second[2])
    assert torch.equal(first_gen, second_gen)
    pecode.set_seed(124)
    assert not torch.equal(torch.rand(3), first[2])


@pytest.mark.parametrize(("seed", "error"), [(-1, ValueError), (1.5, TypeError), (True, TypeError)])
def test_set_seed_rejects_bad_seeds(seed, error):
    with pytest.raises(error, match="seed"):
        pecode.set_seed(seed)


def test_show_source_with_docstrings_is_the_package_source():
    listing = pecode.show_source(attention.causal_mask, docstrings=True)
    assert listing.source == inspect.getsource(attention.causal_mask).rstrip("\n")
    assert listing.full_source == listing.source
    assert listing.qualified_name == "pecode.attention.causal_mask"
    markdown = listing._repr_markdown_()
    assert markdown.count("```") == 2  # nothing left out: no full-source dropdown
    assert "def causal_mask(" in markdown
    assert repr(listing).startswith("# pecode.attention.causal_mask\ndef causal_mask(")


def test_show_source_dedents_methods():
    listing = pecode.show_source(attention.MultiHeadAttention.forward)
    assert listing.source.startswith("def forward(")
    assert listing.qualified_name == "pecode.attention.MultiHeadAttention.forward"


def test_a_shortened_listing_has_the_full_source_in_a_dropdown():
    listing = pecode.show_source(attention.causal_mask)
    assert '"""' not in listing.source
    assert listing.full_source == inspect.getsource(attention.causal_mask).rstrip("\n")
    markdown = listing._repr_markdown_()
    shown, dropdown = markdown.split(":::{dropdown}")
    assert listing.source in shown
    assert listing.full_source in dropdown
    assert dropdown.rstrip().endswith(":::")


class _DropDocstrings(ast.NodeTransformer):
    """An independent docstring remover, on the syntax tree rather than on lines."""

    def _strip(self, node):
        self.generic_visit(node)
        body = node.body
        first = body[0].value if body and isinstance(body[0], ast.Expr) else None
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            node.body = body[1:] or [ast.Expr(ast.Constant(Ellipsis))]
        return node

    visit_Module = visit_ClassDef = visit_FunctionDef = visit_AsyncFunctionDef = _strip


def _tree(source: str, strip: bool = False) -> str:
    tree = ast.parse(source)
    return ast.dump(_DropDocstrings().visit(tree) if strip else tree)


LISTINGS = listings_in_notebooks()


IDS = [f"{notebook}: {call}" for notebook, call, _, _ in LISTINGS]


@pytest.mark.parametrize(("notebook", "call", "listing", "with_docs"), LISTINGS, ids=IDS)
def test_every_listing_of_the_book_is_its_source_without_docstrings(
    notebook, call, listing, with_docs
):
    """Compared on the syntax tree: no line of code lost with a docstring, nothing added."""
    assert _tree(listing.source) == _tree(with_docs.source, strip=True)
    assert '"""' not in listing.source
    if "members=" not in call:
        assert with_docs.source == listing.full_source


@pytest.mark.parametrize(("notebook", "call", "listing", "with_docs"), LISTINGS, ids=IDS)
def test_every_listing_of_the_book_is_at_most_40_lines(notebook, call, listing, with_docs):
    """A listing shows the code that carries the idea; the rest is one click away."""
    assert len(listing.source.splitlines()) <= 40, f"{notebook}: {call}"


def test_the_book_has_listings():
    assert len(LISTINGS) > 30
    assert any("members=" in call for _, call, _, _ in LISTINGS)


def test_the_syntax_tree_comparison_notices_a_lost_line():
    """The check above can fail: one code line dropped with a docstring changes the tree."""
    listing = pecode.show_source(attention.causal_mask)
    lines = listing.source.splitlines()
    shorter = "\n".join(lines[:-2] + lines[-1:])
    assert _tree(shorter) != _tree(listing.full_source, strip=True)


def test_members_show_the_class_statement_and_those_methods():
    from pecode.rope import RotaryEmbedding

    listing = pecode.show_source(RotaryEmbedding, members=["transform_qk", "forward"])
    tree = ast.parse(listing.source)
    (cls,) = tree.body
    assert isinstance(cls, ast.ClassDef)
    assert cls.name == "RotaryEmbedding"
    methods = [node for node in cls.body if isinstance(node, ast.FunctionDef)]
    assert [m.name for m in methods] == ["transform_qk", "forward"]
    for method in methods:
        own = textwrap.dedent(inspect.getsource(getattr(RotaryEmbedding, method.name)))
        expected = _DropDocstrings().visit(ast.parse(own)).body[0]
        assert ast.dump(method) == ast.dump(expected)
    assert "other members" in listing.source
    assert listing.full_source == textwrap.dedent(inspect.getsource(RotaryEmbedding)).rstrip()


@pytest.mark.parametrize(
    ("obj", "members", "error", "match"),
    [
        (attention.causal_mask, ["x"], TypeError, "members is for a class"),
        (attention.KVCache, [], ValueError, "members"),
        (attention.KVCache, "append", ValueError, "members"),
        (attention.KVCache, ["append", "pop"], ValueError, r"\['pop'\]"),
    ],
)
def test_show_source_refuses_bad_members(obj, members, error, match):
    with pytest.raises(error, match=match):
        pecode.show_source(obj, members=members)


@pytest.mark.parametrize("obj", [len, np.zeros, 3])
def test_show_source_refuses_non_pecode_objects(obj):
    with pytest.raises(TypeError, match="obj"):
        pecode.show_source(obj)


# -- Table: results as a rendered table --------------------------------------------------------


def test_table_markdown_reads_back_as_its_cells():
    """Read with the tests' own pipe-table parser (tests/markdown_tables.py)."""
    from markdown_tables import table_by_header

    rows = [["rope", "1.00 ± 0.00", "a | b"], ["rope+yarn_paper", "n/a", "< 0: True"]]
    table = pecode.Table(["model", "copy 1L", "verdict"], rows)
    parsed = table_by_header(table._repr_markdown_(), "model", "copy 1L", "verdict")
    assert parsed == {"rope": ["1.00 ± 0.00", r"a \| b"], "rope+yarn_paper": ["n/a", "< 0: True"]}


def test_table_plain_text_has_aligned_columns():
    table = pecode.Table(["model", "copy 2L"], [["rope", 0.77], ["rope+yarn_frequencies", "1.00"]])
    lines = repr(table).splitlines()
    assert lines == [
        "model                  copy 2L",
        "rope                      0.77",
        "rope+yarn_frequencies     1.00",
    ]


@pytest.mark.parametrize(
    ("header", "rows", "match"),
    [([], [], "header"), (["a", "b"], [["1"]], "rows must have 2 cells")],
)
def test_table_refuses_ragged_input(header, rows, match):
    with pytest.raises(ValueError, match=match):
        pecode.Table(header, rows)


# -- listings of awkward shapes, on source text (show_source takes pecode objects only) ------

DECORATED_FIRST = '''class A:
    @staticmethod
    def s():
        return 1

    def m(self):
        """Doc."""
        return 2

    @property
    def p(self):
        return self._p

    @p.setter
    def p(self, value):
        self._p = value
'''


def test_members_keep_decorators_with_their_own_method():
    shown = pecode.utils._class_with_members(DECORATED_FIRST, ["m"], "A")
    tree = ast.parse(shown)
    (method,) = [node for node in tree.body[0].body if isinstance(node, ast.FunctionDef)]
    assert method.name == "m"
    assert method.decorator_list == []  # the decorator of s did not move onto m
    assert "@staticmethod" not in shown


def test_a_property_shows_its_getter_and_its_setter():
    shown = pecode.utils._class_with_members(DECORATED_FIRST, ["p"], "A")
    methods = [node for node in ast.parse(shown).body[0].body if isinstance(node, ast.FunctionDef)]
    assert [ast.unparse(m.decorator_list[0]) for m in methods] == ["property", "p.setter"]
    with pytest.raises(ValueError, match="each method once"):
        pecode.utils._class_with_members(DECORATED_FIRST, ["p", "p"], "A")


@pytest.mark.parametrize(
    "source",
    [
        'def f():  """doc"""\n',
        'def f(x):\n    """doc"""; return x\n',
        'class C:\n    """doc"""; x = 1\n',
    ],
)
def test_a_docstring_sharing_its_line_with_code_is_refused(source):
    """Dropping its line would drop the code with it."""
    with pytest.raises(ValueError, match="shares its line"):
        pecode.utils._without_docstrings(source)


def test_a_body_that_was_only_a_docstring_becomes_ellipsis():
    shown = pecode.utils._without_docstrings('def f():\n    """Only this."""\n')
    assert shown == "def f():\n    ..."


def test_a_listing_fence_is_longer_than_any_backticks_in_the_code():
    source = 'x = """```python\ny = 1\n```"""'
    markdown = pecode.SourceListing("pecode.example", source)._repr_markdown_()
    assert markdown.startswith("`pecode.example`\n\n````python\n")
    assert markdown.rstrip().endswith("````")


def test_every_show_source_cell_is_a_listing_cell():
    """tools/refresh_listings.py rewrites only cells it recognises: none may be missed."""
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = refresh_listings.nbformat.read(path, as_version=4)
        for cell in nb.cells:
            if cell.cell_type == "code" and "show_source" in cell.source:
                assert refresh_listings.listing_calls(cell.source), (path.name, cell.source)


@pytest.mark.parametrize(
    ("header", "rows", "error", "match"),
    [
        ("ab", [["x", "y"]], TypeError, "header"),
        (["a", "b"], ["xy"], TypeError, "rows"),
        (["a"], [["one\ntwo"]], ValueError, "one line"),
    ],
)
def test_table_refuses_strings_and_line_breaks(header, rows, error, match):
    with pytest.raises(error, match=match):
        pecode.Table(header, rows)


def test_show_source_refuses_a_module_that_only_starts_with_pecode():
    import types

    fake = types.ModuleType("pecode_extras")
    with pytest.raises(TypeError, match="defined in pecode"):
        pecode.show_source(fake)
