"""pecode against the reference code of Hugging Face transformers.

These are the independent references for three pieces of pecode that real checkpoints
depend on: T5's relative-position buckets, ALiBi's slopes and the key-form bias that
BLOOM builds in its own dtype, and the RoPE weight permutation from Meta's interleaved
Llama layout to Hugging Face's half layout. The whole module is skipped where
transformers is not installed.
"""

from __future__ import annotations

import importlib
import types

import pytest
import torch

transformers = pytest.importorskip("transformers")

from pecode.alibi import alibi_bias, alibi_slopes  # noqa: E402
from pecode.relative import t5_relative_position_bucket  # noqa: E402
from pecode.rope import convert_qk_weight_layout  # noqa: E402

# ----------------------------------------------------------------------------- T5


@pytest.mark.parametrize(
    ("bidirectional", "num_buckets", "max_distance"),
    [
        (True, 32, 128),  # T5's encoder
        (False, 32, 128),  # T5's decoder
        (True, 64, 256),
        (False, 16, 64),
        (True, 8, 20),
        (True, 33, 100),  # an odd count: the halves are floor(33 / 2)
        (False, 32, 1000),
    ],
)
def test_t5_buckets_equal_hf_relative_position_bucket(bidirectional, num_buckets, max_distance):
    from transformers.models.t5.modeling_t5 import T5Attention

    offsets = torch.arange(-3000, 3001)  # key position - query position, as in both
    ours = t5_relative_position_bucket(
        offsets, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    theirs = T5Attention._relative_position_bucket(
        offsets, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance
    )
    assert torch.equal(ours, theirs)


# -------------------------------------------------------------------------- ALiBi


def _hf_slopes(num_heads: int) -> torch.Tensor:
    """The slopes inside HF's BLOOM ``build_alibi_tensor``: its bias at key 1 is m * 1."""
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    mask = torch.ones(1, 2, dtype=torch.long)
    return build_alibi_tensor(mask, num_heads, torch.float32)[:, 0, 1]


def test_alibi_slopes_equal_hf_build_alibi_tensor_for_1_to_128_heads():
    # HF raises a float32 base to integer powers in float32, which is off by a few units
    # in the last place (relative error up to 7e-7 here); pecode rounds the exact power of
    # two once. Neighbouring slopes differ by a factor of at least 2^(-8/128) ~ 0.958, so
    # rtol=2e-6 still tells apart any wrong exponent or head order.
    for n in range(1, 129):
        theirs = _hf_slopes(n).double()
        ours = alibi_slopes(n, dtype=torch.float64)
        assert ours.shape == theirs.shape, n
        assert torch.allclose(ours, theirs, rtol=2e-6, atol=0), n


def test_hf_bloom_key_form_in_bfloat16_misweights_the_attention():
    # BLOOM (112 heads, trained at 2048 tokens in bfloat16) builds the key form m*j with
    # HF's build_alibi_tensor in the model's dtype. With equal content scores its last
    # query's weights, softmax in float64, are off by more than 0.5 against the exact bias
    # (chapter 6, ch06-check-precision, measures the same with pecode's key form).
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    heads, length = 112, 2048
    stored = build_alibi_tensor(torch.ones(1, length, dtype=torch.long), heads, torch.bfloat16)
    assert stored.dtype == torch.bfloat16
    exact = alibi_bias(heads, 1, length, dtype=torch.float64).softmax(-1)
    error = (stored.double().softmax(-1) - exact).abs().max().item()
    assert error > 0.5
    # in float32 the same tensor is off by rounding only (2e-5 here: float32 numbers
    # just below 2048 are 2^-13 apart, and 112 heads have slopes that are not powers of 2)
    stored32 = build_alibi_tensor(torch.ones(1, length, dtype=torch.long), heads, torch.float32)
    assert (stored32.double().softmax(-1) - exact).abs().max().item() < 1e-4


# --------------------------------------------------------------------------- RoPE

LLAMA_SCRIPT = "transformers.models.llama.convert_llama_weights_to_hf"


def _code_objects(code: types.CodeType):
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield const
            yield from _code_objects(const)


def hf_llama_permute(module: types.ModuleType):
    """The ``permute`` of HF's Llama conversion script, or None if it has none.

    The script defines it inside ``write_model`` (its defaults read the model's size), so
    it is not a module attribute: this rebuilds that very function from its code object,
    without defaults, and every argument is passed explicitly.
    """
    for value in vars(module).values():
        if isinstance(value, types.FunctionType) and value.__module__ == module.__name__:
            for code in _code_objects(value.__code__):
                if code.co_name == "permute" and not code.co_freevars:
                    return types.FunctionType(code, vars(module), "permute")
    return None


def check_layout_conversion_equals(permute) -> None:
    """``convert_qk_weight_layout(w, H, "interleaved", "half")`` == HF's ``permute``."""
    generator = torch.Generator().manual_seed(0)
    for heads, head_dim, in_features in [(1, 2, 3), (2, 8, 16), (4, 6, 10), (3, 16, 5)]:
        rows = heads * head_dim
        weight = torch.randn(rows, in_features, generator=generator, dtype=torch.float64)
        theirs = permute(weight, heads, rows, in_features)
        ours = convert_qk_weight_layout(weight, heads, "interleaved", "half")
        assert torch.equal(ours, theirs), (heads, head_dim)
        # and back: the round trip is the identity
        back = convert_qk_weight_layout(ours, heads, "half", "interleaved")
        assert torch.equal(back, weight)


def test_convert_qk_weight_layout_equals_hf_llama_conversion_permute():
    try:
        module = importlib.import_module(LLAMA_SCRIPT)
    except ImportError as error:  # the script left transformers in version 5
        pytest.skip(
            f"transformers {transformers.__version__} has no importable {LLAMA_SCRIPT} "
            f"({error.__class__.__name__}: {error})"
        )
    permute = hf_llama_permute(module)
    if permute is None:
        pytest.skip(f"{LLAMA_SCRIPT} defines no permute function")
    check_layout_conversion_equals(permute)
