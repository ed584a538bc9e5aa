"""Randomized positional encodings, Ruoss et al. (2023), "Randomized Positional Encodings
Boost Length Generalization of Transformers" (ACL 2023, arXiv 2305.16843), §3.

A model trained on sequences of at most ``N`` tokens and tested on up to ``M > N`` meets
positions ``N .. M-1`` for the first time at test time. Ruoss et al. instead give a
sequence of ``n`` tokens the positions of a random *ordered* subset of
``{0, ..., L - 1}``, ``L`` at least the longest test length: ``n`` of the ``L``
positions drawn without replacement, then sorted. Training so covers every position a
test sequence can have, and the order of the tokens survives, while the gaps between
neighbours vary. The encoding that reads the positions is unchanged (sinusoidal,
learned, RoPE, ALiBi, relative): only its positions are drawn.

:func:`randomized_positions` draws them. It follows the authors' code
(``models/positional_encodings.py``, ``noisy_fixed_positional_encodings``):
``jax.random.choice(arange(L), shape=(n,), replace=False)``, then ``sort``, on every
call, at test time too (their ``range_evaluation`` passes a fresh random key to every
evaluation batch; the noisy encodings have no test-time switch). Two differences: the
authors draw one subset per call, shared by the whole batch (and, for RoPE, by the
queries and the keys), where each row here gets its own (``randomized_positions(1, n,
L).expand(B, n)`` shares one); and pecode takes the positions as the ``positions``
argument of :meth:`pecode.attention.MultiHeadAttention.forward` (``[B, n]``), so one
draw serves the queries and the keys of a layer, and every layer that is given it.

Evaluated with a :class:`~pecode.attention.KVCache`, pass each step's positions
explicitly (the slice of one draw): the cache's default continues from the last
position plus one.
"""

from __future__ import annotations

import torch
from torch import Tensor

from pecode._checks import check_int

__all__ = ["randomized_positions"]


def randomized_positions(
    batch: int,
    length: int,
    max_position: int,
    *,
    generator: torch.Generator | None = None,
    device: torch.device | str | None = None,
) -> Tensor:
    """Each row: ``length`` distinct positions of ``{0, ..., max_position - 1}``, sorted.

    Every row is an independent, uniformly random subset of size ``length`` (each of the
    ``C(max_position, length)`` subsets equally likely), in ascending order; Ruoss et al.
    (2023), §3, as the authors' code draws it (a random permutation's first ``length``
    entries, sorted). A row is the first ``length`` indices of an ``argsort`` of i.i.d.
    float64 uniforms (a uniform random permutation up to ties, which have probability
    about ``max_position² / 2^54``). ``length == max_position`` gives ``0 .. length-1``.

    The work is ``O(batch · max_position · log max_position)``: ``max_position`` is the
    longest test length, a few thousand in the paper (the authors' code uses 2048).

    Shapes::

        returns: [batch, length](int64)

    Args:
        batch: the number of rows.
        length: the number of positions per row, the sequence length ``n``.
        max_position: ``L``, one past the largest position that may be drawn; at least
            the longest sequence the model will be tested on.
        generator: the random source (on the device the draw is made on: the
            generator's, then moved to ``device``).
        device: where the result lives (default: the generator's device, else the CPU).

    Raises:
        TypeError: ``batch``, ``length`` or ``max_position`` is not an int, or
            ``generator`` is not a ``torch.Generator``.
        ValueError: ``batch``, ``length`` or ``max_position`` is not positive, or
            ``length > max_position`` (there are not enough positions to draw from).
    """
    check_int("batch", batch)
    check_int("length", length)
    check_int("max_position", max_position)
    if length > max_position:
        raise ValueError(
            f"length={length} exceeds max_position={max_position}: a row needs {length} "
            f"distinct positions of 0 .. {max_position - 1}"
        )
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")
    source = generator.device if generator is not None else device
    keys = torch.rand(batch, max_position, dtype=torch.float64, generator=generator, device=source)
    positions = keys.argsort(dim=-1)[:, :length].sort(dim=-1).values
    return positions if device is None else positions.to(device)
