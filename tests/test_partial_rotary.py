"""The four ways 2024–26 models rotate part of a head are four different maps.

With a 16-wide head and half of it turned, at one position, each convention against
every other (they must disagree on a random vector), and which features each leaves
alone. Each is checked against the models that use it elsewhere:

- a contiguous block with its own exponent ``2i / rotary_dim`` (``partial_rotary_factor``:
  Phi-3/Phi-4-mini, Qwen3.5): ``tests/test_hf_models.py`` (Phi-3's family) and
  ``tests/test_mrope.py`` (Qwen3.5);
- Hugging Face's ``proportional`` rope type (Gemma 4's global layers): pairs across the
  whole head with exponent ``2i / head_dim`` and zero frequency past the rotated share,
  ``tests/test_hf_rope_configs.py``;
- adjacent pairs on the first part (GLM-4, ``partial_rotary_factor`` with its
  interleaved code): ``tests/test_hf_models.py`` (GLM-4's family);
- a separate rotary sub-head after the unrotated features (DeepSeek's MLA,
  ``qk_rope_head_dim``): ``tests/test_mla.py``.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from pecode.rope import RotaryEmbedding

F64 = torch.float64


def contiguous(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    return RotaryEmbedding(16, rotary_dim=8, dtype=F64).rotate(x, p)


def proportional(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    rope = RotaryEmbedding(
        16, scaling="proportional", scaling_params={"partial_rotary_factor": 0.5}, dtype=F64
    )
    return rope.rotate(x, p)


def interleaved_first_part(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    return RotaryEmbedding(16, rotary_dim=8, layout="interleaved", dtype=F64).rotate(x, p)


def rotary_sub_head(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
    rope = RotaryEmbedding(8, layout="interleaved", dtype=F64)
    return torch.cat((x[..., :8], rope.rotate(x[..., 8:], p)), dim=-1)


CONVENTIONS = {
    "contiguous block (Phi-4-mini)": (contiguous, list(range(8, 16))),
    "proportional (Gemma 4)": (proportional, [4, 5, 6, 7, 12, 13, 14, 15]),
    "interleaved first part (GLM-4)": (interleaved_first_part, list(range(8, 16))),
    "rotary sub-head (MLA)": (rotary_sub_head, list(range(8))),
}


def vector() -> torch.Tensor:
    return torch.randn(1, 1, 1, 16, dtype=F64, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(("first", "second"), list(itertools.combinations(CONVENTIONS, 2)))
def test_each_pair_of_conventions_disagrees(first, second):
    x, p = vector(), torch.tensor([3])
    a, b = CONVENTIONS[first][0](x, p), CONVENTIONS[second][0](x, p)
    assert (a - b).abs().max() > 0.1


@pytest.mark.parametrize("name", list(CONVENTIONS))
def test_which_features_each_convention_leaves_alone(name):
    rotate, untouched = CONVENTIONS[name]
    x, p = vector(), torch.tensor([3])
    moved = (rotate(x, p) - x).abs()[0, 0, 0] > 1e-12
    assert torch.nonzero(~moved).flatten().tolist() == untouched
    assert torch.equal(rotate(x, torch.tensor([0])), x)  # position 0 turns nothing
