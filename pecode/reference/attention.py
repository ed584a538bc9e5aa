"""Reference for attention itself: multi-head attention, one scalar at a time."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from pecode.attention import MultiHeadAttention

__all__ = ["attention_layer_loop", "linear_loop", "multi_head_attention_loop"]


def linear_loop(linear: torch.nn.Linear, vector: list[float]) -> list[float]:
    """``W x + b`` of an ``nn.Linear`` for one vector, in float64, one sum per output."""
    w = linear.weight.detach().double().tolist()
    b = linear.bias.detach().double().tolist() if linear.bias is not None else [0.0] * len(w)
    return [sum(w[o][i] * vector[i] for i in range(len(vector))) + b[o] for o in range(len(w))]


def multi_head_attention_loop(
    module: MultiHeadAttention,
    x: Tensor,
    *,
    causal: bool = False,
    bias: Tensor | None = None,
    value_bias: Tensor | None = None,
    scale: float | None = None,
) -> Tensor:
    """Multi-head attention (Vaswani et al. 2017, eq. 1 and §3.2.2), token by token in float64.

    Uses the projection weights of ``module`` and ignores its position scheme; the
    arguments below can stand in for one.

    Shapes::

        x:          [B, L, D]
        bias:       [H, L, L], added to the scaled logits
        value_bias: [L, L, Dh], vector r_ij added to value j for query i (Shaw et al.)
        returns:    [B, L, D] (float64, on the CPU)

    ``scale`` multiplies ``q·k`` (default ``1/sqrt(Dh)``).

    Raises:
        ValueError: ``x`` does not have shape ``[B, L, module.embed_dim]``, or ``bias``
            is not ``[H, L, L]``, or ``value_bias`` is not ``[L, L, Dh]``.
    """
    if x.dim() != 3 or x.shape[-1] != module.embed_dim:
        raise ValueError(f"x must have shape [B, L, {module.embed_dim}], got {tuple(x.shape)}")
    batch, length, _ = x.shape
    heads, head_dim = module.num_heads, module.head_dim
    if bias is not None and tuple(bias.shape) != (heads, length, length):
        raise ValueError(
            f"bias must have shape [{heads}, {length}, {length}], got {tuple(bias.shape)}"
        )
    if value_bias is not None and tuple(value_bias.shape) != (length, length, head_dim):
        raise ValueError(
            f"value_bias must have shape [{length}, {length}, {head_dim}], "
            f"got {tuple(value_bias.shape)}"
        )
    scale = 1 / math.sqrt(head_dim) if scale is None else scale

    def weights(linear: torch.nn.Linear) -> tuple[list[list[float]], list[float]]:
        w = linear.weight.detach().double().cpu().tolist()
        b = linear.bias.detach().double().cpu().tolist() if linear.bias is not None else None
        return w, b if b is not None else [0.0] * len(w)

    def project(linear: torch.nn.Linear, vector: list[float]) -> list[float]:
        w, b = weights(linear)
        return [sum(w[o][i] * vector[i] for i in range(len(vector))) + b[o] for o in range(len(w))]

    xs = x.detach().double().cpu().tolist()
    out = torch.zeros(batch, length, module.embed_dim, dtype=torch.float64)
    for n in range(batch):
        qs = [project(module.q_proj, xs[n][t]) for t in range(length)]
        ks = [project(module.k_proj, xs[n][t]) for t in range(length)]
        vs = [project(module.v_proj, xs[n][t]) for t in range(length)]
        for i in range(length):
            concat = []
            for h in range(heads):
                lo, hi = h * head_dim, (h + 1) * head_dim
                visible = range(i + 1) if causal else range(length)
                logits = {}
                for j in visible:
                    dot = sum(qs[i][c] * ks[j][c] for c in range(lo, hi))
                    logits[j] = dot * scale
                    if bias is not None:
                        logits[j] += float(bias[h, i, j])
                top = max(logits.values())
                exps = {j: math.exp(value - top) for j, value in logits.items()}
                total = sum(exps.values())
                head_out = [0.0] * head_dim
                for j, e in exps.items():
                    for c in range(head_dim):
                        extra = float(value_bias[i, j, c]) if value_bias is not None else 0.0
                        head_out[c] += e / total * (vs[j][lo + c] + extra)
                concat += head_out
            out[n, i] = torch.tensor(project(module.out_proj, concat), dtype=torch.float64)
    return out


def attention_layer_loop(
    module: MultiHeadAttention,
    x: Tensor,
    positions: list[int] | None = None,
    *,
    causal: bool = True,
) -> Tensor:
    """A :class:`~pecode.attention.MultiHeadAttention` with the 2024–26 options, in float64 loops.

    Read from ``module`` and each spelled out from its source, not from pecode's code:
    the per-head width ``Dh``; grouped key/value heads (query head ``h`` reads group
    ``h // (H / Hkv)``); the projections' biases; ``qk_norm`` (``x / sqrt(mean(x²) +
    eps) · gain``, over each head or the whole projection, before RoPE; for ``"l2"``
    no gain and after RoPE); RoPE when the
    scheme is an unscaled :class:`~pecode.rope.RotaryEmbedding` in the half layout
    (feature ``c`` paired with ``c + r/2`` of the rotated ``r``, angle ``p·base^(-2c/r)``);
    the logit scale (``logit_scale``, else ``1/sqrt(Dh)``); the soft cap ``s·tanh(l/s)``;
    the causal, sliding-window (``|p_q - p_k| < window``) and chunk (``p_q // chunk ==
    p_k // chunk``) limits; learned sinks (one more term ``exp(sink_h)`` in the softmax's
    denominator); the query temperature ``1 + β ln(1 + ⌊(p + offset)/length⌋)``, ``p``
    the position or, with ``"by": "index"``, the index in the sequence.

    Shapes::

        x:         [B, L, D]
        positions: L ints (default 0 .. L-1), shared by the batch
        returns:   [B, L, D] (float64, on the CPU)

    Raises:
        ValueError: ``x`` has the wrong shape, or the scheme is neither ``None``,
            ``ContentOnly`` nor an unscaled half-layout ``RotaryEmbedding``.
    """
    from pecode.attention import ContentOnly, PositionScheme
    from pecode.rope import RotaryEmbedding

    if x.dim() != 3 or x.shape[-1] != module.embed_dim:
        raise ValueError(f"x must have shape [B, L, {module.embed_dim}], got {tuple(x.shape)}")
    batch, length, _ = x.shape
    positions = list(range(length)) if positions is None else list(positions)
    heads, groups, head_dim = module.num_heads, module.num_kv_heads, module.head_dim
    per_group = heads // groups
    scheme = module.position
    rope = isinstance(scheme, RotaryEmbedding)
    if rope and (scheme.scaling not in (None, "default") or scheme.layout != "half"):
        raise ValueError("attention_layer_loop takes an unscaled half-layout RotaryEmbedding")
    if not rope and type(scheme) not in (PositionScheme, ContentOnly):
        raise ValueError(f"attention_layer_loop does not spell out {type(scheme).__name__}")
    if module.logit_scale is not None:
        scale = module.logit_scale
    elif isinstance(scheme, ContentOnly):
        scale = scheme.logit_scale(head_dim)
    else:
        scale = 1 / math.sqrt(head_dim)

    def rms_norm(vector: list[float], norm: torch.nn.RMSNorm) -> list[float]:
        width = head_dim if module.qk_norm == "l2" else norm.normalized_shape[0]
        gain = [1.0] * width if norm.weight is None else norm.weight.detach().double().tolist()
        out = []
        for start in range(0, len(vector), width):
            piece = vector[start : start + width]
            rms = math.sqrt(sum(value * value for value in piece) / width + norm.eps)
            out += [value / rms * g for value, g in zip(piece, gain, strict=True)]
        return out

    def rotate(vector: list[float], position: int) -> list[float]:
        out = list(vector)
        r = scheme.rotary_dim
        for start in range(0, len(vector), head_dim):
            for c in range(r // 2):
                angle = position * scheme.base ** (-2 * c / r)
                a, b = vector[start + c], vector[start + c + r // 2]
                out[start + c] = a * math.cos(angle) - b * math.sin(angle)
                out[start + c + r // 2] = b * math.cos(angle) + a * math.sin(angle)
        return out

    def prepare(
        linear: torch.nn.Linear, norm_name: str, vector: list[float], p: int
    ) -> list[float]:
        out = linear_loop(linear, vector)
        if module.qk_norm not in (None, "l2"):
            out = rms_norm(out, getattr(module, norm_name))
        out = rotate(out, p) if rope else out
        if module.qk_norm == "l2":  # after the scheme, as Llama 4
            out = rms_norm(out, getattr(module, norm_name))
        return out

    temperature = module.query_temperature
    sinks = module.sinks.detach().double().tolist() if module.sinks is not None else None
    xs = x.detach().double().cpu().tolist()
    out = torch.zeros(batch, length, module.embed_dim, dtype=torch.float64)
    for n in range(batch):
        qs = [prepare(module.q_proj, "q_norm", xs[n][t], positions[t]) for t in range(length)]
        ks = [prepare(module.k_proj, "k_norm", xs[n][t], positions[t]) for t in range(length)]
        vs = [linear_loop(module.v_proj, xs[n][t]) for t in range(length)]
        for i in range(length):
            p = positions[i]
            factor = 1.0
            if temperature is not None:
                counted = i if temperature["by"] == "index" else p
                steps = (counted + temperature["offset"]) // temperature["length"]
                factor = 1 + temperature["beta"] * math.log(1 + steps)
            concat = []
            for h in range(heads):
                g = h // per_group
                q_lo, kv_lo = h * head_dim, g * head_dim
                logits = {}
                for j in range(length):
                    pk = positions[j]
                    if causal and pk > p:
                        continue
                    if module.window is not None and abs(p - pk) >= module.window:
                        continue
                    if module.chunk is not None and p // module.chunk != pk // module.chunk:
                        continue
                    dot = sum(qs[i][q_lo + c] * factor * ks[j][kv_lo + c] for c in range(head_dim))
                    logit = dot * scale
                    if module.softcap is not None:
                        logit = module.softcap * math.tanh(logit / module.softcap)
                    logits[j] = logit
                top = max([*logits.values(), sinks[h]] if sinks else logits.values())
                exps = {j: math.exp(value - top) for j, value in logits.items()}
                total = sum(exps.values()) + (math.exp(sinks[h] - top) if sinks else 0.0)
                head_out = [0.0] * head_dim
                for j, e in exps.items():
                    for c in range(head_dim):
                        head_out[c] += e / total * vs[j][kv_lo + c]
                concat += head_out
            out[n, i] = torch.tensor(linear_loop(module.out_proj, concat), dtype=torch.float64)
    return out
