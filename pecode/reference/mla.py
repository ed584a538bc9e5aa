"""Reference for multi-head latent attention (DeepSeek-V2 §2.1), one scalar at a time."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from pecode.mla import MultiHeadLatentAttention
from pecode.reference.attention import linear_loop

__all__ = ["latent_attention_loop"]


def latent_attention_loop(module: MultiHeadLatentAttention, x: Tensor) -> Tensor:
    """A causal :class:`~pecode.mla.MultiHeadLatentAttention` at positions 0..L-1, in float64 loops.

    Spelled out from DeepSeek-V2's equations (9)–(19), not from pecode's code: the
    latent ``c_t = RMSNorm(W_DKV x_t)``; per head the key content ``W_UK,h c_s`` and the
    value ``W_UV,h c_s`` (the rows of ``kv_up``, head after head, content before value);
    one rotary key ``k^R_s`` for all heads; the query through ``q_proj`` or ``q_down →
    RMSNorm → q_up``; RoPE on adjacent pairs (``2i, 2i + 1``) with angle ``p ·
    base^(-2i / rope_dim)``, unscaled; the score ``(q^C · k^C + q^R · k^R) · scale``
    over the keys ``s ≤ t``.

    Shapes::

        x:       [B, L, D]
        returns: [B, L, D] (float64, on the CPU)

    Raises:
        ValueError: the module's RoPE is scaled or not in the interleaved layout.
    """
    rope = module.rope
    if rope.scaling not in (None, "default") or rope.layout != "interleaved":
        raise ValueError("latent_attention_loop takes an unscaled interleaved RotaryEmbedding")
    heads, nope, rdim, vdim = module.num_heads, module.nope_dim, module.rope_dim, module.v_dim

    def rms_norm(vector: list[float], norm: torch.nn.RMSNorm) -> list[float]:
        rms = math.sqrt(sum(value * value for value in vector) / len(vector) + norm.eps)
        return [
            value / rms * g for value, g in zip(vector, norm.weight.double().tolist(), strict=True)
        ]

    def rotate(vector: list[float], position: int) -> list[float]:
        out = list(vector)
        for i in range(rdim // 2):
            angle = position * rope.base ** (-2 * i / rdim)
            a, b = vector[2 * i], vector[2 * i + 1]
            out[2 * i] = a * math.cos(angle) - b * math.sin(angle)
            out[2 * i + 1] = b * math.cos(angle) + a * math.sin(angle)
        return out

    xs = x.detach().double().cpu().tolist()
    batch, length = x.shape[0], x.shape[1]
    out = torch.zeros(batch, length, module.embed_dim, dtype=torch.float64)
    for n in range(batch):
        queries, latents, rope_keys = [], [], []
        for t in range(length):
            if module.q_rank is None:
                query = linear_loop(module.q_proj, xs[n][t])
            else:
                query = linear_loop(
                    module.q_up, rms_norm(linear_loop(module.q_down, xs[n][t]), module.q_norm)
                )
            queries.append(query)
            down = linear_loop(module.kv_down, xs[n][t])
            latents.append(rms_norm(down[: module.kv_rank], module.kv_norm))
            rope_keys.append(rotate(down[module.kv_rank :], t))
        ups = [linear_loop(module.kv_up, c) for c in latents]
        for t in range(length):
            concat = []
            for h in range(heads):
                q = queries[t][h * (nope + rdim) : (h + 1) * (nope + rdim)]
                q_content, q_rope = q[:nope], rotate(q[nope:], t)
                base = h * (nope + vdim)
                logits = []
                for s in range(t + 1):
                    k_content = ups[s][base : base + nope]
                    dot = sum(a * b for a, b in zip(q_content, k_content, strict=True))
                    dot += sum(a * b for a, b in zip(q_rope, rope_keys[s], strict=True))
                    logits.append(dot * module.scale)
                top = max(logits)
                weights = [math.exp(value - top) for value in logits]
                total = sum(weights)
                head_out = [0.0] * vdim
                for s, weight in enumerate(weights):
                    value = ups[s][base + nope : base + nope + vdim]
                    for c in range(vdim):
                        head_out[c] += weight / total * value[c]
                concat += head_out
            out[n, t] = torch.tensor(linear_loop(module.out_proj, concat), dtype=torch.float64)
    return out
