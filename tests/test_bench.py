"""pecode.bench: the harness measures what it says. No test asserts a time."""

from __future__ import annotations

import math

import pytest
import torch

from pecode import bench
from pecode.relative import peak_tensor_memory


def test_median_time_is_positive_and_checks_its_arguments():
    assert bench.median_time(lambda: torch.ones(3).sum(), min_run_time=0.01) > 0
    with pytest.raises(TypeError, match="fn"):
        bench.median_time(3)
    with pytest.raises(ValueError, match="min_run_time"):
        bench.median_time(lambda: None, min_run_time=0)
    with pytest.raises(ValueError, match="num_threads"):
        bench.median_time(lambda: None, num_threads=0)


def test_bench_rope_rows_ratios_and_memory():
    shape = (1, 2, 16, 8)
    rows = bench.bench_rope(shape, min_run_time=0.01)
    by_name = {r.method: r for r in rows}
    assert list(by_name) == [
        "rope: clone",
        "rope: copy_",
        "rope half: apply_rope",
        "rope interleaved: apply_rope",
        "rope: textbook",
    ]
    clone, textbook = by_name["rope: clone"], by_name["rope: textbook"]
    assert clone.ratio == 1.0
    for r in rows:  # ratios are the medians' quotients, measured in the same run
        assert math.isclose(r.ratio, r.median_s / clone.median_s)
        assert math.isclose(r.textbook_ratio, r.median_s / textbook.median_s)
    out_bytes = 2 * math.prod(shape) * 4
    assert clone.peak_bytes == out_bytes  # two new tensors, nothing else
    assert by_name["rope: copy_"].peak_bytes == 0  # writes into existing tensors
    for layout in ("half", "interleaved"):
        fast = by_name[f"rope {layout}: apply_rope"]
        # the fast path allocates the outputs and small tables; the textbook's
        # temporaries are full size
        assert out_bytes <= fast.peak_bytes < textbook.peak_bytes
        assert fast.max_error <= 1e-6


def test_bench_rope_rejects_bad_shapes():
    with pytest.raises(ValueError, match="shape"):
        bench.bench_rope((2, 16, 8))
    with pytest.raises(ValueError, match="shape"):
        bench.bench_rope((1, 2, 16, 7))


def test_bench_shaw_gather_form_needs_less_memory():
    direct, gather = bench.bench_shaw(64, heads=2, head_dim=16, max_distance=4, min_run_time=0.01)
    # the direct form holds an [L, L, Dh] float32 tensor: 64 * 64 * 16 * 4 bytes
    assert direct.peak_bytes >= 64 * 64 * 16 * 4
    assert gather.peak_bytes < direct.peak_bytes / 2
    assert gather.max_error < 1e-4
    assert direct.ratio == 1.0


def test_bench_bias_attention_same_numbers_less_memory():
    rows = bench.bench_bias_attention(64, heads=2, head_dim=8, min_run_time=0.01)
    assert [r.method for r in rows] == [
        "alibi attention: by hand",
        "alibi attention: sdpa",
        "t5 attention: by hand",
        "t5 attention: sdpa",
    ]
    for by_hand, sdpa in (rows[:2], rows[2:]):
        assert sdpa.max_error < 1e-4
        # by hand holds the [1, H, L, L] logits (and probabilities)
        assert by_hand.peak_bytes >= 2 * 64 * 64 * 4


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
    rows = bench.encoding_costs([length], dim=dim, heads=heads, max_distance=k, min_run_time=0.01)
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


def test_format_table_and_main(capsys):
    rows = bench.main(["--quick", "--min-run-time", "0.01"])
    text = capsys.readouterr().out
    assert "rope half: apply_rope" in text
    assert "shaw key+value: gather" in text
    assert bench.format_table(rows).splitlines()[0].startswith("method")


def test_peak_memory_of_a_clone_is_its_size():
    x = torch.randn(10, 10)
    assert peak_tensor_memory(lambda: x.clone()) == 400
