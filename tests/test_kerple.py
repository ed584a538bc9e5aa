"""pecode.kerple against a float64 loop written from the authors' code, and ALiBi."""

from __future__ import annotations

import math

import pytest
import torch

from pecode.alibi import ALiBi
from pecode.attention import MultiHeadAttention
from pecode.kerple import Kerple, kerple_bias


def _loop(kind, scale, shape, q_positions, k_positions):
    """The authors' kernels, one entry at a time: -p·log(1 + a·d) and -a·d^p, with their
    clamps (at least 0.01; the power at most 2)."""
    out = []
    for r1, r2 in zip(scale, shape, strict=True):
        r1 = max(r1, 0.01)
        r2 = max(r2, 0.01) if kind == "log" else min(max(r2, 0.01), 2.0)
        rows = []
        for i in q_positions:
            row = []
            for j in k_positions:
                d = abs(i - j)
                row.append(-r1 * math.log(1 + r2 * d) if kind == "log" else -r1 * d**r2)
            rows.append(row)
        out.append(rows)
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("kind", ["log", "power"])
def test_bias_equals_the_loop_written_from_the_authors_code(kind):
    torch.manual_seed(0)
    scheme = Kerple(3, kind).double()
    with torch.no_grad():
        scheme.scale[0] = 0.001  # below the clamp
        scheme.shape[1] = 3.0  # above the power's clamp
    qp, kp = torch.arange(2, 9), torch.arange(0, 9)
    q = torch.zeros(1, 3, len(qp), 4, dtype=torch.float64)
    got = scheme.score_bias(q, q, qp, kp)
    want = _loop(kind, scheme.scale.tolist(), scheme.shape.tolist(), qp.tolist(), kp.tolist())
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_the_power_kernel_with_exponent_one_is_alibi():
    """ALiBi's slopes as r1 and r2 = 1: the same attention as pecode's ALiBi (causal).
    Slopes at least 0.01 (the authors' clamp: ALiBi's own 1/256 is below)."""
    torch.manual_seed(0)
    kerple = Kerple(4, "power")
    alibi = ALiBi(4, slopes=[0.5, 0.25, 0.125, 0.0625])
    with torch.no_grad():
        kerple.scale.copy_(alibi.slopes)
        kerple.shape.fill_(1.0)
    x = torch.randn(2, 7, 16, generator=torch.manual_seed(1))
    torch.manual_seed(2)
    a = MultiHeadAttention(16, 4, position=kerple)
    torch.manual_seed(2)
    b = MultiHeadAttention(16, 4, position=alibi)
    torch.testing.assert_close(a(x, causal=True), b(x, causal=True), atol=1e-6, rtol=1e-6)
    with torch.no_grad():
        kerple.shape.fill_(1.5)  # the false neighbour: another exponent is not ALiBi
    assert (a(x, causal=True) - b(x, causal=True)).abs().max() > 1e-3


def test_both_parameters_learn():
    scheme = Kerple(2, "log")
    layer = MultiHeadAttention(8, 2, position=scheme)
    layer(torch.randn(1, 5, 8), causal=True).sum().backward()
    assert scheme.scale.grad.abs().sum() > 0
    assert scheme.shape.grad.abs().sum() > 0


def test_initialization_follows_the_authors():
    torch.manual_seed(0)
    log, power = Kerple(1000, "log"), Kerple(1000, "power")
    pairs = ((log.scale, log.shape), (power.shape, power.scale))
    for wide, narrow in ((a.detach(), b.detach()) for a, b in pairs):
        assert 1.9 < float(wide.max()) <= 2.0
        assert float(wide.min()) >= 0.0
        assert 0.9 < float(narrow.max()) <= 1.0


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match="kind"):
        Kerple(2, "cosine")
    with pytest.raises(TypeError, match="num_heads"):
        Kerple(2.0)
    with pytest.raises(TypeError, match="distance"):
        kerple_bias("log", torch.zeros(2, 2), torch.ones(1), torch.ones(1))
    with pytest.raises(ValueError, match="heads"):
        Kerple(3).score_bias(torch.zeros(1, 2, 4, 8), None, torch.arange(4), torch.arange(4))
    assert repr(Kerple(2, "power")) == "Kerple(num_heads=2, kind='power')"
