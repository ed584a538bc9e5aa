"""The README's code examples run as written, so the README stays true."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCKS = re.findall(r"```python\n(.*?)```", (ROOT / "README.md").read_text(encoding="utf-8"), re.S)


def test_readme_has_examples():
    assert BLOCKS


@pytest.mark.parametrize("source", BLOCKS, ids=lambda s: s.splitlines()[0][:40])
def test_readme_example_runs(source):
    exec(compile(source, "README.md", "exec"), {"__name__": "readme_example"})
