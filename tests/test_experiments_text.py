"""The real-text experiment of chapter 14: the pinned corpus, its split, the end-aligned
and the randomly drawn evaluation windows, per-position losses and the seed interval
against hand-worked examples, and a tiny language model that learns, deterministically
under a seed and whatever the number of worker processes."""

from __future__ import annotations

import hashlib
import math
from fnmatch import fnmatch
from pathlib import Path

import pytest
import torch

from pecode.experiments import TinyDecoder, text
from pecode.experiments.text import (
    CORPUS_SHA256,
    TEXT_SCHEMES,
    TEXT_VARIANTS,
    TextConfig,
    TextResult,
    corpus_splits,
    held_out_windows,
    load_corpus,
    longer_readings,
    nonoverlapping_losses,
    position_losses,
    random_windows,
    run_text_experiment,
    train_language_model,
)

ROOT = Path(__file__).resolve().parents[1]
CORPUS_PATH = ROOT / "pecode" / "experiments" / "data" / "tinyshakespeare.txt"

TINY = TextConfig(
    train_length=16,
    eval_factors=(1, 2),
    tail=4,
    dim=16,
    num_heads=2,
    num_layers=1,
    steps=60,
    batch_size=8,
    lr=1e-2,
    eval_windows=4,
)


@pytest.fixture(scope="module")
def splits():
    return corpus_splits(load_corpus())


def test_the_corpus_is_the_pinned_file():
    # the digest is computed here from the file on disk, not by load_corpus
    data = CORPUS_PATH.read_bytes()
    assert hashlib.sha256(data).hexdigest() == CORPUS_SHA256
    assert len(data) == 1_115_394
    corpus = load_corpus()
    assert corpus == data.decode("ascii")
    assert corpus.startswith("First Citizen:\nBefore we proceed any further, hear me speak.")


def test_a_changed_corpus_is_refused(monkeypatch):
    monkeypatch.setattr(text, "CORPUS_SHA256", "0" * 64)
    with pytest.raises(RuntimeError, match="SHA-256"):
        load_corpus()


def test_the_corpus_ships_with_the_package():
    # pip builds the wheel from pyproject.toml: without a package-data entry the corpus
    # would be missing from `pip install` (Colab), though present in a checkout
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+; make test-oldest may be on 3.10
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    package_data = config["tool"]["setuptools"].get("package-data", {})
    # setuptools matches each pattern against the path relative to its package
    candidates = {
        "pecode": "experiments/data/tinyshakespeare.txt",
        "pecode.experiments": "data/tinyshakespeare.txt",
    }
    assert any(
        fnmatch(path, pattern)
        for package, path in candidates.items()
        for pattern in package_data.get(package, [])
    ), package_data


def test_split_is_contiguous_and_decodes_back(splits):
    corpus = load_corpus()
    assert splits.vocab_size == len(set(corpus)) == 65
    assert splits.alphabet == "".join(sorted(set(corpus)))
    assert splits.train.numel() + splits.test.numel() == len(corpus)
    assert splits.test.numel() == round(0.1 * len(corpus))
    decode = lambda ids: "".join(splits.alphabet[i] for i in ids.tolist())  # noqa: E731
    assert decode(splits.train[:40]) == corpus[:40]
    assert decode(splits.test[-40:]) == corpus[-40:]
    assert decode(splits.test[:40]) == corpus[splits.train.numel() :][:40]


@pytest.mark.parametrize("fraction", [0.0, 1.0, 1, 0.01])
def test_split_rejects_bad_fractions(fraction):
    with pytest.raises(ValueError, match="held_out_fraction"):
        corpus_splits("abcdef", fraction)


def test_split_rejects_bytes():
    with pytest.raises(TypeError):
        corpus_splits(b"abcdef")


def test_random_windows_are_consecutive_ids():
    ids = torch.arange(100)
    windows = random_windows(ids, 9, 5, torch.Generator().manual_seed(0))
    assert windows.shape == (5, 10)
    for row in windows.tolist():
        assert row == list(range(row[0], row[0] + 10))
    with pytest.raises(ValueError, match="ids"):
        random_windows(ids, 100, 1, torch.Generator())


def test_held_out_windows_are_evenly_spaced_consecutive_ids():
    ids = torch.arange(1000)
    windows = held_out_windows(ids, 64, 7)
    ends = [65 + (1000 - 65) * i // 6 for i in range(7)]  # exclusive ends, a slow loop
    assert windows.shape == (7, 65)
    for row, end in zip(windows.tolist(), ends, strict=True):
        assert row == list(range(end - 65, end))
    assert windows[-1, -1] == 999  # the last window ends at the end of the ids


def test_held_out_windows_reject_bad_input():
    with pytest.raises(ValueError, match="ids"):
        held_out_windows(torch.arange(20), 10, 30)
    with pytest.raises(TypeError, match="length"):
        held_out_windows(torch.arange(20), 2.0, 3)


class _FakeModel:
    """Logits that depend on the token and on its position in the input."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.calls: list[tuple[int, ...]] = []

    def __call__(self, tokens):
        self.calls.append(tuple(tokens.shape))
        positions = torch.arange(tokens.shape[1], dtype=torch.float64)
        logits = torch.zeros(*tokens.shape, self.vocab_size, dtype=torch.float64)
        logits.scatter_(-1, tokens[..., None], 1.0)  # favours repeating the token
        logits[..., 0] += 0.1 * positions  # and id 0 more and more along the input
        return logits


def test_nonoverlapping_losses_match_a_slow_loop():
    torch.manual_seed(0)
    windows = torch.randint(5, (3, 13))  # 12 targets per window
    model = _FakeModel(5)
    for chunk in (12, 6, 4, 3, 1):
        fast = nonoverlapping_losses(model, windows, chunk, batch_size=2)
        assert fast.shape == (3, 12)
        slow = torch.empty(3, 12, dtype=torch.float64)
        for w in range(3):
            for start in range(0, 12, chunk):
                piece = windows[w, start : start + chunk + 1]
                logits = model(piece[None, :-1])[0]
                for j in range(chunk):
                    target = int(piece[j + 1])
                    slow[w, start + j] = -torch.log_softmax(logits[j], -1)[target]
        assert torch.allclose(fast, slow, rtol=0, atol=1e-12), chunk
    # the model sees pieces of `chunk` tokens, never the whole window
    model.calls.clear()
    nonoverlapping_losses(model, windows, 4, batch_size=8)
    assert model.calls == [(8, 4), (1, 4)]


def test_nonoverlapping_losses_reject_bad_input():
    model = _FakeModel(5)
    with pytest.raises(ValueError, match="chunk"):
        nonoverlapping_losses(model, torch.zeros(2, 13, dtype=torch.long), 5)
    with pytest.raises(ValueError, match="chunk"):
        nonoverlapping_losses(model, torch.zeros(2, 13, dtype=torch.long), 0)
    with pytest.raises(ValueError, match="windows"):
        nonoverlapping_losses(model, torch.zeros(13, dtype=torch.long), 4)


def test_position_losses_match_a_hand_worked_example():
    # A "model" that always puts probability 1/4 on id 0 and 3/4 on id 1.
    def model(tokens):
        logits = torch.tensor([0.0, math.log(3.0)])
        return logits.expand(*tokens.shape, 2)

    windows = torch.tensor([[0, 1, 0, 1], [1, 1, 1, 0]])
    losses = position_losses(model, windows)
    assert losses.shape == (2, 3)
    assert losses.dtype == torch.float64
    four, four_thirds = math.log(4.0), math.log(4.0 / 3.0)
    expected = torch.tensor([[four_thirds, four, four_thirds], [four_thirds, four_thirds, four]])
    assert torch.allclose(losses, expected.double(), rtol=0, atol=1e-6)


def test_position_losses_do_not_depend_on_the_batch_size(splits):
    torch.manual_seed(0)
    model = TinyDecoder("alibi", vocab_size=splits.vocab_size, max_len=16, dim=16, num_heads=2)
    windows = held_out_windows(splits.test, 16, 5)
    one_by_one = position_losses(model.eval(), windows, batch_size=1)
    assert torch.allclose(position_losses(model, windows, batch_size=2), one_by_one, atol=1e-6)
    with pytest.raises(ValueError, match="batch_size"):
        position_losses(model, windows, batch_size=0)


def test_position_losses_reject_bad_windows():
    with pytest.raises(ValueError, match="windows"):
        position_losses(lambda t: t, torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="windows"):
        position_losses(lambda t: t, torch.zeros(3, 1, dtype=torch.long))


def test_drawn_windows_are_disjoint_slots_and_differ_by_seed(splits):
    ids = torch.arange(100)
    first = held_out_windows(ids, 9, 4, generator=torch.Generator().manual_seed(0))
    # slots of 10 ids: each window is one whole slot, slots distinct, in text order
    assert first.shape == (4, 10)
    assert all(int(row[0]) % 10 == 0 for row in first)
    assert torch.equal(first, first[:, :1] + torch.arange(10))
    starts = first[:, 0].tolist()
    assert starts == sorted(set(starts))
    again = held_out_windows(ids, 9, 4, generator=torch.Generator().manual_seed(0))
    other = held_out_windows(ids, 9, 4, generator=torch.Generator().manual_seed(1))
    assert torch.equal(first, again)
    assert not torch.equal(first, other)
    with pytest.raises(ValueError, match="disjoint"):
        held_out_windows(ids, 9, 11, generator=torch.Generator())


def test_a_tiny_run_learns(splits):
    model, losses = train_language_model("rope", TINY, 0, splits)
    windows = held_out_windows(splits.test, 16, 16)
    held_out = float(position_losses(model, windows).mean())
    # uniform guessing costs log(65) = 4.17 nats; the first steps are near it
    assert losses[0] > 3.9
    assert held_out < 3.4
    assert sum(losses[-10:]) / 10 < 3.4


def test_training_is_deterministic_under_a_seed(splits):
    first, losses_first = train_language_model("alibi", TINY, 3, splits)
    second, losses_second = train_language_model("alibi", TINY, 3, splits)
    other, _ = train_language_model("alibi", TINY, 4, splits)
    assert losses_first == losses_second
    for name, value in first.state_dict().items():
        assert torch.equal(value, second.state_dict()[name]), name
    assert not torch.equal(first.embedding.weight, other.embedding.weight)


def test_training_rejects_bad_input(splits):
    with pytest.raises(ValueError, match="scheme"):
        train_language_model("none", TINY, 0, splits)
    with pytest.raises(TypeError):
        train_language_model("rope", {"steps": 1}, 0, splits)
    with pytest.raises(TypeError):
        train_language_model("rope", TINY, 0, splits.train)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"tail": 17}, ValueError),
        ({"eval_factors": ()}, ValueError),
        ({"eval_factors": (1, 0)}, ValueError),
        ({"lr": -1.0}, ValueError),
        ({"steps": 1.5}, TypeError),
        ({"eval_factors": (1, 3, 4)}, ValueError),
        ({"held_out_fraction": 1.5}, ValueError),
    ],
)
def test_config_rejects_bad_values(kwargs, error):
    with pytest.raises(error):
        TextConfig(train_length=16, **kwargs)


def test_run_text_experiment_shapes_and_the_learned_table(splits):
    config = TextConfig(**{**TINY.__dict__, "steps": 2})
    result = run_text_experiment(config, seeds=(0, 1), splits=splits)
    assert result.names == list(TEXT_VARIANTS)
    assert TEXT_VARIANTS[len(TEXT_SCHEMES) :] == (
        "rope+linear",
        "rope+ntk",
        "rope+yarn",
        "rope+yarn_paper",
        "rope+yarn_frequencies",
        "rope+yarn_temperature",
    )
    for name in result.names:
        for length in (16, 32):
            if name == "learned" and length == 32:
                assert result.losses[name][length] is None
                assert result.perplexity(name, length) is None
                continue
            per_seed = result.losses[name][length]
            # every length scores the same 32 targets of each of the 4 segments
            assert [x.shape for x in per_seed] == [(4, 32)] * 2
            assert result.window_losses(name, length).shape == (2, 4)
            assert len(result.perplexity(name, length, part="all")) == 2
            assert result.per_position(name, length).shape == (length,)
    # at the training length every reading has factor 1: plain RoPE, the same numbers
    # (the paper's YaRN ramp builds its own tables: equal up to float32 rounding)
    for kind in ("linear", "ntk", "yarn", "yarn_paper", "yarn_frequencies", "yarn_temperature"):
        for a, b in zip(result.losses[f"rope+{kind}"][16], result.losses["rope"][16], strict=True):
            assert torch.allclose(a, b, rtol=0, atol=1e-5)
            assert kind in ("yarn_paper", "yarn_frequencies", "yarn_temperature") or torch.equal(
                a, b
            )
    # each seed reads its own segments: the same model scores other text under seed 1
    assert result.models["rope"][0] is not result.models["rope"][1]
    # the tail of a segment is its last `tail` targets; "all" is every target
    losses = result.losses["rope"][16][0]
    assert torch.equal(result.window_losses("rope", 16)[0], losses[:, -4:].mean(1))
    assert torch.equal(result.window_losses("rope", 16, part="all")[0], losses.mean(1))
    # read in pieces of 16, the second piece starts afresh: position 0 again
    per_position = result.per_position("rope", 16)
    stacked = torch.stack(result.losses["rope"][16])
    assert torch.allclose(per_position[0], stacked[:, :, [0, 16]].mean())
    with pytest.raises(ValueError, match="part"):
        result.window_losses("rope", 32, part="middle")


def test_workers_and_windows(splits):
    config = TextConfig(**{**TINY.__dict__, "steps": 3})
    sweep = {
        "seeds": (0, 1),
        "schemes": ("alibi", "rope"),
        "rope_readings": ("yarn",),
        "window": 8,
        "window_schemes": ("rope",),
        "splits": splits,
    }
    here = run_text_experiment(config, **sweep)
    assert here.names == ["alibi", "rope", "rope+yarn", "rope+window"]
    spread = run_text_experiment(config, **sweep, workers=2)
    for name in here.names:  # two processes, each with one thread: the same numbers
        for length in (16, 32):
            for a, b in zip(here.losses[name][length], spread.losses[name][length], strict=True):
                assert torch.equal(a, b), name
    # the window of 8 hides keys at the training length too: it changes the losses
    windowed, plain = here.losses["rope+window"][16][0], here.losses["rope"][16][0]
    assert torch.equal(windowed[:, :8], plain[:, :8])  # the first 8 targets see < 8 keys
    assert not torch.allclose(windowed[:, 8:], plain[:, 8:])
    with pytest.raises(ValueError, match="window_schemes"):
        run_text_experiment(
            config,
            seeds=(0,),
            schemes=("rope",),
            window=8,
            window_schemes=("alibi",),
            splits=splits,
        )


def test_run_text_experiment_rejects_bad_input(splits):
    with pytest.raises(ValueError, match="seeds"):
        run_text_experiment(TINY, seeds=(), splits=splits)
    with pytest.raises(ValueError, match="seeds"):
        run_text_experiment(TINY, seeds=(0, 0), splits=splits)
    with pytest.raises(ValueError, match="scheme"):
        run_text_experiment(TINY, seeds=(0,), schemes=("none",), splits=splits)
    with pytest.raises(ValueError, match="reading"):
        run_text_experiment(TINY, seeds=(0,), rope_readings=("dynamic",), splits=splits)


def _result_with(losses: dict[str, list[float]]) -> TextResult:
    """A TextResult whose readings have one constant loss per seed, at length 16."""
    result = TextResult(config=TINY, seeds=(0, 1), names=list(losses))
    for name, per_seed in losses.items():
        result.losses[name] = {16: [torch.full((4, 32), v, dtype=torch.float64) for v in per_seed]}
    result.losses["undefined"] = {16: None}
    return result


def test_compare_a_hand_worked_example():
    result = _result_with({"a": [0.2, 0.4], "b": [0.0, 0.0], "c": [-0.1, 0.3]})
    worse = result.compare(("a", 16), ("b", 16))
    assert worse.per_seed == pytest.approx((0.2, 0.4))
    # two seeds: mean 0.3, s = 0.1414, s / sqrt(2) = 0.1, t(0.975, 1) = 12.706 (tables):
    # 0.3 +- 1.2706
    assert (worse.seeds.low, worse.seeds.high) == pytest.approx((0.3 - 1.27062, 0.3 + 1.27062))
    assert worse.ratio == pytest.approx(math.exp(0.3))
    assert (worse.low, worse.high) == pytest.approx(
        (math.exp(0.3 - 1.27062), math.exp(0.3 + 1.27062))
    )
    assert not worse.greater  # two seeds that agree in sign: no direction at 95 %
    assert str(worse) == "ratio 1.350 [0.379, 4.810], 2 of 2 seeds above 1"
    with pytest.raises(ValueError, match="undefined"):
        result.compare(("undefined", 16), ("b", 16))


def test_compare_supports_a_direction_only_with_enough_agreement():
    steady = [0.10, 0.12, 0.11, 0.09, 0.13]  # mean 0.11, s = 0.0158
    result = _result_with({"a": steady, "b": [0.0] * 5, "c": [0.1, -0.1, 0.2, -0.2, 0.05]})
    result.seeds = (0, 1, 2, 3, 4)
    up = result.compare(("a", 16), ("b", 16))
    assert up.greater
    assert not up.smaller
    assert result.compare(("b", 16), ("a", 16)).smaller
    # half-width t(0.975, 4) s / sqrt(5) = 2.7764 * 0.015811 / 2.2361 = 0.019632
    assert up.seeds.high - up.seeds.mean == pytest.approx(0.019632, abs=1e-6)
    mixed = result.compare(("c", 16), ("b", 16))
    assert not mixed.greater
    assert not mixed.smaller
    assert (mixed.seeds.positive, mixed.seeds.negative) == (3, 2)


def test_window_losses_of_a_slice_of_targets():
    result = _result_with({"a": [0.0, 0.0]})
    for per_seed in result.losses["a"][16]:
        per_seed[:, 8:10] = 1.0  # targets 8 and 9 of every segment
    assert torch.equal(result.window_losses("a", 16, part=slice(8, 10)), torch.ones(2, 4).double())
    assert torch.equal(result.window_losses("a", 16, part=slice(0, 8)), torch.zeros(2, 4).double())
    assert result.window_losses("a", 16, part="all")[0, 0] == pytest.approx(2 / 32)
    with pytest.raises(ValueError, match="part"):
        result.window_losses("a", 16, part=slice(0, 8, 2))
    with pytest.raises(ValueError, match="no target"):
        result.window_losses("a", 16, part=slice(40, 50))


def test_excess_by_position_of_a_hand_worked_example():
    # target t of a segment: loss (t mod 16) / 100 when read in pieces of L = 16 (it sits
    # at position t mod 16 of its piece), t / 10 when the segment (32) is read whole
    result = TextResult(config=TINY, seeds=(0, 1), names=["a"])
    targets = torch.arange(32, dtype=torch.float64)
    result.losses["a"] = {
        16: [(targets % 16 / 100).expand(4, 32).clone()] * 2,
        32: [(targets / 10).expand(4, 32).clone()] * 2,
    }
    expected = [t / 10 - (t % 16) / 100 for t in range(32)]  # the same target, paired
    assert torch.allclose(result.excess_by_position("a", 32), torch.tensor(expected).double())
    assert torch.equal(result.excess_by_position("a", 16), torch.zeros(16).double())


def test_excess_below_the_training_length_is_zero_for_a_causal_model(splits):
    config = TextConfig(**{**TINY.__dict__, "steps": 5})
    result = run_text_experiment(config, seeds=(0, 1), rope_readings=("linear",), splits=splits)
    for name in ("sinusoidal", "t5", "alibi", "rope"):
        excess = result.excess_by_position(name, 32)
        # the first 16 positions see the same input either way (up to float32 rounding)
        assert excess[:16].abs().max() < 1e-5, name
        assert excess[16:].abs().max() > 1e-4, name
    # linear interpolation at factor 2 changes the positions below L too
    assert result.excess_by_position("rope+linear", 32)[:16].abs().max() > 1e-4
    assert result.excess_by_position("learned", 32) is None


def test_longer_readings_read_new_segments_at_both_lengths(splits):
    """Against nonoverlapping_losses of the model on the segments the docstring names."""
    config = TextConfig(**{**TINY.__dict__, "steps": 2})
    result = run_text_experiment(
        config, seeds=(0, 1), schemes=("learned", "alibi", "rope"), splits=splits
    )
    longer = longer_readings(result, 4, splits, rope_readings=("yarn",), eval_seed=7)
    assert longer.config.eval_lengths == (16, 64)
    assert longer.names == ["learned", "alibi", "rope", "rope+yarn"]
    assert longer.losses["learned"][64] is None  # no table rows past L
    for seed_index, seed in enumerate((0, 1)):
        generator = torch.Generator().manual_seed(7 + 4 * 1000 + seed)
        segments = held_out_windows(splits.test, 64, 4, generator=generator)
        model = result.models["alibi"][seed_index]
        for length in (16, 64):
            expected = nonoverlapping_losses(model, segments, length)
            assert torch.equal(longer.losses["alibi"][length][seed_index], expected)
    # new segments: not the ones the run read at L
    assert not torch.equal(longer.losses["rope"][16][0][:, :32], result.losses["rope"][16][0])
    assert longer.compare(("alibi", 64), ("alibi", 16)).seeds.count == 2
    with pytest.raises(ValueError, match="factor"):
        longer_readings(result, 1, splits)
    with pytest.raises(ValueError, match="rope reading"):
        longer_readings(result, 2, splits, rope_readings=("bogus",))
    with pytest.raises(TypeError, match="TextResult"):
        longer_readings({}, 2, splits)
