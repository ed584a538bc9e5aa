"""Reproductions for errata of source 000 that no notebook cell decides.

Source 000 is *位置编码/绝对位置编码/相对位置编码/Rope原理+公式详细推导及代码实现*. Each test
re-expresses the behaviour of the article's listing or derivation step in a few lines of
our own, contrasts it with pecode or with a hand-worked case, and names the errata entry
(``book/errata.md``) it decides.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

from pecode.attention import MultiHeadAttention
from pecode.reference import multi_head_attention_loop
from pecode.relative import ShawRelativePosition, shaw_relative_index
from pecode.rope import rotate_half


def _gpu(kind: str) -> contextlib.AbstractContextManager:
    """A context in which ``device="cuda"`` works: a real GPU, or PyTorch's fake tensors.

    Fake tensors carry a device and apply the dispatcher's device checks without
    computing anything, so a device mismatch raises as it would on a GPU.
    """
    if kind == "gpu":
        if not torch.cuda.is_available():
            pytest.skip("needs a CUDA device")
        return contextlib.nullcontext()
    return FakeTensorMode()


@pytest.mark.parametrize("kind", ["fake-gpu", pytest.param("gpu", marks=pytest.mark.cuda)])
def test_relative_index_device(kind):
    """errata-000-relative-index-device: an index built without ``device=`` stays on the CPU.

    The listing builds its offset matrix from ``torch.arange(seq_len)`` and looks it up
    in ``nn.Embedding`` tables that live on the model's device. An embedding lookup
    needs the index on the table's device, so the lookup fails on a GPU; built from
    positions on the table's device it works.
    """
    length, k = 6, 3
    with _gpu(kind):
        table = torch.zeros(2 * k + 1, 8, device="cuda")
        cpu_positions = torch.arange(length)  # no device=, as in the listing
        cpu_index = shaw_relative_index(cpu_positions, cpu_positions, k)
        assert cpu_index.device.type == "cpu"
        # torch 2.13 says "same device"; fake tensors of torch 2.7-2.12 "different devices"
        with pytest.raises(RuntimeError, match=r"same device|different devices"):
            F.embedding(cpu_index, table)
        positions = torch.arange(length, device=table.device)
        looked_up = F.embedding(shaw_relative_index(positions, positions, k), table)
        assert looked_up.device == table.device
        assert tuple(looked_up.shape) == (length, length, 8)
    if kind == "gpu":
        # pecode's Shaw layer builds its positions on the input's device: it runs on
        # the GPU and gives the CPU's numbers.
        gen = torch.Generator().manual_seed(0)
        layer = MultiHeadAttention(16, 2, position=ShawRelativePosition(8, k)).double()
        x = torch.randn(2, length, 16, generator=gen, dtype=torch.float64)
        with torch.no_grad():
            on_cpu = layer(x, causal=True)
            on_gpu = layer.to("cuda")(x.to("cuda"), causal=True)
        assert torch.allclose(on_gpu.cpu(), on_cpu, atol=1e-10)


def test_mask_fp16():
    """errata-000-mask-fp16: ``masked_fill_(mask == 0, -1e9)`` overflows float16.

    Both attention listings mask their logits with ``-1e9``. float16's largest finite
    value is 65504, so the fill raises in float16 (the logits' dtype under float16
    autocast); it works in bfloat16, whose range reaches 3e38. pecode's masks use
    ``-inf``, and its layer in float16 with a causal mask agrees with a float64 loop.
    """
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(6, 6, generator=gen)
    allowed = torch.ones(6, 6, dtype=torch.bool).tril()
    assert torch.finfo(torch.float16).min > -1e9  # -65504: -1e9 is out of range
    with pytest.raises(RuntimeError, match="overflow"):
        logits.half().masked_fill(~allowed, -1e9)
    in_bf16 = logits.bfloat16().masked_fill(~allowed, -1e9).float().softmax(-1)
    assert torch.equal(in_bf16[~allowed], torch.zeros(int((~allowed).sum())))

    layer = MultiHeadAttention(16, 2)
    x = torch.randn(2, 6, 16, generator=gen)
    reference = multi_head_attention_loop(layer, x.double(), causal=True)
    with torch.no_grad():
        out = layer.half()(x.half(), causal=True)
    assert out.dtype == torch.float16
    assert torch.allclose(out.double(), reference, atol=2e-3)


# RotateHalf for d = 4 written out by hand: (x1, x2, x3, x4) -> (-x3, -x4, x1, x2).
ROTATE_HALF_4 = torch.tensor(
    [[0, 0, -1, 0], [0, 0, 0, -1], [1, 0, 0, 0], [0, 1, 0, 0]], dtype=torch.float64
)
# Swapping the halves without a sign: (x1, x2, x3, x4) -> (x3, x4, x1, x2).
SWAP_HALVES_4 = torch.tensor(
    [[0, 0, 1, 0], [0, 0, 0, 1], [1, 0, 0, 0], [0, 1, 0, 0]], dtype=torch.float64
)


@pytest.mark.parametrize(
    ("matrix", "sign"),
    [(ROTATE_HALF_4, -1.0), (SWAP_HALVES_4, 1.0)],
    ids=["rotate-half", "swap-halves"],
)
def test_rotate_half_orthogonality(matrix, sign):
    """errata-000-rotate-half-orthogonality: step 2's sign comes from skew-symmetry.

    Source 000 derives q·RotateHalf(k) = -RotateHalf(q)·k "from orthogonality". Both
    matrices here are orthogonal; the identity q·Mk = -Mq·k holds for RotateHalf,
    which is skew-symmetric, and fails for the symmetric half swap, for which
    q·Mk = +Mq·k.
    """
    eye = torch.eye(4, dtype=torch.float64)
    # pecode's rotate_half is the hand-written matrix (rows of rotate_half(I) are M e_i)
    assert torch.equal(rotate_half(eye).T, ROTATE_HALF_4)
    assert torch.equal(matrix.T @ matrix, eye)  # orthogonal, both of them
    assert torch.equal(matrix.T, sign * matrix)  # skew (-1) or symmetric (+1)
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(2, 4, generator=gen, dtype=torch.float64)
    assert torch.isclose(q @ (matrix @ k), sign * (matrix @ q) @ k, atol=1e-12)
    step_two_holds = torch.isclose(q @ (matrix @ k), -(matrix @ q) @ k, atol=1e-12)
    assert bool(step_two_holds) == (sign == -1.0)
