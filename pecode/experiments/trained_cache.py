"""Trained models kept on disk for a second run that reads them again (opt-in).

CI executes every notebook twice: on its own float kernels (``make test``) and on other
ones (``make test-other-cpu``). Training chapters 13 and 14's models is most of each run,
and the second run's point is to read the models under other kernels. With the
environment variable :data:`CACHE_VARIABLE` naming a folder, :func:`trained` keeps each
training run's result there and hands it back, bit for bit, to a later call whose
function, arguments, ``pecode`` source and ``torch`` version are all the same; the
evaluation of the model still runs every time. Unset (the default), nothing is read or
written: a reader's run always trains.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import pickle
from collections.abc import Callable
from functools import cache
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

__all__ = ["CACHE_VARIABLE", "job_digest", "trained"]

CACHE_VARIABLE = "PECODE_TRAINED_CACHE"
"""The environment variable that names the folder of stored training runs (none if unset)."""

_LOG = logging.getLogger(__name__)


@cache
def _source_digest() -> str:
    """SHA-256 of every ``.py`` file of the installed ``pecode``: any code change misses."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _feed(digest: Any, value: object) -> None:
    """Feed ``value`` to ``digest`` by content, type included (no ``repr`` of a tensor)."""
    if isinstance(value, Tensor):
        data = value.detach().cpu().contiguous().reshape(-1)
        digest.update(f"tensor{data.dtype}{tuple(value.shape)}".encode())
        digest.update(data.view(torch.uint8).numpy().tobytes())
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        digest.update(f"dataclass {type(value).__module__}.{type(value).__qualname__}".encode())
        for field in dataclasses.fields(value):
            digest.update(field.name.encode())
            _feed(digest, getattr(value, field.name))
    elif isinstance(value, tuple | list):
        digest.update(f"{type(value).__name__}{len(value)}".encode())
        for item in value:
            _feed(digest, item)
    elif value is None or isinstance(value, bool | int | float | str):
        digest.update(f"{type(value).__name__}:{value!r};".encode())
    else:
        raise TypeError(f"cannot key a cached training run on a {type(value).__name__}")


def job_digest(function: Callable[..., Any], *args: object) -> str:
    """The key of ``function(*args)``: function, arguments, pecode source, torch version.

    Raises:
        TypeError: an argument is not a tensor, dataclass, tuple, list, str, number,
            bool or None.
    """
    digest = hashlib.sha256()
    digest.update(f"{function.__module__}.{function.__qualname__}".encode())
    _feed(digest, list(args))
    digest.update(_source_digest().encode())
    digest.update(torch.__version__.encode())
    return digest.hexdigest()


def trained(function: Callable[..., Any], *args: object) -> Any:
    """``function(*args)``, read from :data:`CACHE_VARIABLE`'s folder when it holds it.

    Without the variable, just the call. With it, a result stored under the same
    :func:`job_digest` is loaded; otherwise the call runs and its result is stored (an
    unreadable file is replaced, and said so on this module's logger, never on stderr).
    """
    folder = os.environ.get(CACHE_VARIABLE)
    if not folder:
        return function(*args)
    path = Path(folder) / f"{function.__name__}-{job_digest(function, *args)[:32]}.pt"
    if path.exists():
        try:
            return torch.load(path, weights_only=False)
        except (OSError, EOFError, RuntimeError, pickle.UnpicklingError) as error:
            _LOG.info("unreadable cached training run %s (%s): training again", path, error)
    result = function(*args)
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    torch.save(result, partial)
    partial.replace(path)  # atomic: a reader sees the whole file or none
    return result
