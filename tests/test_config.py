"""The project's configuration agrees with itself: URLs, toc, pins, notebook hygiene."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import nbformat
import pytest
import tomllib
import yaml
from chapters import CHAPTER_NUMBERS

ROOT = Path(__file__).resolve().parents[1]
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
TOC = yaml.safe_load((ROOT / "_toc.yml").read_text(encoding="utf-8"))
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

REPOSITORY = CONFIG["repository"]["url"]

# tools/colab_install_cell.py writes the notebooks' install guard; the tests compare with it
_spec = importlib.util.spec_from_file_location(
    "colab_install_cell", ROOT / "tools" / "colab_install_cell.py"
)
colab_install_cell = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(colab_install_cell)


def toc_files(node) -> list[str]:
    """Every `file:` entry of the toc, depth first."""
    found = []
    if isinstance(node, dict):
        if "file" in node:
            found.append(node["file"])
        for value in node.values():
            found += toc_files(value)
    elif isinstance(node, list):
        for item in node:
            found += toc_files(item)
    return found


def first_code_cell(nb) -> str:
    return next(cell.source for cell in nb.cells if cell.cell_type == "code")


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found"


def test_config_has_what_the_book_needs():
    assert CONFIG["author"] == "the pecode authors"
    assert CONFIG["only_build_toc_files"] is True
    assert CONFIG["execute"]["execute_notebooks"] == "off"
    extensions = CONFIG["sphinx"]["extra_extensions"]
    for extension in ("sphinx_proof", "sphinx.ext.autodoc", "sphinx.ext.napoleon"):
        assert extension in extensions
    assert {"dollarmath", "amsmath"} <= set(CONFIG["parse"]["myst_enable_extensions"])
    assert CONFIG["bibtex_bibfiles"] == ["book/references.bib"]
    assert CONFIG["launch_buttons"]["colab_url"] == "https://colab.research.google.com"
    assert CONFIG["html"]["use_repository_button"]
    assert CONFIG["html"]["use_issues_button"]
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+", REPOSITORY)


def test_repository_url_is_written_once_in_the_config():
    text = (ROOT / "_config.yml").read_text(encoding="utf-8")
    assert text.count("github.com/") == 1


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_install_cell_and_badge_use_the_config_url(path):
    nb = nbformat.read(path, as_version=4)
    setup = first_code_cell(nb)
    assert f'REPOSITORY = "{REPOSITORY}"' in setup
    assert f'VERSION = "{PROJECT["version"]}"' in setup  # pyproject.toml's
    assert '"google.colab" in sys.modules' in setup
    # the tagged release, with what the notebooks import besides pecode
    assert 'f"pecode[notebooks] @ git+{REPOSITORY}@v{VERSION}"' in setup
    assert set(PROJECT["optional-dependencies"]) >= {"notebooks"}
    # a failed pip shows its output and says what to do, instead of a bare traceback
    assert "capture_output=True" in setup
    assert "raise RuntimeError(" in setup
    assert "check=True" not in setup
    for required in ("pecode.set_seed(", "device = pecode.device()"):
        assert required in setup, required
    # the same guard in every notebook, written by tools/colab_install_cell.py
    assert setup.startswith(colab_install_cell.guard(path.name) + "\n")
    # the book hides the plumbing; its outputs are empty, so nothing is lost
    cell = next(cell for cell in nb.cells if cell.cell_type == "code")
    assert "hide-input" in cell.metadata.get("tags", [])
    assert cell.outputs == []
    owner_repo = REPOSITORY.removeprefix("https://github.com/")
    badge = f"https://colab.research.google.com/github/{owner_repo}/blob/main/notebooks/{path.name}"
    assert badge in nb.cells[0].source
    # every other URL to the repository in the notebook is the same one
    for url in re.findall(
        r"https://github\.com/[\w.-]+/[\w.-]+", "".join(c.source for c in nb.cells)
    ):
        assert url == REPOSITORY


def test_pyproject_points_at_the_same_repository():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["urls"]["Homepage"] == REPOSITORY


def test_every_notebook_is_in_the_toc_and_every_toc_file_exists():
    files = toc_files(TOC)
    notebooks_in_toc = {f for f in files if f.startswith("notebooks/")}
    assert notebooks_in_toc == {f"notebooks/{p.stem}" for p in NOTEBOOKS}
    for entry in [*files, TOC["root"]]:
        assert any((ROOT / f"{entry}{ext}").exists() for ext in (".md", ".ipynb")), entry


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_notebook_is_named_and_clean(path):
    assert re.fullmatch(r"\d\d[a-z]?_[a-z0-9_]+\.ipynb", path.name)  # 09b: a section
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[0].cell_type == "markdown"
    assert nb.cells[0].source.lstrip().startswith("(")
    for index, cell in enumerate(nb.cells):
        if cell.cell_type != "code":
            continue
        # nbval skips the comparison of cells without an execution count
        assert cell.execution_count is not None, f"cell {index} was not executed"
        for output in cell.outputs:
            assert output.output_type != "error", f"cell {index} has an error output"
            assert output.get("name") != "stderr", f"cell {index} wrote to stderr"
            text = str(output.get("text", "")) + str(output.get("data", {}).get("text/plain", ""))
            assert "cuda" not in text, f"cell {index} prints a device-specific value"
    counts = [c.execution_count for c in nb.cells if c.cell_type == "code"]
    assert counts == list(range(1, len(counts) + 1)), "run the notebook top to bottom once"


def test_requirements_are_exact_pins_with_the_required_packages():
    lines = [
        line.strip()
        for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    pins = dict(line.split("==") for line in lines)
    assert all(re.fullmatch(r"[A-Za-z0-9_.-]+==[A-Za-z0-9_.]+", line) for line in lines)
    assert pins["torch"] == "2.13.0"
    assert pins["jupyter-book"] == "1.0.4.post1"
    names = {name.lower().replace("_", "-") for name in pins}
    for required in (
        "sphinx-proof",
        "nbval",
        "sympy",
        "numpy",
        "matplotlib",
        "pytest",
        "hypothesis",
        "tqdm",
        "ipykernel",
        "jupyterlab",  # the README's `.venv/bin/jupyter lab`
        "sphinxcontrib-bibtex",
        "ruff",
    ):
        assert required in names, required


def test_pyproject_bounds_stay_loose():
    extras = [r for extra in PROJECT["optional-dependencies"].values() for r in extra]
    for requirement in PROJECT["dependencies"] + extras:
        assert "==" not in requirement, requirement
        assert ">=" in requirement, requirement


def _chapter_numbers(text: str) -> set[int]:
    """``chapters 1–4, 8, 12`` -> {1, 2, 3, 4, 8, 12}."""
    numbers: set[int] = set()
    for part in text.removeprefix("chapters").split(","):
        first, _, last = part.strip().partition("–")
        numbers |= set(range(int(first), int(last or first) + 1))
    return numbers


def _verdict_table_sources(nb) -> set[str]:
    """Source ids named in the source column of a chapter's verdict table."""
    found: set[str] = set()
    for cell in nb.cells:
        if cell.cell_type != "markdown":
            continue
        for line in cell.source.splitlines():
            columns = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(columns) > 2 and columns[0].isdigit():
                found |= set(re.findall(r"\b00[0-4]\b", columns[1]))
    return found


def test_the_intro_maps_each_source_to_the_chapters_that_check_it():
    intro = (ROOT / "book" / "intro.md").read_text(encoding="utf-8")
    claimed = {
        source: _chapter_numbers(chapters)
        for source, chapters in re.findall(
            r"^\| (00[0-4]) \|.*\| (chapters [\d–, ]+) \|$", intro, flags=re.M
        )
    }
    assert set(claimed) == {"000", "001", "002", "003", "004"}
    checked: dict[str, set[int]] = {source: set() for source in claimed}
    for path in NOTEBOOKS:
        nb = nbformat.read(path, as_version=4)
        chapter = CHAPTER_NUMBERS[path.stem]
        in_table = _verdict_table_sources(nb)
        # the opening names exactly the sources whose claims the chapter's table checks
        assert set(re.findall(r"\bsource (00[0-4])\b", nb.cells[0].source)) == in_table, path.name
        for source in in_table:
            checked[source].add(chapter)
    assert claimed == checked
