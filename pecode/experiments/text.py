"""Train short, test long on real text: a character-level language model (chapter 14).

The synthetic tasks of chapter 13 ask one question each. Real text asks them all at
once: a language model trained on windows of ``L`` characters is read on inputs of
``2L`` and ``4L``, and we watch its perplexity, as Press et al. (2022) do in Figure 1 of
the ALiBi paper, here on a laptop CPU.

* :func:`load_corpus`: the corpus, Tiny Shakespeare (1,115,394 ASCII characters of
  Shakespeare's plays, public domain), shipped in ``pecode/experiments/data`` and checked
  against its SHA-256, so that it is the same text on every machine;
* :func:`corpus_splits`: the characters as ids, the first 90% for training, the last
  10% held out;
* :func:`train_language_model`: a :class:`~pecode.experiments.TinyDecoder` trained on
  random windows of the training part;
* :func:`held_out_windows` and :func:`nonoverlapping_losses`: the evaluation. Each
  seed draws its own held-out segments, and reads them in pieces of ``L``, ``2L``,
  ``4L`` characters, so every input length and every model of that seed scores the
  same targets. Two perplexities follow: over all targets (the
  paper's *nonoverlapping* evaluation, in which a longer input also means fewer
  targets with little context) and over the last ``tail`` targets of each segment,
  which every reading predicts from nearly a whole input of context (like the
  paper's sliding-window evaluation, its Appendix B);
* :func:`run_text_experiment`: the sweep (schemes x seeds x lengths), the RoPE model
  also read with linear interpolation, NTK-aware and YaRN frequencies, and models read
  with a test-time attention window;
* :class:`Comparison`: two readings of the same targets, with Student's t-interval
  over seeds of the per-seed log perplexity ratios. Since each seed has its own
  segments, that spread holds both the training seed and the sampled text.

Everything runs on the CPU with a fixed number of threads, like chapter 13's runs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources

import torch
import torch.nn.functional as F
from torch import Tensor

from pecode._checks import check_int
from pecode.experiments import (
    BIAS_FAMILY_SCHEMES,
    HYBRID_SCHEMES,
    ROPE_READINGS,
    PairedInterval,
    TinyDecoder,
    cpu_threads,
    map_jobs,
    paired_t_interval,
    with_rope_scaling,
)
from pecode.experiments.models import check_scheme, readings
from pecode.experiments.trained_cache import trained
from pecode.experiments.training import fit
from pecode.streaming import SinkCache
from pecode.utils import set_seed

__all__ = [
    "CORPUS_FILE",
    "CORPUS_SHA256",
    "STREAMING_READINGS",
    "TEXT_SCHEMES",
    "TEXT_VARIANTS",
    "Comparison",
    "CorpusSplits",
    "TextConfig",
    "TextResult",
    "corpus_splits",
    "held_out_windows",
    "load_corpus",
    "longer_readings",
    "nonoverlapping_losses",
    "position_losses",
    "random_windows",
    "run_text_experiment",
    "streaming_losses",
    "streaming_readings",
    "train_language_model",
]

CORPUS_FILE = "tinyshakespeare.txt"
"""The corpus, in ``pecode/experiments/data`` (provenance in ``PROVENANCE.md`` there)."""

CORPUS_SHA256 = "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"
"""The SHA-256 of the corpus file, checked at every load, so that every machine reads the
same bytes or gets an error."""

TEXT_SCHEMES: tuple[str, ...] = (
    "sinusoidal",
    "learned",
    "t5",
    "alibi",
    *BIAS_FAMILY_SCHEMES,
    "rope",
)
"""Every position scheme the text experiment trains, five of
:data:`pecode.experiments.SCHEMES` and the bias family of
:data:`pecode.experiments.BIAS_FAMILY_SCHEMES` (KERPLE, FIRE, the forgetting gate)."""

TEXT_VARIANTS: tuple[str, ...] = (*TEXT_SCHEMES, *(f"rope+{kind}" for kind in ROPE_READINGS))
"""Every model :func:`run_text_experiment` reads by default: the schemes first, then the
RoPE model read with each of :data:`pecode.experiments.ROPE_READINGS` (linear
interpolation, NTK-aware, YaRN with the authors' code's ramp and with the paper's, YaRN's
frequencies alone and its temperature alone)."""


def load_corpus() -> str:
    """The corpus text, after checking its SHA-256 against :data:`CORPUS_SHA256`.

    Raises:
        RuntimeError: the file's bytes are not the expected ones (a changed or truncated
            copy would silently change every number of the chapter).
    """
    data = (resources.files("pecode.experiments") / "data" / CORPUS_FILE).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != CORPUS_SHA256:
        raise RuntimeError(
            f"{CORPUS_FILE} has SHA-256 {digest}, expected {CORPUS_SHA256}: the corpus changed"
        )
    return data.decode("ascii")


@dataclass(frozen=True)
class CorpusSplits:
    """The corpus as character ids.

    Attributes:
        alphabet: the distinct characters of the whole corpus, sorted; id ``i`` is
            ``alphabet[i]``.
        train: ids of the first part of the corpus (``[n_train]``, int64).
        test: ids of the held-out last part (``[n_test]``, int64); no training window
            reaches into it.
    """

    alphabet: str
    train: Tensor
    test: Tensor

    @property
    def vocab_size(self) -> int:
        return len(self.alphabet)


def corpus_splits(text: str, held_out_fraction: float = 0.1) -> CorpusSplits:
    """Split ``text`` into a training part and a held-out last part, as character ids.

    The split is contiguous (the last ``held_out_fraction`` of the characters), so that
    held-out windows are text the model never saw, not shuffled neighbours of it.

    Raises:
        TypeError: ``text`` is not a str.
        ValueError: ``held_out_fraction`` not in (0, 1), or a part would be empty.
    """
    if not isinstance(text, str):
        raise TypeError(f"text must be a str, got {type(text).__name__}")
    if not (isinstance(held_out_fraction, float) and 0.0 < held_out_fraction < 1.0):
        raise ValueError(f"held_out_fraction must be a float in (0, 1), got {held_out_fraction!r}")
    alphabet = "".join(sorted(set(text)))
    lookup = {c: i for i, c in enumerate(alphabet)}
    ids = torch.tensor([lookup[c] for c in text], dtype=torch.int64)
    split = len(text) - round(held_out_fraction * len(text))
    if split <= 0 or split >= len(text):
        raise ValueError(f"held_out_fraction={held_out_fraction} leaves an empty part")
    return CorpusSplits(alphabet=alphabet, train=ids[:split], test=ids[split:])


def random_windows(ids: Tensor, length: int, count: int, generator: torch.Generator) -> Tensor:
    """``count`` windows of ``length + 1`` consecutive ids at uniformly random starts.

    Shapes::

        ids: [n]    returns: [count, length + 1] (inputs ``[:, :-1]``, targets ``[:, 1:]``)

    Raises:
        ValueError: ``ids`` is shorter than one window.
    """
    check_int("length", length, 1)
    check_int("count", count, 1)
    if ids.numel() < length + 1:
        raise ValueError(f"ids has {ids.numel()} tokens, fewer than one window of {length + 1}")
    starts = torch.randint(ids.numel() - length, (count,), generator=generator)
    return ids[starts[:, None] + torch.arange(length + 1)]


def held_out_windows(
    ids: Tensor, length: int, count: int, *, generator: torch.Generator | None = None
) -> Tensor:
    """``count`` evaluation windows of ``length + 1`` consecutive ids.

    Without ``generator`` the windows end at ``count`` evenly spaced places of ``ids``
    (the first one leaves room for a whole window before it, the last one ends at the
    end of ``ids``); they do not overlap when ``ids`` holds at least
    ``count * (length + 1)`` ids. With ``generator``, ``ids`` is cut into
    ``len(ids) // (length + 1)`` disjoint slots and ``count`` of them are drawn without
    replacement (returned in the order of the text): a random sample of the held-out
    text, different for each generator seed.

    Shapes::

        ids: [n]    returns: [count, length + 1]

    Raises:
        ValueError: ``ids`` too short for ``count`` distinct (with ``generator``:
            disjoint) windows.
    """
    check_int("length", length, 1)
    check_int("count", count, 1)
    if generator is not None:
        slots = ids.numel() // (length + 1)
        if slots < count:
            raise ValueError(f"ids has {ids.numel()} tokens, too few for {count} disjoint windows")
        chosen = torch.randperm(slots, generator=generator)[:count].sort().values
        return ids[chosen[:, None] * (length + 1) + torch.arange(length + 1)]
    first_end, last_end = length + 1, ids.numel()  # exclusive ends of the windows
    if last_end - first_end < count - 1:
        raise ValueError(f"ids has {ids.numel()} tokens, too few for {count} windows")
    ends = torch.linspace(first_end, last_end, count, dtype=torch.float64).floor().long()
    return ids[ends[:, None] - (length + 1) + torch.arange(length + 1)]


@torch.no_grad()
def position_losses(
    model: Callable[..., Tensor],
    windows: Tensor,
    *,
    batch_size: int = 8,
    window: int | None = None,
) -> Tensor:
    """Cross-entropy (nats) of every window at every position.

    Position ``p`` predicts ``windows[:, p + 1]`` from ``windows[:, : p + 1]``. The
    windows go through the model ``batch_size`` at a time: an additive bias (T5, ALiBi)
    makes attention build full ``[batch, heads, n, n]`` score matrices, and small
    batches keep them in cache. With ``window``, the model is called as
    ``model(inputs, window=window)`` (the test-time window of
    :meth:`pecode.experiments.TinyDecoder.forward`).

    Shapes::

        windows: [count, n + 1] (int64)    returns: [count, n] (float64)

    Raises:
        ValueError: ``windows`` is not 2-D with at least 2 columns.
        TypeError, ValueError: ``batch_size`` is not a positive int.
    """
    if not isinstance(windows, Tensor) or windows.dim() != 2 or windows.shape[1] < 2:
        raise ValueError("windows must be a [count, n + 1] tensor with n >= 1")
    check_int("batch_size", batch_size, 1)
    losses = []
    for chunk in windows.split(batch_size):
        inputs = chunk[:, :-1]
        logits = (model(inputs) if window is None else model(inputs, window=window)).double()
        losses.append(F.cross_entropy(logits.transpose(1, 2), chunk[:, 1:], reduction="none"))
    return torch.cat(losses)


@torch.no_grad()
def streaming_losses(
    model: TinyDecoder,
    windows: Tensor,
    *,
    num_sinks: int,
    window: int,
    reindex: bool = True,
    batch_size: int = 32,
) -> Tensor:
    """Cross-entropy of every target of ``windows``, read one token at a time through a
    :class:`~pecode.streaming.SinkCache` per layer (StreamingLLM).

    Position ``p`` predicts ``windows[:, p + 1]`` from the ``num_sinks`` first tokens and
    the ``window`` latest ones (itself included), at positions in the cache
    (``reindex=True``) or in the text, as :func:`position_losses` does with the whole
    prefix.

    Shapes::

        windows: [count, n + 1] (int64)    returns: [count, n] (float64)

    Raises:
        TypeError: ``model`` is not a :class:`~pecode.experiments.TinyDecoder`.
        ValueError: ``windows`` is not 2-D with at least 2 columns; as
            :class:`~pecode.streaming.SinkCache` for ``num_sinks``, ``window`` and the
            model's scheme.
    """
    if not isinstance(model, TinyDecoder):
        raise TypeError(f"model must be a TinyDecoder, got {type(model).__name__}")
    if not isinstance(windows, Tensor) or windows.dim() != 2 or windows.shape[1] < 2:
        raise ValueError("windows must be a [count, n + 1] tensor with n >= 1")
    check_int("batch_size", batch_size, 1)
    losses = []
    for chunk in windows.split(batch_size):
        caches = [SinkCache(num_sinks, window, reindex=reindex) for _ in model.blocks]
        logits = torch.cat(
            [model(chunk[:, p : p + 1], caches=caches) for p in range(chunk.shape[1] - 1)], 1
        ).double()
        losses.append(F.cross_entropy(logits.transpose(1, 2), chunk[:, 1:], reduction="none"))
    return torch.cat(losses)


def nonoverlapping_losses(
    model: Callable[..., Tensor],
    windows: Tensor,
    chunk: int,
    *,
    batch_size: int = 8,
    window: int | None = None,
) -> Tensor:
    """Cross-entropy of every target of ``windows``, read ``chunk`` positions at a time.

    Each window's ``length`` targets are cut into ``length / chunk`` consecutive pieces,
    and the model reads each piece as a separate input of ``chunk`` positions: the
    *nonoverlapping evaluation* of Press et al. (2022, §2.1) with ``L_valid = chunk``.
    A target at offset ``j`` inside its piece is predicted from ``j + 1`` tokens. The
    losses are put back in the order of the targets, so that readings with different
    ``chunk`` score the same targets and can be compared target by target; the last
    piece of a window is the window's last ``chunk + 1`` ids. ``window`` is passed on
    to :func:`position_losses`.

    Shapes::

        windows: [count, length + 1] (int64)    returns: [count, length] (float64)

    Raises:
        ValueError: ``chunk`` does not divide ``length``, or ``windows`` is not 2-D.
        TypeError, ValueError: ``chunk`` or ``batch_size`` is not a positive int.
    """
    check_int("chunk", chunk, 1)
    if not isinstance(windows, Tensor) or windows.dim() != 2 or windows.shape[1] < 2:
        raise ValueError("windows must be a [count, length + 1] tensor with length >= 1")
    count, length = windows.shape[0], windows.shape[1] - 1
    if length % chunk:
        raise ValueError(f"chunk={chunk} must divide the window length {length}")
    pieces = windows.unfold(1, chunk + 1, chunk).reshape(-1, chunk + 1)
    losses = position_losses(model, pieces, batch_size=batch_size, window=window)
    return losses.reshape(count, length)


@dataclass(frozen=True)
class TextConfig:
    """Model, training budget and evaluation, identical for every scheme.

    The defaults are chapter 14's settings.

    Attributes:
        train_length: ``L``, the characters of every training window.
        eval_factors: input lengths read at test time, as multiples of ``L``; the
            largest must be a multiple of every other (the held-out segments are cut
            into pieces of each length).
        tail: the last ``tail`` targets of every segment are the scored targets of the
            *tail* perplexity (predicted from at least ``n - tail`` characters of
            context at input length ``n``).
        dim, num_heads, num_layers: model size.
        steps, batch_size, lr: AdamW steps, windows per step, peak learning rate
            (linear warm-up over the first tenth, then cosine decay to zero).
        eval_windows: held-out segments per seed, each as long as the longest input.
        held_out_fraction: the last part of the corpus kept for evaluation.
        num_threads: CPU threads for training and evaluation, in each worker.
    """

    train_length: int = 256
    eval_factors: tuple[int, ...] = (1, 2, 4)
    tail: int = 64
    dim: int = 64
    num_heads: int = 4
    num_layers: int = 2
    steps: int = 600
    batch_size: int = 4
    lr: float = 5e-3
    eval_windows: int = 32
    held_out_fraction: float = 0.1
    num_threads: int = 1

    def __post_init__(self) -> None:
        for name in ("train_length", "tail", "dim", "num_heads", "num_layers"):
            check_int(name, getattr(self, name), 1)
        for name in ("steps", "batch_size", "eval_windows", "num_threads"):
            check_int(name, getattr(self, name), 1)
        if self.tail > self.train_length:
            raise ValueError(f"tail={self.tail} exceeds train_length={self.train_length}")
        if not self.eval_factors or any(
            isinstance(f, bool) or not isinstance(f, int) or f < 1 for f in self.eval_factors
        ):
            raise ValueError(f"eval_factors must be positive ints, got {self.eval_factors}")
        if any(max(self.eval_factors) % f for f in self.eval_factors):
            raise ValueError(
                f"eval_factors must all divide the largest one, got {self.eval_factors}"
            )
        if not (isinstance(self.lr, int | float) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive number, got {self.lr!r}")
        if not (isinstance(self.held_out_fraction, float) and 0.0 < self.held_out_fraction < 1.0):
            raise ValueError(
                f"held_out_fraction must be a float in (0, 1), got {self.held_out_fraction!r}"
            )

    @property
    def eval_lengths(self) -> tuple[int, ...]:
        """The test lengths ``factor * train_length``."""
        return tuple(f * self.train_length for f in self.eval_factors)


def train_language_model(
    scheme: str,
    config: TextConfig,
    seed: int,
    splits: CorpusSplits,
    *,
    on_step: Callable[[], None] | None = None,
) -> tuple[TinyDecoder, list[float]]:
    """Train a :class:`~pecode.experiments.TinyDecoder` on random training windows.

    Every step draws ``batch_size`` windows of ``train_length + 1`` characters from
    ``splits.train`` and minimizes the next-character cross-entropy at every position.
    The seed fixes the initialization and the windows drawn.

    Returns:
        The trained model (in eval mode, on the CPU) and the training loss of every step.

    Raises:
        ValueError, TypeError: bad ``scheme``, ``seed``, ``config`` or ``splits``.
    """
    if not isinstance(config, TextConfig):
        raise TypeError(f"config must be a TextConfig, got {type(config).__name__}")
    if not isinstance(splits, CorpusSplits):
        raise TypeError(f"splits must be a CorpusSplits, got {type(splits).__name__}")
    check_scheme(scheme, TEXT_SCHEMES + HYBRID_SCHEMES)
    generator = set_seed(seed)  # seeds the initialization; the generator draws the windows
    with cpu_threads(config.num_threads):
        model = TinyDecoder(
            scheme,
            vocab_size=splits.vocab_size,
            max_len=config.train_length,
            dim=config.dim,
            num_heads=config.num_heads,
            num_layers=config.num_layers,
        )

        def step_loss() -> Tensor:
            windows = random_windows(
                splits.train, config.train_length, config.batch_size, generator
            )
            logits = model(windows[:, :-1])
            return F.cross_entropy(logits.flatten(0, 1), windows[:, 1:].flatten())

        losses = fit(model, step_loss, steps=config.steps, lr=config.lr, on_step=on_step)
    return model, losses


@dataclass(frozen=True)
class Comparison:
    """Reading ``a`` against reading ``b`` on the same targets, in nats per character.

    The difference is ``loss(a) - loss(b)`` averaged over the scored targets of one
    seed's held-out segments: the log of that seed's perplexity ratio ``a / b``. Each
    seed drew its own segments, so the spread over seeds holds both the training seed
    and the sampled text.

    Attributes:
        per_seed: the mean difference of each seed.
        seeds: Student's t-interval over seeds of those differences
            (:func:`pecode.experiments.paired_t_interval`), with the sign count.
    """

    per_seed: tuple[float, ...]
    seeds: PairedInterval

    @property
    def ratio(self) -> float:
        """The perplexity ratio ``exp(mean difference)``."""
        return math.exp(self.seeds.mean)

    @property
    def low(self) -> float:
        """The low end of the ratio's interval, ``exp(low)``."""
        return math.exp(self.seeds.low)

    @property
    def high(self) -> float:
        """The high end of the ratio's interval, ``exp(high)``."""
        return math.exp(self.seeds.high)

    @property
    def greater(self) -> bool:
        """``a`` has a higher loss than ``b``: the interval lies above zero."""
        return self.seeds.low > 0

    @property
    def smaller(self) -> bool:
        """``a`` has a lower loss than ``b``: the interval lies below zero."""
        return self.seeds.high < 0

    def __str__(self) -> str:
        return (
            f"ratio {self.ratio:.3f} [{self.low:.3f}, {self.high:.3f}], "
            f"{self.seeds.positive} of {self.seeds.count} seeds above 1"
        )


@dataclass
class TextResult:
    """Per-target losses of every model read at every input length, one entry per seed.

    ``losses[name][n]`` is a list over seeds of ``[eval_windows, longest]`` float64
    tensors: the cross-entropy of every target of that seed's held-out segments, read
    in pieces of ``n`` (:func:`nonoverlapping_losses`); ``None`` where the model is not
    defined at that length (the learned table past ``L``). The RoPE readings
    ``rope+<kind>`` are the RoPE models of the same seeds, read with ``factor = n / L``;
    ``<scheme>+window`` the models read with keys ``window`` or more back masked.
    ``models[scheme]`` holds the trained models, one per seed (on the CPU, eval mode).
    """

    config: TextConfig
    seeds: tuple[int, ...]
    names: list[str] = field(default_factory=list)
    losses: dict[str, dict[int, list[Tensor] | None]] = field(default_factory=dict)
    train_losses: dict[str, list[list[float]]] = field(default_factory=dict)
    models: dict[str, list[TinyDecoder]] = field(default_factory=dict)
    window: int | None = None

    def window_losses(self, name: str, length: int, *, part: str | slice = "tail") -> Tensor | None:
        """Mean loss per held-out segment, ``[seeds, eval_windows]``; ``None`` if undefined.

        ``part="tail"``: over the last ``config.tail`` targets of each segment;
        ``part="all"``: over all its targets (nonoverlapping evaluation); a ``slice``:
        over those targets of each segment (``slice(256, 320)``: the targets at
        positions 256 to 319 of an input as long as the segment).

        Raises:
            ValueError: ``part`` is none of these, or a slice with a step or with no
                target in it.
        """
        per_seed = self.losses[name][length]
        if part == "tail":
            part = slice(-self.config.tail, None)
        elif part == "all":
            part = slice(None)
        if not isinstance(part, slice) or part.step not in (None, 1):
            raise ValueError(f"part must be 'tail', 'all' or a slice without step, got {part!r}")
        longest = max(self.config.eval_lengths)
        if not range(longest)[part]:
            raise ValueError(f"part {part} holds no target of a segment of {longest}")
        if per_seed is None:
            return None
        return torch.stack([x[:, part].mean(1) for x in per_seed])

    def excess_by_position(self, name: str, length: int) -> Tensor | None:
        """How much worse each position of an input of ``length`` is than the same
        targets read in inputs of ``L``: the mean of ``loss(read at length) - loss(read
        at L)`` over seeds, segments and pieces, in nats. Shape ``[length]``; 0 at the
        positions below ``L`` for a scheme whose prediction there does not depend on
        the input length (a causal model read with the same frequencies); ``None``
        where undefined.
        """
        longer, short = self.losses[name][length], self.losses[name][self.config.train_length]
        if longer is None or short is None:
            return None
        difference = torch.stack(longer) - torch.stack(short)  # [seeds, windows, longest]
        return difference.reshape(-1, length).mean(0)

    def perplexity(
        self, name: str, length: int, *, part: str | slice = "tail"
    ) -> list[float] | None:
        """Perplexity ``exp(mean loss)`` per seed; ``None`` where undefined."""
        losses = self.window_losses(name, length, part=part)
        if losses is None:
            return None
        return [math.exp(float(x)) for x in losses.mean(1)]

    def compare(
        self, a: tuple[str, int], b: tuple[str, int], *, part: str | slice = "tail"
    ) -> Comparison:
        """Reading ``a = (name, length)`` against ``b`` on the same targets.

        Both readings score the same targets of the same segments of each seed (every
        length does, :func:`nonoverlapping_losses`), so the difference is paired by seed.

        Raises:
            ValueError: a reading is not defined (the learned table past ``L``), fewer
                than two seeds, or a bad ``part``.
        """
        losses = [self.window_losses(name, length, part=part) for name, length in (a, b)]
        if losses[0] is None or losses[1] is None:
            raise ValueError(f"{a if losses[0] is None else b} is not defined")
        per_seed = tuple(float(d) for d in (losses[0] - losses[1]).mean(1))
        return Comparison(per_seed, paired_t_interval(list(per_seed)))

    def per_position(self, name: str, length: int) -> Tensor | None:
        """Mean loss at each position ``0 .. n-1`` of an input of ``n = length``.

        Averaged over seeds, segments and the pieces of each segment. Shape ``[length]``;
        ``None`` where undefined.
        """
        per_seed = self.losses[name][length]
        if per_seed is None:
            return None
        stacked = torch.stack(per_seed)  # [seeds, windows, longest]
        return stacked.reshape(-1, length).mean(0)


def _train_and_read(
    scheme: str,
    seed: int,
    config: TextConfig,
    splits: CorpusSplits,
    rope_readings: tuple[str, ...],
    window: int | None,
    eval_seed: int,
) -> tuple[TinyDecoder, list[float], dict[str, dict[int, Tensor | None]]]:
    """One job of :func:`run_text_experiment`: train one model, read it every way.

    The training may come from :mod:`pecode.experiments.trained_cache` (opt-in); the
    reading always runs."""
    model, train_losses = trained(train_language_model, scheme, config, seed, splits)
    longest = max(config.eval_lengths)
    generator = torch.Generator().manual_seed(eval_seed + seed)
    segments = held_out_windows(splits.test, longest, config.eval_windows, generator=generator)
    return model, train_losses, _read(model, scheme, config, segments, rope_readings, window)


def _read(
    model: TinyDecoder,
    scheme: str,
    config: TextConfig,
    segments: Tensor,
    rope_readings: Sequence[str],
    window: int | None,
) -> dict[str, dict[int, Tensor | None]]:
    """One model read every way of :func:`readings` at every length of ``config``."""
    losses: dict[str, dict[int, Tensor | None]] = {}
    for name, kind, masked in readings(scheme, rope_readings, window):
        losses[name] = {}
        for length in config.eval_lengths:
            if scheme == "learned" and length > config.train_length:
                losses[name][length] = None  # no table rows: not defined
                continue
            evaluated = model
            if kind is not None:
                evaluated = with_rope_scaling(model, kind, length / config.train_length)
            with cpu_threads(config.num_threads):
                losses[name][length] = nonoverlapping_losses(
                    evaluated, segments, length, window=masked
                )
    return losses


def longer_readings(
    result: TextResult,
    factor: int,
    splits: CorpusSplits,
    *,
    rope_readings: Sequence[str] = (),
    eval_seed: int = 2022,
) -> TextResult:
    """The models of ``result`` read again at ``L`` and ``factor · L``, on new segments.

    Each seed's models read ``eval_windows`` new held-out segments of ``factor · L``
    (:func:`held_out_windows`, generator seed ``eval_seed + factor · 1000 + seed``:
    another draw than :func:`run_text_experiment`'s ``eval_seed + seed`` for seeds
    below ``1000 · factor``; the two draws may still overlap in the text), in pieces of
    ``L`` and whole. No model is trained;
    the RoPE models are also read with each kind of ``rope_readings``. The result is a
    :class:`TextResult` whose config has ``eval_factors=(1, factor)``, so its
    :meth:`TextResult.compare` gives the same statistics as ``result``'s.

    Raises:
        ValueError: ``factor`` is not an int above 1, or a reading is unknown.
        TypeError: ``result`` is not a :class:`TextResult`.
    """
    if not isinstance(result, TextResult):
        raise TypeError(f"result must be a TextResult, got {type(result).__name__}")
    check_int("factor", factor, 2)
    for kind in rope_readings:
        if kind not in ROPE_READINGS:
            raise ValueError(f"unknown rope reading {kind!r}; accepted: {list(ROPE_READINGS)}")
    config = dataclasses.replace(result.config, eval_factors=(1, factor))
    longer = TextResult(config=config, seeds=result.seeds, models=dict(result.models))
    for scheme, models in result.models.items():
        for seed, model in zip(result.seeds, models, strict=True):
            generator = torch.Generator().manual_seed(eval_seed + factor * 1000 + seed)
            segments = held_out_windows(
                splits.test, max(config.eval_lengths), config.eval_windows, generator=generator
            )
            for name, by_length in _read(
                model, scheme, config, segments, rope_readings, None
            ).items():
                if name not in longer.losses:
                    longer.names.append(name)
                    longer.losses[name] = {n: [] for n in config.eval_lengths}
                for length, found in by_length.items():
                    if found is None:
                        longer.losses[name][length] = None
                    else:
                        longer.losses[name][length].append(found)
    return longer


STREAMING_READINGS: tuple[str, ...] = ("whole", "window", "sinks", "sinks_text_positions")
"""How :func:`streaming_readings` reads a model on inputs of ``4L``: the whole input at
once; a window of the ``L`` latest tokens; StreamingLLM's cache of ``num_sinks`` first and
``L - num_sinks`` latest tokens, positions in the cache; the same cache, positions in the
text."""


def streaming_readings(
    scheme: str,
    seed: int,
    config: TextConfig,
    splits: CorpusSplits,
    num_sinks: int,
    eval_seed: int = 2022,
) -> tuple[TinyDecoder, dict[str, Tensor]]:
    """Train (or take from the trained cache) one model; read it each way of
    :data:`STREAMING_READINGS`, and at ``L`` (nonoverlapping, as ``"at_L"``).

    The segments are those :func:`run_text_experiment` draws for the seed, as long as
    the longest input of ``config``; every reading scores all their targets.

    Returns:
        The model and, per reading, the ``[eval_windows, longest]`` per-target losses.

    Raises:
        ValueError, TypeError: as :func:`train_language_model`; an absolute scheme
            (``sinusoidal``, ``learned``: positions added before attention, which a
            cache cannot re-index); ``num_sinks`` not an int in ``0 .. train_length - 1``.
    """
    if scheme in ("sinusoidal", "learned"):  # positions added before attention
        raise ValueError(f"scheme {scheme!r} cannot stream: its positions are not in attention")
    check_int("num_sinks", num_sinks, 0)
    if num_sinks >= config.train_length:
        raise ValueError(f"num_sinks={num_sinks} must be below train_length={config.train_length}")
    model, _ = trained(train_language_model, scheme, config, seed, splits)
    length = config.train_length
    generator = torch.Generator().manual_seed(eval_seed + seed)
    segments = held_out_windows(
        splits.test, max(config.eval_lengths), config.eval_windows, generator=generator
    )
    cache = {"num_sinks": num_sinks, "window": length - num_sinks}
    with cpu_threads(config.num_threads):
        losses = {
            "at_L": nonoverlapping_losses(model, segments, length),
            "whole": position_losses(model, segments),
            "window": position_losses(model, segments, window=length),
            "sinks": streaming_losses(model, segments, **cache),
            "sinks_text_positions": streaming_losses(model, segments, **cache, reindex=False),
        }
    return model, losses


def run_text_experiment(
    config: TextConfig,
    seeds: Sequence[int],
    *,
    schemes: Sequence[str] = TEXT_SCHEMES,
    rope_readings: Sequence[str] = ROPE_READINGS,
    window: int | None = None,
    window_schemes: Sequence[str] | None = None,
    splits: CorpusSplits | None = None,
    eval_seed: int = 2022,
    workers: int = 1,
) -> TextResult:
    """Train every scheme with every seed; read each model at every input length.

    Each seed reads its own held-out segments (:func:`held_out_windows`:
    ``eval_windows`` disjoint segments of the longest length drawn with the generator
    seed ``eval_seed + seed``), the same for every model and every length of that seed.
    Each RoPE model is also read with every kind in ``rope_readings`` at
    ``factor = n / L`` (factor 1, plain RoPE, at ``L``). With ``window``, the models of
    ``window_schemes`` (default: all) are also read with every key ``window`` or more
    positions back masked (``<scheme>+window``).

    Args:
        config: model, budget and evaluation.
        seeds: the training seeds (distinct non-negative ints).
        schemes: a subset of :data:`TEXT_SCHEMES`.
        rope_readings: a subset of :data:`pecode.experiments.ROPE_READINGS`.
        window: the test-time attention window, or ``None``.
        window_schemes: the schemes read with it (a subset of ``schemes``).
        splits: the corpus (default: :func:`corpus_splits` of :func:`load_corpus`).
        eval_seed: offset of the segments' generator seeds.
        workers: processes that train and read the models
            (:func:`pecode.experiments.map_jobs`); the result does not depend on it.

    Raises:
        ValueError: empty or repeated ``seeds``, unknown schemes or readings, a window
            that is not a positive int.
    """
    seeds = tuple(seeds)
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct and non-empty, got {seeds}")
    for seed in seeds:
        check_int("seed", seed, 0)
    for name in schemes:
        check_scheme(name, TEXT_SCHEMES)
    for kind in rope_readings:
        if kind not in ROPE_READINGS:
            raise ValueError(f"unknown rope reading {kind!r}; accepted: {list(ROPE_READINGS)}")
    windowed: tuple[str, ...] = ()
    if window is not None:
        check_int("window", window, 1)
        windowed = tuple(schemes if window_schemes is None else window_schemes)
        for name in windowed:
            if name not in schemes:
                raise ValueError(f"window_schemes holds {name!r}, which is not in schemes")
    if splits is None:
        splits = corpus_splits(load_corpus(), config.held_out_fraction)
    names = list(schemes)
    if "rope" in schemes:
        names += [f"rope+{kind}" for kind in rope_readings]
    names += [f"{name}+window" for name in windowed]
    result = TextResult(config=config, seeds=seeds, names=names, window=window)
    for name in names:
        result.losses[name] = {length: [] for length in config.eval_lengths}
    jobs = [
        (
            scheme,
            seed,
            config,
            splits,
            tuple(rope_readings),
            window if scheme in windowed else None,
            eval_seed,
        )
        for scheme in schemes
        for seed in seeds
    ]
    outcomes = map_jobs(_train_and_read, jobs, workers)
    for (scheme, *_), (model, train_losses, losses) in zip(jobs, outcomes, strict=True):
        result.models.setdefault(scheme, []).append(model)
        result.train_losses.setdefault(scheme, []).append(train_losses)
        for name, by_length in losses.items():
            for length, found in by_length.items():
                if found is None:
                    result.losses[name][length] = None
                else:
                    result.losses[name][length].append(found)
    return result
