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
  about one ``copy_`` in one round and several in the next (chapter 11 shows both):
  "a small multiple of a clone" is no bandwidth bound. The default sizes
  (:func:`bench_rope_sweep`) run across that range.

Run ``python -m pecode.bench`` for the RoPE table (``--help`` for sizes, rounds, dtype,
threads and device). :func:`bench_shaw`, :func:`bench_bias_attention` and
:func:`encoding_costs` compare the other encodings of chapter 11 the same way
(:class:`Comparison`), with the tensor memory of each method (:func:`peak_tensor_memory`).
:func:`recorded_cases` loads the runs the book quotes but a reader's machine cannot
repeat (a GPU's).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.resources
import inspect
import json
import math
import random
import statistics
import time
import timeit
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from pecode._checks import check_int
from pecode.absolute import LearnedPositionalEncoding, SinusoidalPositionalEncoding
from pecode.alibi import ALiBi, alibi_bias
from pecode.attention import MultiHeadAttention
from pecode.experiments import cpu_threads
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
from pecode.rope import (
    RotaryEmbedding,
    apply_rope,
    apply_rope_complex,
    apply_rope_rotate_half,
    rope_cos_sin,
    rope_inv_freq,
)

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
    "encoding_costs",
    "encoding_layers",
    "format_cases",
    "main",
    "peak_tensor_memory",
    "ratio_spread",
    "recorded_cases",
    "rope_methods",
    "softmax_attention",
    "time_first_call",
    "time_interleaved",
]

# --------------------------------------------------------------------------------------
# The timing core: interleaved rounds, spreads, per-round ratios
# --------------------------------------------------------------------------------------

_MAX_NUMBER = 10**6  # calls in one sample, at most


def _check_device(device: torch.device | str) -> torch.device:
    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as err:
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}") from err
    if device.type not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device is 'cuda' but torch.cuda.is_available() is False")
    return device


def _torch_threads(num_threads: int | None) -> contextlib.AbstractContextManager[None]:
    """:func:`pecode.experiments.cpu_threads`, or nothing when ``num_threads`` is None."""
    return contextlib.nullcontext() if num_threads is None else cpu_threads(num_threads)


def _sampler(
    fn: Callable[[], Any], device: torch.device, clock: Callable[[], float] | None
) -> Callable[[int], float]:
    """A function ``number -> seconds per call`` of ``number`` back-to-back calls of ``fn``.

    On CUDA without an explicit ``clock``: CUDA events recorded before the first and
    after the last call, after a synchronisation, so the time is the stream's. Otherwise
    ``timeit.Timer`` with ``clock`` (``time.perf_counter`` by default), which also
    turns the garbage collector off while it times.
    """
    if device.type == "cuda" and clock is None:

        def sample_cuda(number: int) -> float:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            start.record()
            for _ in range(number):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3 / number

        return sample_cuda
    timer = timeit.Timer("fn()", timer=clock or time.perf_counter, globals={"fn": fn})
    return lambda number: timer.timeit(number) / number


def _calls_per_sample(sample: Callable[[int], float], target_s: float) -> int:
    """How many calls make one sample last about ``target_s`` seconds (at least one)."""
    number = 1
    while True:
        per_call = sample(number)
        if per_call * number >= target_s / 10 or number >= _MAX_NUMBER:
            break
        number = min(10 * number, _MAX_NUMBER)
    if per_call <= 0:
        return number
    return max(1, min(_MAX_NUMBER, math.ceil(target_s / per_call)))


def time_interleaved(
    methods: Mapping[str, Callable[[], Any]],
    *,
    rounds: int = 5,
    number: int | Mapping[str, int] | None = None,
    target_s: float = 0.05,
    warmup: int = 1,
    shuffle: bool = False,
    seed: int = 0,
    num_threads: int | None = 1,
    device: torch.device | str = "cpu",
    clock: Callable[[], float] | None = None,
) -> dict[str, tuple[float, ...]]:
    """Seconds per call of each method, one sample per round, methods interleaved.

    Every method is first called ``warmup`` times (first-call allocations, lazy tables,
    compilation). Then round ``r`` takes one sample of each method in turn (in the
    order of ``methods``, or in a fresh random order per round with ``shuffle=True``),
    and only then does round ``r + 1`` start: a disturbance that lasts a few samples
    slows the methods of one round alike, and per-round ratios
    (:func:`ratio_spread`) cancel it. A sample is ``number`` back-to-back calls,
    divided by ``number``; by default ``number`` is chosen per method, once, so that a
    sample lasts about ``target_s`` seconds (at least one call). On CUDA the samples are
    CUDA-event times; on the CPU they come from ``timeit.Timer`` with ``clock``
    (``time.perf_counter`` by default; tests pass a fake one).

    Args:
        methods: name -> a callable with no arguments.
        rounds: samples per method.
        number: calls per sample, for all methods or per name; None to calibrate.
        target_s: seconds a calibrated sample aims at.
        warmup: untimed calls of each method before the first round.
        shuffle: shuffle the order of the methods in each round (seeded by ``seed``).
        seed: seed of the shuffles.
        num_threads: ``torch.set_num_threads`` while timing (restored after); None
            keeps the current setting.
        device: ``"cpu"`` or ``"cuda"``: where the methods run.
        clock: a function returning seconds, used instead of CUDA events or
            ``time.perf_counter``.

    Returns:
        name -> ``rounds`` seconds per call, in round order, names in the order of
        ``methods``.

    Raises:
        TypeError: a method is not callable.
        ValueError: no methods, or a count, ``target_s`` or ``device`` is invalid.
    """
    if not methods:
        raise ValueError("methods must name at least one callable")
    for name, fn in methods.items():
        if not callable(fn):
            raise TypeError(f"methods[{name!r}] must be callable, got {type(fn).__name__}")
    check_int("rounds", rounds)
    if isinstance(warmup, bool) or not isinstance(warmup, int) or warmup < 0:
        raise ValueError(f"warmup must be a non-negative int, got {warmup!r}")
    if not target_s > 0:
        raise ValueError(f"target_s must be positive, got {target_s}")
    if num_threads is not None:
        check_int("num_threads", num_threads)
    device = _check_device(device)
    names = list(methods)
    if isinstance(number, Mapping):
        missing = [name for name in names if name not in number]
        if missing:
            raise ValueError(f"number has no entry for {missing}")
        for name in names:
            check_int(f"number[{name!r}]", number[name])
    elif number is not None:
        check_int("number", number)
    samplers = {name: _sampler(methods[name], device, clock) for name in names}
    samples: dict[str, list[float]] = {name: [] for name in names}
    order_rng = random.Random(seed)
    with _torch_threads(num_threads):
        for _ in range(warmup):
            for name in names:
                methods[name]()
        if number is None:
            calls = {name: _calls_per_sample(samplers[name], target_s) for name in names}
        elif isinstance(number, Mapping):
            calls = {name: number[name] for name in names}
        else:
            calls = dict.fromkeys(names, number)
        for _ in range(rounds):
            order = list(names)
            if shuffle:
                order_rng.shuffle(order)
            for name in order:
                samples[name].append(samplers[name](calls[name]))
    return {name: tuple(samples[name]) for name in names}


def time_first_call(
    fn: Callable[[], Any],
    *,
    num_threads: int | None = 1,
    device: torch.device | str = "cpu",
    clock: Callable[[], float] | None = None,
) -> float:
    """Seconds of one call of ``fn``, timed alone: for a first call.

    A first call may pay for what later calls reuse (lazy tables, compilation, fresh
    memory). It is timed like a sample of :func:`time_interleaved` (same threads, same
    clock, CUDA events on CUDA), so that it can be compared with the medians of
    later calls. Call it before anything else has called ``fn``.

    Raises:
        TypeError: ``fn`` is not callable.
        ValueError: ``num_threads`` or ``device`` is invalid.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    if num_threads is not None:
        check_int("num_threads", num_threads)
    device = _check_device(device)
    with _torch_threads(num_threads):
        return _sampler(fn, device, clock)(1)


@dataclass(frozen=True)
class Spread:
    """Median, quartiles and extremes of a few numbers (one per round).

    The quartiles interpolate linearly between the sorted values (``numpy``'s default,
    ``statistics.quantiles`` with ``method="inclusive"``); with one value all five
    fields equal it.

    Attributes:
        median: the middle value.
        q1: the first quartile.
        q3: the third quartile; ``q3 - q1`` is the interquartile range.
        min: the smallest value.
        max: the largest value.
    """

    median: float
    q1: float
    q3: float
    min: float
    max: float

    @classmethod
    def of(cls, values: Sequence[float]) -> Spread:
        """The spread of ``values``.

        Raises:
            ValueError: ``values`` is empty or holds a NaN.
        """
        data = sorted(float(v) for v in values)
        if not data:
            raise ValueError("values must not be empty")
        if any(math.isnan(v) for v in data):
            raise ValueError(f"values must not contain NaN, got {data}")
        if len(data) == 1:
            return cls(data[0], data[0], data[0], data[0], data[0])
        q1, median, q3 = statistics.quantiles(data, n=4, method="inclusive")
        return cls(median, q1, q3, data[0], data[-1])

    def __str__(self) -> str:
        return f"{_short(self.median)} [{_short(self.q1)}, {_short(self.q3)}]"


def _short(value: float) -> str:
    """A positive ratio with three significant digits or two decimals: 0.53, 4.13, 28.4, 312."""
    if abs(value) >= 100:
        return f"{value:.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def ratio_spread(samples: Mapping[str, Sequence[float]], method: str, yardstick: str) -> Spread:
    """The spread over rounds of ``method``'s time divided by ``yardstick``'s in the same round.

    The quotient is taken round by round and only then summarised, so that a round in
    which a neighbour slowed everything down gives an ordinary ratio instead of an
    outlier; the median of the quotients is in general not the quotient of the medians.

    Raises:
        ValueError: a name is missing, the two have different numbers of rounds, or a
            yardstick time is not positive.
    """
    for name in (method, yardstick):
        if name not in samples:
            raise ValueError(f"no samples for {name!r}; have {list(samples)}")
    top, bottom = samples[method], samples[yardstick]
    if len(top) != len(bottom):
        raise ValueError(
            f"{method!r} has {len(top)} rounds and {yardstick!r} {len(bottom)}: "
            "ratios need the same rounds"
        )
    if any(not t > 0 for t in bottom):
        raise ValueError(f"times of {yardstick!r} must be positive, got {list(bottom)}")
    return Spread.of([t / b for t, b in zip(top, bottom, strict=True)])


# --------------------------------------------------------------------------------------
# RoPE: the methods, one case, a sweep of sizes, the decode step
# --------------------------------------------------------------------------------------

YARDSTICK, FORWARD, TRAINING = "yardstick", "forward", "forward+backward"
_MODE_SHORT = {FORWARD: "fwd", TRAINING: "fwd+bwd"}

# Peers: (name, module, attribute, pip package). Each one is imported when a case is
# built; one that cannot be imported is skipped with a note.
_PEERS = (
    ("hf", "transformers.models.llama.modeling_llama", "apply_rotary_pos_emb", "transformers"),
    ("torchtune", "torchtune.modules", "RotaryPositionalEmbeddings", "torchtune"),
    (
        "rotary-embedding-torch",
        "rotary_embedding_torch",
        "RotaryEmbedding",
        "rotary-embedding-torch",
    ),
)


def _import_peer(module: str, attribute: str) -> tuple[Any, str]:
    """The peer's function or class and ``""``, or None and why it could not be imported."""
    try:
        return getattr(importlib.import_module(module), attribute), ""
    except Exception as err:  # a peer's own import errors (missing extras) mean "skip"
        return None, f"{type(err).__name__}: {err}".splitlines()[0]


def _accepts_out(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes an ``out`` argument (``apply_rope`` gained one in issue 16)."""
    try:
        return "out" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


@dataclass(frozen=True)
class RopeInputs:
    """The tensors of one RoPE case, shared by all its methods.

    Attributes:
        q: the query, ``[B, H, L, Dh]``, no gradient.
        k: the key, like ``q``.
        q_leaf: a copy of ``q`` that requires a gradient (forward + backward methods).
        k_leaf: a copy of ``k`` that requires a gradient.
        grad_q: the upstream gradient given to ``backward`` for the rotated query.
        grad_k: the upstream gradient for the rotated key.
        cos: the half-width table ``[L, Dh // 2]`` (float32, :func:`~pecode.rope.rope_cos_sin`).
        sin: like ``cos``.
        positions: the ``L`` positions, ``start, ..., start + L - 1``.
        inv_freq: the ``Dh // 2`` frequencies (:func:`~pecode.rope.rope_inv_freq`).
    """

    q: Tensor
    k: Tensor
    q_leaf: Tensor
    k_leaf: Tensor
    grad_q: Tensor
    grad_k: Tensor
    cos: Tensor
    sin: Tensor
    positions: Tensor
    inv_freq: Tensor


@dataclass(frozen=True)
class RopeMethod:
    """One way to rotate the query and the key, as a timed call.

    Attributes:
        fn: the call that is timed (no arguments). It returns the rotated query and
            key; a forward + backward call first sets its inputs' ``.grad`` to None,
            then runs the forward and ``torch.autograd.backward`` with the case's
            upstream gradients.
        mode: ``"forward"`` or ``"forward+backward"``.
        kind: ``"yardstick"``, ``"pecode"``, ``"textbook"`` (a form chapters 8 and 9
            teach) or ``"peer"`` (another library).
        layout: the pairing its result follows (``"half"`` or ``"interleaved"``), or
            None for a yardstick.
        check: calls ``fn`` once and returns the rotated query, the rotated key and,
            for forward + backward, the gradients of the query and the key (else None),
            all as ``[B, H, L, Dh]``.
    """

    fn: Callable[[], Any]
    mode: str
    kind: str
    layout: str | None
    check: Callable[[], tuple[Tensor, Tensor, Tensor | None, Tensor | None]]


@dataclass(frozen=True)
class RopeSetup:
    """What :func:`rope_methods` builds.

    Attributes:
        methods: name -> :class:`RopeMethod`, yardsticks first.
        inputs: the shared tensors.
        notes: one line per method left out, and why.
    """

    methods: dict[str, RopeMethod]
    inputs: RopeInputs
    notes: tuple[str, ...]


def _check_shape(shape: Sequence[int]) -> tuple[int, int, int, int]:
    shape = tuple(shape)
    if (
        len(shape) != 4
        or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in shape)
        or shape[-1] % 2
    ):
        raise ValueError(f"shape must be [B, H, L, Dh] of positive ints, Dh even, got {shape}")
    return shape  # type: ignore[return-value]


def rope_methods(
    shape: Sequence[int],
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    position: int = 0,
    layouts: Sequence[str] = ("half", "interleaved"),
    backward: bool = True,
    peers: bool = True,
    textbook: bool = True,
    seed: int = 0,
) -> RopeSetup:
    """The methods one RoPE case times, on one query and one key of ``shape``.

    In order:

    * yardsticks: ``copy_`` (q and k into tensors allocated beforehand), ``clone``;
    * ``apply_rope <layout>`` for each of ``layouts``, and ``apply_rope <layout> out=``
      into preallocated tensors when :func:`~pecode.rope.apply_rope` takes ``out``;
    * with ``textbook``: ``rotate_half textbook`` (:func:`~pecode.rope.apply_rope_rotate_half`
      with full-width tables made beforehand, half layout) and ``complex textbook``
      (:func:`~pecode.rope.apply_rope_complex`, interleaved; it builds its table at
      every call, as its signature asks). The rotation-matrix form is left out: its
      ``O(Dh²)`` work per token is chapter 9's point, not a contender;
    * with ``peers``, each one that imports: Hugging Face's ``apply_rotary_pos_emb``
      (``transformers.models.llama.modeling_llama``, half layout, tables of ``x``'s dtype
      as its model passes them), torchtune's ``RotaryPositionalEmbeddings``
      (interleaved, on ``[B, L, H, Dh]`` copies of q and k: its layout) and
      rotary-embedding-torch's ``RotaryEmbedding.rotate_queries_or_keys``
      (interleaved); a peer builds or looks up its own tables;
    * with ``backward``, the same as forward + backward: ``identity fwd+bwd``
      (clone q and k, backward: the least arithmetic a training path can do, though
      not always the least time, since its outputs and gradients are new memory),
      ``apply_rope <layout> fwd+bwd`` and the peers' ``... fwd+bwd``.

    The tables hold positions ``position, ..., position + L - 1``; a decode step is
    ``L = 1`` at a large ``position``. Random data is made on the CPU with ``seed``,
    then moved to ``device``.

    Shapes::

        shape: [B, H, L, Dh]   (q, k, the upstream gradients)
        cos, sin: [L, Dh // 2] float32

    Raises:
        ValueError: ``shape``, ``position``, ``layouts`` or ``device`` is invalid.
        TypeError: ``dtype`` is not a floating dtype.
    """
    batch, _, length, head_dim = _check_shape(shape)
    device = _check_device(device)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating torch.dtype, got {dtype!r}")
    if isinstance(position, bool) or not isinstance(position, int) or position < 0:
        raise ValueError(f"position must be a non-negative int, got {position!r}")
    layouts = tuple(layouts)
    if not layouts or any(layout not in ("half", "interleaved") for layout in layouts):
        raise ValueError(f"layouts must be 'half' and/or 'interleaved', got {layouts}")
    generator = torch.Generator().manual_seed(seed)

    def randn() -> Tensor:
        return torch.randn(shape, generator=generator).to(device=device, dtype=dtype)

    q, k, grad_q, grad_k = randn(), randn(), randn(), randn()
    positions = torch.arange(position, position + length, device=device)
    inv_freq = rope_inv_freq(head_dim).to(device)
    cos, sin = rope_cos_sin(positions, inv_freq)
    inputs = RopeInputs(
        q,
        k,
        q.detach().clone().requires_grad_(),
        k.detach().clone().requires_grad_(),
        grad_q,
        grad_k,
        cos,
        sin,
        positions,
        inv_freq,
    )
    q_out, k_out = torch.empty_like(q), torch.empty_like(k)
    methods: dict[str, RopeMethod] = {}
    notes: list[str] = []

    def same(t: Tensor) -> Tensor:
        return t

    def forward(
        name: str,
        fn: Callable[[], tuple[Tensor, Tensor]],
        kind: str,
        layout: str | None,
        to_bhld: Callable[[Tensor], Tensor] = same,
    ) -> None:
        def check() -> tuple[Tensor, Tensor, None, None]:
            rotated_q, rotated_k = fn()
            return to_bhld(rotated_q), to_bhld(rotated_k), None, None

        methods[name] = RopeMethod(fn, FORWARD, kind, layout, check)

    def training(
        name: str,
        rotate: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]],
        kind: str,
        layout: str | None,
        leaves: tuple[Tensor, Tensor] = (inputs.q_leaf, inputs.k_leaf),
        upstream: tuple[Tensor, Tensor] = (grad_q, grad_k),
        to_bhld: Callable[[Tensor], Tensor] = same,
    ) -> None:
        if not backward:
            return
        leaf_q, leaf_k = leaves

        def fn() -> tuple[Tensor, Tensor]:
            leaf_q.grad = leaf_k.grad = None  # as optimizer.zero_grad() leaves them
            rotated = rotate(leaf_q, leaf_k)
            torch.autograd.backward(rotated, upstream)
            return rotated

        def check() -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
            rotated_q, rotated_k = fn()
            grads = [None if g is None else to_bhld(g) for g in (leaf_q.grad, leaf_k.grad)]
            return to_bhld(rotated_q.detach()), to_bhld(rotated_k.detach()), *grads

        methods[name] = RopeMethod(fn, TRAINING, kind, layout, check)

    forward("copy_", lambda: (q_out.copy_(q), k_out.copy_(k)), YARDSTICK, None)
    forward("clone", lambda: (q.clone(), k.clone()), YARDSTICK, None)
    has_out = _accepts_out(apply_rope)
    for layout in layouts:
        forward(
            f"apply_rope {layout}",
            lambda layout=layout: (
                apply_rope(q, cos, sin, layout),
                apply_rope(k, cos, sin, layout),
            ),
            "pecode",
            layout,
        )
        if has_out:
            forward(
                f"apply_rope {layout} out=",
                lambda layout=layout: (
                    apply_rope(q, cos, sin, layout, out=q_out),
                    apply_rope(k, cos, sin, layout, out=k_out),
                ),
                "pecode",
                layout,
            )
    if not has_out:
        notes.append("apply_rope takes no out= argument: no out= rows")
    if textbook:
        cos_full, sin_full = torch.cat((cos, cos), -1), torch.cat((sin, sin), -1)
        if "half" in layouts:
            forward(
                "rotate_half textbook",
                lambda: (
                    apply_rope_rotate_half(q, cos_full, sin_full).to(dtype),
                    apply_rope_rotate_half(k, cos_full, sin_full).to(dtype),
                ),
                "textbook",
                "half",
            )
        if "interleaved" in layouts:
            forward(
                "complex textbook",
                lambda: (
                    apply_rope_complex(q, positions, inv_freq).to(dtype),
                    apply_rope_complex(k, positions, inv_freq).to(dtype),
                ),
                "textbook",
                "interleaved",
            )
    training("identity fwd+bwd", lambda a, b: (a.clone(), b.clone()), YARDSTICK, None)
    for layout in layouts:
        training(
            f"apply_rope {layout} fwd+bwd",
            lambda a, b, layout=layout: (
                apply_rope(a, cos, sin, layout),
                apply_rope(b, cos, sin, layout),
            ),
            "pecode",
            layout,
        )
    if peers:
        _add_peers(
            inputs, dtype, position, layouts, forward, training, notes, (batch, length, head_dim)
        )
    forward_first = sorted(methods.items(), key=lambda item: item[1].mode == TRAINING)
    return RopeSetup(dict(forward_first), inputs, tuple(notes))


def _add_peers(
    inputs: RopeInputs,
    dtype: torch.dtype,
    position: int,
    layouts: tuple[str, ...],
    forward: Callable[..., None],
    training: Callable[..., None],
    notes: list[str],
    sizes: tuple[int, int, int],
) -> None:
    """Add the peers that import, each in the layout it implements; note the others."""
    batch, length, head_dim = sizes
    q, k, cos, sin = inputs.q, inputs.k, inputs.cos, inputs.sin
    device = q.device
    for name, module, attribute, package in _PEERS:
        layout = "half" if name == "hf" else "interleaved"
        if layout not in layouts:
            continue
        peer, why = _import_peer(module, attribute)
        if peer is None:
            notes.append(f"{name} ({package}) not importable, skipped: {why}")
            continue
        if name == "hf":
            # [1, L, Dh] full-width tables in x's dtype, as LlamaRotaryEmbedding returns them
            cos_hf = torch.cat((cos, cos), -1).to(dtype).unsqueeze(0)
            sin_hf = torch.cat((sin, sin), -1).to(dtype).unsqueeze(0)
            label = "hf apply_rotary_pos_emb"
            forward(label, lambda f=peer, c=cos_hf, s=sin_hf: f(q, k, c, s), "peer", layout)
            training(
                f"{label} fwd+bwd",
                lambda a, b, f=peer, c=cos_hf, s=sin_hf: f(a, b, c, s),
                "peer",
                layout,
            )
        elif name == "torchtune":
            # its input is [B, L, H, Dh]; positions as input_pos [B, L] after a prompt
            rope = peer(head_dim, max_seq_len=position + length).to(device)
            input_pos = None if position == 0 else inputs.positions.expand(batch, length)

            def to_bhld(t: Tensor) -> Tensor:
                return t.transpose(1, 2)

            q_t, k_t = (t.transpose(1, 2).contiguous() for t in (q, k))
            leaves = tuple(t.detach().clone().requires_grad_() for t in (q_t, k_t))
            upstream = tuple(g.transpose(1, 2).contiguous() for g in (inputs.grad_q, inputs.grad_k))
            forward(
                "torchtune",
                lambda r=rope, p=input_pos, a=q_t, b=k_t: (r(a, input_pos=p), r(b, input_pos=p)),
                "peer",
                layout,
                to_bhld,
            )
            training(
                "torchtune fwd+bwd",
                lambda a, b, r=rope, p=input_pos: (r(a, input_pos=p), r(b, input_pos=p)),
                "peer",
                layout,
                leaves,
                upstream,
                to_bhld,
            )
        else:
            rotary = peer(dim=head_dim).to(device)
            forward(
                "rotary-embedding-torch",
                lambda r=rotary: (
                    r.rotate_queries_or_keys(q, offset=position),
                    r.rotate_queries_or_keys(k, offset=position),
                ),
                "peer",
                layout,
            )
            training(
                "rotary-embedding-torch fwd+bwd",
                lambda a, b, r=rotary: (
                    r.rotate_queries_or_keys(a, offset=position),
                    r.rotate_queries_or_keys(b, offset=position),
                ),
                "peer",
                layout,
            )


def _rotate_reference(x: Tensor, cos: Tensor, sin: Tensor, layout: str, sign: float) -> Tensor:
    """``x`` rotated by ``sign`` times the tables' angles, as complex numbers in float64.

    The harness's own check of every method's output (``sign=1``) and gradient
    (``sign=-1``: the gradient of a rotation is the rotation back), with the tables
    the case gave ``apply_rope`` promoted to float64, so that the error measures the
    method's arithmetic, not the tables'.
    """
    half = x.shape[-1] // 2
    rotor = torch.complex(cos.double(), sign * sin.double())
    if layout == "interleaved":
        z = torch.view_as_complex(x.detach().double().unflatten(-1, (half, 2)).contiguous())
        return torch.view_as_real(z * rotor).flatten(-2)
    z = torch.complex(x[..., :half].detach().double(), x[..., half:].detach().double())
    turned = z * rotor
    return torch.cat((turned.real, turned.imag), dim=-1)


def _max_errors(setup: RopeSetup) -> dict[str, float]:
    """Largest absolute error of each method's output (and gradients) against float64."""
    inputs = setup.inputs
    errors = {name: math.nan for name in setup.methods}
    for layout in ("half", "interleaved"):
        names = [n for n, m in setup.methods.items() if m.layout == layout]
        if not names:
            continue
        want_q, want_k = (
            _rotate_reference(x, inputs.cos, inputs.sin, layout, 1.0) for x in (inputs.q, inputs.k)
        )
        want_gq, want_gk = (
            _rotate_reference(g, inputs.cos, inputs.sin, layout, -1.0)
            for g in (inputs.grad_q, inputs.grad_k)
        )
        for name in names:
            got = setup.methods[name].check()
            pairs = [(got[0], want_q), (got[1], want_k)]
            if setup.methods[name].mode == TRAINING:
                pairs += [(got[2], want_gq), (got[3], want_gk)]
            errors[name] = max(
                math.inf if a is None else float((a.double() - b).abs().max()) for a, b in pairs
            )
        del want_q, want_k, want_gq, want_gk
    return errors


@dataclass(frozen=True)
class Row:
    """One method of one case, summarised: a line of :func:`format_cases`.

    Attributes:
        method: the method's name (see :func:`rope_methods`).
        mode: ``"forward"`` or ``"forward+backward"``.
        kind: ``"yardstick"``, ``"pecode"``, ``"textbook"`` or ``"peer"``.
        case: the case's label (shape, dtype, bytes).
        time: seconds per call over the rounds.
        vs_copy: per-round ratio to ``copy_`` of q and k (the bandwidth bound).
        vs_clone: per-round ratio to ``clone`` of q and k.
        peer: the fastest peer of the same mode (by median time), or ``""``.
        vs_peer: per-round ratio to ``peer``, or None.
        max_error: largest absolute error against the float64 rotation (outputs and,
            for forward + backward, gradients), NaN for a yardstick.
    """

    method: str
    mode: str
    kind: str
    case: str
    time: Spread
    vs_copy: Spread
    vs_clone: Spread
    peer: str
    vs_peer: Spread | None
    max_error: float


@dataclass(frozen=True)
class Case:
    """Every method of one RoPE size, timed in the same interleaved rounds.

    :meth:`Case.time` and :meth:`Case.ratio` summarise any method against any other,
    so a page can quote a ratio the table does not print; :meth:`Case.rows` gives the
    table's lines and :meth:`Case.as_dict` a JSON-ready record.

    Attributes:
        label: shape, dtype and bytes per tensor, in words.
        shape: ``(B, H, L, Dh)`` of q and of k.
        dtype: q's dtype, e.g. ``"float32"``.
        device: ``"cpu"`` or ``"cuda"`` (with its name on CUDA).
        position: the first position of the tables.
        threads: torch's CPU threads while timing.
        rounds: samples per method.
        samples: method -> seconds per call, one per round.
        modes: method -> ``"forward"`` or ``"forward+backward"``.
        kinds: method -> ``"yardstick"``, ``"pecode"``, ``"textbook"`` or ``"peer"``.
        max_errors: method -> largest absolute error (NaN for yardsticks).
        notes: what was left out, and why.
    """

    label: str
    shape: tuple[int, ...]
    dtype: str
    device: str
    position: int
    threads: int | None
    rounds: int
    samples: Mapping[str, tuple[float, ...]]
    modes: Mapping[str, str]
    kinds: Mapping[str, str]
    max_errors: Mapping[str, float]
    notes: tuple[str, ...] = ()

    def time(self, method: str) -> Spread:
        """Seconds per call of ``method`` over the rounds.

        Raises:
            ValueError: no such method in this case.
        """
        if method not in self.samples:
            raise ValueError(f"method {method!r} is not in this case; have {list(self.samples)}")
        return Spread.of(self.samples[method])

    def ratio(self, method: str, yardstick: str = "copy_") -> Spread:
        """Per-round ratio of ``method``'s time to ``yardstick``'s (:func:`ratio_spread`)."""
        return ratio_spread(self.samples, method, yardstick)

    def best_peer(self, mode: str) -> str | None:
        """The peer of ``mode`` with the smallest median time, or None if none ran."""
        peers = [n for n in self.samples if self.kinds[n] == "peer" and self.modes[n] == mode]
        return min(peers, key=lambda n: self.time(n).median, default=None)

    def rows(self) -> list[Row]:
        """One :class:`Row` per method, in the order they were timed."""
        rows = []
        for name in self.samples:
            peer = self.best_peer(self.modes[name]) or ""
            rows.append(
                Row(
                    name,
                    self.modes[name],
                    self.kinds[name],
                    self.label,
                    self.time(name),
                    self.ratio(name, "copy_"),
                    self.ratio(name, "clone"),
                    peer,
                    self.ratio(name, peer) if peer else None,
                    self.max_errors.get(name, math.nan),
                )
            )
        return rows

    def as_dict(self) -> dict[str, Any]:
        """A JSON-ready record: the case's fields and its rows (NaN written as None)."""

        def clean(value: Any) -> Any:
            if isinstance(value, float) and math.isnan(value):
                return None
            if isinstance(value, dict):
                return {k: clean(v) for k, v in value.items()}
            if isinstance(value, list | tuple):
                return [clean(v) for v in value]
            return value

        record = {
            "label": self.label,
            "shape": list(self.shape),
            "dtype": self.dtype,
            "device": self.device,
            "position": self.position,
            "threads": self.threads,
            "rounds": self.rounds,
            "notes": list(self.notes),
            "rows": [
                {**asdict(row), "seconds": list(self.samples[row.method])} for row in self.rows()
            ],
        }
        return clean(record)

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> Case:
        """The case an :meth:`as_dict` record describes (None read back as NaN).

        Raises:
            ValueError: ``record`` lacks a field of :meth:`as_dict`.
        """
        try:
            rows = record["rows"]
            return cls(
                label=record["label"],
                shape=tuple(record["shape"]),
                dtype=record["dtype"],
                device=record["device"],
                position=record["position"],
                threads=record["threads"],
                rounds=record["rounds"],
                samples={row["method"]: tuple(row["seconds"]) for row in rows},
                modes={row["method"]: row["mode"] for row in rows},
                kinds={row["method"]: row["kind"] for row in rows},
                max_errors={
                    row["method"]: math.nan if row["max_error"] is None else row["max_error"]
                    for row in rows
                },
                notes=tuple(record["notes"]),
            )
        except KeyError as err:
            raise ValueError(f"record lacks the field {err.args[0]!r} of Case.as_dict") from err


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


def _bytes_short(n: int) -> str:
    """``n`` bytes in KiB below 1 MiB, else in MiB."""
    return f"{n / 2**10:g} KiB" if n < 2**20 else f"{n / 2**20:g} MiB"


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return "cpu"


def bench_rope_case(
    shape: Sequence[int] = (1, 32, 2048, 128),
    *,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    position: int = 0,
    layouts: Sequence[str] = ("half", "interleaved"),
    backward: bool = True,
    peers: bool = True,
    textbook: bool = True,
    rounds: int = 5,
    shuffle: bool = False,
    target_s: float = 0.05,
    num_threads: int | None = 1,
    seed: int = 0,
) -> Case:
    """Time every method of :func:`rope_methods` on one size, in interleaved rounds.

    Each method is first called once and its result (and gradients) compared with the
    rotation computed in float64 from the same tables (``max_errors``; a peer's error
    also holds the difference between its own tables and ours). Then
    :func:`time_interleaved` times all of them, ``rounds`` rounds, ``num_threads`` CPU
    threads (1 by default: on a shared machine a multi-threaded operator waits for its
    slowest thread).

    Shapes::

        shape: [B, H, L, Dh]   q and k each; tables [L, Dh // 2]

    Raises:
        ValueError, TypeError: as :func:`rope_methods` and :func:`time_interleaved`.
    """
    device = _check_device(device)
    setup = rope_methods(
        shape,
        dtype=dtype,
        device=device,
        position=position,
        layouts=layouts,
        backward=backward,
        peers=peers,
        textbook=textbook,
        seed=seed,
    )
    errors = _max_errors(setup)
    samples = time_interleaved(
        {name: m.fn for name, m in setup.methods.items()},
        rounds=rounds,
        target_s=target_s,
        shuffle=shuffle,
        seed=seed,
        num_threads=num_threads,
        device=device,
    )
    dtype_name = str(dtype).removeprefix("torch.")
    label = f"q,k {list(shape)} {dtype_name}, {_bytes_short(setup.inputs.q.nbytes)} each"
    if position:
        label += f", position {position}"
    return Case(
        label,
        tuple(shape),
        dtype_name,
        _device_name(device),
        position,
        num_threads,
        rounds,
        samples,
        {name: m.mode for name, m in setup.methods.items()},
        {name: m.kind for name, m in setup.methods.items()},
        errors,
        setup.notes,
    )


def bench_rope_sweep(
    lengths: Sequence[int] = (64, 256, 1024, 2048, 4096),
    *,
    batch: int = 1,
    heads: int = 32,
    head_dim: int = 128,
    **options: Any,
) -> list[Case]:
    """:func:`bench_rope_case` for q and k of ``[batch, heads, L, head_dim]``, one case per L.

    The default lengths make q (and k) 1, 4, 16, 32 and 64 MiB in float32: across the
    sizes at which a CPU ``clone`` starts to take fresh pages from the operating system
    (see the module's docstring), so that the gap between ``clone`` and ``copy_`` shows
    where it opens.
    ``options`` go to :func:`bench_rope_case`.

    Raises:
        ValueError: ``lengths`` is empty or holds a non-positive length.
    """
    lengths = list(lengths)
    if not lengths:
        raise ValueError("lengths must not be empty")
    for length in lengths:
        check_int("lengths", length)
    return [bench_rope_case((batch, heads, length, head_dim), **options) for length in lengths]


def bench_rope_decode(
    *,
    position: int = 4096,
    batch: int = 1,
    heads: int = 32,
    head_dim: int = 128,
    backward: bool = False,
    **options: Any,
) -> Case:
    """One decoding step: q and k of ``[batch, heads, 1, head_dim]``, tables ``[1, head_dim // 2]``.

    Each call rotates a single new token at ``position``, so the tensors are tiny
    (16 KiB each at the defaults) and the time is the fixed cost of a call: argument
    checks, dispatch, allocation. The absolute time per call (µs) and the ratio to
    Hugging Face's ``apply_rotary_pos_emb`` are what matter here. Forward only by
    default (decoding needs no gradient). ``options`` go to :func:`bench_rope_case`.
    """
    return bench_rope_case(
        (batch, heads, 1, head_dim), position=position, backward=backward, **options
    )


def _seconds(value: float) -> str:
    """``value`` seconds with a unit that keeps 3-4 significant digits."""
    if value < 1e-3:
        return f"{value * 1e6:7.1f} µs"
    if value < 1:
        return f"{value * 1e3:7.2f} ms"
    return f"{value:7.3f} s "


def _ratio(spread: Spread | None) -> str:
    return "" if spread is None else str(spread)


def format_cases(cases: Sequence[Case]) -> str:
    """The cases as fixed-width text: one block per case, one line per method.

    Columns: the method; its mode (``fwd`` or ``fwd+bwd``); the median and the minimum
    time per call over the rounds; the median and quartiles ``m [q1, q3]`` of its
    per-round ratio to ``copy_`` of q and k, to ``clone`` of q and k, and to the fastest
    peer of the same mode (named under the block); the largest error against the
    float64 rotation. Notes (peers skipped, say) follow the last block.
    """
    if not cases:
        return ""
    first = cases[0]
    threads = {None: "default threads", 1: "1 thread"}.get(
        first.threads, f"{first.threads} threads"
    )
    lines = [
        f"RoPE on q and k, {first.device}, {threads}, {first.rounds} interleaved rounds; "
        "ratios: median [quartiles] of per-round ratios",
    ]
    header = (
        f"{'method':31s} {'mode':7s} {'median':>10s} {'min':>10s}  {'x copy_':18s} "
        f"{'x clone':18s} {'x peer':18s} {'max |err|':>9s}"
    )
    notes: list[str] = []
    for case in cases:
        lines += ["", case.label, header, "-" * len(header)]
        for row in case.rows():
            error = "" if math.isnan(row.max_error) else f"{row.max_error:.1e}"
            lines.append(
                f"{row.method:31s} {_MODE_SHORT[row.mode]:7s} {_seconds(row.time.median):>10s} "
                f"{_seconds(row.time.min):>10s}  {_ratio(row.vs_copy):18s} "
                f"{_ratio(row.vs_clone):18s} {_ratio(row.vs_peer):18s} {error:>9s}"
            )
        peers = [f"{_MODE_SHORT[m]} {case.best_peer(m)}" for m in _MODE_SHORT if case.best_peer(m)]
        lines.append("peer: " + ("; ".join(peers) if peers else "none ran"))
        notes += [note for note in case.notes if note not in notes]
    lines += [""] + [f"note: {note}" for note in notes]
    return "\n".join(lines).rstrip("\n")


# --------------------------------------------------------------------------------------
# Side-by-side comparisons of chapter 11: Shaw's two forms, the bias attentions, and one
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
# Memory: the peak bytes of the tensors a call creates, on every device
# --------------------------------------------------------------------------------------


class _AllocationTracker(TorchDispatchMode):
    """Counts the bytes of every tensor storage that an operator creates while active.

    Each new storage adds its size when an operator returns it and subtracts it when the
    last tensor that uses it is garbage-collected, so ``peak`` is the largest number of
    bytes held at once by tensors created inside the block.
    """

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._storages: dict[int, list[int]] = {}  # data_ptr -> [bytes, tensors using it]

    def _release(self, key: int) -> None:
        entry = self._storages[key]
        entry[1] -= 1
        if entry[1] == 0:
            self.live -= entry[0]
            del self._storages[key]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        inputs = {
            t.untyped_storage().data_ptr()
            for t in tree_flatten((args, kwargs))[0]
            if isinstance(t, Tensor)
        }
        for tensor in tree_flatten(out)[0]:
            if not isinstance(tensor, Tensor):
                continue
            storage = tensor.untyped_storage()
            key, size = storage.data_ptr(), storage.nbytes()
            if size == 0 or (key in inputs and key not in self._storages):
                continue  # a view of a tensor from before the block: nothing allocated
            if key not in self._storages:
                self._storages[key] = [size, 0]
                self.live += size
                self.peak = max(self.peak, self.live)
            self._storages[key][1] += 1
            weakref.finalize(tensor, self._release, key)
        return out


def peak_tensor_memory(fn: Callable[[], Any]) -> int:
    """Peak bytes held by tensors that ``fn()`` creates, its result included.

    Every ATen operator call is intercepted (a ``TorchDispatchMode``); a new storage
    counts from the call that returns it until its last tensor is freed. Tensors that
    existed before the call (inputs, parameters) are not counted, nor is scratch memory
    a kernel allocates and frees internally. Works on every device (CPU included, where
    PyTorch has no ``max_memory_allocated``); the result is exact and deterministic
    for a given sequence of operators.

    Raises:
        TypeError: ``fn`` is not callable.
    """
    if not callable(fn):
        raise TypeError(f"fn must be callable, got {type(fn).__name__}")
    tracker = _AllocationTracker()
    with tracker:
        result = fn()
    del result
    return tracker.peak


_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def main(argv: Sequence[str] | None = None) -> list[Case]:
    """Command line: ``python -m pecode.bench [--quick] [--device D] [--rounds N] ...``.

    Prints :func:`format_cases` of :func:`bench_rope_sweep` and :func:`bench_rope_decode`
    for each ``--dtype`` (``--help`` lists the options), and returns the cases; with
    ``--json PATH`` also writes their :meth:`Case.as_dict` records. ``--attention``
    adds chapter 11's comparisons of Shaw's two forms and of the bias attentions.
    """
    parser = argparse.ArgumentParser(
        prog="python -m pecode.bench",
        description="RoPE timed against copy_, clone and its peers, in interleaved rounds.",
    )
    parser.add_argument("--quick", action="store_true", help="two lengths, 3 rounds, short samples")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument(
        "--dtype", nargs="+", default=["float32"], choices=list(_DTYPES), help="default float32"
    )
    parser.add_argument("--rounds", type=int, help="interleaved rounds (default 5, quick 3)")
    parser.add_argument("--shuffle", action="store_true", help="shuffle the order in each round")
    parser.add_argument("--threads", type=int, default=1, help="CPU threads (default 1)")
    parser.add_argument(
        "--target-s", type=float, help="seconds per sample (default 0.05, quick 0.005)"
    )
    parser.add_argument(
        "--lengths", type=int, nargs="+", help="L of the sweep (default 64 256 1024 2048 4096)"
    )
    parser.add_argument("--batch", type=int, default=1, help="B (default 1)")
    parser.add_argument("--heads", type=int, default=32, help="H (default 32)")
    parser.add_argument("--head-dim", type=int, default=128, help="Dh (default 128)")
    parser.add_argument(
        "--position", type=int, default=4096, help="position of the decode step (default 4096)"
    )
    parser.add_argument("--no-decode", action="store_true", help="skip the decode step")
    parser.add_argument("--no-backward", action="store_true", help="forward only")
    parser.add_argument("--no-peers", action="store_true", help="leave out the other libraries")
    parser.add_argument("--json", metavar="PATH", help="also write the cases as JSON")
    parser.add_argument(
        "--attention", action="store_true", help="also the Shaw and bias-attention tables"
    )
    args = parser.parse_args(argv)
    device = _check_device(args.device)
    rounds = args.rounds or (3 if args.quick else 5)
    target_s = args.target_s or (0.005 if args.quick else 0.05)
    lengths = args.lengths or ([64, 1024] if args.quick else [64, 256, 1024, 2048, 4096])
    print(f"torch {torch.__version__}, device {_device_name(device)}, threads {args.threads}")
    cases: list[Case] = []
    for name in args.dtype:
        options: dict[str, Any] = {
            "dtype": _DTYPES[name],
            "device": device,
            "rounds": rounds,
            "shuffle": args.shuffle,
            "target_s": target_s,
            "num_threads": args.threads,
            "peers": not args.no_peers,
            "batch": args.batch,
            "heads": args.heads,
            "head_dim": args.head_dim,
        }
        sweep = bench_rope_sweep(lengths, backward=not args.no_backward, **options)
        decode = [] if args.no_decode else [bench_rope_decode(position=args.position, **options)]
        print(format_cases([*sweep, *decode]))
        cases += [*sweep, *decode]
    if args.json:
        with open(args.json, "w", encoding="utf-8") as file:
            json.dump([case.as_dict() for case in cases], file, indent=1)
    if args.attention:
        options = {"device": device, "rounds": rounds, "num_threads": args.threads}
        for length in [256] if args.quick else [512, 1024]:
            shaw = bench_shaw(length, **options)
            print(f"\nShaw key + value terms, {shaw.label}: median, / direct, new tensors")
            print("\n".join(shaw.lines()))
            for name, compared in bench_bias_attention(length, **options).items():
                print(f"\n{name} attention, {compared.label}: median, / by hand, new tensors")
                print("\n".join(compared.lines()))
    return cases


if __name__ == "__main__":
    main()
