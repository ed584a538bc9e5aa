"""Small training runs: train short, test long (chapter 13).

One tiny decoder-only Transformer, identical in size and training budget for every
position scheme, learns synthetic tasks at one length and is evaluated at longer ones.
Each training sequence carries two tasks, read out by one model
(``pecode.experiments.tasks``):

* the *delayed copy*, a local lookup: predict the token ``offset`` places back;
* the *needle*, a retrieval from far back: one token early in the sequence carries a
  value, and every later position must report it.

The pieces:

* ``pecode.experiments.tasks``: the data;
* ``pecode.experiments.models``: :class:`TinyDecoder` (with a test-time attention
  window), :func:`with_rope_scaling` (a trained RoPE model read with long-context
  frequencies, the YaRN paper's ramp included);
* ``pecode.experiments.training``: the one training loop (AdamW, warm-up and cosine
  decay, clipping) of this chapter's models and chapter 14's;
* ``pecode.experiments.stats``: Student's t-interval of per-seed differences, and the
  simulation that shows its coverage;
* here: :class:`ExperimentConfig`, :func:`train`, :func:`evaluate`,
  :func:`evaluate_probes` and :func:`run_experiment`, the whole sweep (schemes x seeds x
  readings x lengths), and :func:`paired_differences`, one model against another on
  every probe and length, as a table.

Everything runs on the CPU with a fixed number of threads (:func:`cpu_threads`, from
:mod:`pecode.utils`), so that
every scheme gets the same compute and a run is bit-for-bit repeatable on one machine.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from pecode._checks import check_bool, check_int
from pecode.experiments import models as _models
from pecode.experiments import tasks as _tasks
from pecode.experiments.models import (
    FrequencyRotary,
    ScaledQueries,
    SilencedPairs,
    TinyDecoder,
    attention_beyond,
    attention_entropy,
    attention_on_first_keys,
    attention_to_sinks,
    check_scheme,
    cpu_threads,
    map_jobs,
    readings,
    sliding_window_mask,
    with_pairs_silenced,
    with_rope_scaling,
    yarn_paper_frequencies,
)
from pecode.experiments.stats import (
    PairedInterval,
    _check_confidence,
    paired_bootstrap,
    paired_t_interval,
    simulated_coverage,
    t_quantile,
)
from pecode.experiments.tasks import (
    NeedleCopyBatch,
    delayed_copy_batch,
    needle_copy_batch,
)
from pecode.experiments.trained_cache import trained
from pecode.experiments.training import fit
from pecode.utils import Table, set_seed

# Re-declared here, with their documentation, so that the API reference has targets for them.
SCHEMES: tuple[str, ...] = _models.SCHEMES
"""The position schemes :class:`TinyDecoder` accepts: ``none`` is NoPE (causal mask only)."""

HYBRID_SCHEMES: tuple[str, ...] = _models.HYBRID_SCHEMES
"""RoPE variants, accepted by :class:`TinyDecoder`, :func:`train` and
:func:`run_experiment` beside ``SCHEMES`` but not in it (so a sweep with the default
``schemes`` is unchanged): ``"rope_nope"``, RoPE with a NoPE layer closing every group
of :data:`NOPE_EVERY` layers (:func:`pecode.layer_pattern.nope_layers`);
``"p_rope"``, RoPE on the fastest :data:`P_ROPE_FRACTION` of each head's pairs;
``"rope_sinks"``, RoPE with a learned sink logit per head (gpt-oss); and
``"rope_local_global"``, RoPE layers alternating between a sliding window of
:data:`LOCAL_WINDOW_SHARE` of the training length and the whole input (gpt-oss)."""

BIAS_FAMILY_SCHEMES: tuple[str, ...] = _models.BIAS_FAMILY_SCHEMES
"""Additive biases after ALiBi (page 6.1), accepted beside ``SCHEMES`` like
``HYBRID_SCHEMES``: ``"kerple"`` (the logarithmic kernel), ``"fire"`` (its learned
threshold initialised at the training length) and ``"forgetting"`` (the forget gate,
read from the keys); one module per layer."""

P_ROPE_FRACTION: float = _models.P_ROPE_FRACTION
"""The share of each head's pairs a ``"p_rope"`` :class:`TinyDecoder` rotates (0.25, as
Gemma 4's global layers; p-RoPE, Barbero et al. 2024)."""

LOCAL_WINDOW_SHARE: float = _models.LOCAL_WINDOW_SHARE
"""The sliding window of a ``"rope_local_global"`` :class:`TinyDecoder`'s local layers,
as a share of the training length (1/8; gpt-oss's and Gemma 3's are 1/32 of their
pre-training contexts)."""

NOPE_EVERY: int = _models.NOPE_EVERY
"""Llama 4's and SmolLM3's default interval of NoPE layers (4); a ``"rope_nope"``
:class:`TinyDecoder` uses ``min(NOPE_EVERY, num_layers)``."""

ROPE_SCALINGS: tuple[str, ...] = _models.ROPE_SCALINGS
"""Test-time RoPE scalings that are kinds of :mod:`pecode.scaling` (``"yarn"``: the authors'
code's ramp, as in Hugging Face transformers)."""

ROPE_READINGS: tuple[str, ...] = _models.ROPE_READINGS
"""Every reading :func:`with_rope_scaling` accepts: the scalings and ``"yarn_paper"``, YaRN
with the paper's ramp (:func:`yarn_paper_frequencies`)."""

PRACTICE_READINGS: tuple[str, ...] = _models.PRACTICE_READINGS
"""Readings from 2023–26 practice that :func:`with_rope_scaling` and
:func:`run_experiment` accept beside ``ROPE_READINGS`` (chapter 11.1): Qwen's ``"logn"``
query factor, Llama 4's ``"log_length"`` one, ``"rerope"`` and ``"leaky_rerope"``."""

REROPE_WINDOW_SHARE: float = _models.REROPE_WINDOW_SHARE
"""ReRoPE's window in ``PRACTICE_READINGS``, as a share of the training length (0.5)."""

IGNORE_INDEX: int = _tasks.IGNORE_INDEX
"""Target value of positions without a target; ignored by the loss and the accuracy."""

__all__ = [
    "BIAS_FAMILY_SCHEMES",
    "HYBRID_SCHEMES",
    "IGNORE_INDEX",
    "LOCAL_WINDOW_SHARE",
    "NOPE_EVERY",
    "PRACTICE_READINGS",
    "P_ROPE_FRACTION",
    "REROPE_WINDOW_SHARE",
    "ROPE_READINGS",
    "ROPE_SCALINGS",
    "SCHEMES",
    "ExperimentConfig",
    "ExperimentResult",
    "FrequencyRotary",
    "NeedleCopyBatch",
    "PairedInterval",
    "Probes",
    "ScaledQueries",
    "SilencedPairs",
    "TinyDecoder",
    "attention_beyond",
    "attention_entropy",
    "attention_on_first_keys",
    "attention_to_sinks",
    "cpu_threads",
    "delayed_copy_batch",
    "evaluate",
    "evaluate_probes",
    "map_jobs",
    "needle_copy_batch",
    "paired_bootstrap",
    "paired_differences",
    "paired_t_interval",
    "run_experiment",
    "seed_test_sets",
    "simulated_coverage",
    "sliding_window_mask",
    "t_quantile",
    "train",
    "with_pairs_silenced",
    "with_rope_scaling",
    "yarn_paper_frequencies",
]


@dataclass(frozen=True)
class ExperimentConfig:
    """Tasks, model and training budget; identical for every scheme.

    The defaults are chapter 13's experiment.

    Attributes:
        train_length: ``L``, the length of every training sequence.
        eval_factors: test lengths as multiples of ``L``.
        offset: the delayed copy's ``offset`` (predict the token this far back).
        vocab_size: number of filler tokens.
        needle_values: values a needle can carry; 0: no needle, the delayed copy alone.
            Needles lie in the first quarter of ``L`` (:attr:`needle_span`).
        dim, num_heads, num_layers: model size.
        steps, batch_size, lr: AdamW steps, sequences per step, peak learning rate
            (linear warm-up over the first tenth, then cosine decay to zero).
        eval_sequences: test sequences per length (the same ones for every model).
        num_threads: CPU threads for training and evaluation.
    """

    train_length: int = 256
    eval_factors: tuple[int, ...] = (1, 2, 4)
    offset: int = 4
    vocab_size: int = 16
    needle_values: int = 8
    dim: int = 64
    num_heads: int = 4
    num_layers: int = 2
    steps: int = 600
    batch_size: int = 4
    lr: float = 3e-3
    eval_sequences: int = 16
    num_threads: int = 1

    def __post_init__(self) -> None:
        for name in ("train_length", "offset", "vocab_size", "dim", "num_heads", "num_layers"):
            check_int(name, getattr(self, name), 1)
        for name in ("steps", "batch_size", "eval_sequences", "num_threads"):
            check_int(name, getattr(self, name), 1)
        check_int("needle_values", self.needle_values, 0)
        if self.needle_values == 1:
            raise ValueError("needle_values must be 0 (no needle) or at least 2")
        if self.offset >= self.train_length:
            raise ValueError(f"offset={self.offset} must be smaller than train_length")
        if self.needle_values and self.train_length < 4:
            raise ValueError("the needle task needs train_length >= 4 (its first quarter)")
        if not self.eval_factors or any(
            isinstance(f, bool) or not isinstance(f, int) or f < 1 for f in self.eval_factors
        ):
            raise ValueError(f"eval_factors must be positive ints, got {self.eval_factors}")
        if not (isinstance(self.lr, int | float) and math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive number, got {self.lr!r}")

    @property
    def eval_lengths(self) -> tuple[int, ...]:
        """The test lengths ``factor * train_length``."""
        return tuple(f * self.train_length for f in self.eval_factors)

    @property
    def needle_span(self) -> int:
        """Needles lie at positions ``0 .. needle_span - 1``, the first quarter of ``L``."""
        return self.train_length // 4

    @property
    def input_size(self) -> int:
        """The number of token ids, the fillers first, then one needle token per value."""
        return self.vocab_size + self.needle_values

    @property
    def output_size(self) -> int:
        """The number of logits per position, the copy's classes (every token id) first."""
        return self.input_size + self.needle_values

    def batch(self, batch_size: int, length: int, generator: torch.Generator) -> NeedleCopyBatch:
        """A batch of this configuration's task(s) at ``length``.

        Without a needle (``needle_values == 0``) the needle fields hold no target.
        """
        if self.needle_values:
            return needle_copy_batch(
                batch_size,
                length,
                offset=self.offset,
                vocab_size=self.vocab_size,
                needle_values=self.needle_values,
                needle_span=self.needle_span,
                generator=generator,
            )
        tokens, targets = delayed_copy_batch(
            batch_size, length, offset=self.offset, vocab_size=self.vocab_size, generator=generator
        )
        nothing = torch.full_like(tokens, IGNORE_INDEX)
        return NeedleCopyBatch(tokens, targets, nothing, torch.zeros(batch_size, dtype=torch.long))


EVAL_CHUNK = 8
"""Test sequences per forward pass in :func:`evaluate_probes`, to bound the memory."""


def _loss(logits: Tensor, batch: NeedleCopyBatch, config: ExperimentConfig) -> Tensor:
    """Cross-entropy of the copy, plus that of the needle when there is one."""
    split = config.input_size
    loss = F.cross_entropy(
        logits[..., :split].flatten(0, 1), batch.copy_targets.flatten(), ignore_index=IGNORE_INDEX
    )
    if config.needle_values:
        loss = loss + F.cross_entropy(
            logits[..., split:].flatten(0, 1),
            batch.needle_targets.flatten(),
            ignore_index=IGNORE_INDEX,
        )
    return loss


def train(
    scheme: str,
    config: ExperimentConfig,
    seed: int,
    *,
    on_step: Callable[[], None] | None = None,
) -> tuple[TinyDecoder, list[float]]:
    """Train a :class:`TinyDecoder` with ``scheme`` on the task(s) of ``config``.

    The seed fixes the initialization and the training data; with the same seed, config
    and thread count, two calls return identical models. The loss is the copy's
    cross-entropy, plus the needle's when ``config.needle_values > 0``.

    Args:
        scheme: one of ``SCHEMES``, ``HYBRID_SCHEMES`` or ``BIAS_FAMILY_SCHEMES``.
        config: the shared budget.
        seed: non-negative int.
        on_step: called after every optimizer step (a progress bar's ``update``).

    Returns:
        The trained model (in eval mode, on the CPU) and the training loss of every step.

    Raises:
        ValueError, TypeError: bad ``scheme``, ``seed`` or ``config``.
    """
    if not isinstance(config, ExperimentConfig):
        raise TypeError(f"config must be an ExperimentConfig, got {type(config).__name__}")
    check_scheme(scheme)
    generator = set_seed(seed)  # seeds the initialization; the generator draws the data
    with cpu_threads(config.num_threads):
        model = TinyDecoder(
            scheme,
            vocab_size=config.input_size,
            max_len=config.train_length,
            dim=config.dim,
            num_heads=config.num_heads,
            num_layers=config.num_layers,
            output_size=config.output_size,
        )

        def step_loss() -> Tensor:
            batch = config.batch(config.batch_size, config.train_length, generator)
            return _loss(model(batch.tokens), batch, config)

        losses = fit(model, step_loss, steps=config.steps, lr=config.lr, on_step=on_step)
    return model, losses


def _accuracy_by_column(predictions: Tensor, targets: Tensor) -> Tensor:
    """Share of correct predictions per column of ``targets`` (NaN where none has a target)."""
    valid = targets != IGNORE_INDEX
    correct = (predictions == targets) & valid
    return correct.sum(0).double() / valid.sum(0).double()


@torch.no_grad()
def evaluate(
    model: TinyDecoder, tokens: Tensor, targets: Tensor, *, window: int | None = None
) -> tuple[Tensor, float]:
    """Per-position accuracy and mean cross-entropy of ``model`` on one test set.

    For a model with one task (every logit is a class of ``targets``); the two-task
    model of chapter 13 is evaluated with :func:`evaluate_probes`.

    Shapes::

        tokens, targets: [batch, seq] (from :func:`delayed_copy_batch`)
        returns: (accuracy [seq] (float64; NaN where no position has a target), loss)

    Raises:
        ValueError: ``tokens`` and ``targets`` differ in shape, or the model is not
            defined at this length (a learned table shorter than ``seq``).
    """
    if tokens.shape != targets.shape:
        raise ValueError(
            f"tokens {tuple(tokens.shape)} and targets {tuple(targets.shape)} differ in shape"
        )
    logits = model(tokens, window=window)
    accuracy = _accuracy_by_column(logits.argmax(-1), targets)
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
    return accuracy, float(loss)


@dataclass(frozen=True)
class Probes:
    """What :func:`evaluate_probes` measures on one test set.

    Attributes:
        copy: ``[seq]`` accuracy of the delayed copy at each position (NaN before ``offset``).
        needle: ``[seq]`` accuracy of the needle at each *distance* from it
            (entry ``d`` averages the rows' positions ``needle + d``; NaN where none).
        near, far: mean needle accuracy over all positions less than / at least
            ``train_length`` after the needle (NaN if there are none).
    """

    copy: Tensor
    needle: Tensor
    near: float
    far: float


@torch.no_grad()
def evaluate_probes(
    model: TinyDecoder,
    batch: NeedleCopyBatch,
    config: ExperimentConfig,
    *,
    window: int | None = None,
) -> Probes:
    """Accuracy of both tasks of ``config`` from one forward pass of ``model`` over ``batch``.

    Raises:
        ValueError: the model is not defined at this length (a learned table shorter
            than the batch), or ``window`` is not positive.
    """
    split = config.input_size
    copy_predictions, needle_predictions = [], []
    for tokens in batch.tokens.split(EVAL_CHUNK):  # bounds the memory of the logits
        logits = model(tokens, window=window)
        copy_predictions.append(logits[..., :split].argmax(-1))
        needle_predictions.append(logits[..., split:].argmax(-1) if config.needle_values else None)
    copy = _accuracy_by_column(torch.cat(copy_predictions), batch.copy_targets)
    length = batch.tokens.shape[1]
    needle = torch.full((length,), float("nan"), dtype=torch.float64)
    near = far = float("nan")
    if config.needle_values:
        correct = (torch.cat(needle_predictions) == batch.needle_targets).double()
        valid = batch.needle_targets != IGNORE_INDEX
        distance = batch.needle_distance()
        totals = torch.zeros(length, dtype=torch.float64)
        counts = torch.zeros(length, dtype=torch.float64)
        index = distance.clamp(min=0)[valid]
        totals.index_add_(0, index, correct[valid])
        counts.index_add_(0, index, torch.ones_like(index, dtype=torch.float64))
        needle = totals / counts
        is_far = valid & (distance >= config.train_length)
        is_near = valid & (distance < config.train_length)
        if is_near.any():
            near = float(correct[is_near].mean())
        if is_far.any():
            far = float(correct[is_far].mean())
    return Probes(copy=copy, needle=needle, near=near, far=far)


PROBES: tuple[str, ...] = ("copy", "near", "far")
"""The scores :class:`ExperimentResult` keeps: copy accuracy, needle near and far."""


@dataclass
class ExperimentResult:
    """Scores of every model at every length, one entry per seed.

    ``scores[probe][name][length]`` is a list over seeds (``probe`` in ``"copy"``,
    ``"near"``, ``"far"``: copy accuracy over all positions with a target; needle
    accuracy at distances below / at least the training length, NaN where there are
    none); ``None`` where the model is not defined at that length (the learned table
    past ``max_len``). ``accuracy`` is ``scores["copy"]``. ``per_position[name]`` is the
    copy accuracy by position at the longest length, ``needle_by_distance[name]`` the
    needle accuracy by distance there, both averaged over seeds (``None`` if undefined).
    ``names`` lists the models: the schemes, then ``rope+<reading>``, then
    ``<scheme>+window``. ``models[scheme]`` holds the trained models, one per seed.
    """

    config: ExperimentConfig
    seeds: tuple[int, ...]
    names: list[str] = field(default_factory=list)
    scores: dict[str, dict[str, dict[int, list[float] | None]]] = field(default_factory=dict)
    per_position: dict[str, Tensor | None] = field(default_factory=dict)
    needle_by_distance: dict[str, Tensor | None] = field(default_factory=dict)
    train_losses: dict[str, list[list[float]]] = field(default_factory=dict)
    models: dict[str, list[TinyDecoder]] = field(default_factory=dict)
    window: int | None = None

    @property
    def accuracy(self) -> dict[str, dict[int, list[float] | None]]:
        """The copy accuracy ``accuracy[name][length]``, a list over seeds (or ``None``)."""
        return self.scores["copy"]

    def values(self, name: str, length: int, probe: str = "copy") -> list[float] | None:
        """The per-seed scores of ``name`` at ``length`` (``None`` if undefined).

        Raises:
            KeyError: unknown probe, model or length.
        """
        if probe not in PROBES:
            raise KeyError(f"unknown probe {probe!r}; accepted: {list(PROBES)}")
        return self.scores[probe][name][length]

    def summary(self, name: str, length: int, probe: str = "copy") -> tuple[float, float] | None:
        """``(mean, standard deviation)`` over seeds; ``None`` if undefined."""
        values = self.values(name, length, probe)
        if values is None:
            return None
        as_tensor = torch.tensor(values, dtype=torch.float64)
        spread = float(as_tensor.std()) if len(values) > 1 else 0.0
        return float(as_tensor.mean()), spread

    def paired(
        self,
        name: str,
        baseline: str,
        length: int,
        probe: str = "copy",
        *,
        baseline_length: int | None = None,
        baseline_probe: str | None = None,
        confidence: float = 0.95,
    ) -> PairedInterval:
        """Student's t-interval of ``name`` minus ``baseline``, seed by seed.

        Each seed's difference is scored on that seed's own test sets, so the interval
        covers the spread of test sequences as well as that of training seeds.

        Both are read at ``length`` and ``probe`` unless ``baseline_length`` or
        ``baseline_probe`` says otherwise (the same model at two lengths, say).

        Raises:
            ValueError: either model is undefined there, or a score is NaN.
        """
        baseline_length = length if baseline_length is None else baseline_length
        baseline_probe = probe if baseline_probe is None else baseline_probe
        a = self.values(name, length, probe)
        b = self.values(baseline, baseline_length, baseline_probe)
        if a is None or b is None:
            raise ValueError(f"{name} or {baseline} is not defined at the lengths asked for")
        return paired_t_interval([x - y for x, y in zip(a, b, strict=True)], confidence=confidence)


def seed_test_sets(
    config: ExperimentConfig, seed: int, eval_seed: int = 12345
) -> dict[int, NeedleCopyBatch]:
    """The test sets :func:`run_experiment` reads seed ``seed``'s models on, by length.

    ``eval_sequences`` sequences per length of ``config.eval_lengths``, drawn in that
    order from one generator seeded with ``eval_seed + seed``: every model and reading
    of a seed meets the same sequences, and a probe run afterwards meets them too.

    Raises:
        TypeError, ValueError: ``seed`` or ``eval_seed`` is not a non-negative int.
    """
    check_int("seed", seed, 0)
    check_int("eval_seed", eval_seed, 0)
    generator = torch.Generator().manual_seed(eval_seed + seed)
    return {
        length: config.batch(config.eval_sequences, length, generator)
        for length in config.eval_lengths
    }


def _train_and_probe(
    scheme: str,
    seed: int,
    config: ExperimentConfig,
    rope_scalings: tuple[str, ...],
    window: int | None,
    eval_seed: int,
) -> tuple[TinyDecoder, list[float], dict[str, dict[int, Probes | None]]]:
    """One job of :func:`run_experiment`: train one model, probe every reading of it.

    The training may come from :mod:`pecode.experiments.trained_cache` (opt-in); the
    probing always runs."""
    model, losses = trained(train, scheme, config, seed)
    test_sets = seed_test_sets(config, seed, eval_seed)
    probes: dict[str, dict[int, Probes | None]] = {}
    for name, kind, masked in readings(scheme, rope_scalings, window):
        probes[name] = {}
        for length, batch in test_sets.items():
            if scheme == "learned" and length > config.train_length:
                probes[name][length] = None  # no table rows: not defined
                continue
            evaluated = model
            if kind is not None:
                evaluated = with_rope_scaling(model, kind, length / config.train_length)
            with cpu_threads(config.num_threads):
                probes[name][length] = evaluate_probes(evaluated, batch, config, window=masked)
    return model, losses, probes


def run_experiment(
    config: ExperimentConfig,
    seeds: Sequence[int],
    *,
    schemes: Sequence[str] = SCHEMES,
    rope_scalings: Sequence[str] = ROPE_SCALINGS,
    window: int | None = None,
    eval_seed: int = 12345,
    workers: int = 1,
) -> ExperimentResult:
    """Train every scheme with every seed and evaluate each model at every test length.

    Each seed has its own test sets (one per length, ``eval_sequences`` each, drawn
    from ``eval_seed + seed``), shared by every model and reading of that seed: a
    comparison is paired within a seed, and the spread over seeds includes the
    sampling of test sequences. A RoPE model is also evaluated with each of
    ``rope_scalings`` at ``factor = length / train_length`` (factor 1 at the training
    length, where every scaling reduces to plain RoPE). With ``window``, every model is
    also evaluated with the keys ``window`` or more positions back masked
    (``<scheme>+window``).

    Args:
        config: tasks, model and budget.
        seeds: the training seeds (distinct non-negative ints).
        schemes: a subset of ``SCHEMES``, ``HYBRID_SCHEMES`` and ``BIAS_FAMILY_SCHEMES``.
        rope_scalings: a subset of ``ROPE_READINGS`` and ``PRACTICE_READINGS`` (ignored
            without ``"rope"``).
        window: the test-time attention window, or ``None``.
        eval_seed: offset of the test sets' seeds.
        workers: processes that train and evaluate the models (:func:`map_jobs`); the
            result does not depend on it.

    Raises:
        ValueError: empty or repeated ``seeds``, unknown schemes or scalings, a window
            that is not a positive int.
    """
    seeds = tuple(seeds)
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct and non-empty, got {seeds}")
    for seed in seeds:
        check_int("seed", seed, 0)
    for name in schemes:
        check_scheme(name)
    for kind in rope_scalings:
        if kind not in ROPE_READINGS + PRACTICE_READINGS:
            raise ValueError(
                f"unknown rope scaling {kind!r}; accepted: "
                f"{list(ROPE_READINGS + PRACTICE_READINGS)}"
            )
    if window is not None:
        check_int("window", window, 1)
    names = list(schemes)
    if "rope" in schemes:
        names += [f"rope+{kind}" for kind in rope_scalings]
    if window is not None:
        names += [f"{scheme}+window" for scheme in schemes]
    result = ExperimentResult(config=config, seeds=seeds, names=names, window=window)
    for probe in PROBES:
        result.scores[probe] = {
            name: {length: [] for length in config.eval_lengths} for name in names
        }
    longest = max(config.eval_lengths)
    curves: dict[str, list[Tensor]] = {name: [] for name in names}
    needle_curves: dict[str, list[Tensor]] = {name: [] for name in names}
    jobs = [
        (scheme, seed, config, tuple(rope_scalings), window, eval_seed)
        for scheme in schemes
        for seed in seeds
    ]
    outcomes = map_jobs(_train_and_probe, jobs, workers)
    for (scheme, *_), (model, losses, probes) in zip(jobs, outcomes, strict=True):
        result.models.setdefault(scheme, []).append(model)
        result.train_losses.setdefault(scheme, []).append(losses)
        for name, by_length in probes.items():
            for length, found in by_length.items():
                if found is None:
                    for probe in PROBES:
                        result.scores[probe][name][length] = None
                    continue
                result.scores["copy"][name][length].append(float(found.copy.nanmean()))
                result.scores["near"][name][length].append(found.near)
                result.scores["far"][name][length].append(found.far)
                if length == longest:
                    curves[name].append(found.copy)
                    needle_curves[name].append(found.needle)
    for name in names:
        result.per_position[name] = torch.stack(curves[name]).mean(0) if curves[name] else None
        result.needle_by_distance[name] = (
            torch.stack(needle_curves[name]).mean(0) if needle_curves[name] else None
        )
    return result


def paired_differences(
    result: ExperimentResult,
    name: str,
    baseline: str,
    *,
    probes: Sequence[str] = PROBES,
    confidence: float = 0.95,
    signs: bool = False,
) -> Table:
    """``name`` minus ``baseline`` on every probe and length, seed by seed, as a table.

    One row per probe and test length where both models are defined and scored (the
    far needle has no positions at the training length, so it starts at ``2L``): the
    mean of each over the seeds, and Student's t-interval of the paired differences
    (:meth:`ExperimentResult.paired`, chapter 13's intervals). Like every interval of
    chapter 13, it covers the spread of test sequences as well as of training seeds.
    With ``signs``, also how many seeds went each way; off by default, because, as
    chapter 13 notes, a seed whose difference is near zero can change sides on another
    CPU, and a notebook's printed output must not.

    Raises:
        KeyError: ``name`` or ``baseline`` is not in ``result``, or an unknown probe.
        TypeError, ValueError: ``confidence`` is not a number strictly between 0 and 1,
            or ``signs`` is not a bool.
    """
    confidence = _check_confidence(confidence)
    check_bool("signs", signs)
    for model in (name, baseline):
        if model not in result.names:
            raise KeyError(f"{model!r} is not in the result; it has {result.names}")
    rows = []
    for probe in probes:
        if probe not in PROBES:
            raise KeyError(f"unknown probe {probe!r}; accepted: {list(PROBES)}")
        for length in result.config.eval_lengths:
            a = result.values(name, length, probe)
            b = result.values(baseline, length, probe)
            if a is None or b is None or any(math.isnan(v) for v in [*a, *b]):
                continue  # not defined, or no position to score (far at L)
            interval = result.paired(name, baseline, length, probe, confidence=confidence)
            factor = length // result.config.train_length
            rows.append(
                [
                    f"{probe} {factor}L",
                    f"{sum(a) / len(a):.2f}",
                    f"{sum(b) / len(b):.2f}",
                    str(interval),
                    *([f"{interval.positive}+ {interval.negative}-"] if signs else []),
                ]
            )
    header = [
        "probe",
        name,
        baseline,
        f"difference [{confidence:.0%} interval]",
        *(["seeds"] if signs else []),
    ]
    return Table(header, rows)
