"""pecode.frequencies: the base and width checks behind every RoPE frequency, and the
module layout that keeps pecode.rope and pecode.scaling from importing each other."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import pecode.rope
import pecode.scaling
from pecode.frequencies import check_rope_base, check_rope_dim, rope_inv_freq
from pecode.reference.rope import rope_inv_freq_loop

ROOT = Path(__file__).resolve().parents[1]


def test_rope_and_scaling_share_one_function():
    assert pecode.rope.rope_inv_freq is rope_inv_freq
    assert pecode.scaling.rope_inv_freq is rope_inv_freq
    want = torch.tensor(rope_inv_freq_loop(64, 500000.0), dtype=torch.float64)
    assert torch.allclose(rope_inv_freq(64, 500000.0, dtype=torch.float64), want, rtol=1e-15)


@pytest.mark.parametrize(
    ("base", "error", "message"),
    [
        ("10000", TypeError, "base must be a real number, got str"),
        (True, TypeError, "base must be a real number, got bool"),
        (None, TypeError, "base must be a real number, got NoneType"),
        (float("inf"), ValueError, "base must be finite, got inf"),
        (float("nan"), ValueError, "base must be finite, got nan"),
        (1.0, ValueError, "base must be greater than 1, got 1.0"),
        (0.5, ValueError, "base must be greater than 1"),
        (-10000.0, ValueError, "base must be greater than 1"),
    ],
)
def test_bad_base_raises_naming_it(base, error, message):
    with pytest.raises(error, match=message):
        rope_inv_freq(8, base)


def test_an_infinite_base_would_silently_stop_every_pair_but_the_first():
    # what the check prevents: base ** (-2i/d) with base = inf is 1 for i = 0 and 0 after
    exponents = torch.arange(0, 8, 2, dtype=torch.float64) / 8
    assert (float("inf") ** -exponents).tolist() == [1.0, 0.0, 0.0, 0.0]


def test_good_bases_of_any_real_type():
    for base in (10000, 10000.0, np.float32(10000.0), np.int64(10000), 1.0001, 1e8):
        assert check_rope_base("base", base) == float(base)
    assert torch.equal(rope_inv_freq(8, 10000), rope_inv_freq(8, 10000.0))


def test_the_name_is_the_callers():
    with pytest.raises(ValueError, match="rope_theta must be greater than 1"):
        check_rope_base("rope_theta", 0.5)
    with pytest.raises(ValueError, match="head_dim must be a positive even number"):
        check_rope_dim("head_dim", 6 + 1)
    with pytest.raises(TypeError, match="rotary_dim must be an int, got bool"):
        check_rope_dim("rotary_dim", True)
    assert check_rope_dim("dim", 64) == 64


def test_one_width_check_for_the_module_and_the_functions():
    # pecode.rope had a copy of the width check; now RotaryEmbedding, layout_permutation
    # and rope_inv_freq all report a bad width through check_rope_dim
    assert not hasattr(pecode.rope, "_check_dim")
    for call, name in [
        (lambda: pecode.rope.RotaryEmbedding(10, rotary_dim=3), "rotary_dim"),
        (lambda: pecode.rope.layout_permutation(0), "dim"),
        (lambda: rope_inv_freq(5), "dim"),
    ]:
        with pytest.raises(ValueError, match=f"^{name} must be a positive even number"):
            call()


def _pecode_imports(path: Path) -> set[str]:
    """Every pecode module ``path`` imports, at module level or inside a function."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pecode"):
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names if alias.name.startswith("pecode"))
    return names


def test_scaling_and_frequencies_do_not_import_rope():
    # pecode.rope used to be imported by pecode.scaling, and imported it back inside a
    # function; now both start from pecode.frequencies, which imports neither.
    assert not {"pecode.rope", "pecode.scaling"} & _pecode_imports(ROOT / "pecode/frequencies.py")
    assert "pecode.rope" not in _pecode_imports(ROOT / "pecode/scaling.py")
    code = "import sys, pecode.scaling; print('pecode.rope' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    assert result.stdout.strip() == "False"
