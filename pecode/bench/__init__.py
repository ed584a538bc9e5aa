"""Benchmark harness: what each encoding costs, measured side by side.

Timings on a shared machine are noisy, so the harness never trusts one number. It times
several methods in interleaved rounds (:func:`time_interleaved`): round ``r`` times
method 1, 2, ..., n in turn, then round ``r + 1`` starts, so a noisy neighbour slows
every method of a round alike. Each method is summarised over the rounds by its
median, quartiles and minimum (:class:`Spread`), and each ratio is computed round by
round, against a yardstick timed in the same round, before it is summarised
(:func:`ratio_spread`). On CUDA the times are device times (CUDA events).

For RoPE (:func:`bench_rope_case`, :func:`bench_rope_sweep`, :func:`bench_rope_decode`)
the yardsticks are two copies of the query and the key:

* ``copy_`` into tensors allocated beforehand reads every byte once and writes it
  once: the bandwidth bound of a memory-bound operation such as RoPE;
* ``clone`` does the same copy into new tensors, so it also pays for new memory.
  glibc's ``malloc`` serves a request above its mmap threshold with fresh pages from
  the operating system and gives them back at ``free`` (the threshold starts at
  128 KiB and frees raise it, up to 32 MiB on 64-bit Linux: ``mallopt(3)``), and the
  first write to each fresh page costs a page fault. Whether a size pays therefore
  depends on the size and on what the process allocated and freed before (a free
  heap block large enough is reused without faults), so the same ``clone`` can cost
  about one ``copy_`` in one round and several in the next (chapter 12 shows both):
  "a small multiple of a clone" is no bandwidth bound. The default sizes
  (:func:`bench_rope_sweep`) run across that range.

Run ``python -m pecode.bench`` for the RoPE table (``--help`` for sizes, rounds, dtype,
threads and device). :func:`bench_shaw`, :func:`bench_bias_attention` and
:func:`encoding_costs` compare the other encodings of chapter 12 the same way
(:class:`Comparison`), with the tensor memory of each method (:func:`peak_tensor_memory`).
:func:`recorded_cases` loads the runs the book quotes but a reader's machine cannot
repeat (a GPU's).

The package has one module per part; every name above is importable from
``pecode.bench`` itself:

* ``pecode.bench.harness``: the timing core (:func:`time_interleaved`,
  :func:`time_first_call`, :class:`Spread`, :func:`ratio_spread`), the memory counter
  (:func:`peak_tensor_memory`) and the thread and device helpers;
* ``pecode.bench.rope_cases``: the RoPE methods and cases (:func:`rope_methods`,
  :class:`Case`, :func:`bench_rope_case`, :func:`bench_rope_sweep`,
  :func:`bench_rope_decode`, :func:`format_cases`, :func:`cases_table`);
* ``pecode.bench.attention_cases``: chapter 12's other comparisons
  (:class:`Comparison`, :func:`bench_shaw`, :func:`bench_bias_attention`,
  :func:`encoding_layers`, :func:`encoding_costs`);
* ``pecode.bench.records``: the recorded runs (:data:`RECORDS`, :func:`recorded_cases`),
  their JSON files in ``pecode/records``;
* ``pecode.bench.cli``: the command line (:func:`main`), which ``python -m pecode.bench``
  runs (``pecode/bench/__main__.py``).
"""

from __future__ import annotations

from pecode.bench import records as _records
from pecode.bench.attention_cases import (
    Comparison,
    bench_bias_attention,
    bench_shaw,
    encoding_costs,
    encoding_layers,
    flex_costs,
    prefill_memory,
    softmax_attention,
)
from pecode.bench.cli import main
from pecode.bench.harness import (
    Spread,
    peak_tensor_memory,
    ratio_spread,
    time_first_call,
    time_interleaved,
)
from pecode.bench.records import recorded_cases
from pecode.bench.rope_cases import (
    Case,
    RopeInputs,
    RopeMethod,
    RopeSetup,
    Row,
    bench_rope_case,
    bench_rope_decode,
    bench_rope_sweep,
    cases_table,
    format_cases,
    rope_methods,
)

# Re-declared here, with its documentation, so that the API reference (which documents
# pecode.bench and reads a constant's docstring from the module it documents) has it.
RECORDS: dict[str, str] = _records.RECORDS
"""The recorded runs the book quotes, by name, each the ``python -m pecode.bench --json``
output of one run, kept in ``pecode/records``. ``"h100"`` ran on one NVIDIA H100 80GB
HBM3 with torch 2.11 (CUDA 13.0) and Triton 3.6 on 2026-11-23, with ``--device cuda
--dtype float32 bfloat16 --lengths 2048 32768 --rounds 5``."""

__all__ = [
    "RECORDS",
    "Case",
    "Comparison",
    "RopeInputs",
    "RopeMethod",
    "RopeSetup",
    "Row",
    "Spread",
    "bench_bias_attention",
    "bench_rope_case",
    "bench_rope_decode",
    "bench_rope_sweep",
    "bench_shaw",
    "cases_table",
    "encoding_costs",
    "encoding_layers",
    "flex_costs",
    "format_cases",
    "main",
    "peak_tensor_memory",
    "prefill_memory",
    "ratio_spread",
    "recorded_cases",
    "rope_methods",
    "softmax_attention",
    "time_first_call",
    "time_interleaved",
]
