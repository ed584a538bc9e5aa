"""RotaryEmbedding and ALiBi as real models use them: meta-device initialisation, far
positions, dynamic NTK decoding, and Hugging Face's ``rotary_emb(x, position_ids)`` call.

The references are a module built the ordinary way (for meta initialisation), the
float64 loops of :mod:`pecode.reference` (for the rows of a far position and of dynamic
NTK at each decoding step), and Hugging Face transformers' ``LlamaRotaryEmbedding`` and
``apply_rotary_pos_emb`` (for the ``forward`` contract and dynamic NTK's rule over a
sequence of calls). The transformers tests are skipped where it is not installed.
"""

from __future__ import annotations

import math

import pytest
import torch

import pecode.rope
from pecode.alibi import ALiBi, alibi_slopes
from pecode.attention import MultiHeadAttention
from pecode.reference.rope import rope_inv_freq_loop, rope_loop
from pecode.reference.scaling import dynamic_inv_freq_loop
from pecode.rope import TABLE_ROWS_ALWAYS_CACHED, RotaryEmbedding

F64 = torch.float64

# --- meta-device initialisation ----------------------------------------------------------

YARN = {"factor": 4.0, "original_max_position_embeddings": 8}
DYNAMIC = {"factor": 2.0, "original_max_position_embeddings": 8}
LONGROPE = {
    "short_factor": [1.0, 1.1, 1.2, 1.3],
    "long_factor": [1.0, 2.0, 4.0, 8.0],
    "original_max_position_embeddings": 8,
    "factor": 4.0,
}

SCHEMES = {
    "rope": lambda: RotaryEmbedding(8, initial_positions=16),
    "rope interleaved partial": lambda: RotaryEmbedding(
        8, layout="interleaved", rotary_dim=4, initial_positions=16
    ),
    "rope float64": lambda: RotaryEmbedding(8, initial_positions=16, dtype=F64),
    "rope yarn": lambda: RotaryEmbedding(
        8, initial_positions=16, scaling="yarn", scaling_params=YARN
    ),
    "rope dynamic": lambda: RotaryEmbedding(
        8, initial_positions=16, scaling="dynamic", scaling_params=DYNAMIC
    ),
    "rope longrope": lambda: RotaryEmbedding(
        8, initial_positions=16, scaling="longrope", scaling_params=LONGROPE
    ),
    "alibi": lambda: ALiBi(2),
    "alibi symmetric": lambda: ALiBi(2, symmetric=True),
    "alibi custom slopes": lambda: ALiBi(2, slopes=[0.3, 0.7]),
}


def _layer(scheme: str) -> MultiHeadAttention:
    return MultiHeadAttention(16, 2, position=SCHEMES[scheme]())


def _outputs(layer: MultiHeadAttention) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 12, 16, generator=gen)
    with torch.no_grad():
        return [
            layer(x, causal=True),
            layer(x[:, :3], positions=torch.arange(3) + 9, causal=True),  # within the tables
            layer(x[:, :1], positions=torch.tensor([40])),  # past them
        ]


@pytest.mark.parametrize("scheme", list(SCHEMES))
@pytest.mark.parametrize("assign", [False, True], ids=["to_empty", "assign"])
def test_meta_initialisation_gives_the_module_built_normally(scheme, assign):
    # The pattern of large models: build on "meta" (no memory), give it memory with
    # to_empty(), load the weights. The tables and slopes are not in the state dict, so
    # nothing restores them unless the module rebuilds them itself. With assign=True the
    # weights are the state dict's tensors and the buffers are still on "meta".
    torch.manual_seed(0)
    normal = _layer(scheme)
    with torch.device("meta"):
        meta = _layer(scheme)
    if not assign:
        meta.to_empty(device="cpu")
    meta.load_state_dict(normal.state_dict(), assign=assign)
    for got, want in zip(_outputs(meta), _outputs(normal), strict=True):
        assert torch.equal(got, want)
    for name, buffer in normal.named_buffers():
        assert torch.equal(dict(meta.named_buffers())[name], buffer), name


@pytest.mark.parametrize("scheme", ["rope yarn", "alibi custom slopes"])
def test_reset_parameters_rebuilds_the_buffers(scheme):
    normal = SCHEMES[scheme]()
    wrecked = SCHEMES[scheme]()
    for buffer in wrecked.buffers():
        buffer.fill_(float("nan"))
    wrecked.reset_parameters()
    for got, want in zip(wrecked.buffers(), normal.buffers(), strict=True):
        assert torch.equal(got, want)


def test_alibi_slopes_stay_exact_through_a_cast_to_bfloat16():
    # 16 heads: slopes 2^(-k/2), which bfloat16 cannot hold for odd k
    alibi = ALiBi(16).to(torch.bfloat16)
    assert alibi.slopes.dtype == F64
    assert torch.equal(alibi.slopes, alibi_slopes(16, dtype=F64))


def test_custom_slopes_on_meta_are_refused_and_a_list_is_kept():
    with torch.device("meta"):
        with pytest.raises(ValueError, match="list of floats"):
            ALiBi(2, slopes=torch.tensor([0.5, 0.25]))
        alibi = ALiBi(2, slopes=[0.5, 0.25])
    alibi.to_empty(device="cpu")
    assert alibi.slopes.tolist() == [0.5, 0.25]


# --- one token far away: rows for the positions asked, not a table up to them ----------


def _reference_rows(positions: list[int], dim: int, inv_freq=None):
    thetas = rope_inv_freq_loop(dim) if inv_freq is None else [float(t) for t in inv_freq]
    cos = torch.tensor([[math.cos(m * t) for t in thetas] for m in positions], dtype=F64)
    sin = torch.tensor([[math.sin(m * t) for t in thetas] for m in positions], dtype=F64)
    return cos, sin


def test_one_far_position_computes_its_row_and_keeps_no_table_up_to_it():
    # The old tables grew to cover the largest position: 10**6 rows (977 MiB at
    # head_dim 64, float32 cos and sin) for one token.
    rotary = RotaryEmbedding(64)
    far = [10**6, 10**6 + 7]
    cos, sin = rotary.cos_sin(torch.tensor(far))
    assert rotary.cached_positions <= 2 * TABLE_ROWS_ALWAYS_CACHED
    assert rotary.cos_cached.numel() + rotary.sin_cached.numel() <= 4 * 4096 * 32
    want_cos, want_sin = _reference_rows(far, 64)
    # float64 angles rounded once to float32 (the error of cos(1e6) itself is below 1e-9)
    assert float((cos.double() - want_cos).abs().max()) < 1e-7
    assert float((sin.double() - want_sin).abs().max()) < 1e-7
    # a batch of far positions keeps nothing either, and agrees with the reference
    batch = torch.tensor([[2 * 10**6, 2 * 10**6 + 1], [5, 3 * 10**6]])
    cos_b, _ = rotary.cos_sin(batch)
    assert rotary.cached_positions <= 2 * TABLE_ROWS_ALWAYS_CACHED
    want_b, _ = _reference_rows(batch.flatten().tolist(), 64)
    assert float((cos_b.double().flatten(0, 1) - want_b).abs().max()) < 1e-7


def test_contiguous_positions_still_grow_the_table_by_doubling():
    rotary = RotaryEmbedding(8)
    rotary.cos_sin(torch.arange(100))  # a prefill
    assert rotary.cached_positions == 100
    rotary.cos_sin(torch.tensor([100]))  # the first decoding step
    assert rotary.cached_positions == 200
    for step in range(101, 200):  # the next steps look the rows up
        rotary.cos_sin(torch.tensor([step]))
    assert rotary.cached_positions == 200


class _RowCounter:
    """Counts the table rows pecode.rope computes (every row goes through rope_cos_sin)."""

    def __init__(self, monkeypatch):
        self.rows = 0
        original = pecode.rope.rope_cos_sin

        def counting(positions, inv_freq, **kwargs):
            self.rows += positions.numel()
            return original(positions, inv_freq, **kwargs)

        monkeypatch.setattr(pecode.rope, "rope_cos_sin", counting)


def test_far_decoding_computes_one_row_per_step(monkeypatch):
    counter = _RowCounter(monkeypatch)
    rotary = RotaryEmbedding(16, dtype=F64)
    start = 10**6
    for step in range(20):
        before = counter.rows
        cos, _ = rotary.cos_sin(torch.tensor([start + step]))
        assert counter.rows - before == 1
        want, _ = _reference_rows([start + step], 16)
        assert torch.allclose(cos, want, atol=1e-9, rtol=0)


# --- dynamic NTK: O(1) table work per decoding step ------------------------------------


def test_dynamic_ntk_decoding_computes_one_row_per_step_and_equals_the_full_rebuild(
    monkeypatch,
):
    # Each step past the trained length (8) has new frequencies (factor from the current
    # length); the old module rebuilt the whole table at every step (O(L) rows, O(L^2)
    # for a decode), the new one computes the row of the new position.
    counter = _RowCounter(monkeypatch)
    rotary = RotaryEmbedding(16, dtype=F64, scaling="dynamic", scaling_params=DYNAMIC)
    prefill = torch.arange(12)
    cos, sin = rotary.cos_sin(prefill)
    inv = dynamic_inv_freq_loop(16, 10000.0, 2.0, 8, 12)
    want_cos, want_sin = _reference_rows(prefill.tolist(), 16, inv)
    assert torch.allclose(cos, want_cos, atol=1e-12)
    assert torch.allclose(sin, want_sin, atol=1e-12)
    before = counter.rows
    rotary.cos_sin(prefill)  # the same length again (the keys after the queries): a lookup
    assert counter.rows == before
    for position in range(12, 300):
        before = counter.rows
        cos, sin = rotary.cos_sin(torch.tensor([[position], [position]]))  # a batch of 2
        assert counter.rows - before == 2  # the two rows asked for, nothing else
        inv = dynamic_inv_freq_loop(16, 10000.0, 2.0, 8, position + 1)  # the full rebuild
        want_cos, want_sin = _reference_rows([position], 16, inv)
        assert torch.allclose(cos[:, 0], want_cos.expand(2, -1), atol=1e-12, rtol=0)
        assert torch.allclose(sin[:, 0], want_sin.expand(2, -1), atol=1e-12, rtol=0)


# --- Hugging Face's rotary_emb(x, position_ids) -> (cos, sin) ---------------------------


def _hf_rotary(rope_scaling, max_position_embeddings=64, head_dim=32, rope_theta=10000.0):
    pytest.importorskip("transformers")
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = LlamaConfig(
        hidden_size=2 * head_dim,
        num_attention_heads=2,
        max_position_embeddings=max_position_embeddings,
        rope_theta=rope_theta,
        rope_scaling=rope_scaling,
    )
    return LlamaRotaryEmbedding(config)


# (HF rope_scaling block, pecode scaling kind, pecode parameters); max_position_embeddings 64
HF_CASES = {
    "default": ({"rope_type": "default"}, None, None),
    "linear": ({"rope_type": "linear", "factor": 4.0}, "linear", {"factor": 4.0}),
    "yarn": (
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
        "yarn",
        {"factor": 4.0, "original_max_position_embeddings": 64},
    ),
    "llama3": (
        {
            "rope_type": "llama3",
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
        "llama3",
        {
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 16,
        },
    ),
}

# transformers forms the frequencies and the angles in float32; pecode in float64 and
# rounds the tables once. At positions below 200 the angles then differ by at most about
# 200 * 2^-23 * 2 ~ 5e-5; a wrong frequency rule moves them by far more.
HF_ATOL = 1e-4


@pytest.mark.parametrize("case", list(HF_CASES))
def test_forward_equals_hugging_face_llama_rotary_embedding(case):
    block, kind, params = HF_CASES[case]
    hf = _hf_rotary(block)
    ours = RotaryEmbedding(32, scaling=kind, scaling_params=params)
    position_ids = torch.tensor([[0, 1, 2, 50, 51, 52], [7, 8, 9, 10, 150, 199]])
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.zeros(2, 6, 64, dtype=dtype)
        got, want = ours(x, position_ids), hf(x, position_ids)
        for g, w in zip(got, want, strict=True):
            assert g.shape == w.shape == (2, 6, 32)
            assert g.dtype == w.dtype == dtype
            atol = HF_ATOL if dtype == torch.float32 else 2**-8  # one bfloat16 rounding
            assert float((g.float() - w.float()).abs().max()) <= atol, (case, dtype)
    if kind == "yarn":  # the attention factor is in the tables, as HF's attention_scaling
        assert hf.attention_scaling > 1.1
        assert math.isclose(float(ours(x.float(), position_ids)[0][0, 0, 0]), hf.attention_scaling)


def test_forward_tables_rotate_like_rotate_with_hugging_faces_apply_rotary_pos_emb():
    pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    rotary = RotaryEmbedding(8, dtype=F64)
    q, k = torch.randn(2, 3, 2, 5, 8, dtype=F64)  # [B, H, L, Dh] each
    position_ids = torch.tensor([[0, 1, 2, 3, 4], [4, 9, 16, 25, 36], [7, 6, 5, 4, 3]])
    cos, sin = rotary(q, position_ids)
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos, sin)
    q_ours = rotary.rotate(q, position_ids)
    for row in range(3):
        want_q = rope_loop(q[row], position_ids[row], layout="half")
        want_k = rope_loop(k[row], position_ids[row], layout="half")
        assert torch.allclose(q_hf[row], want_q, atol=1e-12)
        assert torch.allclose(k_hf[row], want_k, atol=1e-12)
        assert torch.allclose(q_ours[row], want_q, atol=1e-12)


def test_forward_interleaved_tables_repeat_each_angle_for_its_pair():
    rotary = RotaryEmbedding(8, layout="interleaved", dtype=F64)
    x = torch.randn(1, 1, 4, 8, dtype=F64)
    positions = torch.tensor([3, 5, 7, 11])
    cos, sin = rotary(x, positions[None])
    pairs = x.unflatten(-1, (4, 2))
    rotated_90 = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).flatten(-2)
    got = x * cos[:, None] + rotated_90 * sin[:, None]  # GPT-J's rotate_every_two form
    assert torch.allclose(got, rope_loop(x, positions, layout="interleaved"), atol=1e-12)


def test_forward_errors():
    rotary = RotaryEmbedding(8)
    with pytest.raises(TypeError, match="x must be a floating"):
        rotary(torch.zeros(2, dtype=torch.long), torch.arange(3)[None])
    with pytest.raises(TypeError, match="position_ids"):
        rotary(torch.zeros(2), [[0, 1, 2]])
    with pytest.raises(TypeError, match="position_ids"):
        rotary(torch.zeros(2), torch.tensor([[0.0, 1.0]]))
    with pytest.raises(ValueError, match="position_ids"):
        rotary(torch.zeros(2), torch.tensor(3))
    with pytest.raises(ValueError, match="non-negative"):
        rotary(torch.zeros(2), torch.tensor([[-1, 0]]))


def test_dynamic_ntk_follows_hugging_faces_rule_over_a_sequence_of_calls():
    # HF's dynamic_rope_update: the frequencies are those of the longest length seen, and
    # come back to the original ones only when a call stays below max_position_embeddings.
    # The calls: within, past (prefill), decode steps, a shorter call still past the
    # trained length (kept at the longest length: history matters), a short call (reset),
    # and a long one again.
    hf = _hf_rotary({"rope_type": "dynamic", "factor": 2.0}, max_position_embeddings=32)
    ours = RotaryEmbedding(
        32,
        scaling="dynamic",
        scaling_params={"factor": 2.0, "original_max_position_embeddings": 32},
    )
    calls = [
        torch.arange(20),
        torch.arange(40),
        torch.tensor([40]),
        torch.tensor([41]),
        torch.arange(36),
        torch.arange(10),
        torch.arange(50),
        torch.arange(33),
    ]
    x = torch.zeros(1, 1, 64)
    for position_ids in calls:
        got, want = ours(x, position_ids[None]), hf(x, position_ids[None])
        for g, w in zip(got, want, strict=True):
            assert float((g - w).abs().max()) <= HF_ATOL, position_ids
    # a shorter call after 50 positions uses the frequencies at 50, not at its own 33
    stale = ours(x, torch.arange(33)[None])[0][0, -1]
    at_33 = dynamic_inv_freq_loop(32, 10000.0, 2.0, 32, 33)
    fresh = torch.cos(32 * at_33)
    assert float((stale.double() - torch.cat((fresh, fresh))).abs().max()) > 1e-3


def test_a_layout_error_names_the_transpose_that_fixes_it():
    # x [B, L, H, dim] with L != H: the error says positions are the second-to-last axis
    x = torch.randn(2, 7, 4, 16)
    rope = RotaryEmbedding(16)
    with pytest.raises(ValueError, match=r"transpose\(1, 2\)"):
        rope.rotate(x, torch.arange(7))
    cos, sin = pecode.rope.rope_cos_sin(torch.arange(7), pecode.rope.rope_inv_freq(16))
    with pytest.raises(ValueError, match=r"transpose\(1, 2\)"):
        pecode.rope.apply_rope(x, cos, sin)
    # transposed, it rotates like the float64 loop
    expected = rope_loop(x.transpose(1, 2).double(), torch.arange(7), layout="half")
    got = rope.rotate(x.transpose(1, 2), torch.arange(7))
    assert torch.allclose(got.double(), expected, atol=1e-5)
