"""pecode.rope_compiled: the kernels torch.compile builds on the CPU, and the switch to them.

The compiled kernels (both layouts, float32 and bf16, tables shared or per batch row,
contiguous or split-head ``x``, ``out=``, forward, backward and second derivatives)
against the float64 loop of ``pecode.reference.rope``; the bf16 rounding on special
values against PyTorch's own; that ``"auto"`` leaves small inputs and decoding steps
alone, that new lengths, heads and batches do not recompile, and that past the variant
cap the compiled variants keep running; the fallback when no compiler works (said once,
never on stderr), and that other errors are raised as they are; the environment
variable and the argument. Compiled tests are skipped where torch.compile cannot build
C++ (one tiny real build says so, once); the fallback tests run everywhere. Each test
starts with no kernel built, so none depends on another (Inductor's disk cache keeps the
rebuilds short).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
import time
import warnings

import pytest
import torch
from test_rope_kernels import REL_TOL, assert_close_to
from torch._inductor.exc import CppCompileError

from pecode import rope_compiled, rope_kernels
from pecode.reference.rope import rope_loop
from pecode.rope import RotaryEmbedding, apply_rope, rope_cos_sin, rope_inv_freq

LAYOUTS = ["half", "interleaved"]
DTYPES = [torch.float32, torch.bfloat16]
# float32: a few ulp; bf16: the float32 rotation rounded once (half an ulp, 2^-9)
POSITIONS = torch.tensor([0, 1, 5, 17, 1000, 4095, 2])
BATCH_POSITIONS = torch.tensor([[0, 1, 2, 3, 4, 5, 6], [9, 0, 300, 2, 2, 70, 8]])


@pytest.fixture(scope="session")
def compiler_problem():
    """Why torch.compile cannot build C++ here, or None: one tiny real build, once a session."""
    missing = rope_compiled.compiler_missing()
    if missing is not None:
        return missing

    def double(x, out):
        out.copy_(x * 2)

    x, out = torch.arange(4.0), torch.empty(4)
    try:
        with warnings.catch_warnings(), torch._inductor.config.patch(force_disable_caches=True):
            warnings.simplefilter("ignore")
            torch.compile(double, backend="inductor", fullgraph=True)(x, out)
    except Exception as err:
        return f"{type(err).__name__}: {err}".splitlines()[0]
    return None if torch.equal(out, x * 2) else "a compiled kernel computed a wrong result"


@pytest.fixture
def compiler(compiler_problem):
    if compiler_problem is not None:
        pytest.skip(f"torch.compile cannot build C++ here: {compiler_problem}")


needs_compiler = pytest.mark.usefixtures("compiler")


@pytest.fixture(autouse=True)
def fresh_state(monkeypatch):
    """Each test starts with a working compiler (as the module knows), no kernel, no env var."""
    monkeypatch.setattr(rope_compiled._State, "reason", None)
    monkeypatch.setattr(rope_compiled._State, "probed", False)
    monkeypatch.setattr(rope_compiled._State, "kernels", {})
    monkeypatch.setattr(rope_compiled._State, "graphs", {})
    monkeypatch.setattr(rope_compiled._State, "runs", {})
    monkeypatch.delenv(rope_compiled.ENV_VAR, raising=False)


@pytest.fixture
def launches(monkeypatch):
    """The compiled-kernel launches so far (a list of their keys; eager runs not counted)."""
    seen: list[tuple[str, torch.dtype]] = []
    launch = rope_compiled._launch

    def counting(key, *args, **kwargs):
        ran = launch(key, *args, **kwargs)
        if ran and not kwargs.get("eager"):
            seen.append(key)
        return ran

    monkeypatch.setattr(rope_compiled, "_launch", counting)
    return seen


@pytest.fixture
def large_is_auto(monkeypatch):
    """Every input is large enough for "auto" and for the compiled path to read the switch."""
    monkeypatch.setattr(rope_compiled, "AUTO_MIN_NUMEL", 0)
    monkeypatch.setattr(rope_kernels, "SMALL_NUMEL", -1)


def build_error(message="the C++ compiler crashed\nmore lines"):
    """An error by which torch.compile says that it could not build a kernel."""
    return CppCompileError(["g++", "kernel.cpp"], message)


def fake_kernels(monkeypatch, kernel_for):
    """A compiler on the PATH, and kernels that ``kernel_for(key)`` gives instead of builds."""
    monkeypatch.setattr(rope_compiled, "compiler_missing", lambda: None)
    monkeypatch.setattr(rope_compiled, "_build", kernel_for)


def tables(positions, dim):
    cos, sin = rope_cos_sin(positions, rope_inv_freq(dim, dtype=torch.float64))
    return cos.float(), sin.float()


def loop(x, positions, layout):
    """rope_loop in float64, per batch row for positions [B, L]."""
    if positions.dim() == 1:
        return rope_loop(x.double(), positions, layout=layout)
    return torch.stack([rope_loop(x[b].double(), positions[b], layout=layout) for b in range(2)])


SPLIT = ("per batch", "shared, split heads")  # x as attention's split heads
PER_BATCH = ("per batch", "per batch, contiguous")  # tables [B, 1, L, r]


def randn(kind, dtype, generator):
    """[2, 3, 7, 12]; for split heads: [B, L, H, D] viewed as [B, H, L, D]."""
    if kind in SPLIT:
        return torch.randn(2, 7, 3, 12, generator=generator).to(dtype).transpose(1, 2)
    return torch.randn(2, 3, 7, 12, generator=generator).to(dtype)


def case(kind, dtype, seed=0):
    """x, its tables and the positions for the loop reference.

    "shared" tables ([L, r], or "one position" [1, r]) with a contiguous x, or with x as
    attention's split heads; "per batch" tables ([B, 1, L, r]) with split-head x, or
    with a contiguous x.
    """
    x = randn(kind, dtype, torch.Generator().manual_seed(seed))
    if kind in PER_BATCH:
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
@pytest.mark.parametrize(
    "kind", ["shared", "per batch", "one position", "shared, split heads", "per batch, contiguous"]
)
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
@pytest.mark.parametrize("kind", ["shared", "per batch", "shared, split heads"])
def test_gradient_is_the_loop_rotation_by_minus_theta(launches, layout, dtype, kind):
    # d(sum(g * R_θ x))/dx = R_{-θ} g: the loop reference at negated positions
    x, cos, sin, positions = case(kind, dtype, seed=1)
    x.requires_grad_()
    g = randn(kind, dtype, torch.Generator().manual_seed(2))  # the gradient in x's layout
    y = apply_rope(x, cos, sin, layout, compiled=True)
    assert type(y.grad_fn).__name__ == "_CompiledRotateBackward"
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
    assert type(grad.grad_fn).__name__ == "_CompiledRotateBackward"
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
    big = torch.randn(1, 4, 65, 128)  # above SMALL_NUMEL: the variable is used
    cos, sin = tables(torch.arange(65), 128)
    for _ in range(2):  # a bad value is never taken for the last good one
        with pytest.raises(ValueError, match="PECODE_ROPE_COMPILE"):
            apply_rope(big, cos, sin)
        with pytest.raises(ValueError, match="PECODE_ROPE_COMPILE"):
            apply_rope(big[:, :1, :2], cos[:2], sin[:2])  # a decoding step checks it too
    apply_rope(big, cos, sin, compiled=False)  # an explicit switch does not read it
    monkeypatch.setenv(rope_compiled.ENV_VAR, "0")
    apply_rope(big[:, :1, :2], cos[:2], sin[:2])


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


FIRST_COMPILE = """
import torch
from pecode import rope_compiled
from pecode.reference.rope import rope_loop
from pecode.rope import apply_rope, rope_cos_sin, rope_inv_freq

x = torch.randn(2, 3, 7, 12).half()
cos, sin = rope_cos_sin(torch.arange(7), rope_inv_freq(12))
got = apply_rope(x, cos, sin, compiled=True)
err = (got.double() - rope_loop(x.double(), torch.arange(7), layout="half")).abs()
assert rope_compiled.run_count() == 1 and float(err.max()) <= 2**-10 * 4
print(rope_compiled.compile_count())
"""


@needs_compiler
def test_a_first_compile_writes_nothing_on_stderr(tmp_path):
    # a fresh process (torch's lazy imports happen there) and no Inductor cache (the C++
    # compiler really runs), with every warning shown: not a line on stderr
    env = {
        **os.environ,
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path),
        "TORCHINDUCTOR_FORCE_DISABLE_CACHES": "1",
        "PYTHONWARNINGS": "always",
    }
    env.pop(rope_compiled.ENV_VAR, None)
    result = subprocess.run(
        [sys.executable, "-c", FIRST_COMPILE], capture_output=True, text=True, env=env
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "1\n"
    assert result.stderr == ""


ACROSS_ISAS = """
import torch
from pecode.reference.rope import rope_loop
from pecode.rope import apply_rope, rope_cos_sin, rope_inv_freq

x = torch.randn(1, 4, 64, 64, generator=torch.Generator().manual_seed(0))
cos, sin = rope_cos_sin(torch.arange(64), rope_inv_freq(64))
got = apply_rope(x, cos, sin, compiled=True)
print(float((got.double() - rope_loop(x.double(), torch.arange(64), layout="half")).abs().max()))
"""


@needs_compiler
def test_a_kernel_compiled_under_one_vector_isa_is_right_under_another(tmp_path):
    # Inductor's FX graph cache keys a graph without the ISA that ATEN_CPU_CAPABILITY
    # picks (torch 2.13): a kernel cached under this machine's own vector ISA and read back
    # under another gave wrong numbers (AVX-512, then avx2) or failed to compile (then
    # "default", no vectors: the case that fails on any machine). Two processes share one
    # cache folder, as `make test` and `make test-other-cpu` share /tmp's.
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path)}
    env.pop(rope_compiled.ENV_VAR, None)
    for isa in (None, "default"):
        run_env = {**env, "ATEN_CPU_CAPABILITY": isa} if isa else env
        result = subprocess.run(
            [sys.executable, "-c", ACROSS_ISAS], capture_output=True, text=True, env=run_env
        )
        assert result.returncode == 0, result.stderr[-3000:]
        assert float(result.stdout) <= 1e-5, f"ATEN_CPU_CAPABILITY={isa}: {result.stdout}"


# --- the fallback, everywhere ------------------------------------------------------------


@pytest.mark.parametrize("failure", ["no compiler", "compile fails"])
def test_without_a_compiler_auto_stays_eager_says_so_once_and_writes_no_stderr(
    monkeypatch, capfd, caplog, failure
):
    if failure == "no compiler":
        monkeypatch.setattr(rope_compiled, "compiler_missing", lambda: "no C++ compiler: test")
    else:

        def broken(*args):
            raise build_error()

        fake_kernels(monkeypatch, lambda key: broken)
    monkeypatch.setattr(rope_compiled, "AUTO_MIN_NUMEL", 0)
    monkeypatch.setattr(rope_kernels, "SMALL_NUMEL", -1)
    caplog.set_level(logging.DEBUG, logger="pecode")
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
    expected = "no C++ compiler: test" if failure == "no compiler" else "C++ compile error"
    assert expected in reason
    records = [r for r in caplog.records if r.name == "pecode.rope_compiled"]
    said = [r for r in records if r.levelno == logging.INFO]
    assert len(said) == 1
    assert expected in said[0].getMessage()
    if failure == "compile fails":  # the whole message, for whoever turns DEBUG on
        (debug,) = [r for r in records if r.levelno == logging.DEBUG]
        assert "more lines" in caplog.text
        assert debug.exc_info is not None
    with pytest.raises(RuntimeError, match=r"compiled=True.*" + re.escape(expected)):
        apply_rope(x, cos, sin, compiled=True)


def test_explicit_compile_with_a_failing_compiler_raises(monkeypatch):
    def broken(*args):
        raise build_error()

    fake_kernels(monkeypatch, lambda key: broken)
    x, cos, sin, _ = case("shared", torch.float32)
    with pytest.raises(RuntimeError, match=r"could not build the RoPE kernel \(CppCompileError"):
        apply_rope(x, cos, sin, compiled=True)
    assert "C++ compile error" in rope_compiled.unavailable_reason()
    assert torch.equal(apply_rope(x, cos, sin), apply_rope(x, cos, sin, compiled=False))


def test_plan_takes_only_the_layouts_the_kernels_know():
    x = torch.randn(2, 3, 7, 12)
    cos, sin = tables(POSITIONS, 12)
    assert rope_compiled._plan(x, cos, sin)[0].shape == (1, 6, 7, 12)  # rows merged
    assert rope_compiled._plan(x.transpose(1, 2).contiguous().transpose(1, 2), cos, sin) is not None
    assert rope_compiled._plan(x[..., :8], cos[..., :4], sin[..., :4]) is None  # partial rotary
    assert rope_compiled._plan(x, cos, sin, out=torch.empty(2, 3, 12, 7).mT) is None
    assert rope_compiled._plan(x.double(), cos.double(), sin.double()) is None
    assert rope_compiled._plan(x, cos[None], sin[None]) is not None  # [1, L, r]: shared


def test_only_the_switch_and_its_counters_are_public():
    assert sorted(rope_compiled.__all__) == [
        "AUTO_MIN_NUMEL",
        "ENV_VAR",
        "MAX_GRAPHS",
        "compile_count",
        "compiler_missing",
        "resolve_mode",
        "run_count",
        "unavailable_reason",
    ]
    for helper in ("plan", "rotate", "CompiledRotate"):  # they trust apply_rope's checks
        assert not hasattr(rope_compiled, helper), helper


def test_plan_leaves_odd_dims_and_tables_with_more_axes_to_eager():
    cos, sin = tables(POSITIONS, 12)
    assert rope_compiled._plan(torch.randn(7, 12), cos[None, None], sin[None, None]) is None
    assert rope_compiled._plan(torch.randn(7, 12), cos[None], sin[None]) is None
    assert rope_compiled._plan(torch.randn(3, 7, 12), cos[None], sin[None]) is not None
    assert rope_compiled._plan(torch.randn(3, 7, 13), cos, sin) is None  # odd dim


# --- the review's findings ----------------------------------------------------------------


@needs_compiler
@pytest.mark.parametrize("layout", LAYOUTS)
def test_tables_with_more_axes_than_x_give_the_broadcast_shape(layout):
    # x [L, D] with tables [1, 1, L, D/2]: the result is [1, 1, L, D], as eagerly
    x = torch.randn(7, 12, generator=torch.Generator().manual_seed(7))
    cos, sin = tables(POSITIONS, 12)
    cos, sin = cos[None, None], sin[None, None]
    want = rope_loop(x.double(), POSITIONS, layout=layout)[None, None]
    with torch.no_grad():
        got = apply_rope(x, cos, sin, layout, compiled=True)
    assert got.shape == (1, 1, 7, 12)
    assert torch.equal(got, apply_rope(x, cos, sin, layout, compiled=False))
    assert_close_to(got, want, torch.float32)
    leaf = x.clone().requires_grad_()
    g = torch.randn(1, 1, 7, 12, generator=torch.Generator().manual_seed(8))
    y = apply_rope(leaf, cos, sin, layout, compiled=True)
    assert y.shape == (1, 1, 7, 12)
    y.backward(g)
    assert_close_to(
        leaf.grad, rope_loop(g[0, 0].double(), -POSITIONS, layout=layout), torch.float32
    )


@needs_compiler
def test_past_the_cap_compiled_variants_keep_running_and_a_new_one_runs_eagerly(
    monkeypatch, capfd, launches
):
    x, cos, sin, positions = case("shared", torch.float32)
    apply_rope(x, cos, sin, compiled=True)  # the kernel's first variant
    assert rope_compiled.compile_count() == 1
    monkeypatch.setattr(rope_compiled, "MAX_GRAPHS", 1)  # the cap is reached
    capfd.readouterr()
    got = apply_rope(x, cos, sin, compiled=True)
    assert rope_compiled.run_count() == 2  # the compiled graph ran again
    assert launches == [("half", torch.float32)] * 2
    assert_close_to(got, loop(x, positions, "half"), torch.float32)
    # a new variant (split heads, per-batch tables): its formula, eagerly, no compile
    xb, cosb, sinb, batch_positions = case("per batch", torch.float32)
    got = apply_rope(xb, cosb, sinb, compiled=True)
    assert rope_compiled.compile_count() == 1
    assert rope_compiled.run_count() == 2
    assert_close_to(got, loop(xb, batch_positions, "half"), torch.float32)
    assert float((got - apply_rope(xb, cosb, sinb, compiled=False)).abs().max()) <= 1e-6
    assert capfd.readouterr().err == ""


@needs_compiler
def test_a_lower_dynamo_recompile_limit_is_the_cap_and_nothing_is_written_on_stderr(
    monkeypatch, capfd
):
    x, cos, sin, _ = case("shared", torch.float32)
    xb, cosb, sinb, batch_positions = case("per batch", torch.float32)
    capfd.readouterr()
    with torch._dynamo.config.patch(recompile_limit=1):
        apply_rope(x, cos, sin, compiled=True)
        got = apply_rope(xb, cosb, sinb, compiled=True)  # would be dynamo's second graph
    assert rope_compiled.compile_count() == 1
    assert_close_to(got, loop(xb, batch_positions, "half"), torch.float32)
    assert capfd.readouterr().err == ""


@needs_compiler
@pytest.mark.parametrize("compiled", [True, "auto"])
def test_a_default_device_elsewhere_leaves_the_path_working(large_is_auto, launches, compiled):
    x, cos, sin, positions = case("shared", torch.float32)
    g = randn("shared", torch.float32, torch.Generator().manual_seed(9))
    want = apply_rope(x, cos, sin, compiled=False)
    leaf = x.clone().requires_grad_()
    torch.set_default_device("meta")
    try:
        got = apply_rope(x, cos, sin, compiled=compiled)  # the eager paths, on the CPU
        apply_rope(leaf, cos, sin, compiled=compiled).backward(g)
    finally:
        torch.set_default_device(None)
    assert got.device.type == "cpu"
    assert torch.equal(got, want)
    assert_close_to(leaf.grad, loop(g, -positions, "half"), torch.float32)
    assert launches == []
    assert rope_compiled.unavailable_reason() is None
    # the default device changed between the compiled forward and its backward
    leaf.grad = None
    y = apply_rope(leaf, cos, sin, compiled=compiled)
    with torch.device("meta"):
        y.backward(g)
    assert_close_to(leaf.grad, loop(g, -positions, "half"), torch.float32)
    assert_close_to(y.detach(), loop(x, positions, "half"), torch.float32)
    assert launches[0] == ("half", torch.float32)  # the compiled path still works
    assert rope_compiled.unavailable_reason() is None


@pytest.mark.parametrize("error", [MemoryError("out of memory"), ValueError("a bad input")])
@pytest.mark.parametrize("compiled", [True, "auto"])
def test_errors_not_of_the_compiler_are_raised_and_change_nothing(
    monkeypatch, large_is_auto, error, compiled
):
    def failing(*args):
        raise error

    fake_kernels(monkeypatch, lambda key: failing)
    x, cos, sin, _ = case("shared", torch.float32)
    for _ in range(2):
        with pytest.raises(type(error), match=str(error)):
            apply_rope(x, cos, sin, compiled=compiled)
    assert rope_compiled.unavailable_reason() is None


@pytest.mark.parametrize("compiled", [None, True])
def test_a_compiler_failing_in_a_double_backward_falls_back_in_auto(
    monkeypatch, large_is_auto, compiled
):
    # the forward builds; the backward, recorded for a double backward, fails to
    calls = []

    def kernel_for(key):
        def kernel(*args):
            calls.append(key)
            if len(calls) > 1:
                raise build_error()
            rope_compiled._source(key)(*args)  # the formula, eagerly, as a build would

        return kernel

    fake_kernels(monkeypatch, kernel_for)
    x, cos, sin, positions = case("shared", torch.float32, seed=3)
    x.requires_grad_()
    g = randn("shared", torch.float32, torch.Generator().manual_seed(4)).requires_grad_()
    y = apply_rope(x, cos, sin, compiled=compiled)
    (grad,) = torch.autograd.grad(y, x, g, create_graph=True)
    assert_close_to(grad.detach(), loop(g.detach(), -positions, "half"), torch.float32)
    h = randn("shared", torch.float32, torch.Generator().manual_seed(5))
    (again,) = torch.autograd.grad(grad, g, h)
    assert_close_to(again, loop(h, positions, "half"), torch.float32)
    assert len(calls) == 2  # then the process stays eager
    assert "C++ compile error" in rope_compiled.unavailable_reason()


@needs_compiler
def test_warnings_are_caught_only_while_a_call_may_compile(monkeypatch):
    entered = []

    class Counting(warnings.catch_warnings):
        def __enter__(self):
            entered.append(1)
            return super().__enter__()

    monkeypatch.setattr(warnings, "catch_warnings", Counting)
    x, cos, sin, _ = case("shared", torch.float32)
    apply_rope(x, cos, sin, compiled=True)  # builds and compiles: quietly
    assert entered
    entered.clear()
    for _ in range(3):
        apply_rope(x, cos, sin, compiled=True)
    assert entered == []  # the process's warning filters untouched


def test_threads_asking_at_once_build_a_kernel_once(monkeypatch):
    built = []

    def slow_build(key):
        built.append(key)
        time.sleep(0.2)  # every thread arrives while the first builds
        return rope_compiled._source(key)  # the formula, eagerly, as a build would

    fake_kernels(monkeypatch, slow_build)
    x, cos, sin, positions = case("shared", torch.float32)
    results = [None] * 4

    def rotate(i):
        results[i] = apply_rope(x, cos, sin, compiled=True)

    threads = [threading.Thread(target=rotate, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert built == [("half", torch.float32)]
    for got in results:
        assert_close_to(got, loop(x, positions, "half"), torch.float32)


# float32 bit patterns and their nearest bf16: ties to even both ways, the largest finite
# bf16 and what rounds past it to inf, subnormals, signed zeros and infinities
BF16_ROUNDING = {
    0x3F808000: 0x3F80,  # 1 + 2^-8: a tie, down to the even 1
    0x3F818000: 0x3F82,  # a tie, up to the even neighbour
    0x3F808001: 0x3F81,  # just above a tie
    0x3F817FFF: 0x3F81,  # just below one
    0xBF808000: 0xBF80,
    0xBF818000: 0xBF82,
    0x7F7F0000: 0x7F7F,  # the largest finite bf16, 3.3895e38
    0x7F7F7FFF: 0x7F7F,
    0x7F7F8000: 0x7F80,  # 3.3961e38, a tie: up to inf
    0x7F7FFFFF: 0x7F80,  # the largest float32
    0xFF7F8000: 0xFF80,
    0x00000001: 0x0000,  # the smallest subnormal
    0x00008000: 0x0000,  # a tie between subnormals, down
    0x00018000: 0x0002,  # and up
    0x00010000: 0x0001,
    0x007FFFFF: 0x0080,  # the largest subnormal rounds to the smallest normal
    0x80008001: 0x8001,
    0x00000000: 0x0000,
    0x80000000: 0x8000,  # -0.0
    0x7F800000: 0x7F80,  # inf
    0xFF800000: 0xFF80,
    0x3F800000: 0x3F80,
}
NANS = [0x7FC00000, 0x7F800001, 0xFFFFFFFF, 0x7FFFFFFF, 0xFF800001]


def float32_of(patterns):
    signed = [p - 2**32 if p >= 2**31 else p for p in patterns]
    return torch.tensor(signed, dtype=torch.int32).view(torch.float32)


def bf16_bits(t):
    """The bits of a bf16 tensor, as non-negative ints."""
    return (t.view(torch.int16).int() & 0xFFFF).tolist()


def is_bf16_nan(bits):
    return (bits & 0x7F80) == 0x7F80 and (bits & 0x7F) != 0


def test_bf16_rounding_on_the_bits_is_pytorchs_on_special_values():
    values = float32_of([*BF16_ROUNDING, *NANS])
    ours = rope_compiled._bf16_bits(values).tolist()
    theirs = bf16_bits(values.bfloat16())
    n = len(BF16_ROUNDING)
    assert ours[:n] == theirs[:n] == list(BF16_ROUNDING.values())
    assert all(is_bf16_nan(bits) for bits in ours[n:] + theirs[n:])


@needs_compiler
def test_the_compiled_bf16_kernel_rounds_special_values_as_pytorch_does(launches):
    # x = (1, 1) pairs, sin = 0: the first of each pair is 1 · cos, rounded once to bf16
    values = float32_of([*BF16_ROUNDING, *NANS])
    cos = values.repeat(2, 1)
    sin = torch.zeros_like(cos)
    x = torch.ones(1, 1, 2, 2 * len(values), dtype=torch.bfloat16)
    got = apply_rope(x, cos, sin, "interleaved", compiled=True)
    assert launches == [("interleaved", torch.bfloat16)]
    eager = apply_rope(x, cos, sin, "interleaved", compiled=False)
    n = len(BF16_ROUNDING)
    for row in range(2):
        first = bf16_bits(got[0, 0, row, 0::2])
        assert first[:n] == list(BF16_ROUNDING.values())
        assert all(is_bf16_nan(bits) for bits in first[n:])
        ours, theirs = bf16_bits(got[0, 0, row]), bf16_bits(eager[0, 0, row])
        pairs = list(zip(ours, theirs, strict=True))
        assert [(o, t) for o, t in pairs if o != t and not is_bf16_nan(t)] == []
        assert all(is_bf16_nan(o) == is_bf16_nan(t) for o, t in pairs)


@needs_compiler
@pytest.mark.parametrize("layout", LAYOUTS)
def test_bf16_pairs_at_an_odd_storage_offset(launches, layout):
    # the interleaved bf16 kernel reads a pair as one 32-bit word: not here, so eagerly
    x, cos, sin, positions = case("shared", torch.bfloat16, seed=10)
    odd = torch.empty(x.numel() + 1, dtype=torch.bfloat16)[1:].view(x.shape).copy_(x)
    assert odd.storage_offset() == 1
    assert odd.is_contiguous()
    want = loop(x, positions, layout)
    with torch.no_grad():
        assert_close_to(apply_rope(odd, cos, sin, layout, compiled=True), want, torch.bfloat16)
    leaf = odd.requires_grad_()
    g = randn("shared", torch.bfloat16, torch.Generator().manual_seed(11))
    y = apply_rope(leaf, cos, sin, layout, compiled=True)
    assert_close_to(y.detach(), want, torch.bfloat16)
    y.backward(g)
    assert_close_to(leaf.grad, loop(g, -positions, layout), torch.bfloat16)
    if layout == "half":  # no words: the kernel runs
        assert launches == [("half", torch.bfloat16)] * 3
    else:  # the no-grad call and the forward eagerly; the gradient (a new tensor) compiled
        assert launches == [("interleaved", torch.bfloat16)]


@needs_compiler
def test_a_new_thread_count_rotates_the_same(launches):
    x, cos, sin, positions = case("shared", torch.float32)
    threads = torch.get_num_threads()
    first = apply_rope(x, cos, sin, compiled=True)
    torch.set_num_threads(1 if threads > 1 else 2)
    try:
        second = apply_rope(x, cos, sin, compiled=True)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(first, second)
    assert_close_to(second, loop(x, positions, "half"), torch.float32)
    assert launches == [("half", torch.float32)] * 2
