"""The recorded runs: cases the book quotes but a reader's machine cannot repeat (a GPU's).

Each is the ``python -m pecode.bench --json`` output of one run, kept as a JSON file in
``pecode/records`` (package data); :data:`RECORDS` names them and :func:`recorded_cases`
reads one back as :class:`~pecode.bench.rope_cases.Case` objects.
"""

from __future__ import annotations

import importlib.resources
import json

from pecode.bench.rope_cases import Case

__all__ = ["RECORDS", "recorded_cases"]

RECORDS = {
    "h100": "cuda_h100_2026-11-23.json",
}
"""The recorded runs the book quotes, by name, each the ``python -m pecode.bench --json``
output of one run, kept in ``pecode/records``. ``"h100"`` ran on one NVIDIA H100 80GB
HBM3 with torch 2.11 (CUDA 13.0) and Triton 3.6 on 2026-11-23, with ``--device cuda
--dtype float32 bfloat16 --lengths 2048 32768 --rounds 5``."""


def recorded_cases(name: str) -> list[Case]:
    """The cases of a recorded run (:data:`RECORDS`), as :func:`bench_rope_sweep` returned them.

    Raises:
        ValueError: no record of that name.
    """
    if name not in RECORDS:
        raise ValueError(f"no recorded run {name!r}; have {sorted(RECORDS)}")
    text = importlib.resources.files("pecode").joinpath("records", RECORDS[name]).read_text()
    return [Case.from_dict(record) for record in json.loads(text)]
