"""The opt-in cache of training runs (CI's second notebook run reads the first run's models)."""

from __future__ import annotations

import logging

import pytest
import torch

from pecode.experiments import ExperimentConfig, run_experiment, train
from pecode.experiments import trained_cache as cache
from pecode.experiments.text import TextConfig

TINY = ExperimentConfig(
    train_length=16, eval_factors=(1, 2), dim=16, num_heads=2, num_layers=1, steps=3,
    eval_sequences=2,
)  # fmt: skip


class Counted:
    """A training function that counts its calls (the cache must skip it on a hit)."""

    def __init__(self) -> None:
        self.__name__ = self.__qualname__ = "counted"  # as a function has them
        self.calls = 0

    def __call__(self, *args):
        self.calls += 1
        return {"weights": torch.randn(3), "args": args}


def test_without_the_variable_every_call_trains_and_nothing_is_written(monkeypatch, tmp_path):
    monkeypatch.delenv(cache.CACHE_VARIABLE, raising=False)
    monkeypatch.chdir(tmp_path)
    function = Counted()
    cache.trained(function, 1, "rope")
    cache.trained(function, 1, "rope")
    assert function.calls == 2
    assert list(tmp_path.iterdir()) == []


def test_a_second_call_with_the_same_job_loads_the_first_result_bit_for_bit(monkeypatch, tmp_path):
    monkeypatch.setenv(cache.CACHE_VARIABLE, str(tmp_path))
    function = Counted()
    first = cache.trained(function, 1, "rope", TINY)
    second = cache.trained(function, 1, "rope", TINY)
    assert function.calls == 1
    assert torch.equal(first["weights"], second["weights"])
    assert len(list(tmp_path.glob("counted-*.pt"))) == 1


@pytest.mark.parametrize(
    "other",
    [
        (2, "rope", TINY),  # another seed
        (1, "t5", TINY),  # another scheme
        (1, "rope", ExperimentConfig(**{**TINY.__dict__, "steps": 4})),  # another budget
        (1, "rope", TINY, torch.tensor([1, 2, 4])),  # another corpus
    ],
)
def test_any_other_argument_trains_again(monkeypatch, tmp_path, other):
    monkeypatch.setenv(cache.CACHE_VARIABLE, str(tmp_path))
    function = Counted()
    cache.trained(function, 1, "rope", TINY, torch.tensor([1, 2, 3]))
    cache.trained(function, *other)
    assert function.calls == 2


def test_tensors_are_keyed_by_content_dtype_and_shape():
    keys = {
        cache.job_digest(train, value)
        for value in (
            torch.tensor([1, 2, 3]),
            torch.tensor([1, 2, 4]),
            torch.tensor([1.0, 2.0, 3.0]),
            torch.tensor([[1, 2, 3]]),
        )
    }
    assert len(keys) == 4
    assert cache.job_digest(train, torch.arange(4)) == cache.job_digest(train, torch.arange(4))


def test_a_change_to_pecode_source_or_torch_trains_again(monkeypatch, tmp_path):
    monkeypatch.setenv(cache.CACHE_VARIABLE, str(tmp_path))
    function = Counted()
    cache.trained(function, 1)
    monkeypatch.setattr(cache, "_source_digest", lambda: "edited")
    cache.trained(function, 1)
    monkeypatch.setattr(torch, "__version__", "0.0.0")
    cache.trained(function, 1)
    assert function.calls == 3


def test_an_unreadable_file_is_trained_again_and_said_on_the_logger(monkeypatch, tmp_path, caplog):
    monkeypatch.setenv(cache.CACHE_VARIABLE, str(tmp_path))
    function = Counted()
    cache.trained(function, 1)
    (stored,) = tmp_path.glob("counted-*.pt")
    stored.write_bytes(b"not a torch file")
    with caplog.at_level(logging.INFO, logger="pecode.experiments.trained_cache"):
        again = cache.trained(function, 1)
    assert function.calls == 2
    assert "unreadable cached training run" in caplog.text
    assert torch.equal(torch.load(stored, weights_only=False)["weights"], again["weights"])


def test_an_argument_it_cannot_key_is_refused():
    with pytest.raises(TypeError, match="cannot key a cached training run on a object"):
        cache.job_digest(train, object())


def test_a_sweep_read_from_the_cache_equals_the_sweep_that_trained(monkeypatch, tmp_path):
    """The whole point: chapter 13's result from cached models is the trained one's."""
    monkeypatch.setenv(cache.CACHE_VARIABLE, str(tmp_path))
    first = run_experiment(TINY, (0, 1), schemes=("rope",), rope_scalings=("yarn",))
    assert len(list(tmp_path.glob("train-*.pt"))) == 2
    calls = []
    monkeypatch.setattr(
        "pecode.experiments.fit", lambda *args, **kwargs: calls.append(1) or []
    )  # a training step would now be recorded
    second = run_experiment(TINY, (0, 1), schemes=("rope",), rope_scalings=("yarn",))
    assert calls == []
    assert second.train_losses == first.train_losses
    assert repr(second.scores) == repr(first.scores)  # repr: NaN where no needle, exact floats


def test_the_text_configuration_is_keyed_too():
    assert cache.job_digest(train, TextConfig()) != cache.job_digest(train, TextConfig(steps=599))
