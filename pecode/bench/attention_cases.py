"""The other encodings of chapter 12, each compared side by side with its memory.

A :class:`Comparison` holds methods timed together in interleaved rounds, the peak tensor
memory of each (:func:`~pecode.bench.harness.peak_tensor_memory`) and the largest
difference between their results:

* :func:`bench_shaw`: Shaw et al.'s key and value terms, direct ``[L, L, Dh]`` form
  against the gather form;
* :func:`bench_bias_attention`: ALiBi's and T5's biases through PyTorch's fused attention
  against :func:`softmax_attention` written by hand;
* :func:`encoding_costs`: parameters, extra memory and time of one attention layer per
  encoding (:func:`encoding_layers`);
* :func:`prefill_memory`: a causal prefill's tensor memory inside a transformers model,
  on transformers' SDPA path and on pecode's attention;
* :func:`flex_costs`: an offset bias (ALiBi) as a dense mask against FlexAttention's
  table, peak memory and time against the length.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._pytree import tree_flatten

from pecode._checks import check_int
from pecode.absolute import LearnedPositionalEncoding, SinusoidalPositionalEncoding
from pecode.alibi import ALiBi, alibi_bias
from pecode.attention import MultiHeadAttention
from pecode.bench.harness import (
    Spread,
    _check_device,
    peak_tensor_memory,
    ratio_spread,
    time_interleaved,
)
from pecode.hf import swap_attention
from pecode.relative import (
    DebertaRelativePosition,
    ShawRelativePosition,
    T5RelativePositionBias,
    TransformerXLRelativePosition,
    shaw_key_logits,
    shaw_key_logits_naive,
    shaw_value_term,
    shaw_value_term_naive,
)
from pecode.rope import RotaryEmbedding

__all__ = [
    "Comparison",
    "bench_bias_attention",
    "bench_shaw",
    "encoding_costs",
    "encoding_layers",
    "flex_costs",
    "prefill_memory",
    "softmax_attention",
]

# --------------------------------------------------------------------------------------
# Side-by-side comparisons of chapter 12: Shaw's two forms, the bias attentions, and one
# attention layer per encoding, each timed in interleaved rounds with its memory
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Comparison:
    """Methods timed together in interleaved rounds, with the tensor memory each creates.

    Attributes:
        label: the problem size, in words.
        baseline: the method that :meth:`ratio` divides by.
        samples: method -> seconds per call, one per round.
        peaks: method -> peak bytes of the tensors one call creates
            (:func:`peak_tensor_memory`).
        max_error: the largest absolute difference between the methods' results.
    """

    label: str
    baseline: str
    samples: Mapping[str, tuple[float, ...]]
    peaks: Mapping[str, int]
    max_error: float

    def time(self, method: str) -> Spread:
        """Seconds per call of ``method`` over the rounds."""
        return Spread.of(self.samples[method])

    def ratio(self, method: str, yardstick: str | None = None) -> Spread:
        """Per-round ratio of ``method``'s time to ``yardstick``'s (the baseline's by default)."""
        return ratio_spread(self.samples, method, yardstick or self.baseline)

    def lines(self, prefix: str = "") -> list[str]:
        """One line per method: median time, ratio to the baseline, new tensors."""
        return [
            f"{prefix}{name:14s} {self.time(name).median * 1e3:8.2f} ms "
            f"{self.ratio(name)!s:18s} {self.peaks[name] / 2**20:7.1f} MiB"
            for name in self.samples
        ]


def _compare(
    label: str,
    methods: Mapping[str, Callable[[], Any]],
    baseline: str,
    *,
    device: torch.device,
    rounds: int,
    target_s: float,
    num_threads: int | None,
) -> Comparison:
    """Time ``methods`` in interleaved rounds, measure their memory, compare their results."""
    with torch.no_grad():
        samples = time_interleaved(
            methods, rounds=rounds, target_s=target_s, device=device, num_threads=num_threads
        )
        peaks = {name: peak_tensor_memory(fn) for name, fn in methods.items()}
        results = [tree_flatten(fn())[0] for fn in methods.values()]
    error = max(
        (
            float((a - b).abs().max())
            for other in results[1:]
            for a, b in zip(results[0], other, strict=True)
        ),
        default=0.0,
    )
    return Comparison(label, baseline, {k: tuple(v) for k, v in samples.items()}, peaks, error)


def _randn(*shape: int, device: torch.device) -> Tensor:
    return torch.randn(*shape).to(device)  # drawn on the CPU: the same numbers everywhere


def bench_shaw(
    length: int = 1024,
    *,
    heads: int = 8,
    head_dim: int = 64,
    max_distance: int = 16,
    device: torch.device | str = "cpu",
    rounds: int = 5,
    target_s: float = 0.02,
    num_threads: int | None = 1,
) -> Comparison:
    """Shaw et al.'s key and value terms: the direct ``[L, L, Dh]`` form against the gather form.

    ``"direct"`` is :func:`~pecode.relative.shaw_key_logits_naive` plus
    :func:`~pecode.relative.shaw_value_term_naive`, ``"gather"`` their memory-efficient
    forms (:func:`~pecode.relative.shaw_key_logits`, :func:`~pecode.relative.shaw_value_term`),
    batch 1; the baseline is ``"direct"``.

    Raises:
        ValueError: a size is not a positive int (``max_distance`` may be 0), or
            ``device`` is invalid.
    """
    for name, value in (("length", length), ("heads", heads), ("head_dim", head_dim)):
        check_int(name, value)
    check_int("max_distance", max_distance, minimum=0)
    device = _check_device(device)
    q = _randn(1, heads, length, head_dim, device=device)
    weights = torch.softmax(_randn(1, heads, length, length, device=device), dim=-1)
    rows_k = _randn(2 * max_distance + 1, head_dim, device=device)
    rows_v = _randn(2 * max_distance + 1, head_dim, device=device)
    pos = torch.arange(length, device=device)

    def run(key_fn: Callable[..., Tensor], value_fn: Callable[..., Tensor]) -> Callable[[], Any]:
        return lambda: (
            key_fn(q, rows_k, pos, pos, max_distance),
            value_fn(weights, rows_v, pos, pos, max_distance),
        )

    methods = {
        "direct": run(shaw_key_logits_naive, shaw_value_term_naive),
        "gather": run(shaw_key_logits, shaw_value_term),
    }
    label = f"L={length} H={heads} Dh={head_dim} k={max_distance}"
    return _compare(
        label,
        methods,
        "direct",
        device=device,
        rounds=rounds,
        target_s=target_s,
        num_threads=num_threads,
    )


def softmax_attention(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float) -> Tensor:
    """Hand-written attention ``softmax(q kᵀ · scale + bias) v`` (Vaswani et al. 2017, eq. 1).

    The yardstick for :func:`torch.nn.functional.scaled_dot_product_attention` with a
    float mask: it materializes the ``[B, H, Lq, Lk]`` logits and probabilities.

    Shapes::

        q: [B, H, Lq, Dh]    k, v: [B, H, Lk, Dh]    bias: broadcastable to [B, H, Lq, Lk]
        returns: [B, H, Lq, Dh]
    """
    logits = torch.baddbmm(
        bias.expand(*q.shape[:-2], q.shape[-2], k.shape[-2]).flatten(0, 1),
        q.flatten(0, 1),
        k.flatten(0, 1).transpose(-2, -1),
        alpha=scale,
    )
    return (torch.softmax(logits, dim=-1) @ v.flatten(0, 1)).unflatten(0, q.shape[:2])


def bench_bias_attention(
    length: int = 1024,
    *,
    heads: int = 8,
    head_dim: int = 64,
    device: torch.device | str = "cpu",
    rounds: int = 5,
    target_s: float = 0.02,
    num_threads: int | None = 1,
) -> dict[str, Comparison]:
    """ALiBi and T5 biases: PyTorch's fused attention with the bias as a float mask, against
    :func:`softmax_attention` written by hand.

    One :class:`Comparison` per bias (``"alibi"``: :func:`~pecode.alibi.alibi_bias` with
    scale ``Dh^-1/2``; ``"t5"``: :class:`~pecode.relative.T5RelativePositionBias`'s bias,
    scale 1 as in T5), methods ``"by hand"`` (the baseline) and ``"sdpa"``.

    Raises:
        ValueError: a size is not a positive int, or ``device`` is invalid.
    """
    for name, value in (("length", length), ("heads", heads), ("head_dim", head_dim)):
        check_int(name, value)
    device = _check_device(device)
    q, k, v = (_randn(1, heads, length, head_dim, device=device) for _ in range(3))
    positions = torch.arange(length, device=device)
    t5 = T5RelativePositionBias(heads).to(device)
    with torch.no_grad():
        biases = {
            "alibi": (alibi_bias(heads, length, device=device).unsqueeze(0), head_dim**-0.5),
            "t5": (t5.position_bias(positions, positions).unsqueeze(0), 1.0),
        }
    label = f"L={length} H={heads} Dh={head_dim}"
    return {
        name: _compare(
            label,
            {
                "by hand": lambda bias=bias, scale=scale: softmax_attention(q, k, v, bias, scale),
                "sdpa": lambda bias=bias, scale=scale: F.scaled_dot_product_attention(
                    q, k, v, attn_mask=bias, scale=scale
                ),
            },
            "by hand",
            device=device,
            rounds=rounds,
            target_s=target_s,
            num_threads=num_threads,
        )
        for name, (bias, scale) in biases.items()
    }


def encoding_layers(
    length: int, *, dim: int = 128, heads: int = 4, max_distance: int = 16
) -> dict[str, nn.Module]:
    """One attention layer per encoding, every one of width ``dim`` with ``heads`` heads.

    ``"none"`` is :class:`~pecode.attention.MultiHeadAttention` without positions; the
    absolute encodings (sinusoidal, learned with ``length`` rows) are added to its
    input; the others are its ``position`` scheme, with ``max_distance`` for Shaw and
    DeBERTa.
    """
    head_dim = dim // heads

    def attend(position: Any = None) -> MultiHeadAttention:
        return MultiHeadAttention(dim, heads, position=position)

    return {
        "none": attend(),
        "sinusoidal": nn.Sequential(SinusoidalPositionalEncoding(dim, max_len=length), attend()),
        "learned": nn.Sequential(LearnedPositionalEncoding(length, dim), attend()),
        "shaw": attend(ShawRelativePosition(head_dim, max_distance)),
        "transformer-xl": attend(TransformerXLRelativePosition(dim, heads, head_dim)),
        "t5": attend(T5RelativePositionBias(heads)),
        "deberta": attend(DebertaRelativePosition(dim, heads, head_dim, max_distance)),
        "alibi": attend(ALiBi(heads)),
        "rope": attend(RotaryEmbedding(head_dim)),
    }


def encoding_costs(
    lengths: Sequence[int] = (128, 512),
    *,
    dim: int = 128,
    heads: int = 4,
    max_distance: int = 16,
    device: torch.device | str = "cpu",
    rounds: int = 5,
    target_s: float = 0.02,
    num_threads: int | None = 1,
) -> list[dict[str, Any]]:
    """Parameters, extra memory and time of one attention layer's forward, per encoding.

    For each length, the layers of :func:`encoding_layers` run on ``[1, length, dim]``
    without gradient, timed together in interleaved rounds. One dict per encoding and
    length: ``encoding``, ``length``, ``parameters`` (the encoding's own: the layer's
    minus the layer without positions), ``extra_bytes`` (peak tensor memory of the
    forward minus that of the layer without positions) and ``time_ratio`` (a
    :class:`Spread` of the per-round ratio to that layer's time).

    Raises:
        ValueError: a size is not a positive int, or ``device`` is invalid.
    """
    device = _check_device(device)
    rows = []
    for length in lengths:
        check_int("length", length)
        layers = {
            name: layer.to(device).eval()
            for name, layer in encoding_layers(
                length, dim=dim, heads=heads, max_distance=max_distance
            ).items()
        }
        x = _randn(1, length, dim, device=device)
        compared = _compare(
            f"L={length} width={dim} H={heads}",
            {name: (lambda layer=layer, x=x: layer(x)) for name, layer in layers.items()},
            "none",
            device=device,
            rounds=rounds,
            target_s=target_s,
            num_threads=num_threads,
        )
        base = sum(p.numel() for p in layers["none"].parameters())
        rows += [
            {
                "encoding": name,
                "length": length,
                "parameters": sum(p.numel() for p in layer.parameters()) - base,
                "extra_bytes": compared.peaks[name] - compared.peaks["none"],
                "time_ratio": compared.ratio(name),
            }
            for name, layer in layers.items()
        ]
    return rows


# --------------------------------------------------------------------------------------
# A causal prefill's memory inside a transformers model, against transformers' own


def prefill_memory(
    length: int = 8192,
    *,
    hidden: int = 256,
    heads: int = 4,
    kv_heads: int = 2,
    padding: int = 0,
) -> dict[str, int]:
    """Peak tensor bytes of a one-layer Llama's prefill: transformers' SDPA path and pecode's.

    A tiny random Llama (``hidden`` wide, ``heads`` query and ``kv_heads`` key/value
    heads) runs ``length`` tokens once as transformers builds it (``"sdpa"``) and once
    with its attention swapped for pecode's (:func:`pecode.hf.swap_attention`);
    :func:`peak_tensor_memory` measures each. ``padding`` tokens on the left of the one
    row make both build a mask: none is needed without them.

    Returns:
        ``{"transformers sdpa": bytes, "pecode": bytes}``.

    Raises:
        ImportError: transformers is not installed.
        TypeError, ValueError: a size that is not a positive int, or padding not below
            the length.
    """
    for name, value in (("length", length), ("hidden", hidden), ("heads", heads)):
        check_int(name, value)
    check_int("kv_heads", kv_heads)
    if not 0 <= check_int("padding", padding, minimum=0) < length:
        raise ValueError(f"padding must be below length={length}, got {padding}")
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError as error:
        raise ImportError("prefill_memory compares with transformers: pip install it") from error
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=1,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        max_position_embeddings=length,
        attn_implementation="sdpa",
    )
    theirs = LlamaForCausalLM(config).eval()
    ours = swap_attention(copy.deepcopy(theirs))
    ids = torch.zeros(1, length, dtype=torch.long)
    mask = torch.ones(1, length, dtype=torch.long)
    mask[0, :padding] = 0

    def prefill(model: nn.Module) -> Callable[[], Tensor]:
        def run() -> Tensor:
            with torch.no_grad():
                return model.model(input_ids=ids, attention_mask=mask, use_cache=False)[0]

        return run

    return {
        "transformers sdpa": peak_tensor_memory(prefill(theirs)),
        "pecode": peak_tensor_memory(prefill(ours)),
    }


# --------------------------------------------------------------------------------------
# An offset bias as a dense mask against FlexAttention's table (pecode.flex)


def _flex_pair(heads: int, head_dim: int, device: torch.device) -> dict[str, nn.Module]:
    """Two causal ALiBi layers with the same weights, ``kernel="dense"`` and ``"flex"``."""
    torch.manual_seed(0)
    dense = MultiHeadAttention(heads * head_dim, heads, position=ALiBi(heads), kernel="dense")
    flex = MultiHeadAttention(heads * head_dim, heads, position=ALiBi(heads), kernel="flex")
    flex.load_state_dict(dense.state_dict())
    return {"dense mask": dense.to(device).eval(), "FlexAttention": flex.to(device).eval()}


def _process_memory() -> tuple[int, int]:
    """This process's resident bytes now and at their peak (Linux's ``/proc``)."""
    values = {}
    with open("/proc/self/status", encoding="ascii") as status:
        for line in status:
            name, _, rest = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                values[name] = int(rest.split()[0]) * 1024
    return values["VmRSS"], values["VmHWM"]


def _peak_memory_child() -> None:
    """Run in a subprocess by ``_peak_memory``: prints ``{kernel: {length: bytes}}``."""
    lengths, heads, head_dim = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    peaks: dict[str, dict[int, int]] = {}
    for name, layer in _flex_pair(heads, head_dim, torch.device("cpu")).items():
        peaks[name] = {}
        for length in lengths:
            x = _randn(1, length, heads * head_dim, device=torch.device("cpu"))
            with torch.no_grad():
                layer(x, causal=True)  # compiles FlexAttention's kernel for this length
                with open("/proc/self/clear_refs", "w", encoding="ascii") as refs:
                    refs.write("5")  # the peak starts again from what is resident now
                before, _ = _process_memory()
                layer(x, causal=True)
                peaks[name][length] = _process_memory()[1] - before
    print(json.dumps(peaks))


def _peak_memory(
    lengths: Sequence[int], heads: int, head_dim: int, device: torch.device
) -> dict[str, dict[int, int]]:
    """Peak extra bytes of one forward per kernel and length: CUDA's allocator statistics
    on a GPU; on the CPU the resident memory's peak (Linux's ``/proc``: pages touched,
    not reserved), in a fresh process whose ``malloc`` returns every block above 128 KiB
    to the system when it is freed (glibc's ``MALLOC_MMAP_THRESHOLD_``), so that the
    resident memory follows the live tensors. Another allocator (jemalloc, tcmalloc)
    keeps freed memory and would undercount."""
    if device.type == "cuda":
        peaks: dict[str, dict[int, int]] = {}
        for name, layer in _flex_pair(heads, head_dim, device).items():
            peaks[name] = {}
            for length in lengths:
                x = _randn(1, length, heads * head_dim, device=device)
                with torch.no_grad():
                    layer(x, causal=True)
                    torch.cuda.synchronize(device)
                    torch.cuda.reset_peak_memory_stats(device)
                    before = torch.cuda.memory_allocated(device)
                    layer(x, causal=True)
                    torch.cuda.synchronize(device)
                    peaks[name][length] = torch.cuda.max_memory_allocated(device) - before
        return peaks
    if not sys.platform.startswith("linux"):
        raise RuntimeError("flex_costs measures the CPU's peak memory through Linux's /proc")
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024), "OMP_NUM_THREADS": "1"}
    code = "from pecode.bench.attention_cases import _peak_memory_child; _peak_memory_child()"
    done = subprocess.run(
        [sys.executable, "-c", code, json.dumps([list(lengths), heads, head_dim])],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:  # out of memory at the longest length, no /proc, ...
        raise RuntimeError(f"the memory measurement failed:\n{done.stderr[-2000:]}")
    peaks = json.loads(done.stdout.strip().splitlines()[-1])
    return {name: {int(n): b for n, b in rows.items()} for name, rows in peaks.items()}


def flex_costs(
    lengths: Sequence[int] = (1024, 2048, 4096, 8192),
    *,
    heads: int = 4,
    head_dim: int = 32,
    device: torch.device | str = "cpu",
    rounds: int = 3,
    num_threads: int | None = 1,
) -> list[dict[str, Any]]:
    """Peak memory and time of a causal ALiBi layer's forward: dense mask or FlexAttention.

    The same layer (``heads`` heads of ``head_dim``) runs ``[1, length, heads·head_dim]``
    without gradient with ``kernel="dense"`` (ALiBi's bias folded into an
    ``[1, H, L, L]`` float mask for SDPA) and ``kernel="flex"`` (:mod:`pecode.flex`:
    a table of ``H·(2L - 1)`` numbers inside FlexAttention). The peak is the memory one
    forward adds (on a GPU, CUDA's allocator statistics; on the CPU, the resident
    memory's peak under Linux, in a fresh process whose glibc ``malloc`` returns every
    freed block above 128 KiB to the system), after a first call that
    compiled FlexAttention's kernel; the times are interleaved rounds, one thread by
    default. One dict per kernel and length: ``kernel``, ``length``, ``peak_bytes``,
    ``mask_bytes`` (``4·H·L²``, the float32 mask itself), ``time`` (a :class:`Spread`
    of seconds), ``time_ratio`` (per round, to the dense mask's) and ``max_error``
    (the largest difference between the two outputs).

    Raises:
        ValueError: a size is not a positive int, or ``device`` is invalid.
        RuntimeError: on the CPU, the system is not Linux.
    """
    device = _check_device(device)
    for name, value in (("heads", heads), ("head_dim", head_dim)):
        check_int(name, value)
    for length in lengths:
        check_int("length", length)
    peaks = _peak_memory(lengths, heads, head_dim, device)
    layers = _flex_pair(heads, head_dim, device)
    rows = []
    for length in lengths:
        x = _randn(1, length, heads * head_dim, device=device)
        methods = {
            name: (lambda layer=layer, x=x: layer(x, causal=True)) for name, layer in layers.items()
        }
        with torch.no_grad():
            samples = time_interleaved(
                methods, rounds=rounds, number=1, device=device, num_threads=num_threads
            )
            outputs = [fn() for fn in methods.values()]
        error = float((outputs[0] - outputs[1]).abs().max())
        rows += [
            {
                "kernel": name,
                "length": length,
                "peak_bytes": peaks[name][length],
                "mask_bytes": 4 * heads * length**2,
                "time": Spread.of(samples[name]),
                "time_ratio": ratio_spread(samples, name, "dense mask"),
                "max_error": error,
            }
            for name in layers
        ]
    return rows
