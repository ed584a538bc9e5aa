"""One version, one URL, licenses that say what they cover, a package that ships them.

The version of ``pyproject.toml`` is repeated in the book's title, ``CITATION.cff``,
the changelog, the landing page's BibTeX entry and ``pecode.__version__`` (the
notebooks' Colab cells: ``tests/test_config.py``); the repository URL of
``_config.yml`` in ``CITATION.cff``, the BibTeX entry and the README.
"""

from __future__ import annotations

import ast
import datetime
import re
from pathlib import Path

import pytest
import yaml

import pecode

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; make test-oldest may be on 3.10

ROOT = Path(__file__).resolve().parents[1]
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
PROJECT = PYPROJECT["project"]
VERSION = PROJECT["version"]
REPOSITORY = CONFIG["repository"]["url"]
CITATION = yaml.safe_load((ROOT / "CITATION.cff").read_text(encoding="utf-8"))
README = (ROOT / "README.md").read_text(encoding="utf-8")
INTRO = (ROOT / "book" / "intro.md").read_text(encoding="utf-8")
TITLE = "Positional Encoding, Verified"

# the top-level keys of Citation File Format 1.2.0 (a misspelt key is not an error there)
CFF_KEYS = {
    "abstract", "authors", "cff-version", "commit", "contact", "date-released", "doi",
    "identifiers", "keywords", "license", "license-url", "message", "preferred-citation",
    "references", "repository", "repository-artifact", "repository-code", "title", "type",
    "url", "version",
}  # fmt: skip


def test_the_book_title_shows_the_package_version():
    assert CONFIG["title"] == f"{TITLE} ({VERSION})"


def test_the_package_reports_its_version():
    assert pecode.__version__ == VERSION


def test_citation_file_is_cff_1_2_0_with_this_release():
    assert set(CITATION) <= CFF_KEYS, set(CITATION) - CFF_KEYS
    assert CITATION["cff-version"] == "1.2.0"
    assert isinstance(CITATION["message"], str)
    assert CITATION["message"].strip()
    assert CITATION["type"] == "software"
    assert CITATION["title"] == TITLE
    assert CITATION["authors"] == [{"name": "the pecode authors"}]  # an entity, not a person
    assert CITATION["version"] == VERSION
    released = str(CITATION["date-released"])  # YAML reads an unquoted date as a date
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", released)
    datetime.date.fromisoformat(released)
    assert CITATION["repository-code"] == REPOSITORY
    # SPDX identifiers: the code's license, then the text's
    assert CITATION["license"] == [PROJECT["license"], "CC-BY-SA-4.0"]


def test_the_changelog_starts_with_this_release():
    changelog = (ROOT / "book" / "changelog.md").read_text(encoding="utf-8")
    first = re.search(r"^## (\S+) \((\d{4}-\d\d-\d\d)\)$", changelog, flags=re.M)
    assert first, "no release heading '## X.Y.Z (YYYY-MM-DD)'"
    assert first.groups() == (VERSION, str(CITATION["date-released"]))


def test_the_landing_page_bibtex_entry_cites_this_release():
    [entry] = re.findall(r"```bibtex\n(.*?)```", INTRO, flags=re.S)
    fields = dict(re.findall(r"^\s+(\w+)\s*=\s*\{(.*)\},?$", entry, flags=re.M))
    assert fields["title"] == TITLE
    assert fields["author"] == "{the pecode authors}"  # braced: an entity, not a person
    assert fields["version"] == VERSION
    assert fields["year"] == str(CITATION["date-released"])[:4]
    assert fields["url"] == REPOSITORY
    assert f"version {VERSION} of the book" in INTRO


def test_every_repository_url_in_the_readme_is_the_config_one():
    urls = re.findall(r"https://github\.com/[\w.-]+/[\w.-]+?(?=[@\"/)\s]|$)", README)
    assert urls
    for url in urls:
        assert url == REPOSITORY, url
    # the release the README installs is this version's tag
    assert set(re.findall(r"@v([\w.]+)\"", README)) == {VERSION}


def test_licenses_exist_and_say_what_they_cover():
    mit = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert mit.startswith("MIT License\n")
    assert "Copyright (c) 2026 the pecode authors" in mit
    assert PROJECT["license"] == "MIT"
    assert PROJECT["license-files"] == ["LICENSE"]  # shipped in the wheel's dist-info
    book = (ROOT / "LICENSE-BOOK.md").read_text(encoding="utf-8")
    assert "Creative Commons Attribution-ShareAlike 4.0" in book
    assert "https://creativecommons.org/licenses/by-sa/4.0/legalcode" in book
    # the README and the landing page say which license covers what, and link both
    for page, links in (
        (README, ("(LICENSE)", "(LICENSE-BOOK.md)")),
        (INTRO, ("<../LICENSE>", "<../LICENSE-BOOK.md>")),
    ):
        assert "MIT license" in page
        assert "Attribution-ShareAlike 4.0" in page
        for link in links:
            assert link in page, link


def _imported_top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def test_pecode_never_imports_what_only_the_notebooks_need():
    extra = {
        re.match(r"[A-Za-z0-9_.-]+", requirement).group().lower()
        for requirement in PROJECT["optional-dependencies"]["notebooks"]
    }
    assert extra == {"matplotlib", "tqdm"}
    dependencies = {re.match(r"[A-Za-z0-9_.-]+", r).group() for r in PROJECT["dependencies"]}
    assert not extra & dependencies
    for path in sorted((ROOT / "pecode").rglob("*.py")):
        used = _imported_top_level_names(path) & extra
        assert not used, f"{path.relative_to(ROOT)} imports {used}: move it to dependencies"


def test_the_package_is_typed():
    assert (ROOT / "pecode" / "py.typed").exists()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["pecode"]
