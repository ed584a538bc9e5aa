"""Small training runs: train short, test long (chapter 12).

One tiny decoder-only Transformer, identical in size and training budget for every
position scheme, learns a synthetic task at one length and is evaluated at longer ones.

The task, *delayed copy*: a sequence of uniformly random tokens, and at every position
``t >= offset`` the model must predict the token ``offset`` places back,
``y_t = x_{t - offset}``. The rule is the same at every length and every position, and
it needs position information (a model without any cannot tell the token ``offset`` back
from any other), but only *relative* position. A model that learned the rule has no
reason to fail on a longer sequence; when it does, the position scheme is the cause.

* :func:`delayed_copy_batch`: the data;
* :class:`TinyDecoder`: embeddings, an optional absolute encoding, pre-LN blocks built
  on :class:`~pecode.attention.MultiHeadAttention`, and a linear read-out;
* :func:`train` and :func:`evaluate`: a fixed training budget and per-position accuracy;
* :func:`with_rope_scaling`: the same trained RoPE model with long-context frequencies
  from :mod:`pecode.scaling`, without retraining;
* :func:`run_experiment`: the whole sweep (schemes x seeds x lengths).

Everything runs on the CPU with a fixed number of threads (:func:`cpu_threads`), so that
every scheme gets the same compute and a run is bit-for-bit repeatable on one machine.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from pecode._checks import check_int
from pecode.absolute import (
    LearnedPositionalEncoding,
    SinusoidalPositionalEncoding,
)
from pecode.alibi import ALiBi
from pecode.attention import MultiHeadAttention, PositionScheme
from pecode.relative import T5RelativePositionBias
from pecode.rope import RotaryEmbedding
from pecode.utils import set_seed

__all__ = [
    "IGNORE_INDEX",
    "ROPE_SCALINGS",
    "SCHEMES",
    "ExperimentConfig",
    "ExperimentResult",
    "TinyDecoder",
    "cpu_threads",
    "delayed_copy_batch",
    "evaluate",
    "run_experiment",
    "train",
    "with_rope_scaling",
]

SCHEMES: tuple[str, ...] = ("none", "sinusoidal", "learned", "t5", "alibi", "rope")
"""The position schemes :class:`TinyDecoder` accepts: ``none`` is NoPE (causal mask only)."""

ROPE_SCALINGS: tuple[str, ...] = ("linear", "ntk", "yarn")
"""Test-time RoPE scalings of :func:`with_rope_scaling` (kinds of :mod:`pecode.scaling`)."""

IGNORE_INDEX = -100
"""Target value of positions without a target (``t < offset``); ignored by the loss."""


@contextmanager
def cpu_threads(num_threads: int) -> Iterator[None]:
    """Run the body with ``torch.set_num_threads(num_threads)``, then restore the old value.

    A fixed thread count makes CPU reductions, hence training runs, repeatable.

    Raises:
        TypeError, ValueError: ``num_threads`` is not a positive int.
    """
    check_int("num_threads", num_threads, 1)
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def delayed_copy_batch(
    batch_size: int,
    length: int,
    *,
    offset: int,
    vocab_size: int,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor]:
    """A batch of the delayed-copy task: predict the token ``offset`` places back.

    ``tokens`` are i.i.d. uniform over ``0 .. vocab_size - 1``;
    ``targets[:, t] = tokens[:, t - offset]`` for ``t >= offset`` and
    :data:`IGNORE_INDEX` before.

    Shapes::

        returns: (tokens [batch_size, length], targets [batch_size, length]), int64

    Raises:
        TypeError, ValueError: a size is not a positive int, ``offset`` is not in
            ``1 .. length - 1``, ``vocab_size < 2``, or ``generator`` is not a
            ``torch.Generator``.
    """
    check_int("batch_size", batch_size, 1)
    check_int("length", length, 2)
    check_int("offset", offset, 1)
    check_int("vocab_size", vocab_size, 2)
    if offset >= length:
        raise ValueError(f"offset={offset} must be smaller than length={length}")
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    tokens = torch.randint(vocab_size, (batch_size, length), generator=generator)
    targets = torch.full_like(tokens, IGNORE_INDEX)
    targets[:, offset:] = tokens[:, :-offset]
    return tokens, targets


def _position_scheme(
    scheme: str, head_dim: int, num_heads: int, train_length: int
) -> PositionScheme | None:
    """The scheme inside attention (``None`` for NoPE and the absolute encodings)."""
    if scheme == "t5":
        # Decoder buckets; as in T5 (512 tokens, max_distance 128) the last bucket is
        # reached within the training length, so every bucket used later was trained
        # (16 buckets: 8 exact offsets, then log-spaced up to max_distance). The logits
        # are scaled by 1/sqrt(Dh) like every other scheme here.
        return T5RelativePositionBias(
            num_heads,
            bidirectional=False,
            num_buckets=16,
            max_distance=max(train_length, 16),
            scale_logits=True,
        )
    if scheme == "alibi":
        return ALiBi(num_heads)
    if scheme == "rope":
        return RotaryEmbedding(head_dim)
    return None


class _Block(nn.Module):
    """Pre-LN decoder block: ``x + Attn(LN(x))``, then ``x + MLP(LN(x))``."""

    def __init__(self, dim: int, num_heads: int, position: PositionScheme | None) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attention = MultiHeadAttention(dim, num_heads, position=position)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attention(self.norm1(x), causal=True)
        return x + self.mlp(self.norm2(x))


class TinyDecoder(nn.Module):
    """A small decoder-only Transformer whose position scheme is a constructor argument.

    Token embedding, then for ``sinusoidal``/``learned`` the absolute encoding added to
    it (:class:`~pecode.absolute.SinusoidalPositionalEncoding`,
    :class:`~pecode.absolute.LearnedPositionalEncoding` with ``max_len`` rows), then
    ``num_layers`` pre-LN blocks (Xiong et al. 2020) with causal
    :class:`~pecode.attention.MultiHeadAttention` carrying the scheme (T5 bias, ALiBi,
    RoPE, or nothing), a final LayerNorm and a linear read-out. ``none`` adds no
    position information at all: only the causal mask (NoPE, Kazemnejad et al. 2023).

    Shapes::

        tokens: [batch, seq] (int64, in 0 .. vocab_size-1)    returns: [batch, seq, vocab_size]

    Args:
        scheme: one of :data:`SCHEMES`.
        vocab_size: number of token ids.
        max_len: the training length; rows of the learned table, and T5's
            ``max_distance`` (at least 16, which T5's 16 decoder buckets need).
        dim, num_heads, num_layers: width, heads per layer, blocks.

    Raises:
        ValueError: unknown ``scheme``, or sizes that are not positive ints
            (``dim`` must be divisible by ``num_heads``, the head size even).
        TypeError: a size is not an int.
    """

    def __init__(
        self,
        scheme: str,
        *,
        vocab_size: int,
        max_len: int,
        dim: int = 64,
        num_heads: int = 4,
        num_layers: int = 2,
    ) -> None:
        super().__init__()
        if scheme not in SCHEMES:
            raise ValueError(f"unknown scheme {scheme!r}; accepted: {list(SCHEMES)}")
        check_int("vocab_size", vocab_size, 2)
        check_int("max_len", max_len, 1)
        check_int("dim", dim, 1)
        check_int("num_heads", num_heads, 1)
        check_int("num_layers", num_layers, 1)
        if dim % num_heads or (dim // num_heads) % 2:
            raise ValueError(f"dim={dim} must split into num_heads={num_heads} even head sizes")
        self.scheme, self.vocab_size, self.max_len = scheme, vocab_size, max_len
        self.embedding = nn.Embedding(vocab_size, dim)
        self.absolute: nn.Module | None = None
        if scheme == "sinusoidal":
            self.absolute = SinusoidalPositionalEncoding(dim)
        elif scheme == "learned":
            self.absolute = LearnedPositionalEncoding(max_len, dim)
        head_dim = dim // num_heads
        self.blocks = nn.ModuleList(
            _Block(dim, num_heads, _position_scheme(scheme, head_dim, num_heads, max_len))
            for _ in range(num_layers)
        )
        self.norm = nn.LayerNorm(dim)
        self.readout = nn.Linear(dim, vocab_size)

    def forward(self, tokens: Tensor) -> Tensor:
        """Logits for the next-token targets at every position.

        Raises:
            TypeError: ``tokens`` is not an integer tensor.
            ValueError: ``tokens`` is not 2-D, holds an id outside the vocabulary, or
                (``learned``) is longer than ``max_len``: a learned table has no rows
                there, so the model is not defined.
        """
        if (
            not isinstance(tokens, Tensor)
            or tokens.is_floating_point()
            or tokens.dtype == torch.bool
        ):
            raise TypeError("tokens must be an integer tensor")
        if tokens.dim() != 2:
            raise ValueError(f"tokens must have shape [batch, seq], got {tuple(tokens.shape)}")
        if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= self.vocab_size):
            raise ValueError(f"tokens must lie in 0 .. {self.vocab_size - 1}")
        x = self.embedding(tokens)
        if self.absolute is not None:
            x = self.absolute(x)  # the learned table raises past max_len
        for block in self.blocks:
            x = block(x)
        return self.readout(self.norm(x))


def with_rope_scaling(model: TinyDecoder, kind: str, factor: float) -> TinyDecoder:
    """A copy of a trained RoPE model whose rotations use long-context frequencies.

    Each layer's :class:`~pecode.rope.RotaryEmbedding` is replaced by one with
    ``scaling=kind`` and ``factor`` (``original_max_position_embeddings`` = the
    training length for YaRN); the weights are untouched, nothing is retrained. The
    schemes have no parameters, so the copy's ``state_dict`` equals the original's.

    Args:
        model: a :class:`TinyDecoder` built with ``scheme="rope"``.
        kind: one of :data:`ROPE_SCALINGS` (``"linear"``: Chen et al. 2023; ``"ntk"``:
            NTK-aware; ``"yarn"``: Peng et al. 2023).
        factor: the context extension ``s >= 1``, usually test length / training length.

    Raises:
        TypeError: ``model`` is not a :class:`TinyDecoder`.
        ValueError: ``model`` does not use RoPE, ``kind`` is unknown, or ``factor < 1``.
    """
    if not isinstance(model, TinyDecoder):
        raise TypeError(f"model must be a TinyDecoder, got {type(model).__name__}")
    if model.scheme != "rope":
        raise ValueError(f"model must use scheme 'rope', got {model.scheme!r}")
    if kind not in ROPE_SCALINGS:
        raise ValueError(f"unknown kind {kind!r}; accepted: {list(ROPE_SCALINGS)}")
    if isinstance(factor, bool) or not isinstance(factor, int | float) or not factor >= 1:
        raise ValueError(f"factor must be a number >= 1, got {factor!r}")
    params: dict[str, float | int] = {"factor": float(factor)}
    if kind == "yarn":
        params["original_max_position_embeddings"] = model.max_len
    scaled = copy.deepcopy(model)
    for block in scaled.blocks:
        old = block.attention.position
        assert isinstance(old, RotaryEmbedding)
        block.attention.position = RotaryEmbedding(
            old.head_dim, base=old.base, scaling=kind, scaling_params=params
        )
    return scaled


@dataclass(frozen=True)
class ExperimentConfig:
    """Task, model and training budget; identical for every scheme.

    Attributes:
        train_length: ``L``, the length of every training sequence.
        eval_factors: test lengths as multiples of ``L``.
        offset: the task's ``offset`` (predict the token this far back).
        vocab_size: number of token ids.
        dim, num_heads, num_layers: model size.
        steps, batch_size, lr: AdamW steps, sequences per step, peak learning rate
            (linear warm-up over the first tenth, then cosine decay to zero).
        eval_sequences: test sequences per length (the same ones for every model).
        num_threads: CPU threads for training and evaluation.
    """

    train_length: int = 32
    eval_factors: tuple[int, ...] = (1, 2, 4, 8)
    offset: int = 4
    vocab_size: int = 16
    dim: int = 64
    num_heads: int = 4
    num_layers: int = 2
    steps: int = 600
    batch_size: int = 32
    lr: float = 3e-3
    eval_sequences: int = 64
    num_threads: int = 1

    def __post_init__(self) -> None:
        for name in ("train_length", "offset", "vocab_size", "dim", "num_heads", "num_layers"):
            check_int(name, getattr(self, name), 1)
        for name in ("steps", "batch_size", "eval_sequences", "num_threads"):
            check_int(name, getattr(self, name), 1)
        if self.offset >= self.train_length:
            raise ValueError(f"offset={self.offset} must be smaller than train_length")
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


def _learning_rate(step: int, config: ExperimentConfig) -> float:
    """Linear warm-up over the first tenth of the steps, then cosine decay to zero."""
    warmup = max(1, config.steps // 10)
    if step < warmup:
        return config.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, config.steps - warmup)
    return config.lr * 0.5 * (1.0 + math.cos(math.pi * progress))


def train(
    scheme: str,
    config: ExperimentConfig,
    seed: int,
    *,
    on_step: Callable[[], None] | None = None,
) -> tuple[TinyDecoder, list[float]]:
    """Train a :class:`TinyDecoder` with ``scheme`` on the delayed-copy task at ``train_length``.

    The seed fixes the initialization and the training data; with the same seed, config
    and thread count, two calls return identical models.

    Args:
        scheme: one of :data:`SCHEMES`.
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
    if scheme not in SCHEMES:
        raise ValueError(f"unknown scheme {scheme!r}; accepted: {list(SCHEMES)}")
    generator = set_seed(seed)  # seeds the initialization; the generator draws the data
    with cpu_threads(config.num_threads):
        model = TinyDecoder(
            scheme,
            vocab_size=config.vocab_size,
            max_len=config.train_length,
            dim=config.dim,
            num_heads=config.num_heads,
            num_layers=config.num_layers,
        )
        optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01)
        model.train()
        losses = []
        for step in range(config.steps):
            for group in optimizer.param_groups:
                group["lr"] = _learning_rate(step, config)
            tokens, targets = delayed_copy_batch(
                config.batch_size,
                config.train_length,
                offset=config.offset,
                vocab_size=config.vocab_size,
                generator=generator,
            )
            logits = model(tokens)
            loss = F.cross_entropy(
                logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX
            )
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            losses.append(loss.item())
            if on_step is not None:
                on_step()
    return model.eval(), losses


@torch.no_grad()
def evaluate(model: TinyDecoder, tokens: Tensor, targets: Tensor) -> tuple[Tensor, float]:
    """Per-position accuracy and mean cross-entropy of ``model`` on one test set.

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
    logits = model(tokens)
    valid = targets != IGNORE_INDEX
    correct = (logits.argmax(-1) == targets) & valid
    counts = valid.sum(0).double()
    accuracy = correct.sum(0).double() / counts  # 0/0 = NaN where there is no target
    loss = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), ignore_index=IGNORE_INDEX)
    return accuracy, float(loss)


@dataclass
class ExperimentResult:
    """Accuracies of every model at every length, one entry per seed.

    ``accuracy[name][length]`` is a list over seeds of the mean accuracy over all
    positions with a target; ``None`` where the model is not defined at that length
    (the learned table past ``max_len``). ``per_position[name]`` is the per-position
    accuracy at the longest length, averaged over seeds (``[length]``, ``None`` if
    undefined). ``names`` lists the models in order: the schemes, then ``rope+<kind>``.
    """

    config: ExperimentConfig
    seeds: tuple[int, ...]
    names: list[str] = field(default_factory=list)
    accuracy: dict[str, dict[int, list[float] | None]] = field(default_factory=dict)
    loss: dict[str, dict[int, list[float] | None]] = field(default_factory=dict)
    per_position: dict[str, Tensor | None] = field(default_factory=dict)
    train_losses: dict[str, list[list[float]]] = field(default_factory=dict)

    def summary(self, name: str, length: int) -> tuple[float, float] | None:
        """``(mean, standard deviation)`` over seeds of the accuracy; ``None`` if undefined."""
        values = self.accuracy[name][length]
        if values is None:
            return None
        as_tensor = torch.tensor(values, dtype=torch.float64)
        spread = float(as_tensor.std()) if len(values) > 1 else 0.0
        return float(as_tensor.mean()), spread


def run_experiment(
    config: ExperimentConfig,
    seeds: Sequence[int],
    *,
    schemes: Sequence[str] = SCHEMES,
    rope_scalings: Sequence[str] = ROPE_SCALINGS,
    eval_seed: int = 12345,
    on_step: Callable[[], None] | None = None,
) -> ExperimentResult:
    """Train every scheme with every seed and evaluate each model at every test length.

    The test sets (one per length, ``eval_sequences`` each, drawn from ``eval_seed``)
    are shared by all models. A RoPE model is also evaluated with each of
    ``rope_scalings`` at ``factor = length / train_length`` (factor 1 at the training
    length, where every scaling reduces to plain RoPE).

    Args:
        config: task, model and budget.
        seeds: the training seeds (distinct non-negative ints).
        schemes: a subset of :data:`SCHEMES`.
        rope_scalings: a subset of :data:`ROPE_SCALINGS` (ignored without ``"rope"``).
        eval_seed: seed of the test sets.
        on_step: called after every training step (for a progress bar; the total is
            ``len(schemes) * len(seeds) * config.steps``).

    Raises:
        ValueError: empty or repeated ``seeds``, unknown schemes or scalings.
    """
    seeds = tuple(seeds)
    if not seeds or len(set(seeds)) != len(seeds):
        raise ValueError(f"seeds must be distinct and non-empty, got {seeds}")
    for name in schemes:
        if name not in SCHEMES:
            raise ValueError(f"unknown scheme {name!r}; accepted: {list(SCHEMES)}")
    for kind in rope_scalings:
        if kind not in ROPE_SCALINGS:
            raise ValueError(f"unknown rope scaling {kind!r}; accepted: {list(ROPE_SCALINGS)}")
    test_generator = torch.Generator().manual_seed(eval_seed)
    test_sets = {
        length: delayed_copy_batch(
            config.eval_sequences,
            length,
            offset=config.offset,
            vocab_size=config.vocab_size,
            generator=test_generator,
        )
        for length in config.eval_lengths
    }
    names = list(schemes)
    if "rope" in schemes:
        names += [f"rope+{kind}" for kind in rope_scalings]
    result = ExperimentResult(config=config, seeds=seeds, names=names)
    for name in names:
        result.accuracy[name] = {length: [] for length in config.eval_lengths}
        result.loss[name] = {length: [] for length in config.eval_lengths}
    longest = max(config.eval_lengths)
    curves: dict[str, list[Tensor]] = {name: [] for name in names}
    for scheme in schemes:
        result.train_losses[scheme] = []
        for seed in seeds:
            model, losses = train(scheme, config, seed, on_step=on_step)
            result.train_losses[scheme].append(losses)
            variants = [(scheme, None)]
            if scheme == "rope":
                variants += [(f"rope+{kind}", kind) for kind in rope_scalings]
            for name, kind in variants:
                for length, (tokens, targets) in test_sets.items():
                    evaluated = model
                    if kind is not None:
                        evaluated = with_rope_scaling(model, kind, length / config.train_length)
                    if scheme == "learned" and length > config.train_length:
                        result.accuracy[name][length] = None  # no table rows: not defined
                        result.loss[name][length] = None
                        continue
                    with cpu_threads(config.num_threads):
                        accuracy, loss = evaluate(evaluated, tokens, targets)
                    result.accuracy[name][length].append(float(accuracy.nanmean()))
                    result.loss[name][length].append(loss)
                    if length == longest:
                        curves[name].append(accuracy)
    for name in names:
        result.per_position[name] = torch.stack(curves[name]).mean(0) if curves[name] else None
    return result
