"""The synthetic tasks of chapter 13: a local lookup and a retrieval from far back.

* :func:`delayed_copy_batch`, the *local* probe: i.i.d. uniform tokens, and at every
  position ``t >= offset`` the target is the token ``offset`` places back,
  ``y_t = x_{t - offset}``. The rule is the same at every length and needs only
  *relative* position: the key it needs is always ``offset`` back, an offset seen in
  training whatever the length of the input.
* :func:`needle_copy_batch` adds the *far* probe to the same sequences: one *needle*
  token, placed in the first quarter of the training length, carries one of
  ``needle_values`` values, and at every later position a second target asks for that
  value. Finding the needle needs its content, not its position; in a test sequence
  longer than the training length, most of the positions that ask for it lie farther
  from it than any distance seen in training. It is the passkey retrieval of Mohtashami
  and Jaggi (2023), which Chen et al. (2023) and Peng et al. (2023) use to test PI and
  YaRN, in its smallest form.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from pecode._checks import check_int

__all__ = [
    "IGNORE_INDEX",
    "NeedleCopyBatch",
    "delayed_copy_batch",
    "needle_copy_batch",
]

IGNORE_INDEX = -100
"""Target value of positions without a target; ignored by the loss and the accuracy."""


def _check_generator(generator: object) -> None:
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator, got {type(generator).__name__}")


def delayed_copy_batch(
    batch_size: int,
    length: int,
    *,
    offset: int,
    vocab_size: int,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor]:
    """A batch of the delayed-copy task: predict the token ``offset`` places back.

    ``tokens`` are i.i.d. uniform over ``0 .. vocab_size - 1``;
    ``targets[:, t] = tokens[:, t - offset]`` for ``t >= offset`` and
    ``IGNORE_INDEX`` before.

    Shapes::

        returns: (tokens [batch_size, length], targets [batch_size, length]), int64

    Raises:
        TypeError, ValueError: a size is not a positive int, ``offset`` is not in
            ``1 .. length - 1``, ``vocab_size < 2``, or ``generator`` is not a
            ``torch.Generator``.
    """
    check_int("batch_size", batch_size, 1)
    check_int("length", length, 2)
    check_int("offset", offset, 1)
    check_int("vocab_size", vocab_size, 2)
    if offset >= length:
        raise ValueError(f"offset={offset} must be smaller than length={length}")
    _check_generator(generator)
    tokens = torch.randint(vocab_size, (batch_size, length), generator=generator)
    targets = torch.full_like(tokens, IGNORE_INDEX)
    targets[:, offset:] = tokens[:, :-offset]
    return tokens, targets


@dataclass(frozen=True)
class NeedleCopyBatch:
    """One batch of both tasks (shapes ``[B, L]`` unless stated; int64).

    Attributes:
        tokens: fillers ``0 .. vocab_size - 1`` and one needle per row, token
            ``vocab_size + value``.
        copy_targets: the delayed copy of ``tokens`` (a copied needle is its token id).
        needle_targets: the needle's value at every position after it,
            ``IGNORE_INDEX`` up to and including the needle.
        needle_positions: ``[B]``, where each row's needle is.
    """

    tokens: Tensor
    copy_targets: Tensor
    needle_targets: Tensor
    needle_positions: Tensor

    def needle_distance(self) -> Tensor:
        """``[B, L]``: position minus the row's needle position (negative before it)."""
        length = self.tokens.shape[1]
        return torch.arange(length)[None, :] - self.needle_positions[:, None]


def needle_copy_batch(
    batch_size: int,
    length: int,
    *,
    offset: int,
    vocab_size: int,
    needle_values: int,
    needle_span: int,
    generator: torch.Generator,
) -> NeedleCopyBatch:
    """Delayed copy plus one needle per sequence (the two probes of chapter 13).

    Each row: ``length`` i.i.d. uniform fillers from ``0 .. vocab_size - 1``; then one
    position ``p``, uniform in ``0 .. needle_span - 1``, is overwritten with the needle
    token ``vocab_size + v``, ``v`` uniform in ``0 .. needle_values - 1``. The copy
    targets are those of :func:`delayed_copy_batch` on the result; the needle targets
    are ``v`` at every position ``t > p``. The model's input vocabulary is
    ``vocab_size + needle_values``.

    Raises:
        TypeError, ValueError: as :func:`delayed_copy_batch`; ``needle_values < 2``,
            or ``needle_span`` not in ``1 .. length - 1``.
    """
    check_int("batch_size", batch_size, 1)
    check_int("length", length, 2)
    check_int("offset", offset, 1)
    check_int("vocab_size", vocab_size, 2)
    check_int("needle_values", needle_values, 2)
    check_int("needle_span", needle_span, 1)
    if offset >= length:
        raise ValueError(f"offset={offset} must be smaller than length={length}")
    if needle_span >= length:
        raise ValueError(f"needle_span={needle_span} must be smaller than length={length}")
    _check_generator(generator)
    tokens = torch.randint(vocab_size, (batch_size, length), generator=generator)
    positions = torch.randint(needle_span, (batch_size,), generator=generator)
    values = torch.randint(needle_values, (batch_size,), generator=generator)
    tokens[torch.arange(batch_size), positions] = vocab_size + values
    copy_targets = torch.full_like(tokens, IGNORE_INDEX)
    copy_targets[:, offset:] = tokens[:, :-offset]
    after = torch.arange(length)[None, :] > positions[:, None]
    needle_targets = torch.where(after, values[:, None], torch.full_like(tokens, IGNORE_INDEX))
    return NeedleCopyBatch(tokens, copy_targets, needle_targets, positions)
