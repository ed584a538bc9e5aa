"""pecode's helpers: device choice, seeding, showing source."""

from __future__ import annotations

import inspect
import random

import numpy as np
import pytest
import torch

import pecode
from pecode import attention


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


def test_show_source_is_the_package_source():
    listing = pecode.show_source(attention.causal_mask)
    assert listing.source == inspect.getsource(attention.causal_mask).rstrip("\n")
    assert listing.qualified_name == "pecode.attention.causal_mask"
    markdown = listing._repr_markdown_()
    assert markdown.count("```") == 2
    assert "def causal_mask(" in markdown
    assert repr(listing).startswith("# pecode.attention.causal_mask\ndef causal_mask(")


def test_show_source_dedents_methods():
    listing = pecode.show_source(attention.MultiHeadAttention.forward)
    assert listing.source.startswith("def forward(")
    assert listing.qualified_name == "pecode.attention.MultiHeadAttention.forward"


@pytest.mark.parametrize("obj", [len, np.zeros, 3])
def test_show_source_refuses_non_pecode_objects(obj):
    with pytest.raises(TypeError, match="obj"):
        pecode.show_source(obj)
