"""pecode.absolute against the float64 loop reference, plus properties and bad input."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from pecode.absolute import (
    LearnedPositionalEncoding,
    SinusoidalPositionalEncoding,
    sinusoidal_encoding,
    sinusoidal_frequencies,
    sinusoidal_table,
)
from pecode.attention import MultiHeadAttention
from pecode.reference.absolute import sinusoidal_rows_loop

even_dims = st.integers(1, 64).map(lambda half: 2 * half)


def reference(positions: list[int], dim: int, base: float = 10000.0) -> torch.Tensor:
    return torch.tensor(sinusoidal_rows_loop(positions, dim, base), dtype=torch.float64)


# --- the table against the reference ------------------------------------------------


@pytest.mark.parametrize("dim", [2, 4, 16, 512])
def test_table_matches_the_loop_reference(dim):
    table = sinusoidal_table(50, dim)
    assert table.dtype == torch.float32
    assert (table.double() - reference(list(range(50)), dim)).abs().max() < 1e-7


def test_accurate_up_to_a_million():
    positions = [0, 1, 4095, 65_537, 123_457, 999_983, 999_999, 1_000_000]
    ours = sinusoidal_encoding(torch.tensor(positions), 512)
    # float32 rounding of values in [-1, 1] is at most 2**-25 ≈ 3e-8
    assert (ours.double() - reference(positions, 512)).abs().max() < 6e-8
    ours64 = sinusoidal_encoding(torch.tensor(positions), 512, dtype=torch.float64)
    assert (ours64 - reference(positions, 512)).abs().max() < 1e-9


def test_a_float32_angle_is_not_accurate_at_a_million():
    # the reason the angles are formed in float64. The second pair at d = 512 (the first
    # has omega = 1, whose float32 angle is exact for every integer below 2**24): its
    # float32 angle, float32(pos) * float32(omega), is off by ~0.03 rad at a million,
    # while pecode's float64 angle gives the sine to float32 rounding.
    pos, dim = 1_000_000 - 1, 512
    omega = sinusoidal_frequencies(dim)[1].item()
    angle32 = torch.tensor(float(pos), dtype=torch.float32) * torch.tensor(
        omega, dtype=torch.float32
    )
    assert 0.01 < abs(float(angle32) - pos * omega) < 0.04  # ulp(1e6) / 2 = 0.03
    ours = sinusoidal_encoding(torch.tensor([pos]), dim)[0, 2].item()
    assert abs(ours - math.sin(pos * omega)) < 6e-8


def test_a_float32_frequency_costs_as_much_as_a_float32_angle():
    # chapter 2: rounding only the frequencies to float32 (angle and sine in float64) errs
    # about as much near 1e6 as rounding only the angle; each stays below its bound
    positions = list(range(1_000_000 - 32, 1_000_001))
    exact = reference(positions, 512)
    freqs = sinusoidal_frequencies(512)
    pos = torch.tensor(positions, dtype=torch.float64).unsqueeze(1)

    def error(angles: torch.Tensor) -> float:
        rows = torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1)
        return (rows - exact).abs().max().item()

    frequency_only = error(pos * freqs.float().double())
    angle_only = error((pos * freqs).float().double())
    assert frequency_only <= 1_000_000 * 2**-25 + 1e-9  # |fl32(ω) - ω| <= 2**-25 for ω < 1
    assert angle_only <= 2**-5 + 1e-9  # half the float32 spacing in [2**19, 2**20)
    assert min(frequency_only, angle_only) > 0.02
    assert 0.5 < frequency_only / angle_only < 2


def test_worked_example_by_hand():
    # d = 4: ω = (1, 1/100); row 1 is (sin 1, cos 1, sin 0.01, cos 0.01)
    table = sinusoidal_table(3, 4, dtype=torch.float64)
    assert table[0].tolist() == [0.0, 1.0, 0.0, 1.0]
    expected = [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)]
    assert table[1].tolist() == pytest.approx(expected, abs=1e-15)


def test_frequencies_and_wavelength_range():
    freqs = sinusoidal_frequencies(512)
    assert freqs.dtype == torch.float64
    assert freqs.shape == (256,)
    assert freqs[0].item() == 1.0
    wavelengths = 2 * math.pi / freqs
    assert wavelengths[-1].item() == pytest.approx(2 * math.pi * 10000 ** (510 / 512), rel=1e-12)
    assert wavelengths[-1].item() < 2 * math.pi * 10000
    assert bool((wavelengths[1:] > wavelengths[:-1]).all())


def test_base_changes_the_frequencies():
    assert sinusoidal_frequencies(4, base=100.0)[1].item() == pytest.approx(0.1, rel=1e-15)


@given(
    num_positions=st.integers(0, 40),
    dim=even_dims,
    dtype=st.sampled_from([torch.float16, torch.bfloat16, torch.float32, torch.float64]),
)
def test_table_shapes_dtypes_and_range(num_positions, dim, dtype):
    table = sinusoidal_table(num_positions, dim, dtype=dtype)
    assert table.shape == (num_positions, dim)
    assert table.dtype == dtype
    assert bool((table.abs() <= 1).all())
    # each (sin, cos) pair lies on the unit circle
    pairs = table.double().view(num_positions, dim // 2, 2)
    tolerance = {torch.float16: 2e-3, torch.bfloat16: 2e-2}.get(dtype, 1e-6)
    assert bool(((pairs.pow(2).sum(-1) - 1).abs() <= tolerance).all())


@given(positions=st.lists(st.integers(0, 10**7), min_size=1, max_size=5), dim=even_dims)
def test_encoding_of_any_positions_matches_reference(positions, dim):
    ours = sinusoidal_encoding(torch.tensor(positions), dim, dtype=torch.float64)
    assert ours.shape == (len(positions), dim)
    assert (ours - reference(positions, dim)).abs().max() < 1e-8


def test_encoding_keeps_leading_shape_and_device():
    positions = torch.arange(6).view(2, 3)
    out = sinusoidal_encoding(positions, 8)
    assert out.shape == (2, 3, 8)
    assert out.device == positions.device
    assert torch.equal(out[1, 0], sinusoidal_table(4, 8)[3])


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"num_positions": 4, "dim": 5}, ValueError, "dim must be even"),
        ({"num_positions": 4, "dim": 0}, ValueError, "dim"),
        ({"num_positions": 4, "dim": 4.0}, TypeError, "dim"),
        ({"num_positions": -1, "dim": 4}, ValueError, "num_positions"),
        ({"num_positions": 2.5, "dim": 4}, TypeError, "num_positions"),
        ({"num_positions": True, "dim": 4}, TypeError, "num_positions"),
        ({"num_positions": 4, "dim": 4, "base": 1.0}, ValueError, "base"),
        ({"num_positions": 4, "dim": 4, "base": float("inf")}, ValueError, "base"),
        ({"num_positions": 4, "dim": 4, "base": "10000"}, TypeError, "base"),
        ({"num_positions": 4, "dim": 4, "dtype": torch.int64}, TypeError, "dtype"),
    ],
)
def test_table_rejects_bad_arguments(kwargs, error, match):
    with pytest.raises(error, match=match):
        sinusoidal_table(**kwargs)


@pytest.mark.parametrize(
    ("positions", "error", "match"),
    [
        (torch.tensor([0.0, 1.0]), TypeError, "integer"),
        (torch.tensor([True]), TypeError, "integer"),
        (torch.tensor([0, -1]), ValueError, "non-negative"),
        ([0, 1], TypeError, "torch.Tensor"),
    ],
)
def test_encoding_rejects_bad_positions(positions, error, match):
    with pytest.raises(error, match=match):
        sinusoidal_encoding(positions, 4)


# --- the sinusoidal module ----------------------------------------------------------


def test_module_adds_the_table_and_grows():
    module = SinusoidalPositionalEncoding(8, max_len=4)
    x = torch.randn(2, 11, 8)
    out = module(x)
    assert module.table.shape[0] == 16  # grown to the next power of two
    assert torch.allclose(out - x, sinusoidal_table(11, 8).expand(2, 11, 8), atol=1e-6)
    assert "table" not in module.state_dict()  # a function of dim and base, not saved


def test_module_positions_and_input_scale():
    module = SinusoidalPositionalEncoding(8, input_scale=math.sqrt(8))
    x = torch.randn(2, 3, 8, dtype=torch.float64)
    positions = torch.tensor([[5, 6, 7], [100, 0, 3]])
    out = module(x, positions)
    assert out.dtype == torch.float64
    expected = x * math.sqrt(8) + sinusoidal_encoding(positions, 8, dtype=torch.float64)
    assert torch.allclose(out, expected, atol=1e-7)


@given(batch=st.integers(1, 3), seq=st.integers(1, 20), dim=even_dims)
def test_module_shapes(batch, seq, dim):
    module = SinusoidalPositionalEncoding(dim, max_len=8)
    out = module(torch.zeros(batch, seq, dim))
    assert out.shape == (batch, seq, dim)
    assert torch.equal(out[0], sinusoidal_table(seq, dim))


@pytest.mark.parametrize("module_cls", ["sinusoidal", "learned"])
@pytest.mark.parametrize(
    ("x", "positions", "error", "match"),
    [
        (torch.zeros(2, 3, 5), None, ValueError, r"\[batch, seq, 4\]"),
        (torch.zeros(3, 4), None, ValueError, r"\[batch, seq, 4\]"),
        (torch.zeros(2, 3, 4, dtype=torch.long), None, TypeError, "floating"),
        (torch.zeros(2, 3, 4), torch.tensor([0, 1]), ValueError, "positions must have shape"),
        (torch.zeros(2, 3, 4), torch.tensor([0.0, 1.0, 2.0]), TypeError, "integer"),
        (torch.zeros(2, 3, 4), torch.tensor([0, -1, 2]), ValueError, "non-negative"),
    ],
)
def test_modules_reject_bad_input(module_cls, x, positions, error, match):
    module = (
        SinusoidalPositionalEncoding(4)
        if module_cls == "sinusoidal"
        else LearnedPositionalEncoding(8, 4)
    )
    with pytest.raises(error, match=match):
        module(x, positions)


def test_sinusoidal_module_rejects_bad_constructor_arguments():
    with pytest.raises(ValueError, match="dim must be even"):
        SinusoidalPositionalEncoding(7)
    with pytest.raises(ValueError, match="max_len"):
        SinusoidalPositionalEncoding(8, max_len=0)
    with pytest.raises(ValueError, match="input_scale"):
        SinusoidalPositionalEncoding(8, input_scale=float("nan"))


# --- the learned module -------------------------------------------------------------


def test_learned_adds_its_rows_and_trains():
    module = LearnedPositionalEncoding(10, 6)
    assert sum(p.numel() for p in module.parameters()) == 60
    x = torch.randn(2, 4, 6)
    positions = torch.tensor([9, 0, 3, 3])
    out = module(x, positions)
    assert torch.equal(out, x + module.weight.detach()[positions])
    out.sum().backward()
    # row 3 is used twice per batch element, rows 9 and 0 once, the rest never
    counts = module.weight.grad[:, 0].tolist()
    assert counts == [2.0, 0.0, 0.0, 4.0, 0.0, 0.0, 0.0, 0.0, 0.0, 2.0]


@pytest.mark.parametrize("steps", [1, 13])
def test_rows_without_gradient_stay_under_sgd_and_adam_and_shrink_under_adamw(steps):
    # chapter 3: rows past the longest training sequence get a zero gradient; whether they
    # stay the initial vectors depends on the optimizer's weight decay
    lr, wd, used = 0.05, 0.3, 5

    def train(make_optimizer):
        torch.manual_seed(3)
        table = LearnedPositionalEncoding(12, 6)
        start = table.weight.detach().clone()
        optimizer = make_optimizer(table.parameters())
        for _ in range(steps):
            optimizer.zero_grad()
            table(torch.randn(2, used, 6)).pow(2).sum().backward()
            optimizer.step()
        return start, table.weight.detach()

    for make_optimizer in (
        lambda p: torch.optim.SGD(p, lr=lr, momentum=0.9),
        lambda p: torch.optim.Adam(p, lr=lr),
    ):
        start, end = train(make_optimizer)
        assert not torch.equal(end[:used], start[:used])
        assert torch.equal(end[used:], start[used:])
    start, end = train(lambda p: torch.optim.AdamW(p, lr=lr, weight_decay=wd))
    assert not torch.equal(end[used:], start[used:])
    factor = (1 - lr * wd) ** steps  # decoupled decay: p <- (1 - lr wd) p at every step
    torch.testing.assert_close(
        end[used:].double(), start[used:].double() * factor, rtol=1e-5, atol=0
    )


def test_learned_init_std():
    torch.manual_seed(0)
    module = LearnedPositionalEncoding(512, 768)
    assert module.weight.std().item() == pytest.approx(0.02, rel=0.01)
    assert abs(module.weight.mean().item()) < 1e-3


@pytest.mark.parametrize("length", [9, 20])
def test_learned_refuses_positions_past_the_table(length):
    module = LearnedPositionalEncoding(8, 4)
    with pytest.raises(ValueError, match="at or past max_len=8"):
        module(torch.zeros(1, length, 4))
    with pytest.raises(ValueError, match="at or past max_len=8"):
        module(torch.zeros(1, 2, 4), torch.tensor([3, 8]))
    assert module(torch.zeros(1, 8, 4)).shape == (1, 8, 4)


def test_learned_rejects_bad_constructor_arguments():
    with pytest.raises(ValueError, match="max_len"):
        LearnedPositionalEncoding(0, 4)
    with pytest.raises(TypeError, match="dim"):
        LearnedPositionalEncoding(4, 2.0)
    with pytest.raises(ValueError, match="init_std"):
        LearnedPositionalEncoding(4, 2, init_std=-1.0)


@given(max_len=st.integers(1, 30), dim=st.integers(1, 9), batch=st.integers(1, 3))
def test_learned_shapes_any_width(max_len, dim, batch):
    module = LearnedPositionalEncoding(max_len, dim)
    x = torch.zeros(batch, max_len, dim, dtype=torch.float64)
    out = module(x)
    assert out.shape == (batch, max_len, dim)
    assert out.dtype == torch.float64


# --- both break permutation equivariance ---------------------------------------------


@pytest.mark.parametrize("kind", ["sinusoidal", "learned"])
def test_adding_positions_breaks_permutation_equivariance(kind):
    torch.manual_seed(0)
    encoding = (
        SinusoidalPositionalEncoding(8)
        if kind == "sinusoidal"
        else LearnedPositionalEncoding(6, 8, init_std=1.0)
    )
    attention = MultiHeadAttention(8, 2).double()
    x = torch.randn(1, 6, 8, dtype=torch.float64)
    perm = torch.tensor([2, 0, 1, 5, 3, 4])
    with torch.no_grad():
        plain = attention(x)
        assert torch.allclose(attention(x[:, perm]), plain[:, perm], atol=1e-12)
        encoded = attention(encoding(x))
        shuffled = attention(encoding(x[:, perm]))
    assert not torch.allclose(shuffled, encoded[:, perm], atol=1e-3)


# --- the reference itself, and bad input found by hypothesis --------------------------


def test_reference_by_hand():
    row = sinusoidal_rows_loop([1], 4)[0]
    assert row == [math.sin(1), math.cos(1), math.sin(0.01), math.cos(0.01)]
    with pytest.raises(ValueError, match="dim"):
        sinusoidal_rows_loop([0], 3)
    with pytest.raises(ValueError, match="non-negative"):
        sinusoidal_rows_loop([-1], 4)


@given(dim=st.integers(-5, 99).filter(lambda d: d < 2 or d % 2))
def test_any_odd_or_tiny_dim_is_refused(dim):
    with pytest.raises(ValueError, match="dim"):
        sinusoidal_table(3, dim)
    with pytest.raises(ValueError, match="dim"):
        SinusoidalPositionalEncoding(dim)


@given(position=st.integers(-(10**6), -1), dtype=st.sampled_from([torch.int32, torch.int64]))
def test_any_negative_position_is_refused(position, dtype):
    positions = torch.tensor([0, position], dtype=dtype)
    with pytest.raises(ValueError, match="non-negative"):
        sinusoidal_encoding(positions, 4)
    with pytest.raises(ValueError, match="non-negative"):
        LearnedPositionalEncoding(4, 4)(torch.zeros(1, 2, 4), positions)


@given(max_len=st.integers(1, 20), past=st.integers(0, 100))
def test_any_position_past_the_table_is_refused(max_len, past):
    module = LearnedPositionalEncoding(max_len, 3)
    with pytest.raises(ValueError, match=f"max_len={max_len}"):
        module(torch.zeros(1, 1, 3), torch.tensor([max_len + past]))


def test_a_grown_table_keeps_the_modules_dtype():
    # after .double() the table is float64; growing it must not fall back to float32
    module = SinusoidalPositionalEncoding(8, max_len=4).double()
    x = torch.zeros(1, 20, 8, dtype=torch.float64)
    out = module(x)
    assert module.table.dtype == torch.float64
    reference = torch.tensor(sinusoidal_rows_loop(range(20), 8), dtype=torch.float64)
    assert (out[0] - reference).abs().max() < 1e-12  # float32 rows would be ~1e-8 off
