"""The small training runs of chapter 12: data, model, training, evaluation, sweep."""

from __future__ import annotations

import pytest
import torch

from pecode.experiments import (
    IGNORE_INDEX,
    ROPE_SCALINGS,
    SCHEMES,
    ExperimentConfig,
    TinyDecoder,
    cpu_threads,
    delayed_copy_batch,
    evaluate,
    run_experiment,
    train,
    with_rope_scaling,
)

TINY = ExperimentConfig(
    train_length=8,
    eval_factors=(1, 2),
    offset=2,
    vocab_size=6,
    dim=16,
    num_heads=2,
    num_layers=1,
    steps=80,
    batch_size=16,
    lr=1e-2,
    eval_sequences=8,
)


def test_delayed_copy_targets_match_a_loop():
    tokens, targets = delayed_copy_batch(
        3, 10, offset=3, vocab_size=5, generator=torch.Generator().manual_seed(0)
    )
    assert tokens.shape == targets.shape == (3, 10)
    assert tokens.dtype == torch.int64
    assert int(tokens.min()) >= 0
    assert int(tokens.max()) < 5
    for b in range(3):
        for t in range(10):
            expected = tokens[b, t - 3] if t >= 3 else IGNORE_INDEX
            assert int(targets[b, t]) == int(expected)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"offset": 10}, ValueError),
        ({"offset": 0}, ValueError),
        ({"vocab_size": 1}, ValueError),
        ({"batch_size": 2.0}, TypeError),
        ({"generator": 0}, TypeError),
    ],
)
def test_delayed_copy_rejects_bad_input(kwargs, error):
    args = {"offset": 2, "vocab_size": 4, "generator": torch.Generator(), "batch_size": 2}
    args.update(kwargs)
    batch_size = args.pop("batch_size")
    with pytest.raises(error):
        delayed_copy_batch(batch_size, 10, **args)


@pytest.mark.parametrize("scheme", SCHEMES)
def test_model_shapes_and_causality(scheme):
    torch.manual_seed(0)
    model = TinyDecoder(scheme, vocab_size=7, max_len=12, dim=16, num_heads=2).eval()
    tokens = torch.randint(7, (2, 12))
    changed = tokens.clone()
    changed[:, 8:] = (changed[:, 8:] + 1) % 7  # change only the future of position 7
    with torch.no_grad():
        logits, logits_changed = model(tokens), model(changed)
    assert logits.shape == (2, 12, 7)
    assert torch.equal(logits[:, :8], logits_changed[:, :8])
    assert not torch.allclose(logits[:, 8:], logits_changed[:, 8:])


def test_learned_table_is_not_defined_past_max_len():
    model = TinyDecoder("learned", vocab_size=5, max_len=8, dim=16, num_heads=2)
    with pytest.raises(ValueError, match="max_len"):
        model(torch.zeros(1, 9, dtype=torch.long))


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (("alibi2",), ValueError),
        (("rope",), ValueError),  # dim 12 over 4 heads: odd head size
    ],
)
def test_model_rejects_bad_configuration(args, error):
    with pytest.raises(error):
        TinyDecoder(*args, vocab_size=5, max_len=8, dim=12, num_heads=4)


def test_model_rejects_bad_tokens():
    model = TinyDecoder("none", vocab_size=5, max_len=8, dim=16, num_heads=2)
    with pytest.raises(TypeError, match="tokens"):
        model(torch.zeros(1, 4))
    with pytest.raises(ValueError, match="tokens"):
        model(torch.full((1, 4), 5))
    with pytest.raises(ValueError, match="tokens"):
        model(torch.zeros(4, dtype=torch.long))


def test_a_tiny_run_learns():
    model, losses = train("rope", TINY, seed=0)
    first, last = sum(losses[:10]) / 10, sum(losses[-10:]) / 10
    assert last < 0.5 * first
    tokens, targets = delayed_copy_batch(
        32, 8, offset=2, vocab_size=6, generator=torch.Generator().manual_seed(1)
    )
    accuracy, loss = evaluate(model, tokens, targets)
    assert accuracy.shape == (8,)
    assert torch.isnan(accuracy[:2]).all()  # no targets before the offset
    assert float(accuracy[2:].mean()) > 1 / 6 + 0.3  # well above chance
    assert loss < first


def test_training_is_deterministic_under_a_seed():
    short = ExperimentConfig(**{**TINY.__dict__, "steps": 15})
    model_a, losses_a = train("t5", short, seed=3)
    model_b, losses_b = train("t5", short, seed=3)
    _, losses_c = train("t5", short, seed=4)
    assert losses_a == losses_b
    for (name, a), (_, b) in zip(
        model_a.state_dict().items(), model_b.state_dict().items(), strict=True
    ):
        assert torch.equal(a, b), name
    assert losses_a != losses_c


def test_rope_scaling_keeps_weights_and_is_identity_at_factor_one():
    torch.manual_seed(0)
    model = TinyDecoder("rope", vocab_size=5, max_len=8, dim=16, num_heads=2).eval()
    tokens = torch.randint(5, (2, 8))
    for kind in ROPE_SCALINGS:
        scaled = with_rope_scaling(model, kind, 1.0)
        state, scaled_state = model.state_dict(), scaled.state_dict()
        assert state.keys() == scaled_state.keys()
        assert all(torch.equal(state[k], scaled_state[k]) for k in state)
        with torch.no_grad():
            assert torch.allclose(scaled(tokens), model(tokens), atol=1e-5)
        with torch.no_grad():  # factor 4 changes the rotations, hence the logits
            assert not torch.allclose(
                with_rope_scaling(model, kind, 4.0)(tokens), model(tokens), atol=1e-3
            )


def test_rope_scaling_rejects_bad_input():
    rope = TinyDecoder("rope", vocab_size=5, max_len=8, dim=16, num_heads=2)
    alibi = TinyDecoder("alibi", vocab_size=5, max_len=8, dim=16, num_heads=2)
    with pytest.raises(ValueError, match="scheme"):
        with_rope_scaling(alibi, "linear", 2.0)
    with pytest.raises(ValueError, match="kind"):
        with_rope_scaling(rope, "llama4", 2.0)
    with pytest.raises(ValueError, match="factor"):
        with_rope_scaling(rope, "ntk", 0.5)
    with pytest.raises(TypeError, match="model"):
        with_rope_scaling(torch.nn.Linear(2, 2), "ntk", 2.0)


def test_config_rejects_bad_values():
    with pytest.raises(ValueError, match="offset"):
        ExperimentConfig(train_length=4, offset=4)
    with pytest.raises(ValueError, match="eval_factors"):
        ExperimentConfig(eval_factors=(1, 0))
    with pytest.raises(ValueError, match="lr"):
        ExperimentConfig(lr=-1.0)
    with pytest.raises(TypeError, match="steps"):
        ExperimentConfig(steps=1.5)


def test_run_experiment_marks_the_learned_table_undefined_past_its_length():
    config = ExperimentConfig(**{**TINY.__dict__, "steps": 2})
    calls = []
    result = run_experiment(
        config, seeds=(0, 1), schemes=("learned", "rope"), on_step=lambda: calls.append(1)
    )
    assert len(calls) == 2 * 2 * 2
    assert result.names == ["learned", "rope", "rope+linear", "rope+ntk", "rope+yarn"]
    assert result.accuracy["learned"][16] is None
    assert result.summary("learned", 16) is None
    assert result.per_position["learned"] is None
    assert len(result.accuracy["learned"][8]) == 2
    mean, spread = result.summary("rope", 16)
    assert 0.0 <= mean <= 1.0
    assert spread >= 0.0
    assert result.per_position["rope+yarn"].shape == (16,)
    # at the training length every scaling is plain RoPE (factor 1)
    for kind in ROPE_SCALINGS:
        assert result.accuracy[f"rope+{kind}"][8] == result.accuracy["rope"][8]
    with pytest.raises(ValueError, match="seeds"):
        run_experiment(config, seeds=(0, 0))
    with pytest.raises(ValueError, match="scheme"):
        run_experiment(config, seeds=(0,), schemes=("sine",))


def test_cpu_threads_restores_the_thread_count():
    before = torch.get_num_threads()
    with cpu_threads(1):
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(ValueError, match="num_threads"), cpu_threads(0):
        pass
