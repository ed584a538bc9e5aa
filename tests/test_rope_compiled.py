"""pecode.rope_compiled: the kernels torch.compile builds on the CPU, and the switch to them.

The compiled kernels (both layouts, float32 and bf16, tables shared or per batch row,
split-head ``x``, ``out=``, forward, backward and second derivatives) against the float64 loop of
``pecode.reference.rope``; that ``"auto"`` leaves small inputs and decoding steps
alone, that new lengths, heads and batches do not recompile; the fallback when no
compiler works (said once, never on stderr); the environment variable and the argument.
Compiled tests are skipped where no C++ compiler exists; the fallback tests run
everywhere. The inputs are tiny and the kernels are shared by the tests (a process
compiles each variant once, in seconds), so the file is quick once they are built.
"""

from __future__ import annotations

import logging
import re

import pytest
import torch

from pecode import rope_compiled, rope_kernels
from pecode.reference.rope import rope_loop
from pecode.rope import RotaryEmbedding, apply_rope, rope_cos_sin, rope_inv_freq

LAYOUTS = ["half", "interleaved"]
DTYPES = [torch.float32, torch.bfloat16]
# float32: a few ulp; bf16: the float32 rotation rounded once (half an ulp, 2^-9)
REL_TOL = {torch.float32: 1e-6, torch.bfloat16: 2**-8}
NO_COMPILER = rope_compiled.compiler_missing()
needs_compiler = pytest.mark.skipif(
    NO_COMPILER is not None, reason=f"torch.compile cannot build C++ here: {NO_COMPILER}"
)
POSITIONS = torch.tensor([0, 1, 5, 17, 1000, 4095, 2])
BATCH_POSITIONS = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [9, 0, 300, 2, 2, 70, 8]])


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    """Each test starts with a working compiler (as far as the module knows) and no env var."""
    monkeypatch.setattr(rope_compiled._State, "reason", None)
    monkeypatch.setattr(rope_compiled._State, "probed", False)
    monkeypatch.delenv(rope_compiled.ENV_VAR, raising=False)


@pytest.fixture
def launches(monkeypatch):
    """The number of compiled-kernel launches so far (a list of their keys)."""
    seen: list[tuple[str, torch.dtype]] = []
    launch = rope_compiled._launch

    def counting(key, *args):
        ran = launch(key, *args)
        if ran:
            seen.append(key)
        return ran

    monkeypatch.setattr(rope_compiled, "_launch", counting)
    return seen


def tables(positions, dim):
    cos, sin = rope_cos_sin(positions, rope_inv_freq(dim, dtype=torch.float64))
    return cos.float(), sin.float()


def loop(x, positions, layout):
    """rope_loop in float64, per batch row for positions [B, L]."""
    if positions.dim() == 1:
        return rope_loop(x.double(), positions, layout=layout)
    return torch.stack([rope_loop(x[b].double(), positions[b], layout=layout) for b in range(2)])


def assert_close_to(got, want, dtype):
    """|got - want| <= rel * |want| + rel, elementwise."""
    rel = REL_TOL[dtype]
    assert got.dtype == dtype
    assert got.shape == want.shape
    err = (got.double() - want).abs()
    assert bool((err <= rel * want.abs() + rel).all()), float(err.max())


def randn(kind, dtype, generator):
    """[2, 3, 7, 12]; for "per batch" split heads: [B, L, H, D] viewed as [B, H, L, D]."""
    if kind == "per batch":
        return torch.randn(2, 7, 3, 12, generator=generator).to(dtype).transpose(1, 2)
    return torch.randn(2, 3, 7, 12, generator=generator).to(dtype)


def case(kind, dtype, seed=0):
    """x, its tables and the positions for the loop reference.

    Two variants per kernel, so that the file compiles few: "shared" tables ([L, r],
    or "one position" [1, r]) with a contiguous x, and "per batch" tables
    ([B, 1, L, r]) with x as attention's split heads.
    """
    x = randn(kind, dtype, torch.Generator().manual_seed(seed))
    if kind == "per batch":
        cos, sin = tables(BATCH_POSITIONS, 12)
        return x, cos[:, None], sin[:, None], BATCH_POSITIONS
    if kind == "one position":
        cos, sin = tables(torch.tensor([123]), 12)
        return x, cos, sin, torch.tensor([123] * 7)
    cos, sin = tables(POSITIONS, 12)
    return x, cos, sin, POSITIONS


# --- the kernels against the loop -------------------------------------------------------


@needs_compiler
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["shared", "per batch", "one position"])
def test_forward_matches_the_loop_with_and_without_out(launches, layout, dtype, kind):
    x, cos, sin, positions = case(kind, dtype)
    want = loop(x, positions, layout)
    with torch.no_grad():
        got = apply_rope(x, cos, sin, layout, compiled=True)
        out = torch.empty(x.shape, dtype=dtype)
        returned = apply_rope(x, cos, sin, layout, out=out, compiled=True)
    assert launches == [(layout, dtype)] * 2
    assert returned is out
    assert_close_to(got, want, dtype)
    assert torch.equal(out, got)
    # the eager kernel's numbers, to rounding (bf16: one rounding of the same float32)
    eager = apply_rope(x, cos, sin, layout, compiled=False)
    assert float((got.double() - eager.double()).abs().max()) <= 2 * REL_TOL[dtype]


@needs_compiler
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["shared", "per batch"])
def test_gradient_is_the_loop_rotation_by_minus_theta(launches, layout, dtype, kind):
    # d(sum(g * R_θ x))/dx = R_{-θ} g: the loop reference at negated positions
    x, cos, sin, positions = case(kind, dtype, seed=1)
    x.requires_grad_()
    g = randn(kind, dtype, torch.Generator().manual_seed(2))  # the gradient in x's layout
    y = apply_rope(x, cos, sin, layout, compiled=True)
    assert type(y.grad_fn).__name__ == "CompiledRotateBackward"
    assert_close_to(y.detach(), loop(x.detach(), positions, layout), dtype)
    y.backward(g)
    assert launches == [(layout, dtype)] * 2  # the forward and the backward
    assert_close_to(x.grad, loop(g, -positions, layout), dtype)


@needs_compiler
@pytest.mark.parametrize("layout", LAYOUTS)
def test_second_derivative(launches, layout):
    x, cos, sin, positions = case("per batch", torch.float32, seed=3)
    x.requires_grad_()
    generator = torch.Generator().manual_seed(4)
    g = randn("per batch", torch.float32, generator).requires_grad_()
    h = randn("per batch", torch.float32, generator)
    y = apply_rope(x, cos, sin, layout, compiled=True)
    (grad,) = torch.autograd.grad(y, x, g, create_graph=True)
    assert_close_to(grad.detach(), loop(g.detach(), -positions, layout), torch.float32)
    # the backward is itself a CompiledRotate: grad = R(-θ) g, so d(grad · h)/dg = R(θ) h
    assert type(grad.grad_fn).__name__ == "CompiledRotateBackward"
    (again,) = torch.autograd.grad(grad, g, h)
    assert_close_to(again, loop(h, positions, layout), torch.float32)
    assert launches == [(layout, torch.float32)] * 3


@needs_compiler
def test_out_still_refuses_inputs_that_need_gradients():
    x, cos, sin, _ = case("shared", torch.float32)
    with pytest.raises(ValueError, match="out= is for inference"):
        apply_rope(x.requires_grad_(), cos, sin, out=torch.empty(x.shape), compiled=True)


@needs_compiler
def test_tables_needing_gradients_and_float64_are_not_compiled(launches):
    x, cos, sin, _ = case("shared", torch.float32)
    cos.requires_grad_()
    apply_rope(x, cos, sin, compiled=True).sum().backward()
    assert cos.grad is not None
    apply_rope(x.double(), cos.detach().double(), sin.double(), compiled=True)
    assert launches == []


# --- the switch ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("compiled", "env", "mode"),
    [
        (None, None, "auto"),
        (None, "", "auto"),
        (None, " AUTO ", "auto"),
        (None, "1", "on"),
        (None, "true", "on"),
        (None, "On", "on"),
        (None, "yes", "on"),
        (None, "0", "off"),
        (None, "false", "off"),
        (None, "OFF", "off"),
        (None, "no", "off"),
        (True, "0", "on"),
        (False, "1", "off"),
        ("auto", "0", "auto"),
    ],
)
def test_argument_and_environment_variable(monkeypatch, compiled, env, mode):
    if env is not None:
        monkeypatch.setenv(rope_compiled.ENV_VAR, env)
    assert rope_compiled.resolve_mode(compiled) == mode


def test_bad_values_name_the_argument_or_the_variable(monkeypatch):
    x, cos, sin, _ = case("shared", torch.float32)
    with pytest.raises(ValueError, match="compiled must be True, False, 'auto' or None"):
        apply_rope(x, cos, sin, compiled="yes")
    with pytest.raises(TypeError, match="compiled must be a bool, 'auto' or None, got int"):
        apply_rope(x, cos, sin, compiled=1)
    with pytest.raises(ValueError, match="compiled must be"):
        RotaryEmbedding(12, compiled="always")
    monkeypatch.setenv(rope_compiled.ENV_VAR, "maybe")
    with pytest.raises(ValueError, match="PECODE_ROPE_COMPILE must be 'auto', '1' or '0'"):
        rope_compiled.resolve_mode(None)
    big = torch.randn(1, 4, 65, 128)  # above SMALL_NUMEL: the variable is read
    cos, sin = tables(torch.arange(65), 128)
    with pytest.raises(ValueError, match="PECODE_ROPE_COMPILE"):
        apply_rope(big, cos, sin)
    apply_rope(big[:, :1, :2], cos[:2], sin[:2])  # a small input never reads it


def test_auto_leaves_small_inputs_decoding_steps_and_one_pass_cases_alone(monkeypatch, launches):
    built = []
    monkeypatch.setattr(rope_compiled, "_build", lambda key: built.append(key))
    x, cos, sin, _ = case("shared", torch.float32)
    apply_rope(x, cos, sin)  # small: auto never compiles it
    apply_rope(x, cos, sin, compiled="auto")
    step = torch.randn(256, 64, 1, 128)  # one position of a large batch: 2^21 elements
    cos1, sin1 = tables(torch.tensor([4000]), 128)
    assert step.numel() >= rope_compiled.AUTO_MIN_NUMEL
    apply_rope(step, cos1, sin1, compiled="auto")
    monkeypatch.setattr(rope_compiled, "AUTO_MIN_NUMEL", 0)
    monkeypatch.setattr(rope_kernels, "SMALL_NUMEL", -1)
    apply_rope(x, cos, sin, "interleaved")  # float32 interleaved: eager is one pass already
    apply_rope(x[..., :1, :], cos[:1], sin[:1])  # a decoding step, whatever its size
    assert built == []
    assert launches == []


@needs_compiler
def test_auto_compiles_large_half_and_bf16_inputs(monkeypatch, launches):
    monkeypatch.setattr(rope_compiled, "AUTO_MIN_NUMEL", 0)  # every input is "large"
    monkeypatch.setattr(rope_kernels, "SMALL_NUMEL", -1)
    x, cos, sin, _ = case("shared", torch.float32)
    apply_rope(x, cos, sin)
    apply_rope(x.bfloat16(), cos, sin, "interleaved")
    apply_rope(x, cos, sin, "interleaved")  # float32 interleaved stays eager
    assert launches == [("half", torch.float32), ("interleaved", torch.bfloat16)]


@needs_compiler
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_backward_runs_the_formula_eagerly_past_the_variant_limit(monkeypatch, layout, dtype):
    x, cos, sin, positions = case("shared", dtype, seed=5)
    x.requires_grad_()
    g = randn("shared", dtype, torch.Generator().manual_seed(6))
    y = apply_rope(x, cos, sin, layout, compiled=True)
    monkeypatch.setattr(rope_compiled, "MAX_GRAPHS", 0)  # no compiled kernel may run now
    y.backward(g)
    assert_close_to(x.grad, loop(g, -positions, layout), dtype)


@needs_compiler
def test_environment_variable_switches_mid_sized_inputs(monkeypatch, launches):
    x = torch.randn(1, 3, 911, 12)  # above SMALL_NUMEL, below AUTO_MIN_NUMEL
    positions = torch.arange(911)
    cos, sin = tables(positions, 12)
    apply_rope(x, cos, sin)
    monkeypatch.setenv(rope_compiled.ENV_VAR, "1")
    got = apply_rope(x, cos, sin)
    monkeypatch.setenv(rope_compiled.ENV_VAR, "0")
    apply_rope(x, cos, sin, "interleaved")
    assert launches == [("half", torch.float32)]
    assert_close_to(got, rope_loop(x.double(), positions, layout="half"), torch.float32)


@needs_compiler
def test_new_lengths_heads_and_batches_do_not_recompile(launches):
    x, cos, sin, _ = case("shared", torch.float32)
    apply_rope(x, cos, sin, compiled=True)  # built (or already built by an earlier test)
    before = rope_compiled.compile_count()
    for shape in ((2, 3, 5, 12), (4, 3, 9, 12), (2, 5, 23, 12), (3, 2, 64, 12)):
        positions = torch.arange(shape[2]) * 7
        cos, sin = tables(positions, 12)
        y = torch.randn(shape)
        got = apply_rope(y, cos, sin, compiled=True)
        assert_close_to(got, rope_loop(y.double(), positions, layout="half"), torch.float32)
    assert rope_compiled.compile_count() == before
    assert len(launches) == 5


@needs_compiler
def test_rotary_embedding_passes_the_switch_on(launches):
    rotary = RotaryEmbedding(12, compiled=True)
    q = torch.randn(2, 3, 7, 12)
    got = rotary.rotate(q, torch.arange(7))
    assert launches == [("half", torch.float32)]
    rotary.compiled = False
    assert torch.allclose(rotary.rotate(q, torch.arange(7)), got, atol=1e-6)
    assert len(launches) == 1


@needs_compiler
def test_a_first_compile_writes_nothing_on_stderr(capfd, launches):
    # float16 half layout: a kernel no other test builds, so this call compiles it
    x, cos, sin, positions = case("shared", torch.float16)
    capfd.readouterr()
    got = apply_rope(x, cos, sin, compiled=True)
    assert capfd.readouterr().err == ""
    assert launches == [("half", torch.float16)]
    err = (got.double() - loop(x, positions, "half")).abs()
    assert float(err.max()) <= 2**-10 * 4


# --- the fallback, everywhere ------------------------------------------------------------


@pytest.mark.parametrize("failure", ["no compiler", "compile fails"])
def test_without_a_compiler_auto_stays_eager_says_so_once_and_writes_no_stderr(
    monkeypatch, capfd, caplog, failure
):
    if failure == "no compiler":
        monkeypatch.setattr(rope_compiled, "compiler_missing", lambda: "no C++ compiler: test")
    else:
        monkeypatch.setattr(rope_compiled, "compiler_missing", lambda: None)

        def broken(*args):
            raise RuntimeError("the C++ compiler crashed\nmore lines")

        monkeypatch.setattr(rope_compiled._State, "kernels", {})
        monkeypatch.setattr(rope_compiled._State, "graphs", {})
        monkeypatch.setattr(rope_compiled, "_build", lambda key: broken)
    monkeypatch.setattr(rope_compiled, "AUTO_MIN_NUMEL", 0)
    monkeypatch.setattr(rope_kernels, "SMALL_NUMEL", -1)
    caplog.set_level(logging.INFO, logger="pecode")
    capfd.readouterr()
    for dtype in DTYPES:
        x, cos, sin, _ = case("shared", dtype)
        for _ in range(2):
            got = apply_rope(x, cos, sin)
            assert torch.equal(got, apply_rope(x, cos, sin, compiled=False))
            xg = x.clone().requires_grad_()
            apply_rope(xg, cos, sin).sum().backward()
            assert type(xg.grad) is torch.Tensor
    assert capfd.readouterr().err == ""
    reason = rope_compiled.unavailable_reason()
    expected = "no C++ compiler: test" if failure == "no compiler" else "the C++ compiler crashed"
    assert expected in reason
    records = [r for r in caplog.records if r.name == "pecode.rope_compiled"]
    assert len(records) == 1
    assert records[0].levelno == logging.INFO
    assert expected in records[0].getMessage()
    with pytest.raises(RuntimeError, match=r"compiled=True.*" + re.escape(expected)):
        apply_rope(x, cos, sin, compiled=True)


def test_explicit_compile_with_a_failing_compiler_raises(monkeypatch):
    def broken(*args):
        raise OSError("g++: not found")

    monkeypatch.setattr(rope_compiled, "compiler_missing", lambda: None)
    monkeypatch.setattr(rope_compiled._State, "kernels", {})
    monkeypatch.setattr(rope_compiled._State, "graphs", {})
    monkeypatch.setattr(rope_compiled, "_build", lambda key: broken)
    x, cos, sin, _ = case("shared", torch.float32)
    with pytest.raises(RuntimeError, match=r"could not build the RoPE kernel \(OSError: g\+\+"):
        apply_rope(x, cos, sin, compiled=True)
    assert "g++: not found" in rope_compiled.unavailable_reason()
    assert torch.equal(apply_rope(x, cos, sin), apply_rope(x, cos, sin, compiled=False))


def test_plan_takes_only_the_layouts_the_kernels_know():
    x = torch.randn(2, 3, 7, 12)
    cos, sin = tables(POSITIONS, 12)
    assert rope_compiled.plan(x, cos, sin)[0].shape == (1, 6, 7, 12)  # rows merged
    assert rope_compiled.plan(x.transpose(1, 2).contiguous().transpose(1, 2), cos, sin) is not None
    assert rope_compiled.plan(x[..., :8], cos[..., :4], sin[..., :4]) is None  # partial rotary
    assert rope_compiled.plan(x, cos, sin, out=torch.empty(2, 3, 12, 7).mT) is None
    assert rope_compiled.plan(x.double(), cos.double(), sin.double()) is None
    assert rope_compiled.plan(x, cos[None], sin[None]) is not None  # [1, L, r]: shared
