"""Multi-axis RoPE (M-RoPE) against Hugging Face's Qwen2.5-VL, Qwen3-VL and Qwen3.5 code.

The independent references are transformers' own rotary embeddings of those models
(``Qwen2_5_VLRotaryEmbedding``, ``Qwen3VLTextRotaryEmbedding``,
``Qwen3_5TextRotaryEmbedding``, whose ``recomposition_frequencies`` lays the sections
out) and their apply functions, on tiny configs built by transformers' config classes:

- which axis each frequency pair reads (:func:`pecode.mrope.mrope_pair_axes`), read off
  transformers' recomposition of a tensor whose axis ``a`` holds the value ``a``;
- ``RotaryEmbedding.from_hf_config(config)(x, position_ids)`` against the model's
  ``rotary_emb(x, position_ids)`` for position ids ``[3, B, L]`` that differ per axis;
- queries and keys rotated by ``rotate(x, positions [B, L, 3])`` against the model's
  apply function;
- text (the same index on every axis) against 1-D RoPE, and neighbours: the other
  layout, and the axes in another order, rotate otherwise.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from pecode.mrope import mrope_pair_axes, mrope_positions
from pecode.rope import RotaryEmbedding
from pecode.scaling import hf_rope_arguments

transformers = pytest.importorskip("transformers")

from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as qwen2_5_vl  # noqa: E402
from transformers.models.qwen3_5 import modeling_qwen3_5 as qwen3_5  # noqa: E402
from transformers.models.qwen3_vl import modeling_qwen3_vl as qwen3_vl  # noqa: E402

# float32 angles in transformers, float64 ones rounded once in pecode, positions < 64
TOLERANCE = 1e-5


def _config(name: str, sections: list[int], **extra):
    block = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": sections}
    if name != "Qwen2_5_VLTextConfig":
        block["mrope_interleaved"] = True
    if "partial_rotary_factor" in extra:
        block["partial_rotary_factor"] = extra["partial_rotary_factor"]
    fields = {"hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 1}
    return getattr(transformers, name)(**fields, **extra, rope_parameters=block)


# (config, rotary embedding class, apply function) of each model; sections add up to
# the rotated pairs: 16 of a 32-wide head, or 8 where Qwen3.5 rotates half of it
MODELS = {
    "qwen2_5_vl": (
        lambda: _config("Qwen2_5_VLTextConfig", [4, 6, 6]),
        qwen2_5_vl.Qwen2_5_VLRotaryEmbedding,
        "chunked",
    ),
    "qwen3_vl": (
        lambda: _config("Qwen3VLTextConfig", [6, 5, 5], head_dim=32),
        qwen3_vl.Qwen3VLTextRotaryEmbedding,
        "interleaved",
    ),
    "qwen3_5": (
        lambda: _config("Qwen3_5TextConfig", [3, 3, 2], head_dim=32, partial_rotary_factor=0.5),
        qwen3_5.Qwen3_5TextRotaryEmbedding,
        "interleaved",
    ),
}


def position_ids(seed: int = 0) -> torch.Tensor:
    """[3, B=2, L=7] time, height and width indices that differ per axis."""
    return torch.randint(0, 64, (3, 2, 7), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("model", list(MODELS))
def test_pair_axes_equal_transformers_recomposition(model):
    make_config, rotary_class, layout = MODELS[model]
    rotary = rotary_class(make_config())
    pairs = len(rotary.inv_freq)
    tagged = torch.arange(3.0)[:, None].expand(3, pairs).clone()  # axis a holds a
    theirs = rotary.recomposition_frequencies(tagged)[:pairs].long()  # [cos | cos]: one half
    ours = mrope_pair_axes(rotary.mrope_section, layout)
    assert torch.equal(ours, theirs)
    if layout == "interleaved":  # the neighbour: the same sections chunked
        assert not torch.equal(mrope_pair_axes(rotary.mrope_section, "chunked"), theirs)
    else:  # Qwen2.5-VL's sections cannot even be interleaved over 16 pairs
        with pytest.raises(ValueError, match="cannot be interleaved"):
            mrope_pair_axes(rotary.mrope_section, "interleaved")


@pytest.mark.parametrize("model", list(MODELS))
def test_rotary_call_equals_the_models_rotary_emb(model):
    make_config, rotary_class, layout = MODELS[model]
    config = make_config()
    ours = RotaryEmbedding.from_hf_config(config)
    assert ours.sections == tuple(config.rope_parameters["mrope_section"])
    assert ours.section_layout == layout
    x, ids = torch.zeros(1), position_ids()
    their_cos, their_sin = rotary_class(config)(x, ids)
    cos, sin = ours(x, ids)
    assert cos.shape == their_cos.shape
    assert (cos - their_cos).abs().max() < TOLERANCE
    assert (sin - their_sin).abs().max() < TOLERANCE
    # text: [B, L] position ids, which both expand to every axis, are 1-D RoPE
    text = ids[0]
    their_cos, _ = rotary_class(config)(x, text)
    plain = RotaryEmbedding(ours.head_dim, rotary_dim=ours.rotary_dim)
    assert (ours(x, text)[0] - their_cos).abs().max() < TOLERANCE
    assert torch.equal(ours(x, text)[0], plain(x, text)[0])


@pytest.mark.parametrize("model", list(MODELS))
def test_rotated_queries_and_keys_equal_the_models_apply_function(model):
    make_config, rotary_class, _ = MODELS[model]
    config = make_config()
    ids = position_ids(1)
    generator = torch.Generator().manual_seed(2)
    q = torch.randn(2, 2, 7, 32, generator=generator)  # [B, H, L, head_dim]
    k = torch.randn(2, 1, 7, 32, generator=generator)
    cos, sin = rotary_class(config)(q, ids)  # sectioned: [B, L, head_dim]
    module = {"qwen2_5_vl": qwen2_5_vl, "qwen3_vl": qwen3_vl, "qwen3_5": qwen3_5}[model]
    their_q, their_k = module.apply_rotary_pos_emb(q, k, cos, sin)
    ours = RotaryEmbedding.from_hf_config(config)
    positions = ids.movedim(0, -1)  # pecode's [B, L, A]
    q_ours, k_ours = ours.transform_qk(q, k, positions, positions)
    assert (q_ours - their_q).abs().max() < TOLERANCE
    assert (k_ours - their_k).abs().max() < TOLERANCE
    # neighbours: the axes in another order (height and width swapped) rotate otherwise
    swapped = positions[..., [0, 2, 1]]
    assert (ours.rotate(q, swapped) - their_q).abs().max() > 0.1


def test_text_positions_on_every_axis_are_one_dimensional_rope():
    # the same index on every axis: each pair turns by p · θ_j whichever axis it reads
    for layout in ("chunked", "interleaved"):
        rope = RotaryEmbedding(32, sections=[6, 5, 5], section_layout=layout)
        plain = RotaryEmbedding(32)
        x = torch.randn(2, 2, 7, 32, generator=torch.Generator().manual_seed(3))
        p = torch.arange(5, 12).expand(2, 7)
        assert torch.equal(rope.rotate(x, p[..., None].expand(2, 7, 3)), plain.rotate(x, p))
        # the neighbour: height one step ahead of time changes the rotation
        other = torch.stack((p, p + 1, p), dim=-1)
        assert (rope.rotate(x, other) - plain.rotate(x, p)).abs().max() > 1e-3


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: mrope_pair_axes([16]), ValueError, "two or more positive"),
        (lambda: mrope_pair_axes([4, 0, 4]), ValueError, "two or more positive"),
        (lambda: mrope_pair_axes([4.0, 4]), TypeError, "list or tuple of ints"),
        (lambda: mrope_pair_axes([4, 4], "zigzag"), ValueError, "section_layout must be one"),
        (lambda: mrope_pair_axes([2, 10, 4], "interleaved"), ValueError, "cannot be interleaved"),
        (lambda: RotaryEmbedding(32, sections=[4, 6, 4]), ValueError, "add up to 14 pairs"),
        (
            lambda: RotaryEmbedding(32).rotate(
                torch.zeros(1, 1, 3, 32), torch.zeros(1, 3, 3).long()
            ),
            ValueError,
            r"\[L\] or \[B, L\]",
        ),
        (
            lambda: RotaryEmbedding(32, sections=[6, 5, 5]).rotate(
                torch.zeros(1, 1, 3, 32), torch.zeros(1, 3, 2).long()
            ),
            ValueError,
            r"\[1, 3, 3\]",
        ),
        (
            lambda: RotaryEmbedding(32, sections=[6, 5, 5]).cos_sin_axes(torch.zeros(3, 2).long()),
            ValueError,
            "one index per axis",
        ),
    ],
)
def test_bad_sections_and_positions_raise_naming_them(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_configs_with_sections_are_read_by_model_type():
    config = MODELS["qwen3_vl"][0]().to_dict()
    assert hf_rope_arguments(config)["section_layout"] == "interleaved"
    config["rope_parameters"]["mrope_interleaved"] = False  # Qwen3-VL's code interleaves anyway
    with pytest.raises(ValueError, match="whatever the flag says"):
        hf_rope_arguments(config)
    llama = {"model_type": "llama", "head_dim": 32, "rope_theta": 1e4}
    llama["rope_parameters"] = {"rope_type": "default", "mrope_section": [6, 5, 5]}
    with pytest.raises(ValueError, match="section layouts of the model types"):
        hf_rope_arguments(llama)
    qwen2_vl = {"model_type": "qwen2_vl", "head_dim": 32, "rope_theta": 1e4}
    qwen2_vl["rope_scaling"] = {"type": "mrope", "mrope_section": [4, 6, 6]}  # the first form
    assert hf_rope_arguments(qwen2_vl)["sections"] == [4, 6, 6]
    qwen2_vl["rope_scaling"]["mrope_section"] = [4, 6, 4]
    with pytest.raises(ValueError, match="adds up to 14 pairs, not the 16"):
        hf_rope_arguments(qwen2_vl)


def _their_rope_index(segments: list, merge: int = 1) -> tuple[torch.Tensor, int]:
    """transformers' ``Qwen2_5_VLModel.get_rope_index`` for one row of images and text."""
    import functools
    import types

    model = qwen2_5_vl.Qwen2_5_VLModel
    vision = types.SimpleNamespace(spatial_merge_size=merge, tokens_per_second=2)
    fake = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=vision))
    fake.get_vision_position_ids = functools.partial(model.get_vision_position_ids, fake)
    kinds, grids = [], []
    for segment in segments:
        if isinstance(segment, int):
            kinds += [0] * segment
        else:  # the grid before the merge, as the processor reports it
            grids.append([segment[0], segment[1] * merge, segment[2] * merge])
            kinds += [1] * (segment[0] * segment[1] * segment[2])
    ids = torch.zeros(1, len(kinds), dtype=torch.long)
    positions, deltas = model.get_rope_index(
        fake, ids, torch.tensor([kinds]), image_grid_thw=torch.tensor(grids)
    )
    return positions[:, 0].T, int(deltas)


@pytest.mark.parametrize(
    ("segments", "merge"),
    [
        ([2, (1, 2, 3), 3], 1),
        ([(1, 3, 2), 4, (1, 2, 2), 1], 2),  # an image first, two images, merged 2×2
        ([5, (1, 4, 1), 1, (1, 1, 4), 2], 1),  # a tall image and a wide one
    ],
)
def test_positions_of_text_and_images_equal_transformers_rope_index(segments, merge):
    theirs, their_delta = _their_rope_index(segments, merge)
    ours, after = mrope_positions(segments)
    assert torch.equal(ours, theirs)
    assert after - len(ours) == their_delta  # rope_deltas: where decoding continues


def test_text_after_a_video_continues_past_its_last_frame():
    # Qwen2-VL's rule: what follows a grid starts one past its largest position. Frames
    # spaced 2 apart reach time 2 + 3·2 = 8 while height and width stop at 3, so the
    # text after the video starts at 9 and decoding continues where the prompt ended.
    # (transformers 5.23 starts that text at 2 + max(h, w) = 4, below the video's later
    # frames, while its rope_deltas continues decoding from 9.)
    positions, after = mrope_positions([2, (4, 2, 2, 2), 3])
    video, text = positions[2:18], positions[18:]
    assert video[:, 0].unique().tolist() == [2, 4, 6, 8]
    assert text[:, 0].tolist() == [9, 10, 11]
    assert (text[:, None, :] > video[None, :, :]).all()  # past every axis of every frame
    assert after == int(positions.max()) + 1 == 12


def test_transformers_starts_text_after_a_video_below_its_later_frames():
    # What the book says transformers does (5.23 and 5.24, make test-hf-latest): after a
    # video of 4 frames spaced 2 apart (times 2, 4, 6, 8) the text starts at
    # start + max(h, w) = 4, below the later frames, while rope_deltas (-12) continues
    # decoding from 9. If transformers changes this, this test fails: update the chapter.
    import functools
    import types

    model = qwen2_5_vl.Qwen2_5_VLModel
    vision = types.SimpleNamespace(spatial_merge_size=1, tokens_per_second=2)
    fake = types.SimpleNamespace(config=types.SimpleNamespace(vision_config=vision))
    fake.get_vision_position_ids = functools.partial(model.get_vision_position_ids, fake)
    kinds = [0] * 2 + [2] * (4 * 2 * 2) + [0] * 3  # text, a video, text
    positions, deltas = model.get_rope_index(
        fake,
        torch.zeros(1, len(kinds), dtype=torch.long),
        torch.tensor([kinds]),
        video_grid_thw=torch.tensor([[4, 2, 2]]),
        second_per_grid_ts=torch.tensor([1.0]),
    )
    theirs = positions[:, 0].T
    assert theirs[2:18, 0].unique().tolist() == [2, 4, 6, 8]
    assert theirs[18:].tolist() == [[4] * 3, [5] * 3, [6] * 3]  # pecode: 9, 10, 11
    assert int(deltas) == -12  # decoding continues at 21 - 12 = 9
    assert len(kinds) + int(deltas) == int(theirs.max()) + 1  # one past the last frame
    ours, after = mrope_positions([2, (4, 2, 2, 2), 3])
    assert torch.equal(ours[:18], theirs[:18])  # the same up to the text after the video
    assert ours[18:, 0].tolist() == [9, 10, 11]
    assert after == 12


@pytest.mark.parametrize(
    ("segments", "error", "match"),
    [
        ([0], ValueError, "text run of 0"),
        ([(1, 0, 2)], ValueError, "grid sizes must be positive"),
        ([(1, 2, 2, -1)], ValueError, "step must be a non-negative"),
        (["text"], TypeError, "must be an int"),
        ([(1, 2)], TypeError, "must be an int"),
    ],
)
def test_bad_segments_raise_naming_them(segments, error, match):
    with pytest.raises(error, match=match):
        mrope_positions(segments)


# -- M-RoPE through MultiHeadAttention and its KVCache: decoding continues from the cache ----
#
# Qwen2-VL's rule for text after a prompt with images: every axis continues from one past
# the row's largest position on any axis. transformers keeps that as ``rope_deltas`` on
# the model (next position = cache length + delta, ``compute_3d_position_ids``); pecode's
# KVCache keeps the positions themselves, so decoding needs no delta and none can be stale.


def _mrope_layer():
    from pecode.attention import MultiHeadAttention

    torch.manual_seed(5)
    layer = MultiHeadAttention(
        64, 2, num_kv_heads=1, position=RotaryEmbedding(32, sections=[4, 6, 6], dtype=torch.float64)
    ).double()
    with torch.no_grad():
        for parameter in layer.parameters():
            parameter.mul_(4.0)  # logits of a few units, where positions matter
    return layer


def _their_decode_positions(deltas: torch.Tensor, past: int, batch: int) -> torch.Tensor:
    """transformers' ``compute_3d_position_ids`` for one decoding step: ``[B, 1, 3]``."""
    import types

    fake = types.SimpleNamespace(rope_deltas=deltas)
    cache = types.SimpleNamespace(get_seq_length=lambda: past)
    compute = qwen2_5_vl.Qwen2_5_VLModel.compute_3d_position_ids
    # transformers 5.24 renamed past_key_values to cache
    name = "cache" if "cache" in inspect.signature(compute).parameters else "past_key_values"
    ids = compute(
        fake,
        input_ids=None,
        image_grid_thw=None,
        video_grid_thw=None,
        inputs_embeds=torch.zeros(batch, 1, 64),
        attention_mask=None,
        **{name: cache},
    )
    return ids.movedim(0, -1)  # [3, B, 1] -> [B, 1, 3]


def _prompt_positions(rows: list[list]) -> torch.Tensor:
    """``mrope_positions`` of each row (all of one length), stacked: ``[B, L, 3]``."""
    return torch.stack([mrope_positions(row)[0] for row in rows])


def _decode(layer, x, prompt_positions, steps, position_of_step):
    """Prefill ``x[:, :L]`` into a KVCache, then decode ``steps`` tokens one at a time."""
    from pecode.attention import KVCache

    cache, length = KVCache(), prompt_positions.shape[1]
    outputs = [layer(x[:, :length], positions=prompt_positions, causal=True, cache=cache)]
    for t in range(steps):
        token = x[:, length + t : length + t + 1]
        outputs.append(layer(token, positions=position_of_step(cache), causal=True, cache=cache))
    return torch.cat(outputs, dim=1), cache


def test_cached_multi_axis_decoding_equals_one_causal_pass():
    # row 0: text, an image, text (11 tokens ending at position 7); row 1: 11 text tokens
    rows = [[2, (1, 2, 3), 3], [11]]
    prompt = _prompt_positions(rows)
    layer, steps = _mrope_layer(), 4
    x = torch.randn(
        2, 11 + steps, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(6)
    )
    # the whole sequence in one pass: the decoded text continues from each row's next index
    after = [mrope_positions(row)[1] for row in rows]
    decoded = torch.tensor(after)[:, None] + torch.arange(steps)
    full_positions = torch.cat((prompt, decoded[..., None].expand(2, steps, 3)), dim=1)
    with torch.no_grad():
        full = layer(x, positions=full_positions, causal=True)
        # positions=None: each step asks the cache (KVCache.next_positions)
        cached, cache = _decode(layer, x, prompt, steps, lambda cache: None)
    assert (cached - full).abs().max() < 1e-12
    assert torch.equal(cache.positions, full_positions)
    assert cache.next_positions(1).tolist() == [[[12] * 3], [[15] * 3]]
    # the neighbour: decoding on from the sequence length (15, 16, ...), as for text
    with torch.no_grad():
        by_length, _ = _decode(layer, x, prompt, steps, lambda c: torch.tensor([[len(c)]] * 2))
    assert (by_length - full)[0, 11:].abs().max() > 1e-3
    assert (by_length - full)[1].abs().max() < 1e-12  # text alone: the same positions


def test_next_positions_equal_transformers_rope_deltas_rule():
    # transformers: position = cache length + rope_delta, delta = max + 1 - length per row
    rows = [[2, (1, 2, 3), 3], [(1, 3, 3), 1, (1, 1, 1)]]  # both 11 tokens long
    prompt = _prompt_positions(rows)
    deltas = torch.tensor([[_their_rope_index(row)[1]] for row in rows])
    assert deltas.tolist() == [[-3], [-6]]
    layer = _mrope_layer()
    x = torch.randn(2, 14, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        _, cache = _decode(layer, x, prompt, 3, lambda cache: None)
    theirs = [_their_decode_positions(deltas, past, 2) for past in (11, 12, 13)]
    assert torch.equal(cache.positions[:, 11:], torch.cat(theirs, dim=1))
    assert torch.equal(cache.next_positions(1), _their_decode_positions(deltas, 14, 2))


def test_a_stale_delta_from_the_previous_prompt_decodes_at_the_wrong_positions():
    # The bug of transformers #43952 (fixed in 5.x: get_rope_index reruns when the cache is
    # empty): prompt A's rope_deltas reused while decoding prompt B. pecode's cache has no
    # delta to reuse: it continues from B's own cached positions.
    first, second = [2, (1, 2, 3), 3], [1, (1, 4, 4), 2]  # deltas -3 and -12
    stale = torch.tensor([[_their_rope_index(first)[1]]])
    fresh = torch.tensor([[_their_rope_index(second)[1]]])
    assert (stale.item(), fresh.item()) == (-3, -12)
    prompt, after = mrope_positions(second)  # 19 tokens ending at position 6
    layer, steps = _mrope_layer(), 3
    x = torch.randn(
        1, 19 + steps, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(8)
    )
    decoded = (torch.arange(steps) + after)[:, None].expand(steps, 3)
    with torch.no_grad():
        full = layer(x, positions=torch.cat((prompt, decoded))[None], causal=True)
        ours, cache = _decode(layer, x, prompt[None], steps, lambda cache: None)
        with_stale, stale_cache = _decode(
            layer, x, prompt[None], steps, lambda c: _their_decode_positions(stale, len(c), 1)
        )
        with_fresh, _ = _decode(
            layer, x, prompt[None], steps, lambda c: _their_decode_positions(fresh, len(c), 1)
        )
    assert (ours - full).abs().max() < 1e-12
    assert cache.next_positions(1).tolist() == [[[after + steps] * 3]]
    assert (with_fresh - full).abs().max() < 1e-12
    assert stale_cache.positions[0, 19:, 0].tolist() == [16, 17, 18]  # not 7, 8, 9
    assert (with_stale - full)[:, 19:].abs().max() > 1e-3


def test_text_positions_continue_a_multi_axis_cache():
    # a decoding step may pass text positions [B, 1]: the same index on every axis
    layer = _mrope_layer()
    prompt = _prompt_positions([[2, (1, 2, 3), 3]])
    x = torch.randn(1, 13, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(9))
    with torch.no_grad():
        by_cache, _ = _decode(layer, x, prompt, 2, lambda cache: None)
        as_text, cache = _decode(layer, x, prompt, 2, lambda c: c.next_positions(1)[..., 0])
    assert torch.equal(by_cache, as_text)
    assert cache.positions.shape == (1, 13, 3)


@pytest.mark.parametrize(
    ("options", "positions", "match"),
    [
        ({"position": RotaryEmbedding(32)}, torch.zeros(1, 3, 3).long(), "needs a multi-axis"),
        ({}, torch.zeros(1, 3, 2).long(), r"positions must have shape \[1, 3, 3\]"),
        ({}, torch.zeros(2, 3, 3).long(), r"positions must have shape \[1, 3, 3\]"),
        ({"window": 2}, torch.zeros(1, 3, 3).long(), "positions: window reads one index"),
    ],
    ids=["1-D RoPE", "two axes for three", "batch of two for one", "window"],
)
def test_bad_multi_axis_positions_in_attention_raise_naming_positions(options, positions, match):
    from pecode.attention import MultiHeadAttention

    options = {"position": RotaryEmbedding(32, sections=[4, 6, 6]), **options}
    layer = MultiHeadAttention(64, 2, **options)
    with pytest.raises(ValueError, match=match):
        layer(torch.zeros(1, 3, 64), positions=positions, causal=True)
