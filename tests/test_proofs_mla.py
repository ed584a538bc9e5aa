"""MLA's proofs (pecode.proofs.mla): the fixed absorption fails off offset 0, and the
absorbed form of pecode's MultiHeadLatentAttention gives the same logits as its expanded
keys (float64, torch: independent of sympy)."""

from __future__ import annotations

import sympy as sp
import torch

from pecode.mla import MultiHeadLatentAttention
from pecode.proofs import mla
from pecode.rope import RotaryEmbedding


def test_the_fixed_absorption_is_right_at_offset_zero_only():
    step = mla.rope_between_projections(absorb_fixed=True).steps[2]
    assert not step.holds
    m, n = sp.Symbol("m", integer=True), sp.Symbol("n", integer=True)
    assert sp.simplify(step.residual.subs(n, m)).is_zero_matrix
    point = {symbol: sp.Rational(i + 2, 5) for i, symbol in enumerate(step.residual.free_symbols)}
    point.update({m: 1, n: 4})
    assert max(abs(float(entry.subs(point))) for entry in step.residual) > 1e-2


def test_absorbed_logits_on_the_latents_equal_the_expanded_keys():
    torch.manual_seed(0)
    rope = RotaryEmbedding(4, layout="interleaved", dtype=torch.float64)
    module = MultiHeadLatentAttention(
        16, 3, kv_rank=5, rope_dim=4, nope_dim=6, v_dim=5, rope=rope
    ).double()
    x = torch.randn(1, 7, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    positions = torch.arange(7) + 3
    with torch.no_grad():
        q = module._queries(x).view(1, 7, 3, 10).transpose(1, 2)
        q_nope, q_rope = q.split([6, 4], dim=-1)
        latents, k_rope = module.kv_down(x).split([5, 4], dim=-1)
        latents = module.kv_norm(latents)
        q_rope, k_rope = rope.rotate(q_rope, positions), rope.rotate(k_rope[:, None], positions)
        w_up = module.kv_up.weight.view(3, 6 + 5, 5)[:, :6]  # W_UK per head: [H, nope, rank]
        k_nope = torch.einsum("hdr,blr->bhld", w_up, latents)
        expanded = q_nope @ k_nope.transpose(-2, -1) + q_rope @ k_rope.transpose(-2, -1)
        absorbed_query = torch.einsum("bhld,hdr->bhlr", q_nope, w_up)  # W_UKᵀ q^C: [.., rank]
        absorbed = absorbed_query @ latents[:, None].transpose(-2, -1)
        absorbed = absorbed + q_rope @ k_rope.transpose(-2, -1)
    assert torch.allclose(absorbed, expanded, atol=1e-12)
    assert expanded.abs().max() > 1.0
