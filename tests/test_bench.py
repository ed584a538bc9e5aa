"""pecode.bench: the harness measures what it says (interleaved rounds, per-round ratios,
every RoPE method checked against the rotation). No test asserts a time.

The timing core is tested with fake callables and a fake clock (the order of the
samples, the per-round ratios); the RoPE cases run on tiny sizes and check that every
method returns finite positive times and the right rotation, that forward + backward
really produces the gradient (the rotation back, against the float64 loop of
``pecode.reference``), that missing peers are skipped, and that the command line runs.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import types

import pytest
import torch
from torch._inductor.exc import CppCompileError

from pecode import bench, flex, rope_compiled
from pecode.bench import attention_cases, cli, harness, peak_tensor_memory, records, rope_cases
from pecode.bench.attention_cases import _compare
from pecode.bench.rope_cases import _max_errors
from pecode.reference.rope import rope_loop
from pecode.rope import apply_rope, rope_cos_sin, rope_inv_freq


def test_bench_shaw_gather_form_needs_less_memory():
    shaw = bench.bench_shaw(64, heads=2, head_dim=16, max_distance=4, rounds=2, target_s=1e-3)
    assert list(shaw.samples) == ["direct", "gather"]
    assert shaw.baseline == "direct"
    # the direct form holds an [L, L, Dh] float32 tensor: 64 * 64 * 16 * 4 bytes
    assert shaw.peaks["direct"] >= 64 * 64 * 16 * 4
    assert shaw.peaks["gather"] < shaw.peaks["direct"] / 2
    assert shaw.max_error < 1e-4
    assert shaw.ratio("direct").median == 1.0
    assert all(len(times) == 2 and min(times) > 0 for times in shaw.samples.values())
    assert [line.split()[0] for line in shaw.lines()] == ["direct", "gather"]
    with pytest.raises(ValueError, match="max_distance"):
        bench.bench_shaw(8, max_distance=-1)


def test_bench_bias_attention_same_numbers_less_memory():
    compared = bench.bench_bias_attention(64, heads=2, head_dim=8, rounds=2, target_s=1e-3)
    assert list(compared) == ["alibi", "t5"]
    for result in compared.values():
        assert list(result.samples) == ["by hand", "sdpa"]
        assert result.max_error < 1e-4
        # by hand holds the [1, H, L, L] logits (and probabilities)
        assert result.peaks["by hand"] >= 2 * 2 * 64 * 64 * 4
    with pytest.raises(ValueError, match="heads"):
        bench.bench_bias_attention(8, heads=0)


def test_comparison_error_compares_every_method_with_the_first():
    # a method that returns another result is seen: the comparison can fail
    wrong = _compare(
        "two",
        {"one": lambda: torch.ones(3), "two": lambda: torch.full((3,), 2.0)},
        "one",
        device=torch.device("cpu"),
        rounds=1,
        target_s=1e-4,
        num_threads=1,
    )
    assert wrong.max_error == 1.0


def test_softmax_attention_matches_a_loop():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 3, 4, dtype=torch.float64, generator=g) for _ in range(3))
    bias = torch.randn(2, 3, 3, dtype=torch.float64, generator=g)
    got = bench.softmax_attention(q, k, v, bias, 0.5)
    for h in range(2):
        for i in range(3):
            logits = [0.5 * float(q[0, h, i] @ k[0, h, j]) + float(bias[h, i, j]) for j in range(3)]
            weights = [math.exp(x - max(logits)) for x in logits]
            want = sum(w * v[0, h, j] for j, w in enumerate(weights)) / sum(weights)
            assert torch.allclose(got[0, h, i], want, atol=1e-12)


def test_encoding_costs_count_parameters_of_each_papers_parameterisation():
    # counts derived from each paper's definitions applied to this layer (no paper
    # prints a count for it); every encoding of the table is covered
    length, dim, heads, k = 32, 16, 2, 4
    rows = bench.encoding_costs(
        [length], dim=dim, heads=heads, max_distance=k, rounds=2, target_s=1e-3
    )
    params = {r["encoding"]: r["parameters"] for r in rows}
    head_dim = dim // heads
    expected = {
        "none": 0,
        "sinusoidal": 0,
        "alibi": 0,
        "rope": 0,
        "learned": length * dim,  # one vector per position
        "shaw": 2 * (2 * k + 1) * head_dim,  # key and value tables (Shaw et al.)
        "t5": 32 * heads,  # 32 buckets, one scalar per head
        "transformer-xl": dim * dim + 2 * dim,  # W_{k,R}, u and v
        "deberta": 2 * k * dim + 2 * dim * dim,  # P (2k rows), W_{q,r} and W_{k,r}
    }
    assert params == expected
    assert {r["length"] for r in rows} == {length}
    assert next(r for r in rows if r["encoding"] == "none")["extra_bytes"] == 0
    assert all(r["time_ratio"].median > 0 for r in rows)


def test_peak_memory_of_a_clone_is_its_size():
    x = torch.randn(10, 10)
    assert peak_tensor_memory(lambda: x.clone()) == 400


# -- the timing core ----------------------------------------------------------------------


class FakeClock:
    """A clock that only moves when a fake method says how long it took."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def fake_methods(clock, durations, log):
    """Callables that log their name and advance ``clock`` by their next duration."""
    counters = dict.fromkeys(durations, 0)

    def make(name):
        def call():
            log.append(name)
            clock.now += durations[name][min(counters[name], len(durations[name]) - 1)]
            counters[name] += 1

        return call

    return {name: make(name) for name in durations}, counters


def test_time_interleaved_takes_one_sample_of_each_method_per_round():
    log = []
    methods = {name: (lambda name=name: log.append(name)) for name in "abc"}
    bench.time_interleaved(methods, rounds=4, number=1, warmup=1, clock=FakeClock())
    # the warm-up calls each method once, then round r samples a, b, c before round r + 1
    assert log == list("abc") + list("abc") * 4
    log.clear()
    bench.time_interleaved(methods, rounds=3, number={"a": 2, "b": 1, "c": 3}, warmup=0)
    assert log == list("aabccc") * 3


def test_time_interleaved_shuffles_each_round_when_asked():
    log = []
    methods = {name: (lambda name=name: log.append(name)) for name in "abcde"}
    bench.time_interleaved(methods, rounds=8, number=1, warmup=0, shuffle=True, seed=1)
    rounds = [log[i : i + 5] for i in range(0, 40, 5)]
    assert all(sorted(r) == list("abcde") for r in rounds)  # each round: every method once
    assert len({tuple(r) for r in rounds}) > 1  # and not always in the same order
    again = []
    methods = {name: (lambda name=name: again.append(name)) for name in "abcde"}
    bench.time_interleaved(methods, rounds=8, number=1, warmup=0, shuffle=True, seed=1)
    assert again == log  # seeded


def test_samples_and_ratios_are_per_round_with_a_fake_clock():
    clock, log = FakeClock(), []
    # round 3 is slow for everyone (a noisy neighbour): per-round ratios do not see it
    durations = {
        "copy_": [1.0, 2.0, 3.0, 4.0, 5.0],
        "clone": [2.0, 4.0, 6.0, 8.0, 10.0],
        "method": [3.0, 4.0, 6.0, 8.0, 5.0],
    }
    methods, _ = fake_methods(clock, durations, log)
    samples = bench.time_interleaved(methods, rounds=5, number=1, warmup=0, clock=clock)
    assert samples == {name: tuple(d) for name, d in durations.items()}
    ratio = bench.ratio_spread(samples, "method", "copy_")
    # quotients per round: 3, 2, 2, 2, 1 -> median 2, quartiles 2 and 2
    assert (ratio.median, ratio.q1, ratio.q3, ratio.min, ratio.max) == (2.0, 2.0, 2.0, 1.0, 3.0)
    # the quotient of the medians would be 5 / 3: not what is reported
    assert not math.isclose(ratio.median, 5.0 / 3.0)
    assert bench.ratio_spread(samples, "clone", "copy_") == bench.Spread(2.0, 2.0, 2.0, 2.0, 2.0)


def test_a_sample_is_the_mean_of_number_calls():
    clock, log = FakeClock(), []
    methods, _ = fake_methods(clock, {"m": [1.0, 3.0]}, log)  # 1 s, then 3 s per call
    samples = bench.time_interleaved(methods, rounds=2, number=2, warmup=0, clock=clock)
    assert samples == {"m": (2.0, 3.0)}  # (1 + 3) / 2, then (3 + 3) / 2


def test_calibration_makes_a_sample_last_about_target_s():
    clock, log = FakeClock(), []
    methods, _ = fake_methods(clock, {"m": [1e-3]}, log)
    bench.time_interleaved(methods, rounds=2, target_s=0.05, warmup=0, clock=clock)
    # calibration: 1, then 10 calls (10 ms >= 5 ms); then 2 rounds of 50 calls each
    assert len(log) == 1 + 10 + 2 * 50


def test_time_first_call_times_one_call_alone():
    clock, log = FakeClock(), []
    methods, _ = fake_methods(clock, {"m": [5.0, 1.0]}, log)  # slow first call, then fast
    assert bench.time_first_call(methods["m"], clock=clock) == 5.0
    assert log == ["m"]
    assert bench.time_first_call(lambda: torch.ones(4).sum()) > 0
    with pytest.raises(TypeError, match="fn"):
        bench.time_first_call(3)


def test_time_interleaved_real_clock_and_threads():
    before = torch.get_num_threads()
    samples = bench.time_interleaved(
        {"sum": lambda: torch.ones(8).sum(), "noop": lambda: None},
        rounds=2,
        target_s=1e-3,
        num_threads=1,
    )
    assert torch.get_num_threads() == before  # restored
    assert all(len(v) == 2 and all(t > 0 and math.isfinite(t) for t in v) for v in samples.values())


def test_time_interleaved_checks_its_arguments():
    fine = {"a": lambda: None}
    with pytest.raises(ValueError, match="methods"):
        bench.time_interleaved({})
    with pytest.raises(TypeError, match="methods"):
        bench.time_interleaved({"a": 3})
    for bad in ({"rounds": 0}, {"warmup": -1}, {"number": 0}, {"num_threads": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            bench.time_interleaved(fine, **bad)
    with pytest.raises(ValueError, match="target_s"):
        bench.time_interleaved(fine, target_s=0)
    with pytest.raises(ValueError, match="number"):
        bench.time_interleaved(fine, number={"b": 1})
    with pytest.raises(ValueError, match="device"):
        bench.time_interleaved(fine, device="meta")


def test_spread_quartiles_interpolate_linearly():
    spread = bench.Spread.of([5.0, 1.0, 4.0, 2.0, 3.0])
    assert spread == bench.Spread(median=3.0, q1=2.0, q3=4.0, min=1.0, max=5.0)
    # four values: quartiles at positions 0.75 and 2.25 of the sorted list (numpy's default)
    assert bench.Spread.of([1.0, 2.0, 4.0, 8.0]) == bench.Spread(3.0, 1.75, 5.0, 1.0, 8.0)
    assert bench.Spread.of([7.0]) == bench.Spread(7.0, 7.0, 7.0, 7.0, 7.0)
    assert str(bench.Spread(4.127, 4.02, 4.25, 4.0, 4.3)) == "4.13 [4.02, 4.25]"
    with pytest.raises(ValueError, match="empty"):
        bench.Spread.of([])
    with pytest.raises(ValueError, match="NaN"):
        bench.Spread.of([1.0, math.nan])


def test_ratio_spread_checks_its_arguments():
    with pytest.raises(ValueError, match="'b'"):
        bench.ratio_spread({"a": [1.0]}, "a", "b")
    with pytest.raises(ValueError, match="same rounds"):
        bench.ratio_spread({"a": [1.0], "b": [1.0, 2.0]}, "a", "b")
    with pytest.raises(ValueError, match="positive"):
        bench.ratio_spread({"a": [1.0], "b": [0.0]}, "a", "b")


# -- the RoPE cases ------------------------------------------------------------------------

TINY = (1, 2, 5, 8)


def test_every_rope_method_runs_and_returns_finite_positive_numbers():
    case = bench.bench_rope_case(TINY, rounds=2, target_s=1e-3, position=3)
    names = list(case.samples)
    assert names[:2] == ["copy_", "clone"]
    for expected in (
        "apply_rope half",
        "apply_rope interleaved",
        "rotate_half textbook",
        "complex textbook",
        "hf apply_rotary_pos_emb",  # transformers is installed with the book
        "identity fwd+bwd",
        "apply_rope half fwd+bwd",
        "apply_rope interleaved fwd+bwd",
        "hf apply_rotary_pos_emb fwd+bwd",
    ):
        assert expected in names
    # forward methods first, then forward + backward
    modes = [case.modes[n] for n in names]
    assert modes == sorted(modes, key=lambda m: m == "forward+backward")
    for row in case.rows():
        assert row.time.min > 0
        assert math.isfinite(row.time.max)
        assert row.vs_copy.median > 0
        assert math.isfinite(row.vs_copy.max)
        if row.kind != "yardstick":  # the rotation (and gradient) against float64
            assert row.max_error < 1e-5, row.method
    assert case.ratio("copy_") == bench.Spread(1.0, 1.0, 1.0, 1.0, 1.0)
    assert case.best_peer("forward") == "hf apply_rotary_pos_emb"
    assert case.best_peer("forward+backward") == "hf apply_rotary_pos_emb fwd+bwd"
    record = json.loads(json.dumps(case.as_dict()))  # JSON-ready
    assert [r["method"] for r in record["rows"]] == names
    assert all(len(r["seconds"]) == 2 for r in record["rows"])
    text = bench.format_cases([case])
    assert "q,k [1, 2, 5, 8] float32, 0.3125 KiB each, position 3" in text
    assert sum(line.startswith(tuple(names)) for line in text.splitlines()) == len(names)


def test_cases_table_has_a_row_per_method_with_ratios_computed_round_by_round():
    # hand-made samples: apply_rope takes 1.5 copies and half the peer's time every round
    samples = {
        "copy_": (1.0, 2.0, 4.0),
        "clone": (1.0, 2.0, 4.0),
        "apply_rope half": (1.5, 3.0, 6.0),
        "hf": (3.0, 6.0, 12.0),
    }
    case = bench.Case(
        "tiny",
        (1, 2, 64, 8),
        "float32",
        "cpu",
        7,
        1,
        3,
        samples,
        dict.fromkeys(samples, "forward"),
        {"copy_": "yardstick", "clone": "yardstick", "apply_rope half": "pecode", "hf": "peer"},
        {"copy_": math.nan, "clone": math.nan, "apply_rope half": 2.5e-7, "hf": 1e-6},
    )
    table = bench.cases_table([case, case])
    assert table.header[:2] == ["case", "method"]
    assert len(table.rows) == 2 * len(samples)
    row = dict(zip(table.header, table.rows[2], strict=True))
    assert row["case"] == "L = 64, float32, at 7"
    assert (row["method"], row["mode"]) == ("apply_rope half", "fwd")
    assert row["× copy_"] == "1.50 [1.50, 1.50]"
    assert row["× fastest peer"] == "0.50 [0.50, 0.50] (hf)"
    assert row["max |err|"] == "2.5e-07"
    assert dict(zip(table.header, table.rows[0], strict=True))["max |err|"] == ""


def test_bf16_and_decode_cases_run():
    case = bench.bench_rope_decode(
        heads=2, head_dim=8, dtype=torch.bfloat16, rounds=1, target_s=1e-3, peers=False
    )
    assert (case.shape, case.position, case.dtype) == ((1, 2, 1, 8), 4096, "bfloat16")
    assert set(case.modes.values()) == {"forward"}  # decoding needs no gradient
    for name, error in case.max_errors.items():
        assert math.isnan(error) if case.kinds[name] == "yardstick" else error < 2e-2


def test_rope_methods_check_their_arguments():
    with pytest.raises(ValueError, match="shape"):
        bench.rope_methods((2, 5, 8))
    with pytest.raises(ValueError, match="shape"):
        bench.rope_methods((1, 2, 5, 7))
    with pytest.raises(ValueError, match="position"):
        bench.rope_methods(TINY, position=-1)
    with pytest.raises(ValueError, match="layouts"):
        bench.rope_methods(TINY, layouts=("neox",))
    with pytest.raises(TypeError, match="dtype"):
        bench.rope_methods(TINY, dtype=torch.int64)
    with pytest.raises(ValueError, match="lengths"):
        bench.bench_rope_sweep([])


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_forward_backward_computes_the_gradient(layout):
    setup = bench.rope_methods(TINY, position=7, peers=layout == "half", textbook=False)
    inputs = setup.inputs
    # the gradient of a rotation by θ is the rotation by -θ of the upstream gradient:
    # the float64 loop of pecode.reference at positions -m
    want_q = rope_loop(inputs.grad_q, -inputs.positions, layout=layout)
    want_k = rope_loop(inputs.grad_k, -inputs.positions, layout=layout)
    names = [f"apply_rope {layout} fwd+bwd"]
    if layout == "half":
        names.append("hf apply_rotary_pos_emb fwd+bwd")
    for name in names:
        for _ in range(2):  # twice: .grad is reset between calls, not accumulated
            rotated_q, _rotated_k = setup.methods[name].fn()
        assert rotated_q.requires_grad
        assert torch.allclose(inputs.q_leaf.grad.double(), want_q, atol=1e-6), name
        assert torch.allclose(inputs.k_leaf.grad.double(), want_k, atol=1e-6), name
    setup.methods["identity fwd+bwd"].fn()
    assert torch.equal(inputs.q_leaf.grad, inputs.grad_q)


def test_a_missing_gradient_is_an_infinite_error():
    setup = bench.rope_methods(TINY, peers=False, textbook=False, layouts=("half",))
    method = setup.methods["apply_rope half fwd+bwd"]
    broken = bench.RopeMethod(
        method.fn,
        method.mode,
        method.kind,
        method.layout,
        lambda: (*method.check()[:2], None, None),
    )
    setup.methods["apply_rope half fwd+bwd"] = broken
    assert _max_errors(setup)["apply_rope half fwd+bwd"] == math.inf


def test_peers_that_do_not_import_are_skipped_with_a_note(monkeypatch):
    for module in ("transformers.models.llama.modeling_llama", "torchtune.modules"):
        monkeypatch.setitem(sys.modules, module, None)  # import raises ImportError
    monkeypatch.setitem(sys.modules, "rotary_embedding_torch", None)
    setup = bench.rope_methods(TINY)
    assert not [n for n, m in setup.methods.items() if m.kind == "peer"]
    assert sum("not importable, skipped" in note for note in setup.notes) == 3
    case = bench.bench_rope_case(TINY, rounds=1, target_s=1e-3, layouts=("half",))
    assert case.best_peer("forward") is None
    assert "peer: none ran" in bench.format_cases([case])


def interleaved_rotation(x, positions):
    inv_freq = rope_inv_freq(x.shape[-1])
    cos, sin = rope_cos_sin(positions, inv_freq)
    return apply_rope(x, cos, sin, "interleaved")


class FakeTorchtuneRope(torch.nn.Module):
    """torchtune's interface: x [b, s, n_h, h_d], interleaved pairs, input_pos [b, s]."""

    def __init__(self, dim, max_seq_len=4096, base=10_000):
        super().__init__()
        self.max_seq_len = max_seq_len

    def forward(self, x, *, input_pos=None):
        positions = torch.arange(x.shape[1]) if input_pos is None else input_pos[0]
        assert int(positions.max()) < self.max_seq_len
        return interleaved_rotation(x.transpose(1, 2), positions).transpose(1, 2)


class FakeRotaryEmbeddingTorch(torch.nn.Module):
    """rotary-embedding-torch's interface: [..., L, Dh], interleaved pairs, an offset."""

    def __init__(self, dim):
        super().__init__()

    def rotate_queries_or_keys(self, t, seq_dim=None, offset=0):
        return interleaved_rotation(t, torch.arange(offset, offset + t.shape[-2]))


def test_peers_that_import_are_timed_in_their_own_layout(monkeypatch):
    monkeypatch.setitem(
        sys.modules,
        "torchtune.modules",
        types.SimpleNamespace(RotaryPositionalEmbeddings=FakeTorchtuneRope),
    )
    monkeypatch.setitem(
        sys.modules,
        "rotary_embedding_torch",
        types.SimpleNamespace(RotaryEmbedding=FakeRotaryEmbeddingTorch),
    )
    case = bench.bench_rope_case(TINY, rounds=1, target_s=1e-3, position=3, textbook=False)
    for name in ("torchtune", "rotary-embedding-torch"):
        for suffix in ("", " fwd+bwd"):
            assert case.kinds[name + suffix] == "peer"
            assert case.max_errors[name + suffix] < 1e-6  # wired in the right layout


def test_out_rows_appear_when_apply_rope_takes_out(monkeypatch):
    calls = []

    def apply_rope_with_out(x, cos, sin, layout="half", *, out=None):
        calls.append(out is not None)
        result = apply_rope(x, cos, sin, layout)
        return result if out is None else out.copy_(result)

    def apply_rope_without_out(x, cos, sin, layout="half"):
        return apply_rope(x, cos, sin, layout)

    monkeypatch.setattr(rope_cases, "apply_rope", apply_rope_without_out)
    setup = bench.rope_methods(TINY, peers=False, textbook=False)
    assert "apply_rope half out=" not in setup.methods
    assert "apply_rope takes no out= argument: no out= rows" in setup.notes
    monkeypatch.setattr(rope_cases, "apply_rope", apply_rope_with_out)
    case = bench.bench_rope_case(TINY, rounds=1, target_s=1e-3, peers=False, textbook=False)
    for layout in ("half", "interleaved"):
        assert case.max_errors[f"apply_rope {layout} out="] < 1e-6
    assert any(calls)
    assert not [note for note in case.notes if "out=" in note]  # no 'no out= rows' note


@pytest.mark.skipif(
    rope_compiled.compiler_missing() is not None, reason="needs a C++ compiler for torch.compile"
)
def test_compiled_rows_rotate_as_float64_does_and_their_build_is_noted(fresh_compiled_state):
    case = bench.bench_rope_case(TINY, rounds=1, target_s=1e-3, peers=False, textbook=False)
    for layout in ("half", "interleaved"):
        for suffix in (" compiled", " compiled out=", " compiled fwd+bwd"):
            assert case.max_errors[f"apply_rope {layout}{suffix}"] < 1e-6, (layout, suffix)
    assert any("compiled rows' first calls took" in note for note in case.notes)
    assert not [note for note in case.notes if "ran eagerly" in note]  # compiled, all of them
    eager = bench.rope_methods(TINY, peers=False, textbook=False, compiled=False)
    assert not [name for name in eager.methods if "compiled" in name]
    assert "CPU's" in rope_cases._compiled_unavailable(torch.device("cuda"))


@pytest.fixture
def fresh_compiled_state(monkeypatch):
    """pecode.rope_compiled as in a new process, with a compiler on the PATH."""
    monkeypatch.setattr(rope_compiled, "compiler_missing", lambda: None)
    for name, value in [("reason", None), ("probed", False), ("kernels", {}), ("graphs", {})]:
        monkeypatch.setattr(rope_compiled._State, name, value)
    monkeypatch.setattr(rope_compiled._State, "runs", {})


def test_a_failing_compiler_leaves_the_compiled_rows_out_with_a_note(
    monkeypatch, fresh_compiled_state
):
    def broken(*args):
        raise CppCompileError(["g++", "kernel.cpp"], "the C++ compiler crashed")

    monkeypatch.setattr(rope_compiled, "_build", lambda key: broken)
    case = bench.bench_rope_case(TINY, rounds=1, target_s=1e-3, peers=False, textbook=False)
    assert not [name for name in case.samples if "compiled" in name]
    assert case.max_errors["apply_rope half fwd+bwd"] < 1e-6  # the other rows still run
    (note,) = [note for note in case.notes if "compiled" in note]
    assert note.startswith("no compiled rows: torch.compile failed (CppCompileError")
    # a case after it knows before it starts
    again = bench.rope_methods(TINY, peers=False, textbook=False)
    assert not [name for name in again.methods if "compiled" in name]


def test_compiled_rows_that_ran_eagerly_are_noted(monkeypatch, fresh_compiled_state):
    # no variant may compile: every compiled row runs the kernel's formula eagerly
    monkeypatch.setattr(rope_compiled, "MAX_GRAPHS", 0)
    case = bench.bench_rope_case(
        TINY, rounds=1, target_s=1e-3, peers=False, textbook=False, layouts=("half",)
    )
    assert case.max_errors["apply_rope half compiled"] < 1e-6
    eager = [note for note in case.notes if "ran eagerly, not compiled" in note]
    assert len(eager) == 3  # compiled, compiled out=, compiled fwd+bwd
    assert "apply_rope half compiled fwd+bwd: 4 of its 4 kernel calls ran eagerly" in eager[-1]
    assert rope_compiled.compile_count() == 0
    assert rope_compiled.run_count() == 0


def test_every_public_name_is_defined_in_one_module_and_importable_from_the_package():
    modules = [harness, rope_cases, attention_cases, records, cli]
    defined = [name for module in modules for name in module.__all__]
    assert sorted(defined) == sorted(bench.__all__)  # each name once
    for module in modules:
        for name in module.__all__:
            assert getattr(bench, name) is getattr(module, name), name


def test_python_dash_m_runs_the_command_line():
    result = subprocess.run(
        [sys.executable, "-m", "pecode.bench", "--help"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert result.stdout.startswith("usage: python -m pecode.bench")
    assert "--attention" in result.stdout
    assert not result.stderr


def test_command_line_quick(tmp_path, capsys):
    path = tmp_path / "cases.json"
    argv = ["--quick", "--lengths", "4", "8", "--heads", "2", "--head-dim", "8"]
    argv += ["--rounds", "2", "--target-s", "0.001", "--no-peers", "--json", str(path)]
    cases = bench.main(argv)
    text = capsys.readouterr().out
    assert [c.shape for c in cases] == [(1, 2, 4, 8), (1, 2, 8, 8), (1, 2, 1, 8)]
    assert "apply_rope half fwd+bwd" in text
    assert "position 4096" in text
    assert [c["shape"] for c in json.loads(path.read_text())] == [
        [1, 2, 4, 8],
        [1, 2, 8, 8],
        [1, 2, 1, 8],
    ]


def test_case_record_round_trip_and_the_recorded_gpu_run():
    case = bench.bench_rope_case(
        (1, 2, 8, 8), rounds=2, target_s=1e-4, peers=False, layouts=("half",)
    )
    back = bench.Case.from_dict(json.loads(json.dumps(case.as_dict())))
    assert back.samples == case.samples
    assert back.label == case.label
    assert back.ratio("apply_rope half", "copy_") == case.ratio("apply_rope half", "copy_")
    with pytest.raises(ValueError, match="rows"):
        bench.Case.from_dict({"label": "x"})
    # the H100 run the book quotes: every method's rotation was checked on the GPU
    recorded = bench.recorded_cases("h100")
    assert {c.device for c in recorded} == {"cuda (NVIDIA H100 80GB HBM3)"}
    assert {c.dtype for c in recorded} == {"float32", "bfloat16"}
    for c in recorded:
        errors = [e for n, e in c.max_errors.items() if c.kinds[n] != "yardstick"]
        assert max(errors) < (1e-5 if c.dtype == "float32" else 0.05)
    with pytest.raises(ValueError, match="no recorded run"):
        bench.recorded_cases("a100")


def test_a_causal_prefill_needs_no_more_memory_than_transformers():
    # Issue 26: within 1.5x of transformers' SDPA path, with and without left padding.
    # Without padding, an L×L float32 mask (16 MiB at 2048 tokens) is most of
    # transformers' whole peak, so a layer that still built one would fail the bound
    # (pecode did: 8.9x at 8192 tokens; with padding 1.8x).
    pytest.importorskip("transformers")
    length = 2048
    for padding in (0, 16):
        peaks = attention_cases.prefill_memory(length, padding=padding)
        theirs, ours = peaks["transformers sdpa"], peaks["pecode"]
        assert ours <= 1.5 * theirs, (padding, peaks)
        if padding == 0:
            assert 4 * length**2 > 0.5 * theirs  # the neighbour: a float mask would break it
    with pytest.raises(ValueError, match="padding must be below"):
        attention_cases.prefill_memory(8, padding=8)


def test_flex_costs_dense_peak_holds_the_mask_and_flex_stays_below_it():
    """The dense path's peak against the float32 mask's own size (4·H·L² bytes); the
    FlexAttention path's against it; the two outputs against each other."""
    reason = flex.flex_unsupported(torch.zeros(1, 1, 1, 1), needs_grad=False)
    if reason is not None:
        pytest.skip(reason)
    rows = bench.flex_costs((512,), heads=2, head_dim=16, rounds=1)
    by_kernel = {row["kernel"]: row for row in rows}
    assert set(by_kernel) == {"dense mask", "FlexAttention"}
    dense, flexed = by_kernel["dense mask"], by_kernel["FlexAttention"]
    assert dense["mask_bytes"] == 4 * 2 * 512**2
    assert dense["peak_bytes"] >= dense["mask_bytes"]
    assert flexed["peak_bytes"] < dense["mask_bytes"] / 2
    assert dense["max_error"] < 1e-5
    with pytest.raises(ValueError, match="length"):
        bench.flex_costs((0,))
