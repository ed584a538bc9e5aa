"""Write the Colab install guard at the top of every notebook's first code cell.

Usage: python tools/colab_install_cell.py   (after changing the version or the repository URL)

The guard installs, on Colab only, the tagged release ``v{version}`` of pecode from the
repository of ``_config.yml`` with the ``[notebooks]`` extra; elsewhere it does nothing.
Every notebook gets the same guard (chapter 9's page on Hugging Face models also pins
the transformers release it is tested with), and the cell is tagged ``hide-input`` so
that the book hides this plumbing. Nothing else in the notebook changes: no output, no
other cell. ``tests/test_config.py`` checks that each notebook starts with this guard.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import nbformat
import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[1]

GUARD = """import sys

REPOSITORY = "{repository}"
VERSION = "{version}"  # the tagged release of pecode this notebook was run with
if "google.colab" in sys.modules:  # on Colab: install that release of pecode
    import shlex
    import subprocess

    # Colab's own torch (newer than 2.7) satisfies pecode's torch>=2.7, so pip
    # keeps it.
    packages = [f"pecode[notebooks] @ git+{{REPOSITORY}}@v{{VERSION}}"]
{extra}    pip = subprocess.run(
        [sys.executable, "-m", "pip", "install", "-q", *packages],
        capture_output=True,
        text=True,
    )
    if pip.returncode != 0:
        print(pip.stdout, pip.stderr, sep="\\n")
        raise RuntimeError(
            "installing pecode failed (pip's output is above): run "
            f"`!pip install {{shlex.join(packages)}}` in a cell, "
            "then restart the session"
        )
"""

# these run transformers' models, at the release pecode.hf is tested with (requirements.txt)
NEEDS_TRANSFORMERS = ("09b_pecode_in_hf_models.ipynb", "09c_rope_beyond_one_axis.ipynb")
TRANSFORMERS = '    packages += ["transformers=={pin}"]  # pecode.hf is tested with it\n'


def repository() -> str:
    config = yaml.safe_load((ROOT / "_config.yml").read_text(encoding="utf-8"))
    return config["repository"]["url"]


def version() -> str:
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    return pyproject["project"]["version"]


def pinned(package: str) -> str:
    """The version ``requirements.txt`` pins ``package`` to."""
    for line in (ROOT / "requirements.txt").read_text(encoding="utf-8").splitlines():
        name, _, pin = line.partition("==")
        if pin and name.strip().lower() == package:
            return pin.strip()
    raise LookupError(f"requirements.txt pins no {package}")


def guard(notebook_name: str) -> str:
    """The guard that the first code cell of ``notebook_name`` starts with."""
    extra = ""
    if notebook_name in NEEDS_TRANSFORMERS:
        extra = TRANSFORMERS.format(pin=pinned("transformers"))
    return GUARD.format(repository=repository(), version=version(), extra=extra)


def split_guard(source: str) -> tuple[str, str]:
    """``(guard, rest)``: the cell up to the end of its ``if "google.colab"`` block."""
    lines = source.splitlines(keepends=True)
    start = next(i for i, line in enumerate(lines) if line.startswith("if "))
    end = next(  # the first line at column 0 after the block's header
        i
        for i in range(start + 1, len(lines))
        if lines[i].strip() and not lines[i][0].isspace() and not lines[i].startswith(")")
    )
    return "".join(lines[:end]).rstrip("\n") + "\n", "".join(lines[end:])


def main() -> int:
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        nb = nbformat.read(path, as_version=nbformat.NO_CONVERT)
        cell = next(cell for cell in nb.cells if cell.cell_type == "code")
        if not re.match(r"import sys\n\nREPOSITORY = ", cell.source):
            print(f"{path.name}: its first code cell does not start with a guard", file=sys.stderr)
            return 1
        _, rest = split_guard(cell.source)
        cell.source = guard(path.name) + "\n" + rest
        tags = cell.metadata.setdefault("tags", [])
        if "hide-input" not in tags:
            tags.append("hide-input")
        nbformat.write(nb, path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
