"""The harness: interleaved timing, spreads of per-round ratios, and tensor memory.

Every case of :mod:`pecode.bench` is timed and measured with what is here (the package's
docstring says why the rounds are interleaved and the ratios taken round by round):

* :func:`time_interleaved`: seconds per call of several methods, one sample per round,
  the methods interleaved in each round; the samplers behind it (``_sampler``: CUDA
  events on CUDA, ``timeit.Timer`` otherwise; ``_calls_per_sample``: the calls a sample
  needs to last ``target_s``); :func:`time_first_call`: one call timed alone, the same way;
* :class:`Spread` and :func:`ratio_spread`: the median, quartiles and extremes over the
  rounds, of a time or of a per-round ratio;
* :func:`peak_tensor_memory`: the peak bytes of the tensors a call creates, counted by a
  ``TorchDispatchMode`` (``_AllocationTracker``) on every device, the CPU included;
* the thread and device helpers the cases share: ``_check_device``, ``_device_name`` and
  ``_torch_threads`` (:func:`pecode.utils.cpu_threads`, or nothing).
"""

from __future__ import annotations

import contextlib
import math
import random
import statistics
import time
import timeit
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from pecode._checks import check_int
from pecode.utils import cpu_threads

__all__ = ["Spread", "peak_tensor_memory", "ratio_spread", "time_first_call", "time_interleaved"]

# --------------------------------------------------------------------------------------
# The timing core: devices and threads, interleaved rounds, spreads, per-round ratios
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


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"cuda ({torch.cuda.get_device_name(device)})"
    return "cpu"


def _torch_threads(num_threads: int | None) -> contextlib.AbstractContextManager[None]:
    """:func:`pecode.utils.cpu_threads`, or nothing when ``num_threads`` is None."""
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
