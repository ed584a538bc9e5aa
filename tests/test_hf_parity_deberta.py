"""pecode's DeBERTa against Hugging Face's DebertaV2 disentangled attention.

Hugging Face's ``DisentangledSelfAttention`` follows the authors' released code, which the
DeBERTa-v2/v3 checkpoints were trained with. Each case builds a one-layer ``DebertaV2Model``
from a tiny random config in float64, draws every weight at random (biases and the
LayerNorm included), copies the weights into a pecode layer, and compares the
position terms, the attention probabilities and the attention output. The head width is
12, so ``sqrt(3 * 12) = 6`` is exact in the float32 ``sqrt`` Hugging Face takes, and the
two agree to float64 round-off.
"""

from __future__ import annotations

import pytest
import torch

from pecode.relative import deberta_attention

transformers = pytest.importorskip("transformers")
from transformers import DebertaV2Config, DebertaV2Model  # noqa: E402

HEADS, HEAD_DIM = 2, 12
HIDDEN = HEADS * HEAD_DIM
TOLERANCE = 1e-12

# (max_relative_positions, position_buckets, share_att_key, norm_rel_ebd, length)
CASES = {
    # the paper's shape: separate position projections, 2k rows, no buckets
    "separate-k4": (4, -1, False, "none", 10),
    "separate-k4-layernorm": (4, -1, False, "layer_norm", 10),
    # shared projections and log buckets, small enough that lengths reach the log part
    "shared-buckets8": (32, 8, True, "none", 40),
    "shared-buckets8-layernorm": (32, 8, True, "layer_norm", 40),
    "separate-buckets8": (32, 8, False, "layer_norm", 40),
    # the released v3 configs: position_buckets 256, max_relative_positions -1 (= the 512
    # of max_position_embeddings), share_att_key, layer_norm; 300 tokens reach the log part
    "v3-shape": (-1, 256, True, "layer_norm", 300),
}


def hf_model(max_relative: int, buckets: int, share: bool, norm: str) -> DebertaV2Model:
    config = DebertaV2Config(
        vocab_size=16,
        hidden_size=HIDDEN,
        num_attention_heads=HEADS,
        intermediate_size=8,
        num_hidden_layers=1,
        max_position_embeddings=512,
        relative_attention=True,
        pos_att_type=["p2c", "c2p"],
        max_relative_positions=max_relative,
        position_buckets=buckets,
        share_att_key=share,
        norm_rel_ebd=norm,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
        layer_norm_eps=1e-7,
    )
    model = DebertaV2Model(config).double().eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            scale = HIDDEN**-0.5 if parameter.dim() == 2 and "rel_embeddings" not in name else 0.5
            parameter.copy_(
                torch.randn(parameter.shape, generator=gen, dtype=torch.float64) * scale
            )
            if name.endswith("LayerNorm.weight"):
                parameter.add_(1.0)
    return model


def pecode_copy(model: DebertaV2Model, *, bias: bool, **options):
    """A pecode layer with the HF layer's weights; its output projection is the identity."""
    hf = model.encoder.layer[0].attention.self
    max_relative = model.config.max_relative_positions
    if max_relative < 1:
        max_relative = model.config.max_position_embeddings
    buckets = model.config.position_buckets
    layer = deberta_attention(
        HIDDEN,
        HEADS,
        max_relative,
        position_buckets=buckets if buckets > 0 else None,
        share_att_key=model.config.share_att_key,
        norm_rel_ebd="layer_norm" in model.config.norm_rel_ebd,
        layer_norm_eps=model.config.layer_norm_eps,
        **({} if model.config.share_att_key else {"pos_proj_bias": bias}),
        **options,
    ).double()
    scheme = layer.position
    with torch.no_grad():
        for ours, theirs in (
            (layer.q_proj, hf.query_proj),
            (layer.k_proj, hf.key_proj),
            (layer.v_proj, hf.value_proj),
        ):
            ours.load_state_dict(theirs.state_dict())
        layer.out_proj.weight.copy_(torch.eye(HIDDEN, dtype=torch.float64))
        layer.out_proj.bias.zero_()
        scheme.rel_embeddings.copy_(model.encoder.rel_embeddings.weight)
        if scheme.rel_norm is not None:
            scheme.rel_norm.load_state_dict(model.encoder.LayerNorm.state_dict())
        if not scheme.share_att_key:
            scheme.pos_q_proj.weight.copy_(hf.pos_query_proj.weight)
            scheme.pos_k_proj.weight.copy_(hf.pos_key_proj.weight)
            if bias:
                scheme.pos_q_proj.bias.copy_(hf.pos_query_proj.bias)
                scheme.pos_k_proj.bias.copy_(hf.pos_key_proj.bias)
            else:  # pecode's paper form has no biases: zero Hugging Face's
                hf.pos_query_proj.bias.zero_()
                hf.pos_key_proj.bias.zero_()
    return layer


def hf_attention(model: DebertaV2Model, x: torch.Tensor, mask: torch.Tensor):
    """Hugging Face's attention output, probabilities and position terms (scaled)."""
    encoder, hf = model.encoder, model.encoder.layer[0].attention.self
    with torch.no_grad():
        rel_embeddings = encoder.get_rel_embedding()
        relative_pos = encoder.get_rel_pos(x)
        out, probs = hf(
            x,
            encoder.get_attention_mask(mask),
            output_attentions=True,
            relative_pos=relative_pos,
            rel_embeddings=rel_embeddings,
        )
        q = hf.transpose_for_scores(hf.query_proj(x), HEADS)
        k = hf.transpose_for_scores(hf.key_proj(x), HEADS)
        terms = hf.disentangled_attention_bias(q, k, relative_pos, rel_embeddings, 3)
    return out, probs, terms.view(x.shape[0], HEADS, x.shape[1], x.shape[1])


def per_head(layer, x: torch.Tensor, which: str) -> torch.Tensor:
    out = getattr(layer, f"{which}_proj")(x)
    return out.view(x.shape[0], x.shape[1], HEADS, HEAD_DIM).transpose(1, 2)


def compare(model, layer, x, mask):
    """Largest differences of (position terms, probabilities, outputs) on the real tokens."""
    out, probs, terms = hf_attention(model, x, mask)
    keep = mask.bool()
    positions = torch.arange(x.shape[1])
    with torch.no_grad():
        ours_terms = layer.position.score_bias(
            per_head(layer, x, "q"), per_head(layer, x, "k"), positions, positions
        )
        key_mask = keep[:, None, None, :]
        ours_probs = layer.attention_weights(x, attn_mask=key_mask)
        ours_out = layer(x, attn_mask=key_mask)
    rows = keep[:, None, :, None]  # HF masks padded queries' rows entirely: skip them
    both = rows & keep[:, None, None, :]
    return (
        (ours_terms - terms).masked_fill(~both, 0).abs().max().item(),
        (ours_probs - probs).masked_fill(~rows, 0).abs().max().item(),
        (ours_out - out)[keep].abs().max().item(),
    )


def inputs(length: int, padded: bool) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, length, HIDDEN, generator=gen, dtype=torch.float64)
    mask = torch.ones(2, length, dtype=torch.long)
    if padded:
        mask[1, length - length // 3 :] = 0  # the second sequence is a third padding
    return x, mask


@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
@pytest.mark.parametrize("case", list(CASES))
def test_pecode_reproduces_hugging_face(case, padded):
    max_relative, buckets, share, norm, length = CASES[case]
    model = hf_model(max_relative, buckets, share, norm)
    layer = pecode_copy(model, bias=True)
    x, mask = inputs(length, padded)
    terms, probs, out = compare(model, layer, x, mask)
    assert terms < TOLERANCE
    assert probs < TOLERANCE
    assert out < TOLERANCE


def test_pecode_without_position_biases_matches_hf_with_them_zeroed():
    """pecode's paper-shaped default (no biases on W_{q,r}, W_{k,r}) is HF with those zeroed."""
    model = hf_model(4, -1, False, "none")
    layer = pecode_copy(model, bias=False)
    assert layer.position.pos_q_proj.bias is None
    x, mask = inputs(10, padded=True)
    assert max(compare(model, layer, x, mask)) < TOLERANCE


@pytest.mark.parametrize("case", ["separate-k4", "shared-buckets8"])
def test_the_papers_p2c_index_is_not_what_hugging_face_computes(case):
    """Eq. (4) as printed, p2c indexed by δ(j, i), differs from the released code by O(1)."""
    max_relative, buckets, share, norm, length = CASES[case]
    model = hf_model(max_relative, buckets, share, norm)
    layer = pecode_copy(model, bias=True, p2c_index="paper")
    x, mask = inputs(length, padded=False)
    terms, _, out = compare(model, layer, x, mask)
    assert terms > 0.1
    assert out > 1e-3


@pytest.mark.parametrize(("buckets", "max_distance"), [(256, 512), (8, 32), (64, 1024)])
def test_log_buckets_equal_hugging_faces(buckets, max_distance):
    from transformers.models.deberta_v2.modeling_deberta_v2 import make_log_bucket_position

    from pecode.relative import deberta_log_bucket

    offsets = torch.arange(-3000, 3001)
    theirs = make_log_bucket_position(offsets, buckets, max_distance).long()
    assert torch.equal(deberta_log_bucket(offsets, buckets, max_distance), theirs)
