"""pecode.rope_kernels, every fast path of apply_rope, against the float64 loop reference.

Each path (the element-wise formula, the small-input path, the no-grad kernel in one
block and in many blocks, the autograd Function) is forced on small inputs and compared
with ``pecode.reference.rope.rope_loop``: the forward for both layouts, four input
dtypes, broadcast tables and strided views, with and without ``out=``; the gradient
(the rotation by ``-θ`` of the loop reference, and ``gradcheck``); ``torch.func``
transforms; and ``RotaryEmbedding`` inside ``MultiHeadAttention`` compiled with
``torch.compile(fullgraph=True)`` and exported with ``torch.export``.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from pecode import rope_kernels
from pecode.attention import MultiHeadAttention
from pecode.reference.rope import rope_attention_loop, rope_loop
from pecode.rope import RotaryEmbedding, apply_rope, rope_cos_sin, rope_formula, rope_inv_freq
from pecode.rope_kernels import RotateFunction

LAYOUTS = ["half", "interleaved"]
PATHS = ["formula", "small", "kernel", "blocks"]
# float64 arithmetic is exact to rounding; float32 tables and arithmetic to a few ulp;
# bf16/fp16 results are the float32 rotation rounded once (half an ulp: 2^-9, 2^-12)
# torch's own lazy imports (forward-AD decompositions, inductor) call torch.jit.script,
# which torch 2.9+ deprecates: a warning about torch, not about pecode
TORCH_INTERNALS = pytest.mark.filterwarnings(r"ignore:`torch\.jit\.script:DeprecationWarning")
REL_TOL = {torch.float64: 1e-12, torch.float32: 1e-6, torch.bfloat16: 2**-8, torch.float16: 2**-11}


@pytest.fixture
def force_path(monkeypatch):
    """Make apply_rope take one path whatever the input's size."""

    def force(path: str) -> None:
        if path == "formula":
            monkeypatch.setattr(rope_kernels, "can_rotate", lambda *args: False)
        elif path == "small":
            monkeypatch.setattr(rope_kernels, "SMALL_NUMEL", 10**12)
        else:
            monkeypatch.setattr(rope_kernels, "SMALL_NUMEL", -1)
        if path == "blocks":  # one position per block, in the cache passes and the buffer
            monkeypatch.setattr(rope_kernels, "_CACHE_BLOCK_BYTES", 1)
            monkeypatch.setattr(rope_kernels, "_BUFFER_BYTES", 1)

    return force


def tables(positions, dim, dtype=torch.float64):
    cos, sin = rope_cos_sin(positions, rope_inv_freq(dim, dtype=torch.float64))
    return cos.to(dtype), sin.to(dtype)


def loop_reference(x, positions, layout):
    """rope_loop per batch row when positions are [B, L] (tables [B, 1, L, r])."""
    if positions.dim() == 1:
        return rope_loop(x, positions, layout=layout)
    return torch.stack([rope_loop(x[b], positions[b], layout=layout) for b in range(len(x))])


def assert_close_to(got, want, dtype):
    """|got - want| <= rel * |want| + rel, elementwise, for the dtype's tolerance."""
    rel = REL_TOL[dtype]
    assert got.dtype == dtype
    assert got.shape == want.shape
    err = (got.double() - want).abs()
    assert bool((err <= rel * want.abs() + rel).all()), float(err.max())


POSITION_KINDS = {
    "[L,r]": torch.tensor([0, 1, 5, 17, 1000, 4095, 2]),
    "[B,1,L,r]": torch.tensor([[0, 1, 2, 3, 4, 5, 6], [9, 0, 300, 2, 2, 70, 8]]),
    "[1,r]": torch.tensor([123]),
}


def make_tables(kind, dim, dtype):
    positions = POSITION_KINDS[kind]
    cos, sin = tables(positions, dim, dtype)
    if kind == "[B,1,L,r]":
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
    return positions, cos, sin


def expand_positions(positions, length):
    return positions.expand(length) if positions.numel() == 1 else positions


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("kind", list(POSITION_KINDS))
def test_forward_of_every_path_matches_the_loop(force_path, path, layout, dtype, kind):
    force_path(path)
    length = 1 if kind == "[1,r]" else 7
    x = torch.randn(2, 3, length, 12).to(dtype)
    table_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    positions, cos, sin = make_tables(kind, 12, table_dtype)
    want = loop_reference(x.double(), expand_positions(positions, length), layout)
    with torch.no_grad():
        assert_close_to(apply_rope(x, cos, sin, layout), want, dtype)
    # with x requiring grad: the autograd Function (or the formula) gives the same numbers
    got = apply_rope(x.clone().requires_grad_(), cos, sin, layout)
    assert_close_to(got.detach(), want, dtype)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_strided_views_and_out_match_the_loop(force_path, path, layout, dtype):
    # [B, L, H, D] -> [B, H, L, D] (attention's split heads), a view at an odd offset
    # (no complex view of its pairs), and out= tensors of both kinds
    force_path(path)
    base = torch.randn(2, 9, 3, 11, dtype=dtype)
    views = {
        "transposed": base[..., :10].transpose(1, 2),
        "odd offset": base.flatten()[1 : 1 + 2 * 9 * 3 * 10].view(2, 3, 9, 10),
    }
    positions = torch.arange(9) * 11
    cos, sin = tables(positions, 10, dtype)
    for x in views.values():
        want = rope_loop(x.contiguous().double(), positions, layout=layout)
        with torch.no_grad():
            assert_close_to(apply_rope(x, cos, sin, layout), want, dtype)
            contiguous, transposed = torch.empty(2, 3, 9, 10), torch.empty(2, 9, 3, 10)
            for out in (contiguous.to(dtype), transposed.to(dtype).transpose(1, 2)):
                result = apply_rope(x, cos, sin, layout, out=out)
                assert result is out
                assert_close_to(out, want, dtype)


@pytest.mark.parametrize("path", ["small", "kernel", "blocks"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize(
    ("dtype", "table_dtype"),
    [
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.float32),
        (torch.float32, torch.float64),
    ],
)
def test_narrow_out_is_the_wide_rotation_rounded_once(force_path, path, layout, dtype, table_dtype):
    # x narrower than the tables: rotated in the tables' dtype, rounded once into out
    force_path(path)
    x = torch.randn(2, 3, 7, 8).to(dtype)
    positions = torch.arange(7) * 50
    cos, sin = tables(positions, 8, table_dtype)
    out = torch.empty(2, 3, 7, 8, dtype=dtype)
    with torch.no_grad():
        apply_rope(x, cos, sin, layout, out=out)
    want = rope_loop(x.double(), positions, layout=layout)
    if dtype == torch.float32:  # float64 arithmetic: within half an ulp of float32
        assert bool(((out.double() - want).abs() <= 2**-24 * want.abs() + 1e-30).all())
    assert_close_to(out, want, dtype)


# --- gradients --------------------------------------------------------------------------


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_gradient_is_the_loop_rotation_by_minus_theta(force_path, path, layout, dtype):
    # d(sum(g * R_θ x))/dx = R_θᵀ g = R_{-θ} g: the loop reference at negated positions
    force_path(path)
    positions = torch.tensor([0, 3, 50, 999, 7])
    x = torch.randn(2, 3, 5, 12, dtype=dtype, requires_grad=True)
    g = torch.randn(2, 3, 5, 12, dtype=dtype)
    cos, sin = tables(positions, 12, dtype)
    y = apply_rope(x, cos, sin, layout)
    if path in ("kernel", "blocks"):
        assert type(y.grad_fn).__name__ == "RotateFunctionBackward"
    (y * g).sum().backward()
    want = rope_loop(g.double(), -positions, layout=layout)
    assert float((x.grad.double() - want).abs().max()) <= REL_TOL[dtype] * 10


@pytest.mark.parametrize("layout", LAYOUTS)
def test_float32_gradient_equals_autograd_through_the_formula_in_float64(force_path, layout):
    x = torch.randn(2, 4, 64, 32)
    g = torch.randn(2, 4, 64, 32)
    cos, sin = tables(torch.arange(64) * 31, 32)
    exact = x.double().requires_grad_()
    force_path("formula")
    (apply_rope(exact, cos, sin, layout) * g.double()).sum().backward()
    force_path("kernel")
    fast = x.clone().requires_grad_()
    (apply_rope(fast, cos.float(), sin.float(), layout) * g).sum().backward()
    assert float((fast.grad.double() - exact.grad).abs().max()) <= 1e-6


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("table_shape", [(5, 3), (1, 3)])
def test_function_passes_gradcheck_and_gradgradcheck(layout, table_shape):
    # finite differences, independent of any formula; the backward is itself a
    # RotateFunction, so second derivatives are checked too
    x = torch.randn(2, 5, 6, dtype=torch.float64, requires_grad=True)
    angles = torch.rand(table_shape, dtype=torch.float64) * 6
    cos, sin = angles.cos(), angles.sin()

    def fn(t):
        return RotateFunction.apply(t, cos, sin, layout)

    assert torch.autograd.gradcheck(fn, (x,))
    assert torch.autograd.gradgradcheck(fn, (x,))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_tables_needing_gradients_fall_back_to_autograd(force_path, monkeypatch, layout):
    force_path("kernel")

    def refuse(*args):
        raise AssertionError("the Function cannot differentiate the tables")

    monkeypatch.setattr(RotateFunction, "apply", refuse)
    x = torch.randn(2, 3, 6, dtype=torch.float64, requires_grad=True)
    angles = torch.rand(3, 3, dtype=torch.float64) * 6
    cos, sin = angles.cos().requires_grad_(), angles.sin().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, c, s: apply_rope(a, c, s, layout), (x, cos, sin))


# --- torch.func and forward-mode AD -----------------------------------------------------


@TORCH_INTERNALS
@pytest.mark.parametrize("layout", LAYOUTS)
def test_vmap_jvp_and_func_grad_give_the_loop_results(force_path, layout):
    force_path("kernel")  # without routing, these inputs would reach the kernels
    positions = torch.arange(6) * 9
    cos, sin = tables(positions, 8)
    xs = torch.randn(3, 2, 6, 8, dtype=torch.float64)
    tangent = torch.randn(3, 2, 6, 8, dtype=torch.float64)

    def rotate(t):
        return apply_rope(t, cos, sin, layout)

    batched = torch.func.vmap(rotate)(xs)
    assert torch.allclose(batched, rope_loop(xs, positions, layout=layout), atol=1e-12)
    value, jvp_out = torch.func.jvp(rotate, (xs,), (tangent,))
    assert torch.allclose(value, rope_loop(xs, positions, layout=layout), atol=1e-12)
    assert torch.allclose(jvp_out, rope_loop(tangent, positions, layout=layout), atol=1e-12)
    grad = torch.func.grad(lambda t: (rotate(t) * tangent).sum())(xs)
    assert torch.allclose(grad, rope_loop(tangent, -positions, layout=layout), atol=1e-12)
    import torch.autograd.forward_ad as fwad

    with fwad.dual_level():
        dual = rotate(fwad.make_dual(xs, tangent))
        dual_tangent = fwad.unpack_dual(dual).tangent
    assert torch.allclose(dual_tangent, rope_loop(tangent, positions, layout=layout), atol=1e-12)


# --- out= -------------------------------------------------------------------------------


def test_out_errors_name_out():
    x = torch.randn(2, 3, 4, 8)
    cos, sin = tables(torch.arange(4), 8, torch.float32)
    with pytest.raises(TypeError, match="out"):
        apply_rope(x, cos, sin, out=[0.0])
    with pytest.raises(TypeError, match="out"):
        apply_rope(x, cos, sin, out=torch.empty(2, 3, 4, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="out"):
        apply_rope(x, cos, sin, out=torch.empty(2, 3, 4, 6))
    with pytest.raises(ValueError, match="out"):
        apply_rope(x, cos, sin, out=torch.empty(2, 3, 4, 8, device="meta"))
    with pytest.raises(ValueError, match="out"):
        apply_rope(x, cos, sin, out=x)  # in place: not supported
    with pytest.raises(ValueError, match="out"):
        apply_rope(x[:, :2], cos, sin, out=x[:, 1:])  # overlapping views
    with pytest.raises(ValueError, match="out"):
        apply_rope(x.clone().requires_grad_(), cos, sin, out=torch.empty(2, 3, 4, 8))
    # a disjoint part of the same storage is fine
    got = apply_rope(x[:1], cos, sin, out=x[1:])
    assert got.data_ptr() == x[1:].data_ptr()


# --- RotaryEmbedding under torch.compile and torch.export -------------------------------


def make_attention(layout, seed=0):
    torch.manual_seed(seed)
    rotary = RotaryEmbedding(8, layout=layout, initial_positions=64)
    return MultiHeadAttention(32, 4, position=rotary).eval()


@TORCH_INTERNALS
@pytest.mark.parametrize("layout", LAYOUTS)
def test_compiled_attention_has_no_graph_break_and_matches(layout):
    layer = make_attention(layout)
    x = torch.randn(2, 16, 32)
    positions = torch.arange(16) + 20
    compiled = torch.compile(layer, fullgraph=True)  # fails on any graph break
    with torch.no_grad():
        got = compiled(x, positions=positions, causal=True)
        eager = layer(x, positions=positions, causal=True)
        with pytest.raises(RuntimeError, match="past the cached tables"):
            compiled(x, positions=positions + 100, causal=True)  # no host read to grow them
    want = rope_attention_loop(layer, x, positions, layout=layout, causal=True)
    assert float((got.double() - want).abs().max()) <= 1e-5
    assert float((got - eager).abs().max()) <= 1e-5
    with torch.no_grad():
        explained = torch._dynamo.explain(layer)(x, positions=positions, causal=True)
    assert explained.graph_break_count == 0


@TORCH_INTERNALS
def test_exported_attention_matches_and_never_reads_a_tensor_on_the_host():
    for layout in LAYOUTS:
        layer = make_attention(layout)
        x = torch.randn(2, 16, 32)
        positions = torch.arange(16) + 3
        exported = torch.export.export(layer, (x,), {"positions": positions, "causal": True})
        targets = {str(node.target) for node in exported.graph.nodes}
        assert not any("local_scalar_dense" in t or ".item" in t for t in targets)
        with torch.no_grad():
            got = exported.module()(x, positions=positions, causal=True)
        want = rope_attention_loop(layer, x, positions, layout=layout, causal=True)
        assert float((got.double() - want).abs().max()) <= 1e-5
        with pytest.raises(RuntimeError, match="negative"):
            exported.module()(x, positions=positions - 10, causal=True)


@TORCH_INTERNALS
@pytest.mark.parametrize("layout", LAYOUTS)
def test_apply_rope_traces_in_one_graph_with_batched_tables_and_out(force_path, layout):
    force_path("kernel")  # eager calls of this size would take the kernels; traced ones not
    positions = torch.tensor([[0, 1, 2, 3, 4], [9, 8, 7, 6, 5]])
    cos, sin = (t.unsqueeze(1) for t in tables(positions, 8))
    x = torch.randn(2, 3, 5, 8, dtype=torch.float64)
    out = torch.empty_like(x)
    traced = torch.compile(apply_rope, backend="eager", fullgraph=True)
    with torch.no_grad():
        traced(x, cos, sin, layout, out=out)
    assert_close_to(out, loop_reference(x, positions, layout), torch.float64)


def test_rotary_tables_stay_wide_right_after_a_cast():
    # rebuilt by Module.to itself, so a compiled model (which cannot rebuild them) never
    # sees bf16 tables
    layer = make_attention("half").to(torch.bfloat16)
    assert layer.position.cos_cached.dtype == torch.float32
    assert layer.position.cached_positions == 64
    want, _ = rope_cos_sin(torch.arange(64), rope_inv_freq(8, dtype=torch.float64))
    assert float((layer.position.cos_cached.double() - want).abs().max()) < 1e-7


def test_eager_rotary_embedding_still_checks_and_grows():
    rotary = RotaryEmbedding(8, initial_positions=4)
    with pytest.raises(ValueError, match="non-negative"):
        rotary.cos_sin(torch.tensor([3, -1]))
    rotary.cos_sin(torch.tensor([[2, 40]]))
    assert rotary.cached_positions >= 41


# --- the no-grad kernel's pieces ---------------------------------------------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_conjugate_kernel_is_the_rotation_by_minus_theta(layout):
    positions = torch.arange(0, 400, 10)
    x = torch.randn(3, 40, 16, dtype=torch.float64)
    cos, sin = tables(positions, 16)
    for conjugate, sign in ((False, 1), (True, -1)):
        want = rope_loop(x, sign * positions, layout=layout)
        got = rope_kernels.rotate_no_grad(x, cos, sin, layout, conjugate=conjugate)
        assert torch.allclose(got, want, atol=1e-12)
        small = rope_kernels.rotate_small(x, cos, sin, layout, conjugate=conjugate)
        assert torch.allclose(small, want, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_half_layout_cache_blocks_at_the_benchmark_size(dtype):
    # [1, 4, 2048, 128]: many rows per block; against the complex form in float64, which
    # the loop reference checks in tests/test_rope.py
    from pecode.rope import apply_rope_complex

    generator = torch.Generator().manual_seed(3)
    x = torch.randn(1, 4, 2048, 128, generator=generator, dtype=torch.float64)
    inv_freq = rope_inv_freq(128, dtype=torch.float64)
    cos, sin = rope_cos_sin(torch.arange(2048), inv_freq)
    expected = apply_rope_complex(x, torch.arange(2048), inv_freq, layout="half")
    tolerance = 1e-6 if dtype == torch.float32 else 1e-12
    got = rope_kernels.rotate_no_grad(x.to(dtype), cos.to(dtype), sin.to(dtype), "half")
    assert torch.allclose(got.double(), expected, atol=tolerance)


@pytest.mark.parametrize("layout", LAYOUTS)
def test_compilable_math_traces_and_matches(layout):
    # the function the CUDA path compiles: traced by dynamo (backend "eager" needs no
    # compiler) it gives the loop reference's numbers
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    positions = torch.arange(5) * 3
    cos, sin = tables(positions, 8)
    traced = torch.compile(rope_formula, backend="eager", fullgraph=True)
    want = rope_loop(x, positions, layout=layout)
    assert torch.allclose(traced(x, cos, sin, layout), want)
    assert torch.allclose(rope_formula(x, cos, sin, layout), want)


# The Triton kernel, run by Triton's interpreter on the CPU (TRITON_INTERPRET=1 must be
# set before the kernel is defined, hence a fresh process), against the float64 loop:
# both layouts, three dtypes, a head size that is not a power of two (masked lanes),
# per-batch tables broadcast by strides, x and out with rows apart in memory, and
# conjugate=True.
TRITON_SCRIPT = """
import torch
from pecode.reference.rope import rope_loop
from pecode.rope import rope_cos_sin, rope_inv_freq
from pecode.rope_triton import launch

generator = torch.Generator().manual_seed(0)
worst = {}
for layout in ("half", "interleaved"):
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for shape, per_batch, strided in (
            ((2, 3, 5, 8), False, False),
            ((3, 6, 10), False, True),
            ((2, 3, 5, 12), True, False),
            ((7, 6), False, False),
            ((1, 2, 40, 128), False, False),  # two blocks of positions, the last one masked
        ):
            length, dim = shape[-2:]
            # the input rounded to dtype first, so that the only rounding is the result's
            x64 = torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype).double()
            if per_batch:
                positions = torch.randint(0, 500, (shape[0], length), generator=generator)
                want = torch.stack([rope_loop(x64[b], positions[b], layout=layout)
                                    for b in range(shape[0])])
            else:
                positions = torch.arange(length) * 7 + 3
                want = rope_loop(x64, positions, layout=layout)
            cos, sin = rope_cos_sin(positions, rope_inv_freq(dim, dtype=torch.float64))
            cos, sin = cos.float(), sin.float()  # float32 tables rounded once
            if per_batch:
                cos, sin = cos[:, None], sin[:, None]
            x = x64.to(dtype)
            out = torch.empty(*shape[:-2], 2 * length, dim, dtype=dtype)[..., ::2, :]
            if strided:  # rows of x and out that are not adjacent in memory
                x = torch.empty(shape[0], 2 * length, dim, dtype=dtype)[:, ::2].copy_(x)
            launch(x, cos, sin, layout, out)
            back = torch.empty_like(out)
            launch(out, cos, sin, layout, back, conjugate=True)
            scale = float(want.abs().max())
            for key, error in (
                (str(dtype), float((out.double() - want).abs().max()) / scale),
                (f"{dtype} round trip", float((back.double() - x.double()).abs().max()) / scale),
            ):
                worst[key] = max(worst.get(key, 0.0), error)

# tables that broadcast by strides: one row for every position ([1, r]), a stride-0
# expansion, and one table per head ([1, H, L, r]); then tiny blocks, so that several
# programs cover the positions and the grid's second axis is clamped
import pecode.rope_triton as rope_triton

x64 = torch.randn(2, 3, 9, 10, generator=generator, dtype=torch.float64)
angles = torch.rand(1, 3, 9, 5, generator=generator, dtype=torch.float64) * 50
for name, cos, sin, want in (
    ("one row", angles[0, 0, :1].cos(), angles[0, 0, :1].sin(), None),
    ("stride 0", angles[0, 0].cos().expand(9, 5), angles[0, 0].sin().expand(9, 5), None),
    ("per head", angles.cos(), angles.sin(), None),
):
    c4 = cos.expand(1, 3, 9, 5) if cos.dim() < 4 else cos
    s4 = sin.expand(1, 3, 9, 5) if sin.dim() < 4 else sin
    a, b = x64[..., :5], x64[..., 5:]
    want = torch.cat((a * c4 - b * s4, a * s4 + b * c4), -1)
    for elements, grid_y in ((4096, 65535), (20, 2)):
        rope_triton._ELEMENTS_PER_PROGRAM, rope_triton._MAX_GRID_Y = elements, grid_y
        out = torch.empty(2, 3, 9, 10)
        launch(x64.float(), cos.float(), sin.float(), "half", out)
        error = float((out.double() - want).abs().max()) / float(want.abs().max())
        worst["broadcast tables"] = max(worst.get("broadcast tables", 0.0), error)
rope_triton._ELEMENTS_PER_PROGRAM, rope_triton._MAX_GRID_Y = 4096, 65535

# the whole chain apply_rope -> RotateFunction -> kernel, forward and backward, with the
# device check pointed at the interpreter: the gradient is the loop's rotation by -θ
from pecode import rope_kernels
from pecode.rope import apply_rope

rope_kernels._triton_device = lambda x: True
for layout in ("half", "interleaved"):
    positions = torch.arange(40) * 3
    cos, sin = rope_cos_sin(positions, rope_inv_freq(16, dtype=torch.float64))
    x = torch.randn(2, 3, 40, 16, generator=generator).requires_grad_()
    grad = torch.randn(2, 3, 40, 16, generator=generator, dtype=torch.float64)
    out = apply_rope(x, cos.float(), sin.float(), layout)
    out.backward(grad.float())
    want_forward = rope_loop(x.double(), positions, layout=layout)
    forward_error = float((out.double() - want_forward).abs().max())
    back = rope_loop(grad, -positions, layout=layout)
    grad_error = float((x.grad.double() - back).abs().max())
    worst["chain"] = max(worst.get("chain", 0.0), forward_error, grad_error)
print(worst)
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs Triton")
def test_triton_kernel_matches_the_loop_in_the_interpreter():
    result = subprocess.run(
        [sys.executable, "-c", TRITON_SCRIPT],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    worst = ast.literal_eval(result.stdout.strip().splitlines()[-1])
    # relative to the largest element: float32, a few ulp; bf16 (8 significant bits) and
    # fp16 (11): the result is converted once, and the round trip adds the second
    # conversion and the first one's error rotated back. The interpreter converts
    # float32 to bf16/fp16 by truncation (one ulp, 2^-7 or 2^-10 of an element); a GPU
    # rounds to nearest (half that), which test_cuda_paths_match_the_cpu_path checks.
    for dtype, bits in (("float32", 24), ("bfloat16", 7), ("float16", 10)):
        once = 2.0**-bits if bits < 24 else 1e-6
        assert worst[f"torch.{dtype}"] <= once, worst
        assert worst[f"torch.{dtype} round trip"] <= 3 * once, worst
    assert worst["broadcast tables"] < 1e-6, worst  # float32 tables rounded once
    assert worst["chain"] < 1e-5, worst


def test_triton_path_is_only_for_cuda_outside_dispatch_modes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    x = torch.randn(2, 4, 8, 16)
    cos, sin = rope_cos_sin(torch.arange(8), rope_inv_freq(16))
    assert not rope_kernels._use_triton(x, cos, sin)  # on the CPU
    with FakeTensorMode():
        on_gpu = torch.empty(2, 4, 8, 16, device="cuda")
        assert on_gpu.is_cuda
        fake_cos, fake_sin = (torch.empty(8, 8, device="cuda") for _ in range(2))
        assert not rope_kernels._use_triton(on_gpu, fake_cos, fake_sin)  # a dispatch mode


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(2, 4, 33, 16), (2, 8, 1025, 64)], ids=["small", "large"])
def test_cuda_paths_match_the_cpu_path(layout, dtype, shape):
    x = torch.randn(shape).to(dtype)
    length, dim = shape[-2:]
    positions = torch.arange(length) * 5
    cos, sin = tables(positions, dim, torch.float32)
    on_gpu, gpu_cos, gpu_sin = x.cuda(), cos.cuda(), sin.cuda()
    assert rope_kernels._use_triton(on_gpu, gpu_cos, gpu_sin) == (
        rope_kernels._triton() is not None
    )
    got = apply_rope(on_gpu, gpu_cos, gpu_sin, layout)
    assert got.dtype == dtype
    # each element within half an ulp of the float64 loop (rounded to nearest once),
    # plus float32 arithmetic's error, which scales with the pair's size, not the result's
    exact = rope_loop(x.double(), positions, layout=layout)
    bits = {torch.float32: 23, torch.bfloat16: 8, torch.float16: 11}[dtype]
    bound = 2.0**-bits * exact.abs() + 1e-6 * float(x.abs().max())
    assert bool(((got.cpu().double() - exact).abs() <= bound).all())
    # out=: written in place, nothing else allocated on the device
    out = torch.empty_like(on_gpu)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    apply_rope(on_gpu, gpu_cos, gpu_sin, layout, out=out)
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() == before
    assert torch.equal(out, got)
    # training: forward and backward (the rotation by -θ) on the GPU, each gradient
    # element within half an ulp of the float64 loop's rotation of the upstream gradient
    leaf = on_gpu.clone().requires_grad_()
    grad = torch.randn(shape).to(dtype)
    apply_rope(leaf, gpu_cos, gpu_sin, layout).backward(grad.cuda())
    exact_grad = rope_loop(grad.double(), -positions, layout=layout)
    grad_bound = 2.0**-bits * exact_grad.abs() + 1e-6 * float(grad.abs().max())
    assert bool(((leaf.grad.cpu().double() - exact_grad).abs() <= grad_bound).all())


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("layout", LAYOUTS)
def test_cuda_per_batch_tables_and_gradcheck(layout):
    # per-batch positions [B, 1, L, r] broadcast by strides, and the gradient of the
    # kernel path against autograd of the loop reference, in float32 on the GPU
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(3, 4, 40, 32, generator=generator)
    positions = torch.randint(0, 4000, (3, 40), generator=generator)
    cos, sin = tables(positions, 32, torch.float32)  # float32 tables rounded once
    want = loop_reference(x.double(), positions, layout)
    got = apply_rope(x.cuda(), cos[:, None].cuda(), sin[:, None].cuda(), layout)
    assert float((got.cpu().double() - want).abs().max()) < 1e-5
    leaf = x.cuda().requires_grad_()
    grad = torch.randn(x.shape, generator=generator)
    apply_rope(leaf, cos[:, None].cuda(), sin[:, None].cuda(), layout).backward(grad.cuda())
    # the gradient of a rotation by θ is the rotation of the upstream gradient by -θ
    reference = loop_reference(grad.double(), -positions, layout)
    assert float((leaf.grad.cpu().double() - reference).abs().max()) < 1e-5
