"""Small helpers the notebooks share: the device, seeding, and showing pecode's source."""

from __future__ import annotations

import inspect
import os
import random
import textwrap
from typing import Any

import numpy as np
import torch

__all__ = ["SourceListing", "device", "set_seed", "show_source"]

_DEVICE_ENV = "PECODE_DEVICE"


def device() -> torch.device:
    """Return the device the notebooks compute on.

    CUDA when a GPU is available, otherwise the CPU. The environment variable
    ``PECODE_DEVICE`` (for example ``cpu``) overrides the choice, which lets a GPU
    machine reproduce the CPU run.

    Returns:
        The chosen ``torch.device``.

    Raises:
        ValueError: ``PECODE_DEVICE`` names a device torch does not know, or CUDA
            is asked for on a machine without it.
    """
    override = os.environ.get(_DEVICE_ENV, "").strip()
    if override:
        try:
            chosen = torch.device(override)
        except RuntimeError as err:
            raise ValueError(f"{_DEVICE_ENV}={override!r} is not a torch device: {err}") from err
        if chosen.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"{_DEVICE_ENV}={override!r} asks for CUDA, which is not available")
        return chosen
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def set_seed(seed: int) -> torch.Generator:
    """Seed Python's, NumPy's and torch's random number generators (all devices).

    Args:
        seed: a non-negative integer.

    Returns:
        A CPU ``torch.Generator`` seeded with ``seed``, for code that prefers an
        explicit generator to the global one.

    Raises:
        TypeError: ``seed`` is not an integer (a bool is refused too).
        ValueError: ``seed`` is negative.
    """
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer):
        raise TypeError(f"seed must be an int, got {type(seed).__name__}")
    if seed < 0:
        raise ValueError(f"seed must be non-negative, got {seed}")
    seed = int(seed)
    random.seed(seed)
    np.random.seed(seed % 2**32)  # noqa: NPY002 -- seeding the legacy global RNG is the point
    torch.manual_seed(seed)  # seeds every CUDA device as well
    return torch.Generator().manual_seed(seed)


class SourceListing:
    """The source code of a pecode object, displayed as a highlighted listing.

    Jupyter shows it as a Markdown code block; its plain-text form is the code
    itself, so nbval compares the listing the book shows with the package's code.
    """

    def __init__(self, qualified_name: str, source: str) -> None:
        self.qualified_name = qualified_name
        self.source = source

    def __repr__(self) -> str:
        return f"# {self.qualified_name}\n{self.source}"

    def _repr_markdown_(self) -> str:
        return f"`{self.qualified_name}`\n\n```python\n{self.source}\n```\n"


def show_source(obj: Any) -> SourceListing:
    """Show the source of a pecode function, class or method in a notebook.

    The book never copies code into its pages: it shows the package's own source,
    so the two cannot drift apart.

    Args:
        obj: a function, class, method or module defined in pecode.

    Returns:
        A :class:`SourceListing` that Jupyter renders as a Python code block.

    Raises:
        TypeError: ``obj`` has no Python source (a builtin, an instance) or is not
            part of pecode.
    """
    module = inspect.getmodule(obj)
    if module is None or not module.__name__.startswith("pecode"):
        raise TypeError(f"obj must be defined in pecode, got {obj!r}")
    try:
        source = inspect.getsource(obj)
    except (TypeError, OSError) as err:
        raise TypeError(f"obj has no source code to show: {obj!r}") from err
    name = getattr(obj, "__qualname__", getattr(obj, "__name__", repr(obj)))
    qualified = name if inspect.ismodule(obj) else f"{module.__name__}.{name}"
    return SourceListing(qualified, textwrap.dedent(source).rstrip("\n"))
