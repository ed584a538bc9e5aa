"""MultiHeadAttention's FlexAttention path (pecode.flex) against its dense path in float64.

The dense path folds the scheme's ``score_bias`` into a float mask for SDPA and is checked
against float64 loops elsewhere (test_alibi, test_relative_t5, test_kerple, test_sandwich). Here the
FlexAttention path, which reads ``offset_bias`` tables instead, is compared with that path
computed in float64, for every offset scheme and every mask the layer folds. Every test
that expects FlexAttention also counts its calls, so a silent fallback cannot pass.
All shapes stay in one length bucket (128) to keep the compiles few.
"""

from __future__ import annotations

import pytest
import torch

import pecode.attention as attention
import pecode.flex as flex
from pecode.alibi import ALiBi
from pecode.attention import KVCache, MultiHeadAttention
from pecode.kerple import Kerple
from pecode.relative.t5 import T5RelativePositionBias
from pecode.rope import RotaryEmbedding
from pecode.sandwich import Sandwich

SCHEMES = {
    "alibi": lambda: ALiBi(4),
    "alibi_symmetric": lambda: ALiBi(4, symmetric=True),
    "t5_decoder": lambda: T5RelativePositionBias(4, bidirectional=False, scale_logits=True),
    "t5_encoder": lambda: T5RelativePositionBias(4, scale_logits=True),
    "kerple_log": lambda: Kerple(4, "log"),
    "kerple_power": lambda: Kerple(4, "power"),
    "sandwich": lambda: Sandwich(4, d_bar=16),
}


NO_FLEX = flex.flex_unsupported(torch.zeros(1, 1, 1, 1), needs_grad=False)
needs_flex = pytest.mark.skipif(NO_FLEX is not None, reason=str(NO_FLEX))


@pytest.fixture
def flex_calls(monkeypatch):
    """The number of times the layer ran FlexAttention (skips where it cannot run)."""
    if NO_FLEX is not None:
        pytest.skip(NO_FLEX)
    calls = []
    original = attention.offset_bias_attention

    def counted(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(attention, "offset_bias_attention", counted)
    return calls


def _pair(scheme_name: str, num_kv_heads: int = 4, **options):
    """A layer with ``kernel="flex"`` and the same weights in float64, dense."""
    torch.manual_seed(0)
    layer = MultiHeadAttention(
        16, 4, num_kv_heads=num_kv_heads, position=SCHEMES[scheme_name](), kernel="flex", **options
    )
    with torch.no_grad():  # learned biases away from their initial values
        for p in layer.position.parameters():
            p.uniform_(0.1, 1.5)
    reference = MultiHeadAttention(
        16, 4, num_kv_heads=num_kv_heads, position=SCHEMES[scheme_name](), kernel="dense", **options
    ).double()
    reference.load_state_dict(layer.state_dict())
    return layer, reference


def _compare(layer, reference, x, **kwargs):
    with torch.no_grad():
        out = layer(x, **kwargs)
        expected = reference(x.double(), **{k: _double(v) for k, v in kwargs.items()})
    torch.testing.assert_close(out.double(), expected, atol=2e-5, rtol=1e-5)


def _double(value):
    if isinstance(value, torch.Tensor) and value.is_floating_point():
        return value.double()
    return value


@pytest.mark.parametrize("scheme_name", list(SCHEMES))
@pytest.mark.parametrize("causal", [True, False])
def test_flex_equals_the_dense_path_in_float64(scheme_name, causal, flex_calls):
    layer, reference = _pair(scheme_name)
    x = torch.randn(2, 40, 16)
    _compare(layer, reference, x, causal=causal)
    assert len(flex_calls) == 1


@pytest.mark.parametrize("scheme_name", ["alibi", "t5_decoder"])
def test_flex_with_grouped_query_heads_equals_the_dense_path(scheme_name, flex_calls):
    layer, reference = _pair(scheme_name, num_kv_heads=2)
    _compare(layer, reference, torch.randn(2, 40, 16), causal=True)
    assert len(flex_calls) == 1


@pytest.mark.parametrize(
    "options", [{"window": 7}, {"chunk": 16}, {"window": 9, "chunk": 12}], ids=str
)
def test_flex_windows_and_chunks_equal_the_dense_path(options, flex_calls):
    layer, reference = _pair("kerple_log", **options)
    positions = torch.tensor([[*range(3, 43)], [*range(100, 140)]])  # rows at other offsets
    _compare(layer, reference, torch.randn(2, 40, 16), causal=True, positions=positions)
    assert len(flex_calls) == 1


def test_flex_with_a_key_padding_mask_equals_the_dense_path(flex_calls):
    layer, reference = _pair("alibi_symmetric")
    keep = torch.ones(2, 40, dtype=torch.bool)
    keep[0, :5] = False  # left padding of row 0
    keep[1, 30:] = False  # right padding of row 1
    _compare(layer, reference, torch.randn(2, 40, 16), attn_mask=keep[:, None, None, :])
    assert len(flex_calls) == 1


def test_flex_with_a_per_head_query_key_mask_equals_the_dense_path(flex_calls):
    layer, reference = _pair("t5_encoder")
    mask = torch.rand(1, 4, 40, 40) > 0.3
    mask[..., 0] = True  # every query sees a key
    _compare(layer, reference, torch.randn(2, 40, 16), attn_mask=mask)
    assert len(flex_calls) == 1


def test_flex_after_a_cache_prefill_equals_the_dense_path(flex_calls):
    """The second piece's queries are the last 8 of 48 keys (causal offset 40)."""
    layer, reference = _pair("alibi")
    x = torch.randn(2, 48, 16)
    with torch.no_grad():
        cache, cache64 = KVCache(), KVCache()
        outs = [
            layer(x[:, :40], causal=True, cache=cache),
            layer(x[:, 40:], causal=True, cache=cache),
        ]
        expected = [
            reference(x[:, :40].double(), causal=True, cache=cache64),
            reference(x[:, 40:].double(), causal=True, cache=cache64),
        ]
    torch.testing.assert_close(
        torch.cat(outs, 1).double(), torch.cat(expected, 1), atol=2e-5, rtol=1e-5
    )
    assert len(flex_calls) == 2


def test_flex_in_bfloat16_is_within_bfloat16_rounding_of_float64(flex_calls):
    layer, reference = _pair("kerple_power")
    x = torch.randn(2, 40, 16)
    with torch.no_grad():
        out = layer.to(torch.bfloat16)(x.to(torch.bfloat16), causal=True)
        expected = reference(x.double(), causal=True)
    # bfloat16 keeps 8 bits: projections, scores and output are each rounded once or twice
    torch.testing.assert_close(out.double(), expected, atol=3e-2, rtol=3e-2)
    assert len(flex_calls) == 1


def test_training_on_the_cpu_takes_the_dense_path_with_its_gradients(flex_calls):
    """FlexAttention has no backward on the CPU: the gradients are the dense path's."""
    layer, _ = _pair("t5_decoder")
    dense = MultiHeadAttention(
        16, 4, position=SCHEMES["t5_decoder"](), kernel="dense"
    ).requires_grad_(True)
    dense.load_state_dict(layer.state_dict())
    x = torch.randn(2, 40, 16)
    layer(x, causal=True).square().sum().backward()
    dense(x, causal=True).square().sum().backward()
    for (name, p), q in zip(layer.named_parameters(), dense.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=0, rtol=0, msg=name)
    assert flex_calls == []


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="FlexAttention's backward needs CUDA")
@pytest.mark.parametrize("scheme_name", ["alibi", "t5_decoder", "kerple_log"])
def test_flex_backward_on_cuda_equals_the_dense_path(scheme_name, flex_calls):
    """Gradients reach q, k, v and a learned bias table through FlexAttention."""
    layer, _ = _pair(scheme_name)
    dense = MultiHeadAttention(16, 4, position=SCHEMES[scheme_name](), kernel="dense")
    dense.load_state_dict(layer.state_dict())
    layer, dense = layer.cuda(), dense.cuda()
    x = torch.randn(2, 300, 16).cuda()
    torch.testing.assert_close(layer(x, causal=True), dense(x, causal=True), atol=1e-5, rtol=1e-5)
    layer(x, causal=True).square().sum().backward()
    dense(x, causal=True).square().sum().backward()
    for (name, p), q in zip(layer.named_parameters(), dense.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-4, msg=name)
    assert len(flex_calls) >= 2


def test_auto_takes_flex_only_from_its_threshold_on(monkeypatch, flex_calls):
    layer, reference = _pair("alibi")
    layer.kernel = "auto"
    x = torch.randn(2, 40, 16)
    _compare(layer, reference, x, causal=True)
    assert flex_calls == []  # 40·40 pairs: below 2048², dense
    monkeypatch.setattr(attention, "_AUTO_FLEX_ENTRIES", 40 * 40)
    _compare(layer, reference, x, causal=True)
    assert len(flex_calls) == 1


@needs_flex
def test_auto_falls_back_to_the_dense_path_with_a_warning_when_flex_fails(monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(attention, "offset_bias_attention", broken)
    monkeypatch.setattr(attention, "_AUTO_FLEX_ENTRIES", 1)
    monkeypatch.setattr(attention, "_FLEX_FAILED", False)
    monkeypatch.setattr(attention, "_FLEX_WARNED", set())
    layer, reference = _pair("alibi")
    layer.kernel = "auto"
    with pytest.warns(RuntimeWarning, match="no C.. compiler"):
        _compare(layer, reference, torch.randn(2, 40, 16), causal=True)
    assert attention._FLEX_FAILED
    _compare(layer, reference, torch.randn(2, 40, 16), causal=True)  # no second warning


def test_what_flex_cannot_compute_on_the_cpu_is_named(monkeypatch):
    q = torch.zeros(1, 1, 2, 4)
    monkeypatch.setattr(flex, "_torch_version", lambda: (2, 13))  # the rules after 2.9
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    assert "AVX2" in flex.flex_unsupported(q, needs_grad=False)  # PyTorch's own rule
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX2")
    assert flex.flex_unsupported(q, needs_grad=False) is None
    assert "backward" in flex.flex_unsupported(q, needs_grad=True)
    assert "float64" in flex.flex_unsupported(q.double(), needs_grad=False)


def test_bad_kernel_arguments_are_refused():
    with pytest.raises(ValueError, match="kernel must be one of"):
        MultiHeadAttention(16, 4, kernel="triton")
    with pytest.raises(ValueError, match=r"kernel='flex'.*RotaryEmbedding"):
        MultiHeadAttention(16, 4, position=RotaryEmbedding(4), kernel="flex")
    with pytest.raises(ValueError, match="softcap"):
        MultiHeadAttention(16, 4, position=ALiBi(4), kernel="flex", softcap=30.0)


def test_a_table_too_short_for_the_positions_is_refused():
    q = torch.zeros(1, 1, 4, 8)
    with pytest.raises(ValueError, match="table covers offsets"):
        flex.offset_bias_attention(
            q, q, q, torch.zeros(1, 3), 0, torch.arange(4), torch.arange(4), scale=1.0, causal=True
        )


@pytest.mark.parametrize("scheme_name", list(SCHEMES))
def test_offset_table_equals_score_bias_entry_by_entry(scheme_name):
    """The table FlexAttention reads against the bias the dense path adds."""
    torch.manual_seed(1)
    scheme = SCHEMES[scheme_name]()
    q = torch.zeros(1, 4, 6, 8)
    qp, kp = torch.tensor([3, 5, 8, 13, 21, 34]), torch.tensor([0, 1, 2, 3, 5, 8, 13, 21, 34])
    dense = scheme.score_bias(q, q, qp, kp)
    low, high = flex.offset_range(qp, kp)
    table = scheme.offset_bias(q, torch.arange(low, high + 1))
    looked_up = table[:, (qp[:, None] - kp[None, :]) - low]
    # one float32 rounding apart at most: pow on a row and on a matrix may round differently
    torch.testing.assert_close(looked_up, dense, atol=0, rtol=2.4e-7)


@needs_flex
@pytest.mark.parametrize("kernel", ["flex", "auto"])
def test_the_recompile_limit_means_the_dense_path_with_one_warning(monkeypatch, kernel):
    def limited(*args, **kwargs):
        raise flex.FlexRecompileLimit("recompile_limit reached")

    monkeypatch.setattr(attention, "offset_bias_attention", limited)
    monkeypatch.setattr(attention, "_AUTO_FLEX_ENTRIES", 1)
    monkeypatch.setattr(attention, "_FLEX_FAILED", False)
    monkeypatch.setattr(attention, "_FLEX_WARNED", set())
    layer, reference = _pair("alibi")
    layer.kernel = kernel
    with pytest.warns(RuntimeWarning, match="recompile_limit"):
        _compare(layer, reference, torch.randn(2, 40, 16), causal=True)
    _compare(layer, reference, torch.randn(2, 40, 16), causal=True)  # no second warning
    assert not attention._FLEX_FAILED  # a later call may still compile


@needs_flex
def test_torch_at_its_recompile_limit_raises_instead_of_running_uncompiled():
    """Uncompiled, FlexAttention would compute every score: more memory than the mask."""
    import torch._dynamo

    if not hasattr(torch._dynamo.config, "fail_on_recompile_limit_hit"):
        pytest.skip("this PyTorch cannot refuse to run uncompiled")
    positions = torch.arange(40)

    def call(head_dim):
        q = torch.randn(1, 2, 40, head_dim)
        table = torch.zeros(2, 79)
        flex.offset_bias_attention(
            q, q, q, table, -39, positions, positions, scale=1.0, causal=True
        )

    with torch._dynamo.config.patch(recompile_limit=1):
        # two shapes no other test uses: the second is a recompile at the latest
        try:
            call(24)
        except flex.FlexRecompileLimit:
            return
        with pytest.raises(flex.FlexRecompileLimit):
            call(40)


def test_lengths_batches_and_spans_in_one_bucket_share_one_compiled_kernel(flex_calls):
    import torch._dynamo.utils

    layer, reference = _pair("alibi")
    _compare(layer, reference, torch.randn(3, 40, 16), causal=True)
    graphs = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for batch, length in ((4, 41), (4, 70), (3, 127)):  # batch bucket 4, length 128
        _compare(layer, reference, torch.randn(batch, length, 16), causal=True)
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == graphs
    assert len(flex_calls) == 4


def test_rows_far_apart_take_the_dense_path(flex_calls):
    """One table serves every row: rows 10**6 positions apart would need one that wide."""
    layer, reference = _pair("alibi")
    positions = torch.stack([torch.arange(40), torch.arange(40) + 10**6])
    _compare(layer, reference, torch.randn(2, 40, 16), causal=True, positions=positions)
    assert flex_calls == []


def test_a_subclass_that_changes_the_bias_has_no_table():
    class Steeper(ALiBi):
        def score_bias(self, q, k, q_positions, k_positions):
            return 2 * super().score_bias(q, k, q_positions, k_positions)

    assert ALiBi(4).has_offset_bias
    assert not Steeper(4).has_offset_bias
    with pytest.raises(ValueError, match="kernel='flex'"):
        MultiHeadAttention(16, 4, position=Steeper(4), kernel="flex")


def test_no_cpu_flexattention_before_pytorch_2_9(monkeypatch):
    """PyTorch 2.7's and 2.8's Inductor emit C++ for CPU FlexAttention that gcc rejects
    (a bare flex_attention call fails there, 2.9 and 2.13 compile it): pecode names the
    version and the layer takes its dense path."""
    q = torch.zeros(1, 1, 4, 8)
    monkeypatch.setattr(flex, "_torch_version", lambda: (2, 8))
    assert "2.9 or later" in flex.flex_unsupported(q, needs_grad=False)
    monkeypatch.setattr(flex, "_torch_version", lambda: (2, 9))
    assert "2.9" not in str(flex.flex_unsupported(q, needs_grad=False))
