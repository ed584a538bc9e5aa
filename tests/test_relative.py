"""pecode.relative as a package: every name importable from it, batched positions for every
scheme, and the memory counter the chapters measure the schemes with."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest
import torch

import pecode.bench
import pecode.relative
from pecode.attention import MultiHeadAttention
from pecode.bench import peak_tensor_memory
from pecode.relative import (
    DebertaRelativePosition,
    ShawRelativePosition,
    T5RelativePositionBias,
)

SCHEME_MODULES = ("shaw", "transformer_xl", "t5", "deberta")


def test_every_name_is_defined_in_one_scheme_module_and_importable_from_the_package():
    modules = [importlib.import_module(f"pecode.relative.{name}") for name in SCHEME_MODULES]
    defined = [name for module in modules for name in module.__all__]
    assert sorted(defined) == sorted(pecode.relative.__all__)  # each name once
    for module in modules:
        for name in module.__all__:
            obj = getattr(pecode.relative, name)
            assert obj is getattr(module, name)
            assert obj.__module__ == module.__name__, name


def test_the_memory_counter_lives_in_the_bench_and_the_math_does_not_import_it():
    # no forwarding from pecode.relative any more: it closed an import circle
    # (tests/test_imports.py); the counter is pecode.bench.peak_tensor_memory
    assert not hasattr(pecode.relative, "peak_tensor_memory")
    assert "peak_tensor_memory" in pecode.bench.__all__
    with pytest.raises(AttributeError, match="no_such_name"):
        pecode.relative.no_such_name  # noqa: B018
    code = "import sys, pecode.relative; print('pecode.bench' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.strip() == "False"


@pytest.mark.parametrize(
    "make_scheme",
    [
        lambda: ShawRelativePosition(4, 2),
        lambda: T5RelativePositionBias(2, num_buckets=8, max_distance=16),
        lambda: DebertaRelativePosition(8, 2, 4, 3),
    ],
    ids=["shaw", "t5", "deberta"],
)
def test_batched_positions_equal_one_sequence_at_a_time(make_scheme):
    torch.manual_seed(8)
    layer = MultiHeadAttention(8, 2, position=make_scheme()).double()
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    positions = torch.tensor([[0, 1, 2, 3, 4], [7, 3, 9, 1, 20]])
    with torch.no_grad():
        together = layer(x, positions=positions)
        apart = [layer(x[b : b + 1], positions=positions[b]) for b in range(2)]
    assert torch.allclose(together, torch.cat(apart), atol=1e-12)


def test_peak_tensor_memory_by_hand():
    def two_buffers():
        a = torch.empty(1000)  # 4000 bytes
        b = torch.empty(500, dtype=torch.float64)  # 4000 bytes, both alive
        del a
        c = torch.empty(100)  # a was freed: live 4400 < 8000
        return b, c

    assert peak_tensor_memory(two_buffers) == 8000
    x = torch.randn(64)
    assert peak_tensor_memory(lambda: x.view(8, 8).t()) == 0  # views allocate nothing
    assert peak_tensor_memory(lambda: x.view(8, 8).t().contiguous()) == 256
    with pytest.raises(TypeError, match="fn"):
        peak_tensor_memory(3)
