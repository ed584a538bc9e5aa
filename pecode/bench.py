"""Benchmark harness: what each encoding costs, measured side by side.

Every timing is the median of :func:`torch.utils.benchmark.Timer.blocked_autorange`
after one warm-up call (the timer synchronizes CUDA itself). Times are only compared
within one run, as ratios: against a memory copy of the same tensors (the bandwidth
bound of a memory-bound operation), against the textbook formula, and against the
simplest alternative. Peak memory comes from :func:`pecode.relative.peak_tensor_memory`,
which counts the bytes of every tensor an operation creates, on any device.

Run ``python -m pecode.bench`` for the table of chapter 11 (``--help`` for sizes,
threads and device).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils import benchmark

from pecode.absolute import LearnedPositionalEncoding, SinusoidalPositionalEncoding
from pecode.alibi import ALiBi, alibi_bias
from pecode.attention import MultiHeadAttention
from pecode.relative import (
    DebertaRelativePosition,
    ShawRelativePosition,
    T5RelativePositionBias,
    TransformerXLRelativePosition,
    peak_tensor_memory,
    shaw_key_logits,
    shaw_key_logits_naive,
    shaw_value_term,
    shaw_value_term_naive,
)
from pecode.rope import (
    RotaryEmbedding,
    apply_rope,
    apply_rope_rotate_half,
    rope_cos_sin,
    rope_inv_freq,
)

__all__ = [
    "Measurement",
    "bench_bias_attention",
    "bench_rope",
    "bench_shaw",
    "encoding_costs",
    "format_table",
    "main",
    "median_time",
    "softmax_attention",
]


@dataclass(frozen=True)
class Measurement:
    """One row of the benchmark table.

    Attributes:
        method: what was timed.
        size: the problem size, in words.
        median_s: median seconds per call.
        baseline: what ``ratio`` divides by (``"clone"``, ``"direct"``, ...), or ``""``.
        ratio: ``median_s`` over the baseline's median, measured in the same run.
        textbook_ratio: ``median_s`` over the textbook formula's, or NaN.
        peak_bytes: peak bytes of the tensors the call creates, or -1 if not measured.
        max_error: largest absolute difference from the reference, or NaN.
    """

    method: str
    size: str
    median_s: float
    baseline: str = ""
    ratio: float = math.nan
    textbook_ratio: float = math.nan
    peak_bytes: int = -1
    max_error: float = math.nan


def median_time(fn: Callable[[], Any], *, min_run_time: float = 0.2, num_threads: int = 1) -> float:
    """Median seconds per call of ``fn`` after one warm-up call.

    ``torch.utils.benchmark`` runs ``fn`` in blocks until ``min_run_time`` seconds have
    passed and synchronizes CUDA around each block. ``num_threads`` defaults to 1, as
    in ``Timer``: on a shared CPU a multi-threaded operator waits for its slowest
    thread, and the spread grows with the number of operators it launches.

    Raises:
        TypeError: ``fn`` is not callable.
        ValueError: ``min_run_time`` or ``num_threads`` is not positive.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if not min_run_time > 0:
        raise ValueError(f"min_run_time must be positive, got {min_run_time}")
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be a positive int, got {num_threads!r}")
    fn()  # warm-up: first-call allocations, lazy tables, compilation
    timer = benchmark.Timer(stmt="fn()", globals={"fn": fn}, num_threads=num_threads)
    return timer.blocked_autorange(min_run_time=min_run_time).median


def _time_and_memory(
    candidates: dict[str, Callable[[], Any]], min_run_time: float, num_threads: int
) -> tuple[dict[str, float], dict[str, int]]:
    """Median time and peak tensor memory of each candidate, all in one run."""
    times = {
        name: median_time(fn, min_run_time=min_run_time, num_threads=num_threads)
        for name, fn in candidates.items()
    }
    return times, {name: peak_tensor_memory(fn) for name, fn in candidates.items()}


def _randn(*shape: int, device: torch.device, dtype: torch.dtype = torch.float32) -> Tensor:
    return torch.randn(*shape).to(device=device, dtype=dtype)  # made on the CPU


def bench_rope(
    shape: Sequence[int] = (1, 32, 2048, 128),
    *,
    layouts: Sequence[str] = ("half", "interleaved"),
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    min_run_time: float = 0.2,
    num_threads: int = 1,
) -> list[Measurement]:
    """Time :func:`~pecode.rope.apply_rope` on a query and a key against a copy and the textbook.

    The candidates do the same work, on ``q`` and ``k`` of ``shape``
    ``[B, H, L, Dh]``, all in one run: ``clone`` (copy both tensors into new ones: read
    and write every byte once, the bandwidth bound of an out-of-place operation),
    ``copy_`` (the same copy into tensors allocated beforehand: no allocation, no first
    touch of fresh pages), ``apply_rope`` in each of ``layouts``, and the textbook
    ``x * cos + rotate_half(x) * sin`` with full-width tables
    (:func:`~pecode.rope.apply_rope_rotate_half`, the same arithmetic). ``max_error``
    compares ``apply_rope`` with the differentiable path of the same function (the
    version chapters 8 and 9 test against float64), on the same input.

    Raises:
        ValueError: ``shape`` is not 4-D with an even last dimension.
    """
    if len(shape) != 4 or shape[-1] % 2:
        raise ValueError(f"shape must be [B, H, L, Dh] with Dh even, got {tuple(shape)}")
    device = torch.device(device)
    length, head_dim = shape[-2], shape[-1]
    q, k = _randn(*shape, device=device, dtype=dtype), _randn(*shape, device=device, dtype=dtype)
    cos, sin = rope_cos_sin(torch.arange(length, device=device), rope_inv_freq(head_dim))
    cos_full, sin_full = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    candidates: dict[str, Callable[[], Any]] = {
        "rope: clone": lambda: (q.clone(), k.clone()),
        "rope: copy_": lambda: (q_out.copy_(q), k_out.copy_(k)),
    }
    for layout in layouts:
        candidates[f"rope {layout}: apply_rope"] = lambda layout=layout: (
            apply_rope(q, cos, sin, layout),
            apply_rope(k, cos, sin, layout),
        )
    candidates["rope: textbook"] = lambda: (
        apply_rope_rotate_half(q, cos_full, sin_full).to(dtype),
        apply_rope_rotate_half(k, cos_full, sin_full).to(dtype),
    )
    with torch.no_grad():
        times, peaks = _time_and_memory(candidates, min_run_time, num_threads)
    errors = {}
    for layout in layouts:
        with torch.no_grad():
            fast = apply_rope(q, cos, sin, layout)
        with torch.enable_grad():  # the autograd path, on the same input
            reference = apply_rope(q.clone().requires_grad_(), cos, sin, layout).detach()
        errors[f"rope {layout}: apply_rope"] = float((fast.float() - reference.float()).abs().max())
    size = f"{list(shape)} q,k {str(dtype).removeprefix('torch.')}"
    return [
        Measurement(
            name,
            size,
            times[name],
            "clone",
            times[name] / times["rope: clone"],
            times[name] / times["rope: textbook"],
            peaks[name],
            errors.get(name, math.nan),
        )
        for name in candidates
    ]


def bench_shaw(
    length: int = 2048,
    *,
    heads: int = 8,
    head_dim: int = 64,
    max_distance: int = 16,
    device: torch.device | str = "cpu",
    min_run_time: float = 0.2,
    num_threads: int = 1,
) -> list[Measurement]:
    """Shaw et al.'s key and value terms: the direct ``[L, L, Dh]`` form against the gather form.

    Times :func:`~pecode.relative.shaw_key_logits` plus
    :func:`~pecode.relative.shaw_value_term` (memory-efficient) against their
    ``_naive`` versions, batch 1, and measures each one's peak tensor memory.
    ``ratio`` is the time over the direct form's.

    Raises:
        ValueError: a size is not positive.
    """
    if min(length, heads, head_dim) < 1 or max_distance < 0:
        raise ValueError("length, heads and head_dim must be positive, max_distance >= 0")
    device = torch.device(device)
    q = _randn(1, heads, length, head_dim, device=device)
    weights = torch.softmax(_randn(1, heads, length, length, device=device), dim=-1)
    rows_k = _randn(2 * max_distance + 1, head_dim, device=device)
    rows_v = _randn(2 * max_distance + 1, head_dim, device=device)
    pos = torch.arange(length, device=device)

    def run(key_fn: Callable, value_fn: Callable) -> Callable[[], Any]:
        return lambda: (
            key_fn(q, rows_k, pos, pos, max_distance),
            value_fn(weights, rows_v, pos, pos, max_distance),
        )

    candidates = {
        "direct": run(shaw_key_logits_naive, shaw_value_term_naive),
        "gather": run(shaw_key_logits, shaw_value_term),
    }
    with torch.no_grad():
        times, peaks = _time_and_memory(candidates, min_run_time, num_threads)
        outs = [fn() for fn in candidates.values()]
    error = max(float((a - b).abs().max()) for a, b in zip(*outs, strict=True))
    size = f"L={length} H={heads} Dh={head_dim} k={max_distance}"
    return [
        Measurement(
            f"shaw key+value: {name}",
            size,
            times[name],
            "direct",
            times[name] / times["direct"],
            peak_bytes=peaks[name],
            max_error=error if name == "gather" else math.nan,
        )
        for name in candidates
    ]


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
    min_run_time: float = 0.2,
    num_threads: int = 1,
) -> list[Measurement]:
    """ALiBi and T5 biases: ``scaled_dot_product_attention`` with a float mask vs by hand.

    The bias is built once (ALiBi: :func:`~pecode.alibi.alibi_bias`, causal; T5: a
    :class:`~pecode.relative.T5RelativePositionBias` table lookup, logit scale 1) and
    both versions receive the same tensor; ``ratio`` is the time over the
    hand-written :func:`softmax_attention`'s.

    Raises:
        ValueError: a size is not positive.
    """
    if min(length, heads, head_dim) < 1:
        raise ValueError("length, heads and head_dim must be positive")
    device = torch.device(device)
    q, k, v = (_randn(1, heads, length, head_dim, device=device) for _ in range(3))
    pos = torch.arange(length)
    t5 = T5RelativePositionBias(heads).to(device)
    biases = {
        "alibi": (alibi_bias(heads, length, device=device).unsqueeze(0), head_dim**-0.5),
        "t5": (t5.position_bias(pos, pos).unsqueeze(0).detach(), 1.0),
    }
    rows = []
    for name, (bias, scale) in biases.items():
        candidates = {
            "by hand": lambda b=bias, s=scale: softmax_attention(q, k, v, b, s),
            "sdpa": lambda b=bias, s=scale: F.scaled_dot_product_attention(
                q, k, v, attn_mask=b, scale=s
            ),
        }
        with torch.no_grad():
            times, peaks = _time_and_memory(candidates, min_run_time, num_threads)
            outs = [fn() for fn in candidates.values()]
        error = float((outs[0] - outs[1]).abs().max())
        for n in candidates:
            rows.append(
                Measurement(
                    f"{name} attention: {n}",
                    f"L={length} H={heads} Dh={head_dim}",
                    times[n],
                    "by hand",
                    times[n] / times["by hand"],
                    peak_bytes=peaks[n],
                    max_error=error if n == "sdpa" else math.nan,
                )
            )
    return rows


class _AddThenAttend(nn.Module):
    """An absolute encoding added to the input, then attention without positions."""

    def __init__(self, encoding: nn.Module, attention: MultiHeadAttention) -> None:
        super().__init__()
        self.encoding, self.attention = encoding, attention

    def forward(self, x: Tensor) -> Tensor:
        return self.attention(self.encoding(x))


def _encoding_layers(length: int, dim: int, heads: int, max_distance: int) -> dict[str, nn.Module]:
    head_dim = dim // heads

    def attend(position: Any = None) -> MultiHeadAttention:
        return MultiHeadAttention(dim, heads, position=position)

    return {
        "none": attend(),
        "sinusoidal": _AddThenAttend(SinusoidalPositionalEncoding(dim, max_len=length), attend()),
        "learned": _AddThenAttend(LearnedPositionalEncoding(length, dim), attend()),
        "shaw": attend(ShawRelativePosition(head_dim, max_distance)),
        "transformer-xl": attend(TransformerXLRelativePosition(dim, heads, head_dim)),
        "t5": attend(T5RelativePositionBias(heads)),
        "deberta": attend(DebertaRelativePosition(dim, heads, head_dim, max_distance)),
        "alibi": attend(ALiBi(heads)),
        "rope": attend(RotaryEmbedding(head_dim)),
    }


def encoding_costs(
    lengths: Sequence[int] = (256, 1024),
    *,
    dim: int = 256,
    heads: int = 4,
    max_distance: int = 16,
    device: torch.device | str = "cpu",
    min_run_time: float = 0.1,
    num_threads: int = 1,
) -> list[dict[str, Any]]:
    """Parameters, extra memory and time per forward of one attention layer, per encoding.

    Each encoding runs in a :class:`~pecode.attention.MultiHeadAttention` of width
    ``dim`` (absolute encodings are added to its input), batch 1, no mask, no
    gradient. Parameters count only the encoding's own (a learned table of ``length``
    rows for ``"learned"``); ``extra_bytes`` is the peak tensor memory of the forward
    minus that of the layer without positions; ``time_ratio`` its median time over
    that layer's, measured in the same run.

    One dict is returned per encoding and length, with the keys ``encoding``,
    ``length``, ``parameters``, ``extra_bytes``, ``median_s`` and ``time_ratio``.
    """
    device = torch.device(device)
    rows = []
    for length in lengths:
        layers = _encoding_layers(length, dim, heads, max_distance)
        x = _randn(1, length, dim, device=device)
        base_params = sum(p.numel() for p in layers["none"].parameters())
        results = {}
        with torch.no_grad():
            for name, layer in layers.items():
                layer.to(device).eval()
                fn = lambda layer=layer, x=x: layer(x)  # noqa: E731
                results[name] = (
                    median_time(fn, min_run_time=min_run_time, num_threads=num_threads),
                    peak_tensor_memory(fn),
                    sum(p.numel() for p in layer.parameters()) - base_params,
                )
        base_time, base_peak, _ = results["none"]
        for name, (seconds, peak, params) in results.items():
            rows.append(
                {
                    "encoding": name,
                    "length": length,
                    "parameters": params,
                    "extra_bytes": peak - base_peak,
                    "median_s": seconds,
                    "time_ratio": seconds / base_time,
                }
            )
    return rows


def _bytes(n: int) -> str:
    if n < 0:
        return "-"
    return f"{n / 2**20:9.1f} MiB"


def format_table(rows: Sequence[Measurement]) -> str:
    """The measurements as a fixed-width text table (times in ms, ratios to two decimals)."""
    header = (
        f"{'method':32s} {'size':34s} {'median':>9s} {'ratio':>16s} "
        f"{'/ textbook':>10s} {'peak memory':>13s} {'max |err|':>9s}"
    )
    lines = [header, "-" * len(header)]
    for r in rows:
        ratio = f"{r.ratio:6.2f} x {r.baseline}" if r.baseline else ""
        textbook = "" if math.isnan(r.textbook_ratio) else f"{r.textbook_ratio:.2f}"
        error = "" if math.isnan(r.max_error) else f"{r.max_error:.1e}"
        lines.append(
            f"{r.method:32s} {r.size:34s} {r.median_s * 1e3:7.2f}ms {ratio:>16s} "
            f"{textbook:>10s} {_bytes(r.peak_bytes):>13s} {error:>9s}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[Measurement]:
    """Command line: ``python -m pecode.bench [--quick] [--device D] [--threads N]``."""
    parser = argparse.ArgumentParser(prog="python -m pecode.bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="small sizes (seconds)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    parser.add_argument("--min-run-time", type=float, default=0.2, help="seconds per timing")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    opts: dict[str, Any] = {
        "device": device,
        "min_run_time": args.min_run_time,
        "num_threads": args.threads,
    }
    if args.quick:
        rope_shapes: list[tuple[int, ...]] = [(1, 8, 256, 64)]
        shaw_lengths, attention_lengths = [256], [256]
    else:
        rope_shapes = [(1, 32, 512, 128), (1, 32, 2048, 128), (1, 8, 4096, 64)]
        shaw_lengths, attention_lengths = [512, 2048], [512, 2048]
    print(f"torch {torch.__version__}, device {device}, threads {args.threads}")
    rows: list[Measurement] = []
    for shape in rope_shapes:
        rows.extend(bench_rope(shape, **opts))
        if device.type == "cpu":
            rows.extend(bench_rope(shape, layouts=("half",), dtype=torch.bfloat16, **opts)[:3])
    rows.extend(r for n in shaw_lengths for r in bench_shaw(n, **opts))
    rows.extend(r for n in attention_lengths for r in bench_bias_attention(n, **opts))
    print(format_table(rows))
    return rows


if __name__ == "__main__":
    main()
